"""Which node writes an op at a target opset, and how the op's call arguments map onto that
node's inputs and attributes. Shared by both exporters; nothing here names an op."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from .._library.errors import OpbridgeError
from .._library.manifest import ExportRule, OpInfo, RuleAttribute, RuleInput
from .._library.registry import all_ops


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """What one export call asks for: the target ai.onnx opset; whether ops with a kernel keep
    opbridge's own nodes even where a standard op or another runtime's node could be written (for
    runtimes without that op); whether the model should be portable (standard ops even where
    they run much slower in ONNX Runtime than opbridge's kernel, so no opbridge library is
    needed for them)."""

    opset: int
    custom_nodes: bool = False
    portable: bool = False

    def __post_init__(self):
        if self.custom_nodes and self.portable:
            raise OpbridgeError("custom_nodes=True keeps opbridge's own nodes and portable=True asks for standard "
                                "ops instead: choose one")


def own_node(op: OpInfo) -> ExportRule:
    """The op's own node, as a rule mapping everything by name (its min_opset: 1 for a kernel,
    the opset its body needs for a function)."""
    return ExportRule(op.onnx_domain, op.onnx_type, op.function.opset if op.function else 1,
                      tuple(RuleInput(i.name) for i in op.inputs),
                      tuple(RuleAttribute(a.name, a.kind, sources=(a.name,)) for a in op.attributes),
                      target="opbridge_op", opbridge_op=op.qualified_name)


def resolve(op: OpInfo, rule: ExportRule) -> ExportRule:
    """A rule whose target is an opbridge op of another library, with that op's node filled in
    from the loaded libraries (a library's own ops' nodes are filled in when it is read); other
    rules as they are."""
    if rule.resolved:
        return rule
    target = next((o for o in all_ops() if o.qualified_name == rule.opbridge_op and o.defines_torch_op), None)
    if target is None:
        ns = rule.opbridge_op.split("::")[0]
        raise OpbridgeError(f"{_where(op, rule)}: no loaded op library defines it; load the library with torch "
                            f"namespace '{ns}' first (opbridge.load_library)")
    fit(op, rule, target)
    return dataclasses.replace(rule, domain=target.onnx_domain, op_type=target.onnx_type)


def _where(op: OpInfo, rule: ExportRule) -> str:
    return f"{op.qualified_name}: export rule to opbridge op {rule.opbridge_op}"


def fit(op: OpInfo, rule: ExportRule, target: OpInfo) -> None:
    """The target op takes what the rule writes: it has a node of its own, room for the inputs
    written, and every attribute written, of the same kind."""
    where = _where(op, rule)
    if target.export_kind != "kernel":
        raise OpbridgeError(f"{where}: that op has no kernel, so no node of its own")
    if len(rule.inputs) > len(target.inputs):
        raise OpbridgeError(f"{where}: writes {len(rule.inputs)} inputs; the op has {len(target.inputs)}")
    kinds = {a.name: a.kind for a in target.attributes}
    for a in rule.attributes:
        if kinds.get(a.name) != a.kind:
            have = f"is {kinds[a.name]}" if a.name in kinds else "does not exist"
            raise OpbridgeError(f"{where}: attribute '{a.name}' {have}, the rule writes {a.kind}")


def check_library_rules(lib) -> None:
    """Every rule of the library that writes one of its own ops' nodes names an op it defines,
    which fits the rule (rules to other libraries' ops are checked at export, once those load)."""
    problems = []
    for op in lib.ops:
        for rule in op.export_rules:
            if not rule.opbridge or rule.opbridge_op.split("::")[0] != lib.torch_namespace:
                continue
            target = next((o for o in lib.ops if o.qualified_name == rule.opbridge_op), None)
            try:
                if target is None:
                    raise OpbridgeError(f"{_where(op, rule)}: this library does not define it")
                fit(op, rule, target)
            except OpbridgeError as e:
                problems.append(str(e))
    if problems:
        raise OpbridgeError(f"{lib.name}: invalid export rules: " + "; ".join(problems))


def choose_target(op: OpInfo, options: ExportOptions, dtypes: dict[str, str | None] | None = None) -> ExportRule:
    """Which node writes `op` at this opset for these input dtypes (type constraint -> dtype
    name; None or absent: unknown): the applicable rule with the highest min_opset whose target
    takes the dtypes, the op's own node counting as a rule from opset 1 (a function: from the
    opset its body needs). With custom_nodes, opbridge's own nodes win over standard ai.onnx ops
    and other runtimes' nodes wherever the op has one at this opset. Rules marked portable_only
    (a target much slower in ONNX Runtime than the op's kernel) apply only to portable exports,
    unless nothing else can write the op."""
    dtypes = dtypes or {}
    candidates = ([own_node(op)] if op.has_own_node else []) + list(op.export_rules)
    usable = [r for r in candidates if r.min_opset <= options.opset]
    if options.custom_nodes and any(r.opbridge for r in usable):
        usable = [r for r in usable if r.opbridge]
    taken = [r for r in usable if r.takes(dtypes)]
    if not options.portable and any(not r.portable_only for r in taken):
        taken = [r for r in taken if not r.portable_only]  # the faster own node, for ONNX Runtime
    if not taken:
        lowest = min(r.min_opset for r in candidates)
        what = ", ".join(f"{r} from opset {r.min_opset}" + _types_note(r) for r in candidates)
        given = ", ".join(f"{t}={d}" for t, d in dtypes.items() if d)
        fix = f"export with opset >= {lowest}" if not usable else "cast the inputs to a dtype the target takes"
        raise OpbridgeError(f"{op.qualified_name}: cannot be exported at opset {options.opset}"
                            + (f" with {given}" if given and usable else "") + f": it is written as {what}; {fix}")
    # A rule wins a tie with the op's own node (listed first): it was asked for.
    return resolve(op, max(reversed(taken), key=lambda r: r.min_opset))


def domain_version(rule: ExportRule) -> int:
    """The domain version a node of this (resolved, non-standard) target is written with: the
    opbridge op's own version, 1 for another runtime's node."""
    if rule.opbridge:
        for o in all_ops():
            if o.has_own_node and (o.onnx_domain, o.onnx_type) == (rule.domain, rule.op_type):
                return o.since_version
    return 1


def _types_note(rule: ExportRule) -> str:
    return "".join(f" ({t} in {{{', '.join(ds)}}})" for t, ds in rule.target_types)


def input_dtypes(op: OpInfo, dtypes: list[str | None]) -> dict[str, str | None]:
    """The dtype each type constraint binds to, from the dtypes of the op's inputs in order
    (None: absent or unknown)."""
    out: dict[str, str | None] = {}
    for spec, d in zip(op.inputs, dtypes):
        if d is not None and out.get(spec.type) is None:
            out[spec.type] = d
    return out


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
             is_none: Callable[[Any], bool],
             is_graph_value: Callable[[Any], bool] | None = None) -> tuple[list[Any], dict[str, tuple[str, Any]]]:
    """The op's call arguments as the target node's: inputs with None for empty slots, and
    attributes {name: (kind, value)}. An attribute value the graph computes (is_graph_value: a
    size the exporter traced) becomes the target's input for that attribute, after its own
    inputs, where the target's op declares the attribute symbolic; elsewhere the export is refused,
    since a constant would hold the example's value at every size."""
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
    computed: dict[str, Any] = {}
    for a in target.attributes:
        if a.fixed:
            out_attrs[a.name] = (a.kind, a.value)
            continue
        values = [attribute_value(op, attrs, f) for f in a.sources]
        if is_graph_value is not None and any(v is not None and is_graph_value(v) for v in values):
            computed[a.name] = _computed_input(op, target, a, values)
            continue
        if any(v is None for v in values):
            continue  # left to the target's default; the checker reports a missing required one
        if len(values) == 1:
            out_attrs[a.name] = (a.kind, values[0])
        else:
            flat: list = []
            for v in values:
                flat += list(v) if isinstance(v, (list, tuple)) else [int(v) if isinstance(v, bool) else v]
            out_attrs[a.name] = (a.kind, flat)
    if computed:
        node_op = _target_op(op, target)
        out_inputs += [None] * (len(node_op.inputs) - len(out_inputs))
        out_inputs += [computed.get(a.name) for a in node_op.symbolic_attributes]
        while out_inputs and out_inputs[-1] is None:
            out_inputs.pop()
    return out_inputs, out_attrs


def _target_op(op: OpInfo, target: ExportRule) -> OpInfo | None:
    """The opbridge op whose own node the target is (None: a standard op or another runtime's node)."""
    if not target.opbridge:
        return None
    if target.opbridge_op == op.qualified_name:
        return op
    return next((o for o in all_ops() if o.qualified_name == target.opbridge_op and o.defines_torch_op), None)


def _computed_input(op: OpInfo, target: ExportRule, a: RuleAttribute, values: list) -> Any:
    """The graph value that gives target attribute `a`, or the refusal naming why it cannot."""
    node_op = _target_op(op, target)
    sources = ", ".join(f"'{s}'" for s in a.sources)
    if node_op is None or len(values) != 1 or not any(s.name == a.name for s in node_op.symbolic_attributes):
        raise OpbridgeError(
            f"{op.qualified_name}: attribute {sources} is computed in the graph (from an input's size, e.g. a "
            f"dynamic axis) but {target} takes '{a.name}' only as a constant attribute, which would hold the "
            "example's value at every size. Compute it from constants, keep that axis static, or declare the "
            "attribute with .sym_int_attr() in an op whose own node is written (docs/authoring.md)")
    return values[0]
