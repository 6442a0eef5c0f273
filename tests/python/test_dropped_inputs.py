"""Every tensor the call passes must be an input the exported graph reads: one it drops, or keeps
without reading, had its value baked (or its use hidden from the trace), and the export says so."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import opbridge


class Folds(torch.nn.Module):
    """Reads k as a Python number: the TorchScript trace writes the example's value into the graph."""

    def forward(self, x, k):
        return x * float(k.sum())


class Ignores(torch.nn.Module):
    def forward(self, x, unused):
        return x * 2


def test_an_input_folded_into_a_python_number_is_refused_naming_it():
    x, k = torch.rand(2, 5), torch.rand(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        with pytest.raises(opbridge.OpbridgeError, match=r"does not take the input 'k' \(args\[1\]\).*Python number") as e:
            opbridge.export(Folds(), (x, k), exporter="torchscript", input_names=["x", "k"])
        # The line that read it, from the trace's own warning.
        assert "test_dropped_inputs.py:19: Converting a tensor to a Python float" in str(e.value), str(e.value)
        # What the check prevents: the graph computes with the example's k.
        proto = opbridge.export(Folds(), (x, k), exporter="torchscript", input_names=["x", "k"],
                                allow_unused_inputs=True)
    assert [i.name for i in proto.graph.input] == ["x"]
    got = opbridge.session(proto).run(None, {"x": np.ones((2, 5), np.float32)})[0]
    np.testing.assert_allclose(got, np.full((2, 5), float(k.sum())), rtol=1e-6)


def test_the_dynamo_exporter_keeps_the_folded_input_as_a_computation():
    x, k = torch.rand(2, 5), torch.rand(3)
    proto = opbridge.export(Folds(), (x, k), exporter="dynamo", input_names=["x", "k"])
    got = opbridge.session(proto).run(None, {"x": np.ones((2, 5), np.float32), "k": np.ones(3, np.float32)})[0]
    np.testing.assert_allclose(got, np.full((2, 5), 3.0))


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_an_unused_input_is_refused_unless_allowed_then_a_warning(exporter):
    args = (torch.rand(2, 3), torch.rand(4))
    with pytest.raises(opbridge.OpbridgeError, match=r"input 'unused' \(args\[1\]\).*allow_unused_inputs=True"):
        opbridge.export(Ignores(), args, exporter=exporter, input_names=["x", "unused"])
    with pytest.warns(UserWarning, match="does not take the input 'unused'"):
        opbridge.export(Ignores(), args, exporter=exporter, input_names=["x", "unused"], allow_unused_inputs=True)


class Branches(torch.nn.Module):
    """x and y are read only inside the If's branches."""

    def forward(self, c, x, y):
        return torch.cond(c.sum() > 0, lambda x, y: x * 2, lambda x, y: y + 1, (x, y))


def test_inputs_read_inside_a_subgraph_are_taken():
    args = (torch.ones(2), torch.rand(3), torch.rand(3))
    proto = opbridge.export(Branches(), args, exporter="dynamo", input_names=["c", "x", "y"])
    assert any(n.op_type == "If" for n in proto.graph.node)
    assert opbridge.verify(Branches(), args, proto).ok
