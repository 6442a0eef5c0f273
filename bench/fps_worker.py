"""Runs Open3D's furthest point sampling on request, for bench_furthest_point_sampling.py: Open3D
lives in an environment of its own (bench/.open3d-venv), so it runs in a process of its own.

    python fps_worker.py CASE.npz

CASE.npz holds xyz (b, n, 3) float32 and npoint. Each request samples npoint points of every cloud
with PointCloud.farthest_point_down_sample (float64, from point 0; the clouds are made once, not
per request). Reads one command per line on stdin and answers one line on stdout:
  run      -> "ok"   one call per cloud
  save P   -> "ok"   writes the sampled points (b, npoint, 3) float64 to P (.npy), in Open3D's
                     order (ascending index, not pick order)
  ping     -> "ok"   (the pipe's own round trip, to report)
"""

import sys

import numpy as np
import open3d
from worker_loop import serve


def main() -> None:
    case = np.load(sys.argv[1])
    npoint = int(case["npoint"])
    clouds = [open3d.geometry.PointCloud(open3d.utility.Vector3dVector(x.astype(np.float64))) for x in case["xyz"]]

    def run():
        return [np.asarray(c.farthest_point_down_sample(npoint).points) for c in clouds]

    serve(f"Open3D {open3d.__version__} farthest_point_down_sample",
          {"run": lambda _: run(), "save": lambda path: np.save(path, np.stack(run()))})


if __name__ == "__main__":
    main()
