"""deform_conv2d (v2: offsets, mask and bias), float32, side by side in ONNX Runtime with its
default threads: opbridge's custom node (the subject), ONNX Runtime's own ai.onnx DeformConv
(opset 19), a plain ai.onnx Conv of the same shape (the floor: no sampling at all), and opbridge
in PyTorch eager."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from common import Row, measure, ort_session, progress

# ONNX Runtime 1.31 reads models up to IR version 13 (onnx 1.23 writes 14 by default).
IR_VERSION = 10


def _model(op_type: str, inputs: dict[str, np.ndarray], attrs: dict, out_shape: list[int], domain: str = ""):
    node = helper.make_node(op_type, list(inputs), ["y"], domain=domain, **attrs)
    graph = helper.make_graph(
        [node], op_type,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(a.shape)) for n, a in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)])
    imports = [helper.make_opsetid("", 19)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=imports, ir_version=IR_VERSION)


def run(quick: bool) -> list[Row]:
    import torch

    import opbridge  # noqa: F401  (loads torch.ops.opbridge)

    n, c, hw, k = (1, 16, 32, 3) if quick else (1, 64, 64, 3)
    repeat = 5 if quick else 30
    name = f"deform_conv2d n={n} c={c}->{c} {hw}x{hw} k={k} pad=1 mask+bias"
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, hw, hw), dtype=np.float32)
    w = (rng.standard_normal((c, c, k, k), dtype=np.float32) * 0.1).astype(np.float32)
    b = rng.standard_normal(c, dtype=np.float32)
    off = rng.uniform(-2, 2, (n, 2 * k * k, hw, hw)).astype(np.float32)
    mask = rng.uniform(0, 1, (n, k * k, hw, hw)).astype(np.float32)
    out_shape = [n, c, hw, hw]

    subject = _model("DeformConv2d", {"input": x, "weight": w, "offset": off, "bias": b, "mask": mask},
                     {"padding": [1, 1]}, out_shape, domain="opbridge")
    native = _model("DeformConv", {"X": x, "W": w, "offset": off, "B": b, "mask": mask},
                    {"kernel_shape": [k, k], "pads": [1, 1, 1, 1]}, out_shape)
    conv = _model("Conv", {"X": x, "W": w, "B": b}, {"kernel_shape": [k, k], "pads": [1, 1, 1, 1]}, out_shape)

    rows: list[Row] = []
    sess = ort_session(subject)
    feeds = {"input": x, "weight": w, "offset": off, "bias": b, "mask": mask}
    want = sess.run(None, feeds)[0]
    progress(f"{name}: opbridge (ONNX Runtime)")
    rows.append(Row(name, "opbridge DeformConv2d (ONNX Runtime)", measure(lambda: sess.run(None, feeds), repeat=repeat)))

    try:
        nsess = ort_session(native, with_opbridge=False)
    except Exception as e:  # an ONNX Runtime without DeformConv
        progress(f"{name}: no ONNX Runtime DeformConv ({str(e).splitlines()[0]})")
    else:
        nfeeds = {"X": x, "W": w, "offset": off, "B": b, "mask": mask}
        diff = float(np.abs(nsess.run(None, nfeeds)[0] - want).max())
        progress(f"{name}: ONNX Runtime DeformConv")
        rows.append(Row(name, "ONNX Runtime DeformConv (ai.onnx 19)", measure(lambda: nsess.run(None, nfeeds), repeat=repeat),
                        note=f"max |diff| {diff:.1e}"))

    csess = ort_session(conv, with_opbridge=False)
    cfeeds = {"X": x, "W": w, "B": b}
    progress(f"{name}: ONNX Runtime Conv")
    rows.append(Row(name, "ONNX Runtime Conv (floor, no sampling)", measure(lambda: csess.run(None, cfeeds), repeat=repeat)))

    tx, tw, to, tb, tm = (torch.from_numpy(a) for a in (x, w, off, b, mask))
    op = torch.ops.opbridge.deform_conv2d
    progress(f"{name}: opbridge (PyTorch eager)")
    rows.append(Row(name, f"opbridge eager (torch, {torch.get_num_threads()} threads)",
                    measure(lambda: op(tx, tw, to, tb, tm, padding=[1, 1]), repeat=repeat)))
    return rows
