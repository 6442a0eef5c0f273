"""hard_voxelize: mmcv's hard voxelization of a 120 000-point cloud over KITTI's range
[0, -40, -3, 70.4, 40, 1], SECOND's voxels (0.05 x 0.05 x 0.1, max_points 5, max_voxels 16 000)
and PointPillars' pillars (0.16 x 0.16 x 4, max_points 32, max_voxels 40 000), on 1 and 2 threads.

Two clouds: uniform over a box a little wider than the range (points in random order: the worst
case for any table of voxels), and a LiDAR-like scan (64 rings, points in scan order, the ground
and a few obstacles), float32 x, y, z, intensity.

Rows, interleaved per round: opbridge eager (the subject), opbridge in ONNX Runtime, and mmcv's
CPU algorithm written as PyTorch ops: the same voxel per point (floor((p - min) / size) in float32,
kept in [0, round((max - min) / size))), voxels in order of first point, the first max_points
points of each in input order, the first max_voxels voxels. The fastest vectorised form found: one
stable sort of the voxel keys gives the groups, each point's slot and each voxel's first point;
a sort of the voxels by first point gives their order. For the pillar grid (220 000 cells) also the
form closest to mmcv's kernel, a dense table of the grid's cells (scatter_reduce amin). Every
row's output is checked equal to the subject's before timing.

`--cpu-time`: the one-thread ratios again in the calling thread's CPU time (cpu_time_ratios), which
a loaded machine does not stretch as it stretches wall time.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from common import Row, interleaved, on_torch_threads, ort_session, progress

SUBJECT = "opbridge eager (torch.ops)"
RANGE = [0.0, -40.0, -3.0, 70.4, 40.0, 1.0]
CONFIGS = {"SECOND": ([0.05, 0.05, 0.1], 5, 16000), "PointPillars": ([0.16, 0.16, 4.0], 32, 40000)}


def uniform_cloud(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    lo, hi = torch.tensor([-5.0, -45.0, -3.5]), torch.tensor([75.0, 45.0, 1.5])
    return torch.cat([lo + (hi - lo) * torch.rand(n, 3, generator=g), torch.rand(n, 1, generator=g)], 1)


def scan_cloud(n: int, seed: int) -> torch.Tensor:
    """A 64-ring scan from 1.73 m up: each beam stops at the ground or at one of a few boxes (as
    vertical walls at their distance), points ring by ring in azimuth order."""
    rng = np.random.default_rng(seed)
    rings = 64
    per_ring = n // rings
    elevation = np.deg2rad(np.linspace(-24.8, 2.0, rings))[:, None]
    azimuth = np.linspace(-np.pi, np.pi, per_ring, endpoint=False)[None, :]
    ground = np.where(elevation < 0, 1.73 / np.maximum(np.sin(-elevation), 1e-6), 120.0)
    walls = np.full(per_ring, 120.0)
    for centre, width, dist in zip(rng.uniform(-np.pi, np.pi, 40), rng.uniform(0.02, 0.15, 40), rng.uniform(4, 70, 40)):
        hit = np.abs(np.angle(np.exp(1j * (azimuth[0] - centre)))) < width
        walls[hit] = np.minimum(walls[hit], dist)
    r = np.minimum(ground, walls[None, :] / np.cos(elevation)) + rng.normal(0, 0.02, (rings, per_ring))
    x = r * np.cos(elevation) * np.cos(azimuth)
    y = r * np.cos(elevation) * np.sin(azimuth)
    z = r * np.sin(elevation)  # the sensor at the origin, the ground at z = -1.73
    pts = np.stack([x, y, z, rng.random((rings, per_ring))], -1).reshape(-1, 4)
    return torch.from_numpy(pts.astype(np.float32))


def _voxel_keys(points, voxel_size, point_cloud_range):
    size = torch.tensor(voxel_size, dtype=torch.float32)
    lo = torch.tensor(point_cloud_range[:3], dtype=torch.float32)
    grid = torch.tensor([math.floor(float(v) + 0.5) for v in
                         ((torch.tensor(point_cloud_range[3:], dtype=torch.float32) - lo) / size).tolist()])
    cell = torch.floor((points[:, :3] - lo) / size)
    idx = ((cell >= 0) & (cell < grid)).all(1).nonzero().squeeze(1)
    c = cell[idx].long()
    return idx, (c[:, 2] * grid[1] + c[:, 1]) * grid[0] + c[:, 0], grid


def _assemble(points, idx, key, grid, group, slot, first, group_key, max_points, max_voxels, counts):
    """Voxels from each kept point's group and slot, groups ranked by their first point."""
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order))
    vid = rank[group]
    keep = (vid < max_voxels) & (slot < max_points)
    m = min(len(order), max_voxels)
    voxels = points.new_zeros((m, max_points, points.shape[1]))
    voxels[vid[keep], slot[keep]] = points[idx[keep]]
    k = group_key[order[:m]]
    coors = torch.stack((k // (grid[0] * grid[1]), k // grid[0] % grid[1], k % grid[0]), 1).int()
    return voxels, coors, counts[order[:m]].clamp(max=max_points).int()


def mmcv_formula(points, voxel_size, point_cloud_range, max_points, max_voxels):
    """mmcv's CPU algorithm as PyTorch ops, by one stable sort of the voxel keys."""
    idx, key, grid = _voxel_keys(points, voxel_size, point_cloud_range)
    sorted_key, perm = torch.sort(key, stable=True)  # within a voxel, points stay in input order
    new = torch.ones_like(sorted_key, dtype=torch.bool)
    new[1:] = sorted_key[1:] != sorted_key[:-1]
    group = torch.cumsum(new, 0) - 1
    starts = new.nonzero().squeeze(1)
    slot = torch.arange(len(key)) - starts[group]
    counts = torch.diff(starts, append=torch.tensor([len(key)]))
    return _assemble(points, idx[perm], key, grid, group, slot, perm[starts], sorted_key[starts], max_points,
                     max_voxels, counts)


def mmcv_formula_dense(points, voxel_size, point_cloud_range, max_points, max_voxels):
    """The same with mmcv's own device, a dense table over the grid's cells (each cell's first
    point by scatter_reduce amin), then a stable sort by voxel for the slots."""
    idx, key, grid = _voxel_keys(points, voxel_size, point_cloud_range)
    ar = torch.arange(len(key))
    first_of_cell = torch.full((int(grid.prod()),), len(key), dtype=torch.long).scatter_reduce_(0, key, ar, "amin")
    first_point = first_of_cell[key]
    uniq_first, group = torch.unique(first_point, return_inverse=True)  # ascending first point
    s = torch.argsort(group, stable=True)
    counts = torch.bincount(group, minlength=len(uniq_first))
    slot = torch.empty_like(group)
    slot[s] = ar - (torch.cumsum(counts, 0) - counts)[group[s]]
    return _assemble(points, idx, key, grid, group, slot, uniq_first, key[uniq_first], max_points, max_voxels, counts)


class _Hard(torch.nn.Module):
    def __init__(self, voxel_size, max_points, max_voxels):
        super().__init__()
        self.voxel_size, self.max_points, self.max_voxels = voxel_size, max_points, max_voxels

    def forward(self, points):
        return torch.ops.opbridge.hard_voxelize(points, self.voxel_size, RANGE, self.max_points, self.max_voxels)


def run(quick: bool) -> list[Row]:
    import opbridge

    n = 30_000 if quick else 120_000
    rows: list[Row] = []
    saved = torch.get_num_threads()
    try:
        for cloud_name, points in (("uniform", uniform_cloud(n, 0)), ("LiDAR-like scan", scan_cloud(n, 1))):
            for config, (voxel_size, max_points, max_voxels) in CONFIGS.items():
                model = _Hard(voxel_size, max_points, max_voxels)
                proto = opbridge.export(model, (points,), input_names=["points"], dynamic_axes={"points": {0: "n"}})
                want = model(points)
                peers = {"mmcv's algorithm in PyTorch ops (one stable sort)": mmcv_formula}
                if config == "PointPillars":
                    peers["mmcv's algorithm in PyTorch ops (dense cell table)"] = mmcv_formula_dense
                for fn in peers.values():
                    for got, w in zip(fn(points, voxel_size, RANGE, max_points, max_voxels), want):
                        assert torch.equal(got, w), f"{fn.__name__} differs from the op ({config}, {cloud_name})"
                for threads in (1, 2):
                    sess = ort_session(proto, threads=threads, spinning=False)
                    got = sess.run(None, {"points": points.numpy()})
                    assert all(np.array_equal(g, w.numpy()) for g, w in zip(got, want))
                    name = (f"hard_voxelize {config} {cloud_name} n={n} max_points={max_points} "
                            f"max_voxels={max_voxels} threads={threads} (M={want[0].shape[0]})")
                    impls = {SUBJECT: on_torch_threads(threads, lambda: model(points)),
                             "opbridge (ONNX Runtime)": lambda s=sess: s.run(None, {"points": points.numpy()})}
                    for label, fn in peers.items():
                        impls[label] = on_torch_threads(
                            threads, lambda f=fn: f(points, voxel_size, RANGE, max_points, max_voxels))
                    progress(name)
                    rows += interleaved(name, impls, rounds=5 if quick else 15, max_seconds=120)
    finally:
        torch.set_num_threads(saved)
    return rows


def cpu_time_ratios(rounds: int = 30) -> None:
    """One thread, interleaved: the calling thread's CPU time (time.thread_time) of the op and of
    mmcv's algorithm in PyTorch ops, per round, on the four benchmarks. CPU time is not stretched
    by the other processes of a loaded machine as wall time is (only by their use of the caches)."""
    import statistics
    import time

    import opbridge

    opbridge.load_torch()
    torch.set_num_threads(1)
    for cloud_name, points in (("uniform", uniform_cloud(120_000, 0)), ("LiDAR-like scan", scan_cloud(120_000, 1))):
        for config, (voxel_size, max_points, max_voxels) in CONFIGS.items():
            args = (points, voxel_size, RANGE, max_points, max_voxels)
            for got, want in zip(mmcv_formula(*args), torch.ops.opbridge.hard_voxelize(*args)):
                assert torch.equal(got, want), f"mmcv_formula differs from the op ({config}, {cloud_name})"
            ours, ratios = [], []
            for _ in range(rounds):
                t0 = time.thread_time()
                torch.ops.opbridge.hard_voxelize(*args)
                t1 = time.thread_time()
                mmcv_formula(*args)
                t2 = time.thread_time()
                ours.append((t1 - t0) * 1e3), ratios.append((t2 - t1) / (t1 - t0))
            q = statistics.quantiles(ratios, n=4)
            print(f"{config} {cloud_name}: opbridge eager {statistics.median(ours):.2f} ms CPU; mmcv's algorithm "
                  f"{statistics.median(ratios):.2f}x [{q[0]:.2f}-{q[2]:.2f}]")


if __name__ == "__main__":
    import argparse

    from run import table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cpu-time", action="store_true", help="one thread, CPU time ratios (cpu_time_ratios)")
    parsed = parser.parse_args()
    if parsed.cpu_time:
        cpu_time_ratios()
    else:
        print(table(run(parsed.quick)))
