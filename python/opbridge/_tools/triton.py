"""NVIDIA Triton Inference Server model repositories for ONNX models (`opbridge triton`).

    REPOSITORY/NAME/config.pbtxt        Triton's ModelConfig (model_config.proto) in text format
    REPOSITORY/NAME/1/model.onnx        the model as version 1, with its external-data files
    REPOSITORY/NAME/lib<name>_ort.so    each op library that the model's custom ops need

The op libraries are the ones `inspect` finds for the model's custom ops; a MISSING op is an
error with inspect's advice. The tensors are those ONNX Runtime reports for a session of the
model, which is what Triton's ONNX Runtime backend compares the configuration with when it
loads the model (data types exactly, output dims exactly, -1 for a dynamic axis).

The backend hands each op_library_filename to ONNX Runtime's RegisterCustomOpsLibrary as
written, and ONNX Runtime dlopens it: a relative path would resolve against the server's working
directory, not the model's folder. The path is therefore written absolute, as the server sees it.

The python backend (backend "python") gets the same folder from the same plan, plus
REPOSITORY/NAME/1/model.py (triton_model.py, copied), which runs the model with ONNX Runtime and
registers the op libraries that the op_libraries parameter names, found beside config.pbtxt.
"""

from __future__ import annotations

import dataclasses
import filecmp
import os
import re
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Sequence

import onnx

from .._runtime import inspect as I

PLATFORM = "onnxruntime_onnx"  # the ONNX Runtime backend
PYTHON_MODEL = Path(__file__).with_name("triton_model.py")  # the python backend's 1/model.py
DEFAULT_MAX_BATCH_SIZE = 4  # the ONNX Runtime backend's own default-max-batch-size
VERSION = "1"
MODEL_FILE = "model.onnx"  # the backend's default model file name
CONFIG_FILE = "config.pbtxt"

# ONNX Runtime's type strings -> Triton's DataType; the ONNX Runtime backend maps the same pairs.
DATA_TYPES = {
    "tensor(bool)": "TYPE_BOOL",
    "tensor(uint8)": "TYPE_UINT8",
    "tensor(uint16)": "TYPE_UINT16",
    "tensor(uint32)": "TYPE_UINT32",
    "tensor(uint64)": "TYPE_UINT64",
    "tensor(int8)": "TYPE_INT8",
    "tensor(int16)": "TYPE_INT16",
    "tensor(int32)": "TYPE_INT32",
    "tensor(int64)": "TYPE_INT64",
    "tensor(float16)": "TYPE_FP16",
    "tensor(bfloat16)": "TYPE_BF16",
    "tensor(float)": "TYPE_FP32",
    "tensor(double)": "TYPE_FP64",
    "tensor(string)": "TYPE_STRING",
}
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # a folder name that is also a clean URL segment


class TritonError(Exception):
    """A model that cannot be written as asked, explained in one line."""


@dataclasses.dataclass(frozen=True)
class Tensor:
    name: str
    data_type: str  # TYPE_FP32, ...
    shape: tuple  # as ONNX Runtime reports it: sizes, dimension names, None for an unnamed dynamic axis
    dims: tuple[int, ...]  # as configured: -1 for a dynamic axis, without the batch axis when batching
    scalar_item: bool = False  # batching a [batch] tensor: dims [1] with reshape { shape: [ ] }


@dataclasses.dataclass(frozen=True)
class OpLibrary:
    name: str
    path: Path  # the ONNX Runtime library that is copied
    ops: tuple[str, ...]  # domain::Op of the model's nodes it runs


@dataclasses.dataclass
class Plan:
    name: str
    model: Path
    max_batch_size: int
    inputs: list[Tensor]
    outputs: list[Tensor]
    instances: int
    libraries: list[OpLibrary]
    served_dir: PurePosixPath | None  # the model's folder as the server sees it (the ONNX Runtime backend's)
    external: list[str]  # external-data files, relative to the model file's folder
    backend: str = "onnxruntime"
    python_env: str | None = None  # the python backend's EXECUTION_ENV_PATH

    def library_path(self, lib: OpLibrary) -> str:
        return str(self.served_dir / lib.path.name)

    def config_text(self) -> str:
        python = self.backend == "python"
        lines = [f"# Triton model configuration written by `opbridge triton` from {self.model.name}",
                 f"name: {_quote(self.name)}",
                 f"backend: {_quote('python')}" if python else f"platform: {_quote(PLATFORM)}",
                 f"max_batch_size: {self.max_batch_size}"]
        for field, tensors in (("input", self.inputs), ("output", self.outputs)):
            if not tensors:
                continue
            lines.append(f"{field} [")
            for k, t in enumerate(tensors):
                item = _tensor_text(t)
                lines += item[:-1] + [item[-1] + ("," if k + 1 < len(tensors) else "")]
            lines.append("]")
        if self.max_batch_size > 0:
            lines.append("dynamic_batching { }")
        lines += ["instance_group [", "  {", f"    count: {self.instances}", "    kind: KIND_CPU", "  }", "]"]
        if self.libraries and python:
            lines += ["# 1/model.py registers these op libraries (in this folder, ':'-separated) with ONNX Runtime.",
                      *_parameter("op_libraries", ":".join(lib.path.name for lib in self.libraries))]
        elif self.libraries:
            lines += ["# ONNX Runtime dlopens these paths as written: absolute, as the server sees them.",
                      "model_operations {"]
            lines += [f"  op_library_filename: {_quote(self.library_path(lib))}" for lib in self.libraries]
            lines.append("}")
        if self.python_env:
            lines += ["# The Python environment of the model's stubs (numpy, onnxruntime): a folder or an archive.",
                      *_parameter("EXECUTION_ENV_PATH", self.python_env)]
        return "\n".join(lines) + "\n"


def _parameter(key: str, value: str) -> list[str]:
    return ["parameters {", f"  key: {_quote(key)}", f"  value: {{ string_value: {_quote(value)} }}", "}"]


def _quote(s: str) -> str:
    """A protobuf text-format string literal."""
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\{ord(ch):03o}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _tensor_text(t: Tensor) -> list[str]:
    lines = ["  {", f"    name: {_quote(t.name)}", f"    data_type: {t.data_type}",
             f"    dims: [ {', '.join(str(d) for d in t.dims)} ]"]
    if t.scalar_item:
        lines.append("    reshape: { shape: [ ] }")
    return lines + ["  }"]


# --- what the model needs ----------------------------------------------------------------------


def missing_problem(report: I.ModelReport) -> str | None:
    """inspect's verdict on what nothing runs, in one line, or None when every op has a runtime."""
    missing = report.missing
    if not missing:
        return None
    m = missing[0]
    if isinstance(m, I.OpUse):
        what = (f"{I.domain_name(m.domain)}::{m.op_type} (opset {m.opset}, {m.count} node{'s' if m.count != 1 else ''}): "
                f"{m.verdict.advice}")
    else:
        what = f"{m.detail}: {m.advice}"
    more = (f" (and {len(missing) - 1} more problem{'s' if len(missing) > 2 else ''}: see 'opbridge inspect "
            f"{report.path}')") if len(missing) > 1 else ""
    return f"{report.path} cannot be served: {what}{more}"


def op_libraries(report: I.ModelReport) -> list[OpLibrary]:
    """The ONNX Runtime libraries of the loaded opbridge libraries whose ops the model uses (a
    library owns its ONNX domain and those its ops name for their nodes), in load order."""
    needed: dict[str, list[str]] = {}
    for u in report.ops:
        if u.verdict.status == I.OPBRIDGE:
            needed.setdefault(I.domain_name(u.domain), []).append(f"{I.domain_name(u.domain)}::{u.op_type}")
    found = []
    for lib in report.libraries:
        uses = [needed.pop(I.domain_name(d)) for d in lib["domains"] if I.domain_name(d) in needed]
        ops = [op for use in uses for op in use] if uses else None
        if ops is not None:
            if not lib["ort_library"]:  # inspect reports this as MISSING first
                raise TritonError(f"op library '{lib['name']}' was loaded without its ONNX Runtime library")
            found.append(OpLibrary(lib["name"], Path(lib["ort_library"]), tuple(sorted(set(ops)))))
    if needed:
        raise TritonError(f"no loaded op library has domain {', '.join(sorted(needed))}")
    names = [lib.path.name for lib in found]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise TritonError(f"two op libraries are both called {clash[0]}; the model's folder holds one file per name")
    return found


def external_files(model: onnx.ModelProto, model_path: Path) -> list[str]:
    """The external-data files of the model's tensors, relative to the model file's folder."""
    def tensors(graph):
        yield from graph.initializer
        for node in graph.node:
            for a in node.attribute:
                if a.HasField("t"):
                    yield a.t
                yield from a.tensors
            for _, g in I.subgraphs(node):
                yield from tensors(g)

    files = []
    for t in tensors(model.graph):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = {e.key: e.value for e in t.external_data}.get("location", "")
        rel = PurePosixPath(location)
        if not location or rel.is_absolute() or ".." in rel.parts:
            raise TritonError(f"tensor '{t.name}' keeps its data at '{location}', outside the model's folder; "
                              "save the model with its data beside it (onnx.save(..., save_as_external_data=True))")
        if not (model_path.parent / rel).is_file():
            raise TritonError(f"tensor '{t.name}' keeps its data in {model_path.parent / rel}, which does not exist")
        if str(rel) not in files:
            files.append(str(rel))
    return files


# --- the configuration -------------------------------------------------------------------------


def batch_problem(values: Sequence[tuple[str, object]]) -> str | None:
    """Why Triton cannot batch the model along its first axis, or None: batching needs that axis
    dynamic on every input and output. `values` are (kind, ONNX Runtime NodeArg)."""
    for kind, v in values:
        shape = list(v.shape or [])
        if not shape:
            return f"{kind} '{v.name}' has no axes"
        if isinstance(shape[0], int):
            return f"{kind} '{v.name}' has a fixed first axis ({_shape(shape)})"
    return None


def _shape(shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


@dataclasses.dataclass(frozen=True)
class Arg:
    """An input or output as the configuration sees it: ONNX Runtime's NodeArg, with the shape
    inspect infers where the model declares none (an opbridge node's output, from its op's shape
    rules) and ONNX Runtime reports none."""

    name: str
    type: str
    shape: list | None


def arg(v, declared: dict[str, onnx.ValueInfoProto], inferred: dict[str, onnx.ValueInfoProto]) -> Arg:
    shape = list(v.shape or [])
    vi = declared.get(v.name)
    if not shape and vi is not None and not vi.type.tensor_type.HasField("shape") and v.name in inferred:
        shape = [None if d == "?" else d for d in I.dims(inferred[v.name].type) or []]
    return Arg(v.name, v.type, shape)


def tensor(kind: str, v, declared: dict[str, onnx.ValueInfoProto], batching: bool) -> Tensor:
    """One input or output of the configuration, from ONNX Runtime's NodeArg `v` (or an Arg)."""
    data_type = DATA_TYPES.get(v.type)
    if data_type is None:
        raise TritonError(f"{kind} '{v.name}' is {v.type}; Triton's ONNX Runtime backend takes tensors of "
                          f"{', '.join(t[7:-1] for t in DATA_TYPES)}")
    shape = list(v.shape or [])
    vi = declared.get(v.name)
    if not shape and vi is not None and not vi.type.tensor_type.HasField("shape"):
        raise TritonError(f"{kind} '{v.name}' has no shape in the model (its rank is unknown), and Triton's "
                          "configuration needs one: declare it (re-export, or onnx.shape_inference)")
    if any(d == 0 for d in shape):
        raise TritonError(f"{kind} '{v.name}' has an axis of size 0 ({_shape(shape)}); Triton takes sizes >= 1 or "
                          "-1 for a dynamic axis")
    dims = [d if isinstance(d, int) else -1 for d in shape][1 if batching else 0:]
    if not dims and not batching:
        raise TritonError(f"{kind} '{v.name}' is a scalar, which Triton's configuration of a model without "
                          "batching cannot describe: give it the shape [1] in the model")
    return Tensor(v.name, data_type, tuple(shape), tuple(dims) or (1,), scalar_item=not dims)


def plan(model_path: Path, model: onnx.ModelProto, report: I.ModelReport, sess, *, name: str | None,
         max_batch_size: int | None, instances: int, served_repository: PurePosixPath | None,
         backend: str = "onnxruntime", python_env: str | None = None) -> Plan:
    """Everything the model's folder will hold, checked; nothing is written yet. `sess` is an
    ONNX Runtime session of the model (with the op libraries registered). The ONNX Runtime
    backend needs `served_repository` (its library paths are absolute); the python backend finds
    the libraries beside its model.py and may name the stub's environment (`python_env`)."""
    problem = missing_problem(report)
    if problem:
        raise TritonError(problem)
    name = name if name is not None else model_path.stem
    if not NAME.fullmatch(name):
        raise TritonError(f"'{name}' cannot name a Triton model (letters, digits, '_', '.', '-'; not starting "
                          "with '.' or '-'): choose one with --name")
    declared = {vi.name: vi for vi in [*model.graph.input, *model.graph.output]}
    inferred = I.value_infos(report.model.graph) if report.model is not None else {}
    values = [(kind, arg(v, declared, inferred))
              for kind, args in (("input", sess.get_inputs()), ("output", sess.get_outputs())) for v in args]
    why_not = batch_problem(values)
    if max_batch_size is None:
        max_batch_size = 0 if why_not else DEFAULT_MAX_BATCH_SIZE
    elif max_batch_size > 0 and why_not:
        raise TritonError(f"--max-batch-size {max_batch_size}: Triton batches along the first axis, which must be "
                          f"dynamic on every input and output, but {why_not}; export it with a dynamic first "
                          "axis, or give --max-batch-size 0")
    tensors = [tensor(kind, v, declared, max_batch_size > 0) for kind, v in values]
    libraries = op_libraries(report)
    if backend == "python" and any(":" in lib.path.name for lib in libraries):
        raise TritonError(f"op library file {next(lib.path for lib in libraries if ':' in lib.path.name)} has ':' in "
                          "its name, which separates the python backend's op_libraries: rename it")
    return Plan(name=name, model=model_path, max_batch_size=max_batch_size,
                inputs=[t for (kind, _), t in zip(values, tensors) if kind == "input"],
                outputs=[t for (kind, _), t in zip(values, tensors) if kind == "output"],
                instances=instances, libraries=libraries,
                served_dir=served_repository / name if backend == "onnxruntime" else None,
                external=external_files(model, model_path), backend=backend, python_env=python_env)


# --- writing -----------------------------------------------------------------------------------


def _fill(p: Plan, folder: Path) -> None:
    version = folder / VERSION
    version.mkdir()
    shutil.copyfile(p.model, version / MODEL_FILE)
    for rel in p.external:
        (version / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p.model.parent / rel, version / rel)
    if p.backend == "python":
        shutil.copyfile(PYTHON_MODEL, version / "model.py")
    for lib in p.libraries:
        shutil.copy(lib.path, folder / lib.path.name)
    (folder / CONFIG_FILE).write_text(p.config_text())


def _files(root: Path) -> set[str]:
    return {str(f.relative_to(root)) for f in root.rglob("*") if not f.is_dir()}


def differences(a: Path, b: Path) -> list[str]:
    """The files (relative paths) that differ between two folders or are in one only."""
    fa, fb = _files(a), _files(b)
    return sorted((fa ^ fb) | {f for f in fa & fb if not filecmp.cmp(a / f, b / f, shallow=False)})


def write(p: Plan, repository: Path, force: bool = False) -> str:
    """Writes REPOSITORY/NAME whole or not at all: "written", "unchanged" (the same files are
    there already) or "replaced" (with force). A different model folder of that name is an error
    without force."""
    target = repository / p.name
    for folder in (repository, target):
        if folder.exists() and not folder.is_dir():
            raise TritonError(f"{folder} exists and is not a folder")
    repository.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{p.name}.", dir=repository))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private
        _fill(p, tmp)
        if not target.exists():
            tmp.rename(target)
            return "written"
        diff = differences(target, tmp)
        if not diff:
            return "unchanged"
        if not force:
            shown = ", ".join(diff[:3]) + (f" and {len(diff) - 3} more" if len(diff) > 3 else "")
            raise TritonError(f"{target} already holds a different model ({shown} differ): give --force to "
                              "replace it, or another --name")
        old = repository / f".{p.name}.old-{os.getpid()}"
        target.rename(old)
        try:
            tmp.rename(target)
        except OSError:
            old.rename(target)
            raise
        if old.is_symlink():  # a model folder linked in from elsewhere: the link goes, what it names stays
            old.unlink()
        else:
            shutil.rmtree(old)
        return "replaced"
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
