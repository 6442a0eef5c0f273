"""spconv 2.3.8's CPU wheel, installed into an environment of its own (tests/python/envs.py): a model
written against spconv.pytorch (SubMConv3d layers sharing an indice_key, a strided SparseConv3d, the
SparseInverseConv3d of its key, a SparseMaxPool3d, SparseSequential with BatchNorm and ReLU,
SparseConvTensor.dense()) exports with both exporters through opbridge.compat.spconv's substitution
rules, the voxel count dynamic; ONNX Runtime equals spconv's own eager CPU result at the example and
at a second voxel count, per site (spconv numbers a strided layer's output sites in another order
than opbridge's rulebook: rows are compared sorted by their indices). opbridge.compat.spconv's
modules, given the real modules' state_dict, compute what spconv computes.

spconv's CPU path runs with one PyTorch thread here: with more, its result varies from run to run
(a race in its CPU kernels)."""

from __future__ import annotations

import os
import subprocess
import textwrap

import numpy as np
import pytest

import envs

pytestmark = pytest.mark.environments

SPCONV = ["spconv==2.3.8", "cumm<0.8", "pccm", "ccimport", "ninja", "fire", "pybind11", "lark", "portalocker"]

SCRIPT = textwrap.dedent('''
    import sys, warnings
    import numpy as np, torch, opbridge
    import opbridge.compat
    import opbridge.compat.spconv.pytorch as compat
    import spconv.pytorch as spconv

    torch.set_num_threads(1)  # spconv's CPU kernels race with more threads
    SHAPE = [21, 20, 22]

    def make(sp, bias=False):
        def block(conv, c):
            return [conv, torch.nn.BatchNorm1d(c), torch.nn.ReLU()]

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net = sp.SparseSequential(
                    *block(sp.SubMConv3d(4, 16, 3, bias=bias, indice_key="subm1"), 16),
                    *block(sp.SubMConv3d(16, 16, 3, bias=bias, indice_key="subm1"), 16),
                    *block(sp.SparseConv3d(16, 32, 3, stride=2, padding=1, bias=bias, indice_key="down1"), 32),
                    *block(sp.SubMConv3d(32, 32, 3, bias=bias, indice_key="subm2"), 32))
                self.up = sp.SparseInverseConv3d(32, 16, 3, indice_key="down1", bias=bias)
                self.pool = sp.SparseMaxPool3d(2, 2)
                self.head = sp.SparseSequential(sp.SubMConv3d(32, 8, 3, bias=bias, indice_key="subm3"), sp.ToDense())

            def forward(self, features, indices):
                deep = self.net(sp.SparseConvTensor(features, indices, SHAPE, 2))
                up = self.up(deep)
                up = up.replace_feature(torch.relu(up.features))
                pooled = self.pool(deep)
                return (deep.features, deep.indices, up.features, up.indices, pooled.features, pooled.indices,
                        self.head(pooled))
        return Net()

    def voxels(n, seed, shape=SHAPE, channels=4):
        g = np.random.default_rng(seed)
        sites = np.unique(np.concatenate([g.integers(0, 2, (n, 1)), g.integers(0, shape, (n, len(shape)))], 1), axis=0)
        x = g.standard_normal((len(sites), channels)).astype(np.float32)
        return torch.from_numpy(x), torch.from_numpy(sites.astype(np.int32))

    out = {}
    torch.manual_seed(0)
    model = make(spconv).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.uniform_(-0.2, 0.2); m.running_var.uniform_(0.5, 1.5)
    first, second = voxels(700, 1), voxels(1100, 2)
    out["n"] = np.array([len(first[0]), len(second[0])])
    with torch.no_grad():
        for tag, args in (("first", first), ("second", second)):
            for k, v in enumerate(model(*args)):
                out[f"spconv_{tag}_{k}"] = v.numpy()
        twin = make(compat).eval()
        twin.load_state_dict(model.state_dict())  # spconv's keys and shapes
        for k, v in enumerate(twin(*second)):
            out[f"compat_second_{k}"] = v.numpy()
    for exporter in ("torchscript", "dynamo"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            proto = opbridge.export(model, first, exporter=exporter, input_names=["features", "indices"],
                                    dynamic_axes={"features": {0: "voxels"}, "indices": {0: "voxels"}},
                                    check_args=second)
        out[f"{exporter}_nodes"] = np.array(sorted({n.op_type for n in proto.graph.node if n.domain == "opbridge"}))
        sess = opbridge.session(proto)
        names = [i.name for i in sess.get_inputs()]  # the dynamo exporter renames an input it also returns
        for tag, args in (("first", first), ("second", second)):
            for k, v in enumerate(sess.run(None, dict(zip(names, (args[0].numpy(), args[1].numpy()))))):
                out[f"{exporter}_{tag}_{k}"] = v
    # bias and the 2-D, transposed and pooled-inverse layers: spconv's CPU path adds a bias only in
    # training mode (eval refuses it), so both run in training mode (no BatchNorm here).
    def layers(sp):
        torch.manual_seed(3)
        return torch.nn.ModuleList([
            sp.SubMConv2d(3, 5, 3, indice_key="a"), sp.SparseConv2d(5, 6, (3, 2), stride=2, padding=1, indice_key="b"),
            sp.SparseConvTranspose2d(6, 4, 3, stride=2), sp.SparseMaxPool2d(3, 2, padding=1, indice_key="p"),
            sp.SparseInverseConv2d(3, 2, 3, indice_key="p"), sp.SubMConv2d(3, 4, 1),
            sp.SubMConv2d(3, 4, 3, dilation=2)])

    def run(sp, ls, x, sites):
        t = sp.SparseConvTensor(x, sites, [17, 19], 2)
        a = ls[0](t); b = ls[1](a); c = ls[2](b); p = ls[3](t); q = ls[4](p); r = ls[5](t); s = ls[6](t)
        return [v for y in (a, b, c, p, q, r, s) for v in (y.features.detach().numpy(), y.indices.numpy())]

    x2, sites2 = voxels(160, 5, [17, 19], 3)
    real = layers(spconv).train()
    twin = layers(compat).train()
    twin.load_state_dict(real.state_dict())
    for name, (sp, ls) in {"layers_spconv": (spconv, real), "layers_compat": (compat, twin)}.items():
        for k, v in enumerate(run(sp, ls, x2, sites2)):
            out[f"{name}_{k}"] = v
    with opbridge.substitutions():  # the rules, eagerly, on the real modules
        for k, v in enumerate(run(spconv, real, x2, sites2)):
            out[f"layers_rules_{k}"] = v
    np.savez(sys.argv[1], **out)
''')


@pytest.fixture(scope="module")
def got(tmp_path_factory):
    python = envs.python_with("spconv-2.3.8", SPCONV, on_top=True)
    tmp = tmp_path_factory.mktemp("spconv")
    (tmp / "run.py").write_text(SCRIPT)
    r = subprocess.run([str(python), str(tmp / "run.py"), str(tmp / "out.npz")], capture_output=True, text=True,
                       timeout=900, env={**os.environ, "PYTHONPATH": ""})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return dict(np.load(tmp / "out.npz"))


def by_site(features, indices):
    """Rows sorted by their site (batch, then coordinates), and the sorted sites."""
    order = np.lexsort(indices.T[::-1])
    return features[order], indices[order]


# The model's outputs: (features, indices) pairs and a dense tensor.
PAIRS, DENSE = [(0, 1), (2, 3), (4, 5)], 6


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("tag", ["first", "second"])
def test_exported_model_equals_spconvs_eager_result_per_site(got, exporter, tag):
    assert got["n"][0] != got["n"][1]
    assert set(got[f"{exporter}_nodes"]) == {"SparseIndicePairs", "SparseIndiceConv", "SparseIndiceMaxpool"}
    for f, i in PAIRS:
        want_f, want_i = by_site(got[f"spconv_{tag}_{f}"], got[f"spconv_{tag}_{i}"])
        have_f, have_i = by_site(got[f"{exporter}_{tag}_{f}"], got[f"{exporter}_{tag}_{i}"])
        np.testing.assert_array_equal(have_i, want_i)
        np.testing.assert_allclose(have_f, want_f, rtol=1e-4, atol=1e-5, err_msg=f"output {f}")
    np.testing.assert_allclose(got[f"{exporter}_{tag}_{DENSE}"], got[f"spconv_{tag}_{DENSE}"], rtol=1e-4, atol=1e-5)
    # the inverse layer's output sites are the input's, in the input's order, as spconv gives them
    np.testing.assert_array_equal(got[f"{exporter}_{tag}_3"], got[f"spconv_{tag}_3"])


def test_compat_modules_with_spconvs_state_dict_compute_what_spconv_does(got):
    for f, i in PAIRS:
        want_f, want_i = by_site(got[f"spconv_second_{f}"], got[f"spconv_second_{i}"])
        have_f, have_i = by_site(got[f"compat_second_{f}"], got[f"compat_second_{i}"])
        np.testing.assert_array_equal(have_i, want_i)
        np.testing.assert_allclose(have_f, want_f, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[f"compat_second_{DENSE}"], got[f"spconv_second_{DENSE}"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("which", ["compat", "rules"])
def test_2d_transposed_pooled_inverse_1x1_dilated_and_bias_layers_equal_spconv(got, which):
    """SubMConv2d, SparseConv2d (3, 2) stride 2, SparseConvTranspose2d, SparseMaxPool2d and the
    SparseInverseConv2d of its key, a 1x1 SubMConv2d (spconv's (Cin, Cout) view of its weight), a
    dilated SubMConv2d, all with a bias: compat's modules and the rules on spconv's own modules."""
    names = ["subm", "strided", "transposed", "pool", "pool_inverse", "1x1", "dilated"]
    for k, name in enumerate(names):
        want_f, want_i = by_site(got[f"layers_spconv_{2 * k}"], got[f"layers_spconv_{2 * k + 1}"])
        have_f, have_i = by_site(got[f"layers_{which}_{2 * k}"], got[f"layers_{which}_{2 * k + 1}"])
        np.testing.assert_array_equal(have_i, want_i, err_msg=name)
        np.testing.assert_allclose(have_f, want_f, rtol=1e-4, atol=1e-5, err_msg=name)
