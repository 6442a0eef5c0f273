"""Symbolic attributes: an int attribute that models compute from input sizes (furthest point
sampling's npoint = N // 4) is exported as a graph value, the node's input named after it, by both
exporters, so the model is right at every size; ONNX Runtime takes the value from that input, and
still from the attribute in models written before. Each export is run at the example's size and at
another one against eager PyTorch on the same inputs and a numpy loop of the sampling."""

from __future__ import annotations

import sys
import types
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import opbridge
from opbridge._export.rules import map_call
from opbridge._library.manifest import ExportRule, RuleAttribute, RuleInput
from opbridge._library.registry import all_ops

FPS = torch.ops.opbridge.furthest_point_sampling


def _op(name: str):
    return next(o for o in all_ops() if o.qualified_name == f"opbridge::{name}")


def fps_reference(xyz: np.ndarray, npoint: int) -> np.ndarray:
    """pointnet2_ops' sampling per batch item, points near the origin allowed: from point 0, the
    point whose squared distance ((dx² + dy²) + dz², float32) to the picked ones is largest."""
    out = np.zeros((len(xyz), npoint), np.int32)
    for b, p in enumerate(xyz.astype(np.float32)):
        dist = np.full(len(p), 1e10, np.float32)
        last = 0
        for k in range(npoint):
            out[b, k] = last
            d = p - p[last]
            dist = np.minimum(dist, (d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1]) + d[:, 2] * d[:, 2])
            last = int(np.argmax(dist))
    return out


class QuarterOfThePoints(torch.nn.Module):
    """npoint computed from the point count, as PointNet++ models compute it."""

    def forward(self, xyz):
        return FPS(xyz, xyz.shape[1] // 4, tie_threads=0, skip_near_origin=False)


def _export(model, xyz, exporter, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return opbridge.export(model, (xyz,), exporter=exporter, input_names=["xyz"],
                               dynamic_axes={"xyz": {1: "n"}}, **kw)


def _fps_node(proto: onnx.ModelProto) -> onnx.NodeProto:
    (node,) = [n for n in proto.graph.node if n.domain == "opbridge" and n.op_type == "FurthestPointSampling"]
    return node


def _runs_right_at(proto, model, sizes):
    sess = opbridge.session(proto)
    for n in sizes:
        xyz = torch.rand(2, n, 3, generator=torch.Generator().manual_seed(n))
        (got,) = sess.run(None, {"xyz": xyz.numpy()})
        want = model(xyz).numpy()
        assert got.shape == (2, n // 4), (n, got.shape)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, fps_reference(xyz.numpy(), n // 4))


def test_npoint_is_declared_symbolic_in_every_schema():
    op = _op("furthest_point_sampling")
    assert [a.name for a in op.symbolic_attributes] == ["npoint"]
    assert not op.attribute("tie_threads").symbolic
    assert op.node_inputs == 2
    assert "SymInt npoint" in str(FPS.default._schema)
    schema = onnx.defs.get_schema("FurthestPointSampling", 1, "opbridge")
    assert [i.name for i in schema.inputs] == ["xyz", "npoint_value"]
    assert schema.inputs[1].option == onnx.defs.OpSchema.FormalParameterOption.Optional
    assert schema.inputs[1].type_str == "tensor(int64)"
    assert not schema.attributes["npoint"].required


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_a_size_computed_into_npoint_is_a_graph_input_and_right_at_every_size(exporter):
    model = QuarterOfThePoints()
    proto = _export(model, torch.rand(2, 64, 3), exporter)
    node = _fps_node(proto)
    assert len(node.input) == 2 and node.input[1], list(node.input)
    assert "npoint" not in [a.name for a in node.attribute]
    # The graph input's point count stays dynamic, and so does the output's.
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    assert dims[1].dim_param and not dims[1].HasField("dim_value")
    _runs_right_at(proto, model, (64, 200, 7))


@pytest.fixture()
def openpoints():
    """A stand-in for openpoints' sampling Function (its CUDA extension absent), which the op's
    definition substitutes (OpBuilder::replaces)."""
    names = ("openpoints", "openpoints.models", "openpoints.models.layers", "openpoints.models.layers.subsample")
    saved = {n: sys.modules.get(n) for n in names}
    for n in names[:-1]:
        sys.modules[n] = types.ModuleType(n)
    sub = types.ModuleType(names[-1])
    exec(compile('''
import torch

class FurthestPointSampling(torch.autograd.Function):
    @staticmethod
    def forward(ctx, xyz, npoint):
        raise ImportError("openpoints' CUDA extension is not installed")

furthest_point_sample = FurthestPointSampling.apply
''', names[-1], "exec"), sub.__dict__)
    sys.modules[names[-1]] = sub
    yield sub
    for n, m in saved.items():
        if m is None:
            sys.modules.pop(n, None)
        else:
            sys.modules[n] = m


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_openpoints_sampling_with_a_stride_exports_right_at_every_size(openpoints, exporter):
    class Stage(torch.nn.Module):
        def forward(self, xyz):
            from openpoints.models.layers.subsample import furthest_point_sample

            return furthest_point_sample(xyz, xyz.shape[1] // 4)

    model = Stage()
    proto = _export(model, torch.rand(2, 64, 3), exporter)
    node = _fps_node(proto)
    assert len(node.input) == 2 and node.input[1]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs == {"tie_threads": 1024, "skip_near_origin": 0}  # the rule's fixed values; npoint an input
    sess = opbridge.session(proto)
    for n in (64, 200):
        xyz = torch.rand(2, n, 3, generator=torch.Generator().manual_seed(n))
        (got,) = sess.run(None, {"xyz": xyz.numpy()})
        with opbridge.substitutions():
            want = model(xyz).numpy()
        assert got.shape == (2, n // 4)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, fps_reference(xyz.numpy(), n // 4))


def test_a_constant_npoint_stays_an_attribute():
    class Fixed(torch.nn.Module):
        def forward(self, xyz):
            return FPS(xyz, 5, tie_threads=0)

    for exporter in ("torchscript", "dynamo"):
        proto = _export(Fixed(), torch.rand(2, 64, 3), exporter)
        node = _fps_node(proto)
        assert list(node.input) == [proto.graph.input[0].name], exporter
        assert {a.name: helper.get_attribute_value(a) for a in node.attribute}["npoint"] == 5


def _node_model(npoint_attr=None, npoint_input_shape=None, npoint_dtype=TensorProto.INT64):
    inputs = [helper.make_tensor_value_info("xyz", TensorProto.FLOAT, [2, "n", 3])]
    names = ["xyz"]
    if npoint_input_shape is not None:
        inputs.append(helper.make_tensor_value_info("npoint_value", npoint_dtype, npoint_input_shape))
        names.append("npoint_value")
    attrs = {"tie_threads": 0, "skip_near_origin": 0}
    if npoint_attr is not None:
        attrs["npoint"] = npoint_attr
    node = helper.make_node("FurthestPointSampling", names, ["idx"], name="fps0", domain="opbridge", **attrs)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("idx", TensorProto.INT32, [2, "m"])])
    return helper.make_model(graph, ir_version=8,
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("opbridge", 1)])


def test_a_model_with_the_npoint_attribute_still_runs():
    model = _node_model(npoint_attr=6)
    onnx.checker.check_model(model, full_check=True)
    xyz = np.random.default_rng(0).random((2, 50, 3), dtype=np.float32)
    (got,) = opbridge.session(model).run(None, {"xyz": xyz})
    np.testing.assert_array_equal(got, FPS(torch.from_numpy(xyz), 6, tie_threads=0, skip_near_origin=False).numpy())
    np.testing.assert_array_equal(got, fps_reference(xyz, 6))


@pytest.mark.parametrize("shape", [[], [1]])
def test_the_npoint_input_gives_the_value_and_wins_over_the_attribute(shape):
    model = _node_model(npoint_attr=3, npoint_input_shape=shape)
    onnx.checker.check_model(model, full_check=True)
    xyz = np.random.default_rng(1).random((2, 40, 3), dtype=np.float32)
    (got,) = opbridge.session(model).run(None, {"xyz": xyz, "npoint_value": np.full(shape, 9, np.int64)})
    assert got.shape == (2, 9)
    np.testing.assert_array_equal(got, fps_reference(xyz, 9))


def test_onnx_runtime_refuses_a_npoint_input_that_is_not_a_scalar():
    sess = opbridge.session(_node_model(npoint_input_shape=[2]))
    xyz = np.random.default_rng(2).random((2, 40, 3), dtype=np.float32)
    with pytest.raises(Exception) as e:
        sess.run(None, {"xyz": xyz, "npoint_value": np.array([4, 5], np.int64)})
    text = str(e.value)
    for part in ("opbridge::furthest_point_sampling", "node 'fps0'", "attribute 'npoint'",
                 "input 'npoint_value'", "int64 scalar or 1-element tensor", "shape [2]"):
        assert part in text, (part, text)


def test_onnx_runtime_refuses_a_node_without_npoint():
    with pytest.raises(Exception) as e:
        opbridge.session(_node_model())
    text = str(e.value)
    for part in ("opbridge::furthest_point_sampling", "node 'fps0'", "required attribute 'npoint' (int) is missing",
                 "input 'npoint_value'"):
        assert part in text, (part, text)


def test_a_computed_value_for_a_target_that_takes_only_an_attribute_is_refused():
    """A rule that writes the op as another runtime's node, whose attribute can only be a constant:
    a computed value there is refused, naming the op, the attribute and the target."""
    op = _op("furthest_point_sampling")
    rule = ExportRule("com.example", "Sample", 1, (RuleInput("xyz"),),
                      (RuleAttribute("count", "int", sources=("npoint",)),), target="node")
    graph_value = object()
    with pytest.raises(opbridge.OpbridgeError) as e:
        map_call(op, rule, ["X"], {"npoint": graph_value}, lambda v: v is None, lambda v: v is graph_value)
    text = str(e.value)
    for part in ("opbridge::furthest_point_sampling", "attribute 'npoint'", "computed in the graph",
                 "com.example::Sample", "'count' only as a constant attribute"):
        assert part in text, (part, text)
    # Constants map exactly as before.
    assert map_call(op, rule, ["X"], {"npoint": 7}, lambda v: v is None,
                    lambda v: v is graph_value) == (["X"], {"count": ("int", 7)})


class PairSums(torch.nn.Module):
    """Message passing's scatter into as many rows as the graph has nodes (PyG's dim_size=x.size(0)),
    here each pair of rows summed into one: the output's row count follows the input's."""

    def forward(self, x):
        index = torch.arange(x.shape[0]) // 2
        return torch.ops.opbridge.scatter_reduce(x, index, (x.shape[0] + 1) // 2, reduce="sum")


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_scatter_dim_size_computed_from_the_node_count_is_right_at_every_size(exporter):
    model = PairSums()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        proto = opbridge.export(model, (torch.rand(6, 3),), exporter=exporter, input_names=["x"],
                                dynamic_axes={"x": {0: "n"}})
    (node,) = [n for n in proto.graph.node if n.domain == "opbridge" and n.op_type == "ScatterReduce"]
    assert len(node.input) == 3 and node.input[2]
    assert "dim_size" not in [a.name for a in node.attribute]
    sess = opbridge.session(proto)
    for n in (6, 11):
        x = torch.rand(n, 3, generator=torch.Generator().manual_seed(n))
        (got,) = sess.run(None, {"x": x.numpy()})
        rows = x.numpy()
        want = np.stack([rows[i:i + 2].sum(0) for i in range(0, n, 2)])
        assert got.shape == ((n + 1) // 2, 3)
        np.testing.assert_allclose(got, want, rtol=1e-6)
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-6)
