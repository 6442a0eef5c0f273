"""segment_csr, segment_csr_arg, scatter_reduce and scatter_reduce_arg against a numpy loop written
from torch_scatter's CPU kernels: rows in increasing order, sums and means in float32 for float32
and float16, min and max from the type's largest finite value with strict comparisons (the first
row of a tie, NaN never picked), an empty segment 0 with arg n, a segment nothing beat keeping the
start (segment_csr) or 0 (scatter). Against the real torch_scatter too, where it is installed."""

import numpy as np
import pytest
import torch

from opbridge.testing import BadInput, OpCase, OpTest, Sample, random_tensor as r

OPS = torch.ops.opbridge


def largest(dtype):
    return np.float32(65504) if dtype == np.float16 else np.finfo(dtype).max


def reduce_groups(src, groups, reduce, untouched_zero):
    c = np.float64 if src.dtype == np.float64 else np.float32
    n, f = src.shape
    out = np.zeros((len(groups), f), c)
    arg = np.full((len(groups), f), n, np.int64)
    for s, rows in enumerate(groups):
        if reduce in ("sum", "add", "mean"):
            acc = np.zeros(f, c)
            for row in rows:
                acc = acc + src[row].astype(c)
            out[s] = acc / c(max(len(rows), 1)) if reduce == "mean" else acc
            continue
        start = c(largest(src.dtype))
        acc, at = np.full(f, -start if reduce == "max" else start, c), np.full(f, n, np.int64)
        for row in rows:
            v = src[row].astype(c)
            better = v > acc if reduce == "max" else v < acc
            acc, at = np.where(better, v, acc), np.where(better, row, at)
        if not rows:
            acc = np.zeros(f, c)
        elif untouched_zero:
            acc = np.where(at == n, 0, acc)
        out[s], arg[s] = acc, at
    return out.astype(src.dtype), arg


def csr_groups(indptr):
    return [list(range(indptr[s], indptr[s + 1])) for s in range(len(indptr) - 1)]


def scatter_groups(index, dim_size):
    return [[row for row in range(len(index)) if index[row] == s] for s in range(dim_size)]


def csr_reference(src, indptr, reduce="sum"):
    return reduce_groups(src, csr_groups(indptr), reduce, False)[0]


def csr_arg_reference(src, indptr, reduce="max"):
    return reduce_groups(src, csr_groups(indptr), reduce, False)


def scatter_reference(src, index, dim_size, reduce="sum"):
    return reduce_groups(src, scatter_groups(index, dim_size), reduce, True)[0]


def scatter_arg_reference(src, index, dim_size, reduce="max"):
    return reduce_groups(src, scatter_groups(index, dim_size), reduce, True)


def ptr(*bounds, dtype=torch.int64):
    return torch.tensor(bounds, dtype=dtype)


def index(n, dim_size, seed, dtype=torch.int64):
    return torch.randint(0, dim_size, (n,), generator=torch.Generator().manual_seed(seed)).to(dtype)


SPECIAL = torch.tensor([[float("nan"), 1.0, float("inf")], [float("nan"), 2.0, 5.0], [0.5, 2.0, float("-inf")],
                        [float("nan"), float("nan"), float("inf")]])

CSR_SAMPLES = [
    Sample((r([40, 6], seed=1), ptr(0, 10, 10, 25, 40)), {"reduce": reduce}, name=f"{reduce}_empty_segment")
    for reduce in ("sum", "mean", "min", "max")
] + [
    Sample((r([30, 4], "float64", seed=2), ptr(0, 3, 17, 30, dtype=torch.int32)), {"reduce": "mean"},
           name="float64_int32_indptr"),
    # Rows before indptr[0] and after indptr[-1] take part in no segment.
    Sample((r([20, 3], seed=3), ptr(4, 9, 15)), {"reduce": "max"}, name="rows_outside_segments"),
    Sample((SPECIAL, ptr(0, 2, 4)), {"reduce": "max"}, name="nan_and_inf", no_gradcheck="NaN"),
    Sample((SPECIAL, ptr(0, 4)), {"reduce": "min"}, name="nan_and_inf_min", no_gradcheck="NaN"),
    Sample((r([24, 5], "float16", seed=4), ptr(0, 8, 24)), {"reduce": "sum"}, name="float16"),
    Sample((r([0, 3], seed=5), ptr(0, 0, 0)), {"reduce": "max"}, name="no_rows"),
]


class TestSegmentCsr(OpTest):
    case = OpCase(
        "segment_csr",
        reference=csr_reference,
        samples=CSR_SAMPLES,
        bad_inputs=[
            BadInput((r([10, 2]), ptr(0, 5, 11)), {"reduce": "sum"}, r"indptr\[2\] = 11 is not a row boundary of src",
                     "indptr_past_the_end"),
            BadInput((r([10, 2]), ptr(0, 6, 5)), {"reduce": "sum"},
                     r"indptr must be non-decreasing, but indptr\[1\] = 6 > indptr\[2\] = 5", "indptr_decreasing"),
            BadInput((r([10, 2]), ptr(0, 10)), {"reduce": "prod"},
                     'reduce must be "sum", "mean", "min" or "max", got "prod"', "unknown_reduce"),
            BadInput((r([10, 2]), torch.zeros(0, dtype=torch.int64)), {}, "indptr must hold at least one boundary",
                     "empty_indptr"),
        ],
        resize=lambda s, n: Sample((r([40, n], seed=n), s.inputs[1]), s.attrs),
    )


class TestSegmentCsrArg(OpTest):
    case = OpCase(
        "segment_csr_arg",
        reference=csr_arg_reference,
        samples=[
            Sample((r([40, 6], seed=6), ptr(0, 12, 12, 40)), {"reduce": "max"}, name="max"),
            Sample((r([40, 6], "float64", seed=7), ptr(0, 1, 30, 40)), {"reduce": "min"}, name="min_float64"),
            # Ties: the first row of a tie wins.
            Sample((torch.tensor([[1.0, 2.0], [3.0, 2.0], [3.0, 0.0]]), ptr(0, 3)), {"reduce": "max"}, name="ties",
                   no_gradcheck="ties"),
            Sample((SPECIAL, ptr(0, 1, 3, 4)), {"reduce": "max"}, name="nan_and_inf", no_gradcheck="NaN"),
        ],
        bad_inputs=[
            BadInput((r([10, 2]), ptr(0, 10)), {"reduce": "sum"}, 'reduce must be "min" or "max", got "sum"',
                     "sum_has_no_arg"),
        ],
    )


SCATTER_SAMPLES = [
    Sample((r([50, 4], seed=8), index(50, 12, 9), 15), {"reduce": reduce}, name=reduce)
    for reduce in ("sum", "mean", "min", "max")
] + [
    Sample((r([30, 3], "float64", seed=10), index(30, 5, 11, torch.int32), 5), {"reduce": "mean"},
           name="float64_int32_index"),
    Sample((SPECIAL, torch.tensor([1, 1, 0, 2]), 4), {"reduce": "max"}, name="nan_and_inf", no_gradcheck="NaN"),
    Sample((r([0, 2], seed=12), torch.zeros(0, dtype=torch.int64), 3), {"reduce": "min"}, name="no_rows"),
]


class TestScatterReduce(OpTest):
    case = OpCase(
        "scatter_reduce",
        reference=scatter_reference,
        samples=[Sample(s.inputs[:2], {**s.attrs, "dim_size": int(s.inputs[2])}, name=s.name,
                        no_gradcheck=s.no_gradcheck) for s in SCATTER_SAMPLES],
        bad_inputs=[
            BadInput((r([6, 2]), torch.tensor([0, 1, 2, 3, 4, 9])), {"dim_size": 5},
                     r"index\[5\] = 9 is outside \[0, dim_size = 5\)", "index_past_dim_size"),
            BadInput((r([6, 2]), torch.tensor([0, -1, 2, 3, 4, 0])), {"dim_size": 5},
                     r"index\[1\] = -1 is outside", "negative_index"),
            BadInput((r([6, 2]), torch.tensor([0, 1])), {"dim_size": 5}, "index must have one entry per row of src",
                     "index_length"),
        ],
    )


class TestScatterReduceArg(OpTest):
    case = OpCase(
        "scatter_reduce_arg",
        reference=scatter_arg_reference,
        samples=[
            Sample((r([50, 4], seed=13), index(50, 9, 14)), {"dim_size": 12, "reduce": "max"}, name="max"),
            Sample((r([50, 4], "float64", seed=15), index(50, 9, 16)), {"dim_size": 9, "reduce": "min"},
                   name="min_float64"),
        ],
    )


def sorted_index(n, dim_size, seed, dtype=torch.int64):
    return index(n, dim_size, seed, dtype).sort().values


class TestSegmentCoo(OpTest):
    case = OpCase(
        "segment_coo",
        reference=scatter_reference,
        samples=[
            Sample((r([50, 4], seed=22), sorted_index(50, 12, 23)), {"dim_size": 15, "reduce": reduce}, name=reduce)
            for reduce in ("sum", "mean", "min", "max")
        ] + [
            Sample((r([30, 3], "float64", seed=24), sorted_index(30, 5, 25, torch.int32)), {"dim_size": 5,
                   "reduce": "mean"}, name="float64_int32_index"),
            Sample((r([24, 5], "float16", seed=26), sorted_index(24, 4, 27)), {"dim_size": 4, "reduce": "sum"},
                   name="float16"),
            Sample((SPECIAL, torch.tensor([0, 1, 1, 3])), {"dim_size": 4, "reduce": "max"}, name="nan_and_inf",
                   no_gradcheck="NaN"),
            Sample((r([0, 2], seed=28), torch.zeros(0, dtype=torch.int64)), {"dim_size": 3, "reduce": "min"},
                   name="no_rows"),
        ],
        bad_inputs=[
            BadInput((r([5, 2]), torch.tensor([0, 1, 3, 2, 4])), {"dim_size": 5},
                     r"index must be sorted, but index\[2\] = 3 > index\[3\] = 2", "unsorted_index"),
            BadInput((r([5, 2]), torch.tensor([0, 1, 2, 3, 7])), {"dim_size": 5},
                     r"index\[4\] = 7 is outside \[0, dim_size = 5\)", "index_past_dim_size"),
            # The batch-vector rule every op shares (batch_pointers, radius): negative ids refused.
            BadInput((r([5, 2]), torch.tensor([-1, -1, 0, 1, 1])), {"dim_size": 5},
                     r"index\[0\] = -1 is negative; a batch vector numbers the examples from 0", "negative_index"),
        ],
    )


class TestSegmentCooArg(OpTest):
    case = OpCase(
        "segment_coo_arg",
        reference=scatter_arg_reference,
        samples=[
            Sample((r([50, 4], seed=29), sorted_index(50, 9, 30)), {"dim_size": 12, "reduce": "max"}, name="max"),
            Sample((r([50, 4], "float64", seed=31), sorted_index(50, 9, 32)), {"dim_size": 9, "reduce": "min"},
                   name="min_float64"),
            Sample((torch.tensor([[1.0, 2.0], [3.0, 2.0], [3.0, 0.0]]), torch.tensor([1, 1, 1])),
                   {"dim_size": 2, "reduce": "max"}, name="ties", no_gradcheck="ties"),
        ],
    )


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_bfloat16_reduces_in_float32_and_rounds_once(reduce):
    src, idx = (torch.randn(300, 6, generator=torch.Generator().manual_seed(35)) * 50).bfloat16(), sorted_index(300, 9, 36)
    want = torch.from_numpy(scatter_reference(src.float().numpy(), idx.numpy(), 9, reduce)).bfloat16()
    for got in (OPS.segment_coo(src, idx, 9, reduce), OPS.scatter_reduce(src, idx, 9, reduce)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_segment_coo_is_scatter_reduce_of_a_sorted_index():
    src, idx = r([400, 7], seed=33), sorted_index(400, 50, 34)
    for reduce in ("sum", "mean", "min", "max"):
        torch.testing.assert_close(OPS.segment_coo(src, idx, 60, reduce), OPS.scatter_reduce(src, idx, 60, reduce),
                                   rtol=0, atol=0)


@pytest.mark.parametrize("reduce", ["sum", "mean", "min", "max"])
def test_agrees_with_torch_scatter(reduce):
    torch_scatter = pytest.importorskip("torch_scatter", reason="torch_scatter is not installed (it builds from source "
                                                               "against torch: scripts/oracles.sh)")
    src, indptr = r([300, 8], seed=17), ptr(0, 40, 40, 150, 300)
    want = torch_scatter.segment_csr(src, indptr, reduce=reduce)
    torch.testing.assert_close(OPS.segment_csr(src, indptr, reduce), want, rtol=0, atol=0)
    idx = index(300, 20, 18)
    want = torch_scatter.scatter(src, idx, dim=0, dim_size=24, reduce=reduce)
    torch.testing.assert_close(OPS.scatter_reduce(src, idx, 24, reduce), want, rtol=0, atol=0)
    sorted_idx = idx.sort().values
    want = torch_scatter.segment_coo(src, sorted_idx, dim_size=24, reduce=reduce)
    torch.testing.assert_close(OPS.segment_coo(src, sorted_idx, 24, reduce), want, rtol=0, atol=0)
    if reduce in ("min", "max"):
        out, arg = getattr(torch_scatter, f"scatter_{reduce}")(src, idx, dim=0, dim_size=24)
        got = OPS.scatter_reduce_arg(src, idx, 24, reduce)
        torch.testing.assert_close(got[0], out, rtol=0, atol=0)
        torch.testing.assert_close(got[1], arg, rtol=0, atol=0)


@pytest.mark.parametrize("reduce", ["sum", "mean", "min", "max"])
def test_gradients_agree_with_torch_scatter(reduce):
    torch_scatter = pytest.importorskip("torch_scatter", reason="torch_scatter is not installed")
    src = r([200, 6], "float64", seed=37).requires_grad_()
    indptr, idx = ptr(0, 30, 30, 120, 200), sorted_index(200, 9, 38)
    for ours, theirs in (
        (lambda: OPS.segment_csr(src, indptr, reduce), lambda: torch_scatter.segment_csr(src, indptr, reduce=reduce)),
        (lambda: OPS.segment_coo(src, idx, 9, reduce), lambda: torch_scatter.segment_coo(src, idx, dim_size=9,
                                                                                          reduce=reduce)),
        (lambda: OPS.scatter_reduce(src, idx, 9, reduce), lambda: torch_scatter.scatter(src, idx, 0, dim_size=9,
                                                                                         reduce=reduce)),
    ):
        out = ours()
        grad = r(list(out.shape), "float64", seed=39)
        torch.testing.assert_close(torch.autograd.grad(out, src, grad)[0], torch.autograd.grad(theirs(), src, grad)[0])


@pytest.mark.parametrize("reduce", ["sum", "mean", "min", "max"])
def test_gradients_against_pytorch(reduce):
    # sum and mean: each row gets its segment's gradient (over the count); min and max: the row
    # that won (no ties here), as torch's scatter_reduce gives them.
    src = r([60, 5], "float64", seed=19).requires_grad_()
    idx = index(60, 7, 20)
    grad = r([7, 5], "float64", seed=21)
    (got,) = torch.autograd.grad(OPS.scatter_reduce(src, idx, 7, reduce), src, grad)
    amode = {"sum": "sum", "mean": "mean", "min": "amin", "max": "amax"}[reduce]
    want_out = torch.zeros(7, 5, dtype=torch.float64).scatter_reduce(0, idx[:, None].expand(60, 5), src, amode,
                                                                      include_self=False)
    (want,) = torch.autograd.grad(want_out, src, grad)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_arg_backward_adds_up_a_row_named_twice_whatever_the_threads(dtype):
    """No forward names a row twice, but an arg given to the backward may: the gradients add, in
    segment order, the same on 1 and 2 threads (a fuzzed case once showed a race here)."""
    g = torch.Generator().manual_seed(3)
    grad = torch.randn(9, 6, generator=g).to(dtype)
    src = torch.ones(2, 6, dtype=dtype)
    arg = torch.randint(0, 3, (9, 6), generator=g)  # 2 is the empty marker (n)
    want = np.zeros((2, 6), np.float32)
    for s in range(9):
        for c in range(6):
            if arg[s, c] < 2:  # add in order, rounding to dtype after each addition as the kernel does
                want[arg[s, c], c] = torch.tensor(want[arg[s, c], c] + grad[s, c].float().item()).to(dtype).float()
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            got = OPS.arg_reduce_backward(grad, src, arg, "max")
            np.testing.assert_array_equal(got.float().numpy(), want)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("reduce", ["sum", "mean", "min", "max"])
def test_rows_wider_than_a_column_block(reduce):
    """The kernel reduces 4096 columns at a time: 9000 columns take three blocks, the last short."""
    src = r([7, 9000], seed=40)
    indptr = ptr(0, 3, 3, 7)  # an empty segment between two
    np.testing.assert_array_equal(OPS.segment_csr(src, indptr, reduce).numpy(),
                                  csr_reference(src.numpy(), indptr.numpy(), reduce))
    if reduce in ("min", "max"):
        out, arg = OPS.segment_csr_arg(src, indptr, reduce)
        want_out, want_arg = csr_arg_reference(src.numpy(), indptr.numpy(), reduce)
        np.testing.assert_array_equal(out.numpy(), want_out)
        np.testing.assert_array_equal(arg.numpy(), want_arg)
