"""opbridge-run (C++: ONNX Runtime's C++ API, no Python) against Python's onnxruntime on the same
model and inputs: what a Python-free deployment saves per call. The C++ times are opbridge-run's
own per-run latencies (--times), the Python times are wall-clock `InferenceSession.run` calls
including numpy in and out, as a Python service would make them.
"""

from __future__ import annotations

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
        for batch, threads in cases:
            g = np.random.default_rng(batch)
            feeds = {n: g.uniform(-1, 1, (batch, FEATURES)).astype(np.float32) for n in ("x", "y")}
            repeat = 30 if quick else (1000 if batch <= 1024 else 200)
            name = f"demo model batch={batch} threads={threads or 'default'}"
            progress(name)
            cpp = _runner_times(model, feeds, threads, 20, repeat, tmp)
            sess = ort_session(model.read_bytes(), threads=threads)
            py = measure(lambda: sess.run(None, feeds), warmup=20, repeat=repeat)
            rows.append(Row(name, "opbridge-run (C++ API, ORT 1.29 SDK)", cpp))
            rows.append(Row(name, f"Python onnxruntime {ort.__version__} run()", py))
    return rows
