"""Standard nodes a runtime cannot read, written back as the opbridge op's own node.

An op's export rule may write it as a standard ai.onnx op (deformable convolution as DeformConv
from opset 19). A runtime that lacks that op (OpenVINO's ONNX frontend has no DeformConv) can
still run the model: each such node is turned back into the node of the op whose rule writes it,
by the rule read backwards — its inputs by the rule's input order, each attribute split back into
the op's attributes it was concatenated from (a repeated one must agree: symmetric pads), a
constant the rule writes checked, a flag the rule reads an input's presence from set from it. A
node the rule cannot have written is an OpbridgeError naming the node and why.
"""

from __future__ import annotations

import onnx
from onnx import helper

from .._library.errors import OpbridgeError
from .._library.manifest import ExportRule, OpInfo
from .._library.registry import libraries as loaded_libraries


def rule_for(op_type: str, opset: int) -> tuple[OpInfo, ExportRule] | None:
    """The op with its own node and a standard rule that writes `op_type` at `opset`."""
    for lib in loaded_libraries():
        for op in lib.ops:
            if op.export_kind != "kernel":
                continue
            for rule in op.export_rules:
                if rule.target == "standard" and rule.op_type == op_type and rule.min_opset <= opset:
                    return op, rule
    return None


def _split(node: onnx.NodeProto, op: OpInfo, name: str, value, sources: tuple[str, ...]) -> dict:
    """The op's attribute values that `sources` (concatenated) gave the node's `name`."""
    kinds = {a.name: a.kind for a in op.attributes}
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    lists = [s for s in sources if kinds[s].endswith("[]")]
    scalars = len(sources) - len(lists)
    per_list = (len(values) - scalars) // len(lists) if lists else 0
    if lists and per_list * len(lists) + scalars != len(values) or not lists and len(values) != scalars:
        raise OpbridgeError(f"{node.op_type} node '{node.name}': attribute '{name}' has {len(values)} values, "
                            f"which do not split into {op.qualified_name}'s {', '.join(sources)}")
    out, at = {}, 0
    for source in sources:
        n = per_list if source in lists else 1
        got = values[at:at + n] if source in lists else values[at]
        at += n
        if source in out and out[source] != got:
            raise OpbridgeError(f"{node.op_type} node '{node.name}': attribute '{name}' = {values} gives "
                                f"{op.qualified_name}'s '{source}' two values ({out[source]}, {got}), which it "
                                "cannot take")
        out[source] = got
    return out


def own_node(node: onnx.NodeProto, op: OpInfo, rule: ExportRule) -> onnx.NodeProto:
    """`node`, which `rule` of `op` could have written, as the op's own node."""
    given = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    attrs: dict = {}
    for mapped in rule.attributes:
        value = given.pop(mapped.name, None)
        if mapped.value is not None:
            if value is not None and value not in (mapped.value, str(mapped.value).encode()):
                raise OpbridgeError(f"{node.op_type} node '{node.name}': attribute '{mapped.name}' is {value!r}; "
                                    f"{op.qualified_name} computes only {mapped.value!r}")
            continue
        if value is None:
            raise OpbridgeError(f"{node.op_type} node '{node.name}' has no attribute '{mapped.name}': "
                                f"{op.qualified_name} needs it written out")
        attrs.update(_split(node, op, mapped.name, value, mapped.sources))
    if given:
        raise OpbridgeError(f"{node.op_type} node '{node.name}': attribute {', '.join(sorted(given))} has no "
                            f"counterpart in {op.qualified_name}")
    inputs = {}
    for k, slot in enumerate(rule.inputs):
        present = k < len(node.input) and node.input[k] != ""
        if slot.name and present:
            inputs[slot.name] = node.input[k]
        if slot.when:  # the op's flag that the input is there
            attrs[slot.when] = int(present)
    ordered = [inputs.get(i.name, "") for i in op.inputs]
    while ordered and ordered[-1] == "":
        ordered.pop()
    return helper.make_node(op.onnx_type, ordered, list(node.output), name=node.name, domain=op.onnx_domain,
                            **{k: (int(v) if isinstance(v, bool) else v) for k, v in attrs.items()})


def with_own_nodes(model: onnx.ModelProto, op_types: set[str]) -> onnx.ModelProto:
    """A copy of `model` whose ai.onnx nodes of `op_types` are opbridge ops' own nodes (those an
    op's rule writes; the others are left as they are)."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    domains = {}
    for k, node in enumerate(out.graph.node):
        found = rule_for(node.op_type, opset) if node.domain in ("", "ai.onnx") and node.op_type in op_types else None
        if found:
            op, rule = found
            out.graph.node[k].CopyFrom(own_node(node, op, rule))
            domains[op.onnx_domain] = op.library.onnx_domain_version
    for domain, version in domains.items():
        if not any(o.domain == domain for o in out.opset_import):
            out.opset_import.append(helper.make_opsetid(domain, version))
    return out
