"""opbridge-run (C++: ONNX Runtime's C++ API, no Python) against Python's onnxruntime on the same
model and inputs: what a Python-free deployment saves per call. The C++ times are opbridge-run's
own per-run latencies (--times), the Python times are wall-clock `InferenceSession.run` calls
including numpy in and out, as a Python service would make them.

Interleaved in blocks, not call by call: the runner is a separate process, and a process start
per call would time the start, not the run. Each round is one opbridge-run process (20 untimed
runs, then `repeat` timed ones) followed by `repeat` Python calls (after 20 untimed ones); a
round's ratio is the Python block's median over the runner's, and the rows report the median of
those per-round ratios with their spread, so load on the shared machine falls on both alike.
Both sessions keep ONNX Runtime's defaults (thread spinning on), the runner having no switch for it.
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

import opbridge
from common import Row, measure, ort_session, progress
from demo import FEATURES, DemoModel  # examples/demo.py (common puts examples/ on sys.path)

RUNNER = Path(opbridge.__file__).parent / "_sdk/bin/opbridge-run"


def _runner_times(model: Path, feeds: dict, threads: int | None, warmup: int, repeat: int, tmp: Path) -> list[float]:
    args = [str(RUNNER), str(model), "--warmup", str(warmup), "--repeat", str(repeat), "--times", str(tmp / "t.npy")]
    for name, value in feeds.items():
        np.save(tmp / f"{name}.npy", value)
        args += ["--input", f"{name}={tmp / name}.npy"]
    if threads:
        args += ["--threads", str(threads)]
    subprocess.run(args, check=True, capture_output=True, env={})
    return np.load(tmp / "t.npy").tolist()


def run(quick: bool) -> list[Row]:
    if not RUNNER.exists():
        progress(f"opbridge_run: {RUNNER} is not installed; skipped")
        return []
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-opbridge-run-") as d:
        tmp = Path(d)
        model = tmp / "demo.onnx"
        opbridge.export(DemoModel().eval(), (torch.randn(4, FEATURES), torch.randn(4, FEATURES)), model,
                        input_names=["x", "y"], output_names=["out0", "out1"],
                        dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
        cases = [(1, 1), (1024, 1), (65536, 1), (65536, None)]
        if quick:
            cases = [(1, 1), (1024, 1)]
        rounds = 3 if quick else 10
        runner_ort = _runner_ort_version()
        for batch, threads in cases:
            g = np.random.default_rng(batch)
            feeds = {n: g.uniform(-1, 1, (batch, FEATURES)).astype(np.float32) for n in ("x", "y")}
            repeat = 30 if quick else (200 if batch <= 1024 else 20)
            name = f"demo model batch={batch} threads={threads or 'default'}"
            progress(name)
            sess = ort_session(model.read_bytes(), threads=threads)
            cpp: list[list[float]] = []
            py: list[list[float]] = []
            for _ in range(rounds):
                cpp.append(_runner_times(model, feeds, threads, 20, repeat, tmp))
                py.append(measure(lambda: sess.run(None, feeds), warmup=20, repeat=repeat))
            ratios = [statistics.median(p) / statistics.median(c) for p, c in zip(py, cpp)]
            rows.append(Row(name, f"opbridge-run (C++ API, ORT {runner_ort} SDK)", [t for b in cpp for t in b],
                            f"{rounds} rounds of {repeat} runs", [1.0] * rounds))
            rows.append(Row(name, f"Python onnxruntime {ort.__version__} run()", [t for b in py for t in b], "",
                            ratios))
    return rows


def _runner_ort_version() -> str:
    # "opbridge-run 0.1.0 (ONNX Runtime 1.29.0)"
    out = subprocess.run([str(RUNNER), "--version"], check=True, capture_output=True, text=True, env={}).stdout
    return out.rsplit("ONNX Runtime", 1)[-1].strip(" )\n") or "?"
