"""What an exporter writes that the ONNX checker refuses while eager runs the model, repaired by
opbridge.export (python/opbridge/_export/repairs.py). The dtype repair of the TorchScript
exporter is tested with the op it concerns (test_substitution.py)."""

import pytest
import torch

import opbridge


class SqueezeKeeps(torch.nn.Module):
    """openpoints' segmentation models call .squeeze(-1) on (B, C, N): in PyTorch a no-op."""

    def forward(self, x, y):
        return torch.ops.opbridge.my_add(x, y).squeeze(-1), y.squeeze(-1)


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_squeeze_of_an_axis_that_is_not_one_keeps_it(exporter):
    x, y = torch.randn(2, 3, 4), torch.randn(2, 3, 1)
    proto = opbridge.export(SqueezeKeeps(), (x, y), exporter=exporter)  # the checker runs in export
    if exporter == "dynamo":  # y's axis is 1 and stays squeezed; x's Squeeze became an Identity
        assert [n.op_type for n in proto.graph.node].count("Squeeze") == 1
    report = opbridge.verify(SqueezeKeeps(), (x, y), proto)
    assert report.ok, report
    assert [o.shape for o in report.outputs] == [(2, 3, 4), (2, 3)]


class SqueezeDynamic(torch.nn.Module):
    def forward(self, x):
        return (x * 2).squeeze(-1)


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_squeeze_of_a_dynamic_axis_keeps_it(exporter):
    # The same with the axis dynamic (openpoints' segmentation head with the point count dynamic):
    # its size is symbolic, and the exporter's own record of the output's rank says it was kept.
    x = torch.randn(2, 3, 8)
    proto = opbridge.export(SqueezeDynamic(), (x,), exporter=exporter, input_names=["x"],
                            dynamic_axes={"x": {2: "n"}})
    report = opbridge.verify(SqueezeDynamic(), (torch.randn(2, 3, 13),), proto)
    assert report.ok and report.outputs[0].shape == (2, 3, 13), report
