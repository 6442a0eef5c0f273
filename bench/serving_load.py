"""Closed-loop load for a served model: `clients` threads, each sending its requests one after
another (the next when the last is answered), every answer kept with its latency, then the
figures (p50/p99 latency, throughput) and a bit-for-bit check against reference outputs.

Needs numpy alone, so it runs in a server's client environment as well as in the project's (the
direct opbridge.session baseline: one session, run from as many threads). Not a test:
bench/serving_load_triton.py prints the figures, tests/python/test_triton_server.py asserts
correctness only.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from typing import Callable, Sequence

import numpy as np

Call = Callable[[dict], Sequence[np.ndarray]]  # one request's inputs -> its outputs, in the model's order


@dataclasses.dataclass
class Record:
    index: int  # the request; it sent inputs[index % len(inputs)]
    latency: float  # seconds
    outputs: Sequence[np.ndarray] | None = None
    error: str | None = None


@dataclasses.dataclass
class LoadResult:
    clients: int
    wall: float  # seconds, first request sent to last answer
    records: list[Record]

    @property
    def ok(self) -> list[Record]:
        return [r for r in self.records if r.error is None]

    @property
    def errors(self) -> list[Record]:
        return [r for r in self.records if r.error is not None]

    def figures(self) -> dict:
        lat = np.array([r.latency for r in self.ok]) * 1e3
        return {"clients": self.clients, "requests": len(self.records), "errors": len(self.errors),
                "p50_ms": float(np.percentile(lat, 50)) if lat.size else float("nan"),
                "p99_ms": float(np.percentile(lat, 99)) if lat.size else float("nan"),
                "throughput_rps": len(self.ok) / self.wall if self.wall > 0 else float("nan")}

    def mismatches(self, expected: Sequence[Sequence[np.ndarray] | None]) -> list[str]:
        """The answered requests whose outputs differ from expected[index % len(expected)] in
        dtype, shape or any bit (None: the reference refused those inputs), each as one line."""
        found = []
        for r in self.ok:
            want = expected[r.index % len(expected)]
            if want is None or len(r.outputs) != len(want):
                found.append(f"request {r.index}: {len(r.outputs)} outputs, the reference "
                             + ("refused these inputs" if want is None else f"gave {len(want)}"))
                continue
            for k, (got, w) in enumerate(zip(r.outputs, want)):
                if not identical(got, w):
                    found.append(f"request {r.index} output {k}: {got.dtype}{list(got.shape)} differs from the "
                                 f"reference {w.dtype}{list(w.shape)}")
        return found


def identical(a: np.ndarray, b: np.ndarray) -> bool:
    """Same dtype, shape and bits (strings: the same values)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(np.array_equal(a, b)) if a.dtype.kind == "O" else np.ascontiguousarray(a).tobytes() == \
        np.ascontiguousarray(b).tobytes()


def closed_loop(make_call: Callable[[], Call], inputs: Sequence[dict], clients: int, per_client: int,
                on_answer: Callable[[int], None] | None = None) -> LoadResult:
    """`clients` threads, each with its own call from make_call(), sending `per_client` requests:
    request k sends inputs[k % len(inputs)]. A raised exception is that request's error.
    on_answer(n) runs after each answer, n the answers so far (to inject a fault under load)."""
    records: list[Record] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        call = make_call()
        for j in range(per_client):
            k = c * per_client + j
            t0 = time.perf_counter()
            try:
                rec = Record(k, 0.0, outputs=list(call(inputs[k % len(inputs)])))
            except Exception as e:  # noqa: BLE001 - a failed request is a result
                rec = Record(k, 0.0, error=f"{type(e).__name__}: {e}")
            rec.latency = time.perf_counter() - t0
            with lock:
                records.append(rec)
                n = len(records)
            if on_answer is not None:
                on_answer(n)

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return LoadResult(clients, time.perf_counter() - start, sorted(records, key=lambda r: r.index))


def payloads(shapes: dict[str, tuple[int, ...]], count: int, seed: int = 0, batches: Sequence[int] = (1,)) \
        -> list[dict[str, np.ndarray]]:
    """`count` float32 inputs of the given per-item shapes, batch sizes cycling through
    `batches`, the same on every run."""
    rng = np.random.default_rng(seed)
    return [{name: rng.standard_normal((batches[i % len(batches)], *shape), dtype=np.float32)
             for name, shape in shapes.items()} for i in range(count)]


HEADER = f"{'':<30} {'clients':>7} {'requests':>8} {'errors':>6} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8}"


def row(name: str, figures: dict) -> str:
    f = figures
    return (f"{name:<30} {f['clients']:>7} {f['requests']:>8} {f['errors']:>6} {f['p50_ms']:>8.2f} "
            f"{f['p99_ms']:>8.2f} {f['throughput_rps']:>8.1f}")


def free_ports(n: int) -> list[int]:
    """n loopback ports free now (held together while chosen, so they differ) for a server to take."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
