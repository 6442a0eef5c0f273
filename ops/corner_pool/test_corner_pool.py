"""corner_pool: corner pooling with the semantics of mmcv's CornerPool.

Oracles: a numpy loop written from the definition (each output scans its stretch of the row or
column from the sweep's start with torch.cummax's rule); mmcv's forward written out here (flip,
torch.cummax, flip back), compared bit for bit, and PyTorch's autograd through it for the gradient,
also bit for bit; finite differences (the suite's gradcheck)."""

import re
import sys
import types

import numpy as np
import pytest
import torch

import opbridge
from opbridge.testing import BadInput, OpCase, OpTest, Sample, node_model, random_tensor as r

OP = torch.ops.opbridge.corner_pool
BACKWARD = torch.ops.opbridge.corner_pool_backward
MODES = ("top", "bottom", "left", "right")
# mmcv's CornerPool.cummax_dim_flip: the axis of torch.cummax, and whether to flip around it.
DIM_FLIP = {"bottom": (2, False), "left": (3, True), "right": (3, False), "top": (2, True)}


def reference(x, mode):
    """Output (h, w) is the running maximum along the sweep of `mode`, up to (h, w): the maximum
    moves to a value that is NaN, or that is >= it when neither is NaN."""
    axis, flip = DIM_FLIP[mode]
    lines = np.moveaxis(x, axis, -1)
    lines = lines[..., ::-1] if flip else lines
    out = np.empty_like(lines)
    for idx in np.ndindex(lines.shape[:-1]):
        best = None
        for k in range(lines.shape[-1]):
            v = lines[idx + (k,)]
            if best is None or np.isnan(v) or (not np.isnan(best) and v >= best):
                best = v
            out[idx + (k,)] = best
    out = out[..., ::-1] if flip else out
    return np.ascontiguousarray(np.moveaxis(out, -1, axis))


def mmcv_forward(x, mode):
    """mmcv's CornerPool.forward on torch >= 1.5."""
    dim, flip = DIM_FLIP[mode]
    if flip:
        x = x.flip(dim)
    pool, _ = torch.cummax(x, dim=dim)
    return pool.flip(dim) if flip else pool


def ties(shape, dtype=torch.float32, seed=0, nan=True):
    """Values from a small set: ties, both zeros, infinities and (with nan) NaNs."""
    pool = torch.tensor([-1.0, 0.0, -0.0, 1.0, 2.0, 2.0, 3.0, -2.5, float("-inf"), float("inf")]
                        + ([float("nan")] if nan else []), dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    return pool[torch.randint(len(pool), shape, generator=g)].to(dtype)


def bits(t):
    """A tensor's bit patterns, for comparisons that tell -0.0 from 0.0 and NaN from NaN."""
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def resize(smp: Sample, n: int) -> Sample:
    x = smp.inputs[0]
    return Sample((r([n, x.shape[1], n + 2, 2 * n + 1], str(x.dtype).split(".")[1], seed=n),), smp.attrs)


SAMPLES = [
    *(Sample((r([2, 3, 5, 7], seed=k),), {"mode": m}, name=m, dynamic={0: [0, 2, 3]}) for k, m in enumerate(MODES)),
    *(Sample((r([1, 4, 6, 3], "float64", seed=10 + k),), {"mode": m}, name="float64_" + m)
      for k, m in enumerate(MODES)),
    Sample((r([2, 2, 4, 5], "float16", seed=20),), {"mode": "top"}, name="float16_top"),
    Sample((r([1, 2, 3, 9], "float16", seed=21),), {"mode": "left"}, name="float16_left"),
    # NaNs are left to the tests below (opcheck's comparison takes NaN != NaN).
    Sample((ties([2, 3, 6, 6], seed=22, nan=False),), {"mode": "bottom"}, name="ties_zeros_inf",
           no_gradcheck="exact ties: corner pooling is not differentiable there"),
    Sample((r([1, 2, 1, 1], seed=23),), {"mode": "right"}, name="one_pixel"),
    Sample((r([0, 3, 4, 4], seed=24),), {"mode": "top"}, name="empty_batch"),
    Sample((r([2, 3, 0, 4], seed=25),), {"mode": "left"}, name="empty_height"),
]

BAD = [
    BadInput((r([1, 2, 3, 3]),), {"mode": "diagonal"},
             re.escape("mode must be 'top', 'bottom', 'left' or 'right', got 'diagonal'"), "unknown_mode"),
    BadInput((r([1, 2, 3, 3]),), {}, re.escape("mode must be 'top', 'bottom', 'left' or 'right', got ''"),
             "no_mode"),
    BadInput((r([2, 3, 3]),), {"mode": "top"}, "input 'x' must have rank 4", "rank_3"),
    BadInput((r([1, 2, 3, 3]).long(),), {"mode": "top"}, "input 'x' has dtype int64", "integer_input"),
]


class TestCornerPool(OpTest):
    case = OpCase("corner_pool", reference=reference, samples=SAMPLES, bad_inputs=BAD, rtol=0, atol=0,
                  resize=resize)


# ---- against mmcv's formula, bit for bit ------------------------------------------------------

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_forward_is_mmcv_cummax_bit_for_bit(mode, dtype):
    for x in (ties([2, 3, 9, 11], dtype, seed=1), r([2, 3, 40, 70], seed=2).to(dtype)):
        assert torch.equal(bits(OP(x, mode=mode)), bits(mmcv_forward(x, mode)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_gradient_is_torch_autograd_of_mmcv_forward_bit_for_bit(mode, dtype):
    # Ties, NaNs and few distinct values: long runs of outputs share one maximum, so each input's
    # gradient is a sum of many incoming gradients, in the order PyTorch adds them.
    for x, nan in ((ties([2, 3, 12, 13], dtype, seed=3), True), (ties([1, 2, 30, 31], dtype, seed=4, nan=False), False),
                   (r([2, 3, 17, 19], seed=5).to(dtype), False)):
        g = r(list(x.shape), seed=6).to(dtype)
        want_x = x.clone().requires_grad_()
        (want,) = torch.autograd.grad(mmcv_forward(want_x, mode), want_x, g)
        got_x = x.clone().requires_grad_()
        (got,) = torch.autograd.grad(OP(got_x, mode=mode), got_x, g)
        assert torch.equal(bits(got), bits(want)), (mode, dtype, nan)
        assert torch.equal(bits(BACKWARD(g, x, mode=mode)), bits(want))


def test_nan_propagates_and_ties_move_the_maximum_on():
    x = torch.tensor([1.0, 3.0, 3.0, 2.0, float("nan"), 5.0]).view(1, 1, 1, 6)
    torch.testing.assert_close(OP(x, mode="right").flatten(), torch.tensor([1.0, 3, 3, 3, float("nan"), float("nan")]),
                               equal_nan=True)
    g = torch.tensor([1.0, 10, 100, 1000, 1e4, 1e5]).view(1, 1, 1, 6)
    # The tie at 3 moves the maximum to the later 3; the NaN holds its own and every later gradient.
    assert BACKWARD(g, x, mode="right").flatten().tolist() == [1.0, 10.0, 1100.0, 0.0, 1.1e5, 0.0]
    # 'left' sweeps from the right: the tie now goes to the earlier 3 (later in the sweep).
    assert OP(x.flip(3), mode="left").flip(3).flatten()[:4].tolist() == [1.0, 3.0, 3.0, 3.0]


def test_gradient_lines_do_not_mix():
    # A maximum in one column (row) sends nothing to another.
    x = torch.zeros(1, 1, 3, 3)
    x[0, 0, 0, 1] = 5.0
    g = torch.arange(9.0).view(1, 1, 3, 3)
    # bottom: in the columns of zeros every output ties and holds its own position; column 1's
    # 5 holds every output below it.
    want = g.clone()
    want[0, 0, :, 1] = 0
    want[0, 0, 0, 1] = g[0, 0, :, 1].sum()
    assert torch.equal(BACKWARD(g, x, mode="bottom"), want)


def test_backward_refuses_a_gradient_of_another_shape():
    with pytest.raises(RuntimeError, match=re.escape("opbridge::corner_pool_backward: grad_output must have the "
                                                     "shape of x (grad_output.shape[3] = 4, x.shape[3] = 5)")):
        BACKWARD(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 5), mode="top")


def test_onnxruntime_refuses_an_unknown_mode():
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument, RuntimeException

    info = next(op for op in opbridge.all_ops() if op.name == "corner_pool")
    x = r([1, 2, 3, 4]).numpy()
    sess = opbridge.session(node_model(info, [x], {"mode": "diagonal"}))
    with pytest.raises((Fail, InvalidArgument, RuntimeException),
                       match=re.escape("opbridge::corner_pool") + ".*" +
                       re.escape("mode must be 'top', 'bottom', 'left' or 'right', got 'diagonal'")):
        sess.run(None, {"x": x})
    # The process survived: a well-formed node still runs and is right.
    out = opbridge.session(node_model(info, [x], {"mode": "left"})).run(None, {"x": x})[0]
    np.testing.assert_array_equal(out, reference(x, "left"))


# ---- substitution of mmcv's CornerPool.forward -------------------------------------------------

@pytest.fixture
def mmcv_standin(monkeypatch):
    """mmcv.ops.corner_pool shaped as mmcv's: CornerPool(mode) keeps its mode and runs cummax."""
    for name in ["mmcv", "mmcv.ops", "mmcv.ops.corner_pool"]:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    module = sys.modules["mmcv.ops.corner_pool"]

    class CornerPool(torch.nn.Module):
        def __init__(self, mode):
            super().__init__()
            self.mode = mode

        def forward(self, x):
            return mmcv_forward(x, self.mode)

    CornerPool.__module__ = module.__name__
    module.CornerPool = CornerPool
    return module


class Head(torch.nn.Module):
    """CornerNet's pooling block, in short: two corner pools summed after a convolution."""

    def __init__(self, pool):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.a, self.b = pool("top"), pool("left")
        self.c, self.d = pool("bottom"), pool("right")

    def forward(self, x):
        y = self.conv(x)
        return self.a(y) + self.b(y), self.c(y) * self.d(y)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_mmcv_corner_pool_exports_through_the_rule(mmcv_standin, exporter):
    import opbridge.compat.mmcv.corner_pool  # noqa: F401  (the rule)

    torch.manual_seed(0)
    model = Head(mmcv_standin.CornerPool).eval()
    x, x2 = r([1, 4, 8, 9], seed=30), r([2, 4, 13, 6], seed=31)
    with torch.no_grad():
        eager, eager2 = model(x), model(x2)
    with opbridge.substitutions(model), torch.no_grad():
        for got, want in zip(model(x), eager):  # eager on opbridge's op: mmcv's values, bit for bit
            assert torch.equal(got, want)
    proto = opbridge.export(model, (x,), exporter=exporter, input_names=["x"],
                            dynamic_axes={"x": {0: "n", 2: "h", 3: "w"}} if exporter == "torchscript" else None,
                            dynamic_shapes=None if exporter == "torchscript" else
                            ({0: torch.export.Dim("n"), 2: torch.export.Dim("h"), 3: torch.export.Dim("w")},))
    assert [n.op_type for n in proto.graph.node if n.domain == "opbridge"] == ["CornerPool"] * 4
    sess = opbridge.session(proto)
    for inp, want in ((x, eager), (x2, eager2)):
        for got, w in zip(sess.run(None, {"x": inp.numpy()}), want):
            np.testing.assert_allclose(got, w.numpy(), rtol=1e-5, atol=1e-6)
