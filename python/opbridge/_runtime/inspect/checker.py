"""Who runs a node: the loaded opbridge libraries, the installed ONNX Runtime's kernels or its
expansion of an ONNX function body, or a function of the model itself."""

from __future__ import annotations

import collections
import re
from typing import Callable, Iterator, Sequence

import onnx
import onnxruntime as ort

from ..._library.kinds import DTYPES
from ..._library.manifest import Library, OpInfo
from .onnx_types import ONNX_DOMAIN, domain_name, registry_domain, type_proto
from .opbridge_nodes import check_problems
from .report import MISSING, MODEL_FUNCTION, OPBRIDGE, ORT, ORT_FUNCTION, Verdict
from .runtime import Kernel, accepted_ir, header_accepted, kernel_serves, ort_registry, probe_node

MAX_FUNCTION_DEPTH = 8  # ONNX function bodies that call functions; real ones nest 2-3 deep

Types = Callable[[str], "str | None"]  # value name -> type string, or None when unknown


def _bind(params, names: list[str]) -> Iterator[tuple[str, str]]:
    """(type constraint, value name) for the node's arguments bound to a schema's formal
    parameters; the last parameter takes the rest when variadic."""
    for i, name in enumerate(names):
        if not name:
            continue  # an omitted optional argument
        if i < len(params):
            yield params[i].typeStr, name
        elif params and str(params[-1].option).endswith("Variadic"):
            yield params[-1].typeStr, name


def _type_mismatch(constraints: dict[str, list[str]], bound: list[tuple[str, str]],
                   types: Types) -> tuple[str, str, str] | None:
    """(constraint, type, value) that these type constraints reject, or None when they accept the
    node's known types."""
    for constraint, name in bound:
        allowed = constraints.get(constraint)
        actual = types(name)
        if allowed is None or actual is None:
            continue
        if actual not in allowed:
            return constraint, actual, name
    return None


def _short(type_str: str) -> str:
    m = re.fullmatch(r"tensor\((\w+)\)", type_str)
    return m.group(1) if m else type_str


FLOAT16, FLOAT = "tensor(float16)", "tensor(float)"


class Checker:
    """Judges nodes against the installed ONNX Runtime, the loaded opbridge libraries and the
    model's own functions. The caller passes the libraries, so that one analysis sees one set."""

    def __init__(self, model: onnx.ModelProto, libs: Sequence[Library]):
        self.kernels, self.schemas = ort_registry()
        self.ort_domains = {d for d, _ in self.schemas}
        self.ir_version = model.ir_version
        self.functions = {(f.domain, f.name, f.overload): f for f in model.functions}
        self.model_opsets = {registry_domain(o.domain): o.version for o in model.opset_import}
        self.custom: dict[tuple[str, str], OpInfo] = {}
        self.library_domains: dict[str, Library] = {}
        # Standard (or other runtimes') ops that an opbridge op with a kernel writes by an export
        # rule: where the runtime lacks one, the op's own node is the way (custom_nodes=True).
        self.written_by: dict[tuple[str, str], list[OpInfo]] = collections.defaultdict(list)
        for lib in libs:
            for op in lib.ops:
                for r in op.export_rules:
                    if r.target != "opbridge_op" and op.export_kind == "kernel":
                        self.written_by[(registry_domain(r.domain), r.op_type)].append(op)
        for lib in libs:
            self.library_domains[registry_domain(lib.onnx_domain)] = lib
            for op in lib.ops:
                if op.has_own_node:  # in the library's domain, or one the op names
                    self.custom[(registry_domain(op.onnx_domain), op.onnx_type)] = op
                    self.library_domains.setdefault(registry_domain(op.onnx_domain), lib)

    def resolve_since(self, domain: str, op_type: str, opset: int | None) -> int | None:
        """The version of the op's schema that an opset selects (as ONNX Runtime resolves it)."""
        if opset is None:
            return None
        found = [s.since_version for s in self.schemas.get((domain, op_type), []) if s.since_version <= opset]
        return found[-1] if found else None

    def node(self, node: onnx.NodeProto, opsets: dict[str, int], types: Types, depth: int = 0,
             values: dict[str, onnx.ValueInfoProto] | None = None) -> Verdict:
        """The node's verdict; `values` (the graph's ValueInfos) lets an opbridge node's static input
        shapes be checked against its op's checks."""
        domain = registry_domain(node.domain)
        opset = opsets.get(domain)
        qual = f"{domain_name(domain)}::{node.op_type}"

        op = self.custom.get((domain, node.op_type))
        if op is not None and op.export_kind == "kernel":
            return self._opbridge(node, op, types, values)  # custom-op registries come first in ONNX Runtime
        if opset is None:  # ONNX requires an import for every domain a node uses (custom ops excepted above)
            return Verdict(MISSING, "", f"{qual}: the model imports no opset for domain '{domain_name(domain)}'; "
                                        "add it to the model's opset_import")
        since = self.resolve_since(domain, node.op_type, opset)
        kernels: list[Kernel] = []
        bound: list[tuple[str, str]] = []
        if since is not None:
            schema = next(s for s in self.schemas[(domain, node.op_type)] if s.since_version == since)
            bad_attr = _attribute_problem(node, schema, since)
            if bad_attr:
                return Verdict(MISSING, "", bad_attr)
            if (domain, node.op_type) == (ONNX_DOMAIN, "Constant"):
                # No Constant kernel exists: ONNX Runtime's graph loader turns Constant nodes
                # into initializers (ONNX function bodies rely on that as well).
                return Verdict(ORT, "folded into an initializer at load time")
            kernels = [k for k in self.kernels.get((domain, node.op_type), []) if kernel_serves(k, since)]
            bound = list(_bind(schema.inputs, list(node.input))) + list(_bind(schema.outputs, list(node.output)))
            if any(_type_mismatch(k.types, bound, types) is None for k in kernels):
                return Verdict(ORT, f"CPU kernel {node.op_type}-{since}")
            # ONNX Runtime runs a float16 node without a float16 kernel on its float kernel,
            # with Casts inserted around it (InsertCastTransformer).
            as_float = lambda name: FLOAT if types(name) == FLOAT16 else types(name)  # noqa: E731
            if any(types(n) == FLOAT16 for _, n in bound) and any(
                    _type_mismatch(k.types, bound, as_float) is None for k in kernels):
                return Verdict(ORT, f"CPU kernel {node.op_type}-{since} in float32 (Casts inserted around float16)")
        local = self.functions.get((node.domain, node.op_type, node.overload))
        if local is not None:
            unknown = _unknown_attributes(node, op) if op is not None else None
            if unknown:
                return Verdict(MISSING, f"opbridge op {op.name} ({op.export_kind})", unknown)
            return Verdict(MODEL_FUNCTION, f"function {domain_name(local.domain)}::{local.name}"
                                           + (f" ({local.overload})" if local.overload else "")
                                           + (f", opbridge op {op.name} ({op.export_kind})" if op else ""))
        if since is None:
            return self._unknown(node, domain, opset, op)
        expanded = self._onnx_function(node, domain, opsets, types, depth)
        if expanded is not None:
            return expanded
        return self._no_kernel(node, domain, opset, since, kernels, bound, types)

    def _opbridge(self, node: onnx.NodeProto, op: OpInfo, types: Types,
                  values: dict[str, onnx.ValueInfoProto] | None) -> Verdict:
        lib = op.library
        qual = f"{domain_name(op.onnx_domain)}::{op.onnx_type}"
        if lib.ort_path is None:
            return Verdict(MISSING, f"opbridge op {op.name}",
                           f"{qual}: op library '{lib.name}' was loaded without its ONNX Runtime library "
                           f"(lib{lib.name}_ort.so); build it with opbridge_add_op_library and load both")
        imported = self.model_opsets.get(op.onnx_domain)
        if imported is not None and not 1 <= imported <= lib.onnx_domain_version:
            # ONNX Runtime would run it anyway, with this library's (older) version of the op.
            return Verdict(MISSING, f"opbridge op {op.name}",
                           f"{qual}: the model imports domain '{op.onnx_domain}' version {imported}; op library "
                           f"'{lib.name}' provides versions 1 to {lib.onnx_domain_version}: re-export the model "
                           "with this library, or load the library version the model was made with")
        if len(node.input) > op.node_inputs or len(node.output) > len(op.outputs):  # symbolic attributes' too
            return Verdict(MISSING, f"opbridge op {op.name}",
                           f"{qual} takes {op.node_inputs} inputs and {len(op.outputs)} outputs; this node has "
                           f"{len(node.input)} and {len(node.output)}")
        unknown = _unknown_attributes(node, op)
        if unknown:
            return Verdict(MISSING, f"opbridge op {op.name}", unknown)
        bound = [(spec.type, name) for spec, name in zip(op.inputs, node.input) if name]
        bound += [(spec.type, name) for spec, name in zip(op.outputs, node.output) if name]
        onnx_types = {t.name: [DTYPES[d].onnx_type for d in t.dtypes] for t in op.types}
        bad = _type_mismatch(onnx_types, bound, types)
        if bad:
            c = bad[0]
            return Verdict(MISSING, f"opbridge op {op.name}",
                           f"{qual} takes {c} in {{{', '.join(_short(t) for t in onnx_types[c])}}}; this node has "
                           f"{c}={_short(bad[1])} ('{bad[2]}'): cast it or add the dtype to the op's .types()")
        failed = check_problems(op, node, values) if values is not None else []
        if failed:
            more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
            return Verdict(MISSING, f"opbridge op {op.name}",
                           f"{qual}: the node's inputs fail the op's checks, so its kernel refuses them: "
                           f"{failed[0]}{more}")
        return Verdict(OPBRIDGE, f"library {lib.name} ({lib.ort_path.name}), op {op.name}")

    def _function_body(self, node, domain, opset, types) -> tuple[bool, onnx.FunctionProto | None]:
        """(whether the op has an ONNX function at this opset, its body for this node when onnx
        can build it: a context-dependent body needs the input types)."""
        try:
            schema = onnx.defs.get_schema(node.op_type, opset, domain)
        except onnx.defs.SchemaError:
            return False, None
        try:
            if schema.has_function:
                versions = [v for v in schema.function_opset_versions if v <= opset]
                raw = schema.get_function_with_opset_version(versions[-1]) if versions else None
                return True, onnx.FunctionProto.FromString(raw) if raw else schema.function_body
            if schema.has_context_dependent_function:
                versions = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
                in_types = []
                for name in node.input:
                    tp = type_proto(types(name) or "") if name else onnx.TypeProto()
                    if tp is None:
                        return True, None  # onnx builds these bodies from known types only (and crashes without)
                    in_types.append(tp.SerializeToString())
                raw = schema.get_context_dependent_function_with_opset_version(
                    versions[-1] if versions else opset, node.SerializeToString(), in_types)
                return True, onnx.FunctionProto.FromString(raw) if raw else None
        except Exception:  # noqa: BLE001 - a body onnx cannot build is a body ONNX Runtime cannot use
            return True, None
        return False, None

    def _onnx_function(self, node, domain, opsets, types, depth) -> Verdict | None:
        """ONNX Runtime expands an op that has no kernel into its ONNX function body, when the op
        has one. With the node's input types known, ONNX Runtime itself is asked to build the
        node alone; otherwise the body's ops are checked without types."""
        opset = opsets[domain]
        qual = f"{domain_name(domain)}::{node.op_type}"
        has_function, body = self._function_body(node, domain, opset, types)
        if not has_function:
            return None
        what = (f"expands to {len(body.node)} nodes: " + ", ".join(sorted({n.op_type for n in body.node}))
                if body is not None else "expands to its ONNX function body")
        refusal = None
        probe_ir = accepted_ir(self.ir_version)
        if probe_ir is not None and header_accepted(probe_ir, tuple(sorted(opsets.items()))):
            refusal = probe_node(node.SerializeToString(), tuple(sorted(opsets.items())),
                                  tuple((types(n) or "") if n else "" for n in node.input), probe_ir)
        if refusal == "":
            return Verdict(ORT_FUNCTION, what)
        if refusal is not None:
            return Verdict(MISSING, "", f"{qual} has no CPU kernel for this node, and ONNX Runtime cannot run its "
                                        f"ONNX function body either: {refusal}")
        if body is None:
            return Verdict(ORT_FUNCTION, what + " (built from input types, which are unknown here: not checked)")
        if depth >= MAX_FUNCTION_DEPTH:
            return Verdict(MISSING, "", f"{qual}: ONNX function bodies nest more than {MAX_FUNCTION_DEPTH} deep")
        body_opsets = dict(self.model_opsets)
        body_opsets.update({registry_domain(o.domain): o.version for o in body.opset_import})
        for inner in body.node:
            v = self.node(inner, body_opsets, lambda name: None, depth + 1)
            if v.missing:
                return Verdict(MISSING, "", f"{qual} has no CPU kernel and its ONNX function body needs "
                                            f"{domain_name(inner.domain)}::{inner.op_type}: {v.advice}")
        return Verdict(ORT_FUNCTION, what + " (input types unknown: body checked by op and version only)")

    def _no_kernel(self, node, domain, opset, since, kernels, bound, types) -> Verdict:
        qual = f"{domain_name(domain)}::{node.op_type}"
        ver = f"ONNX Runtime {ort.__version__}"
        schemas = self.schemas[(domain, node.op_type)]
        schema = next(s for s in schemas if s.since_version == since)
        deprecated = f" ({qual} is deprecated since opset {since})" if schema.deprecated else ""
        if kernels:  # kernels for this version, none for these types
            actual: dict[str, set[str]] = collections.defaultdict(set)
            for c, name in bound:
                if types(name):
                    actual[c].add(types(name))
            for c, ts in actual.items():
                allowed = {t for k in kernels for t in k.types.get(c, [])}
                if allowed and not ts <= allowed:
                    return Verdict(MISSING, "", f"{ver}'s CPU kernels for {node.op_type}-{since} take {c} in "
                                                f"{{{', '.join(sorted(_short(t) for t in allowed))}}}; this node has {c}="
                                                f"{', '.join(sorted(_short(t) for t in ts - allowed))}: cast to a "
                                                "supported type")
            combo = ", ".join(f"{c}={'|'.join(sorted(_short(t) for t in ts))}" for c, ts in sorted(actual.items()))
            return Verdict(MISSING, "", f"{ver} has no CPU kernel for {node.op_type}-{since} with {combo}: cast to "
                                        "a supported combination")
        # Opsets whose version of the op some kernel serves, adjacent ranges merged.
        served: list[list] = []
        for i, s in enumerate(schemas):
            if any(kernel_serves(k, s.since_version) for k in self.kernels.get((domain, node.op_type), [])):
                hi = schemas[i + 1].since_version - 1 if i + 1 < len(schemas) else None
                if served and served[-1][1] is not None and served[-1][1] + 1 == s.since_version:
                    served[-1][1] = hi
                else:
                    served.append([s.since_version, hi])
        spans = [f"{lo}+" if hi is None else (f"{lo}" if hi == lo else f"{lo}-{hi}") for lo, hi in served]
        if spans:
            return Verdict(MISSING, "", f"{ver} has CPU kernels for {qual} at {domain_name(domain)} opsets "
                                        f"{', '.join(spans)}, not for {node.op_type}-{since} (the model imports opset "
                                        f"{opset}){deprecated}: convert the model to one of those opsets "
                                        "(onnx.version_converter, or re-export with --opset)")
        writers = self.written_by.get((domain, node.op_type))
        if writers:
            return Verdict(MISSING, "", f"{ver} has no CPU kernel for {qual}{deprecated}; opbridge's "
                                        f"{', '.join(sorted({op.name for op in writers}))} wrote it: export with "
                                        f"custom_nodes=True (opbridge's own node, which its ONNX Runtime library runs)")
        return Verdict(MISSING, "", f"{ver} has no CPU kernel for {qual} and no ONNX function body to expand"
                                    f"{deprecated}: provide a custom-op library for it or use other ops")

    def _unknown(self, node, domain, opset, op: OpInfo | None) -> Verdict:
        qual = f"{domain_name(domain)}::{node.op_type}"
        versions = [s.since_version for s in self.schemas.get((domain, node.op_type), [])]
        if versions:
            return Verdict(MISSING, "", f"{qual} first appears in {domain_name(domain)} opset {versions[0]}; the model "
                                        f"imports opset {opset}: raise the opset (re-export with --opset "
                                        f"{versions[0]}, or convert with onnx.version_converter)")
        if op is not None:
            # Not a kernel (those are judged above): its node is defined by a function the
            # model must carry, which opbridge.export adds.
            return Verdict(MISSING, f"opbridge op {op.name} ({op.export_kind})",
                           f"the model lacks the FunctionProto for {qual} (opbridge op '{op.name}', exported as "
                           f"{op.export_kind}): export with opbridge.export, or add the functions with "
                           "opbridge.add_functions(model)")
        lib = self.library_domains.get(domain)
        if lib is not None:
            return Verdict(MISSING, "", f"opbridge library '{lib.name}' (domain '{domain}') has no op {node.op_type}; "
                                        f"it has {', '.join(sorted(o.onnx_type for o in lib.ops)) or 'no ops'}")
        if domain in self.ort_domains:
            try:
                known = onnx.defs.get_schema(node.op_type, domain)  # the newest version onnx knows
                return Verdict(MISSING, "", f"{qual} (opset {known.since_version}) is newer than ONNX Runtime "
                                            f"{ort.__version__}: upgrade onnxruntime")
            except onnx.defs.SchemaError:
                return Verdict(MISSING, "", f"no runtime implements {qual}: domain {domain_name(domain)} has no op "
                                            f"'{node.op_type}'")
        return Verdict(MISSING, "", f"no runtime implements {qual}: load a custom-op library for domain "
                                    f"'{domain}' (opbridge.load_library / --library, or SessionOptions."
                                    "register_custom_ops_library), or add a model-local function for it")


def _unknown_attributes(node: onnx.NodeProto, op: OpInfo) -> str | None:
    """An attribute the op does not take, named with the op and the node. ONNX Runtime accepts any
    attribute on a custom op's node and its C API cannot list them, so the adapter never sees one
    that is misspelt: the op would run with the default instead."""
    known = [a.name for a in op.attributes]
    unknown = [a.name for a in node.attribute if a.name not in known]
    if not unknown:
        return None
    qual = f"{domain_name(op.onnx_domain)}::{op.onnx_type}"
    return (f"{qual} (node '{node.name}') has attribute{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(repr(n) for n in unknown)}, which op '{op.name}' does not take (its attributes: "
            f"{', '.join(known) or 'none'}): remove or rename it")


def _attribute_problem(node: onnx.NodeProto, schema, since: int) -> str | None:
    """ONNX Runtime validates every node against its own schema: an attribute it does not know
    (a model written for a newer ONNX) or a missing required one fails the session."""
    known = schema.attributes
    qual = f"{domain_name(node.domain)}::{node.op_type}-{since}"
    for a in node.attribute:
        if a.name not in known:
            return (f"ONNX Runtime {ort.__version__}'s schema of {qual} has no attribute '{a.name}' (the model was "
                    "written for a newer ONNX): upgrade onnxruntime or drop the attribute")
    given = {a.name for a in node.attribute}
    for name, a in known.items():
        if a.required and name not in given:
            return f"{qual} needs attribute '{name}', which the node lacks"
    return None
