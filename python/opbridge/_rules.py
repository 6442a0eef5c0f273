"""Which node writes an op at a target opset, and how the op's call arguments map onto that
node's inputs and attributes. Shared by both exporters; nothing here names an op."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ._errors import OpbridgeError
from ._manifest import ExportRule, OpInfo, RuleAttribute, RuleInput


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """What one export call asks for: the target ai.onnx opset, and whether ops with a kernel
    keep their own custom node even where a standard op could be written (for runtimes without
    that standard op)."""

    opset: int
    custom_nodes: bool = False


def own_node(op: OpInfo) -> ExportRule:
    """The op's own node of the library's domain, as a rule mapping everything by name (its
    min_opset: 1 for a kernel, the opset its body needs for a function)."""
    return ExportRule(op.onnx_domain, op.onnx_type, op.function.opset if op.function else 1,
                      tuple(RuleInput(i.name) for i in op.inputs),
                      tuple(RuleAttribute(a.name, a.kind, sources=(a.name,)) for a in op.attributes))


def choose_target(op: OpInfo, options: ExportOptions) -> ExportRule:
    """Which node writes `op` at this opset: the applicable rule with the highest min_opset, the
    op's own node (a kernel: from opset 1; a function: from the opset its body needs) counting
    as a rule. With custom_nodes, opbridge's own nodes win over standard ai.onnx ops wherever
    the op has one at this opset."""
    candidates = ([own_node(op)] if op.has_own_node else []) + list(op.export_rules)
    usable = [r for r in candidates if r.min_opset <= options.opset]
    if options.custom_nodes and any(not r.standard for r in usable):
        usable = [r for r in usable if not r.standard]
    if not usable:
        lowest = min(r.min_opset for r in candidates)
        what = ", ".join(f"{r} from opset {r.min_opset}" for r in candidates)
        raise OpbridgeError(f"{op.qualified_name}: cannot be exported at opset {options.opset}: it is written as "
                            f"{what}; export with opset >= {lowest}")
    # A rule wins a tie with the op's own node (listed first): it was asked for.
    return max(reversed(usable), key=lambda r: r.min_opset)


def split_args(op: OpInfo, args: tuple, kwargs: dict) -> tuple[list[Any], dict[str, Any]]:
    """Positional/keyword call arguments -> (the op's inputs, the op's attributes by name)."""
    n_in = len(op.inputs)
    inputs = list(args[:n_in])
    inputs += [kwargs.pop(i.name, None) for i in op.inputs[len(inputs):]]
    attrs = {a.name: v for a, v in zip(op.attributes, args[n_in:])}
    attrs.update(kwargs)
    return inputs, attrs


def attribute_value(op: OpInfo, attrs: dict[str, Any], name: str):
    """The value given for attribute `name`, else its default (None: neither)."""
    v = attrs.get(name)
    return op.attribute(name).default if v is None else v


def map_call(op: OpInfo, target: ExportRule, inputs: list[Any], attrs: dict[str, Any],
             is_none: Callable[[Any], bool]) -> tuple[list[Any], dict[str, tuple[str, Any]]]:
    """The op's call arguments as the target node's: inputs with None for empty slots, and
    attributes {name: (kind, value)}."""
    by_name = {i.name: v for i, v in zip(op.inputs, inputs)}
    out_inputs = []
    for slot in target.inputs:
        v = by_name.get(slot.name) if slot.name else None
        if v is not None and is_none(v):
            v = None
        if v is not None and slot.when and not attribute_value(op, attrs, slot.when):
            v = None
        out_inputs.append(v)
    while out_inputs and out_inputs[-1] is None:  # omitted trailing inputs are simply left off
        out_inputs.pop()
    out_attrs: dict[str, tuple[str, Any]] = {}
    for a in target.attributes:
        if a.fixed:
            out_attrs[a.name] = (a.kind, a.value)
            continue
        values = [attribute_value(op, attrs, f) for f in a.sources]
        if any(v is None for v in values):
            continue  # left to the target's default; the checker reports a missing required one
        if len(values) == 1:
            out_attrs[a.name] = (a.kind, values[0])
        else:
            flat: list = []
            for v in values:
                flat += list(v) if isinstance(v, (list, tuple)) else [int(v) if isinstance(v, bool) else v]
            out_attrs[a.name] = (a.kind, flat)
    return out_inputs, out_attrs
