"""The exported graph's inputs against the call that was exported: every tensor the call passes is
an input the graph reads, and every axis asked to be dynamic (dynamic_axes, or torch.export's
dynamic_shapes) stays dynamic. dynamic_axes are also turned into dynamic_shapes here for the
dynamo exporter."""

from __future__ import annotations

import inspect
import re
import warnings
from pathlib import Path

import onnx
import torch

from .._library.errors import OpbridgeError
from .._library.kinds import tensor_leaves
from .._runtime.feeds import match_inputs, parameter_names, tensor_paths
from .._runtime.second_size import as_exported
from .._runtime.verify import referenced
from .foreign import ForeignCall, called_operators
from .isolation import isolated
from .substitution import substitutions


_PACKAGE = str(Path(__file__).resolve().parents[1])  # opbridge's own files


def modules_of(model) -> list[torch.nn.Module]:
    """The models whose attributes substitutions() rebinds: the model itself (an ExportedProgram has none)."""
    return [model] if isinstance(model, torch.nn.Module) else []


def check_inputs(proto: onnx.ModelProto, model, args: tuple, kwargs: dict | None, names, exporter: str,
                 allow: bool, traced: list | None = None) -> None:
    """Every tensor of the call is a graph input: one that is not was dropped by the exporter, and the
    graph computes as if the example's value were fixed, or without it. traced: the TorchScript
    trace's TracerWarnings (warnings.WarningMessage), whose lines read tensors as Python values."""
    graph_inputs = [i.name for i in proto.graph.input]
    tensors = tensor_leaves((args, kwargs or {}))
    # An input no node reads (subgraphs of If / Loop included) and no output is: the exporter kept
    # it, and baked its value.
    read = set(referenced(proto.graph)) | {o.name for o in proto.graph.output}
    unread = [n for n in graph_inputs if n not in read]
    if len(graph_inputs) >= len(tensors) and not unread:
        return
    try:
        _, dropped = match_inputs(graph_inputs, model, args, kwargs or {}, names)
    except OpbridgeError:
        dropped = ()
    dropped = tuple(dropped) + tuple(unread)
    if len(graph_inputs) == len(tensors):  # only unread ones: named by the graph
        names = graph_inputs
    paths = tensor_paths(args, kwargs or {})
    given = list(names) if names and len(names) == len(tensors) else parameter_names(model, args, kwargs or {},
                                                                                      len(tensors))
    if dropped and given:
        which = [f"'{n}' ({paths[given.index(n)]})" if n in given else f"'{n}'" for n in dropped]
    else:
        which = [f"{len(tensors) - len(graph_inputs)} of {len(tensors)} ({', '.join(paths)}; the graph takes "
                 f"{', '.join(graph_inputs)})"]
    text = (f"opbridge.export: the exported graph does not take the input{'s' if len(which) > 1 else ''} "
            f"{', '.join(which)} that the call passes. The model reads it as a Python number or bool (float(t), "
            "int(t), t.item(), `if t:`), so the graph holds the example's value; or an operator the trace cannot see "
            "into uses it (an autograd.Function over a compiled extension: give it a substitution rule, "
            "@opbridge.substitute('package.module.Function'), docs/authoring.md); or the model does not use it."
            + " Pass allow_unused_inputs=True if the model ignores it on purpose." + _read_as_values(traced or []))
    with substitutions(*modules_of(model)), as_exported(model, exporter):  # the model runs as it was traced
        hidden = called_operators(model, args, kwargs or {})
    if hidden:
        text += ("\nThe model calls code a trace cannot see into: " + ", ".join(hidden) + ". Substitute the one "
                 "that reads the input, e.g.\n" + ForeignCall(hidden[0], "", "").advice())
    if not allow:
        raise OpbridgeError(text)
    warnings.warn(text, stacklevel=3)



def _read_as_values(traced: list) -> str:
    """Where the trace read a tensor as a Python value, from its TracerWarnings: model code first."""
    lines = []
    for w in traced:
        text = str(w.message).strip().split(". ")[0].rstrip(".")
        if "Python" in text or "might cause the trace" in text:
            where = f"{w.filename}:{w.lineno}: {text}"
            if where not in lines:
                lines.append(where)
    model_first = sorted(lines, key=lambda ln: ln.startswith(_PACKAGE) or "/torch/" in ln)
    return ("\nThe trace read tensors as Python values at:\n  " + "\n  ".join(model_first[:6])) if lines else ""


def check_dynamic_axes(proto: onnx.ModelProto, dynamic_axes) -> None:
    inputs = {i.name: i for i in proto.graph.input}
    for name, axes in dynamic_axes.items():
        if name not in inputs:
            continue  # an input the exporter dropped (unused by the graph)
        dims = inputs[name].type.tensor_type.shape.dim
        for ax in axes:
            d = dims[ax]
            if d.HasField("dim_value"):
                raise OpbridgeError(f"axis {ax} of input '{name}' was asked to be dynamic, but the exported model "
                                    f"fixes it to {d.dim_value}: the model specializes on that size")





def _asked_axes(model, args: tuple, kwargs: dict | None, dynamic_shapes) -> list[tuple[torch.Tensor, str, int]]:
    """(tensor, where it sits in the call, axis) for every axis dynamic_shapes asks to be dynamic
    (a torch.export.Dim, Dim.DYNAMIC or a name; Dim.AUTO and Dim.STATIC leave the choice to torch).
    dynamic_shapes mirrors the call: a dict keyed by forward's parameter names, or a sequence in the
    order of the arguments."""
    kwargs = kwargs or {}
    if isinstance(dynamic_shapes, dict):
        try:
            bound = inspect.signature(getattr(model, "forward", model)).bind(*args, **kwargs).arguments
        except (TypeError, ValueError):
            return []
        pairs = [(bound[k], f"{k}", v) for k, v in dynamic_shapes.items() if k in bound]
    elif isinstance(dynamic_shapes, (list, tuple)):
        values = [*args, *kwargs.values()]
        labels = [f"args[{i}]" for i in range(len(args))] + [f"kwargs[{k!r}]" for k in kwargs]
        pairs = list(zip(values, labels, dynamic_shapes))
    else:
        return []
    auto = [a for a in (getattr(torch.export.Dim, n, None) for n in ("AUTO", "STATIC")) if a is not None]
    out = []

    def walk(value, where, spec):
        if spec is None:
            return
        if isinstance(value, torch.Tensor):
            items = spec.items() if isinstance(spec, dict) else \
                enumerate(spec) if isinstance(spec, (list, tuple)) else ()
            for ax, d in items:
                if d is not None and not any(d is a for a in auto):
                    out.append((value, where, ax % max(value.dim(), 1)))
        elif isinstance(value, dict) and isinstance(spec, dict):
            for k, v in value.items():
                walk(v, f"{where}[{k!r}]", spec.get(k))
        elif isinstance(value, (list, tuple)) and isinstance(spec, (list, tuple)):
            for k, (v, sp) in enumerate(zip(value, spec)):
                walk(v, f"{where}[{k}]", sp)

    for value, where, spec in pairs:
        walk(value, where, spec)
    return out


def check_dynamic_shapes(proto: onnx.ModelProto, model, args: tuple, kwargs: dict | None, dynamic_shapes) -> None:
    """dynamic_shapes is checked as dynamic_axes is: an axis asked to be dynamic that the ONNX graph
    fixes is an error naming the input, where it sits in the call and the axis, with torch.export's
    own account of why (its guards)."""
    if isinstance(model, torch.export.ExportedProgram):
        return
    tensors = tensor_leaves((args, kwargs or {}))
    graph = list(proto.graph.input)
    if len(graph) != len(tensors):
        return  # the inputs check names what went missing
    fixed = []
    for t, where, ax in _asked_axes(model, args, kwargs, dynamic_shapes):
        k = next((i for i, x in enumerate(tensors) if x is t), None)
        if k is None:
            continue
        dims = graph[k].type.tensor_type.shape.dim
        if ax < len(dims) and dims[ax].HasField("dim_value"):
            fixed.append(f"axis {ax} of input '{graph[k].name}' ({where}) is fixed to {dims[ax].dim_value}")
    if not fixed:
        return
    raise OpbridgeError("dynamic_shapes asks for dynamic axes that the exported model fixes: the model specializes "
                        "on their size:\n  " + "\n  ".join(fixed) + _guards(model, args, kwargs, dynamic_shapes))


def _guards(model, args: tuple, kwargs: dict | None, dynamic_shapes) -> str:
    """torch.export's own account of why it cannot keep the axes dynamic: each guard the model's
    code generated on those sizes, with the line that generated it (from draft_export's report,
    where this torch has it), else torch.export's error text; "" when neither tells."""
    try:
        with substitutions(*modules_of(model)), isolated(verbose=False):
            program = torch.export.draft_export(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)
        lines = _guard_lines(program)
        if lines:
            return "\ntorch.export's guards on those sizes:\n  " + "\n  ".join(lines)
    except Exception:  # noqa: BLE001 - the plain export's error below still tells
        pass
    try:
        with substitutions(*modules_of(model)), isolated(verbose=False):
            torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as e:  # noqa: BLE001 - only its text is wanted
        text = re.sub(r"\s*For more information, run with TORCH_LOGS=\"[^\"]*\"\.?", "", str(e))
        text = re.sub(r"\.(?=Specializations)", ".\n", text)
        keep = [ln for ln in text.splitlines() if ln.strip() and "draft_export" not in ln
                and "error above occurred" not in ln]
        if keep:
            return "\ntorch.export says:\n  " + "\n  ".join(keep[:12])
    return ""


def _guard_lines(program) -> list[str]:
    """'(pos.size()[1]//4) == 16 at model.py:12 (`return fps(xyz, n)`)' per guard draft_export recorded."""
    try:
        from torch._logging.structured import INTERN_TABLE
    except ImportError:
        INTERN_TABLE = {}
    files = {v: k for k, v in INTERN_TABLE.items()}
    out = []
    for failure in getattr(getattr(program, "_report", None), "failures", []):
        data = failure.data if isinstance(failure.data, dict) else {}
        expr = data.get("expr")
        if not expr:
            continue
        for sym, source in sorted(data.get("symbol_to_sources", {}).items(), key=lambda kv: -len(kv[0])):
            expr = re.sub(rf"\b{re.escape(sym)}\b", source, expr)
        user = [f for f in data.get("user_stack", []) if f.get("name") not in ("_wrapped_call_impl", "_call_impl")]
        at = ""
        if user:
            f = user[-1]
            path = str(files.get(f.get("filename"), "?"))
            if path.startswith(_PACKAGE):
                continue  # a guard of opbridge's own call (axes that share a name are equal), not the model's
            at = f" at {path}:{f.get('line')} (`{f.get('loc', '').strip()}`)"
        out.append(f"{expr}{at}")
    return out[:8]


def dynamic_shapes_from_axes(model, args: tuple, kwargs: dict | None, names: list[str] | None, dynamic_axes):
    """dynamic_axes ({"x": {0: "batch"}}) as torch.export dynamic_shapes, keyed like forward's
    parameters, one torch.export.Dim per axis name, so axes that share a name share a symbol
    (and keep the name in ONNX). input_names name the call's tensors in order, those nested in
    containers too (a dict argument's tensors in its order)."""
    if not dynamic_axes:
        return None
    kwargs = kwargs or {}
    names = names or []
    tensors = tensor_leaves((args, kwargs))
    unknown = sorted(set(dynamic_axes) - set(names[: len(tensors)]))
    if unknown:
        raise OpbridgeError(f"dynamic_axes names {unknown}, which are not in input_names {names} "
                            "(input_names name the tensor inputs in order, those in containers too)")
    symbols: dict[str, torch.export.Dim] = {}
    per_tensor: dict[int, dict] = {}
    for t, name in zip(tensors, names):
        axes = dynamic_axes.get(name)
        if not axes:
            continue
        if isinstance(axes, (list, tuple)):
            axes = {ax: f"{name}_dim{ax}" for ax in axes}
        spec = {}
        for ax, sym in axes.items():
            if not -t.dim() <= ax < t.dim():
                raise OpbridgeError(f"dynamic_axes: input '{name}' has rank {t.dim()}; it has no axis {ax}")
            spec[ax % t.dim()] = symbols.setdefault(sym, torch.export.Dim(sym))
        per_tensor[id(t)] = spec
    forward = getattr(model, "forward", None)
    if not callable(forward):
        raise OpbridgeError("dynamic_axes needs a torch.nn.Module; an ExportedProgram has its shapes already")

    def specs(value):  # the value's structure, each tensor replaced by its axes (None: static)
        return torch.utils._pytree.tree_map(lambda v: per_tensor.get(id(v)) if isinstance(v, torch.Tensor) else None,
                                            value)

    sig = inspect.signature(forward)
    bound = sig.bind(*args, **kwargs)
    shapes = {}
    for pname, value in bound.arguments.items():
        kind = sig.parameters[pname].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            shapes[pname] = tuple(specs(v) for v in value)
        elif kind is inspect.Parameter.VAR_KEYWORD:
            shapes[pname] = {k: specs(v) for k, v in value.items()}
        else:
            shapes[pname] = specs(value)
    return shapes
