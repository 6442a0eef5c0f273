"""multi_scale_deformable_attention: Deformable DETR's encoder attention at an 800x1200 input
(levels 100x150, 50x75, 25x38, 13x19: S = Q = 19 947) and at 512x512 (64x64 .. 8x8: S = Q = 5 440),
8 heads, 4 levels, 4 points, 32 channels per head, float32, batch 1, on 1 and 2 threads.

Rows, the attention alone (value, locations and weights given):
    forward in ONNX Runtime: the opbridge node (the subject; thread spinning off) against the
        pure-PyTorch path (a grid_sample per level, a stack and a weighted sum, as Deformable DETR's
        and mmcv's Python fallback writes it) exported with the same exporter: GridSample, Concat,
        Mul, ReduceSum;
    forward in eager: torch.ops.opbridge against the pure-PyTorch path;
    forward + backward in eager: the op's backward against autograd through the pure-PyTorch path.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from common import Row, input_gradients, interleaved, on_torch_threads, ort_session, progress

SUBJECT = "opbridge node (ONNX Runtime)"
LEVELS = {"800x1200": [(100, 150), (50, 75), (25, 38), (13, 19)], "512x512": [(64, 64), (32, 32), (16, 16), (8, 8)]}


def grid_sample_path(value, spatial_shapes, sampling_locations, attention_weights):
    """Deformable DETR's pure-PyTorch multi-scale deformable attention (the levels' sizes fixed)."""
    b, _, h, d = value.shape
    _, q, _, levels, points, _ = sampling_locations.shape
    per_level = value.split([hh * ww for hh, ww in spatial_shapes], dim=1)
    grids = 2 * sampling_locations - 1
    sampled = []
    for lv, (hh, ww) in enumerate(spatial_shapes):
        v = per_level[lv].flatten(2).transpose(1, 2).reshape(b * h, d, hh, ww)
        g = grids[:, :, :, lv].transpose(1, 2).flatten(0, 1)
        sampled.append(F.grid_sample(v, g, mode="bilinear", padding_mode="zeros", align_corners=False))
    w = attention_weights.transpose(1, 2).reshape(b * h, 1, q, levels * points)
    out = (torch.stack(sampled, dim=-2).flatten(-2) * w).sum(-1).view(b, h * d, q)
    return out.transpose(1, 2).contiguous()


class _Fused(torch.nn.Module):
    def __init__(self, levels):
        super().__init__()
        shapes = torch.tensor(levels)
        areas = shapes[:, 0] * shapes[:, 1]
        self.register_buffer("shapes", shapes)
        self.register_buffer("starts", torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]]))

    def forward(self, value, locations, weights):
        return torch.ops.opbridge.multi_scale_deformable_attention(value, self.shapes, self.starts, locations, weights)


class _GridSample(torch.nn.Module):
    def __init__(self, levels):
        super().__init__()
        self.levels = levels

    def forward(self, value, locations, weights):
        return grid_sample_path(value, self.levels, locations, weights)


def _inputs(levels, heads=8, channels=32, points=4):
    """The encoder's inputs: its queries are the positions of every level in order, each sampling
    every level around its own reference point (the centre of its pixel, normalised) with offsets
    of about two pixels of the level sampled, as Deformable DETR's learned offsets are."""
    s = sum(h * w for h, w in levels)
    rng = np.random.default_rng(0)
    value = torch.from_numpy(rng.standard_normal((1, s, heads, channels), dtype=np.float32))
    refs = np.concatenate([np.stack(np.meshgrid((np.arange(w) + 0.5) / w, (np.arange(h) + 0.5) / h), -1).reshape(-1, 2)
                           for h, w in levels])  # (S, 2) as (x, y)
    sizes = np.array([(w, h) for h, w in levels], np.float64)  # (L, 2) as (x, y)
    offsets = rng.normal(0, 2.0, (1, s, heads, len(levels), points, 2)) / sizes[None, None, None, :, None, :]
    locations = torch.from_numpy((refs[None, :, None, None, None, :] + offsets).astype(np.float32))
    weights = torch.softmax(torch.from_numpy(rng.standard_normal((1, s, heads, len(levels) * points),
                                                                 dtype=np.float32)), -1)
    return value, locations, weights.reshape(1, s, heads, len(levels), points)


def _case(label: str, levels, threads: int, quick: bool) -> list[Row]:
    import opbridge

    args = _inputs(levels)
    names = ["value", "sampling_locations", "attention_weights"]
    feeds = {n: a.numpy() for n, a in zip(names, args)}
    fused, path = _Fused(levels).eval(), _GridSample(levels).eval()
    want = path(*args)
    fused_sess = ort_session(opbridge.export(fused, args, input_names=names), threads=threads, spinning=False)
    path_sess = ort_session(opbridge.export(path, args, input_names=names), threads=threads, spinning=False)
    for sess in (fused_sess, path_sess):
        np.testing.assert_allclose(sess.run(None, feeds)[0], want.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fused(*args).numpy(), want.numpy(), rtol=1e-4, atol=1e-5)
    rounds = 3 if quick else 8
    tail = f"S=Q={args[0].shape[1]} H=8 L=4 P=4 D=32 float32, {threads} thread{'s' if threads > 1 else ''}"
    rows = []

    name = f"MSDA forward in ONNX Runtime {label} {tail}"
    impls = {SUBJECT: lambda: fused_sess.run(None, feeds),
             "grid_sample path exported (GridSample, Concat, Mul, ReduceSum)": lambda: path_sess.run(None, feeds)}
    progress(name)
    rows += interleaved(name, impls, rounds=rounds, warmup=1, max_seconds=120)

    name = f"MSDA forward eager {label} {tail}"
    with torch.no_grad():
        impls = {"opbridge eager (torch.ops)": on_torch_threads(threads, lambda: fused(*args)),
                 "grid_sample path eager": on_torch_threads(threads, lambda: path(*args))}
        progress(name)
        rows += interleaved(name, impls, rounds=rounds, warmup=1, max_seconds=120)

    grad = torch.randn_like(want)

    def backward(model):
        return input_gradients(model, args, grad)

    name = f"MSDA forward + backward eager {label} {tail}"
    got, ref = backward(fused), backward(path)
    for what, g, r in zip(("value", "sampling_locations", "attention_weights"), got, ref):
        # A location's gradient jumps at a whole pixel, and the two paths round a location's pixel
        # coordinate differently (x * w - 0.5 here, ((2x - 1 + 1) * w - 1) / 2 in grid_sample): the
        # few within a rounding of a pixel take the other side's derivative (3 of 5 million here).
        close = torch.isclose(g, r, rtol=1e-3, atol=1e-3).double().mean().item()
        assert close >= (1 - 1e-5 if what == "sampling_locations" else 1), f"grad of {what}: {close} agree"
    impls = {"opbridge forward + backward": on_torch_threads(threads, lambda: backward(fused)),
             "grid_sample path autograd": on_torch_threads(threads, lambda: backward(path))}
    progress(name)
    rows += interleaved(name, impls, rounds=rounds, warmup=1, max_seconds=180)
    return rows


def every_case(case, quick: bool) -> list[Row]:
    """case(label, levels, threads, quick) at both input sizes on 1 and 2 threads (quick: three
    levels of the small one, 1 thread); torch's thread count is restored afterwards."""
    threads = torch.get_num_threads()
    try:
        if quick:
            return case("512x512", LEVELS["512x512"][1:], 1, quick)
        rows = []
        for n in (1, 2):
            rows += case("512x512", LEVELS["512x512"], n, quick) + case("800x1200", LEVELS["800x1200"], n, quick)
        return rows
    finally:
        torch.set_num_threads(threads)


def run(quick: bool) -> list[Row]:
    return every_case(_case, quick)
