"""roi_pool against a numpy loop written from the documented semantics (roi_reference.py):
torchvision's rounded bins and mmcv's bins cut from the scaled corners, empty bins (0 and argmax
-1), RoIs partly or wholly outside, no RoIs; the gradient at the argmax; mmcv's RoIPoolFunction
substituted (it returns the output alone) and exported; mmcv._ext's roi_pool_forward /
roi_pool_backward called as mmcv/ops/roi_pool.py calls them."""

import numpy as np
import pytest
import torch

import opbridge
from opbridge.testing import BadInput, OpCase, OpTest, Sample, random_tensor as r

import roi_reference as ref
from test_roi_align import boxes, mmcv_module

OPS = torch.ops.opbridge


def sample(name, k=6, dtype="float32", output_size=(3, 2), spatial_scale=1.0, round_rois=True, dynamic=None):
    x = r([2, 3, 9, 11], dtype, seed=2, low=-1.0, high=1.0)
    return Sample((x, boxes(k, dtype=dtype, scale=spatial_scale)),
                  dict(output_size=list(output_size), spatial_scale=spatial_scale, round_rois=round_rois), name=name,
                  dynamic=dynamic)


SAMPLES = [
    sample("torchvision_bins", spatial_scale=0.5, dynamic={1: [0]}),
    sample("mmcv_bins", spatial_scale=0.5, round_rois=False),
    sample("mmcv_bins_7x7", output_size=(7, 7), round_rois=False),
    sample("float64", dtype="float64", spatial_scale=0.25, output_size=(2, 4)),
    sample("no_rois", k=0),
]

BAD = [
    BadInput((r([2, 3, 9, 11]), torch.tensor([[3.0, 1, 1, 4, 4]])), dict(output_size=[2, 2]),
             r"rois\[0, 0\] \(the batch index\) is 3, outside \[0, 2\)", "batch_index_out_of_range"),
    BadInput((r([2, 3, 9, 11]), r([2, 4])), dict(output_size=[2, 2]), r"rois must be \(K, 5\)", "rois_not_5_wide"),
    BadInput((r([2, 3, 9, 11]), torch.tensor([[0.0, float("nan"), 1, 4, 4]])), dict(output_size=[2, 2]),
             r"rois\[0, 1\] is nan", "nan_corner"),
    BadInput((r([2, 3, 9, 11]), boxes(1)), dict(output_size=[2, 0]), r"output_size values must be >= 1",
             "output_size_zero"),
]


def _resize(s, n):
    return Sample((s.inputs[0], boxes(n, seed=n, scale=s.attrs["spatial_scale"])), s.attrs)


class TestRoiPool(OpTest):
    case = OpCase("roi_pool", reference=ref.roi_pool, samples=SAMPLES, bad_inputs=BAD, resize=_resize)


@pytest.mark.parametrize("s", SAMPLES[:4], ids=lambda s: s.name)
def test_gradient_goes_to_the_argmax(s):
    x, rois = (t.double() for t in s.inputs)
    out, arg = OPS.roi_pool(x, rois, **s.attrs)
    g = r(list(out.shape), "float64", seed=5)
    want = ref.roi_pool_grad(x.numpy(), rois.numpy(), arg.numpy(), g.numpy())
    np.testing.assert_allclose(OPS.roi_pool_backward(g, x, rois, arg, **s.attrs).numpy(), want, rtol=1e-12)
    x.requires_grad_()
    (OPS.roi_pool(x, rois, **s.attrs)[0] * g).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-12)


def test_backward_refuses_an_argmax_outside_the_plane():
    x, rois = r([1, 2, 4, 4]), torch.tensor([[0.0, 0, 0, 3, 3]])
    arg = torch.full((1, 2, 1, 1), 16, dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"roi_pool_backward: .*argmax\[0\] is 16, outside \[-1, 16\)"):
        OPS.roi_pool_backward(r([1, 2, 1, 1]), x, rois, arg, output_size=[1, 1])


@pytest.fixture
def mmcv_standin():
    yield from mmcv_module("roi_pool", "RoIPoolFunction", "input, rois, output_size, spatial_scale=1.0")


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_mmcv_roi_pool_function_is_substituted(mmcv_standin, exporter):
    class Head(torch.nn.Module):
        def forward(self, x, rois):
            return mmcv_standin.apply(x, rois, 7, 0.5) * 2  # the output alone, output_size an int

    x, rois = r([2, 3, 9, 11]), boxes(5, scale=0.5)
    want = ref.roi_pool(x.numpy(), rois.numpy(), (7, 7), 0.5, round_rois=False)[0] * 2
    with opbridge.substitutions():
        np.testing.assert_array_equal(Head()(x, rois).numpy(), want)
    proto = opbridge.export(Head(), (x, rois), exporter=exporter)
    assert [n.op_type for n in proto.graph.node if n.domain == "opbridge"] == ["RoiPool"]
    with opbridge.substitutions():
        report = opbridge.verify(Head(), (x, rois), proto, rtol=0, atol=0)
    assert report.ok, report.table()


def test_ext_roi_pool_as_mmcv_calls_it():
    from opbridge.compat.mmcv._ext import roi

    x, rois = r([2, 3, 9, 11]), boxes(5, scale=0.5)
    output, argmax = x.new_zeros((rois.shape[0], 3, 3, 4)), x.new_zeros((rois.shape[0], 3, 3, 4), dtype=torch.int)
    roi.roi_pool_forward(x, rois, output, argmax, pooled_height=3, pooled_width=4, spatial_scale=0.5)
    want, want_arg = ref.roi_pool(x.numpy(), rois.numpy(), (3, 4), 0.5, round_rois=False)
    np.testing.assert_array_equal(output.numpy(), want)
    np.testing.assert_array_equal(argmax.numpy(), want_arg)
    g, grad_input = r([rois.shape[0], 3, 3, 4], seed=3), x.new_zeros(x.shape)
    roi.roi_pool_backward(g, rois, argmax, grad_input, pooled_height=3, pooled_width=4, spatial_scale=0.5)
    np.testing.assert_allclose(grad_input.numpy(), ref.roi_pool_grad(x.numpy(), rois.numpy(), want_arg, g.numpy()),
                               rtol=1e-6)
