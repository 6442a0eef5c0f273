"""knn_query: k = 16 nearest neighbours of every point within its segment, n = m = 100 000
uniform points in the unit cube, 2 segments, float32 (point-transformer's KNNQuery).

Every row computes the same thing from scratch, index built per call included:
    opbridge through ONNX Runtime (the subject), opbridge eager, a chunked PyTorch brute
    force (cdist + topk), scipy's cKDTree (workers=-1) and pykdtree, each per segment.
"""

from __future__ import annotations

import numpy as np
import torch

from common import Row, measure, ort_session, progress

K = 16


class _Knn(torch.nn.Module):
    def forward(self, xyz, offset):
        return torch.ops.opbridge.knn_query(xyz, offset, k=K)


def _segments(offset: np.ndarray) -> list[slice]:
    bounds = [0, *offset.tolist()]
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def _torch_brute_force(xyz: torch.Tensor, segments: list[slice], chunk: int):
    # Queries in chunks bound the distance matrix to chunk x segment size.
    for s in segments:
        pts = xyz[s]
        for q in pts.split(chunk):
            torch.cdist(q, pts).topk(K, dim=1, largest=False)


def _round_robin(fns: dict, rounds: int) -> dict:
    """Times each function once per round, in turn, so that load from other processes on a
    shared machine falls on every implementation alike (the ratios are what matter)."""
    for fn in fns.values():
        fn()  # warm-up
    times = {key: [] for key in fns}
    for _ in range(rounds):
        for key, fn in fns.items():
            times[key] += measure(fn, warmup=0, repeat=1)
    return times


def run(quick: bool) -> list[Row]:
    import opbridge

    n = 10_000 if quick else 100_000
    rng = np.random.default_rng(0)
    xyz = rng.random((n, 3), dtype=np.float32)
    offset = np.array([n // 2, n], np.int64)
    segments = _segments(offset)
    xt, ot = torch.from_numpy(xyz), torch.from_numpy(offset)
    name = f"knn_query n=m={n} b=2 k={K} float32"
    threads = torch.get_num_threads()

    model = opbridge.export(_Knn(), (xt, ot), input_names=["xyz", "offset"])
    sess = ort_session(model)
    feeds = {"xyz": xyz, "offset": offset}
    got = sess.run(None, feeds)
    want = _Knn()(xt, ot)
    # Not a test, but a benchmark of a wrong answer is worthless: ONNX Runtime and eager agree.
    assert np.array_equal(got[0], want[0].numpy()) and np.array_equal(got[1], want[1].numpy())

    # (label, note, function); the first is the subject.
    impls = [
        ("opbridge (ONNX Runtime)", "k-d tree per segment, built per call", lambda: sess.run(None, feeds)),
        ("opbridge eager (torch.ops)", f"{threads} torch threads", lambda: _Knn()(xt, ot)),
    ]
    try:
        from scipy.spatial import cKDTree
    except ImportError:
        progress("scipy missing: pip install -r bench/requirements.txt")
    else:
        def scipy_knn():
            for s in segments:
                cKDTree(xyz[s]).query(xyz[s], k=K, workers=-1)

        impls.append(("scipy cKDTree workers=-1", "build + query per segment", scipy_knn))
    try:
        from pykdtree.kdtree import KDTree
    except ImportError:
        progress("pykdtree missing: pip install -r bench/requirements.txt")
    else:
        def pykdtree_knn():
            for s in segments:
                KDTree(xyz[s]).query(xyz[s], k=K)

        impls.append(("pykdtree", "build + query per segment, OpenMP", pykdtree_knn))

    progress(f"{name}: {', '.join(label for label, _, _ in impls)}, round robin")
    times = _round_robin({label: fn for label, _, fn in impls}, rounds=3 if quick else 15)
    rows = [Row(name, label, times[label], note) for label, note, _ in impls]

    progress(f"{name}: torch brute force")
    chunk = 1024
    # Tens of seconds per call at full size: two timed calls, no warm-up (nothing to warm).
    brute = dict(warmup=1, repeat=3) if quick else dict(warmup=0, repeat=2)
    rows.insert(2, Row(name, "torch cdist+topk (chunked)",
                       measure(lambda: _torch_brute_force(xt, segments, chunk), **brute),
                       f"{chunk}-query chunks, {threads} torch threads"))
    return rows
