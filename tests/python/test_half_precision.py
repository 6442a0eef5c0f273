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


CASES = {"my_add": (MyAdd, [(5, 6), (6,)]), "dual_residual": (DualResidual, [(4, 1, 3), (2, 3)])}


def _inputs(shapes, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple((torch.randn(s, generator=g) * 40).to(dtype) for s in shapes)


def _float32_result(model, args):
    out = model(*(a.float() for a in args))
    return [out] if isinstance(out, torch.Tensor) else list(out)


@pytest.mark.parametrize("dtype", FORMATS, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("op", CASES)
def test_eager_rounds_the_float32_result(op, dtype):
    model, shapes = CASES[op][0](), CASES[op][1]
    args = _inputs(shapes, dtype)
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
        onnx_type = onnx.TensorProto.FLOAT16 if a.dtype == torch.float16 else onnx.TensorProto.BFLOAT16
        feeds[i.name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a.view(torch.int16).numpy(), onnx_type)
    return [torch.from_numpy(v.numpy()) for v in sess.run_with_ort_values(None, feeds)]


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
@pytest.mark.parametrize("dtype", FORMATS, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("op", CASES)
def test_onnxruntime_matches_eager_bit_for_bit(op, dtype, exporter):
    model, shapes = CASES[op][0](), CASES[op][1]
    args = _inputs(shapes, dtype, seed=1)
    m = opbridge.export(model, args, exporter=exporter)
    elem = onnx.TensorProto.FLOAT16 if dtype == torch.float16 else onnx.TensorProto.BFLOAT16
    assert all(i.type.tensor_type.elem_type == elem for i in m.graph.input)
    eager = model(*args)
    eager = [eager] if isinstance(eager, torch.Tensor) else list(eager)
    got = _run_in_onnxruntime(m, args)
    for g, e, exact in zip(got, eager, _float32_result(model, args)):
        assert torch.equal(g, e.float()), "ONNX Runtime and eager run the same kernel: same bits"
        assert_rounded_from(g.to(dtype), exact)


def test_float16_verify_and_mixed_precision_refusal():
    a, b = _inputs([(3, 3), (3,)], torch.float16, seed=2)
    m = opbridge.export(MyAdd(), (a, b))
    report = opbridge.verify(MyAdd(), (a, b), m, rtol=0, atol=0)
    assert report.ok, report.table()
    with pytest.raises(RuntimeError, match="opbridge::my_add: inputs 'a' \\(float16\\) and 'b' \\(float32\\) must have "
                                           "the same dtype"):
        opbridge.my_add(a, b.float())
