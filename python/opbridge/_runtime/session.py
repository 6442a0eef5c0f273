"""ONNX Runtime sessions that can run every loaded op library."""

from __future__ import annotations

import mmap
import os
import re
import weakref
from pathlib import Path
from typing import Sequence

import onnx
import onnxruntime as ort

from .._library.errors import OpbridgeError
from .._library.files import ort_library_problem
from .._library.registry import all_ops
from .._library.registry import libraries as loaded_libraries
from .inspect.runtime import clean_ort_message, ort_registry

# Which op libraries each SessionOptions already has: ONNX Runtime refuses a second
# registration of the same domain, and options objects get reused.
_registered: "weakref.WeakKeyDictionary[ort.SessionOptions, set]" = weakref.WeakKeyDictionary()


def _register_libraries(so: ort.SessionOptions, extra: Sequence[str | os.PathLike] = ()) -> ort.SessionOptions:
    done = _registered.setdefault(so, set())
    paths = [lib.ort_path for lib in loaded_libraries() if lib.ort_path is not None]
    for given in extra:
        path = Path(given).resolve()
        if not path.is_file():
            raise OpbridgeError(f"libraries: ONNX Runtime custom-op library not found: {path}")
        problem = ort_library_problem(path)
        if problem:
            raise OpbridgeError(f"libraries: {problem}")
        paths.append(path)
    for path in paths:
        if path not in done:
            so.register_custom_ops_library(str(path))
            done.add(path)
    return so


def session_options(threads: int | None = None,
                    libraries: Sequence[str | os.PathLike] = ()) -> ort.SessionOptions:
    """SessionOptions with every loaded op library registered, and `libraries` (ONNX Runtime
    custom-op libraries) too."""
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    return _register_libraries(so, libraries)


def session(
    model: str | os.PathLike | bytes | onnx.ModelProto,
    *,
    threads: int | None = None,
    options: ort.SessionOptions | None = None,
    libraries: Sequence[str | os.PathLike] = (),
    runtime: str = "onnxruntime",
) -> ort.InferenceSession:
    """An ONNX Runtime CPU session that can run every opbridge op: the ONNX Runtime side of every
    loaded op library is registered. `libraries` adds ONNX Runtime custom-op libraries of your own
    (lib<name>_ort.so of an op library built without PyTorch, or any other); an op library's
    PyTorch file is refused, naming its ONNX Runtime sibling.

    runtime="openvino" compiles the model with OpenVINO for the CPU instead, every loaded op
    library's OpenVINO side (lib<name>_ov.so) added, and returns a session called the same way
    (run, get_inputs, get_outputs); `libraries` then adds OpenVINO extension libraries."""
    if runtime == "openvino":
        if options is not None:
            raise OpbridgeError("session: options are ONNX Runtime's SessionOptions; runtime='openvino' takes threads=")
        from .openvino import OpenVINOSession
        return OpenVINOSession(model, threads=threads, libraries=libraries)
    if runtime != "onnxruntime":
        raise OpbridgeError(f"session: runtime must be 'onnxruntime' or 'openvino', got {runtime!r}")
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    elif not isinstance(model, bytes):
        model = os.fspath(model)
    problems = domain_version_problems(opset_imports(model))
    if problems:
        raise OpbridgeError(problems[0])
    so = _register_libraries(options, libraries) if options is not None else session_options(threads, libraries)
    try:
        return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    except Exception as e:
        # A library of `libraries` that is not an opbridge one may provide any domain: only the
        # runtime's own words could then tell an unknown domain.
        why = newer_than_runtime(str(e)) or (unknown_domain(str(e), model) if not libraries else None)
        if why is None:
            raise
        raise OpbridgeError(why) from e


# How messages name each runtime of opbridge.session(runtime=...).
RUNTIME_NAMES = {"onnxruntime": "ONNX Runtime", "openvino": "OpenVINO"}


def runtime_name(sess) -> str:
    """The runtime a session of opbridge.session runs in, as messages name it."""
    from .openvino import OpenVINOSession
    return RUNTIME_NAMES["openvino" if isinstance(sess, OpenVINOSession) else "onnxruntime"]


def unknown_domain(message: str, model: str | bytes | None = None) -> str | None:
    """Why ONNX Runtime refused a model that has a node of a custom domain no registered library
    provides (or an op a loaded library lacks), told from the model and the runtime's schema
    registry: the domain, the model's op types of it and how to load its library, with ONNX
    Runtime's own words last; None when every node's domain has a runtime."""
    proto = _load(model)
    if proto is None:
        return None
    runtime_domains = {domain for domain, _ in ort_registry()[1]} | {"ai.onnx"}
    local = {(f.domain, f.name) for f in proto.functions}
    for domain, op in _node_ops(proto):
        if domain in runtime_domains or (domain, op) in local:
            continue
        owner = next((lib for lib in loaded_libraries() if domain in lib.domains), None)
        if owner is None or owner.ort_path is None or not any(
                (o.onnx_domain, o.onnx_type) == (domain, op) and o.export_kind == "kernel" for o in owner.ops):
            break
    else:  # every node has a runtime: the refusal is another one
        return None
    said = clean_ort_message(message)
    ops = ", ".join(f"{domain}::{t}" for t in _op_types(proto, domain, local))
    function = next((o for o in owner.ops if (o.onnx_domain, o.onnx_type) == (domain, op)
                     and o.export_kind == "function"), None) if owner is not None else None
    if function is not None:  # the library has the op, as an ONNX function the model must carry
        return (f"the model lacks the FunctionProto for {domain}::{op} (op library '{owner.name}' exports op "
                f"'{function.name}' as an ONNX function, which ONNX Runtime runs from the model's own functions): "
                "export with opbridge.export, or add the functions with opbridge.add_functions(model); "
                f"ONNX Runtime said: {said}")
    if owner is not None:
        where = owner.torch_path or owner.ort_path
        if owner.ort_path is None:
            return (f"the model has {ops} nodes; op library '{owner.name}' ({where}) provides ONNX domain "
                    f"'{domain}' but was loaded without its ONNX Runtime library (none beside it): pass that library "
                    f"with opbridge.session(..., libraries=['path/lib<name>_ort.so']); ONNX Runtime said: {said}")
        return (f"the model has {ops} nodes; op library '{owner.name}' ({where}) provides ONNX domain '{domain}' but "
                f"not {domain}::{op}: the model was made with another version of the library, or the op's ONNX name "
                f"differs; ONNX Runtime said: {said}")
    loaded = ", ".join(f"'{d}'" for lib in loaded_libraries() for d in sorted(lib.domains)) or "none"
    return (f"the model has {ops} nodes, and no loaded op library provides ONNX domain '{domain}' (loaded: "
            f"{loaded}): load its op library first with opbridge.load_library('path/lib<name>_torch.so') (or "
            "opbridge.load / opbridge.load_inline), or pass its ONNX Runtime library with "
            f"opbridge.session(..., libraries=['path/lib<name>_ort.so']); ONNX Runtime said: {said}")


def _load(model: str | bytes | None) -> onnx.ModelProto | None:
    try:
        return onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(model, load_external_data=False)
    except Exception:
        return None


def _node_ops(proto: onnx.ModelProto):
    """(domain, op type) of every node: the graph's (subgraphs included) first, then those in
    model-local function bodies."""
    def walk(nodes):
        for n in nodes:
            yield ("" if n.domain == "ai.onnx" else n.domain), n.op_type
            for a in n.attribute:
                for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    yield from walk(g.node)

    yield from walk(proto.graph.node)
    for f in proto.functions:
        yield from walk(f.node)


def _op_types(proto: onnx.ModelProto, domain: str, local: set) -> list[str]:
    """The op types of `domain` the model's nodes use, in order; not the local functions themselves."""
    return list(dict.fromkeys(op for d, op in _node_ops(proto) if d == domain and (d, op) not in local))


def newer_than_runtime(message: str) -> str | None:
    """ONNX Runtime's refusal of a model that needs a newer runtime (IR version, opset, a standard
    op it has no kernel for), in words that name the feature, both versions and what to export
    instead; None for any other refusal."""
    ver = f"ONNX Runtime {ort.__version__}"
    m = re.search(r"Unsupported model IR version: (\d+), max supported IR version: (\d+)", message)
    if m:
        model_ir, most = int(m[1]), int(m[2])
        opset = max((row[2] for row in onnx.helper.VERSION_TABLE if row[1] <= most), default=None)
        return (f"the model has IR version {model_ir}; {ver} reads IR version {most} at most: export it with "
                f"opset={opset} or lower (opbridge.export writes the lowest IR version its opset needs), or use a "
                "newer onnxruntime")
    m = re.search(r"Opset (\d+) is under development.*support for domain (\S+) is till opset (\d+)", message, re.S)
    if m:
        return (f"the model imports {m[2]} opset {m[1]}; {ver} runs {m[2]} up to opset {m[3]}: export it with "
                f"opset={m[3]} or lower, or use a newer onnxruntime")
    m = re.search(r"Could not find an implementation for (\w+)\((\d+)\) node with name '([^']*)'", message)
    if m:
        # A standard op that opbridge writes for ops that have a custom node too.
        ops = {op.qualified_name: rule.min_opset for op in all_ops() for rule in op.export_rules
               if rule.standard and rule.op_type == m[1]
               and (op.has_own_node or any(not r.standard for r in op.export_rules))}
        if ops:
            return (f"{ver} has no kernel for ai.onnx {m[1]}-{m[2]} (node '{m[3]}'), which opbridge writes for "
                    f"{', '.join(f'{name} from opset {v}' for name, v in ops.items())}: export with custom_nodes=True "
                    f"(or below that opset) to run opbridge's own node instead, or use an onnxruntime that has {m[1]}")
    return None


def domain_version_problems(imports: dict[str, int]) -> list[str]:
    """A model importing a loaded library's ONNX domain at a version the library does not have.
    ONNX Runtime cannot tell (it serves any version of a custom domain with the ops it has), so
    the model would run with the older version's semantics."""
    out = []
    for lib in loaded_libraries():
        version = imports.get(lib.onnx_domain)
        if version is not None and not 1 <= version <= lib.onnx_domain_version:
            out.append(f"the model imports ONNX domain '{lib.onnx_domain}' version {version}; op library "
                       f"'{lib.name}' provides versions 1 to {lib.onnx_domain_version}: export the model again "
                       "with this library, or load the library version the model was made with")
    return out


def opset_imports(model: str | bytes) -> dict[str, int]:
    """The model's opset imports {domain: version}, read from the serialized ModelProto without
    parsing the graph or the weights (a file is mapped, not read)."""
    if isinstance(model, bytes):
        return _scan_opset_imports(memoryview(model))
    with open(model, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return {}
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            view = memoryview(m)
            try:
                return _scan_opset_imports(view)
            finally:
                view.release()


def _varint(buf, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated varint")
        b = buf[i]
        value |= (b & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if not b & 0x80:
            return value, i


def _fields(buf):
    """(field number, wire type, value) of a protobuf message; length-delimited values as views."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire in (1, 5):
            value, i = None, i + (8 if wire == 1 else 4)
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield field, wire, value


def _scan_opset_imports(buf) -> dict[str, int]:
    # ModelProto.opset_import = 8; OperatorSetIdProto: domain = 1, version = 2.
    out: dict[str, int] = {}
    try:
        for field, wire, value in _fields(buf):
            if field != 8 or wire != 2:
                continue
            domain, version = "", 1
            for f, w, v in _fields(value):
                if f == 1 and w == 2:
                    domain = bytes(v).decode("utf-8", "replace")
                elif f == 2 and w == 0:
                    version = v
            out["" if domain == "ai.onnx" else domain] = version
    except ValueError:
        return {}  # not a well-formed model: ONNX Runtime reports that itself
    return out
