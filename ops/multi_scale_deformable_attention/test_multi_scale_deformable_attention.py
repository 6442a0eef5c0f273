"""multi_scale_deformable_attention against a numpy loop written from its definition (bilinear at
(x·W − 0.5, y·H − 0.5), zero outside each level), and against the pure-PyTorch path that Deformable
DETR's and mmcv's code falls back to (a grid_sample per level, align_corners=False), forward and
gradients; samples outside [0, 1], on the borders and at exact pixel centres (the location gradient
taking grid_sample's side where the rounding decides it); every specialised
channel count (16, 32, 64) and another; 16-bit floats; bad levels."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from opbridge.testing import BadInput, OpCase, OpTest, Sample, random_tensor as r

msda = torch.ops.opbridge.multi_scale_deformable_attention


def reference(value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
    c = np.float64 if value.dtype == np.float64 else np.float32
    v, loc, w = value.astype(c), sampling_locations.astype(c), attention_weights.astype(c)
    b_, s_, h_, d_ = v.shape
    _, q_, _, l_, p_, _ = loc.shape
    out = np.zeros((b_, q_, h_, d_), np.float64)
    for b in range(b_):
        for q in range(q_):
            for h in range(h_):
                for lv in range(l_):
                    hh, ww = int(spatial_shapes[lv, 0]), int(spatial_shapes[lv, 1])
                    start = int(level_start_index[lv])
                    for p in range(p_):
                        x = loc[b, q, h, lv, p, 0] * c(ww) - c(0.5)
                        y = loc[b, q, h, lv, p, 1] * c(hh) - c(0.5)
                        if not (x > -1 and y > -1 and x < ww and y < hh):
                            continue
                        x0, y0 = int(np.floor(x)), int(np.floor(y))
                        lx, ly = x - x0, y - y0
                        for yy, xx, cw in ((y0, x0, (1 - ly) * (1 - lx)), (y0, x0 + 1, (1 - ly) * lx),
                                           (y0 + 1, x0, ly * (1 - lx)), (y0 + 1, x0 + 1, ly * lx)):
                            if 0 <= yy < hh and 0 <= xx < ww:
                                out[b, q, h] += w[b, q, h, lv, p] * cw * v[b, start + yy * ww + xx, h]
    return out.reshape(b_, q_, h_ * d_).astype(value.dtype)


def torch_path(value, spatial_shapes, sampling_locations, attention_weights):
    """The pure-PyTorch multi-scale deformable attention, as Deformable DETR's code writes it."""
    b, _, h, d = value.shape
    _, q, _, levels, points, _ = sampling_locations.shape
    per_level = value.split([int(hh) * int(ww) for hh, ww in spatial_shapes], dim=1)
    grids = 2 * sampling_locations - 1
    sampled = []
    for lv, (hh, ww) in enumerate(spatial_shapes):
        v = per_level[lv].flatten(2).transpose(1, 2).reshape(b * h, d, int(hh), int(ww))
        g = grids[:, :, :, lv].transpose(1, 2).flatten(0, 1)
        sampled.append(F.grid_sample(v, g, mode="bilinear", padding_mode="zeros", align_corners=False))
    w = attention_weights.transpose(1, 2).reshape(b * h, 1, q, levels * points)
    out = (torch.stack(sampled, dim=-2).flatten(-2) * w).sum(-1).view(b, h * d, q)
    return out.transpose(1, 2).contiguous()


def pyramid(sizes, dtype=torch.int64):
    shapes = torch.tensor(sizes, dtype=dtype)
    areas = shapes[:, 0] * shapes[:, 1]
    return shapes, torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]]).to(dtype), int(areas.sum())


def inputs(sizes, batch=2, queries=7, heads=2, channels=4, points=3, dtype="float32", seed=0, low=-0.2, high=1.2,
           index_dtype=torch.int64):
    shapes, starts, s = pyramid(sizes, index_dtype)
    levels = len(sizes)
    return (r([batch, s, heads, channels], dtype, seed=seed), shapes, starts,
            r([batch, queries, heads, levels, points, 2], dtype, seed=seed + 1, low=low, high=high),
            r([batch, queries, heads, levels, points], dtype, seed=seed + 2, low=0, high=1))


def pixel_centres_and_borders():
    """Samples exactly at pixel centres, on the levels' borders (0 and 1), and half a pixel past them."""
    value, shapes, starts, _, weights = inputs([[4, 5], [2, 3]], batch=1, queries=6, heads=1, points=4, seed=30)
    loc = torch.zeros(1, 6, 1, 2, 4, 2)
    for lv, (hh, ww) in enumerate(shapes.tolist()):
        xs = torch.tensor([0.5 / ww, 1.5 / ww, 0.0, 1.0, 1.0 + 0.5 / ww, -0.5 / ww])
        ys = torch.tensor([0.5 / hh, (hh - 0.5) / hh, 0.0, 1.0, -0.5 / hh, 1.0 + 0.5 / hh])
        loc[0, :, 0, lv, :, 0] = xs[:, None]
        loc[0, :, 0, lv, :, 1] = ys.roll(1)[:, None]
    return value, shapes, starts, loc, weights


class TestMultiScaleDeformableAttention(OpTest):
    case = OpCase(
        "multi_scale_deformable_attention",
        reference=reference,
        samples=[
            Sample(inputs([[4, 5], [2, 3]]), name="float32", dynamic={3: [1], 4: [1]}),
            Sample(inputs([[3, 3], [2, 2], [1, 1]], dtype="float64", seed=3), name="float64"),
            Sample(inputs([[6, 4], [3, 2]], batch=1, queries=5, heads=2, channels=32, points=4, seed=6),
                   name="32_channels"),
            Sample(inputs([[5, 5], [3, 3]], batch=1, queries=4, heads=3, channels=16, seed=9), name="16_channels"),
            Sample(inputs([[4, 4]], batch=1, queries=3, heads=1, channels=64, points=2, seed=12), name="64_channels"),
            Sample(inputs([[5, 7], [2, 2]], batch=1, queries=4, heads=2, channels=5, seed=15,
                          index_dtype=torch.int32), name="int32_levels"),
            Sample(pixel_centres_and_borders(), name="pixel_centres_and_borders",
                   no_gradcheck="the bilinear sample has a kink at whole pixels"),
            Sample(inputs([[4, 5], [2, 3]], batch=2, queries=0), name="no_queries"),
            Sample(inputs([[4, 4], [2, 2]], dtype="float16", seed=18), name="float16"),
        ],
        bad_inputs=[
            BadInput((*inputs([[4, 5], [2, 3]])[:2], torch.tensor([0, 19]), *inputs([[4, 5], [2, 3]])[3:]), {},
                     r"level_start_index\[1\] = 19, but the levels before it hold 20 positions", "level_start"),
            BadInput((r([2, 30, 2, 4]), *inputs([[4, 5], [2, 3]])[1:]), {},
                     "the levels of spatial_shapes hold 26 positions; value has 30", "levels_do_not_tile_value"),
            BadInput((r([2, 10, 2, 4]), *inputs([[4, 5], [2, 3]])[1:]), {},
                     r"the levels of spatial_shapes hold more positions than value's 10 \(from level 0 on\)",
                     "levels_past_value"),
            BadInput((*inputs([[4, 5], [2, 3]])[:4], r([2, 7, 2, 2, 4])), {},
                     "attention_weights must be sampling_locations' shape without its last axis", "weights_shape"),
            BadInput((*inputs([[4, 5], [2, 3]])[:3], r([2, 7, 2, 1, 3, 2]), r([2, 7, 2, 1, 3])), {},
                     "sampling_locations must have one level per row of spatial_shapes", "levels"),
            BadInput((*inputs([[4, 5], [2, 3]])[:3], r([2, 7, 2, 2, 3, 3]), r([2, 7, 2, 2, 3])), {},
                     r"sampling_locations must end in \(x, y\) pairs", "location_pairs"),
        ],
        resize=lambda s, n: Sample(inputs([[4, 5], [2, 3]], queries=n + 2, seed=n)),
    )


@pytest.mark.parametrize("channels", [32, 7])
def test_equals_the_grid_sample_path_forward_and_backward(channels):
    value, shapes, starts, loc, weights = inputs([[9, 11], [5, 6], [3, 3], [1, 2]], batch=2, queries=40, heads=4,
                                                 channels=channels, points=4, seed=40)
    leaves = [t.clone().requires_grad_() for t in (value, loc, weights)]
    grad = r([2, 40, 4 * channels], seed=44)
    got = msda(leaves[0], shapes, starts, leaves[1], leaves[2])
    got_grads = torch.autograd.grad(got, leaves, grad)
    ref_leaves = [t.clone().requires_grad_() for t in (value, loc, weights)]
    want = torch_path(ref_leaves[0], shapes, ref_leaves[1], ref_leaves[2])
    want_grads = torch.autograd.grad(want, ref_leaves, grad)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for name, g, w in zip(("value", "sampling_locations", "attention_weights"), got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4, msg=lambda m: f"grad of {name}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_location_gradient_at_pixel_centres_takes_grid_samples_side(dtype):
    # Every pixel centre (i + 0.5) / W of levels whose widths and heights are not powers of two:
    # there x·W − 0.5 lands within an ulp of a whole pixel, and how it rounds decides floor(), so
    # the side the location gradient is taken from (the derivative jumps there). The gradient must
    # be autograd's through the grid_sample path; the forward stays the sampled value either way.
    sizes = [[3, 5], [7, 11], [13, 17], [9, 3], [25, 38]]
    shapes, starts, s = pyramid(sizes)
    queries = max(h * w for h, w in sizes)
    loc = torch.empty(1, queries, 1, len(sizes), 1, 2, dtype=torch.float64)
    for lv, (hh, ww) in enumerate(sizes):
        q = torch.arange(queries, dtype=torch.float64) % (hh * ww)
        loc[0, :, 0, lv, 0, 0] = (q % ww + 0.5) / ww
        loc[0, :, 0, lv, 0, 1] = (torch.div(q, ww, rounding_mode="floor") + 0.5) / hh
    loc = loc.to(dtype)
    value = r([1, s, 1, 3], "float64", seed=60).to(dtype)
    weights = r([1, queries, 1, len(sizes), 1], "float64", seed=61, low=0.5, high=1).to(dtype)
    grad = r([1, queries, 3], "float64", seed=62).to(dtype)
    got_leaves = [t.clone().requires_grad_() for t in (value, loc, weights)]
    got = msda(got_leaves[0], shapes, starts, got_leaves[1], got_leaves[2])
    got_grads = torch.autograd.grad(got, got_leaves, grad)
    ref_leaves = [t.clone().requires_grad_() for t in (value, loc, weights)]
    want = torch_path(ref_leaves[0], shapes.tolist(), ref_leaves[1], ref_leaves[2])
    want_grads = torch.autograd.grad(want, ref_leaves, grad)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got, want, **tol)
    for name, g, w in zip(("value", "sampling_locations", "attention_weights"), got_grads, want_grads):
        torch.testing.assert_close(g, w, **tol, msg=lambda m: f"grad of {name}: {m}")


def test_results_do_not_depend_on_the_thread_count():
    args = inputs([[16, 16], [8, 8]], batch=2, queries=300, heads=4, channels=32, points=4, seed=50)
    grad = r([2, 300, 128], seed=51)
    leaves = [args[0].requires_grad_(), args[3].requires_grad_(), args[4].requires_grad_()]
    threads = torch.get_num_threads()
    try:
        runs = []
        for n in (1, max(2, threads)):
            torch.set_num_threads(n)
            out = msda(*args)
            runs.append((out, *torch.autograd.grad(out, leaves, grad)))
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("channels", [32, 5])
def test_encoder_queries_taken_in_tiles_give_the_bits_of_index_order(channels):
    # Queries that are the levels' positions (Q == S) are taken in tiles of their level; the same
    # queries split in two calls (Q != S each) run in index order: every output row bit for bit.
    sizes = [[13, 70], [7, 35], [4, 18], [2, 9], [1, 1]]
    s = sum(h * w for h, w in sizes)
    value, shapes, starts, loc, weights = inputs(sizes, batch=2, queries=s, heads=3, channels=channels, points=2,
                                                 seed=60)
    cut = s // 3
    parts = [msda(value, shapes, starts, loc[:, a:b].contiguous(), weights[:, a:b].contiguous())
             for a, b in ((0, cut), (cut, s))]
    threads = torch.get_num_threads()
    try:
        for n in (1, max(2, threads)):  # the tiles split over threads too
            torch.set_num_threads(n)
            assert torch.equal(msda(value, shapes, starts, loc, weights), torch.cat(parts, 1))
    finally:
        torch.set_num_threads(threads)


def test_nan_locations_sample_nothing():
    value, shapes, starts, loc, weights = inputs([[4, 5], [2, 3]], batch=1, queries=2)
    loc[0, 1] = float("nan")
    out = msda(value, shapes, starts, loc, weights)
    assert torch.equal(out[0, 1], torch.zeros_like(out[0, 1]))
    torch.testing.assert_close(out[0, 0], torch.from_numpy(reference(*[t.numpy() for t in
                                                                       (value, shapes, starts, loc, weights)])[0, 0]))


@pytest.mark.parametrize("channels", [32, 5])
def test_samples_outside_every_level_ignore_their_weight_even_when_infinite_or_nan(channels):
    # A sample outside its level contributes nothing, whatever its weight: no NaN from 0 * inf in
    # the output, and zero location and weight gradients (the vector path and the lane-by-lane tail).
    value, shapes, starts, loc, weights = inputs([[4, 5], [2, 3]], batch=1, queries=3, heads=2, channels=channels,
                                                 points=20, seed=70)
    loc[0, 1, :, :, :, 0] = -0.5  # x·W − 0.5 ≤ −1 on every level
    loc[0, 1, :, :, 1::3, 1] = 1.5
    weights[0, 1, :, :, 0::2] = float("inf")
    weights[0, 1, :, :, 1::4] = float("nan")
    weights[0, 1, :, :, 3::4] = -float("inf")
    grad = r([1, 3, 2 * channels], seed=71)
    leaves = [t.clone().requires_grad_() for t in (value, loc, weights)]
    out = msda(leaves[0], shapes, starts, leaves[1], leaves[2])
    g_value, g_loc, g_weights = torch.autograd.grad(out, leaves, grad)
    assert torch.equal(out[0, 1], torch.zeros_like(out[0, 1]))
    assert torch.equal(g_loc[0, 1], torch.zeros_like(g_loc[0, 1]))
    assert torch.equal(g_weights[0, 1], torch.zeros_like(g_weights[0, 1]))
    # The other queries and the value gradient: the grid_sample path's with the outside query's
    # weights at 0 (there, 0 * inf would make NaN of the sampled zeros).
    finite = weights.clone()
    finite[0, 1] = 0
    ref_leaves = [t.clone().requires_grad_() for t in (value, loc, finite)]
    want = torch_path(ref_leaves[0], shapes.tolist(), ref_leaves[1], ref_leaves[2])
    w_value, w_loc, w_weights = torch.autograd.grad(want, ref_leaves, grad)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g_value, w_value, rtol=1e-4, atol=1e-4)
    for q in (0, 2):
        torch.testing.assert_close(g_loc[0, q], w_loc[0, q], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(g_weights[0, q], w_weights[0, q], rtol=1e-4, atol=1e-4)


def test_bfloat16_computes_in_float32_and_rounds_once():
    # numpy has no bfloat16: the reference runs on the same values in float32.
    args = inputs([[4, 4], [2, 2]], dtype="bfloat16", seed=21)
    got = msda(*args)
    assert got.dtype == torch.bfloat16
    want = reference(*[t.float().numpy() if t.is_floating_point() else t.numpy() for t in args])
    torch.testing.assert_close(got, torch.from_numpy(want).to(torch.bfloat16), rtol=0, atol=0)


@pytest.fixture
def mmcv_standin():
    """mmcv.ops.multi_scale_deform_attn shaped as mmcv's: MultiScaleDeformableAttnFunction.forward(ctx,
    value, value_spatial_shapes, value_level_start_index, sampling_locations, attention_weights,
    im2col_step) over an extension that is not installed here."""
    import sys
    import types

    names = ["mmcv", "mmcv.ops", "mmcv.ops.multi_scale_deform_attn"]
    for name in names:
        sys.modules[name] = types.ModuleType(name)
    module = sys.modules[names[-1]]
    exec(compile('''
import torch
from torch.autograd import Function

class MultiScaleDeformableAttnFunction(Function):
    @staticmethod
    def forward(ctx, value, value_spatial_shapes, value_level_start_index, sampling_locations, attention_weights,
                im2col_step):
        raise ImportError("mmcv._ext is not installed")
''', "<mmcv.ops.multi_scale_deform_attn>", "exec"), module.__dict__)
    yield module.MultiScaleDeformableAttnFunction
    for name in names:
        del sys.modules[name]


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_mmcv_function_is_substituted(mmcv_standin, exporter):
    import opbridge

    class Attention(torch.nn.Module):
        def forward(self, value, shapes, starts, locations, weights):
            return mmcv_standin.apply(value, shapes, starts, locations, weights, 64)

    args = inputs([(4, 5), (2, 3)])
    proto = opbridge.export(Attention(), args, exporter=exporter)
    assert [n.op_type for n in proto.graph.node if n.domain == "opbridge"] == ["MultiScaleDeformableAttention"]
    sess = opbridge.session(proto)
    got = sess.run(None, {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)})[0]
    want = torch_path(args[0], args[1].tolist(), args[3], args[4])
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
