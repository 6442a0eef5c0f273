"""roi_align: opbridge's RoiAlign node against ONNX Runtime's own ai.onnx RoiAlign (opset 16), both
in ONNX Runtime, on the same data: a 4-level FPN of 256 channels for an 800 x 800 image
(1 x 256 x 200 x 200, 100 x 100, 50 x 50, 25 x 25, spatial scales 1/4 .. 1/32), 1 000 RoIs assigned
to levels as mmdet's mapper does (by sqrt(area): < 112, < 224, < 448, above), 7 x 7 bins,
average pooling, half-pixel corners (mmdet's aligned=True; RoiAlign's coordinate_transformation_mode
half_pixel), adaptive sampling (sampling_ratio 0, mmdet's default) and sampling_ratio 2; one node
per level, as mmdet runs them. RoiAlign gets its (K, 4) boxes and int64 batch indices; both give
the same values (checked before timing). Same intra-op threads for both, thread spinning off,
interleaved rounds; the ratios are medians of per-round ratios.

    .venv/bin/python bench/bench_roi_align.py [--quick]
"""

from __future__ import annotations

import sys

import numpy as np

from common import Row, interleaved, ort_session, progress

SUBJECT = "opbridge RoiAlign (ONNX Runtime)"
LEVELS = [(200, 1 / 4), (100, 1 / 8), (50, 1 / 16), (25, 1 / 32)]


def rois_per_level(n: int, seed: int) -> list[np.ndarray]:
    """n boxes in an 800 x 800 image (sides 16 to 600), grouped by mmdet's level rule."""
    rng = np.random.default_rng(seed)
    wh = np.exp(rng.uniform(np.log(16), np.log(600), (n, 2)))
    xy = rng.uniform(0, 800, (n, 2)) - wh / 2
    boxes = np.concatenate([np.zeros((n, 1)), xy, xy + wh], 1).astype(np.float32)
    scale = np.sqrt(wh[:, 0] * wh[:, 1])
    level = np.clip(np.floor(np.log2(scale / 56 + 1e-6)), 0, 3).astype(int)
    return [boxes[level == i] for i in range(4)]


def model(own: bool, rois: list[np.ndarray], channels: int, sampling_ratio: int):
    from onnx import TensorProto, helper

    inputs, nodes, outputs = [], [], []
    for i, ((size, scale), r) in enumerate(zip(LEVELS, rois)):
        inputs.append(helper.make_tensor_value_info(f"f{i}", TensorProto.FLOAT, [1, channels, size, size]))
        out = helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [len(r), channels, 7, 7])
        outputs.append(out)
        if own:
            inputs.append(helper.make_tensor_value_info(f"r{i}", TensorProto.FLOAT, [len(r), 5]))
            nodes.append(helper.make_node("RoiAlign", [f"f{i}", f"r{i}"], [f"y{i}"], domain="opbridge",
                                          output_size=[7, 7], spatial_scale=scale, sampling_ratio=sampling_ratio,
                                          pool_mode="avg", aligned=1))
        else:
            inputs.append(helper.make_tensor_value_info(f"r{i}", TensorProto.FLOAT, [len(r), 4]))
            inputs.append(helper.make_tensor_value_info(f"b{i}", TensorProto.INT64, [len(r)]))
            nodes.append(helper.make_node("RoiAlign", [f"f{i}", f"r{i}", f"b{i}"], [f"y{i}"], mode="avg",
                                          output_height=7, output_width=7, spatial_scale=scale,
                                          sampling_ratio=sampling_ratio, coordinate_transformation_mode="half_pixel"))
    graph = helper.make_graph(nodes, "fpn_roi_align", inputs, outputs)
    opsets = [helper.make_opsetid("", 16)] + ([helper.make_opsetid("opbridge", 1)] if own else [])
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)


def run(quick: bool) -> list[Row]:
    import os

    channels = 64 if quick else 256
    rounds = 5 if quick else 21
    threads = os.cpu_count()
    rng = np.random.default_rng(0)
    feats = [rng.standard_normal((1, channels, s, s)).astype(np.float32) for s, _ in LEVELS]
    rois = rois_per_level(1000, 1)
    rows: list[Row] = []
    for sampling_ratio in (0, 2):
        s_own = ort_session(model(True, rois, channels, sampling_ratio), threads=threads, spinning=False)
        s_std = ort_session(model(False, rois, channels, sampling_ratio), threads=threads, with_opbridge=False,
                            spinning=False)
        f_own = {**{f"f{i}": f for i, f in enumerate(feats)}, **{f"r{i}": r for i, r in enumerate(rois)}}
        f_std = {**{f"f{i}": f for i, f in enumerate(feats)}, **{f"r{i}": r[:, 1:] for i, r in enumerate(rois)},
                 **{f"b{i}": r[:, 0].astype(np.int64) for i, r in enumerate(rois)}}
        for a, b in zip(s_own.run(None, f_own), s_std.run(None, f_std)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
        name = (f"roi_align 1000 RoIs {'/'.join(str(len(r)) for r in rois)} over 4 FPN levels, {channels} ch, 7x7, "
                f"sampling_ratio {sampling_ratio}, {threads} threads")
        progress(name)
        rows += interleaved(name, {
            SUBJECT: lambda s=s_own, f=f_own: s.run(None, f),
            "ONNX Runtime RoiAlign (opset 16)": lambda s=s_std, f=f_std: s.run(None, f),
        }, rounds=rounds)
    return rows


if __name__ == "__main__":
    for row in run("--quick" in sys.argv):
        spread = row.ratio_spread
        ratio = "" if spread is None else f"  ratio {spread[0]:.2f} (IQR {spread[1]:.2f}-{spread[2]:.2f})"
        print(f"{row.benchmark} | {row.impl}: median {row.median_ms:.1f} ms{ratio}")
