"""torchvision::roi_align, roi_pool and ps_roi_align's export rules. With torchvision installed the
tests run its real ops; without it, stand-in ops of the same names and schemas whose kernels are
opbridge's exercise the same rules (the mapping is what is under test). Against torchvision's own
kernels, forward and gradient, in the cached environment that holds torch 2.14.1 and
torchvision 0.29.1 (tests/python/envs.py): the values travel as .npz files."""

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import opbridge
from opbridge.testing import random_tensor as r

try:
    import torchvision  # noqa: F401

    HAVE_TORCHVISION = True
except Exception:  # absent, or a build that does not match this torch
    HAVE_TORCHVISION = False

ROOT = Path(__file__).resolve().parents[2]
OPS = torch.ops.opbridge
SCHEMAS = {
    "roi_align": "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
                 "int sampling_ratio, bool aligned) -> Tensor",
    "roi_pool": "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
                "-> (Tensor, Tensor)",
    "ps_roi_align": "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
                    "SymInt pooled_width, int sampling_ratio) -> (Tensor, Tensor)",
}
IMPLS = {
    "roi_align": lambda x, rois, s, h, w, sr, al: OPS.roi_align(x, rois, [h, w], s, sr, "avg", al),
    "roi_pool": lambda x, rois, s, h, w: OPS.roi_pool(x, rois, [h, w], s),
    "ps_roi_align": lambda x, rois, s, h, w, sr: OPS.ps_roi_align(x, rois, [h, w], s, sr),
}
_standin = None


def tv():
    """torch.ops.torchvision: torchvision's, or the stand-ins."""
    global _standin
    if not HAVE_TORCHVISION and _standin is None:
        _standin = torch.library.Library("torchvision", "FRAGMENT")
        for name, schema in SCHEMAS.items():
            _standin.define(schema)
            _standin.impl(name, IMPLS[name], "CPU")
            torch.library.register_fake(f"torchvision::{name}", IMPLS[name], lib=_standin)
    return torch.ops.torchvision


tv()  # exists before export, as after `import torchvision`


def rois(k=6, n=2, h=20, w=24, scale=0.5, seed=0):
    g = np.random.default_rng(seed)
    x1, y1 = g.uniform(-4, w, k), g.uniform(-4, h, k)
    b = np.stack([g.integers(0, n, k), x1, y1, x1 + g.uniform(1, 14, k), y1 + g.uniform(1, 14, k)], 1)
    return torch.tensor(b / np.array([1, scale, scale, scale, scale]), dtype=torch.float32)


class Heads(torch.nn.Module):
    """The three ops as torchvision.ops.roi_align / roi_pool / ps_roi_align call them."""

    def forward(self, x, boxes, ps_x):
        a = tv().roi_align(x, boxes, 0.5, 3, 3, 2, True)
        b = tv().roi_align(x, boxes, 0.5, 3, 3, 0, False)
        c = tv().roi_pool(x, boxes, 0.5, 3, 3)[0]
        d = tv().ps_roi_align(ps_x, boxes, 0.5, 3, 3, 0)[0]
        return a + b + c, d


def args(k=6):
    return r([2, 4, 20, 24], seed=1), rois(k), r([2, 18, 20, 24], seed=2)


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_the_ops_export_as_opbridge_nodes_and_match(exporter):
    m = opbridge.export(Heads(), args(), exporter=exporter)
    kinds = sorted(n.op_type for n in m.graph.node if n.domain == "opbridge")
    assert kinds == ["PsRoiAlign", "RoiAlign", "RoiAlign", "RoiPool"], kinds
    report = opbridge.verify(Heads(), args(), m, rtol=1e-5, atol=1e-6)
    assert report.ok, report.table()


def test_a_dynamic_number_of_rois():
    m = opbridge.export(Heads(), args(), input_names=["x", "rois", "ps_x"], dynamic_axes={"rois": {0: "k"}})
    sess = opbridge.session(m)
    for k in (1, 9):
        report = opbridge.verify(Heads(), args(k), m, sess=sess, rtol=1e-5, atol=1e-6, prove_dynamic=False)
        assert report.ok, report.table()


TORCHVISION = textwrap.dedent('''
    import sys
    import numpy as np, torch, torchvision  # noqa: F401
    d = np.load(sys.argv[1])
    tv = torch.ops.torchvision
    out = {}
    for dtype in ("float32", "float64"):
        x = torch.tensor(d["x"]).to(getattr(torch, dtype)).requires_grad_()
        ps = torch.tensor(d["ps_x"]).to(getattr(torch, dtype)).requires_grad_()
        boxes = torch.tensor(d["rois"]).to(getattr(torch, dtype))
        for sr in (0, 2):
            for aligned in (True, False):
                y = tv.roi_align(x, boxes, 0.5, 3, 4, sr, aligned)
                (g,) = torch.autograd.grad((y * y.detach()).sum(), x)
                out[f"align_{dtype}_{sr}_{aligned}"], out[f"align_grad_{dtype}_{sr}_{aligned}"] = y.detach(), g
            y, arg = tv.ps_roi_align(ps, boxes, 0.5, 3, 2, sr)
            (g,) = torch.autograd.grad((y * y.detach()).sum(), ps)
            out[f"ps_{dtype}_{sr}"], out[f"ps_map_{dtype}_{sr}"], out[f"ps_grad_{dtype}_{sr}"] = y.detach(), arg, g
        y, arg = tv.roi_pool(x, boxes, 0.5, 3, 4)
        (g,) = torch.autograd.grad((y * y.detach()).sum(), x)
        out[f"pool_{dtype}"], out[f"pool_arg_{dtype}"], out[f"pool_grad_{dtype}"] = y.detach(), arg, g
    np.savez(sys.argv[2], **{k: v.numpy() for k, v in out.items()})
''')


@pytest.mark.environments
def test_values_and_gradients_equal_torchvisions_own_kernels(tmp_path):
    sys.path.insert(0, str(ROOT / "tests" / "python"))
    import envs

    python = envs.python_with("torch-2.14.1", ["torch==2.14.1", "torchvision==0.29.1", "scikit-build-core==1.1.2"])
    x, boxes, ps = args(8)
    np.savez(tmp_path / "in.npz", x=x.numpy(), rois=boxes.numpy(), ps_x=ps.numpy())
    run = subprocess.run([str(python), "-c", TORCHVISION, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    want = np.load(tmp_path / "out.npz")

    def grad(fn, t):
        t = t.detach().requires_grad_()
        y = fn(t)
        return y.detach().numpy(), torch.autograd.grad((y * y.detach()).sum(), t)[0].numpy()

    for dtype, tol in (("float32", dict(rtol=1e-5, atol=1e-6)), ("float64", dict(rtol=1e-12, atol=1e-12))):
        xd, bd, pd = (t.to(getattr(torch, dtype)) for t in (x, boxes, ps))
        for sr in (0, 2):
            for aligned in (True, False):
                y, g = grad(lambda t: OPS.roi_align(t, bd, [3, 4], 0.5, sr, "avg", aligned), xd)
                np.testing.assert_allclose(y, want[f"align_{dtype}_{sr}_{aligned}"], **tol)
                np.testing.assert_allclose(g, want[f"align_grad_{dtype}_{sr}_{aligned}"], **tol)
            y, g = grad(lambda t: OPS.ps_roi_align(t, bd, [3, 2], 0.5, sr)[0], pd)
            np.testing.assert_allclose(y, want[f"ps_{dtype}_{sr}"], **tol)
            np.testing.assert_allclose(g, want[f"ps_grad_{dtype}_{sr}"], **tol)
            np.testing.assert_array_equal(OPS.ps_roi_align(pd, bd, [3, 2], 0.5, sr)[1].numpy(),
                                          want[f"ps_map_{dtype}_{sr}"])
        y, g = grad(lambda t: OPS.roi_pool(t, bd, [3, 4], 0.5)[0], xd)
        np.testing.assert_array_equal(y, want[f"pool_{dtype}"])
        np.testing.assert_array_equal(OPS.roi_pool(xd, bd, [3, 4], 0.5)[1].numpy(), want[f"pool_arg_{dtype}"])
        np.testing.assert_allclose(g, want[f"pool_grad_{dtype}"], **tol)
