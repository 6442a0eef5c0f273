"""What a user's model brings that opbridge's own catalogue does not: ops opbridge does not
define (your own translations), standard ops the runtime lacks (the export-time check, and
verify saying "cannot run"), output names taken from op definitions, rules that name ops of
libraries not loaded."""

import numpy as np
import onnx
import onnxscript
import pytest
import torch

import opbridge
from opbridge._export.rules import resolve
from opbridge._library.manifest import ExportRule

# ---- an op opbridge does not define, with your own translations -----------------------------
_lib = torch.library.Library("userlib", "DEF")
_lib.define("two_out(Tensor x, float alpha) -> (Tensor, Tensor)")
_lib.impl("two_out", lambda x, alpha: (x * alpha, x - alpha), "CompositeExplicitAutograd")
torch.library.register_fake("userlib::two_out", lambda x, alpha: (torch.empty_like(x), torch.empty_like(x)), lib=_lib)
TWO_OUT = torch.ops.userlib.two_out.default


class TwoOut(torch.nn.Module):
    def forward(self, x):
        a, b = torch.ops.userlib.two_out(x, 2.5)
        return a + 1, b


op20 = onnxscript.opset20


def two_out_standard(x, alpha: float):
    """onnxscript translation into standard ops: x * alpha, x - alpha."""
    a = op20.CastLike(op20.Constant(value_float=alpha), x)
    return op20.Mul(x, a), op20.Sub(x, a)


def two_out_symbolic(g, x, alpha):
    """The TorchScript exporter's way: a symbolic registered with torch.onnx."""
    a = g.op("Constant", value_t=torch.tensor(torch.onnx.symbolic_helper._maybe_get_const(alpha, "f")))
    a = g.op("CastLike", a, x)
    return g.op("Mul", x, a), g.op("Sub", x, a)


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_an_op_opbridge_does_not_define_exports_with_both_exporters(exporter):
    x = torch.randn(4, 3)
    if exporter == "dynamo":
        m = opbridge.export(TwoOut(), (x,), extra_translations={TWO_OUT: two_out_standard})
    else:
        torch.onnx.register_custom_op_symbolic("userlib::two_out", two_out_symbolic, 9)
        try:
            m = opbridge.export(TwoOut(), (x,), exporter="torchscript")
        finally:
            torch.onnx.unregister_custom_op_symbolic("userlib::two_out", 9)
    assert {"Mul", "Sub"} <= {n.op_type for n in m.graph.node}
    report = opbridge.verify(TwoOut(), (x,), m)
    assert report.ok, report.table()
    a, b = opbridge.session(m).run(None, {m.graph.input[0].name: x.numpy()})
    np.testing.assert_allclose(a, x.numpy() * 2.5 + 1, rtol=1e-6)
    np.testing.assert_allclose(b, x.numpy() - 2.5, rtol=1e-6)


def test_extra_translations_are_for_the_dynamo_exporter():
    with pytest.raises(opbridge.OpbridgeError, match="extra_translations are onnxscript translations for the dynamo "
                                                     "exporter; for the TorchScript exporter register a symbolic"):
        opbridge.export(TwoOut(), (torch.randn(2),), exporter="torchscript",
                        extra_translations={TWO_OUT: two_out_standard})


custom = onnxscript.values.Opset("com.example.user", 1)


def two_out_custom(x, alpha: float):
    return custom.TwoOutNode(x, alpha=alpha)


def test_custom_node_without_schema_is_named_with_the_fix():
    with pytest.raises(opbridge.OpbridgeError) as e:
        opbridge.export(TwoOut(), (torch.randn(3),), extra_translations={TWO_OUT: two_out_custom})
    assert str(e.value) == (
        "a translation writes com.example.user::TwoOutNode (domain version 1), which has no ONNX schema: declare it "
        "first, e.g. opbridge.declare_node('com.example.user', 'TwoOutNode', inputs=[...], outputs=[...], version=1)")


def test_declared_custom_node_exports_for_another_runtime():
    opbridge.declare_node("com.example.user", "TwoOutNode", inputs=["x"], outputs=["scaled", "shifted"],
                          attributes={"alpha": "float"})
    x = torch.randn(3)
    # No runtime here implements the node: the export-time check says so ...
    with pytest.raises(opbridge.OpbridgeError, match=r"cannot run in ONNX Runtime .*\n  com\.example\.user::TwoOutNode "
                                                     r"\(1 node\): no runtime implements"):
        opbridge.export(TwoOut(), (x,), extra_translations={TWO_OUT: two_out_custom})
    # ... and a model for another runtime is exported on request, checked by the ONNX checker.
    m = opbridge.export(TwoOut(), (x,), extra_translations={TWO_OUT: two_out_custom}, check_runtime=False)
    node = next(n for n in m.graph.node if n.op_type == "TwoOutNode")
    assert node.domain == "com.example.user" and len(node.output) == 2
    assert [a.name for a in node.attribute] == ["alpha"] and node.attribute[0].f == pytest.approx(2.5)
    onnx.checker.check_model(m, full_check=True)


def test_declare_node_refuses_what_it_cannot_declare():
    with pytest.raises(opbridge.OpbridgeError, match="needs a custom domain"):
        opbridge.declare_node("", "Relu2", inputs=["x"], outputs=["y"])
    with pytest.raises(opbridge.OpbridgeError, match="attribute 'flag' has kind 'bool'"):
        opbridge.declare_node("com.example.user", "Flagged", inputs=["x"], outputs=["y"], attributes={"flag": "bool"})
    with pytest.raises(opbridge.OpbridgeError, match="output_dtypes names \\['nope'\\], which are not outputs"):
        opbridge.declare_node("com.example.user", "Typed", inputs=["x"], outputs=["y"], output_dtypes={"nope": "int64"})


# ---- models the runtime cannot run -----------------------------------------------------------
class Hyperbolic(torch.nn.Module):
    def forward(self, x):
        return torch.acosh(x) + torch.sinh(x)


def test_export_refuses_a_model_the_runtime_cannot_run_naming_every_node():
    x = torch.rand(3, dtype=torch.float64) + 1
    with pytest.raises(opbridge.OpbridgeError) as e:
        opbridge.export(Hyperbolic(), (x,))
    msg = str(e.value)
    assert msg.startswith("the exported model cannot run in ONNX Runtime ")
    assert "ai.onnx::Acosh-9 (1 node): ONNX Runtime" in msg and "ai.onnx::Sinh-9 (1 node): ONNX Runtime" in msg
    assert "take T in {float}; this node has T=double: cast to a supported type" in msg
    assert msg.endswith("(export with check_runtime=False for another runtime)")
    # float32 runs: no complaint.
    opbridge.export(Hyperbolic(), (x.float(),))


class Deform(torch.nn.Module):
    def forward(self, x, weight, offset):
        return torch.ops.opbridge.deform_conv2d(x, weight, offset, None, None, padding=[1, 1])


def test_a_standard_op_the_runtime_lacks_that_an_op_wrote_is_answered_with_custom_nodes(monkeypatch):
    """ONNX Runtime before 1.25 has no DeformConv kernel: the answer is opbridge's own node."""
    from opbridge._runtime.inspect import analysis, checker

    g = torch.Generator().manual_seed(0)
    args = (torch.rand(1, 2, 5, 5, generator=g), torch.rand(3, 2, 3, 3, generator=g),
            torch.rand(1, 18, 5, 5, generator=g))
    model = opbridge.export(Deform(), args, opset=19)
    assert "DeformConv" in {n.op_type for n in model.graph.node}
    kernels, schemas = checker.ort_registry()
    without = {k: v for k, v in kernels.items() if k[1] != "DeformConv"}
    monkeypatch.setattr(checker, "ort_registry", lambda: (without, schemas))
    problems = analysis.cannot_run(model)
    assert len(problems) == 1 and "no CPU kernel for ai.onnx::DeformConv" in problems[0], problems
    assert "opbridge's deform_conv2d wrote it: export with custom_nodes=True" in problems[0]


def test_verify_reports_cannot_run_instead_of_raising():
    x = torch.rand(3, dtype=torch.float64) + 1
    m = opbridge.export(Hyperbolic(), (x,), check_runtime=False)
    report = opbridge.verify(Hyperbolic(), (x,), m)
    assert not report.ok and report.outputs == []
    assert "ai.onnx::Acosh-9 (1 node)" in report.cannot_run
    assert report.table().startswith("cannot run: ai.onnx::Acosh-9")


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_float64_asinh_model_runs(exporter):
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.asinh(x) * 3

    x = torch.linspace(-4, 4, 9, dtype=torch.float64)
    m = opbridge.export(M(), (x,), exporter=exporter)
    report = opbridge.verify(M(), (x,), m, rtol=1e-13, atol=1e-14)
    assert report.ok, report.table()


# ---- names ---------------------------------------------------------------------------------
class Dual(torch.nn.Module):
    def forward(self, x, y):
        r1, r2 = opbridge.dual_residual(x, y, alpha=2.0)
        return r1 * 2, r2


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_outputs_of_opbridge_nodes_take_the_definitions_names(exporter):
    x, y = torch.randn(3), torch.randn(3)
    m = opbridge.export(Dual(), (x, y), exporter=exporter)
    node = next(n for n in m.graph.node if n.op_type == "DualResidual")
    assert list(node.output) == ["r1", "r2"]
    assert m.graph.output[1].name == "r2"  # a model output straight from the op
    # Names the caller gives win.
    m = opbridge.export(Dual(), (x, y), exporter=exporter, output_names=["first", "second"])
    assert [o.name for o in m.graph.output] == ["first", "second"]
    node = next(n for n in m.graph.node if n.op_type == "DualResidual")
    assert list(node.output) == ["r1", "second"]
    assert opbridge.verify(Dual(), (x, y), m).ok


def test_two_nodes_of_one_op_get_distinct_names():
    class Twice(torch.nn.Module):
        def forward(self, x, y):
            a, _ = opbridge.dual_residual(x, y, alpha=2.0)
            b, _ = opbridge.dual_residual(a, y, alpha=3.0)
            return b

    m = opbridge.export(Twice(), (torch.randn(2), torch.randn(2)))
    outs = [list(n.output) for n in m.graph.node if n.op_type == "DualResidual"]
    assert outs[0][0] == "r1" and outs[1][0] == "r1_1"
    assert len({name for o in outs for name in o}) == 4


# ---- rules naming ops of other libraries ------------------------------------------------------
def test_rule_to_an_op_of_a_library_not_loaded_says_which_to_load():
    op = opbridge.builtin.op("torch_cluster_grid")
    rule = ExportRule("", "", 1, (), (), target="opbridge_op", opbridge_op="pointlib::voxelize")
    with pytest.raises(opbridge.OpbridgeError, match="torch_cluster::grid: export rule to opbridge op "
                                                     "pointlib::voxelize: no loaded op library defines it; load the "
                                                     "library with torch namespace 'pointlib' first"):
        resolve(op, rule)
