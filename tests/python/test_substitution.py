"""Substitution of Python-level operators: a rule keyed on the qualified name of an
autograd.Function (or a function, or a method) routes its calls to opbridge's ops inside
opbridge.substitutions() and opbridge.export, whatever name the model's code calls it by, and
restores everything afterwards.

The third-party package here is a stand-in made by the test (modules in sys.modules), shaped as
pointnet2_ops is: an autograd.Function over an extension that is not there, an alias of its
apply, a consumer module that imported the alias by name.
"""

import sys
import types

import numpy as np
import pytest
import torch

import opbridge


def _module(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


@pytest.fixture(scope="module")
def package():
    _module("opbridge_test_pkg", "")
    ops = _module("opbridge_test_pkg.ops", '''
import torch

class Sampling(torch.autograd.Function):
    @staticmethod
    def forward(ctx, xyz, npoint):
        raise ImportError("the CUDA extension opbridge_test_pkg._ext is not installed")

sample = Sampling.apply

def lengths(x):
    raise ImportError("the CUDA extension opbridge_test_pkg._ext is not installed")

class Unruled(torch.autograd.Function):  # no rule covers it
    @staticmethod
    def forward(ctx, x):
        raise ImportError("the CUDA extension opbridge_test_pkg._ext is not installed")

class Nearest(torch.autograd.Function):  # two outputs: distances, then indices
    @staticmethod
    def forward(ctx, unknown, known):
        raise ImportError("the CUDA extension opbridge_test_pkg._ext is not installed")

class Layer:
    def run(self, x):
        raise ImportError("the CUDA extension opbridge_test_pkg._ext is not installed")
''')
    model = _module("opbridge_test_pkg.model", '''
import torch
from opbridge_test_pkg.ops import sample, lengths, Sampling, Layer

class Model(torch.nn.Module):
    def forward(self, xyz):
        idx = sample(xyz, 4)                      # the alias imported by name
        again = Sampling.apply(xyz, 4)            # the class's own apply
        return idx, again, lengths(xyz), Layer().run(xyz)

class CallsUnruled(torch.nn.Module):
    def forward(self, x):
        from opbridge_test_pkg.ops import Unruled
        return Unruled.apply(x) + 1

class Interpolation(torch.nn.Module):
    def forward(self, unknown, known):
        from opbridge_test_pkg.ops import Nearest
        dist, idx = Nearest.apply(unknown, known)
        return 1.0 / (dist + 1e-8), idx
''')
    opbridge.substitute("opbridge_test_pkg.ops.Sampling",
                        lambda xyz, npoint: torch.ops.opbridge.furthest_point_sampling(xyz, npoint))
    opbridge.substitute("opbridge_test_pkg.ops.lengths", lambda x: (x * x).sum(-1))
    opbridge.substitute("opbridge_test_pkg.ops.Layer.run", lambda self, x: x + 1)
    opbridge.substitute("opbridge_test_pkg.ops.Nearest", lambda u, k: torch.ops.opbridge.three_nn(u, k))
    yield ops, model
    for name in ("opbridge_test_pkg", "opbridge_test_pkg.ops", "opbridge_test_pkg.model"):
        del sys.modules[name]


def _xyz():
    return torch.rand(2, 32, 3, generator=torch.Generator().manual_seed(0))


def test_outside_the_block_the_original_runs(package):
    _, model = package
    with pytest.raises(ImportError, match="not installed"):
        model.Model()(_xyz())


def test_inside_the_block_every_binding_runs_the_replacement_and_is_restored(package):
    ops, model = package
    before = (ops.sample, model.sample, model.lengths, ops.Layer.run, "apply" in vars(ops.Sampling))
    xyz = _xyz()
    with opbridge.substitutions() as applied:
        idx, again, lengths, shifted = model.Model()(xyz)
    assert {"opbridge_test_pkg.ops.Sampling", "opbridge_test_pkg.ops.lengths",
            "opbridge_test_pkg.ops.Layer.run"} <= set(applied)
    want = torch.ops.opbridge.furthest_point_sampling(xyz, 4)
    assert torch.equal(idx, want) and torch.equal(again, want)
    torch.testing.assert_close(lengths, (xyz * xyz).sum(-1))
    torch.testing.assert_close(shifted, xyz + 1)
    after = (ops.sample, model.sample, model.lengths, ops.Layer.run, "apply" in vars(ops.Sampling))
    assert after[0] == before[0] and after[1] == before[1] and after[2] is before[2] and after[3] is before[3]
    assert after[4] is before[4] is False  # apply inherited from torch.autograd.Function again


def test_nested_blocks_apply_their_own_rules(package):
    ops, model = package
    original = ops.sample
    with opbridge.substitutions() as outer:
        with opbridge.substitutions() as inner:
            assert inner == outer  # the same rules, bound once
            model.Model()(_xyz())
        model.Model()(_xyz())  # still substituted after the inner block
    with pytest.raises(ImportError):
        model.Model()(_xyz())
    assert ops.sample == original


def test_the_scan_for_bindings_asks_no_object_for_its_attributes(package):
    # Every export scans every module's attributes for bindings of the originals. Objects in
    # modules may answer any attribute (torch.ops' namespaces resolve ops on demand, slowly): the
    # scan matches by identity and type and asks them nothing.
    _, model = package
    asked = []

    class Answers:
        def __getattr__(self, name):
            asked.append(name)
            return lambda *a: None

        def __call__(self, *a):
            return None

    watcher = _module("opbridge_test_watcher", "")
    watcher.anything = Answers()
    try:
        with opbridge.substitutions():
            model.Model()(_xyz())
    finally:
        del sys.modules["opbridge_test_watcher"]
    assert asked == []


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_export_applies_the_rules_itself(package, exporter):
    _, model = package
    xyz = _xyz()
    proto = opbridge.export(model.Model(), (xyz,), exporter=exporter)
    assert "FurthestPointSampling" in {n.op_type for n in proto.graph.node}
    with opbridge.substitutions():
        report = opbridge.verify(model.Model(), (xyz,), proto)
    assert report.ok, report


def test_only_applies_the_named_rules_and_names_unknown_ones(package):
    _, model = package
    with opbridge.substitutions(only=["opbridge_test_pkg.ops.lengths"]) as applied:
        assert applied == ["opbridge_test_pkg.ops.lengths"]
        with pytest.raises(ImportError):
            model.Model()(_xyz())
    with pytest.raises(opbridge.OpbridgeError, match="no rule for opbridge_test_pkg.ops.nothing"):
        with opbridge.substitutions(only=["opbridge_test_pkg.ops.nothing"]):
            pass


def test_a_rule_for_a_package_never_imported_does_nothing():
    opbridge.substitute("opbridge_test_absent_pkg.ops.Sampling", lambda *a: None)
    with opbridge.substitutions() as applied:
        assert "opbridge_test_absent_pkg.ops.Sampling" not in applied


def test_bad_rules_are_refused():
    with pytest.raises(opbridge.OpbridgeError, match="qualified name such as 'package.module.Function'"):
        opbridge.substitute("Sampling", lambda x: x)
    with pytest.raises(opbridge.OpbridgeError, match="the replacement must be callable"):
        opbridge.substitute("pkg.mod.Sampling", 3)


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_a_function_with_two_outputs_keeps_their_order(package, exporter):
    """Distances stay distances and indices indices through both exporters (a Function's outputs
    must not be swapped on the way to the graph)."""
    _, model = package
    g = torch.Generator().manual_seed(1)
    unknown, known = torch.rand(2, 20, 3, generator=g), torch.rand(2, 9, 3, generator=g)
    proto = opbridge.export(model.Interpolation(), (unknown, known), exporter=exporter)
    sess = opbridge.session(proto)
    got = sess.run(None, {i.name: t.numpy() for i, t in zip(sess.get_inputs(), (unknown, known))})
    d2 = ((unknown[:, :, None, :] - known[:, None, :, :]) ** 2).sum(-1)
    want_d2, want_idx = d2.topk(3, dim=-1, largest=False)
    torch.testing.assert_close(torch.as_tensor(got[0]), 1.0 / (want_d2.sqrt() + 1e-8), rtol=1e-5, atol=0)
    assert torch.equal(torch.as_tensor(got[1]).long(), want_idx)


# ---- rules an op's definition declares (OpBuilder::replaces) ----------------------------------
@pytest.fixture(scope="module")
def pointnet2():
    """A stand-in for pointnet2_ops.pointnet2_utils with the real Functions' signatures, over an
    extension that is not installed; the rules are the ones opbridge's op definitions declare."""
    _module("pointnet2_ops", "")
    utils = _module("pointnet2_ops.pointnet2_utils", '''
import torch
from torch.autograd import Function

def _missing(*args):
    raise ImportError("pointnet2_ops._ext is not installed")

class FurthestPointSampling(Function):
    @staticmethod
    def forward(ctx, xyz, npoint):
        _missing()

class BallQuery(Function):
    @staticmethod
    def forward(ctx, radius, nsample, xyz, new_xyz):
        _missing()

class ThreeNN(Function):
    @staticmethod
    def forward(ctx, unknown, known):
        _missing()

class ThreeInterpolate(Function):
    @staticmethod
    def forward(ctx, features, idx, weight):
        _missing()

class GatherOperation(Function):
    @staticmethod
    def forward(ctx, features, idx):
        _missing()

class GroupingOperation(Function):
    @staticmethod
    def forward(ctx, features, idx):
        _missing()

furthest_point_sample = FurthestPointSampling.apply
ball_query = BallQuery.apply
three_nn = ThreeNN.apply
three_interpolate = ThreeInterpolate.apply
gather_operation = GatherOperation.apply
grouping_operation = GroupingOperation.apply
''')
    yield utils
    for name in ("pointnet2_ops", "pointnet2_ops.pointnet2_utils"):
        del sys.modules[name]


def test_op_definitions_declare_the_pointnet2_rules(pointnet2):
    rules = {r.target: r for r in opbridge.substitution_rules()}
    for name in ("FurthestPointSampling", "BallQuery", "ThreeNN", "ThreeInterpolate", "GatherOperation",
                 "GroupingOperation"):
        assert f"pointnet2_ops.pointnet2_utils.{name}" in rules
    assert "openpoints.models.layers.subsample.FurthestPointSampling" in rules
    assert "opbridge::furthest_point_sampling" in rules["pointnet2_ops.pointnet2_utils.FurthestPointSampling"].doc


def _reference_ball_query(radius, nsample, xyz, new_xyz):
    """pointnet2_ops' rule as a loop: the first nsample points by index with d² < r², padded with
    the first (0 when none)."""
    out = np.zeros((*new_xyz.shape[:2], nsample), np.int32)
    for b in range(xyz.shape[0]):
        for j in range(new_xyz.shape[1]):
            d2 = ((xyz[b] - new_xyz[b, j]) ** 2).sum(-1)
            hits = np.flatnonzero(d2 < radius * radius)[:nsample]
            if len(hits):
                out[b, j] = np.concatenate([hits, np.full(nsample - len(hits), hits[0])])
    return out


def test_declared_rules_bind_positional_and_keyword_arguments(pointnet2):
    g = torch.Generator().manual_seed(2)
    xyz, new_xyz = torch.rand(2, 64, 3, generator=g), torch.rand(2, 8, 3, generator=g)
    with opbridge.substitutions():
        by_position = pointnet2.ball_query(0.3, 5, xyz, new_xyz)
        by_name = pointnet2.BallQuery.apply(0.3, 5, new_xyz=new_xyz, xyz=xyz)
        dist, idx = pointnet2.three_nn(new_xyz, xyz)
    want = _reference_ball_query(0.3, 5, xyz.numpy(), new_xyz.numpy())
    assert by_position.dtype == torch.int32
    np.testing.assert_array_equal(by_position.numpy(), want)
    np.testing.assert_array_equal(by_name.numpy(), want)
    d = ((new_xyz[:, :, None] - xyz[:, None]) ** 2).sum(-1)
    torch.testing.assert_close(dist, d.topk(3, largest=False).values.sqrt())
    with pytest.raises(ImportError):
        pointnet2.ball_query(0.3, 5, xyz, new_xyz)


class _SetAbstraction(torch.nn.Module):
    """PointNet++'s sampling, grouping and feature propagation as model code calls pointnet2_ops."""

    def forward(self, xyz, features):
        from pointnet2_ops import pointnet2_utils as pu

        idx = pu.furthest_point_sample(xyz, 16)
        centres = pu.gather_operation(xyz.transpose(1, 2).contiguous(), idx).transpose(1, 2).contiguous()
        group = pu.ball_query(0.4, 8, xyz, centres)
        grouped = pu.grouping_operation(features, group)  # (B, C, 16, 8)
        dist, nn_idx = pu.three_nn(xyz, centres)
        weight = 1.0 / (dist + 1e-8)
        weight = weight / weight.sum(-1, keepdim=True)
        return group, pu.three_interpolate(grouped.amax(-1), nn_idx, weight)


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_declared_rules_export_and_verify(pointnet2, exporter):
    g = torch.Generator().manual_seed(4)
    xyz, features = torch.rand(2, 64, 3, generator=g), torch.randn(2, 5, 64, generator=g)
    proto = opbridge.export(_SetAbstraction(), (xyz, features), exporter=exporter, optimize=False)
    assert {"FurthestPointSampling", "BallQuery", "ThreeNn", "ThreeInterpolate", "GatherPoints", "GroupPoints"} <= \
        {n.op_type for n in proto.graph.node}
    with opbridge.substitutions():
        report = opbridge.verify(_SetAbstraction(), (xyz, features), proto)
    assert report.ok, report


def test_torchscript_export_casts_back_an_input_its_type_analysis_widened():
    """torch.linspace(..., dtype=float32) is double in the TorchScript exporter's graph, and so is
    what is computed from it (eager keeps float32), as Deformable DETR's sampling locations are:
    the node gets float32 again."""

    class Attention(torch.nn.Module):
        def forward(self, value, offsets, weights):
            shapes = torch.as_tensor([[4, 5], [2, 3]], dtype=torch.long)  # from Python ints, as DETR's
            starts = torch.tensor([0, 20])
            normalizer = torch.stack([shapes[..., 1], shapes[..., 0]], -1)
            reference = torch.linspace(0.2, 0.8, offsets.shape[1], dtype=offsets.dtype)
            locations = reference[None, :, None, None, None, None] + offsets / normalizer[None, None, None, :, None, :]
            return torch.ops.opbridge.multi_scale_deformable_attention(value, shapes, starts, locations, weights)

    g = torch.Generator().manual_seed(5)
    args = (torch.randn(1, 26, 2, 4, generator=g), torch.randn(1, 3, 2, 2, 2, 2, generator=g),
            torch.rand(1, 3, 2, 2, 2, generator=g))
    proto = opbridge.export(Attention(), args, exporter="torchscript")
    casts = [n for n in proto.graph.node if n.op_type == "Cast" and n.output[0].endswith("_as_float_1")]
    assert len(casts) == 1
    report = opbridge.verify(Attention(), args, proto)
    assert report.ok, report


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_an_operator_no_rule_covers_is_named_with_where_it_is_called(package, exporter):
    _, model = package
    with pytest.raises(opbridge.OpbridgeError) as e:
        opbridge.export(model.CallsUnruled(), (torch.ones(3),), exporter=exporter)
    text = str(e.value)
    assert "the model calls the Python-level operator opbridge_test_pkg.ops.Unruled" in text
    assert "<opbridge_test_pkg.model>:" in text  # the model's call
    assert "ImportError: the CUDA extension opbridge_test_pkg._ext is not installed" in text
    assert "@opbridge.substitute('opbridge_test_pkg.ops.Unruled')" in text


def test_an_attribute_holding_the_operator_is_rebound_for_the_models_given(package):
    """A constructor that keeps the operator (`self.sample = sample`) holds the original: export
    and substitutions(model) rebind it for the block."""
    ops, _ = package

    class Keeps(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.sample = ops.sample

        def forward(self, xyz):
            return self.sample(xyz, 4)

    model, xyz = Keeps(), _xyz()
    with opbridge.substitutions():
        with pytest.raises(ImportError):
            model(xyz)  # not given: the attribute keeps the original
        with opbridge.substitutions(model):  # nested: the model's attributes only
            assert torch.equal(model(xyz), torch.ops.opbridge.furthest_point_sampling(xyz, 4))
    with opbridge.substitutions(model):
        assert torch.equal(model(xyz), torch.ops.opbridge.furthest_point_sampling(xyz, 4))
    assert model.sample == ops.sample  # restored
    for exporter in opbridge.EXPORTERS:
        proto = opbridge.export(model, (xyz,), exporter=exporter)
        assert "FurthestPointSampling" in {n.op_type for n in proto.graph.node}
