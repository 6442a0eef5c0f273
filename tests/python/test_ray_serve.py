"""Ray Serve with opbridge ops, for real: examples/ray_serve.py serving demo.py's DemoModel from two
replicas (ONNX Runtime sessions with libopbridge_ort.so, no PyTorch) in a local Ray (2 CPUs), in
an environment with ray[serve] made on top of this one (tests/python/envs.py, cached).

Every answer, over HTTP (JSON and .npz) and through a DeploymentHandle, equals
opbridge.session's output bit for bit and PyTorch eager's within float tolerance; both replicas
answer; 8 and 32 concurrent clients get no errors; a replica's process killed under load costs
failed requests at most (no hang), and Serve replaces it. bench/serving_load_ray.py is the load
driver (and prints the timings; nothing here asserts one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import envs
import opbridge

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "bench"))
import demo  # noqa: E402  (examples/demo.py: the served model)
import serving_load_ray as load  # noqa: E402

pytestmark = pytest.mark.environments  # scripts/test.sh --environments

RAY = "ray[serve]==2.60.0"
HANDLE_CLIENT = Path(__file__).with_name("ray_serve_handle_client.py")
CLIENT_TIMEOUT = 30  # seconds: a request not answered by then counts as hung
FAILED_CLEANLY = ("ServeError: HTTP 500", "ServeError: HTTP 503", "RemoteDisconnected", "ConnectionResetError")


@pytest.fixture(scope="module")
def ray_python() -> Path:
    # On top of .venv: ray[serve] adds its own packages and keeps numpy, protobuf, torch as they are.
    return envs.python_with("ray-2.60", [RAY], on_top=True)


@pytest.fixture(scope="module")
def server(ray_python, tmp_path_factory):
    """examples/ray_serve.py --serve; at the end Serve and Ray shut down, and nothing of its
    session may be left (what is, is killed and fails the teardown)."""
    with load.ServeProcess(ray_python, tmp_path_factory.mktemp("ray_serve")) as s:
        yield s
    assert not s.stragglers, f"processes left after Ray's shutdown (killed): {s.stragglers}\n{s.tail()}"
    assert s.returncode == 0, f"examples/ray_serve.py exited with {s.returncode}:\n{s.tail()}"


@pytest.fixture(scope="module")
def inputs() -> list[dict[str, np.ndarray]]:
    return load.payloads()


@pytest.fixture(scope="module")
def references(server, inputs) -> tuple[list, list]:
    """Per input: PyTorch eager's outputs (the module itself) and opbridge.session's (the served
    model file, run here)."""
    model, session = demo.DemoModel().eval(), opbridge.session(server.model)
    with torch.no_grad():
        eager = [[t.numpy() for t in model(torch.from_numpy(p["x"]), torch.from_numpy(p["y"]))] for p in inputs]
    return eager, [session.run(list(load.OUTPUTS), p) for p in inputs]


def assert_matches(records: list[load.Record], references, inputs) -> None:
    eager, direct = references
    for r in records:
        if r.error is None:
            k = r.index % len(inputs)
            for name, got, e, d in zip(load.OUTPUTS, r.outputs, eager[k], direct[k]):
                np.testing.assert_array_equal(got, d, err_msg=f"request {r.index} {name} vs opbridge.session")
                np.testing.assert_allclose(got, e, rtol=1e-5, atol=1e-6, err_msg=f"request {r.index} {name} vs eager")


def test_example_checks_its_answers(server):
    """The example's own run: HTTP JSON, HTTP .npz and the handle, compared in the driver."""
    assert "check: every answer matches PyTorch eager and opbridge.session" in server.check_output, \
        "\n".join(server.check_output)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "npz"])
def test_http_answers_from_both_replicas(server, inputs, references, binary):
    client = load.HttpClient(server.url, CLIENT_TIMEOUT, binary=binary)
    records = load.until_replicas(client, inputs, 2, timeout=60)
    client.close()
    assert not [r.error for r in records if r.error], records[-1].error
    assert len({r.replica for r in records}) == 2, f"one replica answered {len(records)} requests"
    assert len({r.pid for r in records}) == 2  # two processes, not one process twice
    assert_matches(records, references, inputs)


def test_handle_from_another_driver(server, ray_python, inputs, references, tmp_path):
    np.savez(tmp_path / "inputs.npz", **{f"{n}{k}": p[n] for k, p in enumerate(inputs) for n in ("x", "y")})
    r = subprocess.run([str(ray_python), str(HANDLE_CLIENT), server.info["gcs"], server.info["app"],
                        str(tmp_path / "inputs.npz"), str(tmp_path / "outputs.npz")], capture_output=True, text=True,
                       timeout=240, env=server.env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    requests = json.loads(r.stdout.strip().splitlines()[-1])["requests"]
    assert len({q["replica"] for q in requests}) == 2
    assert not any(q["torch_loaded"] for q in requests), "a replica imported PyTorch"
    with np.load(tmp_path / "outputs.npz") as out:
        records = [load.Record(q["input"], 0.0, [out[f"{n}_{i}"] for n in load.OUTPUTS], replica=q["replica"],
                               pid=q["pid"]) for i, q in enumerate(requests)]
    assert_matches(records, references, inputs)


@pytest.mark.parametrize("clients,per_client", [(8, 40), (32, 10)])
def test_concurrent_clients(server, inputs, references, clients, per_client):
    """Serve under closed-loop load and opbridge.session run from as many threads: no errors, and
    every answer equal to the threaded baseline's (and to the references)."""
    session = opbridge.session(server.model)
    baseline = load.closed_loop(load.session_client(session), inputs, clients, per_client)
    served = load.closed_loop(lambda: load.HttpClient(server.url, CLIENT_TIMEOUT), inputs, clients, per_client)
    for result in (baseline, served):
        assert not result.errors, result.errors[0].error
        assert len(result.records) == clients * per_client
    assert len({r.replica for r in served.records}) == 2
    assert [r.index for r in baseline.records] == [r.index for r in served.records]
    mismatches = served.mismatches([r.outputs for r in baseline.records])
    assert not mismatches, "Serve's answers differ from the baseline's:\n" + "\n".join(mismatches[:10])
    assert_matches(served.records + baseline.records, references, inputs)


def test_replica_killed_under_load(server, inputs, references):
    """SIGKILL one replica's process under 8 clients: requests fail cleanly or are served by the
    other replica, none waits out its timeout, and Serve starts a replacement that answers."""
    fault = load.kill_replica_under_load(server.url, inputs, clients=8, per_client=40, kill_after=80,
                                         recovery_timeout=90, client_timeout=CLIENT_TIMEOUT)
    everything = fault.before + fault.load.records + fault.recovery
    hung = [r for r in everything if (r.error and "timed out" in r.error.lower()) or r.latency >= CLIENT_TIMEOUT]
    assert not hung, f"{len(hung)} requests hung, e.g. {hung[0]}"
    # A request the dead replica held fails as a server error, or its connection drops; nothing else.
    odd = [r.error for r in everything if r.error and not r.error.startswith(FAILED_CLEANLY)]
    assert not odd, f"{len(odd)} requests failed otherwise, e.g. {odd[0]}"
    assert len(fault.load.records) == 8 * 40
    assert fault.load.ok, "no request succeeded while one replica died"
    with pytest.raises(ProcessLookupError):
        os.kill(fault.killed_pid, 0)  # it is dead (Ray reaped it), not merely unreachable
    assert fault.replaced_in is not None, f"no new replica answered; last: {fault.recovery[-3:]}"
    assert len(fault.replicas_after) == 2 and fault.killed_replica not in fault.replicas_after, fault.replicas_after
    assert fault.recovery[-1].error is None
    assert_matches(everything, references, inputs)
