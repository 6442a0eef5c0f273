"""ball_query: PointNet++'s grouping, 100 000 points, 25 000 centres (a subset of the points),
radius 0.05 (about 50 points per ball), nsample 32, float32, uniform in the unit cube.

Rows, each from scratch (the search structure built per call):
    opbridge through ONNX Runtime (the subject; thread spinning off), opbridge eager, a chunked
    PyTorch reference (cdist, the mask d² < r², the first nsample hits by index through a
    cumulative count, padded with the first hit), and the same search done with knn_query's k-d
    tree: the nsample nearest (ONNX Runtime), then the radius cut. That last one answers a
    different question (the nearest 32, not the first 32 by index) and is there as the other way
    to build this search from opbridge's parts.
"""

from __future__ import annotations

import numpy as np
import torch

from common import Row, interleaved, ort_session, progress

SUBJECT = "opbridge (ONNX Runtime)"


class _BallQuery(torch.nn.Module):
    def __init__(self, radius: float, nsample: int):
        super().__init__()
        self.radius, self.nsample = radius, nsample

    def forward(self, xyz, new_xyz):
        return torch.ops.opbridge.ball_query(xyz, new_xyz, self.radius, self.nsample)


class _KnnCut(torch.nn.Module):
    def __init__(self, radius: float, nsample: int):
        super().__init__()
        self.radius, self.nsample = radius, nsample

    def forward(self, xyz, offset, new_xyz, new_offset):
        idx, dist = torch.ops.opbridge.knn_query(xyz, offset, new_xyz, new_offset, k=self.nsample)
        return torch.where(dist < self.radius, idx, idx[:, :1])


def torch_reference(xyz: torch.Tensor, centres: torch.Tensor, radius: float, nsample: int, chunk: int = 1024):
    """pointnet2_ops' ball query in PyTorch ops: per chunk of centres, the first nsample points by
    index with d² < r² (a cumulative count of hits gives each hit its slot)."""
    out = []
    r2 = radius * radius
    for q in centres.split(chunk):
        hit = torch.cdist(q, xyz).pow_(2) < r2  # (chunk, n)
        slot = hit.cumsum(1) - 1
        keep = hit & (slot < nsample)
        rows, cols = keep.nonzero(as_tuple=True)
        idx = torch.zeros(len(q), nsample, dtype=torch.int64)
        idx[rows, slot[rows, cols]] = cols
        count = keep.sum(1, keepdim=True)
        idx = torch.where(torch.arange(nsample) < count, idx, idx[:, :1])
        out.append(idx)
    return torch.cat(out)


def run(quick: bool) -> list[Row]:
    import opbridge

    n, m, radius, nsample = (20_000, 5_000, 0.08, 32) if quick else (100_000, 25_000, 0.05, 32)
    rng = np.random.default_rng(0)
    pts = rng.random((n, 3), dtype=np.float32)
    centres = pts[rng.choice(n, m, replace=False)]
    xyz, new_xyz = torch.from_numpy(pts)[None], torch.from_numpy(centres)[None]
    name = f"ball_query n={n} m={m} r={radius} nsample={nsample} float32"

    bq = _BallQuery(radius, nsample)
    sess = ort_session(opbridge.export(bq, (xyz, new_xyz), input_names=["xyz", "new_xyz"]), spinning=False)
    feeds = {"xyz": xyz.numpy(), "new_xyz": new_xyz.numpy()}
    got = sess.run(None, feeds)[0]
    assert np.array_equal(got, bq(xyz, new_xyz).numpy())
    # cdist's squared distances round differently from the kernel's: compare away from the sphere.
    want = torch_reference(xyz[0], new_xyz[0, :500], radius, nsample).numpy()
    agree = (got[0, :500] == want).all(1).mean()
    assert agree > 0.98, f"torch reference agrees on {agree:.3f} of the centres"

    knn = _KnnCut(radius, nsample)
    off, new_off = torch.tensor([n]), torch.tensor([m])
    knn_sess = ort_session(opbridge.export(knn, (xyz[0], off, new_xyz[0], new_off),
                                           input_names=["xyz", "offset", "new_xyz", "new_offset"]), spinning=False)
    knn_feeds = {"xyz": pts, "offset": off.numpy(), "new_xyz": centres, "new_offset": new_off.numpy()}
    impls = {SUBJECT: lambda: sess.run(None, feeds),
             "opbridge eager (torch.ops)": lambda: bq(xyz, new_xyz),
             "knn_query k=32 + radius cut (ONNX Runtime)": lambda: knn_sess.run(None, knn_feeds),
             "torch cdist + mask (1024-centre chunks)": lambda: torch_reference(xyz[0], new_xyz[0], radius, nsample)}
    progress(f"{name}: {', '.join(impls)}")
    return interleaved(name, impls, rounds=3 if quick else 10, max_seconds=240)
