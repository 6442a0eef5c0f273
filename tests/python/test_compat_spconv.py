"""opbridge.compat.spconv.pytorch (spconv 2.x's API on opbridge's sparse ops), where spconv is not
installed: each layer's features and gradients against PyTorch's dense convolutions on the densified
grid, read at the active sites (the output sites: those the dense convolution of the occupancy
reaches); indice_key reuse; spconv's errors; state_dict; install("spconv"); and a model of its
modules exported with both exporters, ONNX Runtime equal to eager at a second voxel count.
tests/python/test_spconv.py holds these modules against the real spconv."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import opbridge
import opbridge.compat.spconv.pytorch as spconv

SHAPE = [9, 10, 11]
CONV = {2: F.conv2d, 3: F.conv3d}
TRANSPOSED = {2: F.conv_transpose2d, 3: F.conv_transpose3d}


def voxels(n, shape=SHAPE, channels=4, seed=0, dtype=torch.float64):
    g = np.random.default_rng(seed)
    sites = np.unique(np.concatenate([g.integers(0, 2, (n, 1)), g.integers(0, shape, (n, len(shape)))], 1), axis=0)
    x = torch.tensor(g.standard_normal((len(sites), channels)), dtype=dtype)
    return x, torch.tensor(sites, dtype=torch.int32)


def dense(x, sites, shape):
    """(2, C, *shape): x at the sites, zero elsewhere (differentiable)."""
    d = torch.zeros(2, *shape, x.shape[1], dtype=x.dtype)
    return d.index_put(tuple(sites[:, a].long() for a in range(sites.shape[1])), x).movedim(-1, 1)


def at(d, sites):
    return d.movedim(1, -1)[tuple(sites[:, a].long() for a in range(sites.shape[1]))]


def torch_weight(w):  # spconv's (Cout, *k, Cin) -> PyTorch's (Cout, Cin, *k)
    return w.movedim(-1, 1)


def reached(sites, shape, fn):
    """The sites (sorted) where fn of the occupancy grid is > 0."""
    occupancy = dense(torch.ones(len(sites), 1, dtype=torch.float64), sites, shape)
    return sorted(map(tuple, torch.nonzero(fn(occupancy)[:, 0] > 0).tolist()))


def check(layer, x, sites, shape, fn, out_sites=None, tensor=None):
    """layer's output on the sparse tensor (x, sites) (or `tensor`, x its features) against fn(dense
    input, weight, bias) at its output sites, which must be out_sites (default: the input sites); the
    gradients of x, the weight and the bias for sum(out * g) too."""
    x = x.clone().requires_grad_(True)
    t = tensor if tensor is not None else spconv.SparseConvTensor(x, sites, shape, 2)
    if tensor is not None:
        t = t.replace_feature(x)
    y = layer(t)
    assert sorted(map(tuple, y.indices.tolist())) == (out_sites or sorted(map(tuple, sites.tolist())))
    assert y.indices.dtype == torch.int32
    params = [p for p in (getattr(layer, "weight", None), getattr(layer, "bias", None)) if p is not None]
    copies = [p.detach().clone().requires_grad_(True) for p in params]
    want = at(fn(dense(x, sites, shape), *copies), y.indices)
    torch.testing.assert_close(y.features, want)
    g = torch.randn(want.shape, dtype=want.dtype, generator=torch.Generator().manual_seed(1))
    got_grads = torch.autograd.grad((y.features * g).sum(), [x, *params])
    want_grads = torch.autograd.grad((want * g).sum(), [x, *copies])
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b)
    return y


@pytest.mark.parametrize("kernel,dilation", [(3, 1), ((3, 1, 5), 1), (3, 2), ((3, 3, 5), (1, 2, 2))])
def test_subm_conv_is_a_centred_dense_convolution_at_the_input_sites(kernel, dilation):
    x, sites = voxels(150)
    layer = spconv.SubMConv3d(4, 5, kernel, dilation=dilation).double()
    k, d = layer.kernel_size, layer.dilation
    y = check(layer, x, sites, SHAPE, lambda v, w, b: F.conv3d(v, torch_weight(w), b, padding=[
        di * (ki // 2) for ki, di in zip(k, d)], dilation=d))
    assert torch.equal(y.indices, sites)  # the input sites, in their order


@pytest.mark.parametrize("kernel,stride,padding,dilation", [(3, 2, 1, 1), ((2, 3, 1), (2, 1, 3), (0, 1, 0), 1),
                                                            (3, 1, 0, 2)])
def test_strided_conv_is_a_dense_convolution_at_the_sites_it_reaches(kernel, stride, padding, dilation):
    x, sites = voxels(150, seed=1)
    layer = spconv.SparseConv3d(4, 6, kernel, stride, padding, dilation).double()
    ones = torch.ones(1, 1, *layer.kernel_size, dtype=torch.float64)
    y = check(layer, x, sites, SHAPE, lambda v, w, b: F.conv3d(v, torch_weight(w), b, stride, padding, dilation),
              reached(sites, SHAPE, lambda o: F.conv3d(o, ones, None, stride, padding, dilation)))
    assert y.spatial_shape == [(n + 2 * p - d * (k - 1) - 1) // s + 1 for n, k, s, p, d in
                               zip(SHAPE, layer.kernel_size, layer.stride, layer.padding, layer.dilation)]


def test_transposed_conv_and_2d_layers():
    x, sites = voxels(60, seed=2)
    layer = spconv.SparseConvTranspose3d(4, 3, 3, stride=2, padding=1).double()
    ones = torch.ones(1, 1, 3, 3, 3, dtype=torch.float64)
    y = check(layer, x, sites, SHAPE, lambda v, w, b: F.conv_transpose3d(v, w.movedim(-1, 0), b, 2, 1),
              reached(sites, SHAPE, lambda o: F.conv_transpose3d(o, ones, None, 2, 1)))
    assert y.spatial_shape == [(n - 1) * 2 - 2 + 3 for n in SHAPE]
    x2, sites2 = voxels(80, [12, 13], channels=3, seed=3)
    check(spconv.SubMConv2d(3, 4, 3, indice_key="a").double(), x2, sites2, [12, 13],
          lambda v, w, b: F.conv2d(v, torch_weight(w), b, padding=1))
    ones2 = torch.ones(1, 1, 3, 2, dtype=torch.float64)
    check(spconv.SparseConv2d(3, 4, (3, 2), stride=2, padding=1).double(), x2, sites2, [12, 13],
          lambda v, w, b: F.conv2d(v, torch_weight(w), b, 2, 1), reached(sites2, [12, 13], lambda o: F.conv2d(
              o, ones2, None, 2, 1)))


def test_inverse_conv_runs_its_couples_rulebook_back_to_the_couples_input_sites():
    x, sites = voxels(150, seed=4)
    down = spconv.SparseConv3d(4, 6, 3, stride=2, padding=1, indice_key="down").double()
    t = down(spconv.SparseConvTensor(x, sites, SHAPE, 2))
    assert isinstance(t.indice_dict["down"], spconv.core.IndiceData)
    up = spconv.SparseInverseConv3d(6, 5, 3, indice_key="down").double()
    out_pad = [n - ((m - 1) * 2 - 2 + 3) for n, m in zip(SHAPE, t.spatial_shape)]
    y = check(up, t.features.detach(), t.indices, t.spatial_shape,
              lambda v, w, b: F.conv_transpose3d(v, w.movedim(-1, 0), b, 2, 1, out_pad),
              sorted(map(tuple, sites.tolist())), tensor=t)
    assert torch.equal(y.indices, sites) and y.spatial_shape == SHAPE


def test_max_pool_and_its_inverse():
    x, sites = voxels(150, seed=5)
    pool = spconv.SparseMaxPool3d(2, 2, indice_key="p")
    y = check(pool, x, sites, SHAPE, lambda v: F.max_pool3d(v, 2, 2).clamp(min=0),
              reached(sites, SHAPE, lambda o: F.max_pool3d(o, 2, 2)))
    assert y.spatial_shape == [n // 2 for n in SHAPE]
    assert spconv.SparseMaxPool3d(3).stride == [3, 3, 3]  # stride None: the kernel's
    back = spconv.SparseInverseConv3d(4, 2, 2, indice_key="p", bias=False).double()
    z = back(y)
    assert torch.equal(z.indices, sites)
    want = at(F.conv_transpose3d(dense(y.features, y.indices, y.spatial_shape), back.weight.movedim(-1, 0),
                                 None, 2, 0, [n % 2 for n in SHAPE]), sites)
    torch.testing.assert_close(z.features, want)


def test_1x1_layer_is_spconvs_product_with_its_weight_viewed_as_cin_by_cout():
    x, sites = voxels(50, seed=6)
    for layer in (spconv.SubMConv3d(4, 6, 1), spconv.SparseConv3d(4, 6, 1)):
        y = layer.double()(spconv.SparseConvTensor(x, sites, SHAPE, 2))
        torch.testing.assert_close(y.features, x @ layer.weight.reshape(4, 6) + layer.bias)
        assert torch.equal(y.indices, sites)


def test_fused_activation_and_add_input_come_after_the_bias():
    x, sites = voxels(80, seed=12)
    t = spconv.SparseConvTensor(x, sites, SHAPE, 2)
    skip = spconv.SparseConvTensor(torch.randn(len(sites), 5, dtype=torch.float64), sites, SHAPE, 2)
    for act, fn in (("ReLU", F.relu), ("LeakyReLU", lambda v: F.leaky_relu(v, 0.25)), (None, lambda v: v)):
        layer = spconv.conv.SparseConvolution(3, 4, 5, 3, subm=True, act_type=act, act_alpha=0.25).double()
        conv = at(F.conv3d(dense(x, sites, SHAPE), torch_weight(layer.weight), layer.bias, padding=1), sites)
        torch.testing.assert_close(layer(t, skip).features, fn(conv + skip.features))
    with pytest.raises(RuntimeError, match="no fused activation 'Tanh'"):
        spconv.conv.SparseConvolution(3, 4, 5, 3, subm=True, act_type="Tanh").double()(t)


def test_subm_layers_sharing_an_indice_key_share_one_rulebook_and_spconvs_errors():
    x, sites = voxels(100, seed=7)
    t = spconv.SparseConvTensor(x.float(), sites, SHAPE, 2)
    a = spconv.SubMConv3d(4, 4, 3, indice_key="s")(t)
    assert "s" in a.indice_dict and "s" not in t.indice_dict  # copied into the output, as spconv does
    b = spconv.SubMConv3d(4, 4, 3, indice_key="s")(a)
    assert b.indice_dict["s"] is a.indice_dict["s"]
    with pytest.raises(RuntimeError, match="SubM layers sharing an indice_key need one kernel_size"):
        spconv.SubMConv3d(4, 4, 5, indice_key="s")(a)
    with pytest.raises(RuntimeError, match="only SubM layers may share an indice_key"):
        spconv.SparseConv3d(4, 4, 3, indice_key="s")(a)
    with pytest.raises(RuntimeError, match="needs the rulebook of the layer it inverts, but indice_key 'x'"):
        spconv.SparseInverseConv3d(4, 4, 3, indice_key="x")(a)
    with pytest.raises(RuntimeError, match="is a SubM layer's"):
        spconv.SparseInverseConv3d(4, 4, 3, indice_key="s")(a)
    down = spconv.SparseConv3d(4, 4, 3, 2, indice_key="d")(t)
    with pytest.raises(RuntimeError, match=r"kernel_size \[2, 2, 2\] is not the kernel \[3, 3, 3\]"):
        spconv.SparseInverseConv3d(4, 4, 2, indice_key="d")(down)
    fewer = spconv.SparseConvTensor(down.features[:-1], down.indices[:-1], down.spatial_shape, 2,
                                    indice_dict=down.indice_dict)
    with pytest.raises(RuntimeError, match=f"the input has {len(down.indices) - 1} sites, but the output of the layer"):
        spconv.SparseInverseConv3d(4, 4, 3, indice_key="d")(fewer)
    other = spconv.SparseConvTensor(x[:-1].float(), sites[:-1], SHAPE, 2, indice_dict=a.indice_dict)
    with pytest.raises(RuntimeError, match="but the shared rulebook's input has"):
        spconv.SubMConv3d(4, 4, 3, indice_key="s")(other)
    with pytest.raises(RuntimeError, match="needs an odd kernel_size"):
        spconv.SubMConv3d(4, 4, 2)(t)
    with pytest.raises(RuntimeError, match=r"features must be \(N, 5\)"):
        spconv.SubMConv3d(5, 4, 3)(t)
    with pytest.raises(ValueError, match="groups=2 is not supported"):
        spconv.SparseConv3d(4, 4, 3, groups=2)
    with pytest.raises(RuntimeError, match="duplicate"):
        spconv.SubMConv3d(4, 4, 3)(spconv.SparseConvTensor(x[:3].float(), sites[[0, 1, 0]], SHAPE, 2))
    with pytest.raises(ValueError, match="you can't set feature directly"):
        t.features = x
    with pytest.raises(ValueError, match="indices must be int32"):
        spconv.SparseConvTensor(x, sites.long(), SHAPE, 2)


def test_sequential_dense_and_state_dict():
    x, sites = voxels(100, seed=8)
    torch.manual_seed(0)
    net = spconv.SparseSequential(spconv.SubMConv3d(4, 8, 3, indice_key="s"), torch.nn.BatchNorm1d(8),
                                  spconv.SparseReLU(), spconv.SparseConv3d(8, 6, 3, 2, 1, record_voxel_count=True),
                                  torch.nn.ReLU(), spconv.ToDense()).double().eval()
    got = net(spconv.SparseConvTensor(x, sites, SHAPE, 2))
    d = dense(x, sites, SHAPE)
    h = F.relu(F.batch_norm(F.conv3d(d, torch_weight(net[0].weight), net[0].bias, padding=1), net[1].running_mean,
                            net[1].running_var, net[1].weight, net[1].bias))
    h = F.relu(F.conv3d(h * (d.abs().sum(1, keepdim=True) > 0), torch_weight(net[3].weight), net[3].bias, 2, 1))
    mask = F.conv3d((d.abs().sum(1, keepdim=True) > 0).double(), torch.ones(1, 1, 3, 3, 3, dtype=torch.float64),
                    None, 2, 1) > 0
    torch.testing.assert_close(got, h * mask)
    assert {k: tuple(v.shape) for k, v in net.state_dict().items()} == {
        "0.weight": (8, 3, 3, 3, 4), "0.bias": (8,), "1.weight": (8,), "1.bias": (8,), "1.running_mean": (8,),
        "1.running_var": (8,), "1.num_batches_tracked": (), "3.max_num_voxels_during_training": (1,),
        "3.weight": (6, 3, 3, 3, 8), "3.bias": (6,)}
    t = spconv.SparseConvTensor(x, sites, SHAPE, 2)
    torch.testing.assert_close(t.dense(channels_first=False), d.movedim(1, -1))
    back = spconv.SparseConvTensor.from_dense(d.movedim(1, -1))
    assert torch.equal(back.indices, sites) and torch.equal(back.features, x)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = spconv.SparseSequential(
            spconv.SubMConv3d(4, 8, 3, bias=False, indice_key="s1"), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
            spconv.SubMConv3d(8, 8, 3, indice_key="s1"), spconv.SparseReLU(),
            spconv.SparseConv3d(8, 16, 3, 2, 1, indice_key="d1"), torch.nn.ReLU())
        self.up = spconv.SparseInverseConv3d(16, 4, 3, indice_key="d1")
        self.pool = spconv.SparseMaxPool3d(2, 2)
        self.dilated = spconv.SubMConv3d(4, 3, 3, dilation=2)
        self.transposed = spconv.SparseConvTranspose3d(16, 2, 2, stride=2)

    def forward(self, features, indices):
        x = spconv.SparseConvTensor(features, indices, SHAPE, 2)
        deep = self.net(x)
        up = self.up(deep) + x  # SparseConvTensor.__add__: the same sites
        pooled = self.pool(deep)
        t = self.transposed(deep)
        return (deep.features, deep.indices, up.features, pooled.features, pooled.indices, pooled.dense(),
                self.dilated(x).features, t.features, t.indices)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_a_model_of_these_modules_exports_and_runs_at_a_second_voxel_count(exporter):
    model = Net().eval()
    first, second = voxels(300, seed=9, dtype=torch.float32), voxels(450, seed=10, dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proto = opbridge.export(model, first, exporter=exporter, input_names=["features", "indices"],
                                dynamic_axes={"features": {0: "voxels"}, "indices": {0: "voxels"}}, check_args=second)
    assert {n.op_type for n in proto.graph.node if n.domain == "opbridge"} == {
        "SparseIndicePairs", "SparseIndiceConv", "SparseIndiceMaxpool"}
    sess = opbridge.session(proto)
    names = [i.name for i in sess.get_inputs()]
    with torch.no_grad():
        for args in (second, voxels(0, seed=11, dtype=torch.float32)):
            want = model(*args) if len(args[0]) else None
            got = sess.run(None, dict(zip(names, (args[0].numpy(), args[1].numpy()))))
            if want is None:  # an empty cloud: zero rows
                assert [g.shape[0] for g in got[:5] + got[6:]] == [0] * 8
                continue
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w.numpy(), rtol=1e-4, atol=1e-5)


def test_install_makes_import_spconv_pytorch_resolve_here():
    code = ("import opbridge.compat as c\nprint(c.install('spconv'))\nimport spconv, spconv.pytorch as sp\n"
            "from spconv.pytorch.conv import SubMConv3d\n"
            "print(spconv.__version__, sp.__name__, SubMConv3d is sp.SubMConv3d, sp.conv.SparseConvolution.__module__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:2] == ["{'spconv': 'compat'}", "2.3.8 opbridge.compat.spconv.pytorch True "
                                        "opbridge.compat.spconv.pytorch.conv"]
