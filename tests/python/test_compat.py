"""opbridge.compat's torch_cluster, torch_scatter and pyg_lib modules and install(): each function
against a brute-force numpy reference (and against the real package where scripts/oracles.sh
installed it), signatures against the real packages', exports with both exporters run at a second
batch whose number of examples differs. The layers' modules (pointnet2_ops, pointops, mmcv) are
tests/python/test_compat_layers.py."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import opbridge
from opbridge.compat import pointops as po, pyg_lib, torch_cluster as tc, torch_scatter as ts

# torch_cluster 1.6.3's and torch_scatter 2.1.2's signatures (parameters and defaults), read from
# the packages; checked against them again below where they are installed.
CLUSTER = {
    "fps": "(src, batch=None, ratio=None, random_start=True, batch_size=None, ptr=None)",
    "knn": "(x, y, k, batch_x=None, batch_y=None, cosine=False, num_workers=1, batch_size=None)",
    "knn_graph": "(x, k, batch=None, loop=False, flow='source_to_target', cosine=False, num_workers=1, batch_size=None)",
    "radius": "(x, y, r, batch_x=None, batch_y=None, max_num_neighbors=32, num_workers=1, batch_size=None)",
    "radius_graph": "(x, r, batch=None, loop=False, max_num_neighbors=32, flow='source_to_target', num_workers=1, "
                    "batch_size=None)",
    "nearest": "(x, y, batch_x=None, batch_y=None)",
    "grid_cluster": "(pos, size, start=None, end=None)",
}
SCATTER = {**{f"scatter_{r}": "(src, index, dim=-1, out=None, dim_size=None)"
              for r in ("sum", "add", "mul", "mean", "min", "max")},
           "scatter": "(src, index, dim=-1, out=None, dim_size=None, reduce='sum')",
           "segment_csr": "(src, indptr, out=None, reduce='sum')",
           "segment_coo": "(src, index, out=None, dim_size=None, reduce='sum')",
           **{f"segment_{r}_csr": "(src, indptr, out=None)" for r in ("sum", "add", "mean", "min", "max")},
           **{f"segment_{r}_coo": "(src, index, out=None, dim_size=None)" for r in ("sum", "add", "mean", "min", "max")}}


def _params(fn) -> str:
    return str(inspect.signature(fn).replace(return_annotation=inspect.Signature.empty, parameters=[
        p.replace(annotation=inspect.Parameter.empty) for p in inspect.signature(fn).parameters.values()]))


@pytest.mark.parametrize("module,table", [(tc, CLUSTER), (ts, SCATTER)], ids=["torch_cluster", "torch_scatter"])
def test_signatures_are_the_packages(module, table):
    assert sorted(module.__all__) == sorted(table)
    for name, want in table.items():
        assert _params(getattr(module, name)) == want, name
    real = sys.modules.get(module.__name__.rsplit(".", 1)[1]) or _installed(module.__name__.rsplit(".", 1)[1])
    if real is not None:
        for name in table:
            assert _params(getattr(real, name)) == table[name], name


def _installed(name):
    try:
        return __import__(name)
    except ImportError:
        return None


def _cloud(n, d=3, examples=3, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    pos = torch.rand(n, d, generator=g, dtype=dtype)
    batch = torch.sort(torch.randint(0, examples, (n,), generator=g))[0]
    return pos, batch


def _knn_ref(x, y, k, bx, by, metric=None):
    """(2, E) pairs [y row, x row]: each y row's k nearest x rows of its example, nearest first,
    ties to the lower row."""
    x, y, bx, by = (t.numpy() for t in (x, y, bx, by))
    rows, cols = [], []
    for i in range(len(y)):
        cand = np.nonzero(bx == by[i])[0]
        d = metric(x[cand], y[i]) if metric else ((x[cand] - y[i]) ** 2).sum(1)
        order = np.lexsort((cand, d))[:k]
        rows += [i] * len(order)
        cols += list(cand[order])
    return np.array([rows, cols], dtype=np.int64).reshape(2, -1)


@pytest.mark.parametrize("d", [3, 8])
@pytest.mark.parametrize("k", [1, 6, 40])
def test_knn_is_the_brute_force_search(d, k):
    # d = 3 runs on knn_query's tree, 8 on the dense search; k = 40 exceeds the smallest example.
    x, bx = _cloud(150, d, seed=1)
    y, by = _cloud(60, d, seed=2)
    got = tc.knn(x, y, k, bx, by)
    assert got.dtype == torch.int64
    np.testing.assert_array_equal(got.numpy(), _knn_ref(x, y, k, bx, by))


def test_knn_cosine_ranks_by_the_angle():
    x, bx = _cloud(80, 5, seed=3)
    x = x - 0.5
    cos = lambda pts, q: 1 - pts @ q / (np.linalg.norm(pts, axis=1) * np.linalg.norm(q))  # noqa: E731
    np.testing.assert_array_equal(tc.knn(x, x[:20], 4, bx, bx[:20], cosine=True).numpy(),
                                  _knn_ref(x, x[:20], 4, bx, bx[:20], cos))


@pytest.mark.parametrize("loop", [False, True])
@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
def test_knn_graph_flips_and_drops_self_loops(loop, flow):
    x, b = _cloud(100, seed=4)
    pairs = _knn_ref(x, x, 5 if loop else 6, b, b)
    if not loop:
        pairs = pairs[:, pairs[0] != pairs[1]]
    want = pairs[::-1] if flow == "source_to_target" else pairs
    np.testing.assert_array_equal(tc.knn_graph(x, 5, b, loop=loop, flow=flow).numpy(), want)
    with pytest.raises(ValueError, match="flow"):
        tc.knn_graph(x, 5, b, flow="sideways")


def _radius_ref(x, y, r, bx, by):
    d = ((y.numpy()[:, None] - x.numpy()[None]) ** 2).sum(-1)
    hit = (d < r * r) & (by.numpy()[:, None] == bx.numpy()[None])
    return {tuple(p) for p in np.argwhere(hit)}


def test_radius_is_the_pairs_within_r():
    x, bx = _cloud(200, seed=5)
    y, by = _cloud(50, seed=6)
    got = tc.radius(x, y, 0.3, bx, by, max_num_neighbors=1000)
    assert {tuple(p) for p in got.t().tolist()} == _radius_ref(x, y, 0.3, bx, by)
    capped = tc.radius(x, y, 0.3, bx, by, max_num_neighbors=3)  # the lowest rows of each ball
    want = {}
    for i, j in sorted(_radius_ref(x, y, 0.3, bx, by)):
        want.setdefault(i, []).append(j)
    assert {tuple(p) for p in capped.t().tolist()} == {(i, j) for i, js in want.items() for j in js[:3]}
    graph = tc.radius_graph(x, 0.3, bx, max_num_neighbors=1000)
    assert {tuple(p) for p in graph.t().tolist()} == {(j, i) for i, j in _radius_ref(x, x, 0.3, bx, bx) if i != j}


def test_nearest_is_the_argmin_within_the_example():
    x, bx = _cloud(120, seed=7)
    y, by = _cloud(30, seed=8)
    d = ((x.numpy()[:, None] - y.numpy()[None]) ** 2).sum(-1)
    d[bx.numpy()[:, None] != by.numpy()[None]] = np.inf
    np.testing.assert_array_equal(tc.nearest(x, y, bx, by).numpy(), d.argmin(1))
    with pytest.raises(ValueError, match="do not occur in 'batch_y'"):
        tc.nearest(x, y[by == 0], bx, by[by == 0])
    with pytest.raises(RuntimeError, match=r"opbridge::batch_pointers: torch_cluster\.nearest: batch_x must be sorted"):
        tc.nearest(x, y, bx.flip(0), by)


def _fps_ref(pos, start, count):
    chosen, dist = [start], ((pos - pos[start]) ** 2).sum(1)
    for _ in range(count - 1):
        chosen.append(int(np.argmax(dist)))
        dist = np.minimum(dist, ((pos - pos[chosen[-1]]) ** 2).sum(1))
    return chosen


def test_fps_samples_each_example_from_its_first_point():
    pos, batch = _cloud(90, seed=9)
    got = tc.fps(pos, batch, ratio=0.3, random_start=False)
    want = []
    for e in range(3):
        rows = np.nonzero(batch.numpy() == e)[0]
        want += list(rows[_fps_ref(pos.numpy()[rows], 0, int(np.ceil(np.float32(len(rows)) * np.float32(0.3))))])
    np.testing.assert_array_equal(got.numpy(), want)
    assert torch.equal(tc.fps(pos, ptr=[0, 90], ratio=torch.tensor(0.5), random_start=False),
                       torch.tensor(_fps_ref(pos.numpy(), 0, 45)))
    with pytest.raises(opbridge.OpbridgeError, match="ratio tensor of more than one value"):
        tc.fps(pos, batch, ratio=torch.tensor([0.5, 0.25]))


def test_grid_cluster_numbers_voxels_first_dimension_fastest():
    pos = torch.rand(50, 2, dtype=torch.float64) * 10
    size = torch.tensor([1.5, 2.0], dtype=torch.float64)
    start, end = pos.min(0).values, pos.max(0).values
    c = torch.trunc((pos - start) / size).long()
    num = torch.trunc((end - start) / size).long() + 1
    assert torch.equal(tc.grid_cluster(pos, size), c[:, 0] + c[:, 1] * num[0])


@pytest.mark.parametrize("reduce", ["sum", "add", "mean", "min", "max", "mul"])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_scatter_is_a_loop_over_the_index(reduce, dim, dtype):
    g = torch.Generator().manual_seed(10)
    src = (torch.randn(6, 7, 5, generator=g) * 10).to(dtype)
    index = torch.randint(0, 9, (src.size(dim),), generator=g)
    index[index == 4] = 5  # a place nothing is sent to
    got = ts.scatter(src, index, dim, dim_size=9, reduce=reduce)
    moved = np.moveaxis(src.numpy(), dim, 0)
    want = np.zeros((9,) + moved.shape[1:], dtype=moved.dtype)
    for place in range(9):
        rows = moved[index.numpy() == place]
        if len(rows):
            op = {"sum": np.sum, "add": np.sum, "mul": np.prod, "min": np.min, "max": np.max}.get(reduce)
            want[place] = op(rows, 0) if op else (rows.sum(0) / len(rows) if dtype.is_floating_point
                                                   else rows.sum(0) // len(rows))
        elif reduce == "mul":
            want[place] = 1
    np.testing.assert_allclose(got.numpy(), np.moveaxis(want, 0, dim), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("fn", ["scatter_min", "scatter_max"])
def test_scatter_min_max_return_the_winning_rows(fn):
    src = torch.tensor([[3.0, 1.0], [5.0, 1.0], [-2.0, 7.0], [5.0, 0.0]])
    index = torch.tensor([0, 0, 2, 0])
    values, arg = getattr(ts, fn)(src, index, 0, dim_size=4)
    if fn == "scatter_max":
        assert values.tolist() == [[5.0, 1.0], [0.0, 0.0], [-2.0, 7.0], [0.0, 0.0]]
        assert arg.tolist() == [[1, 0], [4, 4], [2, 2], [4, 4]]  # first row of a tie; n where empty
    else:
        assert values.tolist() == [[3.0, 0.0], [0.0, 0.0], [-2.0, 7.0], [0.0, 0.0]]
        assert arg.tolist() == [[0, 3], [4, 4], [2, 2], [4, 4]]
    full = index[:, None].expand(4, 2).contiguous()  # an index of src's shape: PyTorch's scatter
    v2, a2 = getattr(ts, fn)(src, full, 0, dim_size=4)
    assert torch.equal(v2, values) and torch.equal(a2, arg)


@pytest.mark.parametrize("reduce", ["sum", "mean", "min", "max"])
def test_segments_reduce_their_runs(reduce):
    g = torch.Generator().manual_seed(11)
    src = torch.randn(20, 3, generator=g)
    indptr = torch.tensor([0, 4, 4, 11, 20])
    index = torch.repeat_interleave(torch.arange(4), indptr.diff())
    want = ts.scatter(src, index, 0, dim_size=4, reduce=reduce)  # the loop above checks scatter
    assert torch.allclose(ts.segment_csr(src, indptr, reduce=reduce), want)
    assert torch.allclose(ts.segment_coo(src, index, dim_size=4, reduce=reduce), want)
    assert torch.equal(ts.segment_csr(src.long(), indptr, reduce=reduce),
                       ts.scatter(src.long(), index, 0, dim_size=4, reduce=reduce))
    if reduce in ("min", "max"):
        values, arg = getattr(ts, f"segment_{reduce}_csr")(src, indptr)
        assert torch.equal(values, want)
        assert arg[1].tolist() == [20, 20, 20]  # the empty segment: n
        filled = torch.tensor([0, 2, 3])
        assert torch.equal(torch.gather(src, 0, arg[filled]), want[filled])


def test_scatter_out_accumulates_sums_and_refuses_the_rest():
    src, index = torch.ones(5, 2), torch.tensor([0, 1, 1, 2, 2])
    out = torch.full((3, 2), 10.0)
    assert ts.scatter_add(src, index, 0, out=out) is out
    assert out[:, 0].tolist() == [11.0, 12.0, 12.0]
    with pytest.raises(opbridge.OpbridgeError, match="out= with reduce='max'"):
        ts.scatter(src, index, 0, out=out, reduce="max")
    with pytest.raises(ValueError, match="reduce is one of"):
        ts.scatter(src, index, 0, reduce="median")


@pytest.mark.skipif(_installed("torch_scatter") is None or _installed("torch_cluster") is None,
                    reason="torch_scatter / torch_cluster are not installed (scripts/oracles.sh builds them)")
def test_the_real_packages_agree():
    import torch_cluster
    import torch_scatter

    x, bx = _cloud(300, seed=12, dtype=torch.float32)
    y, by = _cloud(80, seed=13, dtype=torch.float32)
    assert torch.equal(tc.knn(x, y, 8, bx, by), torch_cluster.knn(x, y, 8, bx, by))
    assert torch.equal(tc.knn_graph(x, 8, bx), torch_cluster.knn_graph(x, 8, bx))
    assert torch.equal(tc.nearest(x, y, bx, by), torch_cluster.nearest(x, y, bx, by))
    assert torch.equal(tc.fps(x, bx, 0.3, False), torch_cluster.fps(x, bx, 0.3, False))
    key = lambda e: sorted(map(tuple, e.t().tolist()))  # noqa: E731  (its tree's order within a ball)
    assert key(tc.radius(x, y, 0.2, bx, by)) == key(torch_cluster.radius(x, y, 0.2, bx, by))
    src, index = torch.randn(300, 4), torch.randint(0, 20, (300,))
    for reduce in ("sum", "mean", "min", "max", "mul"):
        assert torch.allclose(ts.scatter(src, index, 0, reduce=reduce), torch_scatter.scatter(src, index, 0, reduce=reduce))
    for a, b in zip(ts.scatter_max(src, index, 0), torch_scatter.scatter_max(src, index, 0)):
        assert torch.equal(a, b)


# ---- pyg-lib's ops -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pyg():
    pyg_lib.register()
    return torch.ops.pyg


def test_pyg_ops_have_pyg_libs_schemas(pyg):
    for name, schema in pyg_lib.SCHEMAS.items():
        assert getattr(pyg, name).default._schema == torch._C.parse_schema(f"pyg::{schema}")


def test_pyg_knn_takes_pointers_of_different_lengths(pyg):
    x, bx = _cloud(100, seed=14)
    y, by = _cloud(40, seed=15)
    by = by.clamp(max=1)  # y names two examples, x three: PyG passes pointers of 4 and 3 entries
    ptr_x = torch.bucketize(torch.arange(4), bx).int()
    ptr_y = torch.bucketize(torch.arange(3), by)
    np.testing.assert_array_equal(pyg.knn(x, y, ptr_x, ptr_y, 5, False, 1).numpy(), _knn_ref(x, y, 5, bx, by))
    np.testing.assert_array_equal(pyg.knn(x, y, None, None, 5).numpy(),
                                  _knn_ref(x, y, 5, torch.zeros(100), torch.zeros(40)))


def test_pyg_radius_ignores_the_query_itself_without_counting_it(pyg):
    x, b = _cloud(150, seed=16)
    ptr = torch.bucketize(torch.arange(4), b)
    got = pyg.radius(x, x, ptr, ptr, 0.35, 4, 1, True)
    want = {}
    for i, j in sorted(_radius_ref(x, x, 0.35, b, b)):
        if i != j:
            want.setdefault(i, []).append(j)
    assert {tuple(p) for p in got.t().tolist()} == {(i, j) for i, js in want.items() for j in js[:4]}


def test_pyg_nearest_and_fps(pyg):
    x, bx = _cloud(60, seed=17)
    y, by = _cloud(30, seed=18)
    ptr_x, ptr_y = torch.bucketize(torch.arange(4), bx), torch.bucketize(torch.arange(4), by)
    assert torch.equal(pyg.nearest(x, y, ptr_x, ptr_y), tc.nearest(x, y, bx, by))
    assert torch.equal(pyg.fps(x, ptr_x, 0.5, False), tc.fps(x, bx, 0.5, False))


# ---- install() ---------------------------------------------------------------------------------


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_install_makes_the_import_resolve_to_the_compat_module():
    r = _python("import opbridge.compat as c, sys\n"
                "print(c.install('torch_cluster', 'pointnet2_ops', 'mmcv', force=True))\n"
                "import torch_cluster, mmcv.ops\n"
                "from pointnet2_ops import pointnet2_utils\n"
                "from pointnet2_ops.pointnet2_utils import QueryAndGroup\n"
                "print(torch_cluster is c.torch_cluster, pointnet2_utils.QueryAndGroup is QueryAndGroup,\n"
                "      mmcv.ops.__name__, sys.modules['pointnet2_ops.pointnet2_utils'].__name__)")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "{'torch_cluster': 'compat', 'pointnet2_ops': 'compat', 'mmcv': 'compat'}"
    assert lines[1] == "True True opbridge.compat.mmcv.ops opbridge.compat.pointnet2_ops.pointnet2_utils"


def test_install_leaves_an_installed_package_and_refuses_unknown_names():
    r = _python("import opbridge.compat as c\nprint(c.install('pointops', 'numpy'))")
    assert r.returncode != 0 and "no compat module for 'numpy'" in r.stderr
    r = _python("import opbridge.compat as c\nprint(c.install('pointops'))\nimport pointops\nprint(pointops.__name__)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["{'pointops': 'compat'}", "opbridge.compat.pointops"]
    r = _python("import opbridge.compat as c\nprint(c.install('torch_cluster'))")  # real where oracles.sh ran
    assert r.stdout.strip() == ("{'torch_cluster': 'real'}" if _installed("torch_cluster") else
                                "{'torch_cluster': 'compat'}")


# ---- export ------------------------------------------------------------------------------------


class _EdgeMax(torch.nn.Module):
    """A point-cloud layer as torch_cluster and torch_scatter users write it: a kNN graph over a
    batch vector, messages along its edges, a max per point."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 8)

    def forward(self, pos, batch):
        row, col = tc.knn_graph(pos, 6, batch)
        msg = self.lin(torch.cat([pos[col], pos[col] - pos[row]], -1))
        return ts.scatter_max(msg, row, 0, dim_size=pos.size(0))[0]


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_compat_calls_export_and_keep_the_number_of_examples_an_input(exporter):
    torch.manual_seed(0)
    model = _EdgeMax().eval()
    pos, batch = _cloud(200, examples=2, seed=19, dtype=torch.float32)
    proto = opbridge.export(model, (pos, batch), exporter=exporter)
    nodes = {n.op_type for n in proto.graph.node if n.domain == "opbridge"}
    # Under torch.jit.trace pos.size(0) is a traced size, which opbridge's scatter cannot take as
    # its dim_size attribute: PyTorch's scatter carries that reduction there. The batch vector
    # becomes segments in a node that checks it (BatchPointers).
    assert nodes == ({"BatchPointers", "KnnQuery", "ScatterReduceArg"} if exporter == "dynamo"
                     else {"BatchPointers", "KnnQuery"})
    pos3, batch3 = _cloud(200, examples=3, seed=20, dtype=torch.float32)  # three examples now
    sess = opbridge.session(proto)
    got = sess.run(None, dict(zip([i.name for i in sess.get_inputs()], [pos3.numpy(), batch3.numpy()])))[0]
    np.testing.assert_allclose(got, model(pos3, batch3).detach().numpy(), atol=1e-6)


@pytest.mark.skipif(_installed("torch_scatter") is None or _installed("torch_cluster") is None,
                    reason="torch_scatter / torch_cluster are not installed (scripts/oracles.sh builds them)")
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_the_real_packages_functions_export_through_their_twins(exporter):
    # The real functions call catch-all C++ ops that neither exporter can write; importing
    # opbridge.compat (done above) substitutes them while exporting.
    import torch_cluster
    import torch_scatter

    class Layer(torch.nn.Module):
        def forward(self, pos, batch):
            row, col = torch_cluster.knn_graph(pos, 6, batch)
            return torch_scatter.scatter_max(pos[col] - pos[row], row, 0, dim_size=pos.size(0))[0]

    pos, batch = _cloud(200, examples=2, seed=21, dtype=torch.float32)
    proto = opbridge.export(Layer(), (pos, batch), exporter=exporter)
    assert "KnnQuery" in {n.op_type for n in proto.graph.node}
    pos3, batch3 = _cloud(200, examples=3, seed=22, dtype=torch.float32)
    sess = opbridge.session(proto)
    got = sess.run(None, dict(zip([i.name for i in sess.get_inputs()], [pos3.numpy(), batch3.numpy()])))[0]
    np.testing.assert_allclose(got, Layer()(pos3, batch3).numpy(), atol=1e-6)  # the real packages, eagerly


# ---- batch vectors: one rule --------------------------------------------------------------------

_UNSORTED, _NEGATIVE = [0, 1, 0, 1, 0, 1, 0, 1], [-1, -1, -1, -1, 0, 0, 0, 0]
_BATCH_ERRORS = {"unsorted": (_UNSORTED, r" must be sorted, but \w+\[1\] = 1 > \w+\[2\] = 0"),
                 "negative": (_NEGATIVE, r"\w+\[0\] = -1 is negative")}


def _batch_functions(x, b):
    """Every compat function that takes a batch vector, called with batch vector b."""
    return {
        "torch_cluster.knn": lambda: tc.knn(x, x, 2, b, b),
        "torch_cluster.knn(5-D)": lambda: tc.knn(torch.cat([x, x[:, :2]], 1), torch.cat([x, x[:, :2]], 1), 2, b, b),
        "torch_cluster.knn_graph": lambda: tc.knn_graph(x, 2, b),
        "torch_cluster.nearest": lambda: tc.nearest(x, x, b, b),
        "torch_cluster.fps": lambda: tc.fps(x, b, 0.5, random_start=False),
        "torch_cluster.radius": lambda: tc.radius(x, x, 0.5, b, b),
        "torch_cluster.radius_graph": lambda: tc.radius_graph(x, 0.5, b),
        "torch_scatter.segment_coo": lambda: ts.segment_coo(x, b, dim_size=2),
        "torch_scatter.segment_coo(int)": lambda: ts.segment_coo(x.long(), b, dim_size=2),
        "torch_scatter.segment_max_coo": lambda: ts.segment_max_coo(x, b, dim_size=2),
        "pointops.batch2offset": lambda: po.batch2offset(b),
    }


@pytest.mark.parametrize("bad", list(_BATCH_ERRORS))
@pytest.mark.parametrize("fn", list(_batch_functions(torch.zeros(8, 3), torch.zeros(8, dtype=torch.long))))
def test_every_batch_vector_function_refuses_a_negative_or_unsorted_one(fn, bad):
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(0))
    values, match = _BATCH_ERRORS[bad]
    with pytest.raises(RuntimeError, match=r"opbridge::\w+: .*" + match):
        _batch_functions(x, torch.tensor(values))[fn]()
    _batch_functions(x, torch.tensor(sorted(abs(v) for v in values)))[fn]()  # the rule kept: it runs


class _BatchUser(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x, batch):
        return {"knn": lambda: tc.knn(x, x, 2, batch, batch),
                "knn_graph": lambda: tc.knn_graph(x, 2, batch),
                "nearest": lambda: tc.nearest(x, x, batch, batch),
                "fps": lambda: tc.fps(x, batch, 0.5, random_start=False)}[self.fn]()


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("fn", ["knn", "knn_graph", "nearest", "fps"])
def test_exported_batch_vector_functions_refuse_what_eager_refuses(fn, exporter):
    if exporter == "torchscript" and fn != "knn":
        pytest.skip("one function shows the TorchScript exporter's graph; the rule is the same node")
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(1))
    good = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    model = _BatchUser(fn)
    proto = opbridge.export(model, (x, good), None, exporter=exporter, input_names=["x", "batch"],
                            dynamic_axes={"x": {0: "n"}, "batch": {0: "n"}})
    sess = opbridge.session(proto)
    np.testing.assert_array_equal(sess.run(None, {"x": x.numpy(), "batch": good.numpy()})[0], model(x, good).numpy())
    for values, match in _BATCH_ERRORS.values():
        with pytest.raises(Exception, match=r"opbridge::batch_pointers.*torch_cluster\.\w+: \w+" + match):
            sess.run(None, {"x": x.numpy(), "batch": np.array(values, np.int64)})


def test_knn_asks_the_tree_for_no_more_neighbours_than_points():
    # A k far above the cloud's size gives the dense path's result, without (m, k) tables.
    x, bx = _cloud(60, seed=23)
    y, by = _cloud(20, seed=24)
    seen = []

    class Record(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.opbridge.knn_query.default:
                seen.append(kwargs.get("k", args[4] if len(args) > 4 else None))
            return func(*args, **(kwargs or {}))

    with Record():
        got = tc.knn(x, y, 10**6, bx, by)
    assert seen and max(seen) <= 60
    from opbridge.compat import _batches
    ptr_x, ptr_y = _batches.ptr_of(bx, x, 3, "t", "batch_x"), _batches.ptr_of(by, y, 3, "t", "batch_y")
    want = _batches.pairs(_batches.dense_knn(x, y, 10**6, ptr_x, ptr_y))
    assert torch.equal(got, want)
    np.testing.assert_array_equal(got.numpy(), _knn_ref(x, y, 10**6, bx, by))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak RSS from /proc")
def test_knn_with_a_huge_k_keeps_its_memory_bounded():
    # The peak from /proc (VmHWM, this process's own): ru_maxrss carries the parent's over exec.
    code = ("import torch\nfrom opbridge.compat import torch_cluster as tc\n"
            "peak = lambda: int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1])\n"
            "x = torch.randn(200, 3)\ntc.knn(x, x, 4)\nbefore = peak()\n"
            "e = tc.knn(x, x, 100_000)\nassert e.shape == (2, 200 * 200), e.shape\n"
            "print((peak() - before) // 1024)")
    r = _python(code)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.split()[-1]) < 64, f"knn with k = 100000 over 200 points grew the peak by {r.stdout} MiB"


# ---- torch_scatter: min and max on every path, and errors that name the function -------------


def _min_max_ref(src, index, n_places, reduce):
    """torch_scatter's rule by a loop: from the type's lowest (max) / largest (min) finite value, a
    value counts if it beats that strictly; no value counted: 0 and arg n; ties to the first row."""
    info = np.finfo(src.dtype) if src.dtype.kind == "f" else np.iinfo(src.dtype)
    start = info.min if reduce == "max" else info.max
    out = np.zeros((n_places,) + src.shape[1:], src.dtype)
    arg = np.full(out.shape, len(src), np.int64)
    for col in np.ndindex(*src.shape[1:]):
        for place in range(n_places):
            best, at = start, len(src)
            for row in range(len(src)):
                v = src[(row,) + col]
                if index[row] == place and (v > best if reduce == "max" else v < best):
                    best, at = v, row
            if at < len(src):
                out[(place,) + col], arg[(place,) + col] = best, at
    return out, arg


@pytest.mark.parametrize("reduce", ["min", "max"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_scatter_min_max_follow_one_rule_for_1d_and_2d_indices(reduce, dtype):
    nan, inf = float("nan"), float("inf")
    if dtype.is_floating_point:
        big = torch.finfo(dtype).max
        src = torch.tensor([[1.0, nan], [nan, nan], [3.0, -inf], [2.0, inf], [3.0, -big], [nan, big], [0.5, 2.0]],
                           dtype=dtype)
    else:
        lo, hi = torch.iinfo(dtype).min, torch.iinfo(dtype).max
        src = torch.tensor([[1, lo], [lo, hi], [3, -4], [2, 7], [3, lo], [hi, hi], [5, 2]], dtype=dtype)
    index = torch.tensor([0, 0, 1, 1, 1, 3, 3])  # place 2 gets nothing
    want_v, want_a = _min_max_ref(src.numpy(), index.numpy(), 4, reduce)
    fn = getattr(ts, f"scatter_{reduce}")
    for idx in (index, index[:, None].expand_as(src).contiguous()):  # opbridge's op; PyTorch's scatter
        values, arg = fn(src, idx, 0, dim_size=4)
        np.testing.assert_array_equal(values.numpy(), want_v)
        np.testing.assert_array_equal(arg.numpy(), want_a)


def test_scatter_errors_name_the_function():
    src, index = torch.randn(4, 3), torch.tensor([0, 0, 1, 1])
    with pytest.raises(ValueError, match=r"torch_scatter\.scatter: an index on the meta device .* pass dim_size"):
        ts.scatter(src.to("meta"), index.to("meta"), 0)
    assert ts.scatter(src.to("meta"), index.to("meta"), 0, dim_size=2).shape == (2, 3)  # shapes only: fine
    with pytest.raises(ValueError, match=r"torch_scatter\.scatter_max: src is on cpu and index on meta"):
        ts.scatter_max(src, index.to("meta"), 0, dim_size=2)
    with pytest.raises(RuntimeError, match=r"opbridge::scatter_reduce: input 'index' is on meta .* one device"):
        torch.ops.opbridge.scatter_reduce(src, index.to("meta"), 2, "sum")
    for fn in ("scatter_max", "scatter_min", "scatter_mean"):
        with pytest.raises(ValueError, match=rf"torch_scatter\.{fn}: a bool src supports reduce='sum' only"):
            getattr(ts, fn)(src > 0, index, 0)
    with pytest.raises(ValueError, match=r"torch_scatter\.scatter: index must be an integer tensor"):
        ts.scatter(src, index.float(), 0)
    for indptr, match in (([0, 2, 9], r"indptr\[2\] = 9 is not a row boundary of src \(4 rows\)"),
                          ([0, 3, 2], r"indptr must be non-decreasing, but indptr\[1\] = 3 > indptr\[2\] = 2"),
                          ([-1, 2, 4], r"indptr\[0\] = -1 is not a row boundary"), ([], "indptr is empty")):
        with pytest.raises(ValueError, match=r"torch_scatter\.segment_csr: " + match):
            ts.segment_csr(src.int(), torch.tensor(indptr, dtype=torch.long))
    with pytest.raises(ValueError, match=r"torch_scatter\.segment_coo: index holds 5, outside \[0, dim_size = 2\)"):
        ts.segment_coo(src.int(), torch.tensor([0, 0, 1, 5]), dim_size=2)


# ---- pointops: offsets reach the ops uncast --------------------------------------------------


def test_pointops_refuses_an_offset_int32_cannot_hold():
    xyz = torch.randn(30, 3, generator=torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match=r"pointops\.farthest_point_sampling: new_offset holds 8589934597"):
        po.farthest_point_sampling(xyz, torch.tensor([30]), torch.tensor([2**33 + 5]))
    with pytest.raises(ValueError, match=r"pointops\.knn_query: offset holds 4294967326"):
        po.knn_query(2, xyz, torch.tensor([2**32 + 30]))
    with pytest.raises(ValueError, match=r"pointops\.ball_query: offset must be an integer tensor"):
        po.ball_query(2, 0.5, 0.0, xyz, torch.tensor([30.0]))
    # int64 offsets that fit run as the int32 ones do.
    i64, i32 = po.knn_query(4, xyz, torch.tensor([12, 30])), po.knn_query(4, xyz, torch.tensor([12, 30]).int())
    assert torch.equal(i64[0], i32[0]) and torch.equal(i64[1], i32[1])
    assert torch.equal(po.farthest_point_sampling(xyz, torch.tensor([12, 30]), torch.tensor([3, 7])),
                       po.farthest_point_sampling(xyz, torch.tensor([12, 30]).int(), torch.tensor([3, 7]).int()))


# ---- pyg-lib: radius without the query itself, row pointers ------------------------------------


def _radius_without_self_ref(x, y, r, bx, by, cap):
    """(2, E) [y row, x row]: per row i of y, the first `cap` rows j != i of x in its example
    closer than r, by row."""
    d = ((y.numpy()[:, None] - x.numpy()[None]) ** 2).sum(-1)
    pairs = [(i, j) for i in range(len(y))
             for j in [j for j in np.nonzero((d[i] < r * r) & (bx.numpy() == by.numpy()[i]))[0] if j != i][:cap]]
    return np.array(pairs, dtype=np.int64).reshape(-1, 2).T


@pytest.mark.parametrize("cap", [0, 1, 3, 64])
@pytest.mark.parametrize("same", [True, False], ids=["graph", "two_clouds"])
def test_pyg_radius_without_the_same_index_is_a_loop(pyg, cap, same):
    # Dense balls: most queries hold more than cap points, so the cap applies after the query's
    # own row is dropped (and, for two clouds, row i of x is dropped for query i of y).
    x, bx = _cloud(120, seed=31)
    y, by = (x, bx) if same else _cloud(120, seed=32)
    px, py = torch.bucketize(torch.arange(4), bx), torch.bucketize(torch.arange(4), by)
    got = pyg.radius(x, y, px, py, 0.45, cap, 1, True)
    np.testing.assert_array_equal(got.numpy(), _radius_without_self_ref(x, y, 0.45, bx, by, cap))


class _RadiusGraph(torch.nn.Module):
    """PyG's radius_graph(loop=False) as it calls pyg-lib: row pointers of the batch vector, then
    pyg::radius with ignore_same_index."""

    def forward(self, pos, batch):
        ptr = pyg_lib.index2ptr(batch)
        return torch.ops.pyg.radius(pos, pos, ptr, ptr, 0.3, 4, 1, True)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_pyg_radius_without_the_same_index_exports_and_is_right_at_another_point_count(pyg, exporter):
    pos, batch = _cloud(90, examples=2, seed=33, dtype=torch.float32)
    proto = opbridge.export(_RadiusGraph(), (pos, batch), exporter=exporter, input_names=["pos", "batch"],
                            dynamic_axes={"pos": {0: "n"}, "batch": {0: "n"}})
    assert "Radius" in {n.op_type for n in proto.graph.node if n.domain == "opbridge"}
    sess = opbridge.session(proto)
    for pos, batch in ((pos, batch), _cloud(150, examples=3, seed=34, dtype=torch.float32)):
        [got] = sess.run(None, {"pos": pos.numpy(), "batch": batch.numpy()})
        np.testing.assert_array_equal(got, _radius_without_self_ref(pos, pos, 0.3, batch, batch, 4))
        assert opbridge.verify(_RadiusGraph(), (pos, batch), proto).ok


_BAD_PTRS = {"negative start": [-5, 20], "short of the rows": [0, 12], "past the rows": [0, 8, 25],
             "going down": [0, 15, 10, 20]}


@pytest.mark.parametrize("bad", list(_BAD_PTRS))
@pytest.mark.parametrize("fn", ["knn", "radius", "nearest", "fps"])
def test_pyg_row_pointers_must_rise_from_0_to_the_row_count(pyg, fn, bad):
    x = torch.rand(20, 3, generator=torch.Generator().manual_seed(35))
    good, ptr = torch.tensor([0, 8, 20]), torch.tensor(_BAD_PTRS[bad])
    call = {"knn": lambda p: pyg.knn(x, x, p, good, 2), "radius": lambda p: pyg.radius(x, x, p, good, 0.5),
            "nearest": lambda p: pyg.nearest(x, x, p, good), "fps": lambda p: pyg.fps(x, p, 0.5, False)}[fn]
    name = "ptr" if fn == "fps" else "ptr_x"
    with pytest.raises(ValueError, match=rf"pyg::{fn}: {name} must rise from 0 to the row count 20 without going "
                                         rf"down, got \[{', '.join(map(str, _BAD_PTRS[bad]))}\]"):
        call(ptr)
    call(good)  # well-formed pointers run
    with pytest.raises(ValueError, match=rf"pyg::{fn}: {name} is a 1-D integer tensor of row pointers"):
        call(good.float())
