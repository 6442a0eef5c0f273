"""furthest_point_sampling: PointNet++'s sampling, N = 100 000 -> 25 000 points in one cloud, and
8 clouds of 16 384 -> 4 096 (float32, uniform in the unit cube).

Rows, each the whole sampling from scratch:
    opbridge through ONNX Runtime (the subject; thread spinning off), opbridge eager, Open3D's
    `PointCloud.farthest_point_down_sample` (float64, one cloud after another, in a process of
    its own: it lives in the benchmark-only environment $OPBRIDGE_OPEN3D_VENV or
    bench/.open3d-venv, which a full run creates), torch_cluster's CPU `fps` where it is installed
    (scripts/oracles.sh, random_start=False) — all picking the same points — and, in rounds of
    its own beside the subject, a vectorised PyTorch loop (per pick: squared distances to the last
    pick, running minimum, argmax; all clouds of a batch at once).

A plain FPS scans every point at every pick: N x npoint distance updates (2.5e9 for the single
cloud). opbridge's kernel skips the blocks of points a pick cannot change, so most of those never
run; the PyTorch loop does them all and takes about 40 s per call at full size: three rounds.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch

from bench_knn_query import OPEN3D_PINS, OPEN3D_VENV
from common import Row, Worker, bench_venv, interleaved, ort_session, progress

SUBJECT = "opbridge (ONNX Runtime)"


class _Fps(torch.nn.Module):
    def __init__(self, npoint: int):
        super().__init__()
        self.npoint = npoint

    def forward(self, xyz):
        # The peers' semantics, so that every row picks the same points: ties to the lowest index
        # (tie_threads=0; 100 000 points do tie late in the chain) and points near the origin taken
        # like any other (uniform points in the unit cube have one there, at a corner, which every
        # chain picks early). pointnet2_ops' rules cost the same.
        return torch.ops.opbridge.furthest_point_sampling(xyz, self.npoint, tie_threads=0, skip_near_origin=False)


def torch_loop(xyz: torch.Tensor, npoint: int) -> torch.Tensor:
    """FPS in PyTorch ops, batched: one vectorised step per pick, starting at index 0."""
    b, n, _ = xyz.shape
    picks = torch.zeros(b, npoint, dtype=torch.int64)
    dist = torch.full((b, n), 1e10)
    rows = torch.arange(b)
    last = torch.zeros(b, dtype=torch.int64)
    for i in range(1, npoint):
        d = ((xyz - xyz[rows, last][:, None, :]) ** 2).sum(-1)
        torch.minimum(dist, d, out=dist)
        last = dist.argmax(1)
        picks[:, i] = last
    return picks


def _torch_cluster_fps(xyz: torch.Tensor, npoint: int):
    try:
        import torch_cluster
    except ImportError:
        progress("torch_cluster missing: scripts/oracles.sh builds it (optional)")
        return None
    b, n, _ = xyz.shape
    flat, batch = xyz.reshape(b * n, 3), torch.arange(b).repeat_interleave(n)
    return lambda: torch_cluster.fps(flat, batch, ratio=npoint / n, random_start=False)


def _open3d(xyz: torch.Tensor, npoint: int, got: np.ndarray, tmp: str, python) -> Worker | None:
    """Open3D's sampling of every cloud in a worker process, checked to pick opbridge's points."""
    if python is None:
        return None
    case = Path(tmp) / "case.npz"
    np.savez(case, xyz=xyz.numpy(), npoint=npoint)
    w = Worker(python, "fps_worker.py", case)
    try:
        w(f"save {Path(tmp) / 'open3d.npy'}")
        picked = np.load(Path(tmp) / "open3d.npy")
        # Open3D returns the sampled points in index order, not pick order.
        want = np.stack([c[np.sort(i)] for c, i in zip(xyz.numpy(), got)]).astype(np.float64)
        assert np.array_equal(picked, want), "Open3D picks other points than opbridge"
    except BaseException:
        w.close()
        raise
    return w


def _case(b: int, n: int, npoint: int, quick: bool, open3d) -> list[Row]:
    import opbridge

    xyz = torch.from_numpy(np.random.default_rng(0).random((b, n, 3), dtype=np.float32))
    name = f"furthest_point_sampling B={b} N={n} -> {npoint} float32"
    fps = _Fps(npoint)
    sess = ort_session(opbridge.export(fps, (xyz,), input_names=["xyz"]), spinning=False)
    feeds = {"xyz": xyz.numpy()}
    got = sess.run(None, feeds)[0]
    # A benchmark of a wrong answer is worthless: every row picks the same points.
    assert np.array_equal(got, fps(xyz).numpy())
    impls = {SUBJECT: lambda: sess.run(None, feeds), "opbridge eager (torch.ops)": lambda: fps(xyz)}
    tc = _torch_cluster_fps(xyz, npoint)
    if tc:
        assert np.array_equal(tc().reshape(b, npoint).numpy() % n, got)
        impls["torch_cluster fps (CPU)"] = tc
    with tempfile.TemporaryDirectory() as tmp:
        w = _open3d(xyz, npoint, got, tmp, open3d)
        notes = {}
        if w:
            label = f"{w.version} [own process]"
            impls[label] = lambda: w("run")
            notes[label] = f"one cloud after another; the request includes the pipe's round trip " \
                           f"({w.round_trip_ms():.3f} ms)"
        try:
            progress(f"{name}: {', '.join(impls)}")
            rows = interleaved(name, impls, rounds=3 if quick else 15, warmup=1, max_seconds=300, notes=notes)
        finally:
            if w:
                w.close()
    if not quick or n <= 20_000:
        assert np.array_equal(got[:, :200], torch_loop(xyz, 200).numpy())
        loop = "PyTorch loop (vectorised per pick)"
        progress(f"{name}: {loop}, beside the subject")
        pair = interleaved(name, {SUBJECT: lambda: sess.run(None, feeds), loop: lambda: torch_loop(xyz, npoint)},
                           rounds=2 if quick else 3, warmup=0, notes={loop: "own rounds beside the subject"})
        rows.append(pair[1])
    return rows


def run(quick: bool) -> list[Row]:
    open3d = bench_venv(OPEN3D_VENV, OPEN3D_PINS, "import open3d",
                        create=not quick, what="furthest_point_sampling with Open3D")
    if quick:
        return _case(1, 20_000, 5_000, quick, open3d) + _case(2, 4_096, 1_024, quick, open3d)
    return _case(1, 100_000, 25_000, quick, open3d) + _case(8, 16_384, 4_096, quick, open3d)
