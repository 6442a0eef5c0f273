"""resize_bicubic deployed in ONNX Runtime: opbridge's own node (the subject, what
opbridge.export writes for ONNX Runtime by default) against the portable model's ai.onnx Resize
(cubic, what portable=True writes) and PyTorch's F.interpolate in eager, on 1 and 2 threads.
Timed in interleaved rounds with ONNX Runtime's thread spinning off, so no implementation runs
in the wake of another's spinning workers."""

from __future__ import annotations

import numpy as np

from common import Row, interleaved, ort_session, progress


def run(quick: bool) -> list[Row]:
    import torch

    import opbridge

    n, c, h, w, scale = (1, 3, 64, 64, 2.0) if quick else (1, 3, 320, 320, 1.6)
    rounds = 5 if quick else 20

    class Resize(torch.nn.Module):
        def forward(self, x, scales):
            return opbridge.resize_bicubic(x, scales)

    x = torch.rand(n, c, h, w)
    scales = torch.tensor([1.0, 1.0, scale, scale])
    own = opbridge.export(Resize(), (x, scales), input_names=["x", "scales"])
    portable = opbridge.export(Resize(), (x, scales), input_names=["x", "scales"], portable=True)
    assert {nd.op_type for nd in own.graph.node} == {"ResizeBicubic"}
    assert {nd.op_type for nd in portable.graph.node} == {"Resize"}
    feeds = {"x": x.numpy(), "scales": scales.numpy()}
    want = torch.nn.functional.interpolate(x, scale_factor=[scale, scale], mode="bicubic", align_corners=False)
    rows: list[Row] = []
    torch_threads = torch.get_num_threads()
    for threads in (1, 2):
        name = f"resize_bicubic {n}x{c}x{h}x{w} x{scale} -> {want.shape[2]}x{want.shape[3]}, {threads} thread(s)"
        s_own = ort_session(own, threads=threads, spinning=False)
        s_std = ort_session(portable, threads=threads, with_opbridge=False, spinning=False)
        diffs = {label: float(np.abs(s.run(None, feeds)[0] - want.numpy()).max())
                 for label, s in (("own", s_own), ("std", s_std))}

        def eager():
            torch.set_num_threads(threads)
            return torch.nn.functional.interpolate(x, scale_factor=[scale, scale], mode="bicubic", align_corners=False)

        progress(name)
        rows += interleaved(name, {
            "opbridge ResizeBicubic (ONNX Runtime)": lambda: s_own.run(None, feeds),
            "ONNX Runtime Resize cubic (portable=True)": lambda: s_std.run(None, feeds),
            "torch F.interpolate bicubic (eager)": eager,
        }, rounds=rounds, notes={"opbridge ResizeBicubic (ONNX Runtime)": f"max |diff| vs torch {diffs['own']:.1e}",
                                 "ONNX Runtime Resize cubic (portable=True)": f"max |diff| vs torch {diffs['std']:.1e}"})
    torch.set_num_threads(torch_threads)
    return rows
