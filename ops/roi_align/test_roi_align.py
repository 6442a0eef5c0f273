"""roi_align against numpy loops written from mmcv's CPU semantics (roi_reference.py): aligned and
legacy corners, adaptive and fixed sampling, average and max pooling, RoIs partly or wholly
outside the image, empty and inverted RoIs, no RoIs at all; the gradient against the chain rule
through the same loops; mmcv's RoIAlignFunction substituted and exported; mmcv._ext's
roi_align_forward / roi_align_backward called as mmcv/ops/roi_align.py calls them, in-process
and on the real mmcv (mmcv-lite with mmdet's environment)."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import opbridge
from opbridge.testing import BadInput, OpCase, OpTest, Sample, random_tensor as r

import roi_reference as ref

OPS = torch.ops.opbridge
HERE = Path(__file__).resolve().parent


def boxes(k, n=2, h=9, w=11, dtype="float32", seed=0, scale=1.0):
    """k random RoIs in image coordinates over a feature map of h x w at `scale` (some across its
    border), then four fixed ones: the whole map, a point, one wholly outside, an inverted one
    (x2 < x1, y2 < y1). k = 0: no RoIs at all."""
    if k == 0:
        return torch.zeros((0, 5), dtype=getattr(torch, dtype))
    g = np.random.default_rng(seed)
    x1, y1 = g.uniform(-3, w, k), g.uniform(-3, h, k)
    rows = np.stack([g.integers(0, n, k), x1, y1, x1 + g.uniform(0.5, 8, k), y1 + g.uniform(0.5, 8, k)], 1)
    fixed = [[0, 0, 0, w, h], [n - 1, 4, 3, 4, 3], [0, -30, -30, -20, -25], [n - 1, 6, 5, 2, 1]]
    corners = np.concatenate([rows, fixed]) / np.array([1, scale, scale, scale, scale])
    return torch.tensor(corners, dtype=getattr(torch, dtype))


def attrs(output_size=(3, 4), spatial_scale=1.0, sampling_ratio=0, pool_mode="avg", aligned=True):
    return dict(output_size=list(output_size), spatial_scale=spatial_scale, sampling_ratio=sampling_ratio,
                pool_mode=pool_mode, aligned=aligned)


def sample(name, k=6, dtype="float32", dynamic=None, **kw):
    a = attrs(**kw)
    x = r([2, 3, 9, 11], dtype, seed=1, low=-1.0, high=1.0)
    return Sample((x, boxes(k, dtype=dtype, scale=a["spatial_scale"])), a, name=name, dynamic=dynamic)


SAMPLES = [
    sample("aligned_adaptive_avg", spatial_scale=0.5, dynamic={1: [0]}),
    sample("legacy_ratio2_avg", sampling_ratio=2, aligned=False),
    sample("aligned_adaptive_max", pool_mode="max", spatial_scale=0.25),
    sample("legacy_ratio2_max", pool_mode="max", sampling_ratio=2, aligned=False, output_size=(2, 2)),
    sample("float64", dtype="float64", spatial_scale=0.5, sampling_ratio=3, output_size=(7, 7)),
    sample("no_rois", k=0),
]


def _resize(s, n):
    return Sample((s.inputs[0], boxes(n, scale=s.attrs["spatial_scale"], seed=n)), s.attrs)


def _bad(name, match, x=None, rois=None, **kw):
    x = r([2, 3, 9, 11]) if x is None else x
    return BadInput((x, boxes(2) if rois is None else rois), attrs(**kw), match, name)


BAD = [
    _bad("rois_not_5_wide", r"rois must be \(K, 5\)", rois=r([3, 4])),
    _bad("batch_index_out_of_range", r"rois\[0, 0\] \(the batch index\) is 2, outside \[0, 2\)",
         rois=torch.tensor([[2.0, 1, 1, 4, 4]])),
    _bad("negative_batch_index", r"rois\[1, 0\] \(the batch index\) is -1", rois=torch.tensor([[0.0, 1, 1, 4, 4],
                                                                                               [-1, 1, 1, 4, 4]])),
    _bad("nan_batch_index", r"rois\[0, 0\] \(the batch index\) is nan", rois=torch.tensor([[float("nan"), 1, 1, 4, 4]])),
    _bad("infinite_corner", r"rois\[0, 3\] is inf: RoI coordinates must be finite",
         rois=torch.tensor([[0.0, 1, 1, float("inf"), 4]])),
    _bad("huge_adaptive_grid", r"samples per bin along its height", rois=torch.tensor([[0.0, 0, 0, 4, 1e9]])),
    _bad("pool_mode", r"pool_mode must be 'avg' or 'max', got 'min'", pool_mode="min"),
    _bad("output_size_zero", r"output_size values must be >= 1", output_size=(0, 2)),
    _bad("output_size_one_value", r"output_size", output_size=(3,)),
    _bad("sampling_ratio_huge", r"sampling_ratio must be <= 1048576", sampling_ratio=1 << 21),
    _bad("input_not_4d", r"input", x=r([3, 9, 11])),
    _bad("rois_dtype", r"rois", rois=boxes(2, dtype="float64")),
]


class TestRoiAlign(OpTest):
    case = OpCase("roi_align", reference=ref.roi_align, samples=SAMPLES, bad_inputs=BAD, rtol=1e-5, atol=1e-6,
                  resize=_resize)


@pytest.mark.parametrize("s", [s for s in SAMPLES if s.inputs[1].shape[0]], ids=lambda s: s.name)
def test_gradient_is_the_chain_rule_through_the_loops(s):
    x, rois = (t.double() for t in s.inputs)
    g = r(list(OPS.roi_align(x, rois, **s.attrs).shape), "float64", seed=7)
    got = OPS.roi_align_backward(g, x, rois, **s.attrs)
    want = ref.roi_align(x.numpy(), rois.numpy(), grad_output=g.numpy(), **s.attrs)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
    # and autograd runs that backward op
    x.requires_grad_()
    (OPS.roi_align(x, rois, **s.attrs) * g).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", ["roi_align", "ps_roi_align"])
def test_an_empty_input_with_a_huge_axis_sizes_nothing_by_it(op):
    # (1, 0, 2, 2^40): no element, so nothing is read; a scratch row sized by the huge axis (4 TiB)
    # would fail to allocate. The output is empty like the input's channels.
    x, rois = torch.empty(1, 0, 2, 2**40), torch.tensor([[0.0, 0.0, 0.0, 1.0, 1.0]])
    out = getattr(OPS, op)(x, rois, [2, 2], 1.0, 2)
    out = out[0] if isinstance(out, tuple) else out
    assert out.shape == (1, 0, 2, 2)
    grad = getattr(OPS, f"{op}_backward")(out, x, rois, [2, 2], 1.0, 2)
    assert grad.shape == x.shape


def test_a_bad_rois_row_is_a_failed_status_in_onnxruntime():
    class Net(torch.nn.Module):
        def forward(self, x, rois):
            return OPS.roi_align(x, rois, output_size=[2, 2], spatial_scale=0.5)

    x, rois = r([2, 3, 9, 11]), boxes(3)
    sess = opbridge.session(opbridge.export(Net(), (x, rois), input_names=["x", "rois"],
                                            dynamic_axes={"rois": {0: "k"}}))
    bad = rois.clone()
    bad[1, 0] = 5
    with pytest.raises(Exception, match=r"roi_align.*rois\[1, 0\] \(the batch index\) is 5, outside \[0, 2\)"):
        sess.run(None, {"x": x.numpy(), "rois": bad.numpy()})
    got = sess.run(None, {"x": x.numpy(), "rois": rois.numpy()})[0]  # the session survived
    np.testing.assert_allclose(got, Net()(x, rois).numpy(), rtol=1e-6)


# ---- mmcv -----------------------------------------------------------------------------------------

def mmcv_module(name, function, signature):
    """Yields mmcv.ops.<name>.<function>, an autograd Function whose forward has `signature` (mmcv's)
    and raises as mmcv-lite's does without its extension; mmcv, mmcv.ops and the module are in
    sys.modules meanwhile."""
    import types

    names = ["mmcv", "mmcv.ops", f"mmcv.ops.{name}"]
    saved = {n: sys.modules.get(n) for n in names}
    for n in names:
        sys.modules[n] = types.ModuleType(n)
    source = (f"from torch.autograd import Function\nclass {function}(Function):\n    @staticmethod\n"
              f"    def forward(ctx, {signature}):\n        raise ImportError('mmcv._ext is not installed')\n")
    exec(compile(source, f"<mmcv.ops.{name}>", "exec"), sys.modules[names[-1]].__dict__)
    yield getattr(sys.modules[names[-1]], function)
    for n, m in saved.items():
        sys.modules.pop(n) if m is None else sys.modules.__setitem__(n, m)


@pytest.fixture
def mmcv_standin():
    yield from mmcv_module("roi_align", "RoIAlignFunction", "input, rois, output_size, spatial_scale=1.0, "
                                                            "sampling_ratio=0, pool_mode='avg', aligned=True")


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_mmcv_roi_align_function_is_substituted(mmcv_standin, exporter):
    class Head(torch.nn.Module):  # as mmcv's RoIAlign module calls it: output_size an int or a pair
        def forward(self, x, rois):
            return (mmcv_standin.apply(x, rois, 7, 0.25, 2, "avg", True)
                    + mmcv_standin.apply(x, rois, (7, 7), 0.25, sampling_ratio=0, pool_mode="max", aligned=False))

    x, rois = r([2, 3, 9, 11]), boxes(5, scale=0.25)
    want = ref.roi_align(x.numpy(), rois.numpy(), (7, 7), 0.25, 2, "avg", True) + \
        ref.roi_align(x.numpy(), rois.numpy(), (7, 7), 0.25, 0, "max", False)
    with opbridge.substitutions():
        np.testing.assert_allclose(Head()(x, rois).numpy(), want, rtol=1e-5, atol=1e-6)
    proto = opbridge.export(Head(), (x, rois), exporter=exporter)
    assert [n.op_type for n in proto.graph.node if n.domain == "opbridge"] == ["RoiAlign", "RoiAlign"]
    with opbridge.substitutions():  # eager runs mmcv's Function, whose extension is missing here
        report = opbridge.verify(Head(), (x, rois), proto, rtol=1e-5, atol=1e-6)
    assert report.ok, report.table()


def _ext():
    from opbridge.compat.mmcv._ext import roi

    return roi


@pytest.mark.parametrize("aligned", [True, False])
def test_ext_roi_align_as_mmcv_calls_it(aligned):
    # mmcv/ops/roi_align.py: zero-filled outputs, argmax of size 0 for avg, pool_mode 1 = avg.
    x, rois = r([2, 3, 9, 11]), boxes(5, scale=0.5)
    kw = dict(aligned_height=3, aligned_width=4, spatial_scale=0.5, sampling_ratio=0, pool_mode=1, aligned=aligned)
    output, argmax_y, argmax_x = x.new_zeros((rois.shape[0], 3, 3, 4)), x.new_zeros(0), x.new_zeros(0)
    _ext().roi_align_forward(x, rois, output, argmax_y, argmax_x, **kw)
    np.testing.assert_allclose(output.numpy(), ref.roi_align(x.numpy(), rois.numpy(), (3, 4), 0.5, 0, "avg", aligned),
                               rtol=1e-5, atol=1e-6)
    g, grad_input = r([rois.shape[0], 3, 3, 4], seed=3), x.new_zeros(x.shape)
    _ext().roi_align_backward(g, rois, argmax_y, argmax_x, grad_input, **kw)
    np.testing.assert_allclose(grad_input.numpy(), ref.roi_align(x.numpy(), rois.numpy(), (3, 4), 0.5, 0, "avg",
                                                                 aligned, grad_output=g.numpy()), rtol=1e-5, atol=1e-6)


def test_ext_max_pooling_forward_runs_and_its_backward_says_what_to_do():
    x, rois = r([2, 3, 9, 11]), boxes(3)
    kw = dict(aligned_height=2, aligned_width=2, spatial_scale=1.0, sampling_ratio=2, pool_mode=0, aligned=True)
    output, ay, ax = (x.new_zeros((rois.shape[0], 3, 2, 2)) for _ in range(3))
    _ext().roi_align_forward(x, rois, output, ay, ax, **kw)
    np.testing.assert_allclose(output.numpy(), ref.roi_align(x.numpy(), rois.numpy(), (2, 2), 1.0, 2, "max"),
                               rtol=1e-6)
    assert ay.isnan().all() and ax.isnan().all()  # never positions that look real
    with pytest.raises(RuntimeError, match=r"roi_align_backward.*opbridge.substitutions\(\)"):
        _ext().roi_align_backward(output, rois, ay, ax, x.new_zeros(x.shape), **kw)


MMCV_SCRIPT = textwrap.dedent('''
    import json, sys
    import numpy as np, torch
    import opbridge.compat
    opbridge.compat.install("mmcv")
    from mmcv.ops import RoIAlign, RoIPool, roi_align
    d = np.load(sys.argv[1])
    x = torch.tensor(d["x"], requires_grad=True)
    rois = torch.tensor(d["rois"])
    out = {}
    for aligned in (True, False):
        y = RoIAlign((3, 4), spatial_scale=0.5, sampling_ratio=0, pool_mode="avg", aligned=aligned)(x, rois)
        (gx,) = torch.autograd.grad((y * torch.tensor(d["g"])).sum(), x)
        out[f"align_{aligned}"], out[f"align_grad_{aligned}"] = y.detach().numpy(), gx.numpy()
    out["align_max"] = roi_align(x, rois, 2, 1.0, 2, "max", True).detach().numpy()
    y = RoIPool((3, 4), spatial_scale=0.5)(x, rois)
    (gx,) = torch.autograd.grad((y * torch.tensor(d["g"])).sum(), x)
    out["pool"], out["pool_grad"] = y.detach().numpy(), gx.numpy()
    np.savez(sys.argv[2], **out)
''')


@pytest.mark.environments
def test_real_mmcv_roi_align_and_roi_pool_run_on_opbridge(tmp_path):
    sys.path.insert(0, str(HERE.parents[1] / "tests" / "python"))
    import envs
    from test_mmdet import MMDET

    python = envs.python_with("mmdet-3.3.0", MMDET, on_top=True)
    x, rois = r([2, 3, 9, 11]), boxes(5, scale=0.5)
    g = r([rois.shape[0], 3, 3, 4], seed=3)
    np.savez(tmp_path / "in.npz", x=x.numpy(), rois=rois.numpy(), g=g.numpy())
    run = subprocess.run([str(python), "-c", MMCV_SCRIPT, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = np.load(tmp_path / "out.npz")
    xn, rn, gn = x.numpy(), rois.numpy(), g.numpy()
    for aligned in (True, False):
        np.testing.assert_allclose(got[f"align_{aligned}"], ref.roi_align(xn, rn, (3, 4), 0.5, 0, "avg", aligned),
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[f"align_grad_{aligned}"],
                                   ref.roi_align(xn, rn, (3, 4), 0.5, 0, "avg", aligned, grad_output=gn),
                                   rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["align_max"], ref.roi_align(xn, rn, (2, 2), 1.0, 2, "max", True), rtol=1e-6)
    out, arg = ref.roi_pool(xn, rn, (3, 4), 0.5, round_rois=False)
    np.testing.assert_array_equal(got["pool"], out)
    np.testing.assert_allclose(got["pool_grad"], ref.roi_pool_grad(xn, rn, arg, gn), rtol=1e-6)
