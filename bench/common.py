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
    # Interleaved rounds (see interleaved()): this row's time / the subject's, per round.
    round_ratios: list[float] | None = None

    @property
    def ratio_spread(self) -> tuple[float, float, float] | None:
        """(median, 25th, 75th percentile) of the per-round ratios, when measured in rounds."""
        if not self.round_ratios:
            return None
        q = statistics.quantiles(self.round_ratios, n=4) if len(self.round_ratios) > 1 else [self.round_ratios[0]] * 3
        return statistics.median(self.round_ratios), q[0], q[2]

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


def interleaved(benchmark: str, fns: dict[str, Callable[[], object]], *, rounds: int = 15, warmup: int = 2,
                max_seconds: float = 60.0, notes: dict[str, str] | None = None) -> list[Row]:
    """Times every implementation once per round, in turn, so that load on a shared machine
    falls on all of them alike; the first implementation is the subject. Each row carries its
    per-round ratio to the subject (report the median and the spread, not a ratio of medians).
    Stops early (keeping at least 3 rounds) when the rounds together exceed `max_seconds`."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    spent = 0.0
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            times[name].append(dt * 1e3)
            spent += dt
        if spent > max_seconds and len(times[next(iter(fns))]) >= 3:
            break
    subject = times[next(iter(fns))]
    return [Row(benchmark, name, t, (notes or {}).get(name, ""), [a / b for a, b in zip(t, subject)])
            for name, t in times.items()]


def ort_session(model, threads: int | None = None, with_opbridge: bool = True, spinning: bool = True):
    """An ONNX Runtime session on `model` (ModelProto or bytes); `threads` intra-op threads
    (default: ONNX Runtime's, one per core). With the opbridge library registered unless told not to.
    spinning=False stops its idle worker threads from spinning, which would otherwise slow
    whatever runs next in the process (use it when timing side by side with other code)."""
    import onnxruntime as ort

    import opbridge

    data = model if isinstance(model, bytes) else model.SerializeToString()
    so = opbridge.session_options() if with_opbridge else ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    if not spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)
