"""furthest_point_sampling: PointNet++'s sampling, N = 100 000 -> 25 000 points in one cloud, and
8 clouds of 16 384 -> 4 096 (float32, uniform in the unit cube).

Rows, each the whole sampling from scratch:
    opbridge through ONNX Runtime (the subject; thread spinning off), opbridge eager, a vectorised
    PyTorch loop (per pick: squared distances to the last pick, running minimum, argmax; all
    clouds of a batch at once), and torch_cluster's CPU `fps` where it is installed
    (scripts/oracles.sh), with random_start=False (the same picks).

FPS is sequential in its picks: every pick scans every point, so a call is N x npoint distance
updates (2.5e9 for the single cloud) and takes seconds; few rounds.
"""

from __future__ import annotations

import numpy as np
import torch

from common import Row, interleaved, ort_session, progress

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


def _case(b: int, n: int, npoint: int, quick: bool) -> list[Row]:
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
    if not quick or n <= 20_000:
        assert np.array_equal(got[:, :200], torch_loop(xyz, 200).numpy())
        impls["PyTorch loop (vectorised per pick)"] = lambda: torch_loop(xyz, npoint)
    tc = _torch_cluster_fps(xyz, npoint)
    if tc:
        assert np.array_equal(tc().reshape(b, npoint).numpy() % n, got)
        impls["torch_cluster fps (CPU)"] = tc
    progress(f"{name}: {', '.join(impls)}")
    return interleaved(name, impls, rounds=2 if quick else 5, warmup=1, max_seconds=300)


def run(quick: bool) -> list[Row]:
    if quick:
        return _case(1, 20_000, 5_000, quick) + _case(2, 4_096, 1_024, quick)
    return _case(1, 100_000, 25_000, quick) + _case(8, 16_384, 4_096, quick)
