"""Shared helpers for the benchmarks: timing, result rows, ONNX Runtime sessions.

Every benchmark module (bench_<name>.py) defines `run(quick: bool) -> list[Row]`. The rows of
one benchmark are measured side by side in the same process; the first row of each benchmark
is the subject (opbridge), and bench/run.py reports every other row as a ratio against it.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time
from typing import Callable

_HERE = os.path.dirname(os.path.abspath(__file__))
for _dir in ("python", "examples"):  # opbridge, and examples/demo.py's models
    if os.path.join(_HERE, "..", _dir) not in sys.path:
        sys.path.insert(0, os.path.join(_HERE, "..", _dir))


@dataclasses.dataclass
class Row:
    benchmark: str  # e.g. "knn_query n=m=100000 k=16"
    impl: str  # e.g. "opbridge (ONNX Runtime)", "scipy cKDTree workers=-1"
    times_ms: list[float]
    note: str = ""

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def min_ms(self) -> float:
        return min(self.times_ms)


def measure(fn: Callable[[], object], *, warmup: int = 2, repeat: int = 10, max_seconds: float = 20.0) -> list[float]:
    """Wall-clock times of `repeat` calls in milliseconds, after `warmup` untimed calls. Stops
    early (keeping at least 3 samples) when the calls together exceed `max_seconds`."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    spent = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        times.append(dt * 1e3)
        spent += dt
        if spent > max_seconds and len(times) >= 3:
            break
    return times


def ort_session(model, threads: int | None = None, with_opbridge: bool = True):
    """An ONNX Runtime session on `model` (ModelProto or bytes); `threads` intra-op threads
    (default: ONNX Runtime's, one per core). With the opbridge library registered unless told not to."""
    import onnxruntime as ort

    import opbridge

    data = model if isinstance(model, bytes) else model.SerializeToString()
    so = opbridge.session_options() if with_opbridge else ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)
