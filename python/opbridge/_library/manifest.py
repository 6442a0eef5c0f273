"""An op library and its ops as its manifest describes it: the JSON every opbridge library
exports (written by core/src/manifest.cc), read once into frozen dataclasses. Nothing else in the
package reads the JSON (files.read_manifest gets it from a library file)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from .errors import OpbridgeError
from .kinds import ATTR_KINDS, DTYPES
from .shapes import Check, ShapeRule, check_from_json, rule_from_json

EXPORT_KINDS = ("kernel", "function", "mapping")


@dataclasses.dataclass(frozen=True)
class TypeConstraint:
    name: str  # "T"
    dtypes: tuple[str, ...]  # dtype names (keys of _kinds.DTYPES), in the spec's order


@dataclasses.dataclass(frozen=True)
class InputInfo:
    name: str
    type: str  # the name of its type constraint
    optional: bool
    rank: int  # -1: any rank
    doc: str


@dataclasses.dataclass(frozen=True)
class AttributeInfo:
    name: str
    kind: str  # a key of _kinds.ATTR_KINDS: "int", "bool", "float", "str", "int[]", "float[]"
    doc: str
    has_default: bool
    default: Any = None  # lists as tuples; None without a default
    # An int that models compute from input sizes (FPS's npoint = N // 4): PyTorch types it SymInt,
    # and the exporters write a computed value as the node's input "<name>_value", after the op's
    # own inputs (see OpInfo.node_inputs).
    symbolic: bool = False

    @property
    def required(self) -> bool:
        return not self.has_default


@dataclasses.dataclass(frozen=True)
class OutputInfo:
    name: str
    type: str  # the name of its type constraint
    shape: ShapeRule
    data_dependent: bool  # some dimension only the kernel knows (allocated by the kernel)
    doc: str


@dataclasses.dataclass(frozen=True)
class RuleInput:
    name: str  # the op's input passed in this slot of the target node; "": an empty slot
    when: str = ""  # an attribute of the op that must be true for the input to be passed; "": always


@dataclasses.dataclass(frozen=True)
class RuleAttribute:
    name: str  # the target node's attribute
    kind: str
    sources: tuple[str, ...] = ()  # the op's attributes whose values, concatenated, give it
    value: Any = None  # a fixed value instead, where `sources` is empty

    @property
    def fixed(self) -> bool:
        return not self.sources


RULE_TARGETS = ("standard", "opbridge_op", "node")


@dataclasses.dataclass(frozen=True)
class ExportRule:
    """From ai.onnx opset `min_opset` on, the op may be written as a node `op_type` of `domain`,
    its inputs and attributes mapped from the op's by name. The target is a standard ai.onnx op,
    the own node of an opbridge op ("opbridge_op": `opbridge_op` names it, and its domain and type
    stay empty until resolved against the loaded libraries, rules.resolve), or a node of another
    domain that some runtime implements ("node", e.g. com.microsoft contrib ops)."""

    domain: str  # "": a standard ai.onnx op (or an unresolved opbridge op)
    op_type: str
    min_opset: int
    inputs: tuple[RuleInput, ...]
    attributes: tuple[RuleAttribute, ...]
    target: str = "standard"  # one of RULE_TARGETS
    opbridge_op: str = ""  # "opbridge_op": the op whose own node is written, "<namespace>::<op>"
    # Type constraint -> the dtypes the target takes for it in the runtime; absent: all.
    target_types: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Why the target is written only for portable models (much slower in ONNX Runtime than the
    # op's own kernel); "": always.
    portable_only: str = ""

    @property
    def standard(self) -> bool:
        """Whether the target is a standard ai.onnx op."""
        return self.target == "standard"

    @property
    def opbridge(self) -> bool:
        """Whether the target is the own node of an opbridge op (run by an opbridge library)."""
        return self.target == "opbridge_op"

    @property
    def resolved(self) -> bool:
        return bool(self.op_type)

    def takes(self, dtypes: dict[str, str | None]) -> bool:
        """Whether the target takes these dtypes (type constraint -> dtype name; None: unknown,
        assumed taken)."""
        return all(dtypes.get(t) is None or dtypes[t] in allowed for t, allowed in self.target_types)

    def __str__(self) -> str:
        if self.standard:
            return f"ai.onnx {self.op_type}"
        return f"{self.domain}::{self.op_type}" if self.resolved else f"opbridge op {self.opbridge_op}"

    def to_json(self) -> dict[str, Any]:
        """The rule as the manifest spells it (for tools that print JSON)."""
        attrs = [{"name": a.name, "kind": a.kind, **({"value": a.value} if a.fixed else {"from": list(a.sources)})}
                 for a in self.attributes]
        j = {"target": self.target, "domain": self.domain, "op_type": self.op_type, "min_opset": self.min_opset,
             "inputs": [{"name": i.name, "when": i.when} for i in self.inputs], "attributes": attrs,
             "target_types": {t: list(d) for t, d in self.target_types}, "portable_only": self.portable_only}
        if self.opbridge_op:
            j["opbridge_op"] = self.opbridge_op
        return j


@dataclasses.dataclass(frozen=True)
class OnnxFunction:
    opset: int  # the lowest ai.onnx opset the body needs
    body: str  # the function's nodes in ONNX textual syntax


@dataclasses.dataclass(frozen=True)
class PythonOperator:
    """A Python-level operator that model code calls in the op's place (an autograd.Function, a
    function, a method), which substitution routes to the op."""

    target: str  # "package.module.Name" or "package.module.Class.method"
    params: tuple[str, ...]  # per parameter of the target (no ctx or self): the op's input or attribute, or ""
    fixed: tuple[tuple[str, Any], ...]  # attributes the target's semantics fix
    returns: tuple[str, ...] = ()  # the op's outputs the target returns (one: that tensor alone); (): all

    def call(self, op: OpInfo, fn, inputs: list, attrs: dict):
        """fn(*inputs, **attrs), the op, as the target returns it: a single int for a list attribute
        repeated to its default's length (as torch's _pair(7) is (7, 7)); the outputs in `returns`."""
        for a in op.attributes:
            if a.kind == "int[]" and isinstance(attrs.get(a.name), int) and a.default:
                attrs[a.name] = [attrs[a.name]] * len(a.default)
        out = fn(*inputs, **attrs)
        if not self.returns:
            return out
        picked = tuple(out[[o.name for o in op.outputs].index(r)] for r in self.returns)
        return picked[0] if len(picked) == 1 else picked


@dataclasses.dataclass(frozen=True)
class OpInfo:
    """One op of a library, as its manifest describes it."""

    library: Library = dataclasses.field(repr=False, compare=False)
    name: str
    qualified_name: str  # the PyTorch op: "<namespace>::<name>", or an existing one such as "aten::relu"
    defines_torch_op: bool  # False: the op only adds export rules to an existing PyTorch op
    doc: str
    # "kernel": its own node, run by the library's kernel; "function": its own node, defined by
    # an ONNX function; "mapping": no node of its own, export rules only.
    export_kind: str
    onnx_domain: str  # its own node: the domain (the library's unless the op names one), type and version
    onnx_type: str
    since_version: int
    export_rules: tuple[ExportRule, ...]  # by ascending min_opset
    function: OnnxFunction | None  # for export_kind "function"
    types: tuple[TypeConstraint, ...]
    inputs: tuple[InputInfo, ...]
    attributes: tuple[AttributeInfo, ...]
    outputs: tuple[OutputInfo, ...]
    checks: tuple[Check, ...]  # the spec's dimension checks
    backward: str = ""  # the op of the library that computes the gradient; "": none
    # The validation-only op the torch adapter defines beside an op with a data-dependent output
    # (its fake kernel calls it first); "": none.
    check_op: str = ""
    replaces: tuple[PythonOperator, ...] = ()
    # A bool attribute that, when true, makes the outputs random: two calls on the same inputs
    # need not agree, so tools compare only their dtypes and shapes. "": never random.
    random_when: str = ""

    def type_constraint(self, name: str) -> TypeConstraint:
        return _named(self.types, name, f"{self.qualified_name} has no type constraint")

    def attribute(self, name: str) -> AttributeInfo:
        return _named(self.attributes, name, f"{self.qualified_name} has no attribute")

    @property
    def symbolic_attributes(self) -> tuple[AttributeInfo, ...]:
        """The attributes a node may give as inputs instead: the node's inputs after the op's own,
        in this order (AttributeInfo.symbolic)."""
        return tuple(a for a in self.attributes if a.symbolic)

    @property
    def node_inputs(self) -> int:
        """How many inputs the op's own node may have: its inputs, then one per symbolic attribute."""
        return len(self.inputs) + len(self.symbolic_attributes)

    def random_with(self, attrs: dict[str, Any]) -> str:
        """Why the op's outputs are random with these attribute values (the declared attribute is
        true, given or by default), e.g. "<op> with random_start=1";
        "" when they are not."""
        if not self.random_when:
            return ""
        a = self.attribute(self.random_when)
        on = attrs[a.name] if a.name in attrs else a.default
        return f"{self.name} with {a.name}=1" if on else ""

    @property
    def has_own_node(self) -> bool:
        """Exported (at some opset) as a node of the library's domain: a kernel or a function."""
        return self.export_kind in ("kernel", "function")

    @property
    def data_dependent(self) -> bool:
        """Whether an output's size depends on input values (the fake kernel is Python's)."""
        return any(o.data_dependent for o in self.outputs)

    def output_dtypes(self, input_dtypes: list[str | None]) -> list[str | None]:
        """Each output's dtype for inputs of these dtypes (None: absent or unknown): a type
        constraint takes the dtype of its first input that has one, or its only dtype; else
        None (unknown)."""
        bound: dict[str, str] = {}
        for spec, d in zip(self.inputs, input_dtypes):
            if d is not None:
                bound.setdefault(spec.type, d)
        out = []
        for o in self.outputs:
            allowed = self.type_constraint(o.type).dtypes
            out.append(bound.get(o.type, allowed[0] if len(allowed) == 1 else None))
        return out

    @property
    def overload(self):
        """The PyTorch op (torch.ops.<namespace>.<name>.default)."""
        import torch

        ns, name = self.qualified_name.split("::")
        return getattr(getattr(torch.ops, ns), name).default

    @property
    def available(self) -> bool:
        """Whether PyTorch has the op now (a mapped op of another library, e.g. torchvision's,
        exists only once that library is imported)."""
        import torch

        ns, name = self.qualified_name.split("::")
        try:
            return hasattr(getattr(torch.ops, ns), name)
        except (AttributeError, RuntimeError):
            return False


@dataclasses.dataclass(frozen=True)
class Library:
    name: str
    torch_namespace: str
    onnx_domain: str
    onnx_domain_version: int
    torch_path: Path | None  # None: PyTorch's side is not loaded (read from the ONNX Runtime side)
    ort_path: Path | None  # None: loaded without its ONNX Runtime side
    ops: tuple[OpInfo, ...] = ()

    def op(self, name: str) -> OpInfo:
        return _named(self.ops, name, f"library '{self.name}' has no op")

    @property
    def openvino_path(self) -> Path | None:  # lib<name>_ov.so beside the others, where the build found OpenVINO
        found = [p.with_name(p.name.rsplit("_", 1)[0] + "_ov.so") for p in (self.ort_path, self.torch_path) if p]
        return next((p for p in found if p.is_file()), None)

    @property
    def domains(self) -> set[str]:
        """The ONNX domains the library registers in ONNX Runtime: its own, and those its ops
        name for their own nodes."""
        return {self.onnx_domain} | {op.onnx_domain for op in self.ops if op.export_kind == "kernel"}


def _named(items, name: str, missing: str):
    for item in items:
        if item.name == name:
            return item
    raise OpbridgeError(f"{missing} '{name}'")


def from_json(m: dict[str, Any], torch_path: Path | None, ort_path: Path | None) -> Library:
    """The library a manifest describes; OpbridgeError for definitions the library refused."""
    if m["errors"]:
        name = (torch_path or ort_path).name if (torch_path or ort_path) else m["library"]
        raise OpbridgeError(f"{name}: invalid op definitions: " + "; ".join(m["errors"]))
    lib = Library(m["library"], m["torch_namespace"], m["onnx_domain"], m["onnx_domain_version"], torch_path, ort_path)
    ops = [_op(lib, op) for op in m["ops"]]
    # A rule that writes an op of this library names its node now (rules.check_library_rules
    # checks that it fits); one of another library stays unresolved until that one is loaded.
    own = {op.qualified_name: op for op in ops if op.has_own_node}
    for k, op in enumerate(ops):
        rules = tuple(dataclasses.replace(r, domain=own[r.opbridge_op].onnx_domain, op_type=own[r.opbridge_op].onnx_type)
                      if r.opbridge and r.opbridge_op in own else r for r in op.export_rules)
        ops[k] = dataclasses.replace(op, export_rules=rules)
    # An op refers to its library: the one place a frozen Library gets its ops after creation.
    object.__setattr__(lib, "ops", tuple(ops))
    return lib


def _frozen(value):
    return tuple(value) if isinstance(value, list) else value


def _known(kind: str, known, what: str, op: str) -> str:
    if kind not in known:
        raise OpbridgeError(f"op '{op}': the manifest names {what} '{kind}', which this opbridge does not know")
    return kind


def _type(t: dict, op: str) -> TypeConstraint:
    dtypes = tuple(_known(d, DTYPES, "dtype", op) for d in t["dtypes"])
    if [DTYPES[d].onnx_type for d in dtypes] != t["onnx"]:
        raise OpbridgeError(f"op '{op}': the manifest spells {t['dtypes']} as {t['onnx']} in ONNX; opbridge's "
                            "dtype table disagrees")
    return TypeConstraint(t["name"], dtypes)


def _attribute(a: dict, op: str) -> AttributeInfo:
    symbolic = bool(a.get("symbolic", False))  # absent from libraries built before it
    if symbolic and a["kind"] != "int":
        raise OpbridgeError(f"op '{op}': the manifest marks attribute '{a['name']}' ({a['kind']}) symbolic; only an "
                            "int can be")
    return AttributeInfo(a["name"], _known(a["kind"], ATTR_KINDS, "attribute kind", op), a["doc"], "default" in a,
                         _frozen(a.get("default")), symbolic)


def _output(o: dict) -> OutputInfo:
    return OutputInfo(o["name"], o["type"], rule_from_json(o["shape"]), o["data_dependent"], o["doc"])


def _rule_attribute(a: dict) -> RuleAttribute:
    if "value" in a:
        return RuleAttribute(a["name"], a["kind"], value=_frozen(a["value"]))
    return RuleAttribute(a["name"], a["kind"], sources=tuple(a["from"]))


def _rule(r: dict, op: str) -> ExportRule:
    types = tuple((t, tuple(_known(d, DTYPES, "dtype", op) for d in ds)) for t, ds in r["target_types"].items())
    return ExportRule(r["domain"], r["op_type"], r["min_opset"], tuple(RuleInput(i["name"], i["when"]) for i in r["inputs"]),
                      tuple(_rule_attribute(a) for a in r["attributes"]),
                      _known(r["target"], RULE_TARGETS, "export rule target", op), r.get("opbridge_op", ""), types,
                      r["portable_only"])


def _random_when(m: dict) -> str:
    name = m.get("random_when", "")  # absent from libraries built before it
    if name and not any(a["name"] == name and a["kind"] == "bool" for a in m["attributes"]):
        raise OpbridgeError(f"op '{m['name']}': the manifest's random_when names '{name}', which is not a bool "
                            "attribute of the op")
    return name


def _op(lib: Library, m: dict) -> OpInfo:
    ex = m["export"]
    fn = ex.get("function")
    return OpInfo(
        library=lib,
        name=m["name"],
        qualified_name=m["qualified_name"],
        defines_torch_op=m["defines_torch_op"],
        doc=m["doc"],
        export_kind=_known(ex["kind"], EXPORT_KINDS, "export kind", m["name"]),
        onnx_domain=ex["domain"],
        onnx_type=ex["op_type"],
        since_version=ex["since_version"],
        export_rules=tuple(_rule(r, m["name"]) for r in ex["rules"]),
        function=OnnxFunction(fn["opset"], fn["body"]) if fn else None,
        types=tuple(_type(t, m["name"]) for t in m["types"]),
        inputs=tuple(InputInfo(i["name"], i["type"], i["optional"], i["rank"], i["doc"]) for i in m["inputs"]),
        attributes=tuple(_attribute(a, m["name"]) for a in m["attributes"]),
        outputs=tuple(_output(o) for o in m["outputs"]),
        checks=tuple(check_from_json(c) for c in m["checks"]),
        backward=m["backward"],
        check_op=m["check_op"],
        random_when=_random_when(m),
        replaces=tuple(PythonOperator(p["target"], tuple(p["params"]),
                                      tuple((k, _frozen(v)) for k, v in p["fixed"].items()),
                                      tuple(p.get("returns", ())))
                       for p in m.get("replaces", ())),  # absent from libraries built before it
    )
