"""The rotated ops as mmcv reaches them: mmcv._ext's box_iou_rotated, nms_rotated and
roi_align_rotated_forward/backward called exactly as mmcv/ops/box_iou_rotated.py, nms.py and
roi_align_rotated.py call them (their calls transcribed below), and the substitution rules for
mmcv's Python operators (a stand-in mmcv.ops, shaped as mmcv 2.x's, over an extension that is not
installed), exported with both exporters and run in ONNX Runtime."""

import sys
import types

import numpy as np
import pytest
import torch

import opbridge
import rotated_reference as ref
from opbridge.compat.mmcv import rotated as compat_rotated
from opbridge.compat.mmcv._ext import rotated as ext
from opbridge.testing import random_tensor as r

from test_rotated_boxes import boxes, crowd, labels, scores
from test_roi_align_rotated import rois


# ---- mmcv's calls, transcribed from mmcv 2.x's ops/*.py -----------------------------------------

def mmcv_box_iou_rotated(bboxes1, bboxes2, mode="iou", aligned=False, clockwise=True):
    mode_flag = {"iou": 0, "iof": 1}[mode]
    rows, cols = bboxes1.size(0), bboxes2.size(0)
    ious = bboxes1.new_zeros(rows) if aligned else bboxes1.new_zeros(rows * cols)
    if not clockwise:
        flip_mat = bboxes1.new_ones(bboxes1.shape[-1])
        flip_mat[-1] = -1
        bboxes1, bboxes2 = bboxes1 * flip_mat, bboxes2 * flip_mat
    ext.box_iou_rotated(bboxes1.contiguous(), bboxes2.contiguous(), ious, mode_flag=mode_flag, aligned=aligned)
    return ious if aligned else ious.view(rows, cols)


def mmcv_nms_rotated(dets, scores, iou_threshold, labels=None, clockwise=True):
    if not clockwise:
        flip_mat = dets.new_ones(dets.shape[-1])
        flip_mat[-1] = -1
        dets_cw = dets * flip_mat
    else:
        dets_cw = dets
    multi_label = labels is not None
    input_labels = scores.new_empty(0, dtype=torch.int) if labels is None else labels
    dets_wl = torch.cat((dets_cw, labels.unsqueeze(1)), 1) if multi_label else dets_cw
    _, order = scores.sort(0, descending=True)
    dets_sorted = dets_wl.index_select(0, order)
    keep_inds = ext.nms_rotated(dets_wl, scores, order, dets_sorted, input_labels, iou_threshold, multi_label)
    return torch.cat((dets[keep_inds], scores[keep_inds].reshape(-1, 1)), dim=1), keep_inds


class MmcvRoIAlignRotatedFunction(torch.autograd.Function):
    """mmcv's RoIAlignRotatedFunction's forward and backward, over mmcv._ext."""

    @staticmethod
    def forward(ctx, input, rois, output_size, spatial_scale, sampling_ratio=0, aligned=True, clockwise=False):
        ctx.output_size, ctx.spatial_scale, ctx.sampling_ratio = output_size, spatial_scale, sampling_ratio
        ctx.aligned, ctx.clockwise = aligned, clockwise
        ctx.save_for_backward(rois)
        ctx.feature_size = input.size()
        output = input.new_zeros(rois.size(0), input.size(1), output_size[0], output_size[1])
        ext.roi_align_rotated_forward(input, rois, output, pooled_height=output_size[0], pooled_width=output_size[1],
                                      spatial_scale=spatial_scale, sampling_ratio=sampling_ratio, aligned=aligned,
                                      clockwise=clockwise)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        rois = ctx.saved_tensors[0]
        grad_input = rois.new_zeros(*ctx.feature_size)
        ext.roi_align_rotated_backward(grad_output.contiguous(), rois, grad_input, pooled_height=grad_output.size(2),
                                       pooled_width=grad_output.size(3), spatial_scale=ctx.spatial_scale,
                                       sampling_ratio=ctx.sampling_ratio, aligned=ctx.aligned,
                                       clockwise=ctx.clockwise)
        return grad_input, None, None, None, None, None, None


# ---- the _ext functions --------------------------------------------------------------------------

@pytest.mark.parametrize("mode, aligned, clockwise", [("iou", False, True), ("iof", False, False),
                                                      ("iou", True, False), ("iof", True, True)])
def test_ext_box_iou_rotated(mode, aligned, clockwise):
    a, b = boxes(20, 101, spread=3.0), boxes(20, 102, spread=3.0)
    got = mmcv_box_iou_rotated(a, b, mode, aligned, clockwise)
    fn = ref.box_iou_rotated_aligned if aligned else ref.box_iou_rotated
    np.testing.assert_allclose(got.numpy(), fn(a.numpy(), b.numpy(), mode, clockwise), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("with_labels, clockwise", [(False, True), (True, True), (False, False)])
def test_ext_nms_rotated(with_labels, clockwise):
    dets, s = crowd(150, 103), scores(150, 104)
    lab = labels(150, 105) if with_labels else None
    kept, keep = mmcv_nms_rotated(dets, s, 0.25, lab, clockwise)
    want_kept, want_keep = ref.nms_rotated(dets.numpy(), s.numpy(), None if lab is None else lab.numpy(), 0.25,
                                           clockwise)
    assert keep.dtype == torch.int64
    np.testing.assert_array_equal(keep.numpy(), want_keep)
    np.testing.assert_allclose(kept.numpy(), want_kept)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_ext_roi_align_rotated_forward_and_backward(dtype):
    x = r([2, 3, 9, 10], dtype, seed=106)
    boxes_ = rois(8, 2, 107, dtype)
    attrs = {"output_size": (3, 3), "spatial_scale": 1.0, "sampling_ratio": 2, "aligned": True, "clockwise": True}
    xg = x.clone().requires_grad_()
    out = MmcvRoIAlignRotatedFunction.apply(xg, boxes_, *attrs.values())
    np.testing.assert_allclose(out.detach().numpy(), ref.roi_align_rotated(x.numpy(), boxes_.numpy(), **attrs),
                               rtol=1e-4, atol=1e-5)
    upstream = r(list(out.shape), dtype, seed=108)
    (out * upstream).sum().backward()
    x2 = x.clone().requires_grad_()
    (torch.ops.opbridge.roi_align_rotated(x2, boxes_, **{**attrs, "output_size": [3, 3]}) * upstream).sum().backward()
    np.testing.assert_allclose(xg.grad.numpy(), x2.grad.numpy(), rtol=1e-6, atol=1e-6)
    if dtype == "float64":  # and against finite differences, through mmcv's Function
        assert torch.autograd.gradcheck(lambda t: MmcvRoIAlignRotatedFunction.apply(t, boxes_, *attrs.values()),
                                        (x.clone().requires_grad_(),))


def test_ext_errors_name_the_function():
    with pytest.raises(RuntimeError, match=r"mmcv._ext.box_iou_rotated: mode_flag must be 0 \(iou\) or 1 \(iof\)"):
        ext.box_iou_rotated(boxes(2, 1), boxes(2, 2), torch.zeros(4), mode_flag=2, aligned=False)
    with pytest.raises(RuntimeError, match=r"opbridge::roi_align_rotated: rois\[0, 0\] = 3 is not a batch index"):
        ext.roi_align_rotated_forward(r([1, 1, 4, 4]), torch.tensor([[3.0, 1, 1, 2, 2, 0]]), torch.zeros(1, 1, 2, 2),
                                      pooled_height=2, pooled_width=2, spatial_scale=1.0, sampling_ratio=0,
                                      aligned=True, clockwise=False)


# ---- substitution of mmcv's Python operators ----------------------------------------------------

MMCV_STANDIN = '''
import torch
from torch.autograd import Function

def nms_rotated(dets, scores, iou_threshold, labels=None, clockwise=True):
    raise ImportError("mmcv._ext is not installed")

def box_iou_rotated(bboxes1, bboxes2, mode="iou", aligned=False, clockwise=True):
    raise ImportError("mmcv._ext is not installed")

class RoIAlignRotatedFunction(Function):
    @staticmethod
    def forward(ctx, input, rois, output_size, spatial_scale, sampling_ratio=0, aligned=True, clockwise=False):
        raise ImportError("mmcv._ext is not installed")
'''


@pytest.fixture
def mmcv_standin(monkeypatch):
    """mmcv.ops.nms, box_iou_rotated and roi_align_rotated with mmcv 2.x's signatures."""
    for name in ["mmcv", "mmcv.ops"]:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    shared = {}
    exec(compile(MMCV_STANDIN, "<mmcv.ops>", "exec"), shared)
    for module, names in [("nms", ["nms_rotated"]), ("box_iou_rotated", ["box_iou_rotated"]),
                          ("roi_align_rotated", ["RoIAlignRotatedFunction"])]:
        m = types.ModuleType(f"mmcv.ops.{module}")
        for n in names:
            obj = shared[n]
            obj.__module__ = m.__name__
            setattr(m, n, obj)
        monkeypatch.setitem(sys.modules, m.__name__, m)
    return sys.modules


class Detector(torch.nn.Module):
    """Pools rotated RoIs, scores them, and keeps the boxes rotated NMS keeps, as an oriented
    detector's head does, through mmcv's operators."""

    def forward(self, feats, proposals, props_scores):
        mods = sys.modules
        pooled = mods["mmcv.ops.roi_align_rotated"].RoIAlignRotatedFunction.apply(feats, proposals, (2, 2), 0.5, 2,
                                                                                  True, False)
        score = props_scores * pooled.mean(dim=(1, 2, 3)).sigmoid()
        kept, keep = mods["mmcv.ops.nms"].nms_rotated(proposals[:, 1:], score, 0.3, clockwise=True)
        overlaps = mods["mmcv.ops.box_iou_rotated"].box_iou_rotated(kept[:, :5], proposals[:, 1:], "iof",
                                                                    aligned=False, clockwise=True)
        return kept, keep, overlaps


def detector_inputs():
    feats = r([1, 4, 16, 16], seed=111)
    props = torch.cat([torch.zeros(40, 1), crowd(40, 112) * torch.tensor([2.0, 2.0, 1.0, 1.0, 1.0])], dim=1)
    return feats, props, scores(40, 113)


def test_substitutions_run_mmcv_operators_on_the_ops(mmcv_standin):
    model, args = Detector(), detector_inputs()
    with pytest.raises(ImportError):
        model(*args)
    rules = {rule.target for rule in opbridge.substitution_rules()}
    assert {"mmcv.ops.nms.nms_rotated", "mmcv.ops.roi_align_rotated.RoIAlignRotatedFunction",
            compat_rotated.TARGET} <= rules
    with opbridge.substitutions():
        kept, keep, overlaps = model(*args)
    feats, props, s = args
    pooled = ref.roi_align_rotated(feats.numpy(), props.numpy(), (2, 2), 0.5, 2, True, False)
    score = (s * torch.from_numpy(pooled).mean(dim=(1, 2, 3)).sigmoid()).numpy()
    want_kept, want_keep = ref.nms_rotated(props[:, 1:].numpy(), score, None, 0.3)
    np.testing.assert_array_equal(keep.numpy(), want_keep)
    np.testing.assert_allclose(kept.numpy(), want_kept, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(overlaps.numpy(), ref.box_iou_rotated(want_kept[:, :5], props[:, 1:].numpy(), "iof"),
                               rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_detector_through_mmcv_operators_exports(mmcv_standin, exporter):
    model, args = Detector(), detector_inputs()
    proto = opbridge.export(model, args, exporter=exporter)
    nodes = sorted(n.op_type for n in proto.graph.node if n.domain == "opbridge")
    assert nodes == ["BoxIouRotated", "NmsRotated", "RoiAlignRotated"]
    with opbridge.substitutions():  # eager on the ops too: mmcv's extension is not here
        report = opbridge.verify(model, args, proto, rtol=1e-4, atol=1e-5)
    assert report.ok, report.table()
