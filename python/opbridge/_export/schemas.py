"""ONNX op schemas for a library's own nodes, generated from its manifest, so that onnx.checker
(full_check) and onnxscript know every custom node. Registered without Python shape-inference
callbacks, which have crashed upstream."""

from __future__ import annotations

from typing import Sequence

import onnx.reference.op_run  # noqa: F401 - before any registration, see register_schemas
from onnx import defs

from .._library.errors import OpbridgeError
from .._library.kinds import ATTR_KINDS, DTYPES
from .._library.manifest import AttributeInfo, ExportRule, Library, OpInfo


def _attribute(a: AttributeInfo) -> defs.OpSchema.Attribute:
    kind = ATTR_KINDS[a.kind]
    if a.has_default:
        return defs.OpSchema.Attribute(a.name, kind.attribute_proto(a.name, a.default), a.doc)
    # A symbolic attribute may come as the node's input instead: the runtime requires one of them.
    return defs.OpSchema.Attribute(a.name, kind.schema_type, a.doc, required=not a.symbolic)


def schema_for(op: OpInfo) -> defs.OpSchema:
    P = defs.OpSchema.FormalParameter
    opt = defs.OpSchema.FormalParameterOption
    inputs = [P(i.name, i.type, i.doc, param_option=opt.Optional if i.optional else opt.Single) for i in op.inputs]
    # A symbolic attribute computed in the graph (from input sizes) is an int64 scalar input after
    # the op's own, "<attribute>_value" (onnxscript wants input and attribute names apart).
    inputs += [P(f"{a.name}_value", "tensor(int64)", f"attribute {a.name} as a graph value (a scalar); else the attribute",
                 param_option=opt.Optional) for a in op.symbolic_attributes]
    outputs = [P(o.name, o.type, o.doc) for o in op.outputs]
    constraints = [(t.name, [DTYPES[d].onnx_type for d in t.dtypes], "") for t in op.types]
    return defs.OpSchema(
        op.onnx_type,
        op.onnx_domain,
        op.since_version,
        op.doc,
        inputs=inputs,
        outputs=outputs,
        type_constraints=constraints,
        attributes=[_attribute(a) for a in op.attributes],
    )


def node_schema_for(op: OpInfo, rule: ExportRule) -> defs.OpSchema:
    """A schema for another runtime's node that a rule writes (e.g. a com.microsoft contrib op,
    which the onnx package does not know), declared from the op's side of the mapping: the
    exporters need the node's output count, the checker its inputs and attributes. Every input
    and attribute is optional: the rule may leave some to the runtime's defaults."""
    P = defs.OpSchema.FormalParameter
    opt = defs.OpSchema.FormalParameterOption.Optional
    types = {i.name: i.type for i in op.inputs}
    inputs = [P(slot.name or f"input{k}", types.get(slot.name, _ANY), "", param_option=opt)
              for k, slot in enumerate(rule.inputs)]
    outputs = [P(o.name, o.type, o.doc) for o in op.outputs]
    constraints = [(t.name, [DTYPES[d].onnx_type for d in t.dtypes], "") for t in op.types]
    if any(not slot.name for slot in rule.inputs):
        constraints.append((_ANY, sorted({d.onnx_type for d in DTYPES.values()}), ""))
    attributes = [defs.OpSchema.Attribute(a.name, ATTR_KINDS[a.kind].schema_type, "", required=False)
                  for a in rule.attributes]
    return defs.OpSchema(rule.op_type, rule.domain, 1, f"{rule} as opbridge op {op.name} writes it",
                         inputs=inputs, outputs=outputs, type_constraints=constraints, attributes=attributes)


_ANY = "T_any"  # an input slot the rule leaves empty


def register_schemas(lib: Library) -> None:
    # onnx.reference (which onnxscript imports) builds its table of schemas once, when first
    # imported, and refuses two ops of one name in different domains (a custom function op named
    # like a standard op): it is imported above, before any custom schema exists.
    for op in lib.ops:
        if op.has_own_node and not defs.has(op.onnx_type, op.since_version, op.onnx_domain):
            defs.register_schema(schema_for(op))  # (unless registered by an earlier load in this process)
        for rule in op.export_rules:
            if rule.target == "node" and not defs.has(rule.op_type, rule.domain):
                defs.register_schema(node_schema_for(op, rule))


def declare_node(domain: str, op_type: str, *, inputs: Sequence[str], outputs: Sequence[str],
                 attributes: dict[str, str] | None = None, output_dtypes: dict[str, str] | None = None,
                 version: int = 1, doc: str = "") -> None:
    """Declares a node of a custom domain that your own translation writes (see
    opbridge.export's extra_translations), so that onnxscript can emit it and the ONNX checker
    knows it: its input names (a trailing "?" marks an optional one), output names, attributes
    {name: kind} with kinds "int", "float", "str", "int[]", "float[]" (none required), and the
    domain version. Inputs take any tensor type; an output has the first input's type unless
    output_dtypes fixes it ({"idx": "int64"}): the exporter types the graph from it. Declaring
    the same node again is a no-op."""
    if not domain or domain == "ai.onnx":
        raise OpbridgeError(f"declare_node: '{op_type}' needs a custom domain; standard ops have schemas already")
    if not inputs:
        raise OpbridgeError(f"declare_node {domain}::{op_type}: give at least one input")
    if defs.has(op_type, version, domain):
        return
    P = defs.OpSchema.FormalParameter
    opt = defs.OpSchema.FormalParameterOption
    everything = sorted({d.onnx_type for d in DTYPES.values()})
    params = [P(name.rstrip("?"), f"T{k}", "", param_option=opt.Optional if name.endswith("?") else opt.Single)
              for k, name in enumerate(inputs)]
    constraints = [(f"T{k}", everything, "") for k in range(len(inputs))]
    fixed = dict(output_dtypes or {})
    for name in outputs:
        dtype = fixed.pop(name, None)
        if dtype is None:
            params.append(P(name, "T0", ""))
            continue
        if dtype not in DTYPES:
            raise OpbridgeError(f"declare_node {domain}::{op_type}: output '{name}' has unknown dtype '{dtype}'; "
                                f"use one of {', '.join(DTYPES)}")
        params.append(P(name, f"T_{name}", ""))
        constraints.append((f"T_{name}", [DTYPES[dtype].onnx_type], ""))
    if fixed:
        raise OpbridgeError(f"declare_node {domain}::{op_type}: output_dtypes names {sorted(fixed)}, which are not "
                            "outputs")
    attrs = []
    for name, kind in (attributes or {}).items():
        if kind not in ATTR_KINDS or kind == "bool":
            raise OpbridgeError(f"declare_node {domain}::{op_type}: attribute '{name}' has kind '{kind}'; use one of "
                                "int, float, str, int[], float[]")
        attrs.append(defs.OpSchema.Attribute(name, ATTR_KINDS[kind].schema_type, "", required=False))
    defs.register_schema(defs.OpSchema(op_type, domain, version, doc or f"{domain}::{op_type}, declared with opbridge",
                                       inputs=params[:len(inputs)], outputs=params[len(inputs):],
                                       type_constraints=constraints, attributes=attrs))
