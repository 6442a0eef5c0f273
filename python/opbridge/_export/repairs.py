"""What an exporter writes that the ONNX checker or ONNX Runtime refuses while eager runs the same
model: each repair here names the exporter's habit it undoes.

- agree_input_types (TorchScript exporter): the exporter can widen a value that eager keeps
  float32 after the symbolic functions have run: torch.linspace(..., dtype=torch.float32) comes
  out double, and so does what is computed from it (Deformable DETR's sampling locations, from its
  reference points). An opbridge node then gets inputs that its type constraint says must agree,
  and the model fails the checker. Eager ran the op with one dtype per constraint, so each
  disagreeing input is cast back to it: the dtype of the node's output of that constraint (which
  the symbolic typed from the traced inputs), else of the constraint's first input.
- squeeze_only_ones (dynamo exporter, torch 2.13): `x.squeeze(-1)` on an axis that is not 1 leaves
  x as it is in PyTorch (openpoints' segmentation models do it), but is written as a Squeeze of
  that axis, which ONNX refuses. Such a Squeeze becomes an Identity where the axis's size is known.
"""

from __future__ import annotations

import onnx
from onnx import helper, numpy_helper

from .._library.registry import all_ops


def agree_input_types(proto: onnx.ModelProto) -> None:
    own = {(op.onnx_domain, op.onnx_type): op for op in all_ops() if op.has_own_node}
    if not any((n.domain, n.op_type) in own for n in proto.graph.node):
        return
    inferred = onnx.shape_inference.infer_shapes(proto)  # not strict: the disagreeing nodes stay untyped
    g = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*g.value_info, *g.input, *g.output]}
    types.update((t.name, t.data_type) for t in g.initializer)
    nodes, casts = [], 0
    for node in proto.graph.node:
        op = own.get((node.domain, node.op_type))
        for constraint in op.types if op is not None else ():
            slots = [k for k, spec in enumerate(op.inputs[:len(node.input)])
                     if spec.type == constraint.name and node.input[k]]
            got = [types.get(node.input[k], 0) for k in slots]
            if len({t for t in got if t}) <= 1:
                continue
            outputs = [types.get(o, 0) for o, spec in zip(node.output, op.outputs) if spec.type == constraint.name]
            want = next((t for t in outputs if t), got[0])
            for k, t in zip(slots, got):
                if t and t != want:
                    casts += 1
                    name = f"{node.input[k]}_as_{onnx.TensorProto.DataType.Name(want).lower()}_{casts}"
                    nodes.append(helper.make_node("Cast", [node.input[k]], [name], to=want,
                                                  name=f"{node.name or node.op_type}_input{k}_cast"))
                    node.input[k] = name
        nodes.append(node)
    if casts:
        del proto.graph.node[:]
        proto.graph.node.extend(nodes)


def squeeze_only_ones(proto: onnx.ModelProto) -> None:
    squeezes = [n for n in proto.graph.node if n.op_type == "Squeeze" and n.domain in ("", "ai.onnx") and len(n.input) > 1]
    if not squeezes:
        return
    inferred = onnx.shape_inference.infer_shapes(proto)  # not strict: the bad Squeeze stays unshaped
    g = inferred.graph
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
              for v in [*g.value_info, *g.input] if v.type.tensor_type.HasField("shape")}
    constants = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    constants.update((n.output[0], numpy_helper.to_array(n.attribute[0].t)) for n in g.node
                     if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value")
    # The ranks the exporter recorded for the Squeezes' outputs: where PyTorch kept an axis whose
    # size is symbolic (torch.export takes a dynamic size to be >= 2), the output has the input's rank.
    recorded = {v.name: len(v.type.tensor_type.shape.dim) for v in [*proto.graph.value_info, *proto.graph.output]
                if v.type.tensor_type.HasField("shape")}
    for node in squeezes:
        shape, axes = shapes.get(node.input[0]), constants.get(node.input[1])
        if shape is None or axes is None:
            continue
        sizes = [shape[int(a)] for a in axes.reshape(-1) if -len(shape) <= int(a) < len(shape)]
        kept = recorded.get(node.output[0]) == len(shape) and all(s != 1 for s in sizes)
        if sizes and (kept or all(s is not None and s != 1 for s in sizes)):  # PyTorch keeps such axes
            node.op_type = "Identity"
            del node.input[1:]
