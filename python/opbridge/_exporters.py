"""Export rules for both PyTorch exporters, generated from the manifests. Nothing here names an
op: every rule is built from an OpInfo.

- dynamo=True: a translation function per op for `custom_translation_table`, emitting the op's
  ONNX node through onnxscript (the schema registered by _schemas gives it the output count).
- dynamo=False (TorchScript, deprecated upstream): a symbolic function per op registered with
  `torch.onnx.register_custom_op_symbolic`, plus `custom_opsets` for the custom domains.
"""

from __future__ import annotations

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


def _trim_optional(op: OpInfo, inputs: list[Any], is_none: Callable[[Any], bool]) -> list[Any]:
    # An omitted optional input is exported as an omitted trailing input, never a dangling name.
    while inputs and is_none(inputs[-1]):
        inputs.pop()
    for spec, v in zip(op.inputs, inputs):
        if is_none(v):
            raise OpbridgeError(
                f"{op.torch_op}: optional input '{spec['name']}' is omitted but a later input is given; "
                "ONNX export supports omitting trailing optional inputs only"
            )
    return inputs


# ---- dynamo=True ------------------------------------------------------------------------------
def _typed_attr(name: str, kind: str, value):
    # Lists are typed explicitly: an empty Python list would otherwise become INTS.
    if kind == "float[]":
        return onnx_ir.AttrFloat32s(name, value)
    if kind == "int[]":
        return onnx_ir.AttrInt64s(name, value)
    return value


def _translation(op: OpInfo) -> Callable:
    if op.export_kind == "custom":
        opset = onnxscript.values.Opset(op.onnx_domain, op.since_version)
    else:
        opset = onnxscript.values.Opset("", _STANDARD_OPSET_VERSION)
    emit = getattr(opset, op.onnx_type)
    kinds = op.attr_kinds

    def translate(*args, **kwargs):
        inputs, attrs = _split_args(op, args, dict(kwargs))
        inputs = _trim_optional(op, inputs, lambda v: v is None)
        onnx_attrs = {k: _typed_attr(k, kinds[k], onnx_attribute_value(kinds[k], v)) for k, v in attrs.items()
                      if v is not None}
        return emit(*inputs, **onnx_attrs)

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


def translation_table(ops: list[OpInfo] | None = None) -> dict[torch._ops.OpOverload, Callable]:
    """custom_translation_table entries for every loaded op (or the given ones)."""
    return {op.overload: _translation(op) for op in (all_ops() if ops is None else ops)}


# ---- dynamo=False -----------------------------------------------------------------------------
_CONST_KIND = {"int": "i", "bool": "b", "float": "f", "str": "s", "int[]": "is", "float[]": "fs"}
_ATTR_SUFFIX = {"int": "i", "bool": "i", "float": "f", "str": "s", "int[]": "i", "float[]": "f"}


def _symbolic(op: OpInfo) -> Callable:
    from torch.onnx import symbolic_helper as sh

    node = f"{op.onnx_domain}::{op.onnx_type}" if op.export_kind == "custom" else op.onnx_type
    n_out = len(op.outputs)

    def symbolic(g, *args):
        inputs, attrs = _split_args(op, args, {})
        inputs = _trim_optional(op, inputs, lambda v: v is None or sh._is_none(v))
        kw = {}
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
                kw[f"{a['name']}_{_ATTR_SUFFIX[a['kind']]}"] = onnx_attribute_value(a["kind"], v)
        outs = g.op(node, *inputs, outputs=n_out, **kw)
        _set_output_types(op, inputs, attrs, [outs] if n_out == 1 else list(outs))
        return outs

    return symbolic


# Stand in for dynamic dimensions when the Meta kernel types a TorchScript node: one value for
# all of them (a batch axis shared by several inputs must still broadcast), and a second run
# with another value tells which output dimensions depend on them.
_DYNAMIC_PLACEHOLDERS = (9973, 9967)


def _set_output_types(op: OpInfo, inputs: list, attrs: dict, outs: list) -> None:
    """Types the node's outputs by running the op's Meta kernel (the spec's shape rule) on the
    traced input types, so the TorchScript exporter's shape inference knows them. Output
    dimensions that follow a dynamic input dimension stay dynamic. Best effort: where the
    inputs are not fully typed the outputs stay untyped, as before."""
    from torch.onnx import symbolic_helper as sh

    typed = [(v.type().varyingSizes(), v.type().dtype()) for v in inputs]
    if any(sizes is None or dtype is None for sizes, dtype in typed):
        return
    try:
        consts = {}
        for a in op.attributes:
            v = attrs.get(a["name"])
            if isinstance(v, torch._C.Value):
                v = None if sh._is_none(v) else sh._maybe_get_const(v, _CONST_KIND[a["kind"]])
            if v is not None:
                consts[a["name"]] = v
        runs = []
        for placeholder in _DYNAMIC_PLACEHOLDERS:
            metas = [torch.empty([placeholder if d is None else d for d in sizes], dtype=dtype, device="meta")
                     for sizes, dtype in typed]
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
            opset = op.since_version if op.export_kind == "standard" else 1
            torch.onnx.register_custom_op_symbolic(op.torch_op, _symbolic(op), opset)


def custom_opsets() -> dict[str, int]:
    """The custom domain versions to tell the TorchScript exporter. It assumes version 1 for a
    domain it is not told about, and warns about every domain it is told about that the model
    does not use; so only versions above 1 are listed."""
    out: dict[str, int] = {}
    for op in all_ops():
        if op.export_kind == "custom" and op.since_version > 1:
            out[op.onnx_domain] = max(out.get(op.onnx_domain, 1), op.since_version)
    return out
