"""opbridge-run, the Python-free C++ runner, as a subprocess: on a model exported by opbridge it
writes the same outputs as Python's ONNX Runtime bit for bit, runs random inputs at a chosen
dynamic size, and answers bad input with one error line and a non-zero exit."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import opbridge

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from demo import FEATURES, DemoModel  # noqa: E402  (examples/demo.py)

RUNNER = Path(opbridge.__file__).parent / "_sdk/bin/opbridge-run"

pytestmark = pytest.mark.skipif(
    not RUNNER.exists(), reason=f"{RUNNER} is not installed (build and `cmake --install build` first)"
)


def run(*args, env=None):
    # An empty environment: the installed tree needs no PYTHONPATH or LD_LIBRARY_PATH.
    return subprocess.run([str(RUNNER), *map(str, args)], capture_output=True, text=True, env=env or {}, timeout=120)


class Residual(torch.nn.Module):
    """my_add and dual_residual without asinh (ONNX Runtime's Asinh has no float64 kernel)."""

    def forward(self, x, y):
        return torch.ops.opbridge.dual_residual(torch.ops.opbridge.my_add(x, y), y, alpha=0.25)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(exporter, kind) -> path: "demo" is the float32 demo model, "residual64" a float64 one."""
    out = tmp_path_factory.mktemp("models")
    paths = {}
    for kind, model, dtype in (("demo", DemoModel(), torch.float32), ("residual64", Residual(), torch.float64)):
        example = (torch.randn(4, FEATURES, dtype=dtype), torch.randn(4, FEATURES, dtype=dtype))
        for exporter in opbridge.EXPORTERS:
            path = out / f"{kind}_{exporter}.onnx"
            opbridge.export(model.eval(), example, path, exporter=exporter, input_names=["x", "y"],
                            output_names=["out0", "out1"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
            paths[exporter, kind] = path
    return paths


@pytest.mark.parametrize("kind", ["demo", "residual64"])
@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_outputs_equal_python_onnxruntime_bit_for_bit(models, tmp_path, exporter, kind):
    path = models[exporter, kind]
    dtype = np.float64 if kind == "residual64" else np.float32
    g = np.random.default_rng(5)
    feeds = {name: (g.standard_normal((5, FEATURES)) * 3).astype(dtype) for name in ("x", "y")}
    for name, value in feeds.items():
        np.save(tmp_path / f"{name}.npy", value)

    r = run(path, "--input", f"x={tmp_path / 'x.npy'}", "--input", f"y={tmp_path / 'y.npy'}", "--threads", "1",
            "--output-dir", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert "batch=5 (from" in r.stdout and "runs/s" in r.stdout

    expected = opbridge.session(path, threads=1).run(None, feeds)
    for name, want in zip(("out0", "out1"), expected):
        got = np.load(tmp_path / "out" / f"{name}.npy")
        assert got.dtype == want.dtype and got.shape == want.shape == (5, FEATURES)
        assert got.tobytes() == want.tobytes(), f"{name}: max abs diff {np.abs(got - want).max()}"


def test_random_inputs_with_a_dynamic_dim(models, tmp_path):
    path = models["dynamo", "demo"]
    r = run(path, "--random", "--dim", "batch=6", "--seed", "3", "--repeat", "3", "--output-dir", tmp_path / "a")
    assert r.returncode == 0, r.stderr
    assert "batch=6 (from --dim)" in r.stdout
    assert "(3 timed runs after 1 warmup)" in r.stdout
    outs = [np.load(tmp_path / "a" / f"{n}.npy") for n in ("out0", "out1")]
    assert all(o.shape == (6, FEATURES) and o.dtype == np.float32 and np.isfinite(o).all() for o in outs)

    # The same seed gives the same data; without --dim the batch is 1, and the summary says so.
    again = run(path, "--random", "--dim", "batch=6", "--seed", "3", "--output-dir", tmp_path / "b")
    assert again.returncode == 0, again.stderr
    assert np.load(tmp_path / "b" / "out1.npy").tobytes() == outs[1].tobytes()
    default = run(path, "--random", "--output-dir", tmp_path / "c")
    assert default.returncode == 0, default.stderr
    assert "batch=1 (default; set it with --dim batch=N)" in default.stdout
    assert np.load(tmp_path / "c" / "out0.npy").shape == (1, FEATURES)


def _tiny_model(path, node, inputs, outputs):
    graph = helper.make_graph([node], "g", inputs, outputs)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("opbridge", 1)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def _error_cases(models, tmp_path):
    demo = models["dynamo", "demo"]
    np.save(tmp_path / "x64.npy", np.zeros((2, FEATURES)))
    np.save(tmp_path / "x_fortran.npy", np.asfortranarray(np.zeros((2, FEATURES), np.float32)))
    (tmp_path / "broken.npy").write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f4'")
    (tmp_path / "garbage.onnx").write_bytes(b"not a model")
    f = TensorProto.FLOAT
    unknown = _tiny_model(tmp_path / "unknown.onnx", helper.make_node("NoSuchOp", ["x"], ["y"], domain="opbridge"),
                          [helper.make_tensor_value_info("x", f, [2])], [helper.make_tensor_value_info("y", f, [2])])
    two_dims = _tiny_model(tmp_path / "two_dims.onnx", helper.make_node("MyAdd", ["a", "b"], ["c"], domain="opbridge"),
                           [helper.make_tensor_value_info("a", f, ["a", 3]), helper.make_tensor_value_info("b", f, ["b", 3])],
                           [helper.make_tensor_value_info("c", f, None)])
    return {
        "no model": ([], 2, "no model given"),
        "bad repeat": ([demo, "--random", "--repeat", "0"], 2, "--repeat: 0 is out of range"),
        "missing model": ([tmp_path / "nope.onnx", "--random"], 1, "nope.onnx: no such file"),
        "garbage model": ([tmp_path / "garbage.onnx", "--random"], 1, "cannot load model"),
        "unknown input": ([demo, "--input", f"z={tmp_path / 'x64.npy'}"], 1, "the model has no input 'z' (its inputs: x, y)"),
        "no data": ([demo], 1, "model input 'x' has no data"),
        "dtype mismatch": ([demo, "--random", "--input", f"x={tmp_path / 'x64.npy'}"], 1,
                           "holds float64, the model input is float32"),
        "fortran order": ([demo, "--random", "--input", f"x={tmp_path / 'x_fortran.npy'}"], 1, "fortran_order is True"),
        "truncated npy": ([demo, "--random", "--input", f"x={tmp_path / 'broken.npy'}"], 1, "truncated header"),
        "custom op missing": ([unknown, "--random"], 1, "NoSuchOp"),
        "kernel error": ([two_dims, "--random", "--dim", "a=2", "--dim", "b=4"], 1, "cannot be broadcast"),
    }


CASES = ["no model", "bad repeat", "missing model", "garbage model", "unknown input", "no data", "dtype mismatch",
         "fortran order", "truncated npy", "custom op missing", "kernel error"]


@pytest.mark.parametrize("case", CASES)
def test_errors_are_one_line_and_a_non_zero_exit(models, tmp_path, case):
    args, code, reason = _error_cases(models, tmp_path)[case]
    r = run(*args)
    assert r.returncode == code, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("opbridge-run: error: "), r.stderr
    assert reason in lines[0]
