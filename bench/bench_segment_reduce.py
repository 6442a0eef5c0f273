"""segment_csr, sum and max: 1 000 000 rows of 64 float32 values into 10 000 segments of 1-200
rows (torch_scatter's segment_csr; PyTorch Geometric's pooling and aggregation).

Rows, each the whole reduction:
    opbridge's SegmentCsr node in ONNX Runtime (the subject; thread spinning off), opbridge eager,
    torch.segment_reduce (lengths, unsafe=True), torch's index_add_ (sum) / index_reduce_ amax
    (max) by the segment of each row, and in ONNX Runtime the same model written with PyTorch's
    scatter_reduce and exported by the dynamo exporter (Expand + ScatterElements with a
    reduction), the graph a user gets without opbridge.
"""

from __future__ import annotations

import numpy as np
import torch

from common import Row, interleaved, ort_session, progress

SUBJECT = "opbridge SegmentCsr (ONNX Runtime)"


class _SegmentCsr(torch.nn.Module):
    def __init__(self, reduce: str):
        super().__init__()
        self.reduce = reduce

    def forward(self, src, indptr):
        return torch.ops.opbridge.segment_csr(src, indptr, self.reduce)


class _ScatterReduce(torch.nn.Module):
    """The same reduction in PyTorch ops, as a model would write it without opbridge."""

    def __init__(self, reduce: str, segments: int):
        super().__init__()
        self.reduce, self.segments = reduce, segments

    def forward(self, src, index):
        idx = index[:, None].expand(-1, src.shape[1])
        if self.reduce == "sum":
            return torch.zeros(self.segments, src.shape[1]).scatter_reduce(0, idx, src, "sum")
        return torch.full((self.segments, src.shape[1]), float("-inf")).scatter_reduce(0, idx, src, "amax")


def _case(src: torch.Tensor, sizes: torch.Tensor, reduce: str, quick: bool) -> list[Row]:
    import opbridge

    segments, (n, f) = len(sizes), src.shape
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), sizes.cumsum(0)])
    index = torch.repeat_interleave(torch.arange(segments), sizes)
    name = f"segment_csr {reduce} {n}x{f} -> {segments} segments float32"

    ours = _SegmentCsr(reduce)
    sess = ort_session(opbridge.export(ours, (src, indptr), input_names=["src", "indptr"]), spinning=False)
    feeds = {"src": src.numpy(), "indptr": indptr.numpy()}
    theirs = _ScatterReduce(reduce, segments)
    scatter_sess = ort_session(opbridge.export(theirs, (src, index), input_names=["src", "index"], exporter="dynamo"),
                               spinning=False)
    scatter_feeds = {"src": src.numpy(), "index": index.numpy()}
    got = sess.run(None, feeds)[0]
    # Every segment holds a row: the -inf start of the scatter form never shows.
    np.testing.assert_allclose(got, scatter_sess.run(None, scatter_feeds)[0], rtol=1e-4, atol=1e-3)
    want = torch.segment_reduce(src, reduce, lengths=sizes, axis=0, unsafe=True)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-3)

    if reduce == "sum":
        def index_form():
            return torch.zeros(segments, f).index_add_(0, index, src)
    else:
        def index_form():
            return torch.zeros(segments, f).index_reduce_(0, index, src, "amax", include_self=False)

    impls = {SUBJECT: lambda: sess.run(None, feeds),
             "opbridge eager (torch.ops)": lambda: ours(src, indptr),
             "torch.segment_reduce (lengths)": lambda: torch.segment_reduce(src, reduce, lengths=sizes, axis=0,
                                                                            unsafe=True),
             f"torch {'index_add_' if reduce == 'sum' else 'index_reduce_ amax'}": index_form,
             "ScatterElements export (ONNX Runtime)": lambda: scatter_sess.run(None, scatter_feeds)}
    progress(f"{name}: {', '.join(impls)}")
    return interleaved(name, impls, rounds=3 if quick else 10, max_seconds=240)


def run(quick: bool) -> list[Row]:
    n, f, segments = (100_000, 64, 1_000) if quick else (1_000_000, 64, 10_000)
    rng = np.random.default_rng(0)
    # Segment sizes 1..200 (mean about 100), scaled to add up to n.
    sizes = rng.integers(1, 201, segments)
    sizes = np.maximum(1, np.round(sizes * n / sizes.sum())).astype(np.int64)
    sizes[-1] += n - sizes.sum()
    src = torch.from_numpy(rng.standard_normal((n, f), dtype=np.float32))
    sizes_t = torch.from_numpy(sizes)
    return [row for reduce in ("sum", "max") for row in _case(src, sizes_t, reduce, quick)]
