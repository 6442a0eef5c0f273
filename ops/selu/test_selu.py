"""selu: PyTorch's aten::selu exported as an ONNX function (FunctionProto in opbridge's domain)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import opbridge
from opbridge.testing import OpCase, OpTest, Sample, random_tensor as r

ALPHA = 1.6732632423543772
SCALE = 1.0507009873554805


def reference(x):
    # In float64, then cast: an independent formula (numpy, not the ONNX body).
    x64 = x.astype(np.float64)
    return (SCALE * np.where(x64 > 0, x64, ALPHA * np.expm1(x64))).astype(x.dtype)


def resize(sample, n):
    return Sample((r([n, 3], seed=n),), sample.attrs)


class TestSelu(OpTest):
    case = OpCase(
        "selu",
        reference=reference,
        samples=[
            Sample((r([4, 3]),), name="float32", dynamic={0: [0]}),
            Sample((r([2, 3, 5], "float64"),), name="float64"),
            Sample((r([0, 3]),), name="empty"),
            Sample((r([1]),), name="one_element"),
        ],
        # float32: ONNX Runtime's Exp and Log in the body are a few ulps from numpy's expm1.
        rtol=2e-6,
        atol=1e-6,
        resize=resize,
    )


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.selu(x) * 2


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_exported_as_a_function_that_plain_onnxruntime_runs(exporter):
    x = r([3, 4], seed=7)
    m = opbridge.export(Model(), (x,), exporter=exporter)
    # One FunctionProto in opbridge's domain, called by one node; its body is standard ONNX.
    assert [(f.domain, f.name) for f in m.functions] == [("opbridge", "Selu")]
    assert ("opbridge", "Selu") in {(n.domain, n.op_type) for n in m.graph.node}
    assert {n.domain for n in m.functions[0].node} == {""}
    model_opset = next(o.version for o in m.opset_import if o.domain == "")
    assert [(o.domain, o.version) for o in m.functions[0].opset_import] == [("", model_opset)]
    # No opbridge library registered: ONNX Runtime inlines the function.
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
    np.testing.assert_allclose(got, reference(x.numpy()) * 2, rtol=2e-6, atol=1e-6)
    onnx.checker.check_model(m, full_check=True)


def test_opset_too_old_for_the_body_is_a_clear_error():
    with pytest.raises(opbridge.OpbridgeError, match=r"aten::selu: cannot be exported at opset 14: .*Selu from opset 15"):
        opbridge.export(Model(), (r([2, 2]),), exporter="torchscript", opset=14)


def test_same_results_as_the_seed_onnxscript_function():
    # The seed note's Selu, written with onnxscript in its own custom domain: opbridge's function
    # (ONNX text in the C++ definition) must compute what that one computes in ONNX Runtime.
    import onnxscript
    from onnx import helper
    from onnxscript.onnx_opset import opset15 as op

    custom = onnxscript.values.Opset(domain="custom-onnx-script", version=1)

    @onnxscript.script(custom)
    def Selu(X):
        alpha = op.CastLike(1.67326, X)
        gamma = op.CastLike(1.0507, X)
        neg = gamma * (alpha * op.Exp(X) - alpha)
        pos = gamma * X
        return op.Where(X <= op.CastLike(0, X), neg, pos)

    x = r([64], seed=3)
    node = helper.make_node("Selu", ["x"], ["y"], domain="custom-onnx-script")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [64])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [64])])
    seed_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15),
                                                         helper.make_opsetid("custom-onnx-script", 1)],
                                   functions=[Selu.to_function_proto()], ir_version=10)
    sess = ort.InferenceSession(seed_model.SerializeToString(), providers=["CPUExecutionProvider"])
    (seed,) = sess.run(None, {"x": x.numpy()})
    ours = opbridge.session(opbridge.export(Model(), (x,))).run(None, {"x": x.numpy()})[0] / 2
    # The seed rounds its constants to 5 digits (1.67326, 1.0507); PyTorch's are exact.
    np.testing.assert_allclose(ours, seed, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ours, torch.nn.functional.selu(x).numpy(), rtol=2e-6, atol=1e-6)
