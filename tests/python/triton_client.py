"""Triton's Python clients (tritonclient, HTTP and gRPC) under closed-loop load
(bench/serving_load.py), checking every answer against reference outputs. Runs in the server's
environment (triton_server.py), which has tritonclient; the test process has neither it nor grpc.

    python triton_client.py JOB.json

JOB.json: {"model", "http", "grpc" (host:port), "timeout" (seconds per request), "inputs",
"outputs" (names, in the model's order), "count", "data" (an .npz with in{i}_{k} and out{i}_{k}:
request i's k-th input and its expected k-th output; no outputs where the reference refused the
inputs), "runs": [{"name", "protocol" ("http" or "grpc"), "clients", "per_client", "kill": a pid
to SIGKILL after "kill_after" answers, or null}]}. Prints one JSON line: per run, the figures, the
errors and the mismatches (the first few of each, with their counts).
"""

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from serving_load import closed_loop  # noqa: E402

SHOWN = 5


def make_call(job: dict, protocol: str):
    """A function of one request's inputs -> its outputs, with its own client connection."""
    from tritonclient.utils import np_to_triton_dtype

    if protocol == "http":
        import tritonclient.http as client_module

        client = client_module.InferenceServerClient(job["http"], connection_timeout=job["timeout"],
                                                     network_timeout=job["timeout"])
        extra = {}
    else:
        import tritonclient.grpc as client_module

        client = client_module.InferenceServerClient(job["grpc"])
        extra = {"client_timeout": job["timeout"]}
    requested = [client_module.InferRequestedOutput(name) for name in job["outputs"]]

    def call(inputs: dict) -> list:
        sent = []
        for name, value in inputs.items():
            t = client_module.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
            t.set_data_from_numpy(value)
            sent.append(t)
        result = client.infer(job["model"], sent, outputs=requested, **extra)
        # BYTES arrive as object arrays of bytes; the references keep strings as fixed-width bytes.
        return [(lambda a: a.astype(bytes) if a.dtype == object else a)(result.as_numpy(name))
                for name in job["outputs"]]

    return call


def main() -> int:
    job = json.loads(Path(sys.argv[1]).read_text())
    with np.load(job["data"], allow_pickle=False) as data:
        inputs = [{name: data[f"in{i}_{k}"] for k, name in enumerate(job["inputs"])} for i in range(job["count"])]
        # A request without expected outputs is one the reference refused.
        expected = [[data[f"out{i}_{k}"] for k in range(len(job["outputs"]))] if f"out{i}_0" in data else None
                    for i in range(job["count"])]
    report = []
    for run in job["runs"]:
        killed = []

        def on_answer(n: int, run=run, killed=killed) -> None:
            if run.get("kill") and n >= run["kill_after"] and not killed:
                killed.append(n)
                os.kill(run["kill"], signal.SIGKILL)

        result = closed_loop(lambda run=run: make_call(job, run["protocol"]), inputs, run["clients"],
                             run["per_client"], on_answer)
        mismatches = result.mismatches(expected)
        report.append({"name": run["name"], "figures": result.figures(), "answered": len(result.ok),
                       "error_count": len(result.errors), "errors": [r.error for r in result.errors[:SHOWN]],
                       "mismatch_count": len(mismatches), "mismatches": mismatches[:SHOWN],
                       "killed_after": killed[0] if killed else None,
                       "slowest_s": max((r.latency for r in result.records), default=0.0)})
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
