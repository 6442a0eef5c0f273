"""OpenVINO, the second runtime: opbridge's nodes run by OpenVINO's CPU plugin through the op
library's extension (libopbridge_ov.so, added to an openvino.Core), against OpenVINO's own
operators and against ONNX Runtime. Every OpenVINO model is compiled for the CPU plugin in float32
(INFERENCE_PRECISION_HINT f32, as opbridge.session(runtime="openvino") does) and run through one
infer request that reads the feeds in place, so no row pays for a Python wrapper or a copy
that the other does not.

- deform_conv2d (v2: offsets, mask and bias), 64 -> 64 channels, 3x3, 64x64, padding 1 (the shape
  of bench_deform_conv2d): opbridge's DeformConv2d node in OpenVINO (the subject) against
  OpenVINO's own DeformableConvolution (opset 8) with the bias as an Add, OpenVINO's Convolution of
  the same shape (the floor: the GEMM without any sampling), and the opbridge node in ONNX Runtime.
  OpenVINO's offsets are laid out as torchvision's ((y, x) per kernel tap, tap-major within each
  offset group); its bilinear_interpolation_pad must be true to sample as torchvision does (with
  false, a point within one pixel outside the input reads zero instead of the edge's share).
- a real model: a Deformable DETR encoder layer (bench_deformable_detr_encoder's) exported with the
  opbridge node, in OpenVINO against ONNX Runtime.

One thread and every core (INFERENCE_NUM_THREADS, intra_op_num_threads), interleaved rounds. The
per-call overhead of an opbridge node in OpenVINO is in bench_call_overhead.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

import opbridge
from common import Row, interleaved, note_floor, one_node_model, ort_session, progress

SUBJECT = "opbridge DeformConv2d (OpenVINO, libopbridge_ov.so)"
NATIVE = "OpenVINO DeformableConvolution (opset 8) + bias Add"
FLOOR = "OpenVINO Convolution (floor, no sampling)"


def ov_runner(model: onnx.ModelProto | object, threads: int, **config) -> Callable[[dict], np.ndarray]:
    """A function of the feeds that runs `model` (an ONNX ModelProto, or an openvino.Model) in
    OpenVINO's CPU plugin in float32 on `threads` threads, opbridge's extension added, and returns
    the first output (a view that the next call overwrites). `config`: more CPU plugin properties."""
    import openvino as ov

    core = ov.Core()
    core.add_extension(str(opbridge.builtin.openvino_path))
    if isinstance(model, onnx.ModelProto):
        with tempfile.TemporaryDirectory() as tmp:  # OpenVINO's ONNX frontend reads files
            path = Path(tmp) / "model.onnx"
            path.write_bytes(model.SerializeToString())
            model = core.read_model(str(path))
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads,
                                                 **config})
    request = compiled.create_infer_request()

    def call(feeds):
        request.infer(feeds, share_inputs=True)  # no copy of the feeds, as ONNX Runtime reads them in place
        return request.get_output_tensor(0).data

    return call


def thread_label(threads: int) -> str:
    return "1 thread" if threads == 1 else f"all {threads} cores"


def _native(feeds: dict, og: int, pad: bool, conv: bool = False):
    """OpenVINO's own model of the same layer: DeformableConvolution (or, for the floor, a
    Convolution without the offsets and mask), then the bias added per channel."""
    import openvino as ov
    import openvino.opset8 as ops

    names = ["input", "weight", "bias"] + ([] if conv else ["offset", "mask"])
    p = {name: ops.parameter(feeds[name].shape, np.float32, name=name) for name in names}
    if conv:
        y = ops.convolution(p["input"], p["weight"], [1, 1], [1, 1], [1, 1], [1, 1])
    else:
        y = ops.deformable_convolution(p["input"], p["offset"], p["weight"], [1, 1], [1, 1], [1, 1], [1, 1],
                                       mask=p["mask"], deformable_group=og, bilinear_interpolation_pad=pad)
    y = ops.add(y, ops.reshape(p["bias"], ops.constant(np.array([1, -1, 1, 1], np.int64)), False))
    return ov.Model([y], [p[name] for name in names]), {name: feeds[name] for name in names}


def _deform_case(n: int, c: int, hw: int, k: int, og: int, threads: int, rounds: int) -> list[Row]:
    import torch

    name = (f"deform_conv2d in OpenVINO n={n} c={c}->{c} {hw}x{hw} k={k} pad=1 offset_groups={og} mask+bias, "
            f"{thread_label(threads)}")
    rng = np.random.default_rng(0)
    feeds = {"input": rng.standard_normal((n, c, hw, hw), dtype=np.float32),
             "weight": (rng.standard_normal((c, c, k, k), dtype=np.float32) * 0.1).astype(np.float32),
             "offset": rng.uniform(-2, 2, (n, 2 * og * k * k, hw, hw)).astype(np.float32),
             "bias": rng.standard_normal(c, dtype=np.float32),
             "mask": rng.uniform(0, 1, (n, og * k * k, hw, hw)).astype(np.float32)}
    want = torch.ops.opbridge.deform_conv2d(*(torch.from_numpy(feeds[key]) for key in
                                              ("input", "weight", "offset", "bias", "mask")),
                                            padding=[1, 1], offset_groups=og).numpy()
    model = one_node_model("DeformConv2d", feeds, {"y": (np.float32, want.shape)},
                           {"padding": [1, 1], "offset_groups": og}, domain="opbridge")
    ours = ov_runner(model, threads)
    native, native_feeds = _native(feeds, og, pad=True)
    theirs = ov_runner(native, threads)
    floor, floor_feeds = _native(feeds, og, pad=True, conv=True)
    conv = ov_runner(floor, threads)
    ort = ort_session(model, threads=threads, spinning=False)

    def diff(got) -> float:
        return float(np.abs(got - want).max())

    np.testing.assert_allclose(ours(feeds), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(theirs(native_feeds), want, rtol=1e-4, atol=1e-4)
    unpadded = diff(ov_runner(_native(feeds, og, pad=False)[0], threads)(native_feeds))
    notes = {SUBJECT: f"max |diff| to eager {diff(ours(feeds)):.1e}",
             NATIVE: f"bilinear_interpolation_pad=true, max |diff| to eager {diff(theirs(native_feeds)):.1e} "
                     f"(false: {unpadded:.1e})"}
    fns = {SUBJECT: lambda: ours(feeds), NATIVE: lambda: theirs(native_feeds), FLOOR: lambda: conv(floor_feeds),
           "opbridge DeformConv2d (ONNX Runtime)": lambda: ort.run(None, feeds)}
    progress(name)
    rows = interleaved(name, fns, rounds=rounds, notes=notes)
    note_floor(rows, FLOOR)
    return rows


def _encoder_case(levels, threads: int, rounds: int) -> list[Row]:
    import torch

    from bench_deformable_detr_encoder import EncoderLayer, encoder_inputs

    args = encoder_inputs(levels)
    names = ["hidden", "reference_points"]
    feeds = {key: a.numpy() for key, a in zip(names, args)}
    layer = EncoderLayer(levels, True).eval()
    with torch.no_grad():
        want = layer(*args).numpy()
    model = opbridge.export(layer, args, input_names=names)
    model = model if isinstance(model, onnx.ModelProto) else onnx.load_from_string(model)
    ours = ov_runner(model, threads)
    ort = ort_session(model, threads=threads, spinning=False)
    np.testing.assert_allclose(ours(feeds), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ort.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)
    name = (f"Deformable DETR encoder layer S=Q={args[0].shape[1]} d_model=256 H=8 L={len(levels)} P=4 FFN=1024 "
            f"float32, opbridge node, {thread_label(threads)}")
    progress(name)
    return interleaved(name, {"encoder layer in OpenVINO": lambda: ours(feeds),
                              "encoder layer in ONNX Runtime": lambda: ort.run(None, feeds)},
                       rounds=rounds, warmup=1, max_seconds=120)


def run(quick: bool) -> list[Row]:
    import torch

    from bench_multi_scale_deformable_attention import LEVELS

    c, hw, k = (16, 16, 3) if quick else (64, 64, 3)
    cases = [(1, 1)] if quick else [(1, 1), (1, 4), (4, 1)]
    every = [1] if quick else [1, os.cpu_count() or 1]
    torch_threads = torch.get_num_threads()
    rows: list[Row] = []
    try:
        for n, og in cases:
            for threads in every:
                rows += _deform_case(n, c, hw, k, og, threads, 3 if quick else 15)
        levels = LEVELS["512x512"][1:] if quick else LEVELS["512x512"]
        for threads in every:
            rows += _encoder_case(levels, threads, 3 if quick else 10)
    finally:
        torch.set_num_threads(torch_threads)
    return rows
