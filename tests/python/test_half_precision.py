"""float16 and bfloat16: ops that take them compute in float32 and round once, so a 16-bit result
is within half a unit in the last place of the float32 result on the same (16-bit) inputs. Checked
in eager and through ONNX Runtime with both exporters."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import opbridge

# Relative spacing of each format (2^-mantissa bits) and its smallest subnormal.
FORMATS = {torch.float16: (2.0**-10, 2.0**-24), torch.bfloat16: (2.0**-7, 2.0**-133)}


def assert_rounded_from(got: torch.Tensor, exact: torch.Tensor):
    """`got` (16-bit) is within half an ulp of the float32 `exact`."""
    eps, tiny = FORMATS[got.dtype]
    err = (got.float() - exact).abs()
    bound = 0.5 * eps * exact.abs() + tiny
    assert bool((err <= bound).all()), f"max error {err.max().item()} beyond half an ulp of {got.dtype}"


class MyAdd(torch.nn.Module):
    def forward(self, a, b):
        return opbridge.my_add(a, b)


class DualResidual(torch.nn.Module):
    def forward(self, x, y):
        return opbridge.dual_residual(x, y, alpha=1.7)


class DeformConv(torch.nn.Module):
    def forward(self, x, weight, offset, bias, mask):
        return opbridge.deform_conv2d(x, weight, offset, bias, mask, padding=[1, 1])


class Resize(torch.nn.Module):
    def forward(self, x, scales):
        return opbridge.resize_bicubic(x, scales)


# op -> (model, input shapes, inputs kept in float32: resize_bicubic's scales are always float32)
CASES = {
    "my_add": (MyAdd, [(5, 6), (6,)], ()),
    "dual_residual": (DualResidual, [(4, 1, 3), (2, 3)], ()),
    "deform_conv2d": (DeformConv, [(2, 4, 7, 7), (6, 4, 3, 3), (2, 18, 7, 7), (6,), (2, 9, 7, 7)], ()),
    "resize_bicubic": (Resize, [(1, 2, 6, 5)], (torch.tensor([1.0, 1.0, 2.0, 1.5]),)),
}


def _inputs(op, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes, fixed = CASES[op][1], CASES[op][2]
    return tuple((torch.randn(s, generator=g) * 4).to(dtype) for s in shapes) + fixed


def _float32_result(model, args):
    out = model(*(a.float() for a in args))
    return [out] if isinstance(out, torch.Tensor) else list(out)


@pytest.mark.parametrize("dtype", FORMATS, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("op", CASES)
def test_eager_rounds_the_float32_result(op, dtype):
    model, args = CASES[op][0](), _inputs(op, dtype)
    got = model(*args)
    got = [got] if isinstance(got, torch.Tensor) else list(got)
    for g, exact in zip(got, _float32_result(model, args)):
        assert g.dtype == dtype and g.shape == exact.shape
        assert_rounded_from(g, exact)


def _run_in_onnxruntime(m: onnx.ModelProto, args) -> list[torch.Tensor]:
    """Runs the model on 16-bit inputs; outputs come back through a Cast to float32 (exact for
    16-bit values), since numpy has no bfloat16."""
    m = onnx.ModelProto.FromString(m.SerializeToString())
    for k, out in enumerate(list(m.graph.output)):
        cast_name = f"{out.name}_as_float"
        m.graph.node.append(onnx.helper.make_node("Cast", [out.name], [cast_name], to=onnx.TensorProto.FLOAT))
        m.graph.output[k].CopyFrom(onnx.helper.make_tensor_value_info(cast_name, onnx.TensorProto.FLOAT, None))
    sess = opbridge.session(m)
    feeds = {}
    for i, a in zip(m.graph.input, args):
        if a.dtype == torch.float32:
            feeds[i.name] = ort.OrtValue.ortvalue_from_numpy(a.numpy())
            continue
        onnx_type = onnx.TensorProto.FLOAT16 if a.dtype == torch.float16 else onnx.TensorProto.BFLOAT16
        feeds[i.name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a.view(torch.int16).numpy(), onnx_type)
    return [torch.from_numpy(v.numpy()) for v in sess.run_with_ort_values(None, feeds)]


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
@pytest.mark.parametrize("dtype", FORMATS, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("op", CASES)
def test_onnxruntime_matches_eager_bit_for_bit(op, dtype, exporter):
    model, args = CASES[op][0](), _inputs(op, dtype, seed=1)
    m = opbridge.export(model, args, exporter=exporter)
    elem = onnx.TensorProto.FLOAT16 if dtype == torch.float16 else onnx.TensorProto.BFLOAT16
    assert all(i.type.tensor_type.elem_type in (elem, onnx.TensorProto.FLOAT) for i in m.graph.input)
    # Every node is opbridge's: ONNX Runtime's DeformConv and Resize have no 16-bit kernels.
    assert all(n.domain == "opbridge" for n in m.graph.node), [(n.domain, n.op_type) for n in m.graph.node]
    eager = model(*args)
    eager = [eager] if isinstance(eager, torch.Tensor) else list(eager)
    got = _run_in_onnxruntime(m, args)
    for g, e, exact in zip(got, eager, _float32_result(model, args)):
        assert torch.equal(g, e.float()), "ONNX Runtime and eager run the same kernel: same bits"
        assert_rounded_from(g.to(dtype), exact)


class Block(torch.nn.Module):
    """A float16 block: deformable convolution, my_add, bicubic resize by run-time scales."""

    def forward(self, x, weight, offset, bias, mask, scales):
        y = opbridge.deform_conv2d(x, weight, offset, bias, mask, padding=[1, 1])
        return opbridge.resize_bicubic(opbridge.my_add(y, y), scales)


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_float16_model_runs_in_onnxruntime_as_in_eager(exporter):
    args = _inputs("deform_conv2d", torch.float16, seed=3) + (torch.tensor([1.0, 1.0, 1.5, 2.0]),)
    m = opbridge.export(Block(), args, exporter=exporter)
    assert {n.op_type for n in m.graph.node} == {"DeformConv2d", "MyAdd", "ResizeBicubic"}
    report = opbridge.verify(Block(), args, m, rtol=0, atol=0)  # the same kernels: the same bits
    assert report.ok, report.table()
    # Each op is within half an ulp of its float32 result (checked above). Along the block, the
    # intermediate roundings (relative 2^-11 of values up to max|y|) pass through the resize's
    # cubic weights (absolute sum <= 1.5 per axis): a bound in units of the largest value.
    exact = Block()(*(a.float() for a in args))
    got = Block()(*args).float()
    bound = 3 * 2.0**-11 * 1.5**2 * float(exact.abs().max())
    assert float((got - exact).abs().max()) <= bound


def test_float16_verify_and_mixed_precision_refusal():
    a, b = _inputs("my_add", torch.float16, seed=2)
    m = opbridge.export(MyAdd(), (a, b))
    report = opbridge.verify(MyAdd(), (a, b), m, rtol=0, atol=0)
    assert report.ok, report.table()
    with pytest.raises(RuntimeError, match="opbridge::my_add: inputs 'a' \\(float16\\) and 'b' \\(float32\\) must have "
                                           "the same dtype"):
        opbridge.my_add(a, b.float())


class Knn(torch.nn.Module):
    def forward(self, xyz, offset, new_xyz, new_offset):
        return opbridge.knn_query(xyz, offset, new_xyz, new_offset, k=5)


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_knn_on_float16_coordinates(exporter):
    # Neighbours and distances computed in float32 on the float16 coordinates; the distances are
    # rounded to float16 once.
    g = torch.Generator().manual_seed(4)
    xyz, q = torch.rand(60, 3, generator=g).half(), torch.rand(20, 3, generator=g).half()
    off, qoff = torch.tensor([30, 60], dtype=torch.int32), torch.tensor([8, 20], dtype=torch.int32)
    idx, dist = Knn()(xyz, off, q, qoff)
    idx32, dist32 = Knn()(xyz.float(), off, q.float(), qoff)
    assert dist.dtype == torch.float16 and torch.equal(idx, idx32)
    assert_rounded_from(dist, dist32)
    m = opbridge.export(Knn(), (xyz, off, q, qoff), exporter=exporter)
    report = opbridge.verify(Knn(), (xyz, off, q, qoff), m, rtol=0, atol=0)
    assert report.ok, report.table()
    # The gradient runs in float16 too (computed in float32).
    xyz_g = xyz.clone().requires_grad_()
    _, d = Knn()(xyz_g, off, q, qoff)
    (gx,) = torch.autograd.grad(d.float().sum(), xyz_g)
    assert gx.dtype == torch.float16 and bool(torch.isfinite(gx).all())
