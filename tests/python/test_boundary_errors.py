"""Errors at the boundaries a user crosses: an export that fails (the op's own error, an op nothing
can translate, any other failure) in one plain line, a model whose custom domain no loaded library
provides, and an op library's PyTorch and ONNX Runtime files passed for each other (told by what
the files export, not by their names)."""

import ctypes.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import opbridge
from opbridge._library.registry import libraries as loaded_libraries

ROOT = Path(__file__).resolve().parents[2]
# The installed runner, or another build of it (OPBRIDGE_RUN=build-x/tools/opbridge-run).
RUNNER = Path(os.environ.get("OPBRIDGE_RUN") or Path(opbridge.__file__).parent / "_sdk/bin/opbridge-run")
LIB_DIR = opbridge.builtin.torch_path.parent
TORCH_LIB, ORT_LIB = LIB_DIR / "libopbridge_torch.so", LIB_DIR / "libopbridge_ort.so"
needs_runner = pytest.mark.skipif(not RUNNER.exists(), reason=f"{RUNNER} is not installed")

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

    class BadView(torch.nn.Module):
        def forward(self, x):
            return x.view(5, 7)
    """)


def _export(tmp_path, factory, exporter, *extra):
    (tmp_path / "models.py").write_text(MODELS)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    return subprocess.run([sys.executable, "-m", "opbridge", "export", f"models.py:{factory}", "-o", "m.onnx",
                           "--input", "x=8x3:float32", "--exporter", exporter, *extra], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=600)


@pytest.mark.parametrize("factory, exporter, message", [
    ("BadK", "dynamo", "opbridge::knn_query: k must be >= 1, got 0"),
    ("BadK", "torchscript", "opbridge::knn_query: k must be >= 1, got 0"),
    ("Unknown", "dynamo", "boundary::mystery: no ONNX translation (the dynamo exporter has none and no loaded opbridge "
                          "library defines one): pass extra_translations={torch.ops.boundary.mystery.default: "
                          "<onnxscript function>}"),
    ("Unknown", "torchscript", "boundary::mystery: no ONNX symbolic for the TorchScript exporter: register one with "
                               "torch.onnx.register_custom_op_symbolic('boundary::mystery', ...)"),
    # Not an op's error: the dynamo exporter's "step 1/3" wrapper gives way to its cause.
    ("BadView", "dynamo", "Failed to export the model with torch.export: RuntimeError: shape '[5, 7]' is invalid for "
                          "input of size 24"),
    ("BadView", "torchscript", "RuntimeError: shape '[5, 7]' is invalid for input of size 24"),
])
def test_cli_export_failure_is_one_plain_line(tmp_path, factory, exporter, message):
    r = _export(tmp_path, factory, exporter)
    assert r.returncode == 1
    lines = [ln for ln in r.stderr.splitlines() if not ln.startswith("[opbridge] ")]
    assert len(lines) == 1 and lines[0].startswith(f"opbridge: error: {message}"), r.stderr
    assert lines[0].endswith(" (--verbose for the traceback)")
    assert "\x1b[" not in r.stderr and "Traceback" not in r.stderr and "Torch IR graph" not in r.stdout + r.stderr
    assert r.stdout == ""
    if factory == "Unknown":  # advice that holds: the dynamo exporter has no translation for it either
        assert "use the dynamo exporter" not in lines[0] and "substitute the Python function" in lines[0]


def test_cli_export_failure_with_verbose_keeps_the_traceback(tmp_path):
    r = _export(tmp_path, "BadK", "dynamo", "--verbose")
    assert r.returncode == 1
    assert "Traceback" in r.stderr and r.stderr.rstrip().endswith("opbridge: error: opbridge::knn_query: k must be "
                                                                  ">= 1, got 0"), r.stderr[-2000:]


class _Mystery(torch.nn.Module):
    def forward(self, x):
        return torch.ops.boundary_api.mystery(x) + 1


@pytest.fixture(scope="module")
def mystery_op():
    lib = torch.library.Library("boundary_api", "DEF")
    lib.define("mystery(Tensor x) -> Tensor")
    lib.impl("mystery", lambda x: x * 3, "CompositeExplicitAutograd")
    torch.library.register_fake("boundary_api::mystery", lambda x: torch.empty_like(x), lib=lib)
    yield
    lib._destroy()


def test_a_translation_that_fails_is_named_with_its_cause(mystery_op):
    def broken(x):
        raise ValueError("this translation is broken\nsecond line")

    with pytest.raises(opbridge.OpbridgeError) as e:
        opbridge.export(_Mystery(), (torch.randn(2, 3),),
                        extra_translations={torch.ops.boundary_api.mystery.default: broken})
    assert str(e.value) == ("Failed to convert the exported program to an ONNX model (translating "
                            "torch.ops.boundary_api.mystery.default): ValueError: this translation is broken")
    assert isinstance(e.value.__cause__, torch.onnx.errors.OnnxExporterError)  # the exporter's own, chained


# ---- a model's custom domain that no library provides ------------------------------------------

X, Y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in "xy")


def _acme_model(nodes, inputs=(X,), functions=()):
    graph = helper.make_graph(nodes, "g", list(inputs), [Y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.acme", 1)],
                             ir_version=8, functions=list(functions))


@pytest.fixture(scope="module")
def foreign_model(tmp_path_factory):
    """com.acme::Mystery, then com.acme::Deep in an If branch; a model-local function
    com.acme::Helper (provided by the model itself) whose body calls com.acme::Inner."""
    branch = helper.make_graph([helper.make_node("Deep", ["t"], ["b"], domain="com.acme")], "branch", [],
                               [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])])
    helper_fn = helper.make_function("com.acme", "Helper", ["i"], ["o"],
                                     [helper.make_node("Inner", ["i"], ["o"], domain="com.acme")],
                                     [helper.make_opsetid("", 17), helper.make_opsetid("com.acme", 1)])
    m = _acme_model([helper.make_node("Mystery", ["x"], ["m"], domain="com.acme"),
                     helper.make_node("Helper", ["m"], ["t"], domain="com.acme"),
                     helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)],
                    inputs=(X, helper.make_tensor_value_info("c", TensorProto.BOOL, [])), functions=[helper_fn])
    path = tmp_path_factory.mktemp("foreign") / "acme.onnx"
    onnx.save(m, path)
    return path


@pytest.mark.parametrize("form", ["path", "proto", "bytes"])
def test_session_names_the_domain_its_ops_and_how_to_load_it(foreign_model, form):
    model = {"path": foreign_model, "proto": onnx.load(foreign_model),
             "bytes": foreign_model.read_bytes()}[form]
    with pytest.raises(opbridge.OpbridgeError) as e:
        opbridge.session(model)
    # opbridge's own library, and any other this process loaded before (the test order decides)
    loaded = ", ".join(f"'{d}'" for lib in loaded_libraries() for d in sorted(lib.domains))
    assert "'opbridge'" in loaded
    assert str(e.value) == (
        "the model has com.acme::Mystery, com.acme::Deep, com.acme::Inner nodes, and no loaded op library provides "
        f"ONNX domain 'com.acme' (loaded: {loaded}): load its op library first with "
        "opbridge.load_library('path/lib<name>_torch.so') (or opbridge.load / opbridge.load_inline), or pass its "
        "ONNX Runtime library with opbridge.session(..., libraries=['path/lib<name>_ort.so']); ONNX Runtime said: "
        "Fatal error: com.acme:Mystery(-1) is not a registered function/op")
    assert "is not a registered function/op" in str(e.value.__cause__)  # ONNX Runtime's own error, chained


def test_session_names_the_op_a_loaded_library_lacks():
    m = helper.make_model(helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["y"], domain="opbridge")], "g",
                                            [X], [Y]),
                          opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("opbridge", 1)], ir_version=8)
    with pytest.raises(opbridge.OpbridgeError) as e:
        opbridge.session(m)
    assert str(e.value).startswith(
        f"the model has opbridge::NoSuchOp nodes; op library 'opbridge' ({TORCH_LIB}) provides ONNX domain 'opbridge' "
        "but not opbridge::NoSuchOp: the model was made with another version of the library")


@needs_runner
def test_opbridge_run_names_the_domain_its_ops_and_the_option(foreign_model):
    r = subprocess.run([str(RUNNER), str(foreign_model), "--random"], capture_output=True, text=True, env={}, timeout=60)
    assert r.returncode == 1
    assert r.stderr.startswith(
        f"opbridge-run: error: cannot load model {foreign_model}: the model has com.acme::Mystery, com.acme::Deep, "
        "com.acme::Inner nodes, and no registered custom-op library implements com.acme::Mystery (registered: "
        "libopbridge_ort.so): pass the ONNX Runtime library of ONNX domain 'com.acme' with --library "
        "path/lib<name>_ort.so; ONNX Runtime said: "), r.stderr
    assert r.stderr.rstrip().endswith("Fatal error: com.acme:Mystery(-1) is not a registered function/op")
    assert r.stderr.count("\n") == 1


# ---- an op library's two files passed for each other ---------------------------------------------

def _system_library() -> Path:
    """A shared library that is no op library: zlib."""
    name = ctypes.util.find_library("z")
    found = [Path(d) / name for d in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")
             if name and (Path(d) / name).exists()]
    if not found:
        pytest.skip("no zlib shared library found")
    return found[0]


def test_load_library_given_the_onnxruntime_file_names_the_pytorch_one():
    with pytest.raises(opbridge.OpbridgeError) as e:
        opbridge.load_library(ORT_LIB)
    assert str(e.value) == (
        "libopbridge_ort.so is an ONNX Runtime custom-op library (it exports RegisterCustomOps): load its PyTorch "
        f"library instead, {TORCH_LIB} (the ONNX Runtime library beside it is found and registered with it)")


def test_load_library_tells_the_file_by_its_symbols_not_its_name(tmp_path):
    renamed = tmp_path / "libsomething_torch.so"
    shutil.copy(ORT_LIB, renamed)
    with pytest.raises(opbridge.OpbridgeError, match=r"^libsomething_torch.so is an ONNX Runtime custom-op library "
                                                     r"\(it exports RegisterCustomOps\): load its PyTorch library "
                                                     r"instead, lib<name>_torch.so, built beside it"):
        opbridge.load_library(renamed)


def test_load_library_given_another_file_says_so(tmp_path):
    with pytest.raises(opbridge.OpbridgeError, match=r"is not an opbridge op library \(it exports neither "
                                                     r"opbridge_manifest_json nor RegisterCustomOps\)$"):
        opbridge.load_library(_system_library())
    (tmp_path / "notes_torch.so").write_text("not a library")
    with pytest.raises(opbridge.OpbridgeError) as e:
        opbridge.load_library(tmp_path / "notes_torch.so")
    assert str(e.value) == f"{tmp_path / 'notes_torch.so'} is not an op library: it is not an ELF shared library"


@pytest.fixture
def torch_lib_copy(tmp_path):
    path = tmp_path / "libcopied_torch.so"
    shutil.copy(TORCH_LIB, path)
    return path


def test_load_library_given_the_pytorch_file_as_ort_path(torch_lib_copy):
    # Checked before anything is loaded: the copy stays unloaded.
    with pytest.raises(opbridge.OpbridgeError, match=r"^ort_path: libopbridge_torch.so is the PyTorch library of an op "
                                                     r"library \(it exports opbridge_manifest_json\)"):
        opbridge.load_library(torch_lib_copy, ort_path=TORCH_LIB)
    assert all(lib.torch_path != torch_lib_copy.resolve() for lib in opbridge.libraries())


def test_session_libraries_given_the_pytorch_file_names_the_onnxruntime_one(foreign_model):
    with pytest.raises(opbridge.OpbridgeError) as e:
        opbridge.session(foreign_model, libraries=[TORCH_LIB])
    assert str(e.value) == (
        "libraries: libopbridge_torch.so is the PyTorch library of an op library (it exports opbridge_manifest_json): "
        f"ONNX Runtime takes its ONNX Runtime library, {ORT_LIB} (or load this one with opbridge.load_library, which "
        "registers its sibling in every opbridge.session)")


def test_session_libraries_refuses_other_files(tmp_path):
    z = _system_library()
    with pytest.raises(opbridge.OpbridgeError, match=r"^libraries: .* is not an ONNX Runtime custom-op library \(it "
                                                     r"does not export RegisterCustomOps\)$"):
        opbridge.session(_acme_model([]), libraries=[z])
    with pytest.raises(opbridge.OpbridgeError, match="^libraries: ONNX Runtime custom-op library not found: "):
        opbridge.session(_acme_model([]), libraries=[tmp_path / "libnothing_ort.so"])


def test_session_libraries_registers_an_onnxruntime_library():
    # The built-in library again: registered once, as loading it did.
    m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [X], [Y]),
                          opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    out = opbridge.session(m, libraries=[ORT_LIB]).run(None, {"x": np.array([-1, 2], np.float32)})[0]
    assert out.tolist() == [0, 2]


@needs_runner
@pytest.mark.parametrize("library, message", [
    (TORCH_LIB, f"libopbridge_torch.so is the PyTorch library of an op library (it exports opbridge_manifest_json, "
                f"not RegisterCustomOps): pass its ONNX Runtime library, {ORT_LIB}"),
    ("zlib", "not an ONNX Runtime custom-op library (it does not export RegisterCustomOps)"),
    ("text", "not an ONNX Runtime custom-op library: it is not an ELF shared library"),
])
def test_opbridge_run_library_that_is_not_an_onnxruntime_one(foreign_model, tmp_path, library, message):
    if library == "zlib":
        library = _system_library()
    elif library == "text":
        library = tmp_path / "libnotes_ort.so"
        library.write_text("not a library")
    r = subprocess.run([str(RUNNER), str(foreign_model), "--random", "--library", str(library)],
                       capture_output=True, text=True, env={}, timeout=60)
    assert r.returncode == 1
    assert r.stderr == f"opbridge-run: error: --library {library}: {message}\n"
