"""spconv 2.3.8's CPU wheel, installed into an environment of its own (tests/python/envs.py): its
submanifold convolution calls compiled code through pccm bindings that neither exporter can see
into. Until a substitution covers it, opbridge.export refuses it with both exporters, naming spconv's
code and the `@opbridge.substitute` line to add — never the silent `Gemm -> Relu -> Gemm` graph with
the indices dropped that the TorchScript exporter writes by itself."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest

import envs

pytestmark = pytest.mark.environments

SPCONV = ["spconv==2.3.8", "cumm<0.8", "pccm", "ccimport", "ninja", "fire", "pybind11", "lark", "portalocker"]

SCRIPT = textwrap.dedent('''
    import json, sys, warnings
    import torch, opbridge
    import spconv.pytorch as spconv

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = spconv.SubMConv3d(4, 8, 3, indice_key="s1", bias=False)
            self.relu = torch.nn.ReLU()

        def forward(self, features, indices):
            x = spconv.SparseConvTensor(features, indices, [16, 16, 16], 1)
            return self.relu(self.conv(x).features)

    torch.manual_seed(0)
    sites = torch.unique(torch.randint(0, 16, (60, 3)), dim=0).int()
    indices = torch.cat([torch.zeros(len(sites), 1, dtype=torch.int32), sites], 1)
    features = torch.rand(len(sites), 4)
    model = Net().eval()
    report = {"eager_shape": list(model(features, indices).shape)}
    for exporter in ("torchscript", "dynamo"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                opbridge.export(model, (features, indices), exporter=exporter, input_names=["features", "indices"])
                report[exporter] = "exported"
            except opbridge.OpbridgeError as e:
                report[exporter] = str(e)
    json.dump(report, open(sys.argv[1], "w"))
''')


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    python = envs.python_with("spconv-2.3.8", SPCONV, on_top=True)
    tmp = tmp_path_factory.mktemp("spconv")
    (tmp / "run.py").write_text(SCRIPT)
    r = subprocess.run([str(python), str(tmp / "run.py"), str(tmp / "out.json")], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PYTHONPATH": ""})
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    return json.loads((tmp / "out.json").read_text())


def test_spconv_runs_eagerly(report):
    assert report["eager_shape"][1] == 8


def test_the_torchscript_export_is_refused_naming_the_dropped_indices_and_spconvs_function(report):
    text = report["torchscript"]
    assert "does not take the input 'indices'" in text, text
    assert "spconv.pytorch.functional.SubMConvFunction" in text
    assert "@opbridge.substitute('spconv.pytorch.functional.SubMConvFunction')" in text


def test_the_dynamo_export_is_refused_naming_spconvs_code_and_the_rule_to_add(report):
    text = report["dynamo"]
    assert "spconv.pytorch.conv.SparseConvolution.forward" in text, text
    assert "@opbridge.substitute('spconv.pytorch.conv.SparseConvolution.forward')" in text
    assert "cannot trace" in text
