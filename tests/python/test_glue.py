"""The mechanism itself: manifest, generated schemas and rules. (That generic code never names
an op: test_structure.py.)"""

from pathlib import Path

import onnx
import pytest
import torch

import opbridge
from op_layout import op_homes

ROOT = Path(__file__).resolve().parents[2]


def test_every_op_has_its_folder_test_and_doc():
    # An op lives, is tested and is documented in the folder whose <folder>.cc defines it (with
    # the op it differentiates, or the family of ops it belongs to).
    homes = op_homes()
    for op in opbridge.builtin.ops:
        name = homes.get(op.name)
        assert name is not None, f"no ops/<folder>/<folder>.cc defines {op.name}"
        assert (ROOT / "ops" / name / f"test_{name}.py").exists(), f"{op.name} has no Python test"
        assert (ROOT / "docs" / "ops" / f"{name}.md").exists(), f"{op.name} has no doc"


def test_manifest_describes_ops():
    op = opbridge.builtin.op("dual_residual")
    assert op.qualified_name == "opbridge::dual_residual"
    assert (op.onnx_domain, op.onnx_type, op.since_version) == ("opbridge", "DualResidual", 1)
    assert [a.name for a in op.attributes] == ["alpha"] and op.attributes[0].default == 1.0
    assert [o.name for o in op.outputs] == ["r1", "r2"]
    assert opbridge.builtin.op("asinh").export_kind == "kernel"  # aten::asinh with a kernel for float64
    assert opbridge.builtin.op("torch_cluster_grid").export_kind == "mapping"


def test_onnx_schemas_are_registered_for_custom_ops():
    for op in opbridge.builtin.ops:
        if op.export_kind != "kernel":
            continue
        s = onnx.defs.get_schema(op.onnx_type, op.since_version, op.onnx_domain)
        # The op's inputs, then an optional input per attribute a graph may compute (npoint_value).
        assert [i.name for i in s.inputs] == [i.name for i in op.inputs] + \
            [f"{a.name}_value" for a in op.symbolic_attributes]
        assert len(s.outputs) == len(op.outputs)


def test_torch_schema_is_generated_from_the_spec():
    schema = str(torch.ops.opbridge.dual_residual.default._schema)
    assert schema == "opbridge::dual_residual(Tensor x, Tensor y, float alpha=1.) -> (Tensor, Tensor)"
    # Attributes stay positional, as the seed notes call them.
    x, y = torch.ones(2), torch.zeros(2)
    assert torch.equal(torch.ops.opbridge.dual_residual(x, y, 0.5)[0], torch.full((2,), 0.5))


def test_float_attribute_is_float32_in_both_runtimes():
    # 0.1 is not a float32; eager rounds it as ONNX Runtime must, so the two agree exactly.
    x = torch.ones(3, dtype=torch.float64)
    r1, _ = torch.ops.opbridge.dual_residual(x, torch.zeros(3, dtype=torch.float64), alpha=0.1)
    assert r1[0].item() == float(torch.tensor(0.1, dtype=torch.float32).item())


def test_backward_is_reported_not_silently_wrong():
    # An op whose definition names no backward op.
    a = torch.ones(2, requires_grad=True)
    y = torch.ops.opbridge.foo(a, torch.ones(2))
    with pytest.raises(RuntimeError, match="opbridge::foo"):
        y.sum().backward()


def test_fake_tensor_shapes_are_symbolic_under_export():
    class M(torch.nn.Module):
        def forward(self, a, b):
            return torch.ops.opbridge.my_add(a, b)

    batch = torch.export.Dim("batch")
    ep = torch.export.export(M(), (torch.ones(4, 3), torch.ones(3)), dynamic_shapes=({0: batch}, None))
    out = [n for n in ep.graph.nodes if n.op == "call_function"][0].meta["val"]
    assert str(out.shape[0]) == "s0" or not isinstance(out.shape[0], int)
    assert out.shape[1] == 3


def test_a_rule_wins_a_tie_with_the_own_node():
    import dataclasses

    from opbridge._export.rules import ExportOptions, choose_target
    from opbridge._library.manifest import ExportRule

    op = opbridge.builtin.op("my_add")
    rule = ExportRule(domain="", op_type="Sum", min_opset=1, inputs=(), attributes=())
    tied = dataclasses.replace(op, export_rules=(rule,))
    assert choose_target(tied, ExportOptions(17)).op_type == "Sum"
    assert choose_target(tied, ExportOptions(17, custom_nodes=True)).op_type == "MyAdd"


def test_manifest_is_read_into_typed_pieces():
    from opbridge._library.manifest import RuleInput
    from opbridge._library.shapes import Expr

    resize = opbridge.builtin.op("resize_bicubic")
    assert resize.data_dependent and resize.check_op == "_check_resize_bicubic"
    assert resize.outputs[0].shape.dims == (Expr("dim", 0, ("x",)), Expr("dim", 1, ("x",)), Expr("data"), Expr("data"))
    assert str(resize.outputs[0].shape) == "[x.shape[0], x.shape[1], <data-dependent>, <data-dependent>]"
    knn = opbridge.builtin.op("knn_query")
    assert not knn.data_dependent and knn.check_op == ""
    assert [str(c.lhs) + " " + c.rel + " " + str(c.rhs) for c in knn.checks][:2] == ["k >= 1", "xyz.shape[1] == 3"]
    assert str(knn.outputs[0].shape.dims[0]) == "(new_xyz or xyz).shape[0]"
    (rule,) = resize.export_rules
    assert rule.standard and (rule.op_type, rule.min_opset, str(rule)) == ("Resize", 13, "ai.onnx Resize")
    assert rule.inputs == (RuleInput("x"), RuleInput(""), RuleInput("scales"))
    assert {a.name: a.value for a in rule.attributes if a.fixed}["mode"] == "cubic"
    selu = opbridge.builtin.op("selu")
    assert (selu.qualified_name, selu.export_kind, selu.defines_torch_op) == ("aten::selu", "function", False)
    assert selu.function.opset == 15 and "Exp (self)" in selu.function.body
    conv = opbridge.builtin.op("deform_conv2d")
    assert conv.attribute("stride").default == (1, 1)
    assert conv.type_constraint("T").dtypes == ("float32", "float64", "float16", "bfloat16")
    pads = next(a for a in conv.export_rules[0].attributes if a.name == "pads")
    assert not pads.fixed and pads.sources == ("padding", "padding")
    with pytest.raises(opbridge.OpbridgeError, match="opbridge::deform_conv2d has no attribute 'strides'"):
        conv.attribute("strides")


def test_manifest_with_an_unknown_dtype_or_kind_is_refused():
    import copy
    import json

    from opbridge._library.manifest import from_json

    lib = opbridge.builtin
    text = json.dumps({"library": "x", "torch_namespace": "x", "onnx_domain": "x", "onnx_domain_version": 1,
                       "errors": [], "ops": [{
                           "name": "op", "qualified_name": "x::op", "defines_torch_op": True, "doc": "",
                           "export": {"kind": "kernel", "domain": "x", "op_type": "Op", "since_version": 1, "rules": []},
                           "types": [{"name": "T", "dtypes": ["float32"], "onnx": ["tensor(float)"]}],
                           "inputs": [], "attributes": [{"name": "a", "kind": "int", "doc": ""}], "outputs": [],
                           "checks": [], "backward": "", "check_op": ""}]})
    assert from_json(json.loads(text), lib.torch_path, None).op("op").attribute("a").required
    bad_dtype, bad_kind = json.loads(text), json.loads(text)
    bad_dtype["ops"][0]["types"][0] = {"name": "T", "dtypes": ["complex32"], "onnx": ["tensor(complex32)"]}
    bad_kind["ops"][0]["attributes"][0]["kind"] = "tensor"
    for m, what in ((bad_dtype, "dtype 'complex32'"), (bad_kind, "attribute kind 'tensor'")):
        with pytest.raises(opbridge.OpbridgeError, match=f"op 'op': the manifest names {what}"):
            from_json(copy.deepcopy(m), lib.torch_path, None)


def test_the_kind_tables_agree_with_onnx_numpy_and_torch():
    import numpy as np
    from onnx import AttributeProto, TensorProto, helper

    from opbridge._library.kinds import ATTR_KINDS, DTYPES, dtype_of

    for name, d in DTYPES.items():
        assert TensorProto.DataType.Name(d.onnx).lower() == d.onnx_name, name
        assert dtype_of(d.torch) is d
        if d.numpy is not None:
            assert helper.tensor_dtype_to_np_dtype(d.onnx) == d.numpy == torch.empty(0, dtype=d.torch).numpy().dtype
            assert dtype_of(d.numpy) is d
    used = {t for op in opbridge.all_ops() for c in op.types for t in c.dtypes}
    assert used <= set(DTYPES)
    assert {a.kind for op in opbridge.all_ops() for a in op.attributes} <= set(ATTR_KINDS)
    samples = {"int": 3, "bool": True, "float": 0.5, "str": "s", "int[]": [1, 2], "float[]": [0.5]}
    for name, k in ATTR_KINDS.items():
        assert k.schema_type.name == AttributeProto.AttributeType.Name(k.proto_type), name
        assert k.attribute_proto("a", samples[name]).type == helper.make_attribute("a", samples[name]).type, name
        assert all(helper.make_attribute("a", v).type != k.proto_type for v in k.other_kind_values), name
    assert ATTR_KINDS["float[]"].attribute_proto("a", []).type == AttributeProto.FLOATS
