"""asinh: PyTorch's aten::asinh exported to ai.onnx Asinh by both exporters (the TorchScript
exporter of torch 2.13 has no mapping of its own for it) where ONNX Runtime runs Asinh (float32),
and to opbridge's own node, run by its kernel, where it does not (float64, opsets below 9)."""

import io

import numpy as np
import pytest
import torch

import opbridge
from opbridge._export.torchscript import register_torchscript_symbolics
from opbridge.testing import OpCase, OpTest, Sample, random_tensor as r


def resize(sample: Sample, n: int) -> Sample:
    return Sample((r([n, 4], seed=n),))


class TestAsinh(OpTest):
    case = OpCase(
        "asinh",
        reference=np.arcsinh,
        samples=[
            Sample((r([3, 4], low=-50, high=50),), name="float32", dynamic={0: [0]}),
            Sample((r([6], "float64"),), name="float64"),
            Sample((r([0, 2]),), name="empty"),
        ],
        resize=resize,
    )


class AsinhModel(torch.nn.Module):
    def forward(self, x):
        return torch.asinh(x)


def test_torchscript_export_needs_the_mapping():
    # Without opbridge's rule the TorchScript exporter cannot export aten::asinh at all
    # (torch.onnx.export itself: opbridge.export registers its rules again before it exports).
    torch.onnx.unregister_custom_op_symbolic("aten::asinh", 9)
    try:
        # torch reports it as UnsupportedOperatorError, or (once a rule was unregistered) trips
        # over its own empty registry with a ValueError.
        with pytest.raises((torch.onnx.errors.UnsupportedOperatorError, ValueError)):
            torch.onnx.export(AsinhModel(), (torch.ones(2),), io.BytesIO(), dynamo=False, opset_version=9)
    finally:
        register_torchscript_symbolics(opbridge.builtin)
    m = opbridge.export(AsinhModel(), (torch.ones(2),), exporter="torchscript", opset=9)
    assert [(n.domain, n.op_type) for n in m.graph.node] == [("", "Asinh")]


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_float64_and_old_opsets_run_opbridges_node(exporter):
    # ONNX Runtime implements ai.onnx Asinh for float32 only: a float64 model gets opbridge's
    # node, and so does any model below Asinh's opset 9; both run, against numpy.
    cases = [(torch.linspace(-30, 30, 7, dtype=torch.float64), None)]
    if exporter == "torchscript":
        cases.append((torch.linspace(-3, 3, 5), 8))
    for x, opset in cases:
        m = opbridge.export(AsinhModel(), (x,), exporter=exporter, opset=opset)
        assert [(n.domain, n.op_type) for n in m.graph.node] == [("opbridge", "Asinh")]
        (got,) = opbridge.session(m).run(None, {m.graph.input[0].name: x.numpy()})
        np.testing.assert_allclose(got, np.arcsinh(x.numpy()), rtol=1e-6 if x.dtype == torch.float32 else 1e-14)


def test_dynamo_translation_is_opbridges():
    assert torch.ops.aten.asinh.default in opbridge.translation_table()
    m = opbridge.export(AsinhModel(), (torch.ones(2),))
    assert [(n.domain, n.op_type) for n in m.graph.node] == [("", "Asinh")]
