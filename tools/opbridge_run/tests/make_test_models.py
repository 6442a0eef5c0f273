"""Writes the small ONNX models the opbridge-run CLI tests use (no torch needed):

    python make_test_models.py DIR

- all_types.onnx: one Identity per element type opbridge-run feeds, inputs of shape ["n", 3]
  (plus a 0-d input and one with an unnamed dynamic axis); one output name holds a '/'.
- unknown_op.onnx: a node of the opbridge domain that no library implements.
- foreign_domain.onnx: nodes of a custom domain, com.acme, one of them in an If branch, that no
  registered library provides.
- string_input.onnx: a string input, which opbridge-run cannot feed.
- my_add_two_dims.onnx: opbridge's MyAdd on inputs of shapes ["a", 8] and ["b", 8], which fails
  at run time (in the kernel) unless a == b or one is 1.
"""

import sys
from pathlib import Path

import onnx
from onnx import TensorProto, helper

TYPES = {
    "bool": TensorProto.BOOL, "int8": TensorProto.INT8, "uint8": TensorProto.UINT8,
    "int16": TensorProto.INT16, "uint16": TensorProto.UINT16, "int32": TensorProto.INT32,
    "uint32": TensorProto.UINT32, "int64": TensorProto.INT64, "uint64": TensorProto.UINT64,
    "float16": TensorProto.FLOAT16, "float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE,
}


def model(nodes, inputs, outputs, opsets=(("", 17),)):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = 8
    return m


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    nodes, ins, outs = [], [], []
    for name, t in TYPES.items():
        out_name = "out/float32" if name == "float32" else f"out_{name}"
        nodes.append(helper.make_node("Identity", [f"in_{name}"], [out_name]))
        ins.append(helper.make_tensor_value_info(f"in_{name}", t, ["n", 3]))
        outs.append(helper.make_tensor_value_info(out_name, t, ["n", 3]))
    nodes += [helper.make_node("Identity", ["scalar"], ["out_scalar"]),
              helper.make_node("Identity", ["unnamed"], ["out_unnamed"])]
    ins += [helper.make_tensor_value_info("scalar", TensorProto.DOUBLE, []),
            helper.make_tensor_value_info("unnamed", TensorProto.FLOAT, [None, 2])]
    outs += [helper.make_tensor_value_info("out_scalar", TensorProto.DOUBLE, []),
             helper.make_tensor_value_info("out_unnamed", TensorProto.FLOAT, [None, 2])]
    m = model(nodes, ins, outs)
    onnx.checker.check_model(m, full_check=True)
    onnx.save(m, out / "all_types.onnx")

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    onnx.save(model([helper.make_node("NoSuchOp", ["x"], ["y"], domain="opbridge")], [x], [y],
                    opsets=(("", 17), ("opbridge", 1))), out / "unknown_op.onnx")

    c = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    branch = helper.make_graph([helper.make_node("Deep", ["x"], ["b"], domain="com.acme")], "branch", [],
                               [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])])
    onnx.save(model([helper.make_node("Mystery", ["x"], ["m"], domain="com.acme"),
                     helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)], [x, c], [y],
                    opsets=(("", 17), ("com.acme", 1))), out / "foreign_domain.onnx")

    s = helper.make_tensor_value_info("s", TensorProto.STRING, [2])
    t = helper.make_tensor_value_info("t", TensorProto.STRING, [2])
    onnx.save(model([helper.make_node("Identity", ["s"], ["t"])], [s], [t]), out / "string_input.onnx")

    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["a", 8])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["b", 8])
    c = helper.make_tensor_value_info("c", TensorProto.FLOAT, None)
    onnx.save(model([helper.make_node("MyAdd", ["a", "b"], ["c"], domain="opbridge")], [a, b], [c],
                    opsets=(("", 17), ("opbridge", 1))), out / "my_add_two_dims.onnx")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
