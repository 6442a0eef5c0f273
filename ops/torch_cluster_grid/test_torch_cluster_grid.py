"""torch_cluster::grid's export rules: both exporters write opbridge's GridCluster node. With
torch_cluster installed the tests run its real op; without it, a stand-in op with torch_cluster's
exact schema (an inferred schema: arguments _0.._3) computes torch_cluster's formula with torch
ops. The oracle is a naive loop over points and dimensions in numpy."""

import numpy as np
import pytest
import torch

import opbridge
from opbridge.testing import random_tensor as r

try:
    import torch_cluster  # noqa: F401

    HAVE_TORCH_CLUSTER = True
except Exception:  # absent, or a build that does not match this torch
    HAVE_TORCH_CLUSTER = False

SCHEMA = "grid(Tensor _0, Tensor _1, Tensor? _2, Tensor? _3) -> Tensor"
_standin = None


def _formula(pos, size, start=None, end=None):
    start = pos.min(0).values if start is None else start
    end = pos.max(0).values if end is None else end
    c = ((pos - start) / size).to(torch.int64)  # truncation toward zero, as torch_cluster's cast
    num = ((end - start) / size).to(torch.int64) + 1
    stride = torch.cat([torch.ones(1, dtype=torch.int64), torch.cumprod(num, 0)[:-1]])
    return (c * stride).sum(1)


def grid_op():
    """torch.ops.torch_cluster.grid: torch_cluster's, or the stand-in."""
    global _standin
    if not HAVE_TORCH_CLUSTER and _standin is None:
        _standin = torch.library.Library("torch_cluster", "DEF")
        _standin.define(SCHEMA)
        _standin.impl("grid", _formula, "CPU")
        torch.library.register_fake("torch_cluster::grid", lambda pos, size, start=None, end=None:
                                    pos.new_empty((pos.shape[0],), dtype=torch.int64), lib=_standin)
    return torch.ops.torch_cluster.grid


grid_op()  # exists before export, as after `import torch_cluster`


def naive(pos, size, start=None, end=None):
    pos, size = pos.numpy(), size.numpy()
    start = pos.min(0) if start is None else start.numpy()
    end = pos.max(0) if end is None else end.numpy()
    out = np.zeros(len(pos), np.int64)
    for i in range(len(pos)):
        stride = 1
        for j in range(pos.shape[1]):
            out[i] += int((pos[i, j] - start[j]) / size[j]) * stride
            stride *= int((end[j] - start[j]) / size[j]) + 1
    return out


class Grid(torch.nn.Module):
    """As torch_cluster.grid_cluster calls the op."""

    def forward(self, pos, size, start=None, end=None):
        return grid_op()(pos, size, start, end)


class GridEnd(torch.nn.Module):
    def forward(self, pos, size, end):
        return grid_op()(pos, size, None, end)


def _case(dtype, given, n=200):
    pos = r([n, 3], dtype, seed=1, low=-5, high=5)
    size = torch.tensor([0.5, 0.75, 1.25], dtype=pos.dtype)
    start = torch.tensor([-6.0, -5.5, -5.0], dtype=pos.dtype)
    end = torch.tensor([6.0, 5.0, 7.0], dtype=pos.dtype)
    if given == "none":
        return Grid(), (pos, size), (pos, size)
    if given == "start":
        return Grid(), (pos, size, start), (pos, size, start)
    if given == "end":
        return GridEnd(), (pos, size, end), (pos, size, None, end)
    return Grid(), (pos, size, start, end), (pos, size, start, end)


@pytest.mark.parametrize("given", ["none", "start", "end", "both"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_exports_as_grid_cluster_and_matches(exporter, dtype, given):
    model, args, call = _case(dtype, given)
    want = naive(*call)
    np.testing.assert_array_equal(model(*args).numpy(), want)  # the op (or stand-in) itself
    m = opbridge.export(model, args, exporter=exporter)
    assert [(n.domain, n.op_type) for n in m.graph.node] == [("opbridge", "GridCluster")]
    feeds = {i.name: a.numpy() for i, a in zip(m.graph.input, args)}
    (got,) = opbridge.session(m).run(None, feeds)
    np.testing.assert_array_equal(got, want)
    report = opbridge.verify(model, args, m)
    assert report.ok, report.table()


@pytest.mark.parametrize("exporter", [
    pytest.param("dynamo", marks=pytest.mark.xfail(
        HAVE_TORCH_CLUSTER, strict=True,
        reason="the real torch_cluster registers its grid as a catch-all (CompositeImplicitAutograd) C++ kernel: "
               "torch.export runs it on fake tensors, which fixes the number of points (a fake kernel cannot be "
               "added to such an op); the stand-in without torch_cluster has one")),
    "torchscript"])
def test_dynamic_number_of_points(exporter):
    model, args, _ = _case("float32", "none")
    m = opbridge.export(model, args, exporter=exporter, input_names=["pos", "size"],
                        dynamic_axes={"pos": {0: "n"}})
    sess = opbridge.session(m)
    for n in (1, 57, 1000):
        pos = r([n, 3], seed=n, low=-5, high=5)
        size = args[1]
        (got,) = sess.run(None, {"pos": pos.numpy(), "size": size.numpy()})
        np.testing.assert_array_equal(got, naive(pos, size))


def test_the_rule_is_listed_for_the_op():
    op = opbridge.builtin.op("torch_cluster_grid")
    assert op.qualified_name == "torch_cluster::grid" and not op.defines_torch_op
    (rule,) = op.export_rules
    assert (rule.target, rule.domain, rule.op_type, rule.opbridge_op) == (
        "opbridge_op", "opbridge", "GridCluster", "opbridge::grid_cluster")
