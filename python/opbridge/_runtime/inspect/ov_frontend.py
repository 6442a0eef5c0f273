"""What the installed OpenVINO reads of a model, as opbridge.session(..., runtime="openvino")
reads it: OpenVINO's own ONNX frontend, with the OpenVINO side (lib<name>_ov.so) of every loaded
op library added, and the model's local functions inlined first.

The frontend is asked rather than a list kept: the model is converted partially, and the nodes it
leaves unconverted (subgraphs' included) are those OpenVINO cannot read. A standard node it cannot
read that an opbridge op's export rule writes (ai.onnx DeformConv) is read as that op's own node,
as the session does, and the model is converted again to confirm it; every other unread node is
MISSING, with why and what to do.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import onnx
import onnx.inliner

from ..._library.errors import OpbridgeError
from ..._library.manifest import Library
from ..._library.registry import libraries
from ..openvino import OPENVINO as PIN
from ..own_nodes import rule_for, with_own_nodes
from .onnx_types import ONNX_DOMAIN, domain_name, registry_domain, subgraphs
from .report import MISSING, MODEL_FUNCTION, OPBRIDGE, OPENVINO, OWN_NODE, ModelReport, OpUse, Value, Verdict

# What the frontend leaves of a node it has no conversion for, and of one whose conversion failed.
NO_RULE = ("ONNXFrameworkNode", "ONNXSubgraphFrameworkNode")
FAILED = "NotSupportedONNXNode"


def _openvino():
    try:
        import openvino
    except ImportError as e:
        raise OpbridgeError(f"inspecting for OpenVINO needs OpenVINO: pip install {PIN}") from e
    return openvino


def _bodies(node) -> list:
    """The OpenVINO models a converted node holds (If's branches, a loop's body)."""
    if node.get_type_name() == "If":
        return [node.get_then_body(), node.get_else_body()]
    return [node.get_function(0)] if node.get_type_name() in ("Loop", "TensorIterator") else []


def _not_read(converted) -> tuple[set[tuple[str, str]], dict[str, tuple[str, str]]]:
    """(domain, op type) of the nodes the frontend has no conversion for, and the nodes whose
    conversion failed: their first output's name (the node's name in OpenVINO) -> (domain, op type)."""
    no_rule, failed, stack = set(), {}, [converted]
    while stack:
        for node in stack.pop().get_ordered_ops():
            if node.get_type_name() in NO_RULE or node.get_type_name() == FAILED:
                meta = node.get_attributes()
                key = (registry_domain(meta.get("ONNX_META_domain", "")), meta.get("ONNX_META_type", "?"))
                if node.get_type_name() == FAILED:
                    failed[node.get_friendly_name()] = key
                else:
                    no_rule.add(key)
            stack.extend(_bodies(node))
    return no_rule, failed


def _failures(path: str, libs: list[Library]) -> dict[tuple[str, str], str]:
    """Why conversions failed, by (domain, op type): the frontend's log, as reading the model
    reports it (the unconverted nodes do not carry it)."""
    import openvino as ov

    core = ov.Core()
    for lib in libs:
        if lib.openvino_path is not None:
            core.add_extension(str(lib.openvino_path))
    try:
        core.read_model(path)
        return {}
    except RuntimeError as e:
        text = str(e)
    out = {}
    entry = r"\n-- (?:(\S+)\.)?(\w+?)(?:-\d+)? with a message:\n(.*?)(?=\n-- |\n\nSummary|\Z)"  # per op type
    for m in re.finditer(entry, text, re.S):
        lines = [line for line in m[3].splitlines() if line.strip()]
        out.setdefault((registry_domain(m[1] or ""), m[2]), lines[-1] if lines else "no reason given")
    return out


def unread_nodes(path: str, libs: list[Library]) -> tuple[set[tuple[str, str]], dict[str, str]]:
    """What OpenVINO's ONNX frontend, with the loaded libraries' OpenVINO sides, cannot read in the
    model at `path`: (domain, op type) of the nodes it has no conversion for, and the nodes whose
    conversion failed, by name in OpenVINO (the node's, else its first output's) -> why (the log
    says it once per op type). RuntimeError: it cannot read the model."""
    from openvino.frontend import FrontEndManager

    frontend = FrontEndManager().load_by_framework("onnx")
    for lib in libs:
        if lib.openvino_path is not None:
            frontend.add_extension(str(lib.openvino_path))
    loaded = frontend.load(path)
    converted = frontend.convert_partially(loaded)
    no_rule, failed = _not_read(converted)
    # The unconverted nodes refer to the loaded model: it must outlive them.
    del converted
    del loaded
    why = _failures(path, libs) if failed else {}
    return no_rule, {name: why.get(key) or "the conversion failed" for name, key in failed.items()}


def _unread_in(model: onnx.ModelProto, path: str, libs: list[Library]) -> tuple[set[tuple[str, str]], dict[str, str]]:
    """unread_nodes of `model`: read from `path`, the file it was read from as is (its external
    data beside it), else ("") from a copy written for the frontend."""
    if path:
        return unread_nodes(path, libs)
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "model.onnx")
        onnx.save(model, copy)
        return unread_nodes(copy, libs)


def _library_advice(lib: Library) -> str:
    return (f"op library '{lib.name}' has no OpenVINO side (lib{lib.name}_ov.so): it is built where OpenVINO's "
            f"CMake package is found (pip install {PIN}, then rebuild; load_inline does not build one yet)")


class _Judge:
    """The verdict on each node of the model, from what the frontend left unread."""

    def __init__(self, model: onnx.ModelProto, path: str, libs: list[Library], version: str):
        self.version, self.libs = version, libs
        self.ops = {(registry_domain(op.onnx_domain), op.onnx_type): op for lib in libs for op in lib.ops
                    if op.export_kind == "kernel"}
        self.functions = {(f.domain, f.name) for f in model.functions}
        on_disk = bool(path) and Path(path).is_file()
        if model.functions and on_disk:
            model = onnx.load(path)  # with its external data: the inlined copy is read from elsewhere
        inlined = onnx.inliner.inline_local_functions(model) if model.functions else model
        self.unread, self.failed = _unread_in(inlined, path if on_disk and inlined is model else "", libs)
        opset = next((o.version for o in model.opset_import if registry_domain(o.domain) == ONNX_DOMAIN), 0)
        self.own: dict[str, Verdict] = {}
        rewritten = inlined
        for op_type in sorted(t for d, t in self.unread if d == ONNX_DOMAIN):
            found = rule_for(op_type, opset)
            if found is None:
                continue
            op, _ = found
            try:
                rewritten = with_own_nodes(rewritten, {op_type})
            except OpbridgeError as e:
                self.own[op_type] = Verdict(MISSING, f"opbridge op {op.name}", f"{e}: OpenVINO cannot read "
                                            f"{op_type} and this node cannot be read as {op.qualified_name}'s own")
                continue
            self.own[op_type] = Verdict(OWN_NODE, f"read as {domain_name(op.onnx_domain)}::{op.onnx_type}, "
                                                  f"op {op.name} of library {op.library.name}")
        if rewritten is not inlined:  # the own nodes must convert in turn
            still, failed = _unread_in(rewritten, "", libs)
            for op_type, verdict in list(self.own.items()):
                op, _ = rule_for(op_type, opset)
                key = (registry_domain(op.onnx_domain), op.onnx_type)
                why = next((failed.get(n.name) or failed.get(n.output[0]) for n in rewritten.graph.node
                            if (registry_domain(n.domain), n.op_type) == key
                            and (n.name in failed or n.output[0] in failed)), "")
                if verdict.status == OWN_NODE and (why or key in still):
                    self.own[op_type] = Verdict(MISSING, f"opbridge op {op.name}", f"read as {domain_name(key[0])}::"
                                                f"{key[1]}, whose conversion failed: {why}") if why \
                        else self.custom(*key, False)

    def __call__(self, node: onnx.NodeProto) -> Verdict:
        domain = registry_domain(node.domain)
        if (node.domain, node.op_type) in self.functions:
            return Verdict(MODEL_FUNCTION, f"function {domain_name(node.domain)}::{node.op_type} (inlined "
                                           "before OpenVINO reads the model)")
        read = (domain, node.op_type) not in self.unread
        name = node.name if node.name in self.failed else node.output[0] if node.output else ""
        if name in self.failed:
            return Verdict(MISSING, "", f"OpenVINO {self.version}'s ONNX frontend failed to convert "
                                        f"{domain_name(domain)}::{node.op_type} node '{node.name or name}': "
                                        f"{self.failed[name]}")
        if domain != ONNX_DOMAIN:
            return self.custom(domain, node.op_type, read)
        if read:
            return Verdict(OPENVINO, "OpenVINO's ONNX frontend")
        if node.op_type in self.own:
            return self.own[node.op_type]
        return Verdict(MISSING, "", f"OpenVINO {self.version}'s ONNX frontend cannot read ai.onnx::{node.op_type}, "
                                    "and no loaded op library's export rule writes it: replace it in the model, "
                                    "or load an OpenVINO extension that converts it")

    def custom(self, domain: str, op_type: str, read: bool) -> Verdict:
        op = self.ops.get((domain, op_type))
        qual = f"{domain_name(domain)}::{op_type}"
        if op is not None and op.library.openvino_path is None:
            return Verdict(MISSING, f"opbridge op {op.name}", f"{qual}: {_library_advice(op.library)}")
        if op is not None and read:
            return Verdict(OPBRIDGE, f"library {op.library.name} ({op.library.openvino_path.name}), op {op.name}")
        if read:  # a domain OpenVINO's frontend knows itself (com.microsoft, org.openvinotoolkit)
            return Verdict(OPENVINO, "OpenVINO's ONNX frontend")
        if op is not None:
            return Verdict(MISSING, f"opbridge op {op.name}",
                           f"{qual}: {op.library.openvino_path.name} does not convert it: rebuild the library "
                           "(its OpenVINO side is older than the library)")
        owner = next((lib for lib in self.libs if domain in lib.domains), None)
        if owner is not None:
            return Verdict(MISSING, "", f"{qual}: op library '{owner.name}' (domain '{domain}') has no op {op_type}")
        return Verdict(MISSING, "", f"no runtime reads {qual} in OpenVINO: load the op library of domain "
                                    f"'{domain}' (opbridge.load, or --library) built with its OpenVINO side")


def _since(domain: str, op_type: str, opset: int | None) -> int | None:
    if domain != ONNX_DOMAIN or opset is None:
        return None
    try:
        return onnx.defs.get_schema(op_type, opset, domain).since_version
    except onnx.defs.SchemaError:
        return None


def analyze_openvino(model: onnx.ModelProto, path: str = "") -> ModelReport:
    """inspect's report for OpenVINO (see the module's doc)."""
    ov = _openvino()
    version = ov.__version__.split("-")[0]
    libs = libraries()
    problems: list[Verdict] = []
    try:
        judge = _Judge(model, path, libs, version)
    except RuntimeError as e:  # the frontend refused the model itself (IR version, a malformed graph)
        judge = None
        problems.append(Verdict(MISSING, "the model", f"OpenVINO {version}'s ONNX frontend cannot read it: "
                                                      f"{str(e).strip().splitlines()[-1]}"))
    uses: dict[tuple, OpUse] = {}
    node_verdicts: dict[int, Verdict] = {}
    called: set[tuple[str, str]] = set()
    model_opsets = {registry_domain(o.domain): o.version for o in model.opset_import}

    def walk(nodes, opsets: dict, where: str, top: bool) -> None:
        for i, node in enumerate(nodes):
            domain = registry_domain(node.domain)
            called.add((node.domain, node.op_type))
            verdict = judge(node) if judge else Verdict(MISSING, "", "the model is not read (see above)")
            if top:
                node_verdicts[i] = verdict
            opset = opsets.get(domain)
            use = uses.setdefault((domain, node.op_type, opset, verdict),
                                  OpUse(domain, node.op_type, opset, _since(domain, node.op_type, opset), verdict))
            use.count += 1
            if where not in use.where:
                use.where.append(where)
            for attr, g in subgraphs(node):
                walk(g.node, opsets, f"{where} > {node.op_type}{' ' + repr(node.name) if node.name else ''}.{attr}",
                     False)

    walk(model.graph.node, model_opsets, "graph", True)
    for f in model.functions:
        walk(f.node, {**model_opsets, **{registry_domain(o.domain): o.version for o in f.opset_import}},
             f"function {domain_name(f.domain)}::{f.name}", False)
    inits = {i.name for i in model.graph.initializer}
    return ModelReport(
        path=path, ir_version=model.ir_version,
        producer=" ".join(x for x in (model.producer_name, model.producer_version) if x),
        opsets={o.domain: o.version for o in model.opset_import},
        inputs=[Value.of(i) for i in model.graph.input if i.name not in inits],
        outputs=[Value.of(o) for o in model.graph.output], initializers=len(model.graph.initializer),
        functions=[{"domain": domain_name(f.domain), "name": f.name, "overload": f.overload, "nodes": len(f.node),
                    "used": (f.domain, f.name) in called} for f in model.functions],
        ops=sorted(uses.values(),
                   key=lambda u: (not u.verdict.missing, domain_name(u.domain), u.op_type, u.opset or 0)),
        model_problems=problems, notes=[], runtime=f"openvino {version} (CPU)",
        libraries=[{"name": lib.name, "onnx_domain": lib.onnx_domain, "domains": sorted(lib.domains),
                    "openvino_library": str(lib.openvino_path) if lib.openvino_path else None,
                    "openvino_ops": sorted(op.name for op in lib.ops if op.export_kind == "kernel")} for lib in libs],
        node_verdicts=node_verdicts, model=model)
