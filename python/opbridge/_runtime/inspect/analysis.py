"""The whole model: every node of the main graph, its control-flow subgraphs and the model-local
functions it calls, judged and grouped into one report."""

from __future__ import annotations

import onnx
import onnxruntime as ort

from ..._library.errors import OpbridgeError
from ..._library.registry import libraries
from .checker import Checker
from .onnx_types import domain_name, graph_types, registry_domain, subgraphs, value_infos
from .opbridge_nodes import output_value_infos
from .report import MISSING, MODEL_FUNCTION, ModelReport, OpUse, Value, Verdict
from .runtime import header_problems

MAX_PASSES = 8  # rounds of ONNX's inference and opbridge's rules; each reaches past one custom node


def infer(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    """The model with inferred value_info (types and shapes of intermediate tensors), or the
    model as is with the reason inference failed. ONNX's shape inference knows nothing of custom
    nodes: the outputs of the loaded libraries' ops are typed from their definitions, and ONNX's
    inference runs again from there."""
    ops = {(registry_domain(op.onnx_domain), op.onnx_type): op for lib in libraries() for op in lib.ops
           if op.export_kind == "kernel"}
    inferred = model
    try:
        for _ in range(MAX_PASSES):
            inferred = onnx.shape_inference.infer_shapes(inferred, check_type=False, strict_mode=False, data_prop=True)
            values = value_infos(inferred.graph)
            added = [vi for node in inferred.graph.node if (registry_domain(node.domain), node.op_type) in ops
                     for vi in output_value_infos(ops[(registry_domain(node.domain), node.op_type)], node, values)]
            if not added:
                return inferred, None
            inferred.graph.value_info.extend(added)
        return inferred, None
    except Exception as e:  # noqa: BLE001 - inspection goes on without inferred types
        return model, f"shape inference failed ({str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}); "\
                      "types of intermediate tensors are unknown"


def analyze(model: onnx.ModelProto, path: str = "", runtime: str = "onnxruntime") -> ModelReport:
    """Who runs each node of the model in `runtime`: "onnxruntime" (the installed ONNX Runtime and
    the loaded libraries' ONNX Runtime sides) or "openvino" (see ov_frontend)."""
    if runtime == "openvino":
        from .ov_frontend import analyze_openvino
        return analyze_openvino(model, path)
    if runtime != "onnxruntime":
        raise OpbridgeError(f"inspect: runtime must be 'onnxruntime' or 'openvino', got {runtime!r}")
    inferred, note = infer(model)
    libs = libraries()
    checker = Checker(inferred, libs)
    model_opsets = {registry_domain(o.domain): o.version for o in inferred.opset_import}
    uses: dict[tuple, OpUse] = {}
    node_verdicts: dict[int, Verdict] = {}
    called: list[tuple[str, str, str]] = []

    values = value_infos(inferred.graph)

    def visit(node, opsets, types: dict[str, str], where: str, index: int | None):
        domain = registry_domain(node.domain)
        verdict = checker.node(node, opsets, types.get, values=values if where == "graph" else None)
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
            for attr, g in subgraphs(node):
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
        opsets.update({registry_domain(o.domain): o.version for o in f.opset_import})
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
        model_problems=list(header_problems(inferred.ir_version, opsets_sorted)),
        notes=notes,
        runtime=f"onnxruntime {ort.__version__} (CPU)",
        libraries=[{"name": lib.name, "onnx_domain": lib.onnx_domain,
                    "domains": sorted(lib.domains),  # its own, and those its ops name for their nodes
                    "ort_library": str(lib.ort_path) if lib.ort_path else None} for lib in libs],
        node_verdicts=node_verdicts,
        model=inferred,
    )


def cannot_run(model: onnx.ModelProto, runtime: str = "onnxruntime") -> list[str]:
    """What the installed runtime (with the loaded libraries) cannot run in this model, one line
    per op (with the nodes' count and where) or header problem, each with inspect's advice; empty
    when it can run everything."""
    report = analyze(model, runtime=runtime)
    lines = [f"{p.detail}: {p.advice}" for p in report.model_problems]
    for use in report.ops:
        if not use.verdict.missing:
            continue
        what = f"{domain_name(use.domain)}::{use.op_type}" + (f"-{use.since}" if use.since else "")
        count = f"{use.count} node{'s' if use.count > 1 else ''}" + ("" if use.where == ["graph"] else
                                                                   f" in {', '.join(use.where)}")
        lines.append(f"{what} ({count}): {use.verdict.advice}")
    return lines
