"""The dynamo exporter's graph optimizer, kept from changing what a graph computes.

onnxscript's rewrite rules remove x + 0, x - 0, x * 1 and x / 1, and take any scalar constant
within 1e-8 (absolute) or 1e-5 (relative) of 0 or 1 for exactly 0 or 1. So `x + 1e-8` became `x`,
and PointNet++'s interpolation weights `1 / (d + 1e-8)` became `1 / d`: infinity, then NaN, at
d = 0. Where a graph holds such a constant, only constant folding runs; otherwise the optimizer
runs as torch.onnx.export's optimize=True runs it.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import onnx_ir as ir
import onnxscript
from onnx_ir import convenience

# op type -> (the identity value, which operands the no-op rules match against it)
_IDENTITY = {"Add": (0.0, (0, 1)), "Sub": (0.0, (1,)), "Mul": (1.0, (0, 1)), "Div": (1.0, (1,))}
# The tolerances of onnxscript's pattern constants (onnxscript.rewriter.pattern: rel 1e-5, abs 1e-8).
_REL_TOL, _ABS_TOL = 1e-5, 1e-8


def near_identities(model: ir.Model) -> list[str]:
    """"Add(x, 1e-08) (node 'n') by x" for every ai.onnx Add, Sub, Mul or Div of the graph, its
    subgraphs and functions whose scalar constant operand the rewrite rules would take for 0 or 1
    but is not."""
    found = []
    graphs = [model.graph, *model.functions.values()]
    for graph in graphs:
        for node in ir.traversal.RecursiveGraphIterator(graph):
            if node.domain not in ("", "ai.onnx") or node.op_type not in _IDENTITY:
                continue
            identity, operands = _IDENTITY[node.op_type]
            for i in operands:
                value = node.inputs[i] if i < len(node.inputs) else None
                tensor = convenience.get_const_tensor(value) if value is not None else None
                if tensor is None or tensor.shape.rank() != 0 or not tensor.dtype.is_floating_point():
                    continue
                scalar = np.asarray(tensor.numpy())[()]  # in its own dtype: prints as written
                v = float(scalar)
                if v != identity and math.isclose(v, identity, rel_tol=_REL_TOL, abs_tol=_ABS_TOL):
                    args = ["x", "x"]
                    args[i] = str(scalar)
                    found.append(f"{node.op_type}({', '.join(args)}) (node '{node.name}') by x")
    return found


def optimize(program) -> None:
    """Optimizes a torch.onnx.ONNXProgram exported with optimize=False, in place."""
    model = program.model
    onnxscript.optimizer.fold_constants(model)  # constants reached through folding count too
    kept = near_identities(model)
    if not kept:
        program.optimize()
        return
    onnxscript.optimizer.remove_unused_nodes(model)
    warnings.warn("opbridge.export skipped onnxscript's rewrite rules (constant folding ran): they would replace "
                  + "; ".join(kept), stacklevel=3)
