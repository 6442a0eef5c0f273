"""The sparse convolution ops against spconv 2.3.8's CPU path on a SECOND-style encoder: KITTI's
grid (41 x 1600 x 1408), the voxels of a simulated 64-beam sweep of a ground plane with cars,
SubM 16->16 x2, strided 16->32, SubM 32->32 x2, strided 32->64, SubM 64->64 x2 with ReLU between,
rulebooks shared by indice_key as SECOND shares them; the same voxels and weights in both, the
outputs compared site by site; forward, best of interleaved runs.

    <spconv environment's python> ops/sparse_conv/bench_sparse_conv.py [threads] [voxels]

(tests/python/test_spconv.py makes that environment: ~/.cache/opbridge/envs/py311-spconv-2.3.8.)
"""

import json
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

def interleaved(fns, reps):
    """Best and median seconds of each function, run in turn (a busy machine slows both alike)."""
    times = [[] for _ in fns]
    for f in fns:
        f()
    for _ in range(reps):
        for f, t in zip(fns, times):
            t0 = time.perf_counter()
            f()
            t.append(time.perf_counter() - t0)
    return [(min(t), float(np.median(t))) for t in times]


def main(threads=1, n=40000, reps=9):
    torch.set_num_threads(threads)
    idx = lidar_voxels(n)
    x = torch.randn(n, 16, generator=torch.Generator().manual_seed(1))
    ws = weights()
    model = Spconv(ws).eval()
    with torch.no_grad():
        a, ai = ours(x, idx, ws)
        b = model(x, idx)
        rows = {tuple(r): i for i, r in enumerate(ai.tolist())}  # the two number output sites differently
        order = torch.tensor([rows[tuple(r)] for r in b.indices.tolist()])
        pairs = OPS.sparse_indice_pairs(idx, spatial_shape=SHAPE, kernel_size=[3] * 3, subm=True)[2]
        (mine, theirs) = interleaved([lambda: ours(x, idx, ws), lambda: model(x, idx)], reps)
    print(json.dumps({"voxels": n, "threads": threads, "output_sites": len(ai),
                      "subm_pairs_per_voxel": round(int(pairs.sum()) / n, 2),
                      "max_abs_difference": (a[order] - b.features).abs().max().item(),
                      "output_scale": b.features.abs().max().item(),
                      "opbridge_s (best, median)": mine, "spconv_s (best, median)": theirs,
                      "speedup (best)": theirs[0] / mine[0]}))


if __name__ == "__main__":
    main(*(int(v) for v in sys.argv[1:3]))
