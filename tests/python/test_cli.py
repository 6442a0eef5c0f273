"""The `opbridge` command line: every command's happy path with its values checked, inspect's
statuses on models this project did not write (checked against ONNX Runtime itself), and bad input
as one line. Commands run in this process (cli_inline: the same main(), file descriptors 1 and 2
captured); the tests about a process itself start one (`python -m opbridge`, the installed script,
the launcher that defers PyTorch)."""

import json
import os
import re
import subprocess
import sys
import threading
import tomllib
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import opbridge
from opbridge._runtime import inspect as _inspect
from opbridge._tools import cli
from cli_inline import run_cli

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "python"), os.environ.get("PYTHONPATH")) if p))

FACTORY = '''
import torch


class Block(torch.nn.Module):
    def forward(self, x, y):
        s = torch.ops.opbridge.my_add(x, y)
        r1, r2 = torch.ops.opbridge.dual_residual(s, y, alpha=0.5)
        return torch.asinh(r1), r2


class Shifted(Block):
    def forward(self, x, y):
        a, b = super().forward(x, y)
        return a, b + 1e-3


def make():
    return Block()


def broken():
    raise ValueError("no weights here")


not_a_module = 3
'''


def run(*args, env=None, cwd=None):
    """The command in this process: its exit status, stdout and stderr, as a process's."""
    return run_cli(*args, env=env, cwd=cwd)


def run_process(*args, env=None, cwd=None, timeout=900):
    """`python -m opbridge ARGS...` in a process of its own."""
    return subprocess.run([sys.executable, "-m", "opbridge", *map(str, args)], capture_output=True, text=True,
                          env=env or ENV, cwd=cwd, timeout=timeout)


def assert_one_line_error(r, code, pattern):
    assert r.returncode == code, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if not ln.startswith("[opbridge] ")]
    assert len(lines) == 1 and lines[0].startswith("opbridge: error: "), r.stderr
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in r.stderr


def ort_accepts(model: onnx.ModelProto | str) -> bool:
    """The oracle: does ONNX Runtime (with the opbridge libraries) create a session?"""
    try:
        opbridge.session(model)
        return True
    except Exception:  # noqa: BLE001
        return False


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    (d / "blocks.py").write_text(FACTORY)
    return d


@pytest.fixture(scope="module")
def exported(work):
    """block.onnx exported by the CLI with a dynamic batch axis."""
    path = work / "block.onnx"
    r = run("export", work / "blocks.py:make", "-o", path, "--input", "x=4x8:float32", "--input", "y=4x8:float32",
            "--dynamic", "x:0:batch", "--dynamic", "y:0:batch", "--output-name", "out0", "--output-name", "out1")
    assert r.returncode == 0, r.stderr
    return path, r


@pytest.fixture(scope="module")
def node_cases():
    """The ONNX node test models of the installed onnx package: the shipped
    onnx/backend/test/data/node/<name>/model.onnx where the wheel has them, else the same models
    built by the package's own test-case code (onnx.backend.test.case.node)."""
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = {c.name: c.model for c in node.collect_testcases(None)}
    shipped = Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"
    for path in shipped.glob("*/model.onnx"):
        cases[path.parent.name] = onnx.load(path)
    return cases


# --- ops ---------------------------------------------------------------------------------------


def _schema_here(op):
    # The PyTorch op's schema where the dispatcher has it in this process; ops of libraries not
    # imported here (torch_cluster's, torchvision's until a test imports it) have none.
    return str(op.overload._schema) if op.qualified_name in torch._C._dispatch_get_all_op_names() else None


def test_ops_json_lists_every_loaded_op():
    r = run("ops", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    got = {o["name"]: o for o in data["ops"]}
    assert sorted(got) == sorted(op.name for op in opbridge.all_ops())
    for op in opbridge.all_ops():
        o = got[op.name]
        assert o["torch_schema"] == _schema_here(op)
        assert o["export"]["kind"] == op.export_kind and o["export"]["rules"] == [r.to_json() for r in op.export_rules]
        if op.has_own_node:
            assert o["export"]["own_node"] == {"domain": op.onnx_domain, "op_type": op.onnx_type,
                                               "since_version": op.since_version}
        assert [(i["name"], i["dtypes"]) for i in o["inputs"]] == [(i.name, list(op.type_constraint(i.type).dtypes))
                                                                    for i in op.inputs]
        assert [(x["name"], x["dtypes"]) for x in o["outputs"]] == [(x.name, list(op.type_constraint(x.type).dtypes))
                                                                     for x in op.outputs]
    assert [lib["onnx_domain"] for lib in data["libraries"]] == [lib.onnx_domain for lib in opbridge.libraries()]
    # Concrete values, not only agreement with the loader.
    dr = got["dual_residual"]
    assert dr["export"]["own_node"]["domain"] == "opbridge" and dr["export"]["own_node"]["op_type"] == "DualResidual"
    assert dr["inputs"][0]["dtypes"] == ["float32", "float64", "float16", "bfloat16"]
    asinh = got["asinh"]["export"]
    assert asinh["kind"] == "kernel" and asinh["own_node"]["op_type"] == "Asinh"
    assert [(r["domain"], r["op_type"], r["min_opset"], r["target_types"]) for r in asinh["rules"]] == [
        ("", "Asinh", 9, {"T": ["float32"]})]
    assert asinh["summary"] == "opbridge::Asinh v1; ai.onnx::Asinh from opset 9 for T in {float32}"
    grid = got["torch_cluster_grid"]["export"]
    assert grid["kind"] == "mapping" and grid["own_node"] is None
    assert grid["summary"] == "opbridge::GridCluster"
    assert got["selu"]["export"]["summary"] == "opbridge::Selu v1 (function, opset 15+)"
    if "torch_cluster::grid" not in torch._C._dispatch_get_all_op_names():  # no torch_cluster, no stand-in
        assert got["torch_cluster_grid"]["torch_schema"] is None
    assert got["resize_bicubic"]["export"]["summary"] == ("opbridge::ResizeBicubic v1; ai.onnx::Resize from opset 13 "
                                                          "for T in {float32}")


def test_ops_table_shows_signatures_and_mapping():
    r = run("ops")
    assert r.returncode == 0, r.stderr
    for op in opbridge.all_ops():
        assert f"torch: {_schema_here(op) or op.qualified_name + ' (not in this torch build)'}" in r.stdout
        row = next(ln for ln in r.stdout.splitlines() if ln.startswith(op.name + " "))
        assert op.export_kind in row
        for rule in op.export_rules:
            assert f"{rule.domain or 'ai.onnx'}::{rule.op_type}" in row
        if op.has_own_node:
            assert f"{op.onnx_domain}::{op.onnx_type}" in row


def test_entry_point_is_declared_and_installed_script_works():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["scripts"]["opbridge"] == "_opbridge_cli:opbridge"
    assert meta["project"]["scripts"]["opbridge-run"] == "_opbridge_cli:opbridge_run"
    script = Path(sys.executable).parent / "opbridge"
    if not script.exists():
        pytest.skip("the venv has no `opbridge` script yet (scripts/setup.sh reinstalls the package)")
    r = subprocess.run([str(script), "ops", "--json"], capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr
    assert sorted(o["name"] for o in json.loads(r.stdout)["ops"]) == sorted(op.name for op in opbridge.all_ops())


# --- export and verify -------------------------------------------------------------------------


# The launcher of the installed `opbridge` command, with a note of whether torch was imported.
LAUNCH = ("import atexit, sys, _opbridge_cli; atexit.register(lambda: print('torch' in sys.modules, file=sys.stderr)); "
          "sys.argv = ['opbridge', *sys.argv[1:]]; sys.exit(_opbridge_cli.opbridge())")


def test_commands_that_need_no_torch_never_import_it(exported, tmp_path):
    exported = exported[0]
    for args, torch_imported in ((["--version"], False), (["inspect", exported], False),
                                 (["inspect", exported, "--runtime", "openvino", "--session"], False),
                                 (["graph", exported, "-o", tmp_path / "g.dot"], False),
                                 (["triton", exported, "--repository", tmp_path / "repo"], False),
                                 (["ops", "--json"], True)):
        r = subprocess.run([sys.executable, "-c", LAUNCH, *map(str, args)], capture_output=True, text=True, env=ENV,
                           timeout=300)
        assert r.returncode == 0, (args, r.stderr)
        assert r.stderr.strip().splitlines()[-1] == str(torch_imported), (args, r.stderr)


def test_export_writes_a_dynamic_model_and_a_summary(exported):
    path, r = exported
    m = onnx.load(path)
    assert [i.name for i in m.graph.input] == ["x", "y"] and [o.name for o in m.graph.output] == ["out0", "out1"]
    assert [d.dim_param or d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim] == ["batch", 8]
    assert sorted((n.domain, n.op_type) for n in m.graph.node) == [("", "Asinh"), ("opbridge", "DualResidual"),
                                                                   ("opbridge", "MyAdd")]
    assert "exporter   dynamo" in r.stdout
    assert re.search(r"inputs\s+x\s+float \[batch, 8\]", r.stdout)
    assert "ai.onnx 1, opbridge 2 (3 nodes)" in r.stdout
    assert f"({path.stat().st_size} bytes)" in r.stdout
    assert "[opbridge] exporting with the dynamo exporter" in r.stderr
    assert "dynamic    dynamic axes proven at a second size (derived): batch: 4 -> 8" in r.stdout


def test_export_refuses_a_model_wrong_at_a_second_size_unless_told(work):
    (work / "baked.py").write_text("import torch\n\n\nclass Baked(torch.nn.Module):\n    def forward(self, xyz):\n"
                                   "        return torch.ops.opbridge.ball_query(xyz, xyz, 0.3, xyz.shape[1] // 4)\n")
    args = ("export", work / "baked.py:Baked", "-o", work / "baked.onnx", "--input", "xyz=2x64x3:float32",
            "--dynamic", "xyz:1:n", "--exporter", "torchscript")
    r = run(*args)
    assert r.returncode != 0 and "wrong at a second size" in r.stderr and "nsample=16" in r.stderr, r.stderr
    assert not (work / "baked.onnx").exists()
    r = run(*args, "--no-prove-dynamic")
    assert r.returncode == 0, r.stderr


def test_export_with_torchscript_and_an_opset(work):
    path = work / "block_ts.onnx"
    r = run("export", "blocks:Block", "-o", path, "--input", "x=3x5:float64", "--input", "y=3x5:float64",
            "--exporter", "torchscript", "--opset", "17", cwd=work)  # a dotted module, found from the cwd
    assert r.returncode == 0, r.stderr
    m = onnx.load(path)
    assert {o.domain: o.version for o in m.opset_import}[""] == 17
    assert m.graph.input[0].type.tensor_type.elem_type == TensorProto.DOUBLE
    assert "exporter   torchscript" in r.stdout


def test_verify_passes_at_another_batch_size(exported, work):
    path, _ = exported
    r = run("verify", path, "--torch", work / "blocks.py:Block", "--input", "x=9x8:float32", "--input",
            "y=9x8:float32")
    assert r.returncode == 0, r.stderr
    rows = [ln for ln in r.stdout.splitlines() if re.match(r"out\d ", ln)]
    assert len(rows) == 2 and all(ln.rstrip().endswith("ok") and "[9, 8]" in ln for ln in rows)
    assert "PASS" in r.stdout


def test_verify_with_npz_inputs(exported, work):
    path, _ = exported
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((3, 8), dtype=np.float32), rng.standard_normal((3, 8), dtype=np.float32)
    np.savez(work / "in.npz", y=y, x=x)  # matched by name, not by order
    r = run("verify", path, "--torch", work / "blocks.py:make", "--inputs", work / "in.npz")
    assert r.returncode == 0, r.stderr
    assert "x [3, 8] float32, y [3, 8] float32" in r.stdout


def test_verify_reports_a_mismatch(exported, work):
    path, _ = exported
    r = run("verify", path, "--torch", work / "blocks.py:Shifted", "--input", "x=5x8:float32", "--input",
            "y=5x8:float32")
    assert r.returncode == 1
    out1 = next(ln for ln in r.stdout.splitlines() if ln.startswith("out1"))
    assert "MISMATCH" in out1 and "1.000e-03" in out1  # the 1e-3 shift, measured
    assert next(ln for ln in r.stdout.splitlines() if ln.startswith("out0")).rstrip().endswith("ok")
    assert "FAIL: mismatch in out1" in r.stdout


def test_verify_in_openvino_names_it(exported, work):
    path, _ = exported
    r = run("verify", path, "--torch", work / "blocks.py:Shifted", "--runtime", "openvino", "--input", "x=5x8:float32",
            "--input", "y=5x8:float32")
    assert r.returncode == 1, r.stderr
    assert r.stdout.startswith("OpenVINO vs PyTorch eager") and "compiling" in r.stderr
    out1 = next(ln for ln in r.stdout.splitlines() if ln.startswith("out1"))
    assert "MISMATCH" in out1 and "1.000e-03" in out1 and ": OpenVINO " in out1
    assert "ONNX Runtime" not in r.stdout + r.stderr


# --- inspect -----------------------------------------------------------------------------------


def inspect_json(path, *extra):
    r = run("inspect", path, "--json", *extra)
    return r.returncode, json.loads(r.stdout), r


def statuses(data) -> dict:
    return {(o["domain"], o["op_type"]): o["status"] for o in data["ops"]}


def test_inspect_model_exported_with_custom_ops(exported):
    path, _ = exported
    code, data, _ = inspect_json(path)
    assert code == 0 and data["runnable"]
    assert statuses(data) == {("opbridge", "MyAdd"): "opbridge", ("opbridge", "DualResidual"): "opbridge",
                              ("ai.onnx", "Asinh"): "onnxruntime"}
    assert data["opset_imports"]["opbridge"] == 1
    assert data["inputs"][0] == {"name": "x", "dtype": "float", "shape": ["batch", 8]}
    assert [o["count"] for o in data["ops"]] == [1, 1, 1]
    assert ort_accepts(str(path))


def test_inspect_table(exported):
    path, _ = exported
    r = run("inspect", path)
    assert r.returncode == 0
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("opbridge") and "DualResidual" in ln)
    assert row.split()[:5] == ["opbridge", "DualResidual", "1", "1", "opbridge"]
    assert "IR version" in r.stdout and re.search(r"opsets\s+ai.onnx \d+, opbridge 1", r.stdout)
    assert r.stdout.rstrip().splitlines()[-1].startswith("OK:")


def test_inspect_for_openvino(exported, tmp_path):
    path, _ = exported
    code, data, r = inspect_json(path, "--runtime", "openvino", "--session")
    assert code == 0 and data["runnable"] and data["session"] == {"ok": True, "error": None}, r.stderr
    assert statuses(data) == {("opbridge", "MyAdd"): "opbridge", ("opbridge", "DualResidual"): "opbridge",
                              ("ai.onnx", "Asinh"): "openvino"}
    assert data["runtime"].startswith("openvino 2026.")
    (lib,) = [lib for lib in data["opbridge_libraries"] if lib["name"] == "opbridge"]
    assert lib["openvino_library"].endswith("libopbridge_ov.so")
    assert {"my_add", "dual_residual"} <= set(lib["openvino_ops"])
    opbridge.session(path, runtime="openvino")  # the oracle: OpenVINO compiles it
    r = run("inspect", path, "--runtime", "openvino", "--session")
    assert r.returncode == 0 and "session: OpenVINO compiled the model for the CPU" in r.stdout
    assert re.search(r"opbridge \(opbridge; libopbridge_ov.so, \d+ ops\)", r.stdout)
    assert r.stdout.rstrip().splitlines()[-1].startswith("OK: openvino 2026.")
    # A domain nothing provides: MISSING, as OpenVINO's own refusal says.
    nope = helper.make_model(helper.make_graph(
        [helper.make_node("Nope", ["x"], ["y"], domain="com.example")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    code, data, _ = inspect_json(save(nope, tmp_path / "nope.onnx"), "--runtime", "openvino")
    assert code == 1 and statuses(data) == {("com.example", "Nope"): "MISSING"}
    assert "no runtime reads com.example::Nope in OpenVINO" in data["ops"][0]["advice"]
    with pytest.raises(opbridge.OpbridgeError, match="com.example.Nope"):
        opbridge.session(nope, runtime="openvino")
    # An op's check on static shapes: OpenVINO runs it as it converts the node, naming the op and
    # the node; the compile (--session) refuses the model too.
    pool = helper.make_model(helper.make_graph(
        [helper.make_node("RoiAlign", ["x", "rois"], ["y"], domain="opbridge", name="pool", output_size=[2, 2])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4]),
         helper.make_tensor_value_info("rois", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("opbridge", 1)])
    code, data, r = inspect_json(save(pool, tmp_path / "pool.onnx"), "--runtime", "openvino", "--session")
    assert code == 1 and statuses(data) == {("opbridge", "RoiAlign"): "MISSING"}, r.stdout
    assert data["ops"][0]["advice"].endswith("failed to convert opbridge::RoiAlign node 'pool': opbridge::roi_align "
                                             "(node 'pool'): rois must be (K, 5): batch index, x1, y1, x2, y2, got 4")
    assert not data["session"]["ok"] and "opbridge::roi_align (node 'pool')" in data["session"]["error"]
    with pytest.raises(opbridge.OpbridgeError, match=r"opbridge::roi_align \(node 'pool'\): rois must be"):
        opbridge.session(pool, runtime="openvino")


@pytest.mark.parametrize("name", ["test_deform_conv_with_mask_bias", "test_basic_deform_conv_without_padding"])
def test_inspect_onnx_deform_conv_models(node_cases, tmp_path, name):
    path = save(node_cases[name], tmp_path / f"{name}.onnx")
    code, data, _ = inspect_json(path)
    assert code == 0 and statuses(data) == {("ai.onnx", "DeformConv"): "onnxruntime"}
    assert data["ops"][0]["opset"] == 22 and data["ops"][0]["since_version"] == 22
    assert ort_accepts(node_cases[name])


def test_inspect_op_onnxruntime_lacks(node_cases, tmp_path):
    # RoiAlign-22: ONNX Runtime's kernels serve RoiAlign-10 and -16 only (opsets 10-21).
    model = node_cases["test_roialign_aligned_false"]
    assert not ort_accepts(model)
    code, data, _ = inspect_json(save(model, tmp_path / "roialign.onnx"))
    assert code == 1 and not data["runnable"]
    (op,) = data["ops"]
    assert (op["op_type"], op["status"]) == ("RoiAlign", "MISSING")
    assert "opsets 10-21" in op["advice"] and "RoiAlign-22" in op["advice"]


def test_inspect_onnx_function_expansion(node_cases, tmp_path):
    model = node_cases["test_swish"]  # Swish has no kernel; ONNX Runtime expands its function body
    assert ort_accepts(model)
    code, data, _ = inspect_json(save(model, tmp_path / "swish.onnx"))
    assert code == 0 and statuses(data) == {("ai.onnx", "Swish"): "onnxruntime (function)"}


def test_inspect_op_no_runtime_has(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph([helper.make_node("Nope", ["x"], ["t"], domain="com.example"),
                           helper.make_node("Relu", ["t"], ["y"])], "g", [x], [y])
    model = helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 18),
                                                               helper.make_opsetid("com.example", 1)])
    assert not ort_accepts(model)
    path = save(model, tmp_path / "nope.onnx")
    code, data, _ = inspect_json(path)
    assert code == 1
    assert statuses(data) == {("com.example", "Nope"): "MISSING", ("ai.onnx", "Relu"): "onnxruntime"}
    nope = next(o for o in data["ops"] if o["op_type"] == "Nope")
    assert "no runtime implements com.example::Nope" in nope["advice"]
    r = run("inspect", path)
    assert r.returncode == 1 and "MISSING (1):" in r.stdout and "FAIL:" in r.stdout


def test_inspect_model_local_function(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    twice = helper.make_function("com.local", "Twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
                                 [helper.make_opsetid("", 18)])
    g = helper.make_graph([helper.make_node("Twice", ["x"], ["y"], domain="com.local")], "g", [x], [y])
    model = helper.make_model(g, ir_version=10, functions=[twice],
                              opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.local", 1)])
    assert ort_accepts(model)
    code, data, _ = inspect_json(save(model, tmp_path / "func.onnx"))
    assert code == 0
    assert statuses(data) == {("com.local", "Twice"): "model function", ("ai.onnx", "Add"): "onnxruntime"}
    add = next(o for o in data["ops"] if o["op_type"] == "Add")
    assert add["where"] == ["function com.local::Twice"]
    assert data["functions"] == [{"domain": "com.local", "name": "Twice", "overload": "", "nodes": 1, "used": True}]


def test_inspect_op_below_its_first_opset(node_cases, tmp_path):
    model = onnx.ModelProto()
    model.CopyFrom(node_cases["test_deform_conv_with_mask_bias"])
    del model.opset_import[:]
    model.opset_import.append(helper.make_opsetid("", 18))  # DeformConv first appears in opset 19
    assert not ort_accepts(model)
    code, data, _ = inspect_json(save(model, tmp_path / "deform18.onnx"))
    assert code == 1
    (op,) = data["ops"]
    assert op["status"] == "MISSING" and "first appears in ai.onnx opset 19" in op["advice"]
    assert "--opset 19" in op["advice"]


def test_inspect_session_option_catches_kernel_refusals(node_cases, tmp_path):
    # GRU with layout=1: the kernel exists but refuses the attribute when the session is built.
    path = save(node_cases["test_gru_batchwise"], tmp_path / "gru.onnx")
    code, data, _ = inspect_json(path)
    assert code == 0
    code, data, _ = inspect_json(path, "--session")
    assert code == 1 and not data["session"]["ok"] and "layout" in data["session"]["error"]


def _onnxruntime_verdict(model) -> bool | None:
    """Whether ONNX Runtime builds a session for `model`; None where a kernel refuses an
    attribute value at initialisation (e.g. a missing locale), which only --session sees."""
    so = ort.SessionOptions()
    so.log_severity_level = 4
    try:
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return True
    except Exception as e:  # noqa: BLE001
        return None if "Exception during initialization" in str(e) else False


def test_inspect_agrees_with_onnxruntime_on_every_onnx_node_model(node_cases):
    """In-process over all ~1900 node models: inspect says runnable exactly when ONNX Runtime
    creates a session, except where a kernel refuses an attribute value at initialisation
    (which only --session sees)."""
    disagree, runnable, missing = [], 0, 0
    for name, model in node_cases.items():
        accepted = _onnxruntime_verdict(model)
        if accepted is None:
            continue
        ok = _inspect.analyze(model).ok
        runnable += ok
        missing += not ok
        if ok != accepted:
            disagree.append((name, accepted))
    assert not disagree, disagree[:10]
    assert runnable > 1000 and missing > 50  # both verdicts are exercised


def test_inspect_agrees_with_onnxruntime_on_the_shipped_model_files():
    """The model files the onnx wheel does ship (onnx/backend/test/data/{simple,light,pytorch-*,...}),
    through the CLI itself on a sample and in-process on all of them."""
    shipped = sorted((Path(onnx.__file__).parent / "backend" / "test" / "data").glob("*/*/model.onnx"))
    if not shipped:
        pytest.skip("this onnx wheel ships no model files")
    disagree = []
    for path in shipped:
        model = onnx.load(path)
        accepted = _onnxruntime_verdict(model)
        if accepted is not None and _inspect.analyze(model).ok != accepted:
            disagree.append(str(path.relative_to(path.parents[2])))
    assert not disagree, disagree
    for path in shipped[:: max(1, len(shipped) // 5)]:
        r = run("inspect", path)
        ok = _inspect.analyze(onnx.load(path)).ok
        assert r.returncode == (0 if ok else 1), (path, r.stdout[-500:], r.stderr[-500:])
        assert ("OK:" in r.stdout) == ok and ("MISSING" in r.stdout) == (not ok), r.stdout[-500:]


def test_inspect_treats_export_kinds_generically(monkeypatch):
    """An op of a library exported as something other than a custom node (e.g. an ONNX function
    in the library's domain) is runnable through the model's own function, and MISSING with
    advice when the model lacks it; nothing is keyed on the kind's name."""
    import dataclasses

    lib = dataclasses.replace(opbridge.builtin, ops=())
    base = opbridge.builtin.op("my_add")
    object.__setattr__(lib, "ops", (dataclasses.replace(base, library=lib, export_kind="function", onnx_type="Fn"),))
    monkeypatch.setattr(_inspect.analysis, "libraries", lambda: [lib])  # the one read of the libraries
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    g = helper.make_graph([helper.make_node("Fn", ["x", "x"], ["y"], domain="opbridge")], "g", [x], [y])
    fn = helper.make_function("opbridge", "Fn", ["a", "b"], ["c"], [helper.make_node("Add", ["a", "b"], ["c"])],
                              [helper.make_opsetid("", 18)])
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("opbridge", 1)]
    with_fn = _inspect.analyze(helper.make_model(g, ir_version=10, opset_imports=opsets, functions=[fn]))
    use = next(u for u in with_fn.ops if u.op_type == "Fn")
    assert use.verdict.status == "model function" and "opbridge op my_add (function)" in use.verdict.detail
    assert with_fn.ok
    without = _inspect.analyze(helper.make_model(g, ir_version=10, opset_imports=opsets))
    (use,) = without.ops
    assert use.verdict.status == "MISSING" and "exported as function" in use.verdict.advice


# --- graph -------------------------------------------------------------------------------------


def test_graph_svg_highlights_custom_nodes(exported, tmp_path):
    path, _ = exported
    out = tmp_path / "block.svg"
    r = run("graph", path, "-o", out)
    assert r.returncode == 0, r.stderr
    svg = ET.parse(out).getroot()
    ns = {"s": "http://www.w3.org/2000/svg"}
    model = onnx.load(path)
    groups = {g.get("id"): g for g in svg.iter("{http://www.w3.org/2000/svg}g")}
    for i, node in enumerate(model.graph.node):
        g = groups[f"n{i}"]
        fill = g.find(".//s:polygon", ns).get("fill")
        text = " ".join(t.text for t in g.iter("{http://www.w3.org/2000/svg}text"))
        if node.domain == "opbridge":
            assert "opbridge" in g.get("class").split() and fill == "#cfe2ff"
            assert f"opbridge::{node.op_type}" in text
        else:
            assert "onnxruntime" in g.get("class").split() and fill == "#ffffff"
    assert "input" in groups["in0"].get("class") and "output" in groups["out1"].get("class")
    edge_labels = [t.text for g in svg.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "edge"
                   for t in g.iter("{http://www.w3.org/2000/svg}text")]
    assert edge_labels and all(t == "float[batch,8]" for t in edge_labels)


def test_graph_dot_collapses_long_runs_of_standard_ops(tmp_path):
    # x -> 120 x Relu -> MyAdd(., w) -> 80 x Sigmoid -> y, with an initializer w.
    nodes, prev = [], "x"
    for k in range(120):
        nodes.append(helper.make_node("Relu", [prev], [f"r{k}"]))
        prev = f"r{k}"
    nodes.append(helper.make_node("MyAdd", [prev, "w"], ["m"], domain="opbridge"))
    prev = "m"
    for k in range(80):
        nodes.append(helper.make_node("Sigmoid", [prev], [f"s{k}"]))
        prev = f"s{k}"
    w = onnx.numpy_helper.from_array(np.ones((3, 4), np.float32), "w")
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)], [w])
    model = helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 18),
                                                               helper.make_opsetid("opbridge", 1)])
    path = save(model, tmp_path / "chain.onnx")
    full = run("graph", path, "-o", tmp_path / "full.dot", "--max-nodes", "500")
    small = run("graph", path, "-o", tmp_path / "small.dot", "--max-nodes", "50")
    assert full.returncode == 0 and small.returncode == 0, small.stderr
    boxes = lambda text: re.findall(r"^  (n\d+) \[(.*)\]$", text, re.M)  # noqa: E731
    full_boxes = boxes((tmp_path / "full.dot").read_text())
    small_boxes = dict(boxes((tmp_path / "small.dot").read_text()))
    assert len(full_boxes) == 201
    assert len(small_boxes) == 3  # Relu run, MyAdd, Sigmoid run
    assert 'label="120 ops\\nRelu → Relu → … → Relu"' in small_boxes["n0"]
    assert 'class="opbridge"' in small_boxes["n120"] and "w: float[3,4]" in small_boxes["n120"]
    assert 'label="80 ops' in small_boxes["n121"]
    assert "collapsed 2 runs" in small.stderr
    # Edges follow the collapsed boxes, labelled with inferred shapes.
    small_text = (tmp_path / "small.dot").read_text()
    assert re.search(r'^  in0 -> n0 \[label="float\[n,4\]"', small_text, re.M)
    assert re.search(r'^  n0 -> n120 \[label="float\[n,4\]"', small_text, re.M)


def test_graph_without_graphviz_is_one_clear_error(exported, tmp_path):
    path, _ = exported
    empty = tmp_path / "empty_path"
    empty.mkdir()
    r = run("graph", path, "-o", tmp_path / "g.svg", env=dict(ENV, PATH=str(empty)))
    assert_one_line_error(r, 1, r"Graphviz 'dot' is not installed .*apt-get install graphviz")


# --- errors and help ---------------------------------------------------------------------------


def test_bad_input_files_are_one_line_errors(exported, work, tmp_path, capsys):
    path, _ = exported
    (tmp_path / "garbage.onnx").write_bytes(b"\xff\x00 this is not protobuf \x07" * 20)
    (tmp_path / "empty.onnx").write_bytes(b"")
    (tmp_path / "garbage.npz").write_text("no zip here")
    # One through `python -m opbridge` (nothing else reaches a process's stderr), the rest in-process.
    assert_one_line_error(run_process("inspect", tmp_path / "garbage.onnx"), 1, r"is not an ONNX model")
    for argv, code, pattern in [
        (["inspect", tmp_path / "missing.onnx"], 1, r"missing.onnx: no such file"),
        (["graph", tmp_path / "empty.onnx", "-o", tmp_path / "g.dot"], 1, r"is not an ONNX model"),
        (["verify", path, "--torch", work / "blocks.py:Block", "--inputs", tmp_path / "garbage.npz"], 1,
         r"is not a readable \.npz file"),
        (["export", work / "blocks.py:broken", "-o", tmp_path / "b.onnx", "--input", "x=2:float32"], 1,
         r"broken\(\) raised ValueError: no weights here"),
        (["export", "blocks.py:make", "-o", tmp_path / "b.onnx", "--input", "x=2xq:float32"], 2,
         r"SHAPE must be sizes joined by 'x'"),
    ]:
        rc, line = _one_line(argv, capsys)
        assert rc == code and re.search(pattern, line), (argv, line)


@pytest.mark.parametrize("argv, code, pattern", [
    (["inspect"], 2, r"required: MODEL.onnx"),
    (["frobnicate"], 2, r"invalid choice: 'frobnicate'"),
    (["graph", "m.onnx", "-o", "m.pdf"], 2, r"must end in \.svg, \.png or \.dot"),
    (["graph", "m.onnx", "-o", "m.svg", "--max-nodes", "0"], 2, r"must be positive"),
    (["export", "nofactory", "-o", "m.onnx", "--input", "x=2:float32"], 2, r"is not MODULE:FACTORY"),
    (["export", "m:F", "-o", "m.onnx", "--input", "x=2:complex64"], 2, r"DTYPE must be one of"),
    (["export", "m:F", "-o", "m.onnx", "--input", "x2float32"], 2, r"is not NAME=SHAPE:DTYPE"),
    (["export", "m:F", "-o", "m.onnx"], 2, r"give the model's example inputs with --input"),
    (["export", "m:F", "-o", "m.onnx", "--input", "x=2:float32", "--dynamic", "z:0"], 2, r"no --input named 'z'"),
    (["export", "m:F", "-o", "m.onnx", "--input", "x=2:float32", "--dynamic", "x:1"], 2, r"input 'x' has rank 1"),
    (["export", "m:F", "-o", "m.onnx", "--input", "x=2:float32", "--input", "x=3:float32"], 2, r"given twice"),
    (["verify", "m.onnx", "--torch", "m:F", "--rtol", "-1"], 2, r"must be >= 0"),
    (["verify", "m.onnx", "--torch", "m:F", "--inputs", "a.npz", "--input", "x=2:float32"], 2, r"not both"),
])
def test_usage_errors(argv, code, pattern, capsys):
    """In-process (the same main() the subprocess runs): usage errors exit 2 with one line."""
    try:
        rc = cli.main(argv)
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if not ln.startswith("[opbridge] ")]
    assert rc == code and len(lines) == 1 and lines[0].startswith("opbridge: error: "), err
    assert re.search(pattern, lines[0]), lines[0]


def test_failures_in_user_code_and_data(exported, work, tmp_path, capsys):
    path, _ = exported
    np.savez(tmp_path / "wrong.npz", z=np.ones(3))
    cases = [
        (["export", str(tmp_path / "none.py") + ":F", "-o", "m.onnx", "--input", "x=2:float32"], r"none.py: no such file"),
        (["export", str(work / "blocks.py") + ":Missing", "-o", "m.onnx", "--input", "x=2:float32"],
         r"module '.*blocks.py' has no attribute 'Missing'"),
        (["export", str(work / "blocks.py") + ":not_a_module", "-o", "m.onnx", "--input", "x=2:float32"],
         r"is not callable"),
        (["export", "no_such_module_xyz:F", "-o", "m.onnx", "--input", "x=2:float32"],
         r"cannot import module 'no_such_module_xyz'"),
        (["verify", str(path), "--torch", str(work / "blocks.py") + ":Block", "--inputs", str(tmp_path / "wrong.npz")],
         r"lacks 'x', 'y' \(it has z"),
        (["verify", str(path), "--torch", str(work / "blocks.py") + ":Block", "--input", "x=2x8:float64",
          "--input", "y=2x8:float32"], r"input 'x' is tensor\(float\) in the model, the given data is tensor\(double\)"),
        (["verify", str(path), "--torch", str(work / "blocks.py") + ":Block"], r"has shape \['batch', 8\]: give --input"),
        (["inspect", str(path), "--library", str(tmp_path / "libnothing_torch.so")], r"op library not found"),
    ]
    for argv, pattern in cases:
        rc = cli.main(argv)
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if not ln.startswith("[opbridge] ")]
        assert rc in (1, 2) and len(lines) == 1 and lines[0].startswith("opbridge: error: "), (argv, err)
        assert re.search(pattern, lines[0]), (argv, lines[0])
        assert "Traceback" not in err


def _one_line(argv, capsys):
    """cli.main in-process: its exit status and its one error line."""
    try:
        rc = cli.main([str(a) for a in argv])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if not ln.startswith("[opbridge] ")]
    assert len(lines) == 1 and lines[0].startswith("opbridge: error: ") and "Traceback" not in err, (argv, err)
    return rc, lines[0]


def test_export_checks_the_output_path_before_exporting(work, tmp_path, capsys):
    # broken() raises when called: an error about -o shows that the path was judged first, before
    # the model was built (let alone exported).
    (tmp_path / "out").mkdir()
    (tmp_path / "plain").write_text("")
    os.mkfifo(tmp_path / "pipe")
    factory = f"{work / 'blocks.py'}:broken"
    for output, pattern in [
        (tmp_path / "out", rf"-o {re.escape(str(tmp_path / 'out'))} is a directory: give the path of the \.onnx "
                           rf"file to write \(e\.g\. {re.escape(str(tmp_path / 'out' / 'model.onnx'))}\)"),
        (tmp_path / "pipe", r"-o .*pipe is a FIFO \(named pipe\): give the path of the \.onnx file"),
        (tmp_path / "plain" / "m.onnx", r"-o .*plain/m\.onnx: .*plain is a regular file, not a folder"),
        (tmp_path / "nowhere" / "m.onnx", r"-o .*nowhere/m\.onnx: folder .*nowhere does not exist"),
    ]:
        rc, line = _one_line(["export", factory, "-o", output, "--input", "x=2:float32"], capsys)
        assert rc == 1 and re.search(pattern, line), line
    assert list((tmp_path / "out").iterdir()) == []
    # A regular file is replaced as before: the factory then runs (and here fails).
    rc, line = _one_line(["export", factory, "-o", tmp_path / "plain", "--input", "x=2:float32"], capsys)
    assert rc == 1 and "broken() raised ValueError: no weights here" in line


def test_verify_refuses_npz_arrays_the_model_does_not_take(exported, work, tmp_path, capsys):
    path, _ = exported
    x = np.ones((3, 8), np.float32)
    np.savez(tmp_path / "named.npz", x=x, y=x, z=x, w=x)
    np.savez(tmp_path / "positional.npz", x, x, x)
    for npz, pattern in [
        ("named.npz", r"named\.npz has 'z', 'w', which the model does not take \(the model's inputs are x, y\)$"),
        ("positional.npz", r"positional\.npz has 'arr_2', which the model does not take \(the model's inputs are "
                           r"x, y, given as arr_0, arr_1\)$"),
    ]:
        rc, line = _one_line(["verify", path, "--torch", f"{work / 'blocks.py'}:Block", "--inputs", tmp_path / npz],
                             capsys)
        assert rc == 1 and re.search(pattern, line), line


class _WriterAfter:
    """Opens each FIFO for writing (and closes it) every second once `delay` seconds have passed, so
    that a command that opened one to read returns, having read nothing, instead of waiting for a
    writer forever: opening a FIFO blocks until the other end is opened."""

    def __init__(self, fifos, delay):
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._release, args=(fifos, delay), daemon=True)

    def _release(self, fifos, delay):
        if self.done.wait(delay):
            return
        while not self.done.wait(1.0):
            for f in fifos:
                try:
                    os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:  # ENXIO: no reader waits on it
                    pass

    def __enter__(self):
        self.thread.start()

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()


def test_a_fifo_is_named_as_such_without_blocking(exported, work, tmp_path):
    # Opening the FIFO would block until a writer came: a writer comes after 30 s, and the
    # command, if it opened the FIFO, reads nothing and says something else.
    path, _ = exported
    os.mkfifo(tmp_path / "model.onnx")
    os.mkfifo(tmp_path / "in.npz")
    for argv, pattern in [
        (["inspect", tmp_path / "model.onnx"], r"model\.onnx is a FIFO \(named pipe\), not a regular file"),
        (["graph", tmp_path / "model.onnx", "-o", tmp_path / "g.dot"], r"model\.onnx is a FIFO \(named pipe\)"),
        (["verify", path, "--torch", work / "blocks.py:Block", "--inputs", tmp_path / "in.npz"],
         r"--inputs .*in\.npz is a FIFO \(named pipe\), not a regular file"),
    ]:
        with _WriterAfter([tmp_path / "model.onnx", tmp_path / "in.npz"], delay=30):
            r = run(*argv)
        assert_one_line_error(r, 1, pattern)


def test_verbose_adds_the_traceback(tmp_path):
    r = run("--verbose", "inspect", tmp_path / "missing.onnx")
    assert r.returncode == 1 and "Traceback" in r.stderr and "opbridge: error:" in r.stderr.splitlines()[-1]
    r = run("inspect", tmp_path / "missing.onnx", "--verbose")
    assert r.returncode == 1 and "Traceback" in r.stderr


@pytest.mark.parametrize("command", ["ops", "inspect", "graph", "export", "verify"])
def test_every_command_has_help_with_an_example(command, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "example:" in out and f"opbridge {command}" in out.split("example:", 1)[1]
