"""ONNX Runtime sessions that can run every loaded op library."""

from __future__ import annotations

import mmap
import os
import re
import weakref

import onnx
import onnxruntime as ort

from ._errors import OpbridgeError
from ._registry import all_ops, libraries

# Which op libraries each SessionOptions already has: ONNX Runtime refuses a second
# registration of the same domain, and options objects get reused.
_registered: "weakref.WeakKeyDictionary[ort.SessionOptions, set]" = weakref.WeakKeyDictionary()


def _register_libraries(so: ort.SessionOptions) -> ort.SessionOptions:
    done = _registered.setdefault(so, set())
    for lib in libraries():
        if lib.ort_path is not None and lib.ort_path not in done:
            so.register_custom_ops_library(str(lib.ort_path))
            done.add(lib.ort_path)
    return so


def session_options(threads: int | None = None) -> ort.SessionOptions:
    """SessionOptions with every loaded op library registered."""
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    return _register_libraries(so)


def session(
    model: str | os.PathLike | bytes | onnx.ModelProto,
    *,
    threads: int | None = None,
    options: ort.SessionOptions | None = None,
) -> ort.InferenceSession:
    """An ONNX Runtime CPU session that can run every opbridge op."""
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    elif not isinstance(model, bytes):
        model = os.fspath(model)
    problems = domain_version_problems(opset_imports(model))
    if problems:
        raise OpbridgeError(problems[0])
    so = _register_libraries(options) if options is not None else session_options(threads)
    try:
        return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    except Exception as e:
        why = newer_than_runtime(str(e)) or unknown_domain(str(e))
        if why is None:
            raise
        raise OpbridgeError(why) from e


def unknown_domain(message: str) -> str | None:
    """ONNX Runtime's refusal of a node whose custom domain no registered library provides, in
    words that name the domain and how to load its library; None for any other refusal."""
    m = re.search(r"Fatal error: ([\w.\-]+):(\w+)\(-?\d+\) is not a registered function/op", message)
    if not m or m[1] in ("", "ai.onnx"):
        return None
    loaded = ", ".join(f"'{d}'" for lib in libraries() for d in sorted(lib.domains)) or "none"
    return (f"the model has {m[1]}::{m[2]} nodes, and no loaded op library provides ONNX domain '{m[1]}' (loaded: "
            f"{loaded}): load its library first with opbridge.load_library('lib<name>_torch.so') (or "
            "opbridge.load / opbridge.load_inline), or register its ONNX Runtime library with "
            "SessionOptions.register_custom_ops_library and pass options=...; ONNX Runtime said: "
            + m[0])


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
    for lib in libraries():
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
