"""knn_query: the k = 16 and the k = 1 nearest neighbours of every point within its segment,
n = m = 100 000 uniform points in the unit cube, 2 segments, float32 (point-transformer's
KNNQuery).

Every row computes the same thing from scratch, index built per call included:
    opbridge through ONNX Runtime (the subject; thread spinning off), opbridge eager, a chunked
    PyTorch brute force (cdist + topk), scipy's cKDTree (workers=-1) and pykdtree, each per
    segment. All on their default threads.

Timed in interleaved rounds. The brute force takes seconds per call at full size, so it has
rounds of its own, each beside one call of the subject: its ratios are to the subject's times in
those rounds.

Then the same calls with every library in a worker process of its own (knn_worker.py; one
request per timed run, the pipe's round trip counted for all alike): opbridge through ONNX
Runtime, pykdtree, scipy and Open3D's nearest-neighbour search (nanoflann's k-d tree). Open3D
brings many dependencies, so it lives in a benchmark-only environment, $OPBRIDGE_OPEN3D_VENV or
bench/.open3d-venv (a full run creates it; Open3D needs the libusb-1.0-0 Debian package).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from common import Row, Worker, bench_venv, interleaved, ort_session, progress

SUBJECT = "opbridge (ONNX Runtime)"
OPEN3D_VENV = Path(os.environ.get("OPBRIDGE_OPEN3D_VENV", Path(__file__).resolve().parent / ".open3d-venv"))
OPEN3D_PINS = ["open3d-cpu==0.20.0"]


class _Knn(torch.nn.Module):
    def __init__(self, k: int):
        super().__init__()
        self.k = k

    def forward(self, xyz, offset):
        return torch.ops.opbridge.knn_query(xyz, offset, k=self.k)


def _segments(offset: np.ndarray) -> list[slice]:
    bounds = [0, *offset.tolist()]
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def _torch_brute_force(xyz: torch.Tensor, segments: list[slice], k: int, chunk: int):
    # Queries in chunks bound the distance matrix to chunk x segment size.
    for s in segments:
        pts = xyz[s]
        for q in pts.split(chunk):
            torch.cdist(q, pts).topk(k, dim=1, largest=False)


def _peers(xyz: np.ndarray, segments: list[slice], k: int) -> dict:
    """scipy's and pykdtree's build + query per segment, those installed: {label: (note, fn)}."""
    peers = {}
    try:
        from scipy.spatial import cKDTree
    except ImportError:
        progress("scipy missing: pip install -r bench/requirements.txt")
    else:
        def scipy_knn():
            for s in segments:
                cKDTree(xyz[s]).query(xyz[s], k=k, workers=-1)

        peers["scipy cKDTree workers=-1"] = ("build + query per segment", scipy_knn)
    try:
        from pykdtree.kdtree import KDTree
    except ImportError:
        progress("pykdtree missing: pip install -r bench/requirements.txt")
    else:
        def pykdtree_knn():
            for s in segments:
                KDTree(xyz[s]).query(xyz[s], k=k)

        peers["pykdtree"] = ("build + query per segment, OpenMP", pykdtree_knn)
    return peers


def _case(xyz: np.ndarray, offset: np.ndarray, k: int, quick: bool) -> list[Row]:
    import opbridge

    n = len(xyz)
    segments = _segments(offset)
    xt, ot = torch.from_numpy(xyz), torch.from_numpy(offset)
    name = f"knn_query n=m={n} b=2 k={k} float32"
    threads = torch.get_num_threads()
    knn = _Knn(k)

    sess = ort_session(opbridge.export(knn, (xt, ot), input_names=["xyz", "offset"]), spinning=False)
    feeds = {"xyz": xyz, "offset": offset}
    got = sess.run(None, feeds)
    want = knn(xt, ot)
    # Not a test, but a benchmark of a wrong answer is worthless: ONNX Runtime and eager agree.
    assert np.array_equal(got[0], want[0].numpy()) and np.array_equal(got[1], want[1].numpy())

    impls = {SUBJECT: ("k-d tree per segment, built per call", lambda: sess.run(None, feeds)),
             "opbridge eager (torch.ops)": (f"{threads} torch threads", lambda: knn(xt, ot)),
             **_peers(xyz, segments, k)}
    progress(f"{name}: {', '.join(impls)}")
    rows = interleaved(name, {label: fn for label, (_, fn) in impls.items()}, rounds=3 if quick else 15,
                       notes={label: note for label, (note, _) in impls.items()})

    chunk = 1024
    brute = "torch cdist+topk (chunked)"
    progress(f"{name}: {brute}, beside the subject")
    # Seconds per call at full size: no warm-up (nothing to warm; the subject is warm already).
    pair = interleaved(name, {SUBJECT: lambda: sess.run(None, feeds),
                              brute: lambda: _torch_brute_force(xt, segments, k, chunk)},
                       rounds=3, warmup=0,
                       notes={brute: f"{chunk}-query chunks, {threads} torch threads, own rounds beside the subject"})
    rows.insert(2, pair[1])
    return rows


def _per_process_case(xyz: np.ndarray, offset: np.ndarray, k: int, quick: bool, open3d: Path | None) -> list[Row]:
    """Every library in its own worker process, timed in interleaved rounds of one request each."""
    name = f"knn_query n=m={len(xyz)} b=2 k={k} float32, each library in its own process"
    with tempfile.TemporaryDirectory() as tmp:
        case = Path(tmp) / "case.npz"
        np.savez(case, xyz=xyz, offset=offset)
        pythons = {"opbridge": sys.executable, "pykdtree": sys.executable, "scipy": sys.executable}
        if open3d is not None:
            pythons["open3d"] = open3d
        workers = {lib: Worker(python, "knn_worker.py", lib, case, k) for lib, python in pythons.items()}
        try:
            # A benchmark of a wrong answer is worthless: every library finds the same distances.
            want = None
            for lib, w in workers.items():
                w(f"save {Path(tmp) / lib}.npy")
                got = np.load(Path(tmp) / f"{lib}.npy")
                want = got if want is None else want
                assert np.allclose(got, want, rtol=1e-4, atol=1e-9), f"{lib}'s distances differ from opbridge's"
            ping = max(w.round_trip_ms() for w in workers.values())
            labels = {lib: f"{w.version} [own process]" for lib, w in workers.items()}
            progress(f"{name}: {', '.join(labels.values())}")
            return interleaved(name, {labels[lib]: (lambda w=w: w("run")) for lib, w in workers.items()},
                               rounds=3 if quick else 15,
                               notes={labels["opbridge"]: f"every library's request includes the pipe's round trip "
                                                          f"(at most {ping:.3f} ms)"})
        finally:
            for w in workers.values():
                w.close()


def run(quick: bool) -> list[Row]:
    n = 10_000 if quick else 100_000
    rng = np.random.default_rng(0)
    xyz = rng.random((n, 3), dtype=np.float32)
    offset = np.array([n // 2, n], np.int64)
    rows = [row for k in (16, 1) for row in _case(xyz, offset, k, quick)]
    open3d = bench_venv(OPEN3D_VENV, OPEN3D_PINS, "import open3d.core", create=not quick, what="knn_query with Open3D")
    return rows + [row for k in (16, 1) for row in _per_process_case(xyz, offset, k, quick, open3d)]
