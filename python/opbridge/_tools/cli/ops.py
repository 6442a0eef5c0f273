"""`opbridge ops`: the loaded operators, as a table or as JSON."""

from __future__ import annotations

import dataclasses
import json

from ._common import load_libraries, opbridge_api, table

NEEDS_TORCH = True
HELP = "list the loaded operators"
DESCRIPTION = ("Every loaded operator: PyTorch signature, ONNX domain/op/version, dtypes per input and "
               "output, and the export mapping.")
EPILOG = """example:
  opbridge ops
  opbridge ops --json | python -c 'import json,sys; print([o["name"] for o in json.load(sys.stdin)["ops"]])'
"""


def add_arguments(c) -> None:
    c.add_argument("--json", action="store_true", help="machine-readable output")


def _domain(d: str) -> str:
    return d if d not in ("", "ai.onnx") else "ai.onnx"


def _torch_schema(op) -> str | None:
    try:
        return str(op.overload._schema)
    except Exception:  # noqa: BLE001 - a mapping to an op torch lacks in this build
        return None


def export_summary(op) -> str:
    """Which ONNX node the op becomes, by target opset, e.g. 'opbridge::MyConv v1; ai.onnx::Conv from opset 11'."""
    parts = []
    if op.export_kind == "kernel":
        parts.append(f"{_domain(op.onnx_domain)}::{op.onnx_type} v{op.since_version}")
    elif op.export_kind == "function":
        parts.append(f"{_domain(op.onnx_domain)}::{op.onnx_type} v{op.since_version} (function, opset {op.function.opset}+)")
    for r in op.export_rules:
        target = f"{_domain(r.domain)}::{r.op_type}" if r.resolved else f"opbridge op {r.opbridge_op}"
        target += f" from opset {r.min_opset}" if r.min_opset > 1 else ""
        target += "".join(f" for {t} in {{{', '.join(ds)}}}" for t, ds in r.target_types)
        parts.append(target)
    return "; ".join(parts)


def _json_value(v):
    """A default as JSON has it: the manifest's lists come back as tuples."""
    return list(v) if isinstance(v, tuple) else v


def op_json(op) -> dict:
    return {
        "name": op.name,
        "library": op.library.name,
        "qualified_name": op.qualified_name,
        "torch_schema": _torch_schema(op),
        "defines_torch_op": op.defines_torch_op,
        "doc": op.doc,
        "export": {"kind": op.export_kind,
                   "own_node": ({"domain": _domain(op.onnx_domain), "op_type": op.onnx_type,
                                 "since_version": op.since_version} if op.has_own_node else None),
                   "rules": [r.to_json() for r in op.export_rules],
                   "function": dataclasses.asdict(op.function) if op.function else None,
                   "summary": export_summary(op)},
        "inputs": [{"name": i.name, "type": i.type, "dtypes": list(op.type_constraint(i.type).dtypes),
                    "optional": i.optional, "doc": i.doc} for i in op.inputs],
        "attributes": [{"name": a.name, "kind": a.kind, **({"default": _json_value(a.default)} if a.has_default else {}),
                        "doc": a.doc} for a in op.attributes],
        "outputs": [{"name": o.name, "type": o.type, "dtypes": list(op.type_constraint(o.type).dtypes),
                     "shape": str(o.shape), "data_dependent": o.data_dependent, "doc": o.doc} for o in op.outputs],
        "checks": [str(c) for c in op.checks],
    }



EXPORT_KINDS = {  # known export kinds, for the legend only; others print as they are
    "kernel": "a node in the library's ONNX domain, run by its ONNX Runtime library",
    "mapping": "no node of its own: export rules write other ops (standard ai.onnx ops or library ops)",
    "function": "an ONNX function in the library's domain, defined inside the exported model",
}


def run(args) -> int:
    load_libraries(args.library, args.jit)
    ob = opbridge_api()
    libs = ob.libraries()
    if args.json:
        print(json.dumps({
            "libraries": [{"name": lib.name, "torch_namespace": lib.torch_namespace,
                           "onnx_domain": lib.onnx_domain, "onnx_domain_version": lib.onnx_domain_version,
                           "torch_library": str(lib.torch_path), "ort_library": str(lib.ort_path) if lib.ort_path else None,
                           "ops": [op.name for op in lib.ops]} for lib in libs],
            "ops": [op_json(op) for op in ob.all_ops()],
        }, indent=2))
        return 0
    for lib in libs:
        ort_lib = lib.ort_path.name if lib.ort_path else "no ONNX Runtime library"
        print(f"library {lib.name}: torch namespace '{lib.torch_namespace}', ONNX domain '{lib.onnx_domain}' "
              f"v{lib.onnx_domain_version}, {len(lib.ops)} ops ({lib.torch_path.name}, {ort_lib})")
        rows, sigs = [], []
        for op in lib.ops:
            args_ = [f"{i.name}{'?' if i.optional else ''}:{i.type}" for i in op.inputs]
            outs = [f"{o.name}:{o.type}" for o in op.outputs]
            types = "; ".join(f"{t.name}={'|'.join(t.dtypes)}" for t in op.types)
            rows.append([op.name, op.export_kind, export_summary(op), f"({', '.join(args_)}) -> ({', '.join(outs)})",
                         types])
            sigs.append(_torch_schema(op) or f"{op.qualified_name} (not in this torch build)")
        lines = table(rows, ["op", "export", "ONNX (by target opset)", "inputs -> outputs", "dtypes"])
        print("\n".join(lines[:2]))
        for line, sig in zip(lines[2:], sigs):
            print(line)
            print(f"    torch: {sig}")
        print()
    kinds = sorted({op.export_kind for op in ob.all_ops()})
    legend = "; ".join(f"{k} = {EXPORT_KINDS.get(k, 'see the op library')}" for k in kinds)
    print(f"{sum(len(lib.ops) for lib in libs)} ops in {len(libs)} librar{'y' if len(libs) == 1 else 'ies'}"
          + (f". export: {legend}" if legend else ""))
    return 0
