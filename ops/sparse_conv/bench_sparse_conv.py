"""The sparse convolution ops against spconv 2.3.8's CPU path and against dense convolution on a
SECOND-style encoder: KITTI's grid (41 x 1600 x 1408), the voxels of a simulated 64-beam sweep of a
ground plane with cars, SubM 16->16 x2, strided 16->32, SubM 32->32 x2, strided 32->64, SubM
64->64 x2 with ReLU between, rulebooks shared by indice_key as SECOND shares them; the same voxels
and weights in all three.

    <spconv environment's python> ops/sparse_conv/bench_sparse_conv.py [--threads 1 2] [--voxels N] [--rounds R]

(tests/python/test_spconv.py makes that environment: ~/.cache/opbridge/envs/py311-spconv-2.3.8.)

- spconv: the same encoder in spconv.pytorch, its output checked equal to opbridge's site by site
  before timing (spconv numbers a strided layer's sites in another order: rows matched by index).
- dense: the same layers as dense 3-D convolutions (PyTorch's oneDNN convolution,
  torch.mkldnn_convolution on channels_last_3d; F.conv3d takes torch's slow_conv3d here, about
  10x slower), the floor a sparse encoder must beat. The whole grid is 92M cells (5.9 GB a 16-channel
  activation): it runs on a slab of 1/100 of it (all of z and x, 16 of y's 1600 rows) and its time
  is scaled by 100, a dense convolution's work being the grid's volume whatever the data. Each layer
  is checked against opbridge's on that slab first (the sparse layer's input made dense; its
  output at the sparse output sites).
- Forward only, no gradient; interleaved rounds (a busy machine slows each alike); the ratios are the
  median of per-round ratios [25th-75th percentile].
- Peak memory: each in a fresh process of its own (this script, --memory): after the imports, the
  input and a warm-up on a 2 000-voxel cloud, the high-water mark is reset (/proc/self/clear_refs)
  and one forward runs; reported: VmHWM after it minus VmRSS before it.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

import opbridge
import spconv.pytorch as spconv

opbridge.load_torch()
OPS = torch.ops.opbridge

SHAPE = [41, 1600, 1408]
def lidar_voxels(n, seed=0):
    """A simulated 64-beam sweep (KITTI's SECOND grid: 0.05 x 0.05 x 0.1 m voxels over x 0..70.4, y -40..40,
    z -3..1; sensor 1.73 m up) of a ground plane with cars, voxelized; azimuth step chosen for ~n voxels."""
    g = np.random.default_rng(seed)
    elev = np.deg2rad(np.linspace(-24.9, 2.0, 64))
    cars = [(g.uniform(5, 60), g.uniform(-25, 25), g.uniform(0, np.pi)) for _ in range(25)]
    def sweep(step):
        az = np.deg2rad(np.arange(-45, 45, step))
        E, A = np.meshgrid(elev, az, indexing="ij")
        d = np.stack([np.cos(E) * np.cos(A), np.cos(E) * np.sin(A), np.sin(E)], -1).reshape(-1, 3)
        o = np.array([0, 0, 1.73])
        t = np.where(d[:, 2] < -1e-6, -o[2] / np.minimum(d[:, 2], -1e-6), np.inf)
        for cx, cy, yaw in cars:  # oriented boxes 4 x 1.8 x 1.5 m on the ground
            c, s = np.cos(yaw), np.sin(yaw)
            R = np.array([[c, s, 0], [-s, c, 0], [0, 0, 1]])
            lo, hi = np.array([-2, -0.9, 0]), np.array([2, 0.9, 1.5])
            oo, dd = R @ (o - [cx, cy, 0]), d @ R.T
            with np.errstate(divide="ignore", invalid="ignore"):
                t1, t2 = (lo - oo) / dd, (hi - oo) / dd
            tn, tf = np.nanmax(np.minimum(t1, t2), 1), np.nanmin(np.maximum(t1, t2), 1)
            hit = (tn <= tf) & (tn > 0)
            t = np.where(hit & (tn < t), tn, t)
        p = o + d * t[:, None]
        p = p[np.isfinite(t)] + g.normal(0, 0.02, (np.isfinite(t).sum(), 3))
        v = np.floor((p - [0, -40, -3]) / [0.05, 0.05, 0.1]).astype(np.int64)[:, ::-1]  # z, y, x
        ok = np.all((v >= 0) & (v < SHAPE), 1)
        return np.unique(v[ok], axis=0)
    step = 0.2
    v = sweep(step)
    while len(v) < n:
        step *= 0.8
        v = sweep(step)
    v = v[g.permutation(len(v))[:n]]
    return torch.from_numpy(np.c_[np.zeros(n, np.int64), v].astype(np.int32))


LAYERS = [  # (cin, cout, kernel, stride, padding, subm, key)
    (16, 16, 3, 1, 1, True, "s1"), (16, 16, 3, 1, 1, True, "s1"),
    (16, 32, 3, 2, 1, False, "d2"), (32, 32, 3, 1, 1, True, "s2"), (32, 32, 3, 1, 1, True, "s2"),
    (32, 64, 3, 2, 1, False, "d3"), (64, 64, 3, 1, 1, True, "s3"), (64, 64, 3, 1, 1, True, "s3"),
]

def weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(k, k, k, ci, co, generator=g) * (1.0 / (ci * 27) ** 0.5) for ci, co, k, *_ in LAYERS]

def ours(features, indices, ws):
    x, idx, shape, cache = features, indices, SHAPE, {}
    for (ci, co, k, s, p, subm, key), w in zip(LAYERS, ws):
        if key in cache:
            oi, pairs, num = cache[key]
        else:
            oi, pairs, num = OPS.sparse_indice_pairs(idx, spatial_shape=shape, kernel_size=[k]*3, stride=[s]*3, padding=[p]*3, subm=subm, batch_size=1)
            cache[key] = (oi, pairs, num)
        x = torch.relu(OPS.sparse_indice_conv(x, w, pairs, num, oi))
        if not subm:
            shape = [(i + 2 * p - (k - 1) - 1) // s + 1 for i in shape]
        idx = oi
    return x, idx

class Spconv(torch.nn.Module):
    def __init__(self, ws):
        super().__init__()
        mods = []
        for (ci, co, k, s, p, subm, key), w in zip(LAYERS, ws):
            m = spconv.SubMConv3d(ci, co, k, padding=p, bias=False, indice_key=key) if subm else \
                spconv.SparseConv3d(ci, co, k, stride=s, padding=p, bias=False, indice_key=key)
            with torch.no_grad():
                m.weight.copy_(w.permute(4, 0, 1, 2, 3))  # spconv 2: (Cout, *k, Cin)
            mods += [m, torch.nn.ReLU()]
        self.net = spconv.SparseSequential(*mods)
    def forward(self, features, indices):
        return self.net(spconv.SparseConvTensor(features, indices, SHAPE, 1))

DENSE_SLAB = 100  # the dense floor runs on 1/DENSE_SLAB of the grid's y rows
SLAB_Y0 = 792  # the slab: y rows [SLAB_Y0, SLAB_Y0 + 16), by the sensor (y = 0 m)


def dense_weights(ws):
    """The filters as a dense convolution's (Cout, Cin, kz, ky, kx), channels_last_3d."""
    return [w.permute(4, 3, 0, 1, 2).contiguous(memory_format=torch.channels_last_3d) for w in ws]


def dense(x, dws):
    """The encoder on a dense (1, 16, z, y, x) grid: every cell computed, active or not."""
    for (ci, co, k, s, p, *_), w in zip(LAYERS, dws):
        x = torch.relu(torch.mkldnn_convolution(x, w, None, [p] * 3, [s] * 3, [1] * 3, 1))
    return x


def scatter(features, indices, shape):
    """(N, C) features at (N, 4) (batch, z, y, x) indices as a dense (1, C, *shape) channels_last_3d grid."""
    grid = torch.zeros(1, *shape, features.shape[1])
    grid[0, indices[:, 1].long(), indices[:, 2].long(), indices[:, 3].long()] = features
    return grid.permute(0, 4, 1, 2, 3)


def slab(features, indices):
    """The voxels in y rows [SLAB_Y0, SLAB_Y0 + 16), their y shifted to 0; the slab's shape."""
    keep = (indices[:, 2] >= SLAB_Y0) & (indices[:, 2] < SLAB_Y0 + SHAPE[1] // DENSE_SLAB)
    idx = indices[keep].clone()
    idx[:, 2] -= SLAB_Y0
    return features[keep], idx, [SHAPE[0], SHAPE[1] // DENSE_SLAB, SHAPE[2]]


def check_dense(features, indices, ws):
    """Each layer on the slab: the dense convolution of the sparse layer's input, read at the sparse
    output sites, against the sparse layer's output. The largest difference over the output scale."""
    x, idx, shape = slab(features, indices)
    worst = 0.0
    for (ci, co, k, s, p, subm, key), w, dw in zip(LAYERS, ws, dense_weights(ws)):
        oi, pairs, num = OPS.sparse_indice_pairs(idx, spatial_shape=shape, kernel_size=[k] * 3, stride=[s] * 3,
                                                 padding=[p] * 3, subm=subm, batch_size=1)
        y = OPS.sparse_indice_conv(x, w, pairs, num, oi)
        d = torch.mkldnn_convolution(scatter(x, idx, shape), dw, None, [p] * 3, [s] * 3, [1] * 3, 1)
        at = d[0, :, oi[:, 1].long(), oi[:, 2].long(), oi[:, 3].long()].T
        worst = max(worst, ((at - y).abs().max() / y.abs().max()).item())
        if not subm:
            shape = [(i + 2 * p - (k - 1) - 1) // s + 1 for i in shape]
        x, idx = torch.relu(y), oi
    return worst


def spread(values):
    q = statistics.quantiles(values, n=4)
    return [round(statistics.median(values), 3), round(q[0], 3), round(q[2], 3)]


def inputs(n):
    idx = lidar_voxels(n)
    return torch.randn(len(idx), 16, generator=torch.Generator().manual_seed(1)), idx


def compare(x, idx, ws, model):
    """opbridge's output against spconv's, site by site: the largest difference, the output scale."""
    a, ai = ours(x, idx, ws)
    b = model(x, idx)
    rows = {tuple(r): i for i, r in enumerate(ai.tolist())}  # the two number output sites differently
    assert sorted(rows) == sorted(map(tuple, b.indices.tolist())), "opbridge and spconv give other output sites"
    order = torch.tensor([rows[tuple(r)] for r in b.indices.tolist()])
    return (a[order] - b.features).abs().max().item(), b.features.abs().max().item(), a


def bench(threads, n, rounds):
    torch.set_num_threads(threads)
    x, idx = inputs(n)
    ws = weights()
    model = Spconv(ws).eval()
    with torch.no_grad():
        diff, scale, a = compare(x, idx, ws, model)
        # spconv's CPU path races on more than one thread: equal on one (checked), reported on two.
        assert threads > 1 or diff <= 1e-5 * scale, f"spconv differs from opbridge by {diff} (scale {scale})"
        torch.set_num_threads(1)
        same_on_one = torch.equal(ours(x, idx, ws)[0], a)
        torch.set_num_threads(threads)
        dense_diff = check_dense(x, idx, ws)
        assert dense_diff <= 1e-4, f"the dense layers differ from opbridge's by {dense_diff} of the scale"
        sx, sidx, sshape = slab(x, idx)
        grid, dws = scatter(sx, sidx, sshape), dense_weights(ws)
        fns = {"opbridge": lambda: ours(x, idx, ws), "spconv": lambda: model(x, idx),
               "dense": lambda: dense(grid, dws)}
        times = {k: [] for k in fns}
        for f in fns.values():
            f()
        for _ in range(rounds):
            for k, f in fns.items():
                t0 = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t0)
    times["dense"] = [t * DENSE_SLAB for t in times["dense"]]
    pairs = OPS.sparse_indice_pairs(idx, spatial_shape=SHAPE, kernel_size=[3] * 3, subm=True)[2]
    return {"threads": threads, "voxels": n, "output_sites": len(a), "rounds": rounds,
            "subm_pairs_per_voxel": round(int(pairs.sum()) / n, 2),
            "spconv_max_abs_difference": diff, "output_scale": scale,
            "opbridge_equal_to_its_one_thread_result": same_on_one,
            "dense_layers_max_relative_difference": dense_diff,
            "median_s": {k: round(statistics.median(t), 4) for k, t in times.items()},
            "spconv_over_opbridge": spread([s / o for s, o in zip(times["spconv"], times["opbridge"])]),
            "dense_over_opbridge": spread([d / o for d, o in zip(times["dense"], times["opbridge"])])}


def status_kb(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def memory(which, threads, n):
    """This process's peak memory over one forward of `which` (see the module's docstring), in MB."""
    torch.set_num_threads(threads)
    ws = weights()
    model = Spconv(ws).eval()
    with torch.no_grad():
        if which == "dense":
            sx, sidx, sshape = slab(*inputs(n))
            grid, dws = scatter(sx, sidx, sshape), dense_weights(ws)
            dense(grid[:, :, :, :4], dws)  # the warm-up: 4 of the slab's 16 rows
            f = lambda: dense(grid, dws)
        else:
            small, (x, idx) = inputs(2000), inputs(n)
            run = (lambda v, i: ours(v, i, ws)) if which == "opbridge" else model
            run(*small)
            f = lambda: run(x, idx)
        with open("/proc/self/clear_refs", "w") as c:
            c.write("5")  # resets VmHWM to the present VmRSS
        before = status_kb("VmRSS")
        f()
        return (status_kb("VmHWM") - before) / 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--voxels", type=int, default=40000)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--memory", choices=["opbridge", "spconv", "dense"])
    args = parser.parse_args()
    if args.memory:
        print(json.dumps(memory(args.memory, args.threads[0], args.voxels)))
        return
    for threads in args.threads:
        row = bench(threads, args.voxels, args.rounds)
        peak = {}
        for which in ("opbridge", "spconv", "dense"):
            out = subprocess.run([sys.executable, __file__, "--memory", which, "--threads", str(threads), "--voxels",
                                  str(args.voxels)], capture_output=True, text=True, check=True).stdout
            peak[which] = round(json.loads(out.strip().splitlines()[-1]), 1)
        peak["dense, the whole grid (the slab's x DENSE_SLAB)"] = round(peak.pop("dense") * DENSE_SLAB)
        row["peak_memory_mb"] = peak
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
