"""The mechanism itself: manifest, generated schemas and rules, and the rule that adapters and
the export glue never name an op."""

import re
from pathlib import Path

import onnx
import pytest
import torch

import opbridge

ROOT = Path(__file__).resolve().parents[2]
GENERIC_FILES = sorted(
    [*ROOT.glob("adapters/**/*.cc"), *ROOT.glob("core/**/*.cc"), *ROOT.glob("core/**/*.h")]
    + [ROOT / "python/opbridge" / f for f in ("_library.py", "_schemas.py", "_exporters.py", "_fake.py", "_api.py", "testing.py")]
)


def test_adapters_and_glue_name_no_op():
    names = set()
    for op in opbridge.builtin.ops:
        names |= {op.name, op.onnx_type}
    for path in GENERIC_FILES:
        text = path.read_text()
        for name in names:
            assert not re.search(rf"\b{re.escape(name)}\b", text), f"{path.relative_to(ROOT)} names op '{name}'"


def test_every_op_has_its_folder_test_and_doc():
    for op in opbridge.builtin.ops:
        folder = ROOT / "ops" / op.name
        assert (folder / f"{op.name}.cc").exists(), op.name
        assert (folder / f"test_{op.name}.py").exists(), f"{op.name} has no Python test"
        assert (ROOT / "docs" / "ops" / f"{op.name}.md").exists(), f"{op.name} has no doc"


def test_manifest_describes_ops():
    op = opbridge.builtin.op("dual_residual")
    assert op.torch_op == "opbridge::dual_residual"
    assert (op.onnx_domain, op.onnx_type, op.since_version) == ("opbridge", "DualResidual", 1)
    assert [a["name"] for a in op.attributes] == ["alpha"] and op.attributes[0]["default"] == 1.0
    assert [o["name"] for o in op.outputs] == ["r1", "r2"]
    assert opbridge.builtin.op("asinh").export_kind == "mapping"


def test_onnx_schemas_are_registered_for_custom_ops():
    for op in opbridge.builtin.ops:
        if op.export_kind != "kernel":
            continue
        s = onnx.defs.get_schema(op.onnx_type, op.since_version, op.onnx_domain)
        assert [i.name for i in s.inputs] == [i["name"] for i in op.inputs]
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
    a = torch.ones(2, requires_grad=True)
    y = torch.ops.opbridge.my_add(a, torch.ones(2))
    with pytest.raises(RuntimeError, match="opbridge::my_add"):
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

    from opbridge._exporters import ExportOptions, choose_target

    op = opbridge.builtin.op("my_add")
    rule = {"domain": "", "op_type": "Sum", "min_opset": 1, "inputs": [], "attributes": []}
    tied = dataclasses.replace(op, export_rules=[rule])
    assert choose_target(tied, ExportOptions(17)).op_type == "Sum"
    assert choose_target(tied, ExportOptions(17, custom_nodes=True)).op_type == "MyAdd"
