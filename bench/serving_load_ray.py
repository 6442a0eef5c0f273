"""Load and faults for examples/ray_serve.py: closed-loop clients over HTTP against the Ray Serve
deployment (2 replicas), beside the same requests run on one opbridge.session in as many
threads, and one replica's process killed under load.

    python bench/serving_load_ray.py [--python PY] [--clients 8 32] [--requests 60]

PY is a Python with ray[serve], torch and opbridge (default: this one), e.g. the cached
environment tests/python/test_ray_serve.py makes (~/.cache/opbridge/envs/py311-ray-2.60/bin/python).
It prints p50/p99 latency and throughput per concurrency, and what the fault did. Not a test:
tests/python/test_ray_serve.py runs the same driver and asserts correctness only.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import http.client
import io
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serving_load  # noqa: E402  (the closed-loop driver and figures this file extends)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ray_serve.py"
OUTPUTS = ("out0", "out1")
FEATURES = 8  # examples/demo.py's DemoModel


def payloads() -> list[dict[str, np.ndarray]]:
    """64 inputs for DemoModel, batches 1..16, the same on every run."""
    return serving_load.payloads({"x": (FEATURES,), "y": (FEATURES,)}, 64, batches=range(1, 17))


# ---- the server: examples/ray_serve.py --serve in a session of its own -----------------------------
def session_members(sid: int) -> list[int]:
    """Pids in session `sid`. Ray's processes stay in their driver's session (its workers get
    process groups of their own)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            # pid (comm) state ppid pgrp session ...: comm may hold spaces, so split after its ')'.
            state, _, _, session = stat.rsplit(")", 1)[1].split()[:4]
            if int(session) == sid and state != "Z":  # a zombie is dead, waiting for its parent
                pids.append(int(entry))
    return pids


def _wait_gone(sid: int, seconds: float) -> list[int]:
    """The members of session `sid` still alive after up to `seconds`."""
    deadline = time.monotonic() + seconds
    while (alive := session_members(sid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive


class ServeProcess:
    """examples/ray_serve.py --serve under `python`, with Ray's files in a fresh folder. Leaving the
    `with` closes its stdin (Serve and Ray shut down), then kills whatever of its session is
    left after `stop_timeout` and lists those pids in `stragglers`."""

    def __init__(self, python: str | os.PathLike, workdir: Path, *, start_timeout: float = 300,
                 stop_timeout: float = 60):
        self.python, self.workdir = str(python), workdir
        self.start_timeout, self.stop_timeout = start_timeout, stop_timeout
        self.stragglers: list[int] = []
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "ServeProcess":
        self.workdir.mkdir(parents=True, exist_ok=True)
        # Ray's socket paths must stay under 108 bytes: a short folder of its own.
        self.ray_dir = tempfile.mkdtemp(prefix="obray")
        # Ray's token authentication with a token of this run's own, passed in the environment:
        # other drivers given `self.env` can join, and nothing is written to ~/.ray.
        self.env = dict(os.environ, RAY_TMPDIR=self.ray_dir, RAY_AUTH_MODE="token",
                        RAY_AUTH_TOKEN=secrets.token_hex(32), PYTHONUNBUFFERED="1")
        self.log = self.workdir / "serve.log"
        self._log_file = open(self.log, "wb")
        self.proc = subprocess.Popen(
            [self.python, str(EXAMPLE), "--serve", "--port", str(serving_load.free_ports(1)[0]),
             "--out", str(self.workdir),
             "--requests", "2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log_file, env=self.env,
            start_new_session=True)
        try:
            self.info = self._wait_ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.url, self.model = self.info["url"], Path(self.info["model"])
        return self

    def _wait_ready(self) -> dict:
        lines: list[str] = []
        ready: dict = {}

        def read():
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace").rstrip("\n")
                lines.append(line)
                if line.startswith("{"):
                    ready.update(json.loads(line))
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(self.start_timeout)
        if not ready:
            state = (f"exited with {self.proc.poll()}" if self.proc.poll() is not None
                     else f"not ready after {self.start_timeout:.0f} s")
            raise RuntimeError(f"examples/ray_serve.py --serve {state}; its output:\n" + "\n".join(lines) +
                               f"\n--- the end of its log ({self.log}):\n{self.tail()}")
        self.check_output = lines
        return ready

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def __exit__(self, *exc) -> None:
        proc = self.proc
        try:
            proc.stdin.close()  # the server's signal to shut Serve and Ray down
        except OSError:
            pass
        try:
            self.returncode = proc.wait(self.stop_timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            self.returncode = proc.wait(10)
        # The driver leads a session of its own (start_new_session): what remains of it is left over.
        self.stragglers = _wait_gone(proc.pid, 10)
        for pid in self.stragglers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _wait_gone(proc.pid, 10)
        proc.stdout.close()
        self._log_file.close()
        shutil.rmtree(self.ray_dir, ignore_errors=True)


# ---- clients ---------------------------------------------------------------------------------------
class ServeError(RuntimeError):
    pass


class HttpClient:
    """One keep-alive HTTP connection speaking examples/ray_serve.py's JSON, or with `binary` its
    .npz bytes. A call returns (outputs, replica, pid)."""

    def __init__(self, url: str, timeout: float = 30, binary: bool = False):
        parts = urllib.parse.urlsplit(url)
        self.host, self.port, self.path, self.timeout = parts.hostname, parts.port, parts.path, timeout
        self.binary = binary
        self.conn: http.client.HTTPConnection | None = None

    def __call__(self, inputs: dict[str, np.ndarray]) -> tuple[list[np.ndarray], str, int]:
        if self.binary:
            buf = io.BytesIO()
            np.savez(buf, **inputs)
            body, kind = buf.getvalue(), "application/octet-stream"
        else:
            body, kind = json.dumps({"inputs": {k: v.tolist() for k, v in inputs.items()}}), "application/json"
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            self.conn.request("POST", self.path, body, {"content-type": kind})
            r = self.conn.getresponse()
            data = r.read()
        except BaseException:
            self.close()  # a broken or timed-out connection is not reused
            raise
        if r.status != 200:
            raise ServeError(f"HTTP {r.status}: {data[:300].decode(errors='replace')}")
        if self.binary:
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                outputs = [npz[name] for name in OUTPUTS]
            return outputs, r.headers["x-opbridge-replica"], int(r.headers["x-opbridge-pid"])
        answer = json.loads(data)
        outputs = [np.asarray(answer["outputs"][name], dtype=np.float32) for name in OUTPUTS]
        return outputs, answer["replica"], answer["pid"]

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def session_client(session) -> Callable[[], Callable]:
    """Clients that run the request on `session` in their own thread (ONNX Runtime runs one
    session from many threads): the baseline without Serve."""
    def make():
        def call(inputs):
            return session.run(list(OUTPUTS), inputs), "direct", os.getpid()
        return call
    return make


@dataclasses.dataclass
class Record(serving_load.Record):
    replica: str | None = None  # which replica answered
    pid: int | None = None  # its process
    finished: float = 0.0  # time.perf_counter() at the answer


class LoadResult(serving_load.LoadResult):
    def figures(self) -> dict:
        return {**super().figures(), "replicas": sorted({r.replica for r in self.ok})}


def timed(call: Callable, inputs: dict, k: int) -> Record:
    """Request k, sent by call(inputs) -> (outputs, replica, pid); an exception is its error."""
    t0 = time.perf_counter()
    try:
        outputs, replica, pid = call(inputs)
        rec = Record(k, 0.0, outputs, replica=replica, pid=pid)
    except Exception as e:  # noqa: BLE001 - a failed request is a result
        rec = Record(k, 0.0, error=f"{type(e).__name__}: {e}")
    rec.finished = time.perf_counter()
    rec.latency = rec.finished - t0
    return rec


class _Request(dict):
    """One request's inputs that know the request's index (serving_load.closed_loop hands a
    call its inputs alone)."""

    def __init__(self, index: int, inputs: dict):
        super().__init__(inputs)
        self.index = index


def closed_loop(make_client: Callable[[], Callable], inputs: list[dict], clients: int, per_client: int,
                on_answer: Callable[[int], None] | None = None) -> LoadResult:
    """serving_load.closed_loop (`clients` threads, `per_client` requests each, one after
    another; on_answer(n) after each answer), keeping who answered each request: make_client()
    gives a call(inputs) -> (outputs, replica, pid)."""
    who: dict[int, tuple[str, int, float]] = {}
    made = []

    def make_call():
        client = make_client()
        made.append(client)

        def call(request: _Request) -> list[np.ndarray]:
            outputs, replica, pid = client(request)
            who[request.index] = (replica, pid, time.perf_counter())
            return outputs
        return call

    requests = [_Request(k, inputs[k % len(inputs)]) for k in range(clients * per_client)]
    try:
        result = serving_load.closed_loop(make_call, requests, clients, per_client, on_answer)
    finally:
        for client in made:
            getattr(client, "close", lambda: None)()
    return LoadResult(result.clients, result.wall, [Record(r.index, r.latency, r.outputs, r.error,
                                                           *who.get(r.index, (None, None, 0.0)))
                                                    for r in result.records])


def until_replicas(client: Callable, inputs: list[dict], count: int, timeout: float,
                   avoid_pid: int | None = None) -> list[Record]:
    """Requests one at a time until `count` distinct replicas (none with `avoid_pid`) have
    answered, or `timeout` seconds; errors are kept."""
    records: list[Record] = []
    seen: set[str] = set()
    deadline = time.perf_counter() + timeout
    while len(seen) < count and time.perf_counter() < deadline:
        rec = timed(client, inputs[len(records) % len(inputs)], len(records))
        records.append(rec)
        if rec.error is None and rec.pid != avoid_pid:
            seen.add(rec.replica)
        elif rec.error is not None:
            time.sleep(0.2)  # the deployment is changing: do not spin
    return records


@dataclasses.dataclass
class FaultResult:
    killed_pid: int
    killed_replica: str
    before: list[Record]  # requests until both replicas had answered, before the kill
    load: LoadResult  # the requests sent while the replica died
    recovery: list[Record]  # requests after the load until two live replicas answered
    replaced_in: float | None  # seconds from the kill to the first answer of a new replica
    replicas_after: set[str]  # the live replicas that answered the recovery requests


def kill_replica_under_load(url: str, inputs: list[dict], clients: int, per_client: int, kill_after: int,
                            recovery_timeout: float = 90, client_timeout: float = 30) -> FaultResult:
    """Requests until both replicas answered; then closed-loop load, and after `kill_after`
    answers SIGKILL the process of the replica that answered first; then requests until two
    replicas other than the killed one answer (or `recovery_timeout`)."""
    client = HttpClient(url, client_timeout)
    before = until_replicas(client, inputs, 2, recovery_timeout)
    answered = [r for r in before if r.error is None]
    if len({r.replica for r in answered}) < 2:
        raise RuntimeError(f"two replicas did not answer within {recovery_timeout} s: {before[-3:]}")
    victim, victim_pid = answered[0].replica, answered[0].pid
    known = {r.replica for r in answered}
    killed: list[float] = []
    lock = threading.Lock()

    def maybe_kill(done: int):
        with lock:
            if done >= kill_after and not killed:
                os.kill(victim_pid, signal.SIGKILL)
                killed.append(time.perf_counter())

    load = closed_loop(lambda: HttpClient(url, client_timeout), inputs, clients, per_client, maybe_kill)
    maybe_kill(kill_after)  # fewer answers than kill_after: the fault happens regardless
    recovery = until_replicas(client, inputs, 2, recovery_timeout, avoid_pid=victim_pid)
    client.close()
    new = [r.finished for r in load.records + recovery if r.error is None and r.replica not in known]
    return FaultResult(victim_pid, victim, before, load, recovery, min(new) - killed[0] if new else None,
                       {r.replica for r in recovery if r.error is None and r.pid != victim_pid})


# ---- the benchmark ---------------------------------------------------------------------------------
def cpu_seconds(sid: int) -> collections.Counter:
    """CPU seconds (user + system) so far of session `sid`'s processes, summed by name, and of
    this process (the clients)."""
    ticks, out = os.sysconf("SC_CLK_TCK"), collections.Counter()
    for pid in session_members(sid):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # utime and stime are fields 14 and 15 of stat
        out[stat[stat.index("(") + 1:stat.rindex(")")]] += (int(fields[11]) + int(fields[12])) / ticks
    t = os.times()
    out["clients"] = t.user + t.system
    return out


def measured(name: str, run: Callable[[], LoadResult], sid: int) -> LoadResult:
    """Prints the run's figures, then the CPU time per request it cost each kind of process: on
    a machine shared with other work, this says where the time goes better than the clock."""
    before = cpu_seconds(sid)
    result = run()
    spent = cpu_seconds(sid)
    spent.subtract(before)
    f = result.figures()
    print(serving_load.row(name, f), " ", ", ".join(map(str, f["replicas"])))
    per_request = {k: 1e3 * v / len(result.records) for k, v in spent.most_common() if v > 0}
    print(f"{'':<30} CPU ms/request: " + ", ".join(f"{k} {v:.2f}" for k, v in per_request.items())
          + f" (total {sum(per_request.values()):.2f})", flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="a Python with ray[serve], torch and opbridge")
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--requests", type=int, default=60, help="requests per client")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT / "python"))
    import opbridge

    inputs = payloads()
    with tempfile.TemporaryDirectory(prefix="opbridge-serve-load-") as tmp, \
            ServeProcess(args.python, Path(tmp)) as server:
        session, sid = opbridge.session(server.model), server.proc.pid
        print(serving_load.HEADER, "  replicas")
        closed_loop(lambda: HttpClient(server.url), inputs, 2, 10)  # warm-up: connections, both replicas
        for clients in args.clients:
            measured("opbridge.session (threads)",
                     lambda: closed_loop(session_client(session), inputs, clients, args.requests), sid)
            for name, binary in (("Ray Serve HTTP JSON", False), ("Ray Serve HTTP .npz", True)):
                measured(name, lambda: closed_loop(lambda: HttpClient(server.url, binary=binary), inputs, clients,
                                                   args.requests), sid)
        fault = kill_replica_under_load(server.url, inputs, 8, args.requests, kill_after=8 * args.requests // 4)
        errors = fault.load.errors
        print(f"\nkilled replica {fault.killed_replica} (pid {fault.killed_pid}) under 8 clients: "
              f"{len(fault.load.ok)} answered, {len(errors)} failed"
              + (f" (e.g. {errors[0].error[:160]!r})" if errors else "")
              + f"; slowest {max(r.latency for r in fault.load.records):.2f} s; a new replica answered "
              + (f"{fault.replaced_in:.1f} s after the kill" if fault.replaced_in is not None else "never")
              + f"; live replicas after: {', '.join(sorted(fault.replicas_after))}")
    if server.stragglers:
        print(f"left over after shutdown (killed): {server.stragglers}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
