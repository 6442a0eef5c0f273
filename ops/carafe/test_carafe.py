"""carafe: content-aware reassembly of features with mmcv 2.x's semantics.

Oracles: numpy loops written from the definition (output pixel (oy, ox) sums the k×k window
centred on input pixel (oy // s, ox // s), zero outside, weighted by its group's mask channels
(g * k + ky) * k + kx), for the forward and both gradients; finite differences (the suite's
gradcheck); mmcv's Functions' own calls into mmcv._ext, transcribed from mmcv/ops/carafe.py."""

import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import opbridge
from opbridge.compat.mmcv._ext import carafe as ext
from opbridge.testing import BadInput, OpCase, OpTest, Sample, node_model, random_tensor as r

OP = torch.ops.opbridge.carafe
BACKWARD = torch.ops.opbridge.carafe_backward


def _windows(features, kernel_size, group_size, scale_factor):
    """Yields (ky, kx, window values (N, C, H*s, W*s) in float64, zero outside the image, mask
    channel per feature channel (C,))."""
    n, c, h, w = features.shape
    k, s, rad = kernel_size, scale_factor, (kernel_size - 1) // 2
    group = np.arange(c) // (c // group_size) if c else np.zeros(0, np.int64)
    for ky in range(k):
        iy = np.arange(h * s) // s + ky - rad
        for kx in range(k):
            ix = np.arange(w * s) // s + kx - rad
            inside = ((iy >= 0) & (iy < h))[:, None] & ((ix >= 0) & (ix < w))[None, :]
            vals = features[:, :, np.clip(iy, 0, h - 1)[:, None], np.clip(ix, 0, w - 1)[None, :]].astype(np.float64)
            yield ky, kx, inside, np.where(inside, vals, 0.0), (group * k + ky) * k + kx


def reference(features, masks, kernel_size, group_size, scale_factor):
    out = np.zeros(features.shape[:2] + masks.shape[2:])
    for ky, kx, inside, vals, mc in _windows(features, kernel_size, group_size, scale_factor):
        out += np.where(inside, vals * masks[:, mc].astype(np.float64), 0.0)
    return out.astype(features.dtype)


def reference_backward(grad_output, features, masks, kernel_size, group_size, scale_factor):
    """(grad_features, grad_masks) by the chain rule, one window position at a time."""
    n, c, h, w = features.shape
    s, rad = scale_factor, (kernel_size - 1) // 2
    go = grad_output.astype(np.float64)
    grad_f, grad_m = np.zeros(features.shape), np.zeros(masks.shape)
    for ky, kx, inside, vals, mc in _windows(features, kernel_size, group_size, scale_factor):
        for ch in range(c):
            grad_m[:, mc[ch]] += np.where(inside, vals[:, ch] * go[:, ch], 0.0)
            contrib = np.where(inside, masks[:, mc[ch]] * go[:, ch], 0.0)
            for oy in range(h * s):
                iy = oy // s + ky - rad
                for ox in range(w * s):
                    ix = ox // s + kx - rad
                    if 0 <= iy < h and 0 <= ix < w:
                        grad_f[:, ch, iy, ix] += contrib[:, oy, ox]
    return grad_f.astype(features.dtype), grad_m.astype(masks.dtype)


def inputs(n=2, c=4, h=5, w=6, k=3, g=1, s=2, dtype="float32", seed=0):
    return (r([n, c, h, w], dtype, seed), r([n, g * k * k, h * s, w * s], dtype, seed + 1, -1.0, 1.0))


def attrs(k=3, g=1, s=2):
    return {"kernel_size": k, "group_size": g, "scale_factor": s}


def sample(name, dynamic=None, no_gradcheck=None, **cfg):
    shape = {key: cfg.pop(key) for key in ("n", "c", "h", "w", "dtype", "seed") if key in cfg}
    return Sample(inputs(**shape, **cfg), attrs(**cfg), name=name, dynamic=dynamic, no_gradcheck=no_gradcheck)


def dyadic_float16():
    # Multiples of 1/8 and 1/4: every product and sum is exact in float32 and the result exact in
    # float16, so the reference's rounding and the kernel's agree to the bit.
    f, m = inputs(c=4, h=3, w=4, k=3, g=2, s=2, seed=9)
    f, m = (torch.round(f * 8) / 8).half(), (torch.round(m * 4) / 4).half()
    return Sample((f, m), attrs(3, 2, 2), name="float16_exact")


def resize(smp: Sample, n: int) -> Sample:
    f, m = smp.inputs
    a = smp.attrs
    return Sample(inputs(n, f.shape[1], f.shape[2], f.shape[3], a["kernel_size"], a["group_size"],
                         a["scale_factor"], seed=n), a)


SAMPLES = [
    sample("k3_g2_s2", dynamic={0: [0], 1: [0]}, g=2),
    sample("k1_g1_s1", k=1, s=1),
    sample("k1_g4_s3", k=1, g=4, s=3),
    # One batch item: the gradcheck perturbs each input element (100 mask channels of 12 x 9 here)
    # and its cost grows with the square of the batch; the batch loop has the other samples.
    sample("k5_g4_s3_window_past_every_border", n=1, c=8, h=4, w=3, k=5, g=4, s=3),
    sample("k5_g1_s2_two_by_two", h=2, w=2, k=5),
    sample("k3_g1_s3", c=3, h=3, w=4, s=3),
    sample("one_pixel", n=1, h=1, w=1, k=3, s=2),
    sample("float64", dtype="float64", c=6, k=5, g=2, s=2, h=4, w=5),
    dyadic_float16(),
    sample("empty_batch", n=0),
]


def bad(name, match, edit=None, cfg=None, **a):
    ts = list(inputs(**(cfg or {})))
    if edit:
        edit(ts)
    return BadInput(tuple(ts), attrs(**a), re.escape(match), name)


def _masks(shape):
    def edit(ts):
        ts[1] = r(shape)
    return edit


BAD = [
    bad("kernel_even", "kernel_size must be odd", cfg={"k": 2}, k=2),
    bad("kernel_zero", "kernel_size must be >= 1", edit=_masks([2, 0, 10, 12]), k=0),
    bad("channels_not_divisible", "features' channels must be divisible by group_size", cfg={"g": 3}, g=3),
    bad("group_zero", "group_size must be >= 1", edit=_masks([2, 0, 10, 12]), g=0),
    bad("scale_zero", "scale_factor must be >= 1", s=0),
    bad("mask_channels", "masks must have group_size * kernel_size * kernel_size channels", edit=_masks([2, 8, 10, 12])),
    bad("mask_height", "masks' height must be features' height * scale_factor", edit=_masks([2, 9, 11, 12])),
    bad("mask_width", "masks' width must be features' width * scale_factor", edit=_masks([2, 9, 10, 6])),
    bad("mask_batch", "masks must have the batch size of features", edit=_masks([1, 9, 10, 12])),
    bad("mixed_dtypes", "inputs 'features' (float32) and 'masks' (float64)",
        edit=lambda ts: ts.__setitem__(1, ts[1].double())),
    bad("wrong_rank", "input 'masks' must have rank 4", edit=lambda ts: ts.__setitem__(1, ts[1][0])),
    bad("integer_features", "input 'features' has dtype int64", edit=lambda ts: ts.__setitem__(0, ts[0].long())),
]


class TestCarafe(OpTest):
    case = OpCase("carafe", reference=reference, samples=SAMPLES, bad_inputs=BAD, rtol=1e-5, atol=1e-5, resize=resize)


# ---- beyond the standard suite ---------------------------------------------------------------

@pytest.mark.parametrize("k,g,s", [(1, 1, 1), (3, 2, 2), (5, 4, 3), (5, 1, 2), (3, 1, 3)])
def test_backward_matches_the_chain_rule(k, g, s):
    f, m = inputs(n=2, c=4, h=3, w=4, k=k, g=g, s=s, dtype="float64", seed=k + g + s)
    go = r([2, 4, 3 * s, 4 * s], "float64", seed=40)
    got = BACKWARD(go, f, m, k, g, s)
    want = reference_backward(go.numpy(), f.numpy(), m.numpy(), k, g, s)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-12, atol=1e-12)


def test_weights_outside_the_image_take_no_part():
    # mmcv skips window positions outside the image: a NaN weight there changes nothing.
    f, m = inputs(n=1, c=2, h=3, w=3, k=3, s=1)
    m[:, 0, 0, :] = float("nan")  # window row 0, column 0 of the top output row: above the image
    m[:, 0, :, 0] = float("nan")  # ... and of the left column: left of it
    got = OP(f, m, 3, 1, 1)
    assert torch.isfinite(got).all()
    m[:, 0, 0, :] = 0
    m[:, 0, :, 0] = 0
    torch.testing.assert_close(got, OP(f, m, 3, 1, 1), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_floats_compute_in_float32_and_round_once(dtype):
    f, m = (t.to(dtype) for t in inputs(k=5, g=2, s=2))
    # The float32 reference's order of sums is not the kernel's: one rounding apart at most.
    want = reference(f.float().numpy(), m.float().numpy(), 5, 2, 2)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(OP(f, m, 5, 2, 2), torch.from_numpy(want).to(dtype), rtol=eps, atol=1e-5)
    go = r([2, 4, 10, 12], seed=3).to(dtype)
    for got, want in zip(BACKWARD(go, f, m, 5, 2, 2), reference_backward(go.float().numpy(), f.float().numpy(),
                                                                     m.float().numpy(), 5, 2, 2)):
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), torch.from_numpy(want), rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("attrs_, match", [
    ({"kernel_size": 2, "group_size": 1, "scale_factor": 2}, "kernel_size must be odd"),
    ({"kernel_size": 3, "group_size": 3, "scale_factor": 2}, "features' channels must be divisible by group_size"),
    ({"kernel_size": 3, "group_size": 1, "scale_factor": 3}, "masks' height must be features' height * scale_factor"),
])
def test_onnxruntime_fails_with_the_reason(attrs_, match):
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument, RuntimeException

    info = next(op for op in opbridge.all_ops() if op.name == "carafe")
    f, m = inputs(k=attrs_["kernel_size"], g=attrs_["group_size"], s=2)
    model = node_model(info, [f.numpy(), m.numpy()], attrs_)
    sess = opbridge.session(model)
    with pytest.raises((Fail, InvalidArgument, RuntimeException), match=r"opbridge::carafe.*" + re.escape(match)):
        sess.run(None, {"features": f.numpy(), "masks": m.numpy()})
    # The process survived: a well-formed node still runs and is right.
    f, m = inputs()
    good = node_model(info, [f.numpy(), m.numpy()], attrs())
    out = opbridge.session(good).run(None, {"features": f.numpy(), "masks": m.numpy()})[0]
    np.testing.assert_allclose(out, reference(f.numpy(), m.numpy(), **attrs()), rtol=1e-5, atol=1e-5)


# ---- mmcv._ext, called as mmcv/ops/carafe.py calls it -----------------------------------------

def _mmcv_carafe(features, masks, k, g, s, grad_output):
    """CARAFEFunction's forward and backward, their _ext calls as mmcv writes them."""
    n, c, h, w = features.size()
    output = features.new_zeros((n, c, h * s, w * s))
    routput = features.new_zeros(output.size(), requires_grad=False)
    rfeatures = features.new_zeros(features.size(), requires_grad=False)
    rmasks = masks.new_zeros(masks.size(), requires_grad=False)
    ext.carafe_forward(features, masks, rfeatures, routput, rmasks, output, kernel_size=k, group_size=g,
                       scale_factor=s)
    rgrad_output = torch.zeros_like(grad_output, requires_grad=False)
    rgrad_input_hs = torch.zeros_like(grad_output, requires_grad=False)
    rgrad_input = torch.zeros_like(features, requires_grad=False)
    rgrad_masks = torch.zeros_like(masks, requires_grad=False)
    grad_input = torch.zeros_like(features, requires_grad=False)
    grad_masks = torch.zeros_like(masks, requires_grad=False)
    ext.carafe_backward(grad_output.contiguous(), rfeatures, masks, rgrad_output, rgrad_input_hs, rgrad_input,
                        rgrad_masks, grad_input, grad_masks, kernel_size=k, group_size=g, scale_factor=s)
    return output, grad_input, grad_masks, dict(rfeatures=rfeatures, routput=routput, rmasks=rmasks,
                                                rgrad_output=rgrad_output, rgrad_input=rgrad_input,
                                                rgrad_masks=rgrad_masks, rgrad_input_hs=rgrad_input_hs)


def _mmcv_carafe_naive(features, masks, k, g, s, grad_output):
    """CARAFENaiveFunction's forward and backward, their _ext calls as mmcv writes them."""
    n, c, h, w = features.size()
    output = features.new_zeros((n, c, h * s, w * s))
    ext.carafe_naive_forward(features, masks, output, kernel_size=k, group_size=g, scale_factor=s)
    grad_input = torch.zeros_like(features)
    grad_masks = torch.zeros_like(masks)
    ext.carafe_naive_backward(grad_output.contiguous(), features, masks, grad_input, grad_masks, kernel_size=k,
                              group_size=g, scale_factor=s)
    return output, grad_input, grad_masks


def nhwc(t):
    return t.permute(0, 2, 3, 1)


@pytest.mark.parametrize("k,g,s", [(3, 2, 2), (5, 1, 2), (1, 4, 3)])
def test_ext_functions_as_mmcv_calls_them(k, g, s):
    f, m = inputs(n=2, c=4, h=3, w=4, k=k, g=g, s=s, dtype="float64", seed=k * s)
    go = r([2, 4, 3 * s, 4 * s], "float64", seed=50)
    want_out = reference(f.numpy(), m.numpy(), k, g, s)
    want_gf, want_gm = reference_backward(go.numpy(), f.numpy(), m.numpy(), k, g, s)
    out, gf, gm, buffers = _mmcv_carafe(f, m, k, g, s, go)
    for got, want in ((out, want_out), (gf, want_gf), (gm, want_gm)):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
    # The channels-last buffers, as mmcv's extension resizes and fills them.
    for name, want in (("rfeatures", nhwc(f)), ("routput", nhwc(out)), ("rmasks", nhwc(m)),
                       ("rgrad_output", nhwc(go)), ("rgrad_input", nhwc(gf)), ("rgrad_masks", nhwc(gm))):
        assert buffers[name].shape == want.shape, name
        torch.testing.assert_close(buffers[name], want, rtol=0, atol=0, msg=name)
    assert buffers["rgrad_input_hs"].shape == nhwc(go).shape
    naive = _mmcv_carafe_naive(f, m, k, g, s, go)
    for got, want in zip(naive, (want_out, want_gf, want_gm)):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


def test_ext_naive_backward_adds_as_mmcv_kernel_does():
    f, m = inputs(k=3, g=1, s=2, dtype="float64")
    go = r([2, 4, 10, 12], "float64", seed=51)
    grad_input, grad_masks = torch.ones_like(f), torch.ones_like(m)
    ext.carafe_naive_backward(go, f, m, grad_input, grad_masks, kernel_size=3, group_size=1, scale_factor=2)
    want_gf, want_gm = reference_backward(go.numpy(), f.numpy(), m.numpy(), 3, 1, 2)
    np.testing.assert_allclose(grad_input.numpy(), want_gf + 1, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grad_masks.numpy(), want_gm + 1, rtol=1e-12, atol=1e-12)


def test_ext_errors_name_the_op_and_the_buffer():
    f, m = inputs(k=3, g=1, s=2)
    with pytest.raises(RuntimeError, match=r"opbridge::carafe: .*kernel_size must be odd"):
        ext.carafe_naive_forward(f, m, f.new_zeros(2, 4, 10, 12), kernel_size=2, group_size=1, scale_factor=2)
    with pytest.raises(RuntimeError, match=re.escape("mmcv._ext.carafe_forward: output must have shape (2, 4, 10, 12)")):
        ext.carafe_forward(f, m, torch.zeros_like(f), f.new_zeros(2, 4, 10, 12), torch.zeros_like(m),
                           f.new_zeros(2, 4, 10, 11), kernel_size=3, group_size=1, scale_factor=2)


# ---- substitution of mmcv's Functions --------------------------------------------------------

@pytest.fixture
def mmcv_standin(monkeypatch):
    """mmcv.ops.carafe shaped as mmcv's: CARAFEFunction and CARAFENaiveFunction with forward(ctx,
    features, masks, kernel_size, group_size, scale_factor) over an extension not installed here,
    and CARAFEPack's encoder, normaliser and reassembly (mmcv's forward, transcribed)."""
    for name in ["mmcv", "mmcv.ops", "mmcv.ops.carafe"]:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    module = sys.modules["mmcv.ops.carafe"]
    exec(compile('''
import torch
import torch.nn.functional as F
from torch.autograd import Function

class CARAFEFunction(Function):
    @staticmethod
    def forward(ctx, features, masks, kernel_size, group_size, scale_factor):
        raise ImportError("mmcv._ext is not installed")

class CARAFENaiveFunction(Function):
    @staticmethod
    def forward(ctx, features, masks, kernel_size, group_size, scale_factor):
        raise ImportError("mmcv._ext is not installed")

carafe = CARAFEFunction.apply
carafe_naive = CARAFENaiveFunction.apply

class CARAFEPack(torch.nn.Module):
    def __init__(self, channels, scale_factor, up_kernel=5, up_group=1, naive=False):
        super().__init__()
        self.scale_factor, self.up_kernel, self.up_group, self.naive = scale_factor, up_kernel, up_group, naive
        self.channel_compressor = torch.nn.Conv2d(channels, 16, 1)
        self.content_encoder = torch.nn.Conv2d(16, up_kernel * up_kernel * up_group * scale_factor * scale_factor,
                                               3, padding=1)

    def forward(self, x):
        mask = self.content_encoder(self.channel_compressor(x))
        mask = F.pixel_shuffle(mask, self.scale_factor)
        n, mask_c, h, w = mask.size()
        mask_channel = int(mask_c / float(self.up_kernel**2))
        mask = F.softmax(mask.view(n, mask_channel, -1, h, w), dim=2, dtype=mask.dtype)
        mask = mask.view(n, mask_c, h, w).contiguous()
        fn = carafe_naive if self.naive else carafe
        return fn(x, mask, self.up_kernel, self.up_group, self.scale_factor)
''', "<mmcv.ops.carafe>", "exec"), module.__dict__)
    return module


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("naive", [False, True])
def test_carafe_pack_exports_through_the_mmcv_rules(mmcv_standin, exporter, naive):
    torch.manual_seed(0)
    model = mmcv_standin.CARAFEPack(8, 2, up_kernel=5, up_group=2, naive=naive).eval()
    x = r([1, 8, 6, 7], seed=60)
    with opbridge.substitutions(model), torch.no_grad():
        eager = model(x)
        mask = model.content_encoder(model.channel_compressor(x))
    proto = opbridge.export(model, (x,), exporter=exporter)
    assert [n.op_type for n in proto.graph.node if n.domain == "opbridge"] == ["Carafe"]
    got = opbridge.session(proto).run(None, {proto.graph.input[0].name: x.numpy()})[0]
    np.testing.assert_allclose(got, eager.numpy(), rtol=1e-5, atol=1e-6)
    # The eager substitution computes CARAFE on mmcv's normalised masks.
    mask = torch.nn.functional.pixel_shuffle(mask, 2).view(1, 2, 25, 12, 14).softmax(2).view(1, 50, 12, 14)
    np.testing.assert_allclose(eager.numpy(), reference(x.numpy(), mask.numpy(), 5, 2, 2), rtol=1e-5, atol=1e-6)


# ---- the real mmcv-lite on mmcv._ext -----------------------------------------------------------

MMCV_SCRIPT = textwrap.dedent('''
    import sys
    import numpy as np, torch
    import opbridge, opbridge.compat
    opbridge.compat.install("mmcv")
    from mmcv.ops import CARAFE, CARAFENaive, CARAFEPack
    d = np.load(sys.argv[1])
    f, m = (torch.tensor(d[k], requires_grad=True) for k in ("f", "m"))
    y = CARAFE(5, 2, 2)(f, m)
    out = {"carafe": y.detach().numpy(), "naive": CARAFENaive(5, 2, 2)(f, m).detach().numpy()}
    out["grad_f"], out["grad_m"] = (g.numpy() for g in torch.autograd.grad(y, (f, m), torch.tensor(d["g"])))
    pack, x = CARAFEPack(16, 2).eval(), torch.tensor(d["x"])
    with torch.no_grad():
        out["pack"] = pack(x).numpy()
    for exporter in ("dynamo", "torchscript"):
        proto = opbridge.export(pack, (x,), exporter=exporter)
        out["nodes_" + exporter] = np.array([n.op_type for n in proto.graph.node if n.domain == "opbridge"])
        out["ort_" + exporter] = opbridge.session(proto).run(None, {proto.graph.input[0].name: x.numpy()})[0]
    np.savez(sys.argv[2], **out)
''')


@pytest.mark.environments
def test_real_mmcv_carafe_runs_on_opbridge(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))
    import envs
    from test_mmdet import MMDET

    python = envs.python_with("mmdet-3.3.0", MMDET, on_top=True)
    f, m = inputs(n=2, c=4, h=3, w=5, k=5, g=2, s=2, dtype="float64", seed=70)
    g, x = r([2, 4, 6, 10], "float64", seed=71), r([1, 16, 8, 9], seed=72)
    np.savez(tmp_path / "in.npz", f=f.numpy(), m=m.numpy(), g=g.numpy(), x=x.numpy())
    run = subprocess.run([str(python), "-c", MMCV_SCRIPT, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = np.load(tmp_path / "out.npz")
    want = reference(f.numpy(), m.numpy(), 5, 2, 2)
    np.testing.assert_allclose(got["carafe"], want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got["naive"], want, rtol=1e-12, atol=1e-12)
    for name, w in zip(("grad_f", "grad_m"), reference_backward(g.numpy(), f.numpy(), m.numpy(), 5, 2, 2)):
        np.testing.assert_allclose(got[name], w, rtol=1e-12, atol=1e-12)
    for exporter in ("dynamo", "torchscript"):  # CARAFEPack through the substitution rules
        assert list(got["nodes_" + exporter]) == ["Carafe"]
        np.testing.assert_allclose(got["ort_" + exporter], got["pack"], rtol=1e-5, atol=1e-6)
