"""What an ONNX model needs at run time, and who provides it.

Every node (main graph, control-flow subgraphs, model-local functions) gets a status:
  onnxruntime             a CPU kernel of the installed ONNX Runtime (its own kernel registry,
                          honouring the node's opset and, where known, its tensor types)
  onnxruntime (function)  an ONNX op without a kernel that ONNX Runtime expands into its ONNX
                          function body (whose ops are checked the same way)
  opbridge                a custom op of a loaded opbridge library (its *_ort.so)
  model function          a function defined in the model itself (its body is inspected too)
  MISSING                 nothing runs it; the verdict says what to do
The installed runtime is asked rather than a hand-kept list: kernels and schemas come from
onnxruntime's registry, and the IR version and opset imports are tried on ONNX Runtime itself.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
from typing import Callable, Iterator

import onnx
import onnxruntime as ort
from onnx import AttributeProto, TensorProto

from ._library import OpInfo, libraries

ORT = "onnxruntime"
ORT_FUNCTION = "onnxruntime (function)"
OPBRIDGE = "opbridge"
MODEL_FUNCTION = "model function"
MISSING = "MISSING"

ONNX_DOMAIN = ""  # ai.onnx, as ONNX Runtime's registries spell it
CPU = "CPUExecutionProvider"  # opbridge.session() runs on the CPU provider
MAX_FUNCTION_DEPTH = 8  # ONNX function bodies that call functions; real ones nest 2-3 deep


def domain_name(domain: str) -> str:
    return domain if domain not in ("", "ai.onnx") else "ai.onnx"


def _registry_domain(domain: str) -> str:
    return ONNX_DOMAIN if domain == "ai.onnx" else domain


def elem_type_name(elem_type: int) -> str:
    """ONNX's own spelling of a tensor element type: float, int64, bfloat16, float8e4m3fn..."""
    try:
        return TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return f"elem_type {elem_type}"


def type_string(t: onnx.TypeProto) -> str | None:
    """A TypeProto as ONNX type-constraint strings spell it ("tensor(float)",
    "seq(tensor(int64))"), or None when the type is not known."""
    which = t.WhichOneof("value")
    if which in ("tensor_type", "sparse_tensor_type"):
        tt = getattr(t, which)
        if not tt.elem_type:
            return None
        return f"{which[:-5]}({elem_type_name(tt.elem_type)})"
    if which in ("sequence_type", "optional_type"):
        inner = type_string(getattr(t, which).elem_type)
        return None if inner is None else f"{'seq' if which == 'sequence_type' else 'optional'}({inner})"
    if which == "map_type":
        inner = type_string(t.map_type.value_type)
        return None if inner is None else f"map({elem_type_name(t.map_type.key_type)},{inner})"
    return None


def dims(t: onnx.TypeProto) -> list[str | int] | None:
    """A tensor's shape: ints, symbolic names, or "?" for unknown dims; None when even the rank
    is unknown."""
    if t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
        return None
    out: list[str | int] = []
    for d in t.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            out.append(d.dim_value)
        elif d.HasField("dim_param"):
            out.append(d.dim_param)
        else:
            out.append("?")
    return out


def short_type(t: onnx.TypeProto) -> str:
    """float[batch,8], seq(tensor(int64)), ? ..."""
    which = t.WhichOneof("value")
    if which == "tensor_type":
        dtype = elem_type_name(t.tensor_type.elem_type) if t.tensor_type.elem_type else "?"
        shape = dims(t)
        return dtype if shape is None else f"{dtype}[{','.join(str(d) for d in shape)}]"
    return type_string(t) or "?"


@dataclasses.dataclass
class Value:
    name: str
    dtype: str  # "float", "seq(tensor(int64))", "?"
    shape: list[str | int] | None  # None: rank unknown

    def describe(self) -> str:
        shape = "rank unknown" if self.shape is None else "[" + ", ".join(str(d) for d in self.shape) + "]"
        return f"{self.dtype} {shape}"

    @classmethod
    def of(cls, vi: onnx.ValueInfoProto) -> "Value":
        t = vi.type
        if t.WhichOneof("value") == "tensor_type":
            dtype = elem_type_name(t.tensor_type.elem_type) if t.tensor_type.elem_type else "?"
        else:
            dtype = type_string(t) or "?"
        return cls(vi.name, dtype, dims(t))


@dataclasses.dataclass(frozen=True)
class Verdict:
    status: str
    detail: str = ""  # who provides it
    advice: str = ""  # for MISSING: the reason and what to do

    @property
    def missing(self) -> bool:
        return self.status == MISSING


@dataclasses.dataclass
class OpUse:
    """All nodes of one op (domain, type, opset in effect) that got the same verdict."""

    domain: str
    op_type: str
    opset: int | None
    since: int | None  # the version of the op's schema that the opset selects, when known
    verdict: Verdict
    count: int = 0
    where: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "domain": domain_name(self.domain),
            "op_type": self.op_type,
            "opset": self.opset,
            "since_version": self.since,
            "count": self.count,
            "status": self.verdict.status,
            "detail": self.verdict.detail,
            "advice": self.verdict.advice,
            "where": self.where,
        }


@dataclasses.dataclass
class ModelReport:
    path: str
    ir_version: int
    producer: str
    opsets: dict[str, int]
    inputs: list[Value]
    outputs: list[Value]
    initializers: int
    functions: list[dict]
    ops: list[OpUse]
    model_problems: list[Verdict]  # IR version / opset imports ONNX Runtime refuses
    notes: list[str]
    runtime: str
    libraries: list[dict]
    node_verdicts: dict[int, Verdict]  # main-graph node index -> verdict
    model: onnx.ModelProto  # after shape inference (when it succeeded)

    @property
    def missing(self) -> list:
        return self.model_problems + [u for u in self.ops if u.verdict.missing]

    @property
    def ok(self) -> bool:
        return not self.missing

    def to_json(self) -> dict:
        return {
            "model": self.path,
            "ir_version": self.ir_version,
            "producer": self.producer,
            "opset_imports": {domain_name(d): v for d, v in self.opsets.items()},
            "inputs": [dataclasses.asdict(v) for v in self.inputs],
            "outputs": [dataclasses.asdict(v) for v in self.outputs],
            "initializers": self.initializers,
            "functions": self.functions,
            "ops": [u.to_json() for u in self.ops],
            "model_problems": [dataclasses.asdict(p) for p in self.model_problems],
            "notes": self.notes,
            "runtime": self.runtime,
            "opbridge_libraries": self.libraries,
            "runnable": self.ok,
        }


# --- what the installed ONNX Runtime has -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Kernel:
    lo: int
    hi: int
    types: dict[str, list[str]]  # type constraint -> allowed type strings


@functools.lru_cache(maxsize=None)
def _ort_registry():
    """(CPU kernels by (domain, op), ONNX Runtime's schemas by (domain, op) sorted by version)."""
    from onnxruntime.capi import _pybind_state as C

    kernels: dict[tuple[str, str], list[_Kernel]] = collections.defaultdict(list)
    for k in C.get_all_opkernel_def():
        if k.provider == CPU:
            lo, hi = k.version_range
            kernels[(k.domain, k.op_name)].append(_Kernel(lo, hi, dict(k.type_constraints)))
    schemas: dict[tuple[str, str], list] = collections.defaultdict(list)
    for s in C.get_all_operator_schema():
        schemas[(s.domain, s.name)].append(s)
    for v in schemas.values():
        v.sort(key=lambda s: s.since_version)
    return dict(kernels), dict(schemas)


def _clean_ort_message(msg: str) -> str:
    """ONNX Runtime's exception text without the status prefix and the C++ source location and
    function signature it carries."""
    msg = " ".join(str(msg).split())
    msg = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", msg)
    m = re.search(r"(?:^|\s)/\S+\.(?:cc|cpp|h|hpp|inc):\d+ ", msg)
    if not m:
        return msg
    head, rest = msg[:m.start()].strip(), msg[m.end():]
    # A signature runs to its closing parenthesis, then on until the next space
    # ("Locale(const std::string&)::<lambda()>"); only strip what looks like one.
    if re.match(r"[\w:~<> ,*&]+\(", rest):
        depth, i = 0, 0
        for i, ch in enumerate(rest):
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
                if depth == 0:
                    break
        j = rest.find(" ", i)
        rest = rest[j + 1:] if j >= 0 else ""
        rest = re.sub(r"^(?:const|noexcept|\[with [^\]]*\])\s*", "", rest)
    return f"{head} {rest}".strip()


def _probe(ir_version: int, opsets: dict[str, int]) -> str | None:
    """Lets ONNX Runtime itself judge a model header (IR version and opset imports) on a model
    with no nodes; returns its complaint, or None."""
    x = onnx.helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = onnx.helper.make_graph([], "probe", [x], [x])
    return _ort_refusal(graph, ir_version, opsets.items())


def _ort_refusal(graph, ir_version: int, opsets) -> str | None:
    """ONNX Runtime's complaint about a model of `graph` with these opset imports, or None when
    it builds a session."""
    model = onnx.helper.make_model(graph, ir_version=ir_version,
                                   opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opsets])
    so = ort.SessionOptions()
    so.log_severity_level = 3
    try:
        ort.InferenceSession(model.SerializeToString(), so, providers=[CPU])
    except Exception as e:  # noqa: BLE001 - any refusal is the answer
        return _clean_ort_message(str(e))
    return None


@functools.lru_cache(maxsize=None)
def _accepted_ir(ir_version: int) -> int | None:
    """The highest IR version up to ir_version that ONNX Runtime accepts."""
    for v in range(ir_version, 2, -1):
        if _probe(v, {ONNX_DOMAIN: 1}) is None:
            return v
    return None


@functools.lru_cache(maxsize=256)
def _header_accepted(ir_version: int, opsets: tuple[tuple[str, int], ...]) -> bool:
    return _probe(ir_version, dict(opsets)) is None


@functools.lru_cache(maxsize=256)
def _header_problems(ir_version: int, opsets: tuple[tuple[str, int], ...]) -> tuple[Verdict, ...]:
    if _header_accepted(ir_version, opsets):
        return ()
    ver = f"ONNX Runtime {ort.__version__}"
    problems = []
    accepted_ir = _accepted_ir(ir_version)
    if accepted_ir != ir_version:
        why = _probe(ir_version, {ONNX_DOMAIN: 1})
        problems.append(Verdict(MISSING, f"IR version {ir_version}",
                                f"{ver} refuses IR version {ir_version} ({why}): save the model with ir_version "
                                f"{accepted_ir} or lower (onnx.save after setting model.ir_version, when no newer "
                                "IR feature is used) or upgrade onnxruntime"))
    for domain, version in opsets:
        msg = _probe(accepted_ir or ir_version, {domain: version})
        if msg is None:
            continue
        m = re.search(r"support for domain \S+ is till opset (\d+)", msg)
        if m:
            problems.append(Verdict(MISSING, f"opset {domain_name(domain)} {version}",
                                    f"{ver} supports {domain_name(domain)} up to opset {m.group(1)}; the model "
                                    f"imports opset {version}: convert the model to opset {m.group(1)} "
                                    f"(onnx.version_converter, or re-export with --opset {m.group(1)}) or upgrade "
                                    "onnxruntime"))
        else:
            problems.append(Verdict(MISSING, f"opset {domain_name(domain)} {version}",
                                    f"{ver} refuses {domain_name(domain)} opset {version}: {msg}"))
    if not problems:  # refused only as a combination: ONNX Runtime's own words
        problems.append(Verdict(MISSING, "model header", f"{ver} refuses the model: {_probe(ir_version, dict(opsets))}"))
    return tuple(problems)


# --- one node ----------------------------------------------------------------------------------


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


INT_MAX = 2**31 - 1


def _kernel_serves(k: _Kernel, since: int) -> bool:
    """ONNX Runtime's own rule (KernelRegistry::VerifyKernelDef): a kernel serves the schema
    version it starts at, or a later one only when its range is closed; an open-ended kernel
    registered at version 16 does not serve version 22 of the op."""
    return k.lo == since or (k.lo < since and k.hi != INT_MAX and k.hi >= since)


def _short(type_str: str) -> str:
    m = re.fullmatch(r"tensor\((\w+)\)", type_str)
    return m.group(1) if m else type_str


FLOAT16, FLOAT = "tensor(float16)", "tensor(float)"


class Checker:
    """Judges nodes against the installed ONNX Runtime, the loaded opbridge libraries and the
    model's own functions."""

    def __init__(self, model: onnx.ModelProto):
        self.kernels, self.schemas = _ort_registry()
        self.ort_domains = {d for d, _ in self.schemas}
        self.ir_version = model.ir_version
        self.functions = {(f.domain, f.name, f.overload): f for f in model.functions}
        self.model_opsets = {_registry_domain(o.domain): o.version for o in model.opset_import}
        self.custom: dict[tuple[str, str], OpInfo] = {}
        self.library_domains: dict[str, object] = {}
        for lib in libraries():
            self.library_domains[_registry_domain(lib.onnx_domain)] = lib
            for op in lib.ops:
                if _registry_domain(op.onnx_domain) == _registry_domain(lib.onnx_domain):
                    self.custom[(_registry_domain(op.onnx_domain), op.onnx_type)] = op

    def resolve_since(self, domain: str, op_type: str, opset: int | None) -> int | None:
        """The version of the op's schema that an opset selects (as ONNX Runtime resolves it)."""
        if opset is None:
            return None
        found = [s.since_version for s in self.schemas.get((domain, op_type), []) if s.since_version <= opset]
        return found[-1] if found else None

    def node(self, node: onnx.NodeProto, opsets: dict[str, int], types: Types, depth: int = 0) -> Verdict:
        domain = _registry_domain(node.domain)
        opset = opsets.get(domain)
        qual = f"{domain_name(domain)}::{node.op_type}"

        op = self.custom.get((domain, node.op_type))
        if op is not None and op.export_kind == "kernel":
            return self._opbridge(node, op, types)  # custom-op registries come first in ONNX Runtime
        if opset is None:  # ONNX requires an import for every domain a node uses (custom ops excepted above)
            return Verdict(MISSING, "", f"{qual}: the model imports no opset for domain '{domain_name(domain)}'; "
                                        "add it to the model's opset_import")
        since = self.resolve_since(domain, node.op_type, opset)
        kernels: list[_Kernel] = []
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
            kernels = [k for k in self.kernels.get((domain, node.op_type), []) if _kernel_serves(k, since)]
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
            return Verdict(MODEL_FUNCTION, f"function {domain_name(local.domain)}::{local.name}"
                                           + (f" ({local.overload})" if local.overload else "")
                                           + (f", opbridge op {op.name} ({op.export_kind})" if op else ""))
        if since is None:
            return self._unknown(node, domain, opset, op)
        expanded = self._onnx_function(node, domain, opsets, types, depth)
        if expanded is not None:
            return expanded
        return self._no_kernel(node, domain, opset, since, kernels, bound, types)

    def _opbridge(self, node: onnx.NodeProto, op: OpInfo, types: Types) -> Verdict:
        lib = op.library
        qual = f"{domain_name(op.onnx_domain)}::{op.onnx_type}"
        if lib.ort_path is None:
            return Verdict(MISSING, f"opbridge op {op.name}",
                           f"{qual}: op library '{lib.name}' was loaded without its ONNX Runtime library "
                           f"(lib{lib.name}_ort.so); build it with opbridge_add_op_library and load both")
        if len(node.input) > len(op.inputs) or len(node.output) > len(op.outputs):
            return Verdict(MISSING, f"opbridge op {op.name}",
                           f"{qual} takes {len(op.inputs)} inputs and {len(op.outputs)} outputs; this node has "
                           f"{len(node.input)} and {len(node.output)}")
        bound = [(spec["type"], name) for spec, name in zip(op.inputs, node.input) if name]
        bound += [(spec["type"], name) for spec, name in zip(op.outputs, node.output) if name]
        bad = _type_mismatch(op.onnx_types, bound, types)
        if bad:
            c = bad[0]
            return Verdict(MISSING, f"opbridge op {op.name}",
                           f"{qual} takes {c} in {{{', '.join(_short(t) for t in op.onnx_types[c])}}}; this node has "
                           f"{c}={_short(bad[1])} ('{bad[2]}'): cast it or add the dtype to the op's .types()")
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
                    tp = _type_proto(types(name) or "") if name else onnx.TypeProto()
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
        probe_ir = _accepted_ir(self.ir_version)
        if probe_ir is not None and _header_accepted(probe_ir, tuple(sorted(opsets.items()))):
            refusal = _probe_node(node.SerializeToString(), tuple(sorted(opsets.items())),
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
        body_opsets.update({_registry_domain(o.domain): o.version for o in body.opset_import})
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
            if any(_kernel_serves(k, s.since_version) for k in self.kernels.get((domain, node.op_type), [])):
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
            return Verdict(MISSING, f"opbridge op {op.name} ({op.export_kind})",
                           f"{qual} is opbridge op '{op.name}', exported as {op.export_kind}; this model lacks its "
                           "definition: re-export the model with opbridge.export")
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


@functools.lru_cache(maxsize=1024)
def _probe_node(node_bytes: bytes, opsets: tuple, input_types: tuple, ir_version: int) -> str | None:
    """ONNX Runtime's verdict on a model holding only this node: "" when it builds a session,
    its complaint when not, None when the node cannot be isolated (unknown input types,
    subgraphs that see outer values)."""
    node = onnx.NodeProto.FromString(node_bytes)
    if any(True for _ in _subgraphs(node)):
        return None
    inputs, seen = [], set()
    for name, t in zip(node.input, input_types):
        if not name or name in seen:
            continue
        tp = _type_proto(t) if t else None
        if tp is None:
            return None
        seen.add(name)
        inputs.append(onnx.helper.make_value_info(name, tp))
    outputs = [onnx.helper.make_empty_tensor_value_info(n) for n in node.output if n]
    graph = onnx.helper.make_graph([node], "probe", inputs, outputs)
    refusal = _ort_refusal(graph, ir_version, opsets)
    return "" if refusal is None else refusal


def _type_proto(type_str: str) -> onnx.TypeProto | None:
    """A type string ("tensor(float)", "seq(tensor(int64))", "optional(...)") as a TypeProto
    without shape, or None for types it cannot spell."""
    m = re.fullmatch(r"(tensor|seq|optional)\((.+)\)", type_str)
    if not m:
        return None
    if m.group(1) == "tensor":
        try:
            return onnx.helper.make_tensor_type_proto(TensorProto.DataType.Value(m.group(2).upper()), None)
        except ValueError:
            return None
    inner = _type_proto(m.group(2))
    if inner is None:
        return None
    if m.group(1) == "seq":
        return onnx.helper.make_sequence_type_proto(inner)
    return onnx.helper.make_optional_type_proto(inner)


# --- the whole model ---------------------------------------------------------------------------


def infer(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    """The model with inferred value_info (types and shapes of intermediate tensors), or the
    model as is with the reason inference failed."""
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True), None
    except Exception as e:  # noqa: BLE001 - inspection goes on without inferred types
        return model, f"shape inference failed ({str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}); "\
                      "types of intermediate tensors are unknown"


def graph_types(graph: onnx.GraphProto, outer: dict[str, str] | None = None) -> dict[str, str]:
    """Type strings of every value a graph knows, including those visible from outer scopes."""
    types = dict(outer or {})
    for init in graph.initializer:
        types[init.name] = f"tensor({elem_type_name(init.data_type)})"
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        t = type_string(vi.type)
        if t:
            types[vi.name] = t
    return types


def _subgraphs(node: onnx.NodeProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    for a in node.attribute:
        if a.type == AttributeProto.GRAPH:
            yield a.name, a.g
        elif a.type == AttributeProto.GRAPHS:
            for i, g in enumerate(a.graphs):
                yield f"{a.name}[{i}]", g


def analyze(model: onnx.ModelProto, path: str = "") -> ModelReport:
    inferred, note = infer(model)
    checker = Checker(inferred)
    model_opsets = {_registry_domain(o.domain): o.version for o in inferred.opset_import}
    uses: dict[tuple, OpUse] = {}
    node_verdicts: dict[int, Verdict] = {}
    called: list[tuple[str, str, str]] = []

    def visit(node, opsets, types: dict[str, str], where: str, index: int | None):
        domain = _registry_domain(node.domain)
        verdict = checker.node(node, opsets, types.get)
        if index is not None:
            node_verdicts[index] = verdict
        if verdict.status == MODEL_FUNCTION:
            called.append((node.domain, node.op_type, node.overload))
        opset = opsets.get(domain)
        key = (domain, node.op_type, opset, verdict)
        use = uses.get(key)
        if use is None:
            use = uses[key] = OpUse(domain, node.op_type, opset, checker.resolve_since(domain, node.op_type, opset),
                                    verdict)
        use.count += 1
        if where not in use.where:
            use.where.append(where)

    def walk(nodes, opsets, types, where, top: bool):
        for i, node in enumerate(nodes):
            visit(node, opsets, types, where, i if top else None)
            for attr, g in _subgraphs(node):
                walk(g.node, opsets, graph_types(g, types),
                     f"{where} > {node.op_type}{' ' + repr(node.name) if node.name else ''}.{attr}", False)

    walk(inferred.graph.node, model_opsets, graph_types(inferred.graph), "graph", True)
    # Model-local functions reachable from the graph, each body once.
    seen = set()
    while called:
        key = called.pop(0)
        if key in seen or key not in checker.functions:
            continue
        seen.add(key)
        f = checker.functions[key]
        opsets = dict(model_opsets)
        opsets.update({_registry_domain(o.domain): o.version for o in f.opset_import})
        walk(f.node, opsets, {}, f"function {domain_name(f.domain)}::{f.name}", False)

    functions = [{"domain": domain_name(f.domain), "name": f.name, "overload": f.overload,
                  "nodes": len(f.node), "used": (f.domain, f.name, f.overload) in seen} for f in inferred.functions]
    opsets_sorted = tuple(sorted((o.domain, o.version) for o in inferred.opset_import))
    notes = [note] if note else []
    inits = {i.name for i in inferred.graph.initializer}
    ops = sorted(uses.values(), key=lambda u: (u.verdict.status != MISSING, domain_name(u.domain), u.op_type, u.opset or 0))
    return ModelReport(
        path=path,
        ir_version=inferred.ir_version,
        producer=" ".join(x for x in (inferred.producer_name, inferred.producer_version) if x),
        opsets={o.domain: o.version for o in inferred.opset_import},
        inputs=[Value.of(i) for i in inferred.graph.input if i.name not in inits],
        outputs=[Value.of(o) for o in inferred.graph.output],
        initializers=len(inferred.graph.initializer),
        functions=functions,
        ops=ops,
        model_problems=list(_header_problems(inferred.ir_version, opsets_sorted)),
        notes=notes,
        runtime=f"onnxruntime {ort.__version__} (CPU)",
        libraries=[{"name": lib.name, "onnx_domain": lib.onnx_domain,
                    "ort_library": str(lib.ort_path) if lib.ort_path else None} for lib in libraries()],
        node_verdicts=node_verdicts,
        model=inferred,
    )
