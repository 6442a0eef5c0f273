"""Export rules for both PyTorch exporters, generated from the manifests. Nothing here names an
op: every rule is built from an OpInfo.

- dynamo=True: a translation function per op for `custom_translation_table`, emitting the op's
  ONNX node through onnxscript (the schema registered by _schemas gives it the output count).
- dynamo=False (TorchScript, deprecated upstream): a symbolic function per op registered with
  `torch.onnx.register_custom_op_symbolic`, plus `custom_opsets` for the custom domains.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import inspect
import warnings
from typing import Any, Callable

import onnx_ir
import onnxscript
import torch

from ._library import Library, OpbridgeError, OpInfo, all_ops
from ._schemas import onnx_attribute_value

# The standard ops opbridge exports to are written with this opset's onnxscript bindings; the
# exporter converts the model to the requested opset afterwards.
_STANDARD_OPSET_VERSION = 20
_TORCHSCRIPT_BASE_OPSET = 9
# What torch.onnx.export(dynamo=True) writes when no opset is given.
_DEFAULT_DYNAMO_OPSET = 20


def torchscript_exporter_available() -> bool:
    return hasattr(torch.onnx, "register_custom_op_symbolic") and hasattr(torch.onnx, "symbolic_helper")


def _split_args(op: OpInfo, args: tuple, kwargs: dict) -> tuple[list[Any], dict[str, Any]]:
    """Positional/keyword call arguments -> (ONNX inputs, ONNX attributes)."""
    n_in = len(op.inputs)
    inputs = list(args[:n_in])
    inputs += [kwargs.pop(i["name"], None) for i in op.inputs[len(inputs):]]
    attrs = {a["name"]: v for a, v in zip(op.attributes, args[n_in:])}
    attrs.update(kwargs)
    return inputs, attrs


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """What one export call asks for: the target ai.onnx opset, and whether ops with a kernel
    keep their own custom node even where a standard op could be written (for runtimes without
    that standard op)."""

    opset: int
    custom_nodes: bool = False


# custom_nodes for the TorchScript exporter, whose symbolics are registered once: set around an
# export by opbridge.export (a context variable: concurrent exports do not see each other's).
# The target opset comes from the graph being built.
_custom_nodes: contextvars.ContextVar[bool] = contextvars.ContextVar("opbridge_custom_nodes", default=False)


@contextlib.contextmanager
def custom_nodes_requested(flag: bool):
    token = _custom_nodes.set(flag)
    try:
        yield
    finally:
        _custom_nodes.reset(token)


@dataclasses.dataclass(frozen=True)
class _Target:
    domain: str  # "" for ai.onnx
    op_type: str
    version: int  # domain version for custom domains; ai.onnx: the rule's min_opset
    inputs: list[dict[str, str]]
    attributes: list[dict[str, Any]]


def _own_node(op: OpInfo) -> _Target:
    return _Target(op.onnx_domain, op.onnx_type, op.since_version,
                   [{"name": i["name"], "when": ""} for i in op.inputs],
                   [{"name": a["name"], "kind": a["kind"], "from": [a["name"]]} for a in op.attributes])


def choose_target(op: OpInfo, options: ExportOptions) -> _Target:
    """Which node writes `op` at this opset: the applicable rule with the highest min_opset, the
    op's own node (a kernel: from opset 1; a function: from the opset its body needs) counting
    as a rule. With custom_nodes, opbridge's own nodes win over standard ai.onnx ops wherever
    the op has one at this opset."""
    candidates: list[tuple[int, _Target]] = []
    if op.export_kind == "kernel":
        candidates.append((1, _own_node(op)))
    elif op.export_kind == "function":
        candidates.append((op.function["opset"], _own_node(op)))
    for r in op.export_rules:
        candidates.append((r["min_opset"], _Target(r["domain"], r["op_type"], r["min_opset"], r["inputs"], r["attributes"])))
    usable = [(v, t) for v, t in candidates if v <= options.opset]
    if options.custom_nodes and any(t.domain for _, t in usable):
        usable = [(v, t) for v, t in usable if t.domain]
    if not usable:
        lowest = min(v for v, _ in candidates)
        what = ", ".join(f"{t.domain + '::' if t.domain else 'ai.onnx '}{t.op_type} from opset {v}" for v, t in candidates)
        raise OpbridgeError(f"{op.torch_op}: cannot be exported at opset {options.opset}: it is written as {what}; "
                            f"export with opset >= {lowest}")
    # A rule wins a tie with the op's own node (listed first): it was asked for.
    return max(reversed(usable), key=lambda vt: vt[0])[1]


def _attr_value(op: OpInfo, attrs: dict[str, Any], name: str):
    v = attrs.get(name)
    if v is None:
        spec = next(a for a in op.attributes if a["name"] == name)
        v = spec.get("default")
    return v


def _map_call(op: OpInfo, target: _Target, inputs: list[Any], attrs: dict[str, Any], is_none: Callable[[Any], bool]):
    """The op's call arguments as the target node's (inputs with None for empty slots, typed
    attributes {name: (kind, value)})."""
    by_name = {i["name"]: v for i, v in zip(op.inputs, inputs)}
    out_inputs = []
    for slot in target.inputs:
        v = by_name.get(slot["name"]) if slot["name"] else None
        if v is not None and is_none(v):
            v = None
        if v is not None and slot["when"] and not _attr_value(op, attrs, slot["when"]):
            v = None
        out_inputs.append(v)
    while out_inputs and out_inputs[-1] is None:  # omitted trailing inputs are simply left off
        out_inputs.pop()
    out_attrs: dict[str, tuple[str, Any]] = {}
    for a in target.attributes:
        if "value" in a:
            out_attrs[a["name"]] = (a["kind"], a["value"])
            continue
        values = [_attr_value(op, attrs, f) for f in a["from"]]
        if any(v is None for v in values):
            continue  # left to the target's default; the checker reports a missing required one
        if len(values) == 1:
            out_attrs[a["name"]] = (a["kind"], values[0])
        else:
            flat: list = []
            for v in values:
                flat += list(v) if isinstance(v, (list, tuple)) else [int(v) if isinstance(v, bool) else v]
            out_attrs[a["name"]] = (a["kind"], flat)
    return out_inputs, out_attrs


# ---- dynamo=True ------------------------------------------------------------------------------
def _typed_attr(name: str, kind: str, value):
    # Lists are typed explicitly: an empty Python list would otherwise become INTS.
    if kind == "float[]":
        return onnx_ir.AttrFloat32s(name, value)
    if kind == "int[]":
        return onnx_ir.AttrInt64s(name, value)
    return value


def _translation(op: OpInfo, options: ExportOptions) -> Callable:
    def translate(*args, **kwargs):
        target = choose_target(op, options)
        inputs, attrs = _split_args(op, args, dict(kwargs))
        inputs, onnx_attrs = _map_call(op, target, inputs, attrs, lambda v: v is None)
        version = target.version if target.domain else max(_STANDARD_OPSET_VERSION, options.opset)
        emit = getattr(onnxscript.values.Opset(target.domain, version), target.op_type)
        return emit(*inputs, **{k: _typed_attr(k, kind, onnx_attribute_value(kind, v)) for k, (kind, v) in onnx_attrs.items()})

    # The exporter matches the torch op's arguments to this signature.
    P = inspect.Parameter
    params = [P(i["name"], P.POSITIONAL_OR_KEYWORD, default=None if i["optional"] else P.empty) for i in op.inputs]
    params += [P(a["name"], P.POSITIONAL_OR_KEYWORD, default=a.get("default", P.empty)) for a in op.attributes]
    # Python forbids a required parameter after a defaulted one; such attributes get a None
    # default, and the ONNX checker reports them if really missing.
    seen_default = False
    for k, p in enumerate(params):
        seen_default |= p.default is not P.empty
        if seen_default and p.default is P.empty:
            params[k] = p.replace(default=None)
    translate.__signature__ = inspect.Signature(params)
    translate.__name__ = f"opbridge_{op.name}"
    translate.__qualname__ = translate.__name__
    return translate


def translation_table(ops: list[OpInfo] | None = None, *, opset: int = _DEFAULT_DYNAMO_OPSET,
                      custom_nodes: bool = False) -> dict[torch._ops.OpOverload, Callable]:
    """custom_translation_table entries for every loaded op (or the given ones) whose PyTorch op
    exists in this process, for a model of ai.onnx `opset` (rules are chosen by it: pass the
    opset_version given to torch.onnx.export). opbridge.export does all this, and also adds the
    FunctionProtos of function ops (add_functions) and runs the checker."""
    options = ExportOptions(opset, custom_nodes)
    return {op.overload: _translation(op, options) for op in (all_ops() if ops is None else ops) if op.available}


# ---- dynamo=False -----------------------------------------------------------------------------
_CONST_KIND = {"int": "i", "bool": "b", "float": "f", "str": "s", "int[]": "is", "float[]": "fs"}
_ATTR_SUFFIX = {"int": "i", "bool": "i", "float": "f", "str": "s", "int[]": "i", "float[]": "f"}


def _symbolic(op: OpInfo) -> Callable:
    from torch.onnx import symbolic_helper as sh

    n_out = len(op.outputs)

    def symbolic(g, *args):
        target = choose_target(op, ExportOptions(g.opset, _custom_nodes.get()))
        inputs, attrs = _split_args(op, args, {})
        consts = {}
        for a in op.attributes:
            v = attrs.get(a["name"])
            if isinstance(v, torch._C.Value):
                if sh._is_none(v):
                    continue
                v = sh._maybe_get_const(v, _CONST_KIND[a["kind"]])
                if isinstance(v, torch._C.Value):
                    raise OpbridgeError(f"{op.torch_op}: attribute '{a['name']}' must be a constant to export")
            if isinstance(v, torch.Tensor):
                v = v.tolist()
            if v is not None:
                consts[a["name"]] = v
        is_none = lambda v: v is None or sh._is_none(v)  # noqa: E731
        node_inputs, node_attrs = _map_call(op, target, inputs, consts, is_none)
        node_inputs = [_none_value(g) if v is None else v for v in node_inputs]
        kw = {f"{k}_{_ATTR_SUFFIX[kind]}": onnx_attribute_value(kind, v) for k, (kind, v) in node_attrs.items()}
        name = f"{target.domain}::{target.op_type}" if target.domain else target.op_type
        outs = g.op(name, *node_inputs, outputs=n_out, **kw)
        _set_output_types(op, [None if is_none(v) else v for v in inputs], consts, [outs] if n_out == 1 else list(outs))
        return outs

    return symbolic


def _none_value(g):
    # A None-typed value: the TorchScript exporter writes it as an empty input name.
    v = g.op("prim::Constant")
    v.setType(torch._C.NoneType.get())
    return v


# Stand in for dynamic dimensions when the Meta kernel types a TorchScript node: one value for
# all of them (a batch axis shared by several inputs must still broadcast), and a second run
# with another value tells which output dimensions depend on them.
_DYNAMIC_PLACEHOLDERS = (9973, 9967)


def _set_output_types(op: OpInfo, inputs: list, consts: dict, outs: list) -> None:
    """Types the node's outputs by running the op's Meta kernel (the spec's shape rule) on the
    traced input types (None: an absent optional input), so the TorchScript exporter's shape
    inference knows them. Output dimensions that follow a dynamic input dimension stay
    dynamic. Best effort: where the inputs are not fully typed the outputs stay untyped."""
    typed = [None if v is None else (v.type().varyingSizes(), v.type().dtype()) for v in inputs]
    if any(t is not None and (t[0] is None or t[1] is None) for t in typed):
        return
    try:
        runs = []
        for placeholder in _DYNAMIC_PLACEHOLDERS:
            metas = [None if t is None else
                     torch.empty([placeholder if d is None else d for d in t[0]], dtype=t[1], device="meta")
                     for t in typed]
            results = op.overload(*metas, **consts)
            runs.append([results] if isinstance(results, torch.Tensor) else list(results))
    except Exception:  # untypable here; the exporter copes without types
        return
    for value, r, r2 in zip(outs, *runs):
        sizes = [d if d == d2 else None for d, d2 in zip(r.shape, r2.shape)]
        value.setType(torch._C.TensorType.create_from_tensor(r).with_sizes(sizes))


def register_torchscript_symbolics(lib: Library) -> None:
    if not torchscript_exporter_available():
        return  # export(exporter="torchscript") says so in one line
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation notice, once per op
        for op in lib.ops:
            # One symbolic for every opset: registered at the exporter's base opset (9), which
            # its registry also serves to older targets. Below an op's lowest rule the
            # symbolic says which opset it needs.
            torch.onnx.register_custom_op_symbolic(op.torch_op, _symbolic(op), _TORCHSCRIPT_BASE_OPSET)


def custom_opsets() -> dict[str, int]:
    """The custom domain versions to tell the TorchScript exporter. It assumes version 1 for a
    domain it is not told about, and warns about every domain it is told about that the model
    does not use; so only versions above 1 are listed."""
    out: dict[str, int] = {}
    for op in all_ops():
        if op.has_own_node and op.since_version > 1:
            out[op.onnx_domain] = max(out.get(op.onnx_domain, 1), op.since_version)
    return out


# ---- ONNX functions ---------------------------------------------------------------------------
def function_proto(op: OpInfo, opset: int) -> "onnx.FunctionProto":
    """The FunctionProto of a function op, its body importing ai.onnx at `opset` (a model's
    functions must import the opsets the model imports)."""
    import onnx.parser

    if opset < op.function["opset"]:
        raise OpbridgeError(f"{op.torch_op}: its ONNX function needs ai.onnx opset >= {op.function['opset']}, "
                            f"the model imports {opset}")
    attrs = f"<{', '.join(a['name'] for a in op.attributes)}>" if op.attributes else ""
    text = (f'<domain: "{op.onnx_domain}", opset_import: ["" : {opset}]>\n'
            f"{op.onnx_type} {attrs} ({', '.join(i['name'] for i in op.inputs)}) => "
            f"({', '.join(o['name'] for o in op.outputs)})\n{{\n{op.function['body']}\n}}")
    try:
        return onnx.parser.parse_function(text)
    except Exception as e:  # a body that does not parse is the op author's error: say whose
        raise OpbridgeError(f"{op.torch_op}: its ONNX function body does not parse: {e}") from None


def _node_types(graph) -> set[tuple[str, str]]:
    found = set()
    for node in graph.node:
        found.add((node.domain, node.op_type))
        for a in node.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                found |= _node_types(g)
    return found


def add_functions(model) -> None:
    """Adds the FunctionProto of every function op the model uses (in place)."""
    used = _node_types(model.graph)
    have = {(f.domain, f.name) for f in model.functions}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    for op in all_ops():
        key = (op.onnx_domain, op.onnx_type)
        if op.export_kind != "function" or key not in used or key in have:
            continue
        model.functions.append(function_proto(op, opset))
        if not any(o.domain == op.onnx_domain for o in model.opset_import):
            model.opset_import.add(domain=op.onnx_domain, version=op.since_version)
