"""roi_align_rotated (and its gradient, by the suite's float64 gradcheck and against PyTorch's
gradient of a differentiable re-statement) against a numpy loop written from mmcv 2.x's
RoIAlignRotated semantics (rotated_reference.roi_align_rotated)."""

import re

import numpy as np
import pytest
import torch

import opbridge
import rotated_reference as ref
from opbridge.testing import BadInput, OpCase, OpTest, Sample, node_model, random_tensor as r

OP = torch.ops.opbridge.roi_align_rotated


def rois(k, n, seed, dtype="float32", size=(1.0, 6.0), extent=10.0):
    """k RoIs over n images of about extent x extent pixels (some reach outside)."""
    g = np.random.default_rng(seed)
    out = np.concatenate([g.integers(0, n, (k, 1)), g.uniform(-1, extent + 1, (k, 2)), g.uniform(*size, (k, 2)),
                          g.uniform(-np.pi, np.pi, (k, 1))], axis=1)
    return torch.from_numpy(out.astype(dtype))


BASE = {"output_size": [3, 2], "spatial_scale": 1.0}


def resize(s, n):
    return Sample((s.inputs[0], rois(n, s.inputs[0].shape[0], 99, str(s.inputs[0].dtype).split(".")[1])), s.attrs)


class TestRoiAlignRotated(OpTest):
    case = OpCase(
        "roi_align_rotated",
        reference=ref.roi_align_rotated,
        samples=[
            Sample((r([2, 3, 10, 12], seed=1), rois(9, 2, 2)), {**BASE, "sampling_ratio": 2}, name="float32",
                   dynamic={1: [0]}),
            Sample((r([2, 2, 9, 11], "float64", seed=3), rois(6, 2, 4, "float64")), {**BASE, "clockwise": True},
                   name="float64_adaptive_clockwise"),
            Sample((r([1, 2, 12, 12], seed=5), rois(5, 1, 6, size=(0.2, 3.0))),
                   {"output_size": [2, 2], "spatial_scale": 1.0, "aligned": False}, name="legacy_not_aligned"),
            # Feature map at stride 4: RoIs in image coordinates.
            Sample((r([1, 2, 8, 8], seed=7), rois(5, 1, 8, extent=32.0, size=(4.0, 20.0))),
                   {"output_size": [2, 3], "spatial_scale": 0.25, "sampling_ratio": 3}, name="spatial_scale"),
            Sample((r([1, 2, 6, 6], seed=9), torch.tensor([[0.0, 3, 3, 0, 2, 0.4], [0.0, 3, 3, 2, 0, 0]])),
                   {**BASE, "sampling_ratio": 0}, name="zero_size_rois"),
            Sample((r([1, 1, 5, 5], seed=10), torch.tensor([[0.0, -20, -20, 4, 4, 0.3]])), {**BASE, "sampling_ratio": 2},
                   name="outside_the_image"),
            Sample((r([2, 3, 5, 5], seed=11), rois(0, 2, 12)), BASE, name="no_rois"),
        ],
        rtol=1e-4, atol=1e-5,
        bad_inputs=[
            BadInput((r([2, 1, 5, 5]), torch.tensor([[2.0, 2, 2, 2, 2, 0]])), BASE,
                     r"rois\[0, 0\] = 2 is not a batch index of input \(batch size 2\)", "batch_index_past_the_end"),
            BadInput((r([2, 1, 5, 5]), torch.tensor([[-1.0, 2, 2, 2, 2, 0]])), BASE,
                     r"rois\[0, 0\] = -1 is not a batch index", "negative_batch_index"),
            BadInput((r([1, 1, 5, 5]), torch.tensor([[0.0, 2, 2, float("nan"), 2, 0]])), BASE,
                     r"rois\[0, 3\] = nan is not finite", "nan_roi"),
            BadInput((r([1, 1, 5, 5]), torch.tensor([[0.0, 2, 2, -1, 2, 0]])), BASE,
                     "roi 0 has a negative size", "negative_size"),
            BadInput((r([1, 1, 5, 5]), torch.tensor([[0.0, 2, 2, 1e9, 1e9, 0]])), BASE,
                     r"needs a .* sampling grid per bin: more than 2\^26 samples; give sampling_ratio > 0", "huge_roi"),
            BadInput((r([1, 1, 5, 5]), torch.zeros(2, 5)), BASE, r"rois must be \(K, 6\)", "five_columns"),
            BadInput((r([1, 1, 5, 5]), torch.zeros(2, 6)), {**BASE, "output_size": [0, 2]},
                     "output_size values must be >= 1", "empty_output"),
            BadInput((r([1, 1, 5, 5]), torch.zeros(2, 6)), {**BASE, "output_size": [2, 2, 2]},
                     r"output_size must be \(pooled_height, pooled_width\), got 3 values", "three_sizes"),
            BadInput((r([1, 1, 5, 5]), torch.zeros(2, 6)), {**BASE, "sampling_ratio": -1},
                     "sampling_ratio must be >= 0", "negative_sampling_ratio"),
            BadInput((r([1, 1, 0, 5]), torch.zeros(2, 6)), BASE, r"input has an empty image \(0 x 5\)", "empty_image"),
        ],
        resize=resize,
    )


def restated(input, rois, output_size, spatial_scale, sampling_ratio, aligned, clockwise):
    """The same sampling in differentiable torch ops (float64): its gradient is an independent
    check of the backward kernel's scatter."""
    n, c, h, w = input.shape
    ph_n, pw_n = output_size
    outs = []
    for roi in rois:
        b = int(roi[0])
        off = 0.5 if aligned else 0.0
        cw_, ch_ = float(roi[1]) * spatial_scale - off, float(roi[2]) * spatial_scale - off
        rw, rh = float(roi[3]) * spatial_scale, float(roi[4]) * spatial_scale
        if not aligned:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        theta = -float(roi[5]) if clockwise else float(roi[5])
        gh = sampling_ratio or int(np.ceil(np.float32(rh / ph_n)))
        gw = sampling_ratio or int(np.ceil(np.float32(rw / pw_n)))
        out = torch.zeros(c, ph_n, pw_n, dtype=input.dtype)
        for ph in range(ph_n):
            for pw in range(pw_n):
                acc = torch.zeros(c, dtype=input.dtype)
                for iy in range(gh):
                    yy = -rh / 2 + ph * rh / ph_n + (iy + 0.5) * rh / ph_n / gh
                    for ix in range(gw):
                        xx = -rw / 2 + pw * rw / pw_n + (ix + 0.5) * rw / pw_n / gw
                        y = yy * np.cos(theta) - xx * np.sin(theta) + ch_
                        x = yy * np.sin(theta) + xx * np.cos(theta) + cw_
                        if y < -1 or y > h or x < -1 or x > w:
                            continue
                        y, x = min(max(y, 0.0), h - 1), min(max(x, 0.0), w - 1)
                        y0, x0 = int(y), int(x)
                        y1, x1 = min(y0 + 1, h - 1), min(x0 + 1, w - 1)
                        ly, lx = y - y0, x - x0
                        img = input[b]
                        acc = acc + ((1 - ly) * (1 - lx) * img[:, y0, x0] + (1 - ly) * lx * img[:, y0, x1]
                                     + ly * (1 - lx) * img[:, y1, x0] + ly * lx * img[:, y1, x1])
                out[:, ph, pw] = acc / max(gh * gw, 1)
        outs.append(out)
    return torch.stack(outs)


@pytest.mark.parametrize("attrs", [
    {"output_size": [3, 2], "spatial_scale": 1.0, "sampling_ratio": 2, "aligned": True, "clockwise": False},
    {"output_size": [2, 2], "spatial_scale": 0.5, "sampling_ratio": 0, "aligned": False, "clockwise": True},
])
def test_gradient_matches_torchs_gradient_of_the_same_sampling(attrs):
    x = r([2, 3, 8, 9], "float64", seed=21).requires_grad_()
    boxes = rois(6, 2, 22, "float64", extent=8.0 / attrs["spatial_scale"], size=(1.0, 8.0))
    upstream = r([6, 3, *attrs["output_size"]], "float64", seed=23)
    (OP(x, boxes, **attrs) * upstream).sum().backward()
    mine = x.grad.clone()
    x.grad = None
    want = restated(x, boxes, **attrs)
    np.testing.assert_allclose(OP(x, boxes, **attrs).detach().numpy(), want.detach().numpy(), atol=1e-12)
    (want * upstream).sum().backward()
    np.testing.assert_allclose(mine.numpy(), x.grad.numpy(), atol=1e-12)


def test_a_rotation_by_half_a_turn_reverses_the_bins():
    x = r([1, 2, 10, 10], "float64", seed=31)
    roi = torch.tensor([[0.0, 5, 5, 4, 4, 0.0]], dtype=torch.float64)
    turned = roi.clone()
    turned[0, 5] = np.pi
    a = OP(x, roi, [4, 4], 1.0, 2)
    b = OP(x, turned, [4, 4], 1.0, 2)
    np.testing.assert_allclose(a.numpy(), b.flip(2, 3).numpy(), atol=1e-12)


def test_onnxruntime_refuses_a_batch_index_out_of_range():
    info = opbridge.builtin.op("roi_align_rotated")
    x = r([2, 1, 5, 5]).numpy()
    bad = np.array([[5.0, 2, 2, 2, 2, 0]], np.float32)
    sess = opbridge.session(node_model(info, [x, bad], BASE))
    with pytest.raises(Exception, match=re.escape("opbridge::roi_align_rotated") + r".*rois\[0, 0\] = 5 is not a "
                                                                                     r"batch index"):
        sess.run(None, {"input": x, "rois": bad})
    good = np.array([[1.0, 2, 2, 2, 2, 0]], np.float32)
    np.testing.assert_allclose(sess.run(None, {"input": x, "rois": good})[0],
                               ref.roi_align_rotated(x, good, **BASE), rtol=1e-5, atol=1e-6)
