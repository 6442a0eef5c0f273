"""deform_conv2d (v2: offsets, mask and bias), float32: opbridge's custom node DeformConv2d in
ONNX Runtime (the subject), ONNX Runtime's own ai.onnx DeformConv (opset 19), a plain ai.onnx
Conv of the same shape in ONNX Runtime (the floor: the same GEMM without any sampling), torch's
conv2d of the same shape (oneDNN; a second floor), and opbridge in PyTorch eager
(torch.ops.opbridge.deform_conv2d, on torch's intra-op threads).

64 -> 64 channels, 3x3, 64x64, padding 1, offset_groups 1 and 4, N = 1 and 4, each on 1 and
2 threads (ONNX Runtime's intra_op_num_threads, torch.set_num_threads for eager); and the custom
node on float16 against float32. Timed in
interleaved rounds with ONNX Runtime's thread spinning off, so no implementation runs in the wake
of another's spinning workers.
"""

from __future__ import annotations

import statistics

import numpy as np

from common import Row, interleaved, note_floor, on_torch_threads, one_node_model, ort_session, progress

SUBJECT = "opbridge DeformConv2d (ONNX Runtime)"
NATIVE = "ONNX Runtime DeformConv (ai.onnx 19)"
FLOOR = "ONNX Runtime Conv (floor, no sampling)"
TORCH_FLOOR = "torch conv2d (a second floor, torch's threads)"


def _case(n: int, c: int, hw: int, k: int, og: int, threads: int, rounds: int) -> list[Row]:
    import torch

    name = f"deform_conv2d n={n} c={c}->{c} {hw}x{hw} k={k} pad=1 offset_groups={og} mask+bias, {threads} thread(s)"
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, hw, hw), dtype=np.float32)
    w = (rng.standard_normal((c, c, k, k), dtype=np.float32) * 0.1).astype(np.float32)
    b = rng.standard_normal(c, dtype=np.float32)
    off = rng.uniform(-2, 2, (n, 2 * og * k * k, hw, hw)).astype(np.float32)
    mask = rng.uniform(0, 1, (n, og * k * k, hw, hw)).astype(np.float32)
    out = {"y": (np.float32, (n, c, hw, hw))}
    pads = {"kernel_shape": [k, k], "pads": [1, 1, 1, 1]}

    feeds = {"input": x, "weight": w, "offset": off, "bias": b, "mask": mask}
    sess = ort_session(one_node_model("DeformConv2d", feeds, out, {"padding": [1, 1], "offset_groups": og},
                                      domain="opbridge"), threads=threads, spinning=False)
    want = sess.run(None, feeds)[0]
    fns = {SUBJECT: lambda: sess.run(None, feeds)}
    notes = {}

    nfeeds = {"X": x, "W": w, "offset": off, "B": b, "mask": mask}
    try:
        nsess = ort_session(one_node_model("DeformConv", nfeeds, out, {**pads, "offset_group": og}),
                            threads=threads, with_opbridge=False, spinning=False)
    except Exception as e:  # an ONNX Runtime without DeformConv
        progress(f"{name}: no ONNX Runtime DeformConv ({str(e).splitlines()[0]})")
    else:
        notes[NATIVE] = f"max |diff| {float(np.abs(nsess.run(None, nfeeds)[0] - want).max()):.1e}"
        fns[NATIVE] = lambda: nsess.run(None, nfeeds)

    cfeeds = {"X": x, "W": w, "B": b}
    csess = ort_session(one_node_model("Conv", cfeeds, out, pads), threads=threads, with_opbridge=False,
                        spinning=False)
    fns[FLOOR] = lambda: csess.run(None, cfeeds)

    tx, tw, tb = (torch.from_numpy(a) for a in (x, w, b))
    fns[TORCH_FLOOR] = on_torch_threads(threads, lambda: torch.nn.functional.conv2d(tx, tw, tb, padding=1))

    targs = [torch.from_numpy(a) for a in (x, w, off, b, mask)]
    eager_name = f"opbridge eager (torch.ops, {threads} torch thread(s))"
    fns[eager_name] = on_torch_threads(threads, lambda: torch.ops.opbridge.deform_conv2d(
        *targs, padding=[1, 1], offset_groups=og))
    notes[eager_name] = f"max |diff| {float(np.abs(fns[eager_name]().numpy() - want).max()):.1e}"

    progress(name)
    rows = interleaved(name, fns, rounds=rounds, notes=notes)
    note_floor(rows, FLOOR)
    # The subject's time over torch's convolution as well (oneDNN: the other floor a model meets).
    subject, torch_floor = (next(r for r in rows if r.impl == impl) for impl in (SUBJECT, TORCH_FLOOR))
    if subject.round_ratios and torch_floor.round_ratios:
        x = statistics.median(a / b for a, b in zip(subject.round_ratios, torch_floor.round_ratios))
        subject.note = ", ".join(s for s in (subject.note, f"{x:.2f}x torch conv2d") if s)
    return rows


def _half_case(n: int, c: int, hw: int, k: int, threads: int, rounds: int) -> list[Row]:
    """The same DeformConv2d node in ONNX Runtime on float32 (the subject) and float16 inputs. The
    16-bit path widens the inputs to float32, runs the float32 kernel and rounds the output: the
    ratio is the price of the conversions (ONNX Runtime's own DeformConv has no float16 kernel)."""
    name = f"deform_conv2d float16 vs float32 in ONNX Runtime, n={n} c={c}->{c} {hw}x{hw} k={k}, {threads} thread(s)"
    rng = np.random.default_rng(1)
    feeds32 = {"input": rng.standard_normal((n, c, hw, hw), dtype=np.float32),
               "weight": (rng.standard_normal((c, c, k, k), dtype=np.float32) * 0.1).astype(np.float32),
               "offset": rng.uniform(-2, 2, (n, 2 * k * k, hw, hw)).astype(np.float32),
               "bias": rng.standard_normal(c, dtype=np.float32),
               "mask": rng.uniform(0, 1, (n, k * k, hw, hw)).astype(np.float32)}
    fns, outs = {}, {}
    for dtype in (np.float32, np.float16):
        feeds = {key: v.astype(dtype) for key, v in feeds32.items()}
        sess = ort_session(one_node_model("DeformConv2d", feeds, {"y": (dtype, (n, c, hw, hw))}, {"padding": [1, 1]},
                                          domain="opbridge"), threads=threads, spinning=False)
        label = f"opbridge DeformConv2d (ONNX Runtime) {np.dtype(dtype).name}"
        outs[label] = sess.run(None, feeds)[0]
        fns[label] = lambda sess=sess, feeds=feeds: sess.run(None, feeds)
    first, second = outs.values()
    notes = {list(fns)[1]: f"max |float16 - float32| {float(np.abs(second.astype(np.float32) - first).max()):.1e}"}
    progress(name)
    return interleaved(name, fns, rounds=rounds, notes=notes)


def run(quick: bool) -> list[Row]:
    import torch

    import opbridge  # noqa: F401  (loads torch.ops.opbridge)

    # (n, offset_groups); quick mode keeps one case of each kind at a small size.
    c, hw, k = (16, 16, 3) if quick else (64, 64, 3)
    cases = [(1, 1), (2, 4)] if quick else [(1, 1), (1, 4), (4, 1), (4, 4)]
    rounds = 3 if quick else 20
    torch_threads = torch.get_num_threads()
    rows: list[Row] = []
    try:
        for n, og in cases:
            for threads in (1, 2):
                rows += _case(n, c, hw, k, og, threads, rounds)
        for threads in (1, 2):
            rows += _half_case(cases[-1][0], c, hw, k, threads, rounds)
    finally:
        torch.set_num_threads(torch_threads)
    return rows
