"""The `opbridge` command: which ops a model needs and whether ONNX Runtime runs it (inspect),
the loaded operators (ops), a drawing of the graph (graph), export of a user's model (export)
and ONNX Runtime against PyTorch (verify).

    opbridge ops [--json]
    opbridge inspect MODEL.onnx [--json] [--session]
    opbridge graph MODEL.onnx -o out.svg|out.png|out.dot [--max-nodes N]
    opbridge export MODULE:FACTORY -o model.onnx --input x=4x8:float32 [--dynamic x:0:batch]
    opbridge verify MODEL.onnx --torch MODULE:FACTORY [--inputs FILE.npz | --input x=2x8:float32]

Errors are one line (`opbridge: error: ...`), exit status 2 for usage errors and 1 for failures;
--verbose adds the traceback. Progress goes to stderr, results to stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import os
import re
import shutil
import sys
import textwrap
import traceback
from pathlib import Path
from typing import Any, Sequence

PROG = "opbridge"


class CliError(Exception):
    """A failure explained in one line (exit status 1)."""


class UsageError(CliError):
    """A command line that cannot work (exit status 2)."""


def progress(msg: str) -> None:
    print(f"[{PROG}] {msg}", file=sys.stderr, flush=True)


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if isinstance(e, CliError) or type(e).__name__ == "OpbridgeError":
        return first or type(e).__name__
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


# --- argument values ---------------------------------------------------------------------------

DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool")


@dataclasses.dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str

    def __str__(self) -> str:
        return f"{self.name}={'x'.join(map(str, self.shape))}:{self.dtype}"


def input_spec(text: str) -> InputSpec:
    """NAME=SHAPE:DTYPE, SHAPE like 1x3x224x224 (empty for a scalar)."""
    m = re.fullmatch(r"([^=\s]+)=([^:]*):(\w+)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"'{text}' is not NAME=SHAPE:DTYPE (e.g. x=1x3x224x224:float32)")
    name, shape, dtype = m.groups()
    if shape and not re.fullmatch(r"\d+(x\d+)*", shape):
        raise argparse.ArgumentTypeError(f"'{text}': SHAPE must be sizes joined by 'x' (e.g. 1x3x224x224), got '{shape}'")
    if dtype not in DTYPES:
        raise argparse.ArgumentTypeError(f"'{text}': DTYPE must be one of {', '.join(DTYPES)}, got '{dtype}'")
    return InputSpec(name, tuple(int(d) for d in shape.split("x")) if shape else (), dtype)


@dataclasses.dataclass(frozen=True)
class DynamicSpec:
    name: str
    axis: int
    dim: str | None


def dynamic_spec(text: str) -> DynamicSpec:
    """NAME:AXIS or NAME:AXIS:DIM_NAME (axes with the same DIM_NAME share one size)."""
    m = re.fullmatch(r"([^:\s]+):(-?\d+)(?::([A-Za-z_]\w*))?", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"'{text}' is not NAME:AXIS or NAME:AXIS:DIM_NAME (e.g. x:0:batch)")
    return DynamicSpec(m.group(1), int(m.group(2)), m.group(3))


def factory_spec(text: str) -> tuple[str, str]:
    """MODULE:FACTORY, MODULE a dotted module or a path to a .py file."""
    module, sep, attr = text.rpartition(":")
    if not sep or not module or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", attr):
        raise argparse.ArgumentTypeError(f"'{text}' is not MODULE:FACTORY (e.g. my_pkg.models:make_model or "
                                         "path/to/model.py:Model)")
    return module, attr


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {v}")
    return v


def tolerance(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


# --- shared steps ------------------------------------------------------------------------------


def _opbridge():
    import opbridge  # loads torch and the built-in op library: only for commands that need them

    return opbridge


def load_libraries(paths: Sequence[str] | None) -> None:
    ob = _opbridge()
    for p in paths or ():
        progress(f"loading op library {p}")
        ob.load_library(p)


def read_model(path: str):
    import onnx
    from google.protobuf.message import DecodeError

    p = Path(path)
    if not p.is_file():
        raise CliError(f"{path}: no such file")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as e:
        raise CliError(f"{path} is not an ONNX model (cannot parse it as a ModelProto: {_one_line(e)})") from e
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise CliError(f"{path} is not an ONNX model (no IR version or no graph)")
    return model


def import_factory(module: str, attr: str):
    """The callable `attr` of a module given as a dotted name or a path to a .py file."""
    if module.endswith(".py") or os.sep in module or "/" in module:
        path = Path(module).resolve()
        if not path.is_file():
            raise CliError(f"{module}: no such file")
        sys.path.insert(0, str(path.parent))  # the file's own imports of its siblings
        name = "_opbridge_user_" + re.sub(r"\W", "_", path.stem)
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise CliError(f"{module}: cannot be imported as a Python module")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except Exception as e:
            raise CliError(f"importing {module} failed: {_one_line(e)}") from e
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # the console script does not put it there
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and module.startswith(e.name):
                raise CliError(f"cannot import module '{module}': {e}") from e
            raise CliError(f"importing {module} failed: {_one_line(e)}") from e
        except Exception as e:
            raise CliError(f"importing {module} failed: {_one_line(e)}") from e
    obj: Any = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CliError(f"module '{module}' has no attribute '{attr}'")
        obj = getattr(obj, part)
    if not callable(obj):
        raise CliError(f"'{module}:{attr}' is not callable (FACTORY must be a class or a function)")
    return obj


def build_model(spec: tuple[str, str]):
    import torch

    module, attr = spec
    progress(f"importing {module}")
    factory = import_factory(module, attr)
    progress(f"calling {attr}()")
    try:
        model = factory()
    except Exception as e:
        raise CliError(f"{attr}() raised {_one_line(e)}") from e
    if not isinstance(model, torch.nn.Module):
        raise CliError(f"{attr}() returned {type(model).__name__}, not a torch.nn.Module")
    return model.eval()


def random_tensor(spec: InputSpec, seed: int):
    """Reproducible example data: normal floats, integers in [0, 10), random booleans."""
    import torch

    g = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, spec.dtype)
    if dtype.is_floating_point:
        return torch.randn(spec.shape, generator=g, dtype=torch.float32).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, spec.shape, generator=g).bool()
    return torch.randint(0, 10, spec.shape, generator=g, dtype=torch.int64).to(dtype)


def _no_duplicate_names(specs: Sequence[InputSpec]) -> None:
    seen = set()
    for s in specs:
        if s.name in seen:
            raise UsageError(f"--input {s.name} is given twice")
        seen.add(s.name)


# --- ops ---------------------------------------------------------------------------------------


def _domain(d: str) -> str:
    return d if d not in ("", "ai.onnx") else "ai.onnx"


def _torch_schema(op) -> str | None:
    try:
        return str(op.overload._schema)
    except Exception:  # noqa: BLE001 - a mapping to an op torch lacks in this build
        return None


def export_summary(op) -> str:
    """Which ONNX node the op becomes, by target opset, e.g. 'opbridge::MyConv v1; ai.onnx::Conv from opset 11'."""
    parts = []
    if op.export_kind == "kernel":
        parts.append(f"{_domain(op.onnx_domain)}::{op.onnx_type} v{op.since_version}")
    elif op.export_kind == "function":
        parts.append(f"{_domain(op.onnx_domain)}::{op.onnx_type} v{op.since_version} (function, opset {op.function['opset']}+)")
    for r in op.export_rules:
        target = f"{_domain(r['domain'])}::{r['op_type']}"
        parts.append(f"{target} from opset {r['min_opset']}" if r["min_opset"] > 1 else target)
    return "; ".join(parts)


def op_json(op) -> dict:
    return {
        "name": op.name,
        "library": op.library.name,
        "torch_op": op.torch_op,
        "torch_schema": _torch_schema(op),
        "defines_torch_op": op.defines_torch_op,
        "doc": op.doc,
        "export": {"kind": op.export_kind,
                   "own_node": ({"domain": _domain(op.onnx_domain), "op_type": op.onnx_type,
                                 "since_version": op.since_version} if op.has_own_node else None),
                   "rules": op.export_rules, "function": op.function, "summary": export_summary(op)},
        "inputs": [{"name": i["name"], "type": i["type"], "dtypes": op.types[i["type"]], "optional": i["optional"],
                    "doc": i["doc"]} for i in op.inputs],
        "attributes": [{k: a[k] for k in ("name", "kind", "default", "doc") if k in a} for a in op.attributes],
        "outputs": [{"name": o["name"], "type": o["type"], "dtypes": op.types[o["type"]], "shape": o["shape"],
                     "doc": o["doc"]} for o in op.outputs],
        "checks": op.checks,
    }


def _table(rows: list[list[str]], head: list[str]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    fmt = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return [fmt(head), fmt(["-" * w for w in widths]), *[fmt(r) for r in rows]]


EXPORT_KINDS = {  # known export kinds, for the legend only; others print as they are
    "kernel": "a node in the library's ONNX domain, run by its ONNX Runtime library",
    "mapping": "no node of its own: export rules write other ops (standard ai.onnx ops or library ops)",
    "function": "an ONNX function in the library's domain, defined inside the exported model",
}


def cmd_ops(args) -> int:
    load_libraries(args.library)
    ob = _opbridge()
    libs = ob.libraries()
    if args.json:
        print(json.dumps({
            "libraries": [{"name": lib.name, "torch_namespace": lib.torch_namespace,
                           "onnx_domain": lib.onnx_domain, "onnx_domain_version": lib.onnx_domain_version,
                           "torch_library": str(lib.torch_path), "ort_library": str(lib.ort_path) if lib.ort_path else None,
                           "ops": [op.name for op in lib.ops]} for lib in libs],
            "ops": [op_json(op) for op in ob.all_ops()],
        }, indent=2))
        return 0
    for lib in libs:
        ort_lib = lib.ort_path.name if lib.ort_path else "no ONNX Runtime library"
        print(f"library {lib.name}: torch namespace '{lib.torch_namespace}', ONNX domain '{lib.onnx_domain}' "
              f"v{lib.onnx_domain_version}, {len(lib.ops)} ops ({lib.torch_path.name}, {ort_lib})")
        rows, sigs = [], []
        for op in lib.ops:
            args_ = [f"{i['name']}{'?' if i['optional'] else ''}:{i['type']}" for i in op.inputs]
            outs = [f"{o['name']}:{o['type']}" for o in op.outputs]
            types = "; ".join(f"{c}={'|'.join(d)}" for c, d in op.types.items())
            rows.append([op.name, op.export_kind, export_summary(op), f"({', '.join(args_)}) -> ({', '.join(outs)})",
                         types])
            sigs.append(_torch_schema(op) or f"{op.torch_op} (not in this torch build)")
        lines = _table(rows, ["op", "export", "ONNX (by target opset)", "inputs -> outputs", "dtypes"])
        print("\n".join(lines[:2]))
        for line, sig in zip(lines[2:], sigs):
            print(line)
            print(f"    torch: {sig}")
        print()
    kinds = sorted({op.export_kind for op in ob.all_ops()})
    legend = "; ".join(f"{k} = {EXPORT_KINDS.get(k, 'see the op library')}" for k in kinds)
    print(f"{sum(len(lib.ops) for lib in libs)} ops in {len(libs)} librar{'y' if len(libs) == 1 else 'ies'}"
          + (f". export: {legend}" if legend else ""))
    return 0


# --- inspect -----------------------------------------------------------------------------------


def _wrap(text: str, indent: str) -> str:
    width = max(60, min(shutil.get_terminal_size((110, 20)).columns, 130))
    return textwrap.fill(text, width=width, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False, break_long_words=False)


def print_report(report, session_result: str | None) -> None:
    from . import _inspect as I

    print(f"model      {report.path}")
    print(f"format     IR version {report.ir_version}" + (f", producer {report.producer}" if report.producer else ""))
    print("opsets     " + (", ".join(f"{I.domain_name(d)} {v}" for d, v in report.opsets.items()) or "(none)"))
    libs = ", ".join(f"{lib['name']} ({lib['onnx_domain']})" for lib in report.libraries) or "none"
    print(f"runtime    {report.runtime}; opbridge libraries: {libs}")
    for title, values in (("inputs", report.inputs), ("outputs", report.outputs)):
        width = max((len(v.name) for v in values), default=0)
        for k, v in enumerate(values):
            print(f"{title if k == 0 else '':<10} {v.name:<{width}}  {v.describe()}")
        if not values:
            print(f"{title:<10} (none)")
    print(f"weights    {report.initializers} initializers")
    if report.functions:
        fs = [f"{f['domain']}::{f['name']}{'(' + f['overload'] + ')' if f['overload'] else ''} "
              f"({f['nodes']} nodes{'' if f['used'] else ', unused'})" for f in report.functions]
        print("functions  " + ", ".join(fs))
    print()
    rows = []
    for u in report.ops:
        where = [w for w in u.where if w != "graph"]
        note = u.verdict.detail if not u.verdict.missing else "see below"
        if where:
            note = (note + "; " if note else "") + "in " + ", ".join(where)
        rows.append([I.domain_name(u.domain), u.op_type, "-" if u.opset is None else str(u.opset), str(u.count),
                     u.verdict.status, note])
    if rows:
        print("\n".join(_table(rows, ["domain", "op", "opset", "count", "status", "provided by"])))
    else:
        print("(the graph has no nodes)")
    for note in report.notes:
        print("\n" + _wrap(f"note: {note}", ""))
    missing = report.missing
    if missing:
        print(f"\nMISSING ({len(missing)}):")
        for m in missing:
            if isinstance(m, I.OpUse):
                print(_wrap(f"{I.domain_name(m.domain)}::{m.op_type} (opset {m.opset}, {m.count} "
                            f"node{'s' if m.count != 1 else ''}): {m.verdict.advice}", "  "))
            else:
                print(_wrap(f"{m.detail}: {m.advice}", "  "))
    if session_result is not None:
        print("\n" + _wrap(f"session: {session_result or 'ONNX Runtime created a session for the model'}", ""))
    runtime = report.runtime.split(" (")[0]
    if report.ok and not session_result:
        print(f"\nOK: {runtime} can run every op of this model"
              + (" (with the opbridge libraries registered)" if any(u.verdict.status == I.OPBRIDGE for u in report.ops)
                 else ""))
    elif report.ok:
        print(f"\nFAIL: every op has a runtime, but {runtime} refused to create a session (see above)")
    else:
        print(f"\nFAIL: {runtime} cannot run this model: {len(missing)} problem{'s' if len(missing) != 1 else ''}")


def _session_check(path: str) -> str:
    """Creates a real ONNX Runtime session (opbridge libraries registered): "" or the refusal.
    Catches what a static check cannot (e.g. a kernel that rejects an attribute value)."""
    from . import _inspect as I

    ob = _opbridge()
    try:
        so = ob.session_options()
        so.log_severity_level = 3
        ob.session(path, options=so)
    except Exception as e:  # noqa: BLE001 - the refusal is the answer
        return I.clean_ort_message(str(e))
    return ""


def cmd_inspect(args) -> int:
    load_libraries(args.library)
    from . import _inspect as I

    model = read_model(args.model)
    progress(f"inspecting {args.model}")
    report = I.analyze(model, args.model)
    session_result = None
    if args.session:
        progress("creating an ONNX Runtime session")
        session_result = _session_check(args.model)
    if args.json:
        out = report.to_json()
        if args.session:
            out["session"] = {"ok": not session_result, "error": session_result or None}
            out["runnable"] = out["runnable"] and not session_result
        print(json.dumps(out, indent=2))
    else:
        print_report(report, session_result)
    return 0 if report.ok and not session_result else 1


# --- graph -------------------------------------------------------------------------------------


def cmd_graph(args) -> int:
    load_libraries(args.library)
    from . import _graph, _inspect as I

    out = Path(args.output)
    fmt = out.suffix.lower().lstrip(".")
    if fmt not in ("svg", "png", "dot"):
        raise UsageError(f"-o {args.output}: the file name must end in .svg, .png or .dot")
    dot = None
    if fmt != "dot":
        dot = shutil.which("dot")
        if dot is None:
            raise CliError("Graphviz 'dot' is not installed (Debian: apt-get install graphviz); "
                           f"or write the DOT text with -o {out.with_suffix('.dot')}")
    model = read_model(args.model)
    progress(f"inspecting {args.model}")
    report = I.analyze(model, args.model)
    drawing = _graph.to_dot(report, max_nodes=args.max_nodes)
    if drawing.collapsed:
        progress(f"{drawing.op_nodes} nodes > --max-nodes {args.max_nodes}: collapsed {drawing.collapsed} runs of "
                 f"standard ops, {drawing.drawn_nodes} boxes drawn")
        if drawing.drawn_nodes > args.max_nodes:
            progress(f"still {drawing.drawn_nodes} boxes after collapsing: the drawing will be large")
    if fmt == "dot":
        out.write_text(drawing.text)
    else:
        progress(f"rendering with {dot}")
        try:
            _graph.render(drawing.text, out, fmt, dot)
        except _graph.GraphvizError as e:
            raise CliError(str(e))  # no cause: the message says it all (no --verbose hint)
    counts = ", ".join(f"{n} {s}" for s, n in sorted(drawing.status_counts.items()))
    print(f"wrote {out} ({drawing.drawn_nodes} boxes for {drawing.op_nodes} nodes: {counts or 'no nodes'})")
    return 0 if report.ok else 1


# --- export ------------------------------------------------------------------------------------


def _dynamic_axes(inputs: Sequence[InputSpec], dynamic: Sequence[DynamicSpec]) -> dict[str, dict[int, str]] | None:
    by_name = {s.name: s for s in inputs}
    axes: dict[str, dict[int, str]] = {}
    for d in dynamic or ():
        spec = by_name.get(d.name)
        if spec is None:
            raise UsageError(f"--dynamic {d.name}:{d.axis}: no --input named '{d.name}' "
                             f"(inputs: {', '.join(by_name) or 'none'})")
        rank = len(spec.shape)
        if not -rank <= d.axis < rank:
            raise UsageError(f"--dynamic {d.name}:{d.axis}: input '{d.name}' has rank {rank}")
        axis = d.axis % rank
        axes.setdefault(d.name, {})[axis] = d.dim or f"{d.name}_dim{axis}"
    return axes or None


def summarize(path: Path, exporter: str | None = None) -> None:
    from . import _inspect as I

    model = read_model(str(path))
    report = I.analyze(model, str(path))
    by_domain: dict[str, int] = {}
    for u in report.ops:
        key = I.domain_name(u.domain)
        by_domain[key] = by_domain.get(key, 0) + u.count
    if exporter:
        print(f"exporter   {exporter}")
    print("opsets     " + ", ".join(f"{I.domain_name(d)} {v}" for d, v in report.opsets.items()))
    for title, values in (("inputs", report.inputs), ("outputs", report.outputs)):
        width = max((len(v.name) for v in values), default=0)
        for k, v in enumerate(values):
            print(f"{title if k == 0 else '':<10} {v.name:<{width}}  {v.describe()}")
    print("ops        " + (", ".join(f"{d} {n}" for d, n in sorted(by_domain.items())) or "none")
          + f" ({sum(by_domain.values())} nodes)")
    size = path.stat().st_size
    print(f"file       {path} ({size / 1e6:.2f} MB)" if size >= 1e5 else f"file       {path} ({size} bytes)")
    missing = report.missing
    print("runtime    " + (f"every op has a runtime ({report.runtime} with the opbridge libraries)" if not missing
                           else f"{len(missing)} MISSING: run 'opbridge inspect {path}'"))


def cmd_export(args) -> int:
    if not args.input:
        raise UsageError("give the model's example inputs with --input NAME=SHAPE:DTYPE (one per forward argument)")
    _no_duplicate_names(args.input)
    dynamic_axes = _dynamic_axes(args.input, args.dynamic)
    load_libraries(args.library)
    ob = _opbridge()
    model = build_model(args.factory)
    example = tuple(random_tensor(s, args.seed + k) for k, s in enumerate(args.input))
    out = Path(args.output)
    if out.parent and not out.parent.exists():
        raise CliError(f"-o {args.output}: folder {out.parent} does not exist")
    progress(f"exporting with the {args.exporter} exporter"
             + (f" (opset {args.opset})" if args.opset else "") + ", then the ONNX checker")
    ob.export(model, example, out, exporter=args.exporter, opset=args.opset,
              input_names=[s.name for s in args.input], output_names=args.output_name or None,
              dynamic_axes=dynamic_axes, verbose=args.verbose)
    progress(f"wrote {out}")
    summarize(out, args.exporter)
    return 0


# --- verify ------------------------------------------------------------------------------------


def _verify_inputs(args, sess) -> list:
    import numpy as np
    import onnx
    import torch

    model_inputs = sess.get_inputs()
    names = [i.name for i in model_inputs]
    if args.inputs:
        path = Path(args.inputs)
        if not path.is_file():
            raise CliError(f"--inputs {args.inputs}: no such file")
        try:
            with np.load(path, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
        except Exception as e:
            raise CliError(f"--inputs {args.inputs} is not a readable .npz file ({_one_line(e)})") from e
        if all(n in arrays for n in names):
            chosen = [arrays[n] for n in names]
        elif all(f"arr_{k}" in arrays for k in range(len(names))):  # np.savez(f, a, b): positional
            chosen = [arrays[f"arr_{k}"] for k in range(len(names))]
        else:
            missing = [n for n in names if n not in arrays]
            raise CliError(f"--inputs {args.inputs} lacks {', '.join(repr(m) for m in missing)} (it has "
                           f"{', '.join(arrays) or 'no arrays'}; the model's inputs are {', '.join(names)})")
        tensors = []
        for i, a in zip(model_inputs, chosen):
            if a.dtype.kind not in "biuf":
                raise CliError(f"--inputs {args.inputs}: array '{i.name}' has dtype {a.dtype}, not a number or bool")
            tensors.append(torch.from_numpy(np.ascontiguousarray(a)))
        return tensors
    specs = {s.name: s for s in args.input or ()}
    unknown = [n for n in specs if n not in names]
    if unknown:
        raise UsageError(f"--input {unknown[0]}: the model has no input '{unknown[0]}' (its inputs: {', '.join(names)})")
    tensors = []
    proto_inputs = {i.name: i for i in read_model(args.model).graph.input}
    for k, i in enumerate(model_inputs):
        spec = specs.get(i.name)
        if spec is None:
            t = proto_inputs[i.name].type.tensor_type
            shape = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
            if not t.HasField("shape") or None in shape:
                raise UsageError(f"the model's input '{i.name}' has shape {i.shape}: give --input "
                                 f"{i.name}=SHAPE:DTYPE or --inputs FILE.npz")
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)).name
            if dtype not in DTYPES:
                raise UsageError(f"the model's input '{i.name}' is {dtype}: give it in --inputs FILE.npz")
            spec = InputSpec(i.name, tuple(shape), dtype)
        tensors.append(random_tensor(spec, args.seed + k))
    return tensors


def _onnx_type(t) -> str | None:
    """'tensor(float)' for a torch tensor, as ONNX Runtime names its inputs' types."""
    import torch

    names = {torch.float32: "float", torch.float64: "double", torch.float16: "float16", torch.bfloat16: "bfloat16",
             torch.int8: "int8", torch.int16: "int16", torch.int32: "int32", torch.int64: "int64",
             torch.uint8: "uint8", torch.bool: "bool"}
    return f"tensor({names[t.dtype]})" if t.dtype in names else None


def cmd_verify(args) -> int:
    if args.inputs and args.input:
        raise UsageError("give either --inputs FILE.npz or --input NAME=SHAPE:DTYPE, not both")
    _no_duplicate_names(args.input or ())
    load_libraries(args.library)
    ob = _opbridge()
    read_model(args.model)  # a clear error for a missing or malformed file
    progress(f"creating an ONNX Runtime session for {args.model}")
    try:
        sess = ob.session(args.model)
    except Exception as e:
        from . import _inspect as I

        raise CliError(f"ONNX Runtime cannot load {args.model}: {I.clean_ort_message(str(e))} "
                       f"(run 'opbridge inspect {args.model}')") from e
    tensors = _verify_inputs(args, sess)
    for i, t in zip(sess.get_inputs(), tensors):
        given = _onnx_type(t)
        if given and i.type != given:
            raise CliError(f"input '{i.name}' is {i.type} in the model, the given data is {given}")
    model = build_model(args.torch)
    progress("running PyTorch eager and ONNX Runtime")
    try:
        report = ob.verify(model, tuple(tensors), args.model, rtol=args.rtol, atol=args.atol, sess=sess)
    except ob.OpbridgeError:
        raise
    except Exception as e:
        from . import _inspect as I

        raise CliError(f"running the model failed: {I.clean_ort_message(_one_line(e))}") from e
    print(f"ONNX Runtime vs PyTorch eager (rtol {args.rtol:g}, atol {args.atol:g}), inputs: "
          + ", ".join(f"{i.name} {list(t.shape)} {str(t.dtype).replace('torch.', '')}"
                      for i, t in zip(sess.get_inputs(), tensors)))
    print(report.table())
    bad = [o.name for o in report.outputs if not o.ok]
    print(f"\n{'PASS: every output matches' if not bad else 'FAIL: mismatch in ' + ', '.join(bad)}")
    return 0 if not bad else 1


# --- the parser --------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit status 2
        print(f"{PROG}: error: {message} (see '{self.prog} --help')", file=sys.stderr)
        sys.exit(2)


def _help_formatter(prog):
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32)


EPILOGS = {
    "ops": """example:
  opbridge ops
  opbridge ops --json | python -c 'import json,sys; print([o["name"] for o in json.load(sys.stdin)["ops"]])'
""",
    "inspect": """statuses:
  onnxruntime             a CPU kernel of the installed ONNX Runtime (its kernel registry, the node's
                          opset version and input types)
  onnxruntime (function)  no kernel: ONNX Runtime expands the op's ONNX function body
  opbridge                a custom op of a loaded opbridge library
  model function          a function defined in the model
  MISSING                 nothing runs it; the advice says what to do (exit status 1)

example:
  opbridge inspect model.onnx
  opbridge inspect model.onnx --json --library build/libmy_ops_torch.so
""",
    "graph": """Custom nodes are coloured by status (opbridge blue, model function yellow, ONNX function
grey, MISSING red); edges carry dtype[shape] after ONNX shape inference; initializers are listed
inside their consumer's box. Above --max-nodes, runs of consecutive standard ONNX ops collapse
into one box each.

example:
  opbridge graph model.onnx -o model.svg
  opbridge graph big.onnx -o big.dot --max-nodes 150
""",
    "export": """example:
  opbridge export my_models.py:Block -o block.onnx --input x=4x8:float32 --input y=4x8:float32 \\
      --dynamic x:0:batch --dynamic y:0:batch
  opbridge export my_pkg.models:make_model -o m.onnx --input img=1x3x224x224:float32 \\
      --exporter torchscript --opset 17
""",
    "verify": """example:
  opbridge verify block.onnx --torch my_models.py:Block --input x=9x8:float32 --input y=9x8:float32
  opbridge verify block.onnx --torch my_models.py:Block --inputs batch.npz --rtol 1e-4 --atol 1e-5
""",
}


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, formatter_class=_help_formatter,
                description="Which ops does a model need and will ONNX Runtime run it (inspect), the loaded "
                            "operators (ops), draw a graph (graph), export a PyTorch model (export), and check "
                            "ONNX Runtime against PyTorch (verify).",
                epilog="example:\n  opbridge inspect model.onnx\n  opbridge <command> --help")
    p.add_argument("--verbose", action="store_true", help="show tracebacks and the exporters' own output")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)

    def command(name: str, help_: str, description: str):
        c = sub.add_parser(name, help=help_, description=description, epilog=EPILOGS[name],
                           formatter_class=_help_formatter)
        c.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                       help="show tracebacks and the exporters' own output")
        c.add_argument("--library", action="append", metavar="LIB_torch.so",
                       help="also load this opbridge op library (repeatable)")
        return c

    c = command("ops", "list the loaded operators",
                "Every loaded operator: PyTorch signature, ONNX domain/op/version, dtypes per input and "
                "output, and the export mapping.")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.set_defaults(func=cmd_ops)

    c = command("inspect", "which ops a model needs and whether ONNX Runtime runs it",
                "Every op the model uses (main graph, subgraphs, model-local functions) with the opset in "
                "effect, the count and who runs it; the model's IR version, opsets, inputs and outputs. "
                "Exit status 1 when anything is MISSING.")
    c.add_argument("model", metavar="MODEL.onnx")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.add_argument("--session", action="store_true",
                   help="also create an ONNX Runtime session (catches kernels that refuse an attribute value)")
    c.set_defaults(func=cmd_inspect)

    c = command("graph", "draw the graph with Graphviz",
                "Draws the main graph: op nodes coloured by the status 'inspect' computes, edges labelled "
                "with dtype and shape.")
    c.add_argument("model", metavar="MODEL.onnx")
    c.add_argument("-o", "--output", required=True, metavar="OUT.svg|OUT.png|OUT.dot")
    c.add_argument("--max-nodes", type=positive_int, default=300, metavar="N",
                   help="collapse runs of standard ops above N nodes (default 300)")
    c.set_defaults(func=cmd_graph)

    c = command("export", "export a PyTorch model with opbridge's rules",
                "Imports MODULE (a dotted module or path/to/file.py), calls FACTORY() for a torch.nn.Module, "
                "exports it on random example inputs with opbridge.export (which runs the ONNX checker) and "
                "prints a summary. Example data: normal floats, integers in [0, 10), random booleans.")
    c.add_argument("factory", type=factory_spec, metavar="MODULE:FACTORY")
    c.add_argument("-o", "--output", required=True, metavar="MODEL.onnx")
    c.add_argument("--input", type=input_spec, action="append", metavar="NAME=SHAPE:DTYPE",
                   help="one per forward argument, in order; SHAPE like 1x3x224x224, DTYPE one of "
                        + ", ".join(DTYPES))
    c.add_argument("--dynamic", type=dynamic_spec, action="append", metavar="NAME:AXIS[:DIM]",
                   help="keep this axis symbolic; axes with the same DIM name share a size")
    c.add_argument("--output-name", action="append", metavar="NAME", help="name the outputs, in order")
    c.add_argument("--opset", type=positive_int, help="ai.onnx opset (dynamo: 18 or newer)")
    c.add_argument("--exporter", choices=("dynamo", "torchscript"), default="dynamo",
                   help="PyTorch exporter (default dynamo)")
    c.add_argument("--seed", type=int, default=0, help="seed of the example inputs (default 0)")
    c.set_defaults(func=cmd_export)

    c = command("verify", "compare ONNX Runtime with PyTorch eager",
                "Runs the PyTorch model (FACTORY() from MODULE) and the ONNX model in ONNX Runtime with the "
                "opbridge libraries on the same inputs; prints the per-output difference. Exit status 1 on "
                "mismatch. Inputs: from an .npz (keys = the model's input names, or arr_0, arr_1, ...), from "
                "--input specs (random), or random from the model's static input shapes.")
    c.add_argument("model", metavar="MODEL.onnx")
    c.add_argument("--torch", required=True, type=factory_spec, metavar="MODULE:FACTORY")
    c.add_argument("--inputs", metavar="FILE.npz", help="input arrays by name")
    c.add_argument("--input", type=input_spec, action="append", metavar="NAME=SHAPE:DTYPE",
                   help="a random input of this shape and dtype (repeatable)")
    c.add_argument("--rtol", type=tolerance, default=1e-5, help="relative tolerance (default 1e-5)")
    c.add_argument("--atol", type=tolerance, default=1e-6, help="absolute tolerance (default 1e-6)")
    c.add_argument("--seed", type=int, default=0, help="seed of random inputs (default 0)")
    c.set_defaults(func=cmd_verify)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `opbridge ops | head`
        return 0
    except Exception as e:  # noqa: BLE001 - every failure ends as one line
        if args.verbose:
            traceback.print_exc()
        hint = "" if args.verbose or isinstance(e, UsageError) else " (--verbose for the traceback)"
        if isinstance(e, CliError) and not isinstance(e, UsageError) and e.__cause__ is None:
            hint = ""
        print(f"{PROG}: error: {_one_line(e)}{hint}", file=sys.stderr)
        return 2 if isinstance(e, UsageError) else 1
