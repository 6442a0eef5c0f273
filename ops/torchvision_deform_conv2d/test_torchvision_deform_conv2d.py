"""torchvision::deform_conv2d's export rules. With torchvision installed the tests run its real op
(and compare with it); without it, a stand-in op of the same name and schema whose kernel is
opbridge's deform_conv2d exercises the same rules — the mapping is what is under test, and
ONNX Runtime's own DeformConv and the ONNX reference evaluator are the oracles."""

import numpy as np
import onnx
import pytest
import torch

import opbridge
from opbridge.testing import random_tensor as r

try:
    import torchvision  # noqa: F401

    HAVE_TORCHVISION = True
except Exception:  # absent, or a build that does not match this torch
    HAVE_TORCHVISION = False

SCHEMA = ("deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, SymInt stride_h, "
          "SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups, "
          "SymInt offset_groups, bool use_mask) -> Tensor")
_standin = None


def _opbridge_call(input, weight, offset, mask, bias, sh, sw, ph, pw, dh, dw, groups, offset_groups, use_mask):
    return torch.ops.opbridge.deform_conv2d(input, weight, offset, bias, mask if use_mask else None,
                                            stride=[sh, sw], padding=[ph, pw], dilation=[dh, dw], groups=groups,
                                            offset_groups=offset_groups)


def torchvision_op():
    """torch.ops.torchvision.deform_conv2d: torchvision's, or the stand-in."""
    global _standin
    if not HAVE_TORCHVISION and _standin is None:
        _standin = torch.library.Library("torchvision", "DEF")
        _standin.define(SCHEMA)
        _standin.impl("deform_conv2d", _opbridge_call, "CPU")
        torch.library.register_fake("torchvision::deform_conv2d", _opbridge_call, lib=_standin)
    return torch.ops.torchvision.deform_conv2d


torchvision_op()  # exists before export, as after `import torchvision`


class Net(torch.nn.Module):
    """A DCNv2 block as torchvision.ops.deform_conv2d calls the op."""

    def __init__(self, use_mask=True, stride=1, pad=1, dil=1, groups=1, offset_groups=1):
        super().__init__()
        self.cfg = (stride, stride, pad, pad, dil, dil, groups, offset_groups, use_mask)

    def forward(self, x, weight, offset, bias, mask=None):
        if mask is None:  # what torchvision.ops.deform_conv2d passes without a mask
            mask = torch.zeros((x.shape[0], 1), dtype=x.dtype)
        return torchvision_op()(x, weight, offset, mask, bias, *self.cfg) * 2


def inputs(n=1, c_in=4, c_out=6, size=7, k=3, stride=1, pad=1, dil=1, groups=1, offset_groups=1, use_mask=True,
           dtype="float32"):
    out = (size + 2 * pad - (dil * (k - 1) + 1)) // stride + 1
    x = r([n, c_in, size, size], dtype, seed=1)
    w = r([c_out, c_in // groups, k, k], dtype, seed=2, low=-0.5, high=0.5)
    off = r([n, 2 * offset_groups * k * k, out, out], dtype, seed=3, low=-1.5, high=1.5)
    bias = r([c_out], dtype, seed=5)
    if not use_mask:
        return x, w, off, bias
    return x, w, off, bias, r([n, offset_groups * k * k, out, out], dtype, seed=4, low=0.0, high=1.0)


CONFIGS = {
    "dcn_v2": dict(),
    "dcn_v1_no_mask": dict(use_mask=False),
    "stride2_dilation2_groups": dict(stride=2, dil=2, pad=2, groups=2, offset_groups=2, c_in=4, c_out=4),
}


def _net(cfg):
    keys = ("use_mask", "stride", "pad", "dil", "groups", "offset_groups")
    return Net(**{k: v for k, v in cfg.items() if k in keys}).eval()


def _nodes(m):
    return {(n.domain, n.op_type) for n in m.graph.node}


@pytest.mark.parametrize("cfg", CONFIGS, ids=list(CONFIGS))
@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_deform_conv_from_opset_19(cfg, exporter):
    net, args = _net(CONFIGS[cfg]), inputs(**CONFIGS[cfg])
    m = opbridge.export(net, args, exporter=exporter, opset=19 if exporter == "torchscript" else None)
    assert ("", "DeformConv") in _nodes(m) and ("opbridge", "DeformConv2d") not in _nodes(m)
    node = next(n for n in m.graph.node if n.op_type == "DeformConv")
    use_mask = CONFIGS[cfg].get("use_mask", True)
    assert len([i for i in node.input if i]) == (5 if use_mask else 4), "the mask is written only with use_mask"
    # ONNX Runtime's own DeformConv against PyTorch (no opbridge kernel in the session).
    report = opbridge.verify(net, args, m, rtol=1e-4, atol=1e-5)
    assert report.ok, report.table()
    # And the ONNX reference evaluator against ONNX Runtime.
    from onnx.reference import ReferenceEvaluator

    feeds = {i.name: t.numpy() for i, t in zip(m.graph.input, [a for a in args])}
    np.testing.assert_allclose(ReferenceEvaluator(m).run(None, feeds)[0], opbridge.session(m).run(None, feeds)[0],
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cfg", CONFIGS, ids=list(CONFIGS))
@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_opbridge_node_below_opset_19_and_on_request(cfg, exporter):
    net, args = _net(CONFIGS[cfg]), inputs(**CONFIGS[cfg])
    below = 17 if exporter == "torchscript" else 18
    for m in (opbridge.export(net, args, exporter=exporter, opset=below),
              opbridge.export(net, args, exporter=exporter, custom_nodes=True)):
        assert ("opbridge", "DeformConv2d") in _nodes(m) and ("", "DeformConv") not in _nodes(m)
        report = opbridge.verify(net, args, m, rtol=1e-4, atol=1e-5)
        assert report.ok, report.table()


def test_float64_through_the_opbridge_node():
    net, args = _net({}), inputs(dtype="float64")
    m = opbridge.export(net, args, custom_nodes=True)
    report = opbridge.verify(net, args, m, rtol=1e-10, atol=1e-12)
    assert report.ok, report.table()


def test_dynamic_batch():
    net, args = _net({}), inputs(n=2)
    names = ["x", "weight", "offset", "bias", "mask"]
    m = opbridge.export(net, args, input_names=names,
                        dynamic_axes={"x": {0: "batch"}, "offset": {0: "batch"}, "mask": {0: "batch"}})
    sess = opbridge.session(m)
    for n in (1, 3):
        report = opbridge.verify(net, inputs(n=n), m, sess=sess, rtol=1e-4, atol=1e-5)
        assert report.ok, report.table()


@pytest.mark.skipif(not HAVE_TORCHVISION, reason="torchvision is not installed (see README: optional tests)")
@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_torchvision_ops_deform_conv2d_exports_and_matches_torchvision(exporter):
    from torchvision.ops import deform_conv2d

    class TV(torch.nn.Module):
        def forward(self, x, offset, weight, mask):
            return deform_conv2d(x, offset, weight, padding=(1, 1), mask=mask)

    x, w, off, _, mask = inputs()
    for opset, node in ((19, ("", "DeformConv")), (18, ("opbridge", "DeformConv2d"))):
        m = opbridge.export(TV(), (x, off, w, mask), exporter=exporter, opset=opset)
        assert node in _nodes(m)
        report = opbridge.verify(TV(), (x, off, w, mask), m, rtol=1e-4, atol=1e-5)
        assert report.ok, report.table()
    # torchvision's kernel and opbridge's agree.
    want = deform_conv2d(x, off, w, padding=(1, 1), mask=mask)
    got = torch.ops.opbridge.deform_conv2d(x, w, off, None, mask, padding=[1, 1])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_model_checks_with_full_shape_inference():
    net, args = _net({}), inputs()
    onnx.checker.check_model(opbridge.export(net, args), full_check=True)
