"""`opbridge triton`: every config.pbtxt it writes is parsed with Triton's own ModelConfig
protobuf (model_config.proto as the tritonclient package ships it) and checked field by field
against the model: input and output names in the model's order, data types against the ONNX
element types (through tritonclient's own Triton-to-numpy table), dims against the ONNX
declarations, batching, instances, and the op library: the copied file is the loaded library's,
and ONNX Runtime runs the copied model with the configured library path, as Triton's ONNX
Runtime backend does (RegisterCustomOpsLibrary with op_library_filename, then 1/model.onnx)."""

import filecmp
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from google.protobuf import text_format
from onnx import TensorProto, helper

import opbridge
from opbridge._tools import cli

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "python"), os.environ.get("PYTHONPATH")) if p))
sys.path.insert(0, str(ROOT / "examples"))
from demo import CATALOGUE_INPUTS, FEATURES, CatalogueModel, DemoModel, catalogue_inputs, example_inputs  # noqa: E402

TRITONCLIENT = "tritonclient==2.69.0, pinned in requirements.txt (scripts/setup.sh installs it)"


@pytest.fixture(scope="session")
def pb():
    """tritonclient's model_config_pb2, loaded from its file: `import tritonclient.grpc` also
    needs grpcio, which a configuration does not. A missing package fails every test here."""
    spec = importlib.util.find_spec("tritonclient")
    if spec is None:
        pytest.fail(f"the tritonclient package is not installed; these tests parse config.pbtxt with Triton's "
                    f"ModelConfig from it: install {TRITONCLIENT}")
    path = Path(next(iter(spec.submodule_search_locations))) / "grpc" / "model_config_pb2.py"
    if not path.is_file():
        pytest.fail(f"{path} is missing: install {TRITONCLIENT}")
    module_spec = importlib.util.spec_from_file_location("_triton_model_config_pb2", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The demo model (batch axis dynamic) with both exporters, and the catalogue model with the
    TorchScript exporter: every custom op of it is an opbridge kernel node there (DeformConv2d,
    GridCluster, KnnQuery) or a model function (Selu), with four outputs of three dtypes."""
    out = tmp_path_factory.mktemp("models")
    paths = {}
    for exporter in opbridge.EXPORTERS:
        paths[f"demo_{exporter}"] = out / f"demo_{exporter}.onnx"
        opbridge.export(DemoModel().eval(), example_inputs(4), paths[f"demo_{exporter}"], exporter=exporter,
                        input_names=["x", "y"], output_names=["out0", "out1"],
                        dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    paths["catalogue"] = out / "catalogue.onnx"
    opbridge.export(CatalogueModel().eval(), catalogue_inputs(64, 2.0), paths["catalogue"], exporter="torchscript",
                    input_names=CATALOGUE_INPUTS, output_names=["idx", "dist", "cluster", "resized"],
                    dynamic_axes={"points": {0: "n"}})
    return paths


def triton(capsys, *args) -> tuple[int, str, str]:
    code = cli.main(["triton", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def parse(pb, folder: Path):
    return text_format.Parse((folder / "config.pbtxt").read_text(), pb.ModelConfig())


def declared(path: Path) -> tuple[list, list]:
    m = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    return [vi for vi in m.graph.input if vi.name not in inits], list(m.graph.output)


def onnx_dims(vi) -> list[int]:
    return [d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim]


def numpy_dtype(pb, data_type: int) -> np.dtype:
    from tritonclient.utils import triton_to_np_dtype

    name = pb.DataType.Name(data_type)[len("TYPE_"):]
    return np.dtype(triton_to_np_dtype("BYTES" if name == "STRING" else name))


def check_tensors(pb, cfg, path: Path, batching: bool) -> None:
    """Names, data types and dims of the configuration against the model's declarations."""
    for got, want in zip((cfg.input, cfg.output), declared(path)):
        assert [t.name for t in got] == [vi.name for vi in want]
        for t, vi in zip(got, want):
            assert numpy_dtype(pb, t.data_type) == helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type), t
            full = onnx_dims(vi)
            if batching:
                assert full and full[0] == -1, vi
                if len(full) == 1:  # one value per batch item: dims [1] reshaped to a scalar
                    assert list(t.dims) == [1] and t.HasField("reshape") and list(t.reshape.shape) == []
                else:
                    assert list(t.dims) == full[1:] and not t.HasField("reshape")
            else:
                assert list(t.dims) == full and not t.HasField("reshape")


def check_common(pb, cfg, folder: Path, instances: int = 1) -> None:
    assert cfg.name == folder.name and cfg.platform == "onnxruntime_onnx"
    assert [(g.count, g.kind) for g in cfg.instance_group] == [(instances, pb.ModelInstanceGroup.KIND_CPU)]
    assert cfg.HasField("dynamic_batching") == (cfg.max_batch_size > 0)


def check_opbridge_library(cfg, folder: Path) -> Path:
    """One op library, the built-in one, copied into the model's folder and named there by an
    absolute path."""
    (path,) = cfg.model_operations.op_library_filename
    lib = Path(path)
    assert lib.is_absolute() and lib == (folder / opbridge.builtin.ort_path.name).resolve()
    assert filecmp.cmp(lib, opbridge.builtin.ort_path, shallow=False)
    return lib


def run_like_triton(cfg, folder: Path, feeds: dict) -> list:
    so = ort.SessionOptions()
    for lib in cfg.model_operations.op_library_filename:
        so.register_custom_ops_library(lib)
    sess = ort.InferenceSession(str(folder / "1" / "model.onnx"), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def fits(shape, dims) -> bool:
    return len(shape) == len(dims) and all(d in (-1, s) for s, d in zip(shape, dims))


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_demo_model_batches_along_its_dynamic_first_axis(pb, models, tmp_path, capsys, exporter):
    path = models[f"demo_{exporter}"]
    code, out, _ = triton(capsys, path, "--repository", tmp_path / "repo")
    assert code == 0 and out.startswith(f"wrote {tmp_path / 'repo' / path.stem}")
    folder = tmp_path / "repo" / path.stem
    cfg = parse(pb, folder)
    check_common(pb, cfg, folder)
    assert cfg.max_batch_size == 4  # the ONNX Runtime backend's own default
    check_tensors(pb, cfg, path, batching=True)
    check_opbridge_library(cfg, folder)
    assert (folder / "1" / "model.onnx").read_bytes() == path.read_bytes()
    assert sorted(p.name for p in folder.iterdir()) == ["1", "config.pbtxt", opbridge.builtin.ort_path.name]

    x, y = (t.numpy() for t in example_inputs(5, seed=3))  # a batch of 5 requests' items
    assert all(fits(a.shape, [-1, *t.dims]) for a, t in zip((x, y), cfg.input))
    got = run_like_triton(cfg, folder, {"x": x, "y": y})
    want = opbridge.session(path).run(None, {"x": x, "y": y})
    for g, w, t in zip(got, want, cfg.output):
        assert fits(g.shape, [-1, *t.dims]) and g.shape[0] == 5
        np.testing.assert_array_equal(g, w)


def test_max_batch_size_option(pb, models, tmp_path, capsys):
    path = models["demo_dynamo"]
    assert triton(capsys, path, "--repository", tmp_path, "--name", "big", "--max-batch-size", 16)[0] == 0
    cfg = parse(pb, tmp_path / "big")
    assert cfg.max_batch_size == 16 and cfg.HasField("dynamic_batching")
    check_tensors(pb, cfg, path, batching=True)

    assert triton(capsys, path, "--repository", tmp_path, "--name", "whole", "--max-batch-size", 0)[0] == 0
    cfg = parse(pb, tmp_path / "whole")
    check_common(pb, cfg, tmp_path / "whole")
    assert cfg.max_batch_size == 0
    check_tensors(pb, cfg, path, batching=False)
    assert [list(t.dims) for t in cfg.input] == [[-1, FEATURES]] * 2


def test_catalogue_model_with_every_custom_op(pb, models, tmp_path, capsys):
    path = models["catalogue"]
    code, out, _ = triton(capsys, path, "--repository", tmp_path, "--instances", 3)
    assert code == 0
    folder = tmp_path / "catalogue"
    cfg = parse(pb, folder)
    check_common(pb, cfg, folder, instances=3)
    assert cfg.max_batch_size == 0  # points' first axis is dynamic, the image's is not
    check_tensors(pb, cfg, path, batching=False)
    assert [numpy_dtype(pb, t.data_type) for t in cfg.output] == [np.int32, np.float32, np.int64, np.float32]
    check_opbridge_library(cfg, folder)
    m = onnx.load(path)
    kernels = sorted({n.op_type for n in m.graph.node if n.domain == "opbridge"} - {f.name for f in m.functions})
    assert len(kernels) >= 3
    assert f"op library 'opbridge' for {', '.join('opbridge::' + k for k in kernels)}" in out

    for n_points in (64, 200):
        feeds = {name: t.numpy() for name, t in zip(CATALOGUE_INPUTS, catalogue_inputs(n_points, 1.5, seed=2))}
        assert all(fits(feeds[t.name].shape, t.dims) for t in cfg.input)
        got = run_like_triton(cfg, folder, feeds)
        want = opbridge.session(path).run(None, feeds)
        for g, w, t in zip(got, want, cfg.output):
            assert fits(g.shape, t.dims) and g.dtype == numpy_dtype(pb, t.data_type)
            np.testing.assert_array_equal(g, w)


def test_batching_needs_a_dynamic_first_axis_everywhere(models, tmp_path, capsys):
    code, _, err = triton(capsys, models["catalogue"], "--repository", tmp_path / "repo", "--max-batch-size", 8)
    assert code == 1
    assert "input 'offset' has a fixed first axis ([2])" in err and "--max-batch-size 0" in err
    assert not (tmp_path / "repo").exists()


def test_a_missing_op_library_is_inspects_message_and_nothing_is_written(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])
    graph = helper.make_graph([helper.make_node("Nope", ["x"], ["y"], domain="com.example")], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
                              ir_version=8)
    onnx.save(model, tmp_path / "nope.onnx")
    r = subprocess.run([sys.executable, "-m", "opbridge", "triton", tmp_path / "nope.onnx", "--repository",
                        tmp_path / "repo"], capture_output=True, text=True, env=ENV, timeout=600)
    assert r.returncode == 1, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if not ln.startswith("[opbridge] ")]
    assert len(errors) == 1 and errors[0].startswith("opbridge: error: "), r.stderr
    assert "com.example::Nope (opset 1, 1 node)" in errors[0]
    assert "load a custom-op library for domain 'com.example'" in errors[0] and "--library" in errors[0]
    assert errors[0].endswith("nothing was written") and r.stdout == ""
    assert not (tmp_path / "repo").exists()


def test_standard_ops_need_no_library(pb, tmp_path, capsys):
    """Several dtypes, a [batch] tensor (a scalar per item) and a [batch, 2, 3] one."""
    kinds = [TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT8, TensorProto.UINT16, TensorProto.INT64,
             TensorProto.BOOL, TensorProto.STRING]
    inputs = [helper.make_tensor_value_info(f"in{k}", t, ["b"] if k % 2 else ["b", 2, 3]) for k, t in enumerate(kinds)]
    outputs = [helper.make_tensor_value_info(f"out{k}", t, ["b"] if k % 2 else ["b", 2, 3]) for k, t in enumerate(kinds)]
    nodes = [helper.make_node("Identity", [f"in{k}"], [f"out{k}"]) for k in range(len(kinds))]
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / "plain.onnx"
    onnx.save(model, path)
    assert triton(capsys, path, "--repository", tmp_path / "repo")[0] == 0
    folder = tmp_path / "repo" / "plain"
    cfg = parse(pb, folder)
    check_common(pb, cfg, folder)
    assert cfg.max_batch_size == 4 and not cfg.HasField("model_operations")
    check_tensors(pb, cfg, path, batching=True)
    assert sorted(p.name for p in folder.iterdir()) == ["1", "config.pbtxt"]
    feeds = {vi.name: np.ones([3] + onnx_dims(vi)[1:], helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
             for vi in model.graph.input}
    assert [o.shape for o in run_like_triton(cfg, folder, feeds)] == [(3,) if k % 2 else (3, 2, 3) for k in range(7)]



@pytest.mark.parametrize("case, message", [
    ("scalar", "input 's' is a scalar, which Triton's configuration of a model without batching cannot describe"),
    ("rank", "output 'y' has no shape in the model (its rank is unknown)"),
    ("sequence", "output 'q' is seq(tensor(float)); Triton's ONNX Runtime backend takes tensors of"),
])
def test_values_triton_cannot_describe_are_refused(tmp_path, capsys, case, message):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    if case == "scalar":
        graph = helper.make_graph([helper.make_node("Add", ["x", "s"], ["y"])], "g",
                                  [x, helper.make_tensor_value_info("s", TensorProto.FLOAT, [])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    elif case == "rank":
        graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "g",  # rank = len(shape)
                                  [x, helper.make_tensor_value_info("shape", TensorProto.INT64, ["k"])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    else:
        graph = helper.make_graph([helper.make_node("SequenceConstruct", ["x"], ["q"])], "g", [x],
                                  [helper.make_tensor_sequence_value_info("q", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "m.onnx")
    code, _, err = triton(capsys, tmp_path / "m.onnx", "--repository", tmp_path / "repo")
    assert code == 1 and message in err, err
    assert not (tmp_path / "repo").exists()

def test_server_repository_sets_the_library_path(pb, models, tmp_path, capsys):
    code, out, _ = triton(capsys, models["demo_dynamo"], "--repository", tmp_path, "--server-repository", "/models")
    assert code == 0 and "tritonserver --model-repository=/models" in out
    cfg = parse(pb, tmp_path / "demo_dynamo")
    assert list(cfg.model_operations.op_library_filename) == [f"/models/demo_dynamo/{opbridge.builtin.ort_path.name}"]
    code, _, err = triton(capsys, models["demo_dynamo"], "--repository", tmp_path / "r", "--server-repository", "models")
    assert code == 2 and "give an absolute path" in err and not (tmp_path / "r").exists()


def test_rewriting_is_idempotent_and_replacing_needs_force(pb, models, tmp_path, capsys):
    path, folder = models["demo_dynamo"], tmp_path / "demo_dynamo"
    assert triton(capsys, path, "--repository", tmp_path)[0] == 0
    code, out, _ = triton(capsys, path, "--repository", tmp_path)
    assert code == 0 and "is up to date" in out
    code, _, err = triton(capsys, path, "--repository", tmp_path, "--instances", 2)
    assert code == 1 and "config.pbtxt differ" in err and "--force" in err
    assert parse(pb, folder).instance_group[0].count == 1
    code, out, _ = triton(capsys, path, "--repository", tmp_path, "--instances", 2, "--force")
    assert code == 0 and out.startswith("replaced")
    assert parse(pb, folder).instance_group[0].count == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo_dynamo"]  # no temporary folders left


def test_external_data_travels_with_the_model(pb, tmp_path, capsys):
    w = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 64])],
                              [onnx.numpy_helper.from_array(w, "w")])
    src = tmp_path / "src"
    src.mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), src / "mm.onnx",
              save_as_external_data=True, location="mm.weights", size_threshold=0)
    assert triton(capsys, src / "mm.onnx", "--repository", tmp_path / "repo")[0] == 0
    folder = tmp_path / "repo" / "mm"
    assert filecmp.cmp(folder / "1" / "mm.weights", src / "mm.weights", shallow=False)
    x = np.ones((2, 64), np.float32)
    np.testing.assert_array_equal(run_like_triton(parse(pb, folder), folder, {"x": x})[0], x @ w)


def test_model_names(models, tmp_path, capsys):
    code, _, err = triton(capsys, models["demo_dynamo"], "--repository", tmp_path, "--name", "../up")
    assert code == 1 and "cannot name a Triton model" in err
    assert list(tmp_path.iterdir()) == []


def test_help_has_an_example(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["triton", "--help"])
    assert e.value.code == 0
    assert "opbridge triton" in capsys.readouterr().out.split("example:", 1)[1]



def test_the_schema_is_tritons(pb):
    fields = pb.ModelConfig.DESCRIPTOR.fields_by_name
    assert pb.ModelConfig.DESCRIPTOR.full_name == "inference.ModelConfig"
    assert {"name", "platform", "max_batch_size", "input", "output", "instance_group", "model_operations",
            "dynamic_batching"} <= set(fields)


def test_force_replaces_a_linked_model_folder_by_the_link_alone(pb, models, tmp_path, capsys):
    # A model folder kept elsewhere and linked into the repository: --force replaces the link,
    # never what it points to.
    elsewhere, repo = tmp_path / "kept", tmp_path / "repo"
    assert triton(capsys, models["demo_dynamo"], "--repository", elsewhere)[0] == 0
    (elsewhere / "demo_dynamo" / "notes.txt").write_text("the user's")
    before = {p: p.read_bytes() for p in (elsewhere / "demo_dynamo").rglob("*") if p.is_file()}
    repo.mkdir()
    (repo / "demo_dynamo").symlink_to(elsewhere / "demo_dynamo", target_is_directory=True)
    code, _, err = triton(capsys, models["demo_dynamo"], "--repository", repo)
    assert code == 1 and "notes.txt" in err and "--force" in err
    code, out, err = triton(capsys, models["demo_dynamo"], "--repository", repo, "--force")
    assert code == 0 and out.startswith("replaced"), err
    assert not (repo / "demo_dynamo").is_symlink() and parse(pb, repo / "demo_dynamo").name == "demo_dynamo"
    assert {p: p.read_bytes() for p in (elsewhere / "demo_dynamo").rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in repo.iterdir()) == ["demo_dynamo"]  # no hidden folder left behind


def test_a_repository_that_is_a_file_is_refused_and_left_alone(models, tmp_path, capsys):
    (tmp_path / "repo").write_text("not a folder")
    code, _, err = triton(capsys, models["demo_dynamo"], "--repository", tmp_path / "repo")
    assert code in (1, 2) and "repo" in err and "not a folder" in err and "Traceback" not in err
    assert (tmp_path / "repo").read_text() == "not a folder"


# ---- --backend python -------------------------------------------------------------------------
def test_python_backend_writes_the_same_plan_with_a_model_py(pb, models, tmp_path, capsys):
    """The same tensors, batching, instances and copied library as the ONNX Runtime backend's
    folder, with backend "python", 1/model.py and the library named by file in op_libraries (the
    real server runs it in tests/python/test_triton_server.py)."""
    path = models["demo_dynamo"]
    code, out, _ = triton(capsys, path, "--repository", tmp_path, "--backend", "python", "--python-env",
                          "/opt/envs/ort", "--instances", 2)
    assert code == 0 and "backend python, max_batch_size 4, dynamic batching, 2 instances" in out
    folder = tmp_path / path.stem
    cfg = parse(pb, folder)
    assert cfg.backend == "python" and cfg.platform == "" and not cfg.HasField("model_operations")
    assert cfg.max_batch_size == 4 and cfg.HasField("dynamic_batching")
    assert [(g.count, g.kind) for g in cfg.instance_group] == [(2, pb.ModelInstanceGroup.KIND_CPU)]
    check_tensors(pb, cfg, path, batching=True)
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    assert params == {"op_libraries": opbridge.builtin.ort_path.name, "EXECUTION_ENV_PATH": "/opt/envs/ort"}
    assert filecmp.cmp(folder / opbridge.builtin.ort_path.name, opbridge.builtin.ort_path, shallow=False)
    model_py = Path(opbridge.__file__).parent / "_tools" / "triton_model.py"
    assert (folder / "1" / "model.py").read_bytes() == model_py.read_bytes()
    assert (folder / "1" / "model.onnx").read_bytes() == path.read_bytes()
    # The library's folder is found from model.py at run time: no path of this machine is written.
    assert str(tmp_path) not in (folder / "config.pbtxt").read_text()
    code, out, _ = triton(capsys, path, "--repository", tmp_path, "--backend", "python", "--python-env",
                          "/opt/envs/ort", "--instances", 2)
    assert code == 0 and "is up to date" in out


def test_python_backend_without_an_environment_or_a_library(pb, tmp_path, capsys):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 2])
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                                opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "relu.onnx")
    code, out, _ = triton(capsys, tmp_path / "relu.onnx", "--repository", tmp_path / "repo", "--backend", "python")
    assert code == 0 and "EXECUTION_ENV_PATH   (not set" in out
    cfg = parse(pb, tmp_path / "repo" / "relu")
    assert cfg.backend == "python" and dict(cfg.parameters) == {}
    assert sorted(p.name for p in (tmp_path / "repo" / "relu").iterdir()) == ["1", "config.pbtxt"]


@pytest.mark.parametrize("args, message", [
    (["--python-env", "/opt/envs/ort"], "--python-env is for --backend python"),
    (["--backend", "python", "--python-env", "envs/ort"], "--python-env envs/ort: give an absolute path"),
    (["--backend", "python", "--server-repository", "/models"], "--server-repository is for the onnxruntime backend"),
])
def test_backend_options_that_do_not_fit_are_refused(models, tmp_path, capsys, args, message):
    code, _, err = triton(capsys, models["demo_dynamo"], "--repository", tmp_path / "repo", *args)
    assert code == 2 and message in err, err
    assert not (tmp_path / "repo").exists()


def test_python_env_in_the_model_folder(pb, models, tmp_path, capsys):
    env = "$$TRITON_MODEL_DIRECTORY/ort.tar.gz"  # the python backend's name for the model's folder
    assert triton(capsys, models["demo_dynamo"], "--repository", tmp_path, "--backend", "python",
                  "--python-env", env)[0] == 0
    assert parse(pb, tmp_path / "demo_dynamo").parameters["EXECUTION_ENV_PATH"].string_value == env
