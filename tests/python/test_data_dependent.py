"""An output whose size only the kernel knows, declared in the op's definition
(data_dependent("pairs") in tests/python/extra_library/pairs.cc: three outputs that share the
number of pairs within a radius): an unbacked SymInt under torch.export and torch.compile, a
symbolic dimension in the ONNX model with both exporters, allocated by the kernel in PyTorch and
in ONNX Runtime; checked against a numpy brute force."""

import numpy as np
import onnx
import pytest
import torch

import opbridge
from opbridge.testing import BadInput, OpCase, OpTest, Sample, random_tensor as r

RADIUS = 0.9


def reference(x, y, radius):
    d = np.sqrt(((x[:, None, :] - y[None, :, :]) ** 2).sum(-1))
    i, j = np.nonzero(d <= np.float32(radius).astype(x.dtype))  # row-major: by i, then j
    return i.astype(np.int64), j.astype(np.int64), d[i, j]


class RadiusPairs(torch.nn.Module):
    def forward(self, x, y):
        return torch.ops.extra.radius_pairs(x, y, radius=RADIUS)


@pytest.fixture(scope="module", autouse=True)
def extra(extra_ops):
    return extra_ops


def points(n, m, d=3, dtype="float32", seed=0):
    return r([n, d], dtype, seed=seed), r([m, d], dtype, seed=seed + 1)


def test_the_definition_declares_one_shared_size(extra):
    op = extra.op("radius_pairs")
    assert op.data_dependent and op.check_op == "_check_radius_pairs"
    assert [o.data_dependent for o in op.outputs] == [True, True, True]
    assert {str(o.shape) for o in op.outputs} == {"[<data-dependent pairs>]"}


def test_eager_matches_a_brute_force():
    for n, m, seed in ((9, 7, 0), (0, 5, 1), (4, 0, 2), (30, 40, 3)):
        x, y = points(n, m, seed=seed)
        got = torch.ops.extra.radius_pairs(x, y, radius=RADIUS)
        for g, w in zip(got, reference(x.numpy(), y.numpy(), RADIUS)):
            np.testing.assert_allclose(g.numpy(), w, rtol=1e-6)
    far = torch.ops.extra.radius_pairs(torch.zeros(3, 2), torch.full((2, 2), 5.0), radius=1.0)
    assert [t.shape for t in far] == [(0,), (0,), (0,)]


def test_torch_export_gives_the_outputs_one_unbacked_size():
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    x, y = points(9, 7)
    n, m = torch.export.Dim("n"), torch.export.Dim("m")
    ep = torch.export.export(RadiusPairs(), (x, y), dynamic_shapes=({0: n}, {0: m}))
    node = next(nd for nd in ep.graph.nodes if nd.op == "call_function" and "radius_pairs" in str(nd.target))
    sizes = [t.shape[0] for t in node.meta["val"]]
    assert free_unbacked_symbols(sizes[0]) and len({str(s) for s in sizes}) == 1, sizes
    for n_, m_ in ((9, 7), (20, 3)):
        a, b = points(n_, m_, seed=n_)
        for g, w in zip(ep.module()(a, b), RadiusPairs()(a, b)):
            torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_torch_compile_runs_the_op_with_dynamic_sizes():
    torch._dynamo.reset()
    compiled = torch.compile(RadiusPairs(), backend="aot_eager", dynamic=True, fullgraph=True)
    for n, m in ((9, 7), (15, 11), (2, 30)):
        x, y = points(n, m, seed=n)
        for g, w in zip(compiled(x, y), RadiusPairs()(x, y)):
            torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_both_exporters_write_a_symbolic_size_that_onnxruntime_fills(exporter):
    x, y = points(9, 7)
    proto = opbridge.export(RadiusPairs(), (x, y), exporter=exporter, input_names=["x", "y"],
                            dynamic_axes={"x": {0: "n"}, "y": {0: "m"}})
    onnx.checker.check_model(proto, full_check=True)
    dims = [o.type.tensor_type.shape.dim for o in proto.graph.output]
    assert all(len(d) == 1 and not d[0].HasField("dim_value") for d in dims), dims
    if exporter == "dynamo":  # one name for the shared size
        assert len({d[0].dim_param for d in dims}) == 1 and dims[0][0].dim_param, dims
    sess = opbridge.session(proto)
    for n, m, seed in ((9, 7, 0), (25, 12, 5), (3, 0, 6), (0, 4, 7)):
        a, b = points(n, m, seed=seed)
        report = opbridge.verify(RadiusPairs(), (a, b), proto, sess=sess)
        assert report.ok, report.table()
        got = sess.run(None, {"x": a.numpy(), "y": b.numpy()})
        for g, w in zip(got, reference(a.numpy(), b.numpy(), RADIUS)):
            np.testing.assert_allclose(g, w, rtol=1e-6)


class TestRadiusPairs(OpTest):
    case = OpCase(
        "radius_pairs",
        reference=reference,
        samples=[
            Sample(points(9, 9), {"radius": RADIUS}, name="float32", dynamic={0: [0], 1: [0]}),  # one axis name
            Sample(points(6, 8, d=2, dtype="float64", seed=3), {"radius": 1.5}, name="float64"),
            Sample(points(5, 4, seed=9), {"radius": 0.0}, name="no_pairs"),
        ],
        bad_inputs=[
            BadInput(points(3, 3), {"radius": -1.0}, "radius must be finite and >= 0, got -1", "negative_radius"),
            BadInput((r([3, 3]), r([3, 2])), {"radius": 1.0}, r"y must have the dimensions of x \(y.shape\[1\] = 2, "
                     r"x.shape\[1\] = 3\)", "mismatched_dims"),
        ],
        resize=lambda s, n: Sample(points(n, n, seed=n), s.attrs),
    )

