"""Errors at the boundaries a user crosses: an export that fails (the op's own error, an op nothing
can translate, any other failure) in one plain line, a model whose custom domain no loaded library
provides (or that lacks a function op's FunctionProto), an unknown attribute on an opbridge node,
an allocation that fails (named by the op and what it was for), an op library's PyTorch and ONNX
Runtime files passed for each other (told by what the files export, not by their names), backward
ops called directly with inputs of a wrong dtype, rank or shape (eagerly and as ONNX nodes), and
double backward through any op with a gradient."""

import ctypes.util
import json
import os
import re
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
from cli_inline import run_cli
from op_cases import backward_ops, builtin_ops, op_cases, run_isolated, samples_of
from opbridge._library.kinds import DTYPES
from opbridge._library.registry import libraries as loaded_libraries
from opbridge._library.shapes import failed_checks
from opbridge._runtime.inspect import cannot_run
from opbridge._tools.testing._cases import ORT_ERRORS
from opbridge.testing import node_model

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
    # The command in this process (cli_inline: its stdout and stderr as a process's); the ops
    # models.py defines are removed after it, as the end of a process would.
    (tmp_path / "models.py").write_text(MODELS)
    return run_cli("export", f"models.py:{factory}", "-o", "m.onnx", "--input", "x=8x3:float32", "--exporter",
                   exporter, *extra, cwd=tmp_path)


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


def _selu_model():
    return helper.make_model(helper.make_graph([helper.make_node("Selu", ["x"], ["y"], domain="opbridge")], "g",
                                               [X], [Y]),
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("opbridge", 1)],
                             ir_version=8)


def test_a_function_op_without_its_function_body_is_named():
    m = _selu_model()
    advice = ("the model lacks the FunctionProto for opbridge::Selu (op library 'opbridge' exports op 'selu' as an "
              "ONNX function, which ONNX Runtime runs from the model's own functions): export with opbridge.export, "
              "or add the functions with opbridge.add_functions(model); ONNX Runtime said: ")
    with pytest.raises(opbridge.OpbridgeError) as e:
        opbridge.session(m)
    assert str(e.value).startswith(advice) and "another version" not in str(e.value), str(e.value)
    assert cannot_run(m) == ["opbridge::Selu (1 node): the model lacks the FunctionProto for opbridge::Selu (opbridge "
                             "op 'selu', exported as function): export with opbridge.export, or add the functions "
                             "with opbridge.add_functions(model)"]
    # The advice holds: with the functions added, the node runs as torch.selu.
    opbridge.add_functions(m)
    assert cannot_run(m) == []
    x = np.array([-1.5, 0.75], np.float32)
    got = opbridge.session(m).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, torch.selu(torch.from_numpy(x)).numpy(), rtol=1e-6, atol=1e-7)


def _knn_query_node(**extra):
    info = next(op for op in builtin_ops() if op.name == "knn_query")
    xyz, offset = np.random.default_rng(0).random((8, 3), dtype=np.float32), np.array([8], np.int32)
    inputs = [xyz, offset, xyz, offset]
    m = node_model(info, inputs, {"k": 2})
    m.graph.node[0].attribute.extend(helper.make_attribute(k, v) for k, v in extra.items())
    return m, dict(zip([i.name for i in info.inputs], inputs))


def test_an_unknown_attribute_on_an_opbridge_node_is_named(tmp_path):
    # ONNX Runtime takes any attribute on a custom op's node and its C API cannot list a node's
    # attributes, so a misspelt one would run with the op's default: inspect and the export's
    # runtime check (cannot_run) name it, as ONNX's checker does at export.
    m, feeds = _knn_query_node(kk=3, radius=0.5)
    assert cannot_run(m) == [
        "opbridge::KnnQuery (1 node): opbridge::KnnQuery (node 'knn_query_node') has attributes 'kk', 'radius', "
        "which op 'knn_query' does not take (its attributes: k): remove or rename it"]
    with pytest.raises(onnx.checker.ValidationError, match="Unrecognized attribute: kk for operator KnnQuery"):
        onnx.checker.check_model(m, full_check=True)
    onnx.save(m, tmp_path / "m.onnx")
    r = run_cli("inspect", tmp_path / "m.onnx")
    assert r.returncode == 1 and "has attributes 'kk', 'radius', which op 'knn_query' does not take" in \
        " ".join(r.stdout.split()), r.stdout
    # Its own attributes only: nothing to say, and the node runs.
    good, _ = _knn_query_node()
    assert cannot_run(good) == []
    assert [o.shape for o in opbridge.session(good).run(None, feeds)] == [(8, 2), (8, 2)]


# ---- allocations that fail ------------------------------------------------------------------------

# Run in a child whose address space is capped a little above what it holds once set up, so an
# allocation that would take the machine's memory fails at once instead (one thread each: no
# thread pool grows the address space while it runs). Prints each case's error, one JSON line.
_CAPPED = textwrap.dedent("""\
    import json, resource, sys
    import numpy as np, torch
    import opbridge
    from opbridge.testing import node_model

    torch.set_num_threads(1)
    ops = {op.name: op for op in opbridge.builtin.ops}
    xyz, centres = np.zeros((1, 4, 3), np.float32), np.zeros((1, 2, 3), np.float32)
    points = np.zeros((4000, 3), np.float32)  # all at one place: every pair is closer than r
    cases = {
        "ort_huge_attribute": (node_model(ops["ball_query"], [xyz, centres], {"radius": 0.5, "nsample": 2 ** 37}),
                               [xyz, centres]),
        "ort_radius_pairs": (node_model(ops["radius"], [points, points], {"r": 1.0, "max_num_neighbors": 4000}),
                             [points, points]),
    }
    sessions = {k: (opbridge.session(m, threads=1), feeds) for k, (m, feeds) in cases.items()}
    eager = {"torch_radius_pairs": lambda: torch.ops.opbridge.radius(torch.from_numpy(points), torch.from_numpy(points),
                                                                      r=1.0, max_num_neighbors=4000)}
    eager["torch_radius_pairs"]  # nothing runs before the cap
    with open("/proc/self/status") as f:
        vm = next(int(ln.split()[1]) for ln in f if ln.startswith("VmSize:")) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + (96 << 20), resource.RLIM_INFINITY))
    for name, (sess, feeds) in sessions.items():
        try:
            sess.run(None, {i.name: x for i, x in zip(sess.get_inputs(), feeds)})
            print(json.dumps([name, "ran"]), flush=True)
        except Exception as e:
            print(json.dumps([name, str(e)]), flush=True)
    for name, f in eager.items():
        try:
            f()
            print(json.dumps([name, "ran"]), flush=True)
        except Exception as e:
            print(json.dumps([name, str(e).splitlines()[0]]), flush=True)
    """)


def test_allocations_that_fail_name_the_op_and_what_it_allocated():
    r = subprocess.run([sys.executable, "-c", _CAPPED], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
    assert r.returncode == 0, r.stderr[-3000:]
    got = dict(json.loads(ln) for ln in r.stdout.splitlines())
    # An output sized by an attribute, in ONNX Runtime: the output, its shape and its bytes.
    assert got["ort_huge_attribute"].endswith(
        "opbridge::ball_query (node 'ball_query_node'): output 'idx' of shape [1, 2, 137438953472] (1099511627776 "
        "bytes) cannot be allocated: out of memory"), got["ort_huge_attribute"]
    # The pairs within r, which the kernel holds until it has them all: in both runtimes.
    pairs = ("out of memory finding the pairs closer than r = 1: up to 16000000 pairs of 16 bytes (max_num_neighbors "
             "= 4000 per row of y, 4000 rows): lower r or max_num_neighbors")
    assert got["ort_radius_pairs"].endswith(f"opbridge::radius (node 'radius_node'): {pairs}"), got["ort_radius_pairs"]
    assert got["torch_radius_pairs"] == f"opbridge::radius: {pairs}", got["torch_radius_pairs"]


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


# ---- backward ops called directly with inputs of a wrong dtype, rank or shape -------------------
#
# Every backward op of the registry (op.backward of some op) is an op of its own, callable as
# torch.ops.opbridge.<name>_backward and as an ONNX node. Each is called with a valid call (the one
# autograd makes after its forward op's first sample) changed in one input, derived from the spec:
# a dtype its type constraint lacks, one axis more or less than its rank, one more row on an axis
# that a check of the spec relates to another input (or an attribute or a constant), and a shape
# that differs from an input an output's shape rule says it must equal. Each gives the op's own
# RuntimeError. The eager calls run in child processes: a crash or a hang fails that op's test
# instead of ending the run.

BACKWARD_OPS = backward_ops()
WRONG_DTYPES = ("int64", "int32", "uint8", "float64", "float32")


def _listed(names) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _valid_call(op):
    """The op's first derived call whose inputs are all non-empty, its inputs padded to the spec's."""
    sample = next(s for s in samples_of(op) if all(t is None or t.numel() for t in s.inputs))
    return list(sample.inputs) + [None] * (len(op.inputs) - len(sample.inputs)), dict(sample.attrs)


def _one_more(t: torch.Tensor, axis: int) -> torch.Tensor:
    """t with one more entry on `axis`, a copy of its first (indices stay valid indices)."""
    return torch.cat([t, t.narrow(axis, 0, 1)], axis)


def backward_op_mutations(op) -> list[tuple[str, list, dict, str]]:
    """(what, inputs, attributes, the start of the expected message) per bad call of `op`."""
    inputs, attrs = _valid_call(op)
    q, names = op.qualified_name, [i.name for i in op.inputs]

    def changed(k, t):
        return [t if j == k else x for j, x in enumerate(inputs)]

    found = []
    for k, (spec, t) in enumerate(zip(op.inputs, inputs)):
        if t is None:
            continue
        allowed = op.type_constraint(spec.type).dtypes
        bad = next(d for d in WRONG_DTYPES if d not in allowed)
        found.append((f"dtype: {spec.name} as {bad}", changed(k, t.to(DTYPES[bad].torch)), attrs,
                      f"{q}: input '{spec.name}' has dtype {bad}; expected {_listed(allowed)}"))
        if spec.rank >= 0:
            for wrong in (t.unsqueeze(0), t.flatten(0, 1) if t.dim() >= 2 else None):
                if wrong is not None:
                    found.append((f"rank: {spec.name} of rank {wrong.dim()}", changed(k, wrong), attrs,
                                  f"{q}: input '{spec.name}' must have rank {spec.rank}, got shape {list(wrong.shape)}"))
    seen = set()
    for check in op.checks:
        for side in (check.lhs, check.rhs):
            if side.kind != "dim":
                continue
            name = next((n for n in side.inputs if inputs[names.index(n)] is not None), None)
            if name is None or (name, side.value) in seen:
                continue
            seen.add((name, side.value))
            k = names.index(name)
            bad_call = changed(k, _one_more(inputs[k], side.value))
            failed = failed_checks(op, [None if x is None else list(x.shape) for x in bad_call], attrs)
            assert failed, f"{name}.shape[{side.value}] + 1 fails no check of {q}"
            first = next(c for c in op.checks if failed[0].startswith(f"{c.what}: {c.text} fails"))
            found.append((f"shape: {name}.shape[{side.value}] + 1", bad_call, attrs, f"{q}: {first.what}"))
    for out in op.outputs:
        same = [n for n in out.shape.inputs if inputs[names.index(n)] is not None] if out.shape.kind == "same" else []
        if len(same) >= 2:
            a, b = same[:2]
            k = names.index(b)
            bad_call = changed(k, _one_more(inputs[k], -1))
            found.append((f"same shape: {b} vs {a}", bad_call, attrs,
                          f"{q}: inputs '{a}' {list(inputs[names.index(a)].shape)} and '{b}' "
                          f"{list(bad_call[k].shape)} must have the same shape"))
    unique = {}
    for m in found:
        unique.setdefault(m[0], m)
    return list(unique.values())


def _args(inputs: list) -> list:
    """The positional arguments of a call: omitted trailing optional inputs dropped."""
    inputs = list(inputs)
    while inputs and inputs[-1] is None:
        inputs.pop()
    return inputs


def backward_op_errors(name: str) -> dict:
    """What each bad call of the backward op `name` raised (its message; "no error" if none), and
    the valid call after them: run in a child process (run_isolated), so a crash or a hang fails
    this op's test rather than ending the run."""
    op = opbridge.builtin.op(name)
    calls = [(what, inputs, attrs) for what, inputs, attrs, _ in backward_op_mutations(op)]
    calls.append(("the valid call, after them", *_valid_call(op)))
    results = {}
    for what, inputs, attrs in calls:
        try:
            op.overload(*_args(inputs), **attrs)
            results[what] = "no error"
        except RuntimeError as e:
            results[what] = str(e)
    return results


@pytest.fixture(scope="module")
def backward_op_results():
    return run_isolated("test_boundary_errors", "backward_op_errors", [[op.name] for op in BACKWARD_OPS])


def test_every_backward_op_is_checked():
    assert {op.name for op in BACKWARD_OPS} >= {"my_add_backward", "deform_conv2d_backward", "resize_bicubic_backward"}
    assert all(samples_of(op) for op in BACKWARD_OPS), "a backward op without a derived call"


@pytest.mark.parametrize("op", BACKWARD_OPS, ids=[op.name for op in BACKWARD_OPS])
def test_backward_op_called_directly_with_bad_inputs_gives_its_error(op, backward_op_results):
    results = backward_op_results[(op.name,)]
    if "died" in results:
        pytest.fail(f"{op.qualified_name} called with bad inputs: {results['died']}")
    mutations = backward_op_mutations(op)
    kinds = {what.split(":")[0] for what, *_ in mutations}
    assert "dtype" in kinds and ("rank" in kinds or all(i.rank < 0 for i in op.inputs))
    assert "shape" in kinds or "same shape" in kinds or len(op.inputs) == 1
    for what, _, _, expected in mutations:
        assert results[what].startswith(expected), f"{what}:\n  got:      {results[what]}\n  expected: {expected}..."
    assert results["the valid call, after them"] == "no error"


def _onnxruntime_run(op, inputs, attrs):
    arrays = [None if t is None else t.numpy() for t in inputs]
    m = node_model(op, arrays, attrs)
    feeds = {i.name: x for i, x in zip(op.inputs, arrays) if x is not None}
    return opbridge.session(m).run(None, feeds)


@pytest.mark.parametrize("op", BACKWARD_OPS, ids=[op.name for op in BACKWARD_OPS])
def test_backward_op_node_with_bad_inputs_fails_naming_the_op(op):
    # The representative mutations as ONNX nodes: a wrong dtype (ONNX Runtime's type check, naming
    # the op type and the input) and the first shape the checks relate (the op's own error, naming
    # the op and the node); the valid node still runs after them.
    inputs, attrs = _valid_call(op)
    mutations = backward_op_mutations(op)
    what, bad, _, _ = next(m for m in mutations if m[0].startswith("dtype: "))
    name, dtype = what.removeprefix("dtype: ").split(" as ")
    with pytest.raises(ORT_ERRORS, match=re.escape(f"Type Error: Type '{DTYPES[dtype].onnx_type}' of input parameter "
                                                   f"({name}) of operator ({op.onnx_type})")):
        _onnxruntime_run(op, bad, attrs)
    shape = next((m for m in mutations if m[0].startswith("shape: ")), None)
    if shape is not None:
        what, bad, _, expected = shape
        reason = expected.removeprefix(f"{op.qualified_name}: ")
        with pytest.raises(ORT_ERRORS, match=re.escape(f"{op.qualified_name} (node '{op.name}_node'): {reason}")):
            _onnxruntime_run(op, bad, attrs)
    want = op.overload(*_args(inputs), **attrs)
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    for g, w in zip(_onnxruntime_run(op, inputs, attrs), want):
        np.testing.assert_array_equal(g, w.numpy())


# ---- double backward: refused naming the op, for every op with a gradient ----------------------

GRADIENT_OPS = [op for op in builtin_ops() if op.backward and op.defines_torch_op and op.name in op_cases()]


@pytest.mark.parametrize("op", GRADIENT_OPS, ids=[op.name for op in GRADIENT_OPS])
def test_double_backward_is_refused_naming_the_op(op):
    # test_autograd checks it for deform_conv2d; here for every op whose definition names a
    # backward op: differentiating a gradient taken with create_graph=True is the op's error.
    differentiable = {o.name[len("grad_"):] for o in op.library.op(op.backward).outputs}
    for sample in op_cases()[op.name].samples:
        inputs = [t.detach().clone().requires_grad_() if isinstance(t, torch.Tensor) and t.is_floating_point()
                  and t.numel() and spec.name in differentiable else t for t, spec in zip(sample.inputs, op.inputs)]
        wrt = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
        if wrt:
            break
    else:
        pytest.fail(f"no sample of {op.name} has a non-empty differentiable input")
    outs = op.overload(*inputs, **sample.attrs)
    outs = [outs] if isinstance(outs, torch.Tensor) else list(outs)
    loss = sum((torch.where(torch.isfinite(o), o, 0).double() ** 2).sum() for o in outs if o.is_floating_point())
    grads = [g for g in torch.autograd.grad(loss, wrt, create_graph=True, allow_unused=True) if g is not None]
    assert grads and all(g.requires_grad for g in grads)
    with pytest.raises(opbridge.OpbridgeError, match="^" + re.escape(f"{op.qualified_name}: double backward (a gradient "
                                                                     "of its gradient) is not supported")):
        torch.autograd.grad(sum(g.sum() for g in grads), wrt, allow_unused=True)
