"""Errors at the boundaries a user crosses: an export that fails (the op's own error, or an op
nothing can translate) in one plain line, a model whose custom domain no loaded library provides,
and an op library's PyTorch and ONNX Runtime files passed for each other."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import opbridge

ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(opbridge.__file__).parent / "_sdk/bin/opbridge-run"
LIB_DIR = opbridge.builtin.torch_path.parent

MODELS = textwrap.dedent("""\
    import torch
    import opbridge

    class BadK(torch.nn.Module):
        def forward(self, x):
            return opbridge.knn_query(x, torch.tensor([x.shape[0]], dtype=torch.int32), k=0)[1]

    _lib = torch.library.Library("boundary", "DEF")
    _lib.define("mystery(Tensor x) -> Tensor")
    _lib.impl("mystery", lambda x: x * 3, "CompositeExplicitAutograd")
    torch.library.register_fake("boundary::mystery", lambda x: torch.empty_like(x), lib=_lib)

    class Unknown(torch.nn.Module):
        def forward(self, x):
            return torch.ops.boundary.mystery(x) + 1
    """)


def _export(tmp_path, factory, exporter):
    (tmp_path / "models.py").write_text(MODELS)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    return subprocess.run([sys.executable, "-m", "opbridge", "export", f"models.py:{factory}", "-o", "m.onnx",
                           "--input", "x=8x3:float32", "--exporter", exporter], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=600)


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
@pytest.mark.parametrize("factory, message", [
    ("BadK", "opbridge::knn_query: k must be >= 1, got 0"),
    ("Unknown", "boundary::mystery: no ONNX "),
])
def test_cli_export_failure_is_one_plain_line(tmp_path, exporter, factory, message):
    r = _export(tmp_path, factory, exporter)
    assert r.returncode == 1
    lines = [ln for ln in r.stderr.splitlines() if not ln.startswith("[opbridge] ")]
    assert len(lines) == 1 and lines[0].startswith(f"opbridge: error: {message}"), r.stderr
    assert "\x1b[" not in r.stderr and "Traceback" not in r.stderr and "Torch IR graph" not in r.stdout + r.stderr
    assert r.stdout == ""


def test_what_to_do_about_an_op_nothing_translates(tmp_path):
    r = _export(tmp_path, "Unknown", "dynamo")
    assert "pass extra_translations={torch.ops.boundary.mystery.default: <onnxscript function>}" in r.stderr
    r = _export(tmp_path, "Unknown", "torchscript")
    assert "register one with torch.onnx.register_custom_op_symbolic('boundary::mystery', ...)" in r.stderr


@pytest.fixture(scope="module")
def foreign_model(tmp_path_factory):
    node = helper.make_node("Mystery", ["x"], ["y"], domain="com.acme")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.acme", 1)],
                          ir_version=8)
    path = tmp_path_factory.mktemp("foreign") / "acme.onnx"
    onnx.save(m, path)
    return path


def test_session_names_the_domain_no_library_provides(foreign_model):
    with pytest.raises(opbridge.OpbridgeError) as e:
        opbridge.session(foreign_model)
    msg = str(e.value)
    assert msg.startswith("the model has com.acme::Mystery nodes, and no loaded op library provides ONNX domain "
                          "'com.acme' (loaded: 'opbridge'")
    assert "opbridge.load_library('lib<name>_torch.so')" in msg and msg.endswith("is not a registered function/op")


@pytest.mark.skipif(not RUNNER.exists(), reason="opbridge-run is not installed")
def test_opbridge_run_names_the_domain_and_the_option(foreign_model):
    r = subprocess.run([str(RUNNER), str(foreign_model), "--random"], capture_output=True, text=True, env={}, timeout=60)
    assert r.returncode != 0
    assert r.stderr.strip().endswith("(no registered custom-op library provides ONNX domain 'com.acme': pass its ONNX "
                                     "Runtime library with --library path/lib<name>_ort.so)"), r.stderr


def test_load_library_given_the_onnxruntime_file_names_the_pytorch_one():
    with pytest.raises(opbridge.OpbridgeError) as e:
        opbridge.load_library(LIB_DIR / "libopbridge_ort.so")
    assert str(e.value) == (
        "libopbridge_ort.so is an ONNX Runtime custom-op library (it exports RegisterCustomOps): pass its PyTorch "
        f"library ({LIB_DIR / 'libopbridge_torch.so'}) to opbridge.load_library, which finds this one beside it")


def test_load_library_given_another_file_says_so(tmp_path):
    import ctypes.util

    other = ctypes.util.find_library("z")
    path = next(Path(d) / other for d in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib")
                if other and (Path(d) / other).exists())
    with pytest.raises(opbridge.OpbridgeError, match="is not an opbridge op library \\(it exports neither "
                                                     "opbridge_manifest_json nor RegisterCustomOps\\)"):
        opbridge.load_library(path)


@pytest.mark.skipif(not RUNNER.exists(), reason="opbridge-run is not installed")
def test_opbridge_run_given_the_pytorch_file_names_the_onnxruntime_one(foreign_model):
    r = subprocess.run([str(RUNNER), str(foreign_model), "--random", "--library", str(LIB_DIR / "libopbridge_torch.so")],
                       capture_output=True, text=True, env={}, timeout=60)
    assert r.returncode != 0
    assert r.stderr.strip().endswith(f"(libopbridge_torch.so is the PyTorch side of an op library; ONNX Runtime takes "
                                     f"its sibling {LIB_DIR / 'libopbridge_ort.so'})"), r.stderr
