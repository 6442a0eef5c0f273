"""mmcv's sparse convolution on opbridge: mmcv._ext's sparse functions called as mmcv/ops/sparse_ops.py
calls them (against sparse_reference.py), and mmcv-lite 2.1.0's real modules (SubMConv, SparseConv,
SparseInverseConv with indice_key reuse, SparseMaxPool, SparseSequential; 3-D and 2-D) running on
them, their features and gradients against dense PyTorch convolutions at the active sites; then a
SECOND-style encoder of those modules exported with both exporters (the voxel count dynamic) and
run in ONNX Runtime at another voxel count, equal to mmcv's eager forward."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from opbridge.compat.mmcv import _ext as ext  # what mmcv gets as mmcv._ext
import sparse_reference as R

HERE = Path(__file__).resolve().parent
SHAPE3, SHAPE2 = [9, 10, 11], [12, 13]


def mmcv_get_indice_pairs(indices, batch_size, spatial_shape, ksize, stride, padding, dilation, out_padding, subm,
                          transpose):
    """sparse_ops.get_indice_pairs' call of the extension (lists given, grid None)."""
    out_shape = R.output_shape(spatial_shape, ksize, stride, padding, dilation, out_padding, subm, transpose)
    fn = {2: ext.get_indice_pairs_2d_forward, 3: ext.get_indice_pairs_3d_forward,
          4: ext.get_indice_pairs_4d_forward}[indices.shape[1] - 1]
    return fn(indices, batch_size, out_shape, spatial_shape, ksize, stride, padding, dilation, out_padding, int(subm),
              int(transpose))


@pytest.mark.parametrize("shape,ksize,stride,padding,dilation,out_padding,subm,transpose", [
    (SHAPE3, [3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1], [0, 0, 0], True, False),
    (SHAPE3, [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], [0, 0, 0], False, False),
    (SHAPE3, [3, 1, 1], [2, 1, 1], [0, 0, 0], [1, 1, 1], [0, 0, 0], False, False),
    (SHAPE3, [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], [1, 0, 1], False, True),
    (SHAPE2, [3, 3], [2, 2], [1, 1], [1, 1], [0, 0], False, False),
    ([5, 4, 6, 3], [3, 3, 3, 3], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [0] * 4, True, False),
])
def test_ext_get_indice_pairs_as_mmcv_calls_it(shape, ksize, stride, padding, dilation, out_padding, subm, transpose):
    idx = R.sites(50, shape, batch=2, seed=len(shape) + 3 * subm + 5 * transpose)
    got = mmcv_get_indice_pairs(idx, 2, shape, ksize, stride, padding, dilation, out_padding, subm, transpose)
    want = R.rulebook(idx.numpy(), shape, ksize, stride, padding, dilation, out_padding, 2, subm, transpose)
    assert isinstance(got, list) and len(got) == 3
    for g, w in zip(got, want):
        assert g.dtype == torch.int32
        np.testing.assert_array_equal(g.numpy(), w)
    if len(shape) < 4:  # the grid variant (mmcv's _backward functions): the same rulebook
        grid = torch.full((2 * int(np.prod(R.output_shape(shape, ksize, stride, padding, dilation, out_padding,
                                                          subm, transpose))),), -1, dtype=torch.int32)
        fn = ext.get_indice_pairs_2d_backward if len(shape) == 2 else ext.get_indice_pairs_3d_backward
        out_shape = R.output_shape(shape, ksize, stride, padding, dilation, out_padding, subm, transpose)
        again = fn(idx, grid, 2, out_shape, shape, ksize, stride, padding, dilation, out_padding, int(subm),
                   int(transpose))
        for g, w in zip(again, want):
            np.testing.assert_array_equal(g.numpy(), w)
        with pytest.raises(RuntimeError, match="gridOut has 3 entries, fewer than batchSize"):
            fn(idx, grid[:3], 2, out_shape, shape, ksize, stride, padding, dilation, out_padding, int(subm),
               int(transpose))


def test_ext_get_indice_pairs_refuses_what_mmcv_would_misread():
    idx = R.sites(20, SHAPE3, batch=1, seed=3)
    with pytest.raises(RuntimeError, match=r"outSpatialShape \[5, 5, 5\] is not the output grid of spatialShape"):
        ext.get_indice_pairs_3d_forward(idx, 1, [5, 5, 5], SHAPE3, [3] * 3, [2] * 3, [1] * 3, [1] * 3, [0] * 3, 0, 0)
    with pytest.raises(RuntimeError, match=r"indices must be \(N, 3\)"):
        ext.get_indice_pairs_2d_forward(idx, 1, SHAPE3, SHAPE3, [3] * 3, [1] * 3, [1] * 3, [1] * 3, [0] * 3, 1, 0)
    dup = torch.cat([idx, idx[:1]])
    with pytest.raises(RuntimeError, match="indices rows 0 and 20 are the same site"):
        mmcv_get_indice_pairs(dup, 1, SHAPE3, [3] * 3, [1] * 3, [1] * 3, [1] * 3, [0] * 3, True, False)


@pytest.mark.parametrize("inverse", [0, 1])
def test_ext_indice_conv_forward_backward_and_fused(inverse):
    idx = R.sites(70, SHAPE3, batch=2, seed=9)
    outids, pairs, num = mmcv_get_indice_pairs(idx, 2, SHAPE3, [3] * 3, [2] * 3, [1] * 3, [1] * 3, [0] * 3, False,
                                               False)
    n_in, n_out = (len(outids), len(idx)) if inverse else (len(idx), len(outids))
    g = torch.Generator().manual_seed(inverse)
    x, w = torch.randn(n_in, 4, generator=g), torch.randn(3, 3, 3, 4, 6, generator=g)
    bias, grad = torch.randn(6, generator=g), torch.randn(n_out, 6, generator=g)
    args = (pairs.numpy(), num.numpy())
    want = R.conv(x.numpy(), w.numpy(), *args, np.zeros((n_out, 0)), bool(inverse))
    got = ext.indice_conv_forward(x, w, pairs, num, n_out, inverse, 0)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    fused = ext.fused_indice_conv_forward(x, w, bias, pairs, num, n_out, inverse, 0)
    np.testing.assert_allclose(fused.numpy(), want + bias.numpy(), rtol=1e-5, atol=1e-5)
    gx, gw = ext.indice_conv_backward(x, w, grad, pairs, num, inverse, 0)
    want_gx, want_gw = R.conv_backward(grad.numpy(), x.numpy(), w.numpy(), *args, bool(inverse))
    np.testing.assert_allclose(gx.numpy(), want_gx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gw.numpy(), want_gw, rtol=1e-5, atol=1e-4)


def test_ext_indice_maxpool_forward_backward():
    idx = R.sites(70, SHAPE3, batch=2, seed=10)
    outids, pairs, num = mmcv_get_indice_pairs(idx, 2, SHAPE3, [2] * 3, [2] * 3, [0] * 3, [1] * 3, [0] * 3, False,
                                               False)
    g = torch.Generator().manual_seed(3)
    x, grad = torch.randn(len(idx), 5, generator=g), torch.randn(len(outids), 5, generator=g)
    out = ext.indice_maxpool_forward(x, pairs, num, len(outids))
    np.testing.assert_array_equal(out.numpy(), R.maxpool(x.numpy(), pairs.numpy(), num.numpy(), outids.numpy()))
    gx = ext.indice_maxpool_backward(x, out, grad, pairs, num)
    np.testing.assert_array_equal(gx.numpy(), R.maxpool_backward(grad.numpy(), x.numpy(), out.numpy(),
                                                                  pairs.numpy(), num.numpy()))


# ---- mmcv-lite's real modules -------------------------------------------------------------------

def scatter(feat, sites, shape):
    """The dense (B, C, *shape) tensor with feat at the sites, zero elsewhere (differentiable)."""
    d = torch.zeros(2, *shape, feat.shape[1], dtype=feat.dtype)
    d = d.index_put(tuple(sites[:, a].long() for a in range(sites.shape[1])), feat)
    return d.movedim(-1, 1)


def at(d, sites):
    return d.movedim(1, -1)[tuple(sites[:, a].long() for a in range(sites.shape[1]))]


def torch_weight(w):  # mmcv's (*kernel, Cin, Cout) -> PyTorch's (Cout, Cin, *kernel)
    k = w.dim() - 2
    return w.permute(k + 1, k, *range(k))


def check_module(got, name, sites_in, x, in_shape, fn, reach, params=("weight", "bias")):
    """mmcv's module (as saved): its output sites are those the dense `reach` of the input's
    occupancy marks; its features and the gradients of sum(features * g) are those of
    fn(dense input, *params) there."""
    shape = [int(v) for v in got[f"{name}_shape"]]
    x = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    names = [p for p in params if f"{name}_{p}" in got]
    ps = [torch.tensor(got[f"{name}_{p}"], dtype=torch.float64, requires_grad=True) for p in names]
    out_sites = torch.tensor(got[f"{name}_indices"])
    occupancy = scatter(torch.ones(len(sites_in), 1, dtype=torch.float64), sites_in, list(in_shape))
    marked = reach(occupancy)
    assert list(marked.shape[2:]) == shape, name
    assert sorted(map(tuple, torch.nonzero(marked[:, 0] > 0).tolist())) == sorted(map(tuple, out_sites.tolist())), name
    want = at(fn(scatter(x, sites_in, list(in_shape)), *ps), out_sites)
    np.testing.assert_allclose(got[f"{name}_features"], want.detach().numpy(), rtol=1e-4, atol=1e-4, err_msg=name)
    (want * torch.tensor(got[f"{name}_g"], dtype=torch.float64)).sum().backward()
    np.testing.assert_allclose(got[f"{name}_x_grad"], x.grad.numpy(), rtol=1e-4, atol=1e-4, err_msg=name)
    for p, t in zip(names, ps):
        np.testing.assert_allclose(got[f"{name}_{p}_grad"], t.grad.numpy(), rtol=1e-4, atol=1e-3, err_msg=name)



@pytest.fixture(scope="module")
def mmcv_run(tmp_path_factory):
    """mmcv_sparse_run.py in the cached mmdet environment (mmcv-lite 2.1.0, mmengine): its inputs
    and what mmcv computed."""
    sys.path.insert(0, str(HERE.parents[1] / "tests" / "python"))
    import envs
    from test_mmdet import MMDET

    python = envs.python_with("mmdet-3.3.0", MMDET, on_top=True)
    tmp = tmp_path_factory.mktemp("sparse")
    g = np.random.default_rng(0)
    data = {"sites3": R.sites(80, SHAPE3, batch=2, seed=1).numpy(), "x3": g.standard_normal((80, 4), np.float32),
            "sites2": R.sites(60, SHAPE2, batch=2, seed=2).numpy(), "x2": g.standard_normal((60, 3), np.float32),
            "sites_first": R.clustered_sites(300, SHAPE3, batch=2, seed=3).numpy(),
            "x_first": g.standard_normal((300, 4), np.float32),
            "sites_second": R.clustered_sites(450, SHAPE3, batch=2, seed=4).numpy(),
            "x_second": g.standard_normal((450, 4), np.float32)}
    np.savez(tmp / "in.npz", **data)
    run = subprocess.run([str(python), str(HERE / "mmcv_sparse_run.py"), str(tmp / "in.npz"), str(tmp / "out.npz")],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return data, dict(np.load(tmp / "out.npz"))


def ones(*kernel):
    return torch.ones(1, 1, *kernel, dtype=torch.float64)


@pytest.mark.environments
def test_real_mmcv_3d_modules_match_dense_convolutions(mmcv_run):
    data, got = mmcv_run
    sites, x = torch.tensor(data["sites3"]), data["x3"]
    occupancy = scatter(torch.ones(len(sites), 1, dtype=torch.float64), sites, SHAPE3)
    check_module(got, "subm3", sites, x, SHAPE3, lambda d, w, b: F.conv3d(d, torch_weight(w), b, padding=1),
                 lambda o: o)
    check_module(got, "down3", sites, x, SHAPE3,
                 lambda d, w, b: F.conv3d(d, torch_weight(w), b, stride=2, padding=1),
                 lambda o: F.conv3d(o, ones(3, 3, 3), stride=2, padding=1))
    # mmcv's CPU order of the output sites, row for row.
    np.testing.assert_array_equal(got["down3_indices"], R.rulebook(data["sites3"], SHAPE3, [3] * 3, [2] * 3,
                                                                   [1] * 3, [1] * 3, [0] * 3)[0])
    down = [int(v) for v in got["down3_shape"]]
    pad = [n - ((m - 1) * 2 - 2 + 3) for n, m in zip(SHAPE3, down)]
    check_module(got, "inverse3", torch.tensor(got["down3_indices"]), got["down3_features"], down,
                 lambda d, w, b: F.conv_transpose3d(d, w.permute(3, 4, 0, 1, 2), b, stride=2, padding=1,
                                                    output_padding=pad),
                 lambda o: occupancy)
    np.testing.assert_array_equal(got["inverse3_indices"], data["sites3"])  # the couple's input sites
    check_module(got, "pool3", sites, x, SHAPE3, lambda d: F.max_pool3d(d, 2, 2).clamp(min=0),
                 lambda o: F.max_pool3d(o, 2, 2))


@pytest.mark.environments
def test_real_mmcv_2d_modules_match_dense_convolutions(mmcv_run):
    data, got = mmcv_run
    sites, x = torch.tensor(data["sites2"]), data["x2"]
    occupancy = scatter(torch.ones(len(sites), 1, dtype=torch.float64), sites, SHAPE2)
    check_module(got, "subm2", sites, x, SHAPE2, lambda d, w, b: F.conv2d(d, torch_weight(w), b, padding=1),
                 lambda o: o)
    check_module(got, "down2", sites, x, SHAPE2,
                 lambda d, w, b: F.conv2d(d, torch_weight(w), b, stride=2, padding=1),
                 lambda o: F.conv2d(o, ones(3, 2), stride=2, padding=1))
    down = [int(v) for v in got["down2_shape"]]
    pad = [n - ((m - 1) * 2 - 2 + k) for n, m, k in zip(SHAPE2, down, (3, 2))]
    check_module(got, "inverse2", torch.tensor(got["down2_indices"]), got["down2_features"], down,
                 lambda d, w, b: F.conv_transpose2d(d, w.permute(2, 3, 0, 1), b, stride=2, padding=1,
                                                    output_padding=pad),
                 lambda o: occupancy)
    check_module(got, "pool2", sites, x, SHAPE2, lambda d: F.max_pool2d(d, 3, 2, 1).clamp(min=0),
                 lambda o: F.max_pool2d(o, 3, 2, 1))


@pytest.mark.environments
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_real_mmcv_encoder_exports_with_a_dynamic_voxel_count(mmcv_run, exporter):
    # Exported at 300 voxels, run at 450: ONNX Runtime equals mmcv's own eager forward (on mmcv._ext).
    _, got = mmcv_run
    assert sorted(set(got[f"{exporter}_nodes"])) == ["SparseIndiceConv", "SparseIndiceMaxpool", "SparseIndicePairs"]
    assert list(got[f"{exporter}_nodes"]).count("SparseIndicePairs") == 4  # subm1's rulebook built once
    for k in range(5):
        ort, eager = got[f"{exporter}_{k}"], got[f"eager_{k}"]
        assert ort.shape == eager.shape and ort.dtype == eager.dtype, k
        np.testing.assert_allclose(ort, eager, rtol=1e-5, atol=1e-5, err_msg=f"output {k}")
    assert got["eager_1"].shape[0] > 100 and got["eager_2"].shape[0] == 450
    # No voxels at all: every output has zero rows.
    np.testing.assert_array_equal(got[f"{exporter}_empty_shapes"][:, 0], [0] * 5)
