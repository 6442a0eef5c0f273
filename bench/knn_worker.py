"""Runs one kNN implementation on request, for bench_knn_query.py's per-process rows: each library
in a process of its own, so no two spin on each other's idle threads (OpenMP passive) and Open3D
can come from an environment of its own.

    python knn_worker.py opbridge|pykdtree|scipy|open3d CASE.npz K

CASE.npz holds xyz (n, 3) float32 and offset (segment ends, int64). Each request computes the k
nearest neighbours of every point within its segment, index built per call. Reads one command per
line on stdin and answers one line on stdout:
  run      -> "ok"   one call
  save P   -> "ok"   writes the sorted distances (n, k) to P (.npy)
  ping     -> "ok"   (the pipe's own round trip, to report)
"""

import sys

import numpy as np
from worker_loop import serve


def implementation(name: str, xyz: np.ndarray, offset: np.ndarray, k: int):
    """A function computing the neighbours' distances of the case, and the implementation's version."""
    bounds = [0, *offset.tolist()]
    segments = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    if name == "opbridge":
        import onnxruntime as ort
        import torch

        import opbridge

        class Knn(torch.nn.Module):
            def forward(self, xyz, offset):
                return torch.ops.opbridge.knn_query(xyz, offset, k=k)

        model = opbridge.export(Knn(), (torch.from_numpy(xyz), torch.from_numpy(offset)), input_names=["xyz", "offset"])
        options = opbridge.session_options()
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = opbridge.session(model, options=options)
        feeds = {"xyz": xyz, "offset": offset}
        return (lambda: sess.run(None, feeds)[1]), f"opbridge {opbridge.__version__} (ONNX Runtime {ort.__version__})"
    if name == "pykdtree":
        from importlib.metadata import version

        from pykdtree.kdtree import KDTree

        def run():
            return np.concatenate([KDTree(xyz[s]).query(xyz[s], k=k)[0].reshape(-1, k) for s in segments])

        return run, f"pykdtree {version('pykdtree')} (OpenMP)"
    if name == "scipy":
        import scipy
        from scipy.spatial import cKDTree

        def run():
            return np.concatenate([cKDTree(xyz[s]).query(xyz[s], k=k, workers=-1)[0].reshape(-1, k)
                                   for s in segments])

        return run, f"scipy {scipy.__version__} cKDTree(workers=-1)"
    import open3d
    import open3d.core as o3c

    def run():
        out = []
        for s in segments:
            points = o3c.Tensor(xyz[s])
            nns = o3c.nns.NearestNeighborSearch(points)
            nns.knn_index()  # nanoflann's k-d tree
            out.append(np.sqrt(nns.knn_search(points, k)[1].numpy()))  # it gives squared distances
        return np.concatenate(out)

    return run, f"Open3D {open3d.__version__} NearestNeighborSearch.knn (nanoflann)"


def main() -> None:
    name, case_path, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
    case = np.load(case_path)
    fn, version = implementation(name, case["xyz"], case["offset"], k)
    serve(version, {"run": lambda _: fn(),
                    "save": lambda path: np.save(path, np.sort(np.asarray(fn(), dtype=np.float64), axis=1))})


if __name__ == "__main__":
    main()
