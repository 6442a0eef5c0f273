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

import numpy as np

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


def one_node_model(op_type: str, inputs: dict, outputs: dict, attrs: dict | None = None, *, domain: str = "",
                   opset: int = 19):
    """A ModelProto of one `op_type` node: `inputs` maps names to example arrays (their dtypes and
    shapes are the graph's), `outputs` maps names to (numpy dtype, shape). A custom `domain` is
    imported at version 1 beside ai.onnx `opset`."""
    from onnx import helper

    def info(name, dtype, shape):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), list(shape))

    node = helper.make_node(op_type, list(inputs), list(outputs), domain=domain, **(attrs or {}))
    graph = helper.make_graph([node], op_type, [info(n, a.dtype, a.shape) for n, a in inputs.items()],
                              [info(n, dtype, shape) for n, (dtype, shape) in outputs.items()])
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    # ONNX Runtime 1.31 reads models up to IR version 13 (onnx 1.23 writes 14 by default).
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def on_torch_threads(threads: int, fn: Callable[[], object]) -> Callable[[], object]:
    """`fn` run on `threads` torch intra-op threads (set on every call: other rows of the same
    round may have changed them). The caller restores torch's own count when done."""
    import torch

    def call():
        torch.set_num_threads(threads)
        return fn()

    return call


def input_gradients(model: Callable[..., object], args: tuple, grad) -> tuple:
    """The gradients of model(*args) with respect to every input, for the output gradient `grad`
    (fresh leaves each call, so a timed call does the whole forward and backward; leaves that share
    the inputs' memory, since a copy of the inputs is part of neither side's work)."""
    import torch

    leaves = [a.detach().requires_grad_() for a in args]
    return torch.autograd.grad(model(*leaves), leaves, grad)


def note_floor(rows: list[Row], floor_impl: str) -> None:
    """Appends to every other row's note its time over the floor's (`floor_impl`, a row of the
    same interleaved rounds): the median of per-round ratios."""
    floor = next(r for r in rows if r.impl == floor_impl)
    for row in rows:
        if row is not floor and row.round_ratios and floor.round_ratios:
            x = statistics.median(a / b for a, b in zip(row.round_ratios, floor.round_ratios))
            row.note = ", ".join(s for s in (row.note, f"{x:.2f}x the floor") if s)


def progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def bench_venv(path, pins: list[str], check: str, create: bool, what: str):
    """The Python of a benchmark-only environment at `path` (a peer that cannot share .venv: another
    torch, or a package of many dependencies), made with `pins` on request (a full run) and checked
    with the statement `check`; else only if it exists. None, with a message, when there is none."""
    import subprocess
    from pathlib import Path

    path = Path(path)
    python = path / "bin" / "python"
    if python.exists():
        return python
    if not create:
        progress(f"{what}: skipped, no environment at {path} (a full run creates it)")
        return None
    progress(f"{what}: creating {path} with {' '.join(pins)} (minutes)")
    base = getattr(sys, "_base_executable", sys.executable)  # the interpreter .venv was made from
    try:
        subprocess.run([base, "-m", "venv", str(path)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *pins], check=True)
        subprocess.run([str(python), "-c", check], check=True)
    except (subprocess.CalledProcessError, OSError) as e:
        progress(f"{what}: skipped, the environment could not be made ({e})")
        return None
    return python


class Worker:
    """An implementation in a process of its own (a bench/*_worker.py script), answering one request
    per line: so that peers from another environment can run, and no two implementations' OpenMP
    threads spin on each other's cores (OMP_WAIT_POLICY=PASSIVE). The script prints
    "ready <version>" first, then "ok" per request."""

    def __init__(self, python, script: str, *args: str):
        import subprocess

        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": os.path.join(_HERE, "..", "python")}
        self.proc = subprocess.Popen([str(python), os.path.join(_HERE, script), *map(str, args)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        first = self.proc.stdout.readline().split(maxsplit=1)
        if first[:1] != ["ready"]:
            self.proc.kill()
            raise RuntimeError(f"the worker {script} {' '.join(map(str, args))} did not start")
        self.version = first[1].strip()

    def __call__(self, cmd: str) -> None:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline().strip()
        if reply != "ok":
            raise RuntimeError(f"worker answered {reply!r} to {cmd!r}")

    def round_trip_ms(self, n: int = 100) -> float:
        """The pipe's own round trip (a "ping" request), which every timed request includes."""
        t0 = time.perf_counter()
        for _ in range(n):
            self("ping")
        return (time.perf_counter() - t0) * 1000 / n

    def close(self) -> None:
        self.proc.stdin.close()  # end of input: the worker returns
        self.proc.wait(timeout=60)
