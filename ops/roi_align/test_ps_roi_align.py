"""ps_roi_align against a numpy loop written from torchvision's semantics (roi_reference.py):
half-pixel corners, adaptive and fixed sampling, RoIs across the border or outside, an empty grid
(NaN, as torchvision's 0 / 0), no RoIs; its gradient against the chain rule through the loop."""

import numpy as np
import pytest
import torch

from opbridge.testing import BadInput, OpCase, OpTest, Sample, random_tensor as r

import roi_reference as ref
from test_roi_align import boxes

OPS = torch.ops.opbridge


def sample(name, k=5, dtype="float32", output_size=(2, 3), spatial_scale=0.5, sampling_ratio=0, dynamic=None,
           with_point=False):
    x = r([2, 2 * output_size[0] * output_size[1], 9, 11], dtype, seed=4, low=-1.0, high=1.0)
    rois = boxes(k, dtype=dtype, scale=spatial_scale)
    if not with_point and k:
        rois = rois[[i for i in range(rois.shape[0]) if i != k + 1]]  # the point RoI pools NaN (0 / 0)
    return Sample((x, rois), dict(output_size=list(output_size), spatial_scale=spatial_scale,
                                  sampling_ratio=sampling_ratio), name=name, dynamic=dynamic)


SAMPLES = [
    sample("adaptive", dynamic={1: [0]}),
    sample("ratio2", sampling_ratio=2, output_size=(3, 3), spatial_scale=1.0),
    sample("float64", dtype="float64", sampling_ratio=1),
    sample("no_rois", k=0),
]

BAD = [
    BadInput((r([2, 6, 9, 11]), boxes(1)), dict(output_size=[2, 2]),
             r"input channels must be a multiple of output_size\[0\] \* output_size\[1\]", "channels_not_a_multiple"),
    BadInput((r([2, 4, 9, 11]), torch.tensor([[2.0, 1, 1, 4, 4]])), dict(output_size=[2, 2]),
             r"rois\[0, 0\] \(the batch index\) is 2, outside \[0, 2\)", "batch_index_out_of_range"),
]


def _resize(s, n):
    return Sample((s.inputs[0], boxes(n, seed=n, scale=s.attrs["spatial_scale"])[:n]), s.attrs)


class TestPsRoiAlign(OpTest):
    case = OpCase("ps_roi_align", reference=ref.ps_roi_align, samples=SAMPLES, bad_inputs=BAD, rtol=1e-5, atol=1e-6,
                  resize=_resize)


def test_an_empty_grid_is_nan_as_torchvisions():
    s = sample("point", with_point=True)
    out = OPS.ps_roi_align(*s.inputs, **s.attrs)[0]
    want = ref.ps_roi_align(*(t.numpy() for t in s.inputs), **s.attrs)[0]
    assert np.isnan(want[6]).all() and not np.isnan(np.delete(want, 6, 0)).any()
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)  # NaN where NaN


@pytest.mark.parametrize("s", SAMPLES[:3], ids=lambda s: s.name)
def test_gradient_is_the_chain_rule_through_the_loop(s):
    x, rois = (t.double() for t in s.inputs)
    out = OPS.ps_roi_align(x, rois, **s.attrs)[0]
    g = r(list(out.shape), "float64", seed=6)
    want = ref.ps_roi_align(x.numpy(), rois.numpy(), grad_output=g.numpy(), **s.attrs)
    np.testing.assert_allclose(OPS.ps_roi_align_backward(g, x, rois, **s.attrs).numpy(), want, rtol=1e-12, atol=1e-12)
    x.requires_grad_()
    (OPS.ps_roi_align(x, rois, **s.attrs)[0] * g).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-12, atol=1e-12)


def test_a_hugely_inverted_roi_samples_nothing_as_torchvisions():
    # ceil(bin size) of an RoI inverted by 1e30 is far below any int: held at the grid's bound, its
    # count keeps the sign torchvision's has (the empty sum divided by it: 0 here, not 0 / 0).
    x = torch.rand(1, 4, 3, 5, dtype=torch.float64)
    rois = torch.tensor([[0.0, 1e30, 1e30, -1e30, -1e30], [0.0, 0.5, 0.5, 2.5, 2.0]], dtype=torch.float64)
    out = OPS.ps_roi_align(x, rois, [2, 2])[0]
    want = ref.ps_roi_align(x.numpy(), rois.numpy(), output_size=(2, 2))[0]
    assert (out[0] == 0).all()
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-12, atol=0)
