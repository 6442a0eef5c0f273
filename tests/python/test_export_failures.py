"""What an export says and takes (python/opbridge/_export/failures.py, exporter.py): a Python
condition on a value read from the data names the model's line and the exporter that records it,
without torch.export's dump of the partial graph; the TorchScript trace's fixed values are
summarised once per line; an ExportedProgram exports any number of times."""

from pathlib import Path

import pytest
import torch

import opbridge


class _BranchesOnData(torch.nn.Module):
    """basicsr's DCNv2Pack pattern: a Python condition on a value read from the data."""

    def forward(self, x):
        if x.abs().mean() > 50:  # the line the error must name
            x = x * 0.5
        return x + 1


def test_a_python_condition_on_data_is_named_with_its_line_and_the_way_out(capfd):
    model, x = _BranchesOnData(), torch.randn(4, 4)
    with pytest.raises(opbridge.OpbridgeError) as e:
        opbridge.export(model, (x,), exporter="dynamo")
    line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "the line the error" in text)
    assert f"{__file__}:{line} in forward" in str(e.value)
    assert "exporter='torchscript'" in str(e.value)
    assert capfd.readouterr().err == ""  # torch.export's dump of the partial graph is not printed
    proto = opbridge.export(model, (x,), exporter="torchscript")  # the way out the message gives
    assert opbridge.verify(model, (x,), proto).ok


def test_the_torchscript_traces_fixed_values_are_summarised_once_per_line():
    model, x = _BranchesOnData(), torch.randn(4, 4)
    with pytest.warns(torch.jit.TracerWarning) as record:
        opbridge.export(model, (x,), exporter="torchscript")
    line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "the line the error" in text)
    mine = [w for w in record if w.filename == __file__]
    assert [w.lineno for w in mine] == [line], [(w.filename, w.lineno, str(w.message)) for w in record]
    assert "the TorchScript trace fixed a value here: Converting a tensor to a Python boolean" in str(mine[0].message)


class _Pairs(torch.nn.Module):
    def forward(self, x, y):
        return torch.ops.opbridge.radius(x, y, None, None, r=0.5, max_num_neighbors=8)


def test_an_exported_program_with_a_data_dependent_size_exports_twice():
    x, y = torch.rand(50, 3), torch.rand(10, 3)
    program = torch.export.export(_Pairs(), (x, y))
    for _ in range(2):  # the second export once failed: PendingUnbackedSymbolNotFound
        assert opbridge.verify(_Pairs(), (x, y), opbridge.export(program, (x, y))).ok
    with pytest.raises(opbridge.OpbridgeError, match="an ExportedProgram is exported by the dynamo exporter"):
        opbridge.export(program, (x, y), exporter="torchscript")
