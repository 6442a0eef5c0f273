"""`opbridge triton --backend python` on a real Triton Inference Server (tritonserver 2.51 from
PyPI's nvidia-pytriton, CPU; tests/python/triton_server.py), its models' stubs in an environment
with numpy < 2 and the pinned onnxruntime only (no PyTorch, no opbridge).

Every answer, over HTTP and gRPC (tritonclient), equals opbridge.session's output for the same
inputs bit for bit: the demo model (my_add, dual_residual; dynamic batching that merges requests),
the catalogue model (knn_query, grid_cluster, deform_conv2d, resize_bicubic; outputs of three
dtypes) and a standard-ops model of strings and [batch] tensors. A request the op refuses is an
error naming the model and the op's reason, and the requests around it are answered. A broken
model folder (an op library cut short, one that is gone, none registered, a bad thread count) fails
to load with a message naming the library, the op or the parameter; intra_op_thread_count reaches
the session. Under 8 and 32 concurrent clients (the same requests on one opbridge.session from as
many threads too) nothing fails or
differs; a stub killed under load fails requests fast (none hang), and a reload brings the model
back with fresh stubs. bench/serving_load_triton.py prints the timings; nothing here asserts one.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import opbridge
from opbridge._tools import cli

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "bench"))
import serving_load  # noqa: E402  (bench/serving_load.py: the load driver)
import triton_server  # noqa: E402
from triton_server import load_run  # noqa: E402
from demo import CATALOGUE_INPUTS, FEATURES, CatalogueModel, DemoModel, catalogue_inputs, example_inputs  # noqa: E402

pytestmark = pytest.mark.environments  # scripts/test.sh --environments

LIBRARY = opbridge.builtin.ort_path.name


# ---- the models and the repository -------------------------------------------------------------
def _strings_model(path: Path) -> None:
    """Standard ops only: a string and a float per batch item ([batch] tensors)."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["s"], ["s_out"]), helper.make_node("Neg", ["v"], ["v_out"])], "g",
        [helper.make_tensor_value_info("s", TensorProto.STRING, ["b"]),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, ["b"])],
        [helper.make_tensor_value_info("s_out", TensorProto.STRING, ["b"]),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, ["b"])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


def _write(model: Path, repository: Path, *args) -> None:
    code = cli.main(["triton", str(model), "--repository", str(repository), "--backend", "python",
                     "--python-env", str(triton_server.model_env()), *map(str, args)])
    assert code == 0


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("models")
    paths = {"demo": out / "demo.onnx", "catalogue": out / "catalogue.onnx", "strings": out / "strings.onnx"}
    opbridge.export(DemoModel().eval(), example_inputs(4), paths["demo"], input_names=["x", "y"],
                    output_names=["out0", "out1"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    opbridge.export(CatalogueModel().eval(), catalogue_inputs(64, 2.0), paths["catalogue"], exporter="torchscript",
                    input_names=CATALOGUE_INPUTS, output_names=["idx", "dist", "cluster", "resized"],
                    dynamic_axes={"points": {0: "n"}})
    _strings_model(paths["strings"])
    return paths


@pytest.fixture(scope="module")
def repository(models, tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("repository")
    _write(models["demo"], repo, "--instances", 2, "--max-batch-size", 8)
    triton_server.set_parameter(repo / "demo", "intra_op_thread_count", "1")  # 2 instances on few cores
    _write(models["demo"], repo, "--name", "demo_faults", "--instances", 2)
    _write(models["catalogue"], repo)
    _write(models["strings"], repo)
    # A batch waits up to 0.2 s for more requests: concurrent ones are certain to merge.
    _write(models["demo"], repo, "--name", "demo_merging", "--max-batch-size", 8)
    config = repo / "demo_merging" / "config.pbtxt"
    config.write_text(config.read_text().replace("dynamic_batching { }",
                                                 "dynamic_batching { max_queue_delay_microseconds: 200000 }"))
    # Broken folders: a library cut short, one that is gone, none registered, a bad thread count.
    for name in ("truncated", "library_gone", "unregistered", "bad_threads"):
        _write(models["demo"], repo, "--name", name)
    triton_server.set_parameter(repo / "bad_threads", "intra_op_thread_count", "two")
    lib = repo / "truncated" / LIBRARY
    lib.write_bytes(lib.read_bytes()[:4096])
    (repo / "library_gone" / LIBRARY).unlink()
    config = repo / "unregistered" / "config.pbtxt"
    lines = config.read_text().splitlines(keepends=True)
    start = next(k for k, ln in enumerate(lines) if ln.startswith("# 1/model.py registers"))
    del lines[start:lines.index("}\n", start) + 1]  # the comment and its parameters { } block
    config.write_text("".join(lines))
    assert "op_libraries" not in config.read_text()
    return repo


@pytest.fixture(scope="module")
def server(repository, tmp_path_factory):
    with triton_server.Server(repository, tmp_path_factory.mktemp("server") / "tritonserver.log") as s:
        yield s


def _load(server, name: str) -> None:
    """Loads the model unless it is ready (a second load call may reload it: see reload())."""
    if server.ready(name):
        return
    status, error = server.load(name)
    assert status == 200, f"{name} did not load: {error}\n{server.log_tail()}"


def _reference(model: Path, inputs: list[dict]) -> list[list[np.ndarray] | None]:
    """opbridge.session's outputs for each request, None where it refuses the inputs."""
    sess = opbridge.session(model)
    out = []
    for feed in inputs:
        try:
            out.append(sess.run(None, feed))
        except Exception:  # noqa: BLE001 - a refused request has no reference
            out.append(None)
    return out


def _demo_inputs(count: int, batches=(1, 2, 3, 4)) -> list[dict]:
    return serving_load.payloads({"x": (FEATURES,), "y": (FEATURES,)}, count, batches=batches)


def _clean(report: dict) -> None:
    assert report["error_count"] == 0, f"{report['name']}: {report['error_count']} errors, e.g. {report['errors']}"
    assert report["mismatch_count"] == 0, f"{report['name']}: {report['mismatches']}"


# ---- answers -------------------------------------------------------------------------------------
def test_demo_model_over_http_and_grpc_equals_opbridge_session(server, models, tmp_path):
    _load(server, "demo")
    assert len(server.stubs("demo")) == 2  # --instances 2: a stub process each
    inputs = _demo_inputs(12)
    for report in triton_server.run_client(server, "demo", inputs, _reference(models["demo"], inputs),
                                           [load_run("http", 1, 12), load_run("grpc", 1, 12)], tmp_path):
        _clean(report)
        assert report["answered"] == 12


def test_dynamic_batching_merges_requests_and_splits_the_answers(server, models, tmp_path):
    _load(server, "demo_merging")
    inputs = _demo_inputs(16, batches=(1, 2))
    (report,) = triton_server.run_client(server, "demo_merging", inputs, _reference(models["demo"], inputs),
                                         [load_run("grpc", 8, 4)], tmp_path)
    _clean(report)
    status, stats = server.get("/v2/models/demo_merging/stats")
    assert status == 200
    sizes = {b["batch_size"] for m in stats["model_stats"] for b in m["batch_stats"]}
    assert max(sizes) > 2, f"no merged batch: executed batch sizes {sorted(sizes)}"  # one request has at most 2


def test_catalogue_model_with_real_model_ops(server, models, tmp_path):
    _load(server, "catalogue")
    inputs = [{n: t.numpy() for n, t in zip(CATALOGUE_INPUTS, catalogue_inputs(n_points, scale, seed=s))}
              for s, (n_points, scale) in enumerate([(64, 2.0), (200, 1.5), (37, 1.0)])]
    expected = _reference(models["catalogue"], inputs)
    assert [o.dtype for o in expected[0]] == [np.int32, np.float32, np.int64, np.float32]
    for report in triton_server.run_client(server, "catalogue", inputs, expected,
                                           [load_run("http", 1, 3), load_run("grpc", 1, 3)], tmp_path):
        _clean(report)


def test_strings_and_batch_item_tensors(server, models, tmp_path):
    """[batch] tensors are dims [1] reshaped to [] in the configuration; strings are Triton's BYTES."""
    _load(server, "strings")
    items = [(np.array([b"alpha", b"b"][:n]), np.arange(n, dtype=np.float32) - 0.5) for n in (1, 2)]
    sess = opbridge.session(models["strings"])
    # The client's view: [batch, 1] (dims [1]); the model's: [batch]. Strings as fixed-width bytes.
    sent = [{"s": s[:, None], "v": v[:, None]} for s, v in items]
    expected = [[(o.astype(bytes) if o.dtype == object else o)[:, None]
                 for o in sess.run(None, {"s": s.astype(str).astype(object), "v": v})] for s, v in items]
    for report in triton_server.run_client(server, "strings", sent, expected,
                                           [load_run("http", 1, 2), load_run("grpc", 1, 2)], tmp_path):
        _clean(report)


def test_a_refused_request_is_an_error_naming_the_model_and_the_reason(server, models, tmp_path):
    _load(server, "catalogue")
    good = {n: t.numpy() for n, t in zip(CATALOGUE_INPUTS, catalogue_inputs(64, 2.0))}
    bad = dict(good, offset=np.array([32, 70], np.int32))  # offsets past the 64 points
    inputs = [good, bad, good]
    expected = _reference(models["catalogue"], inputs)
    assert expected[1] is None
    for report in triton_server.run_client(server, "catalogue", inputs, expected,
                                           [load_run("http", 1, 3), load_run("grpc", 1, 3)], tmp_path):
        assert report["answered"] == 2 and report["mismatch_count"] == 0, report
        (error,) = report["errors"]
        assert "model 'catalogue': ONNX Runtime failed" in error, error
        assert "opbridge::knn_query" in error and "the last entry of offset (70) must equal the number of rows" \
            in error, error


def test_intra_op_thread_count_sizes_the_sessions_thread_pool(server):
    """The ONNX Runtime backend's parameter reaches model.py's session: with one intra-op thread a
    stub runs fewer threads than with ONNX Runtime's default pool (one per core)."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: the default pool has one thread too")
    _load(server, "demo")
    _load(server, "demo_merging")  # the default

    def threads(pid: int) -> int:
        return int(re.search(r"Threads:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1))

    one, default = ([threads(p) for p in server.stubs(name)] for name in ("demo", "demo_merging"))
    assert max(one) < min(default), (one, default)


# ---- models that cannot load ---------------------------------------------------------------------
@pytest.mark.parametrize("name, reasons", [
    ("truncated", [f"/truncated/{LIBRARY} cannot be loaded: the file is cut short: a loadable segment ends at byte"]),
    ("library_gone", [f"/library_gone/{LIBRARY} (op_libraries in config.pbtxt) does not exist"]),
    ("unregistered", ["cannot load", "with no op library registered", "MyAdd"]),
    ("bad_threads", ["intra_op_thread_count must be a whole number, got 'two'"]),
])
def test_a_broken_model_fails_to_load_with_the_reason(server, name, reasons):
    status, error = server.load(name)
    assert status == 400, (status, error)
    entry = server.index()[name]
    log = server.log.read_text(errors="replace")
    for reason in [f"model '{name}': ", *reasons]:
        assert reason in error, error
        assert reason in entry["reason"], entry
        assert reason in log
    assert entry["state"] == "UNAVAILABLE" and not server.ready(name)
    server.wait(lambda: not server.stubs(name), 15, f"{name}'s stub to exit")


# ---- load and faults -----------------------------------------------------------------------------
def test_8_and_32_clients_get_the_baselines_answers(server, models, tmp_path):
    _load(server, "demo")
    inputs = _demo_inputs(64)
    expected = _reference(models["demo"], inputs)
    # The baseline: the same requests on one opbridge.session from as many threads.
    sess = opbridge.session(models["demo"])
    for clients in (8, 32):
        direct = serving_load.closed_loop(lambda: (lambda feed: sess.run(None, feed)), inputs, clients, 8)
        assert not direct.errors and not direct.mismatches(expected)
    runs = [load_run(protocol, clients, 128 // clients) for clients in (8, 32) for protocol in ("http", "grpc")]
    for report in triton_server.run_client(server, "demo", inputs, expected, runs, tmp_path):
        _clean(report)
        assert report["answered"] == 128


def test_a_stub_killed_under_load_fails_requests_fast_and_a_reload_recovers(server, models, tmp_path):
    _load(server, "demo_faults")
    stubs = server.stubs("demo_faults")
    assert len(stubs) == 2
    inputs = _demo_inputs(32)
    expected = _reference(models["demo"], inputs)
    runs = [load_run("http", 8, 30, kill=stubs[0], kill_after=40)]
    (report,) = triton_server.run_client(server, "demo_faults", inputs, expected, runs, tmp_path / "kill",
                                         request_timeout=20, timeout=240)
    assert report["killed_after"] is not None, "the stub was not killed under load"
    assert report["mismatch_count"] == 0, report["mismatches"]  # what is answered is right
    assert report["answered"] + report["error_count"] == 240
    assert report["slowest_s"] < 20, report  # nothing waited for the client's timeout
    # This python backend does not restart a dead stub: its instance fails each request it takes.
    assert report["error_count"] > 0 and all("Stub process 'demo_faults_0_" in e and "is not healthy" in e
                                              for e in report["errors"]), report["errors"]
    assert server.ready("demo_faults")  # and the model still says it is ready
    # Reloaded, the model has fresh stubs and answers everything again.
    status, error = server.reload("demo_faults")
    assert status == 200, f"{error}\n{server.log_tail()}"
    assert len(set(server.stubs("demo_faults")) - set(stubs)) == 2
    (report,) = triton_server.run_client(server, "demo_faults", inputs, expected, [load_run("http", 8, 8)],
                                         tmp_path / "after")
    _clean(report)
