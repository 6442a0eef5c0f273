"""Load and a fault on Triton's python backend serving an opbridge model (`opbridge triton
--backend python`): closed-loop tritonclient clients over HTTP and gRPC against tritonserver 2.51
(PyPI's nvidia-pytriton; tests/python/triton_server.py), beside the same requests run on one
opbridge.session from as many threads; then one stub process killed under load.

    .venv/bin/python bench/serving_load_triton.py [--clients 8 32] [--requests 800]

The model is examples/demo.py's DemoModel (my_add, dual_residual, asinh) with requests of 1 to 4
rows of 8 floats; the server runs it in 2 instances (one ONNX Runtime thread each) with dynamic
batching. Clients, server and baseline share this machine's cores. Every answer is checked bit
for bit against opbridge.session's; prints p50/p99 latency and throughput per row, and what the
fault did. Not a test: tests/python/test_triton_server.py asserts correctness only.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _dir in ("python", "examples", "tests/python", "bench"):
    sys.path.insert(0, str(ROOT / _dir))

import envs  # noqa: E402
import serving_load  # noqa: E402
import triton_server  # noqa: E402
from triton_server import load_run  # noqa: E402

MODEL = "demo"


def cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        name = next(ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name"))
        flags = next(ln.split(":", 1)[1].split() for ln in out.splitlines() if ln.startswith("Flags"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{name}, {os.cpu_count()} cores, {isa}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--requests", type=int, default=800, help="requests per row (split among the clients)")
    args = parser.parse_args()

    import opbridge
    from demo import FEATURES, DemoModel, example_inputs
    from opbridge._tools import cli

    inputs = serving_load.payloads({"x": (FEATURES,), "y": (FEATURES,)}, 64, batches=(1, 2, 3, 4))
    with tempfile.TemporaryDirectory(prefix="opbridge-triton-load-") as tmp:
        tmp = Path(tmp)
        model = tmp / f"{MODEL}.onnx"
        opbridge.export(DemoModel().eval(), example_inputs(4), model, input_names=["x", "y"],
                        output_names=["out0", "out1"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
        assert cli.main(["triton", str(model), "--repository", str(tmp / "repo"), "--backend", "python",
                         "--python-env", str(triton_server.model_env()), "--instances", "2"]) == 0
        triton_server.set_parameter(tmp / "repo" / MODEL, "intra_op_thread_count", "1")
        session = opbridge.session(model)
        expected = [session.run(None, feed) for feed in inputs]
        print(f"\n{cpu()}; tritonserver {triton_server.TRITON}, onnxruntime {envs.pinned('onnxruntime')} in the stubs")
        print(serving_load.HEADER)
        with triton_server.Server(tmp / "repo", tmp / "tritonserver.log") as server:
            status, error = server.load(MODEL)
            assert status == 200, error
            warmup = [load_run("http", 2, 20), load_run("grpc", 2, 20)]
            triton_server.run_client(server, MODEL, inputs, expected, warmup, tmp / "warmup")
            for clients in args.clients:
                per_client = max(1, args.requests // clients)
                direct = serving_load.closed_loop(lambda: (lambda feed: session.run(None, feed)), inputs, clients,
                                                  per_client)
                check(direct.figures()["errors"], len(direct.mismatches(expected)), "opbridge.session")
                print(serving_load.row("opbridge.session (threads)", direct.figures()))
                both = [load_run(protocol, clients, per_client) for protocol in ("http", "grpc")]
                for r in triton_server.run_client(server, MODEL, inputs, expected, both, tmp / f"load{clients}"):
                    check(r["error_count"], r["mismatch_count"], r["name"])
                    print(serving_load.row(f"Triton python backend, {r['name'].split()[0]}", r["figures"]))
            fault(server, inputs, expected, tmp)
    return 0


def check(errors: int, mismatches: int, what: str) -> None:
    if errors or mismatches:
        raise SystemExit(f"{what}: {errors} errors, {mismatches} answers differ from opbridge.session's")


def fault(server, inputs, expected, tmp: Path) -> None:
    """SIGKILL one of the two stubs after 100 answers of 8 clients x 100 requests over HTTP; then
    reload the model, and 8 x 50 requests more."""
    stubs = server.stubs(MODEL)
    (r,) = triton_server.run_client(server, MODEL, inputs, expected,
                                    [load_run("http", 8, 100, kill=stubs[0], kill_after=100)], tmp / "fault")
    print(f"\nkilled stub pid {stubs[0]} (of {len(stubs)}) after {r['killed_after']} answers, 8 clients over HTTP: "
          f"{r['answered']} answered (all equal to opbridge.session's: {r['mismatch_count'] == 0}), "
          f"{r['error_count']} failed (e.g. {r['errors'][0] if r['errors'] else '-'}); slowest request "
          f"{r['slowest_s']:.2f} s; model still ready: {server.ready(MODEL)}")
    t0 = time.perf_counter()
    status, error = server.reload(MODEL)
    assert status == 200, error
    took = time.perf_counter() - t0
    (r,) = triton_server.run_client(server, MODEL, inputs, expected, [load_run("http", 8, 50)], tmp / "recovered")
    print(f"reload: {took:.1f} s, fresh stubs {sorted(set(server.stubs(MODEL)) - set(stubs))}; then 8 x 50 "
          f"requests: {r['answered']} answered, {r['error_count']} failed, {r['mismatch_count']} differ")


if __name__ == "__main__":
    sys.exit(main())
