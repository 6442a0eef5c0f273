"""deform_conv2d forward + backward (v2: offsets, mask and bias; float32) in PyTorch eager:
opbridge (torch.ops.opbridge.deform_conv2d, gradients by deform_conv2d_backward; the subject)
against torchvision.ops.deform_conv2d on the CPU, forward and backward, and forward alone.

torchvision only pairs with a torch build other than the project's (torch 2.14.1 with torchvision
0.29.1, a CUDA build that runs on the CPU), so it runs in a benchmark-only environment,
$OPBRIDGE_TORCHVISION_VENV or bench/.torchvision-venv (created here on a full run: pip install of
about 5.5 GB, from this machine's disk where it lies there), and each implementation
runs in a worker process of its own (deform_worker.py, OpenMP threads passive so neither spins on
the other's cores): each run is one request over a pipe, timed here in interleaved rounds, the
pipe's round trip (reported) counted for both alike. Without that environment the benchmark is
skipped with a message.

Both sides run on the same number of torch intra-op threads (1 and 2).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from common import Row, Worker, bench_venv, interleaved, progress

HERE = Path(__file__).resolve().parent
VENV = Path(os.environ.get("OPBRIDGE_TORCHVISION_VENV", HERE / ".torchvision-venv"))
PINS = ["torch==2.14.1", "torchvision==0.29.1"]


def _case(python: Path, n: int, c: int, hw: int, og: int, threads: int, rounds: int) -> list[Row]:
    import torch

    g = torch.Generator().manual_seed(0)
    k = 3
    inputs = [torch.randn(n, c, hw, hw, generator=g), torch.randn(c, c, k, k, generator=g) * 0.1,
              torch.rand(n, 2 * og * k * k, hw, hw, generator=g) * 4 - 2, torch.randn(c, generator=g),
              torch.rand(n, og * k * k, hw, hw, generator=g)]
    attrs = {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1, "offset_groups": og}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        case = Path(tmp) / "case.pt"
        torch.save({"inputs": inputs, "attrs": attrs, "grad": torch.randn(n, c, hw, hw, generator=g)}, case)
        ours = Worker(sys.executable, "deform_worker.py", "opbridge", case, threads)
        theirs = Worker(python, "deform_worker.py", "torchvision", case, threads)
        try:
            results = []
            for w, out in ((ours, "ours.pt"), (theirs, "theirs.pt")):
                w(f"save {Path(tmp) / out}")
                results.append(torch.load(Path(tmp) / out))
            diff = max(float((a - b).abs().max() / (b.abs().max() + 1e-30)) for a, b in zip(*results))
            ping_ms = theirs.round_trip_ms()
            shape = f"n={n} c={c}->{c} {hw}x{hw} k=3 pad=1 offset_groups={og} mask+bias, {threads} thread(s)"
            notes = {theirs.version: f"max relative |diff| of the output and gradients {diff:.1e}",
                     ours.version: f"both in their own process; a request's pipe round trip ({ping_ms:.3f} ms) counted"}
            for what, cmd in (("forward+backward", "fwdbwd"), ("forward", "fwd")):
                rows += interleaved(f"deform_conv2d {what} {shape}",
                                    {ours.version: lambda c=cmd: ours(c), theirs.version: lambda c=cmd: theirs(c)},
                                    rounds=rounds, notes=notes)
        finally:
            ours.close()
            theirs.close()
    return rows


def run(quick: bool) -> list[Row]:
    python = bench_venv(VENV, PINS, "import torchvision.ops", create=not quick, what="deform_conv2d backward")
    if python is None:
        return []
    c, hw = (16, 16) if quick else (64, 64)
    cases = [(1, 1), (2, 4)] if quick else [(1, 1), (4, 1), (4, 4)]
    rows = []
    for n, og in cases:
        for threads in (1, 2):
            progress(f"deform_conv2d backward: n={n} offset_groups={og}, {threads} thread(s)")
            rows += _case(python, n, c, hw, og, threads, 3 if quick else 15)
    return rows
