"""A real Triton Inference Server for the tests and the load figures: tritonserver 2.51 as PyPI's
nvidia-pytriton 0.7.0 bundles it (CPU, python backend only), in an environment of envs.py with the
tritonclient package for the clients, and a second one (numpy < 2, the pinned onnxruntime) that
the models' stubs run in (their EXECUTION_ENV_PATH).

What the bundle needs to start, as the pytriton package itself prepares it: the python backend's
stub for this Python version in backends/python/, and nvidia_pytriton.libs (the server's shared
libraries) and this Python's libpython on LD_LIBRARY_PATH. The stub ignores PYTHONPATH: a model
finds numpy and onnxruntime through the environment its configuration names.

The control plane (health, load, unload, repository index) is Triton's HTTP API over urllib, so
the test process needs no client package; inference goes through tritonclient in the server's
environment (serving_load.py's client).
"""

from __future__ import annotations

import filecmp
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

import envs
from serving_load import free_ports  # bench/serving_load.py, on the path the tests set

TRITON = "2.51.0"  # the server nvidia-pytriton 0.7.0 bundles; the client of the same release
SERVER_REQUIREMENTS = ["nvidia-pytriton==0.7.0", f"tritonclient[http,grpc]=={TRITON}"]
# The stub is built against numpy 1; onnxruntime is the version the project pins (its wheels from
# 1.19 on run with numpy 1 too), so the served outputs can be compared bit for bit.
MODEL_ENV_REQUIREMENTS = [f"onnxruntime=={envs.pinned('onnxruntime')}", "numpy<2"]
STUB = "triton_python_backend_stub"


def server_python() -> Path:
    return envs.python_with(f"tritonserver-{TRITON}", SERVER_REQUIREMENTS)


def model_env() -> Path:
    """The folder of the stubs' environment (a venv: its bin/activate is what the backend sources)."""
    return envs.python_with(f"triton-python-backend-onnxruntime-{envs.pinned('onnxruntime')}",
                            MODEL_ENV_REQUIREMENTS).parent.parent


def server_tree(python: Path) -> Path:
    """The bundled server (bin/, backends/) with this Python's stub in place (copied once, and
    again only when it differs)."""
    site = next((python.parent.parent / "lib").glob("python*/site-packages"))
    tree = site / "pytriton" / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub, placed = tree / "python_backend_stubs" / version / STUB, tree / "backends" / "python" / STUB
    if not stub.is_file():
        raise AssertionError(f"nvidia-pytriton has no python backend stub for Python {version} ({stub})")
    if not placed.is_file() or not filecmp.cmp(stub, placed, shallow=False):
        tmp = placed.with_name(f"{STUB}.tmp{os.getpid()}")
        shutil.copy2(stub, tmp)
        tmp.rename(placed)
    return tree


class Server:
    """tritonserver on free ports over `repository`, models loaded on request (explicit model
    control), its log in `log`. A context manager: the server's process group is killed on exit."""

    def __init__(self, repository: Path, log: Path, *, start_timeout: float = 60.0):
        self.python = server_python()
        self.tree = server_tree(self.python)
        self.repository, self.log = repository, log
        self.output = log.with_name(log.name + ".out")  # what else it prints
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
        self.start_timeout = start_timeout
        self.process: subprocess.Popen | None = None

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def __enter__(self) -> "Server":
        libs = [str(self.tree.parent.parent / "nvidia_pytriton.libs"), sysconfig.get_config_var("LIBDIR")]
        env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(libs + [os.environ.get("LD_LIBRARY_PATH", "")]))
        # --log-file: the server's own log, written line by line (its stdout is block-buffered).
        cmd = [str(self.tree / "bin" / "tritonserver"), f"--model-repository={self.repository}",
               f"--backend-directory={self.tree / 'backends'}", f"--http-port={self.http_port}",
               f"--grpc-port={self.grpc_port}", f"--metrics-port={self.metrics_port}",
               "--model-control-mode=explicit", "--exit-timeout-secs=2", f"--log-file={self.log}"]
        with open(self.output, "wb") as out:
            # Its own process group: the stubs it starts go with it at the end.
            self.process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
        try:
            self.wait(lambda: self.get("/v2/health/live")[0] == 200, self.start_timeout, "the server to start")
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # whatever of its group is left: the server, stubs
        except ProcessLookupError:
            pass
        self.process.wait(timeout=15)

    def log_tail(self, lines: int = 40) -> str:
        tails = []
        for path in (self.log, self.output):
            text = path.read_text(errors="replace") if path.exists() else ""
            kept = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(("+-", "| "))]  # not tables
            tails.append(f"--- {path.name}:\n" + "\n".join(kept[-lines:]))
        return "\n".join(tails)

    def wait(self, ready, timeout: float, what: str) -> None:
        """Polls ready() until true; fails with the log's tail after `timeout` seconds or when the
        server has exited."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"tritonserver exited ({self.process.returncode}) waiting for {what}:\n"
                                     f"{self.log_tail()}")
            if ready():
                return
            time.sleep(0.2)
        raise AssertionError(f"waited {timeout:.0f} s for {what}:\n{self.log_tail()}")

    # --- Triton's HTTP API ---------------------------------------------------------------------

    def request(self, method: str, path: str, body: dict | None = None, timeout: float = 120.0) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://{self.http_url}{path}", data=data, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                text = r.read()
                return r.status, json.loads(text) if text else {}
        except urllib.error.HTTPError as e:
            text = e.read()
            return e.code, json.loads(text) if text else {}
        except OSError:  # not listening (yet)
            return 0, {}

    def get(self, path: str) -> tuple[int, dict]:
        return self.request("GET", path, timeout=5.0)

    def load(self, model: str) -> tuple[int, str]:
        """Loads a model: (HTTP status, the server's error message or "")."""
        status, body = self.request("POST", f"/v2/repository/models/{model}/load", {})
        return status, body.get("error", "")

    def reload(self, model: str) -> tuple[int, str]:
        """Loads a loaded model afresh (new instances, new stubs), as load() does for a model whose
        folder changed: its folders' times are touched first. (A changed config.pbtxt alone is
        applied in place, and an unchanged model is left as it is.)"""
        folder = self.repository / model
        for d in (folder, *(p for p in folder.iterdir() if p.is_dir())):
            os.utime(d)
        return self.load(model)

    def unload(self, model: str, timeout: float = 60.0) -> None:
        """Unloads a model and waits until it is (the call returns while it is still unloading)."""
        status, body = self.request("POST", f"/v2/repository/models/{model}/unload", {})
        assert status == 200, body
        self.wait(lambda: self.index()[model]["state"] == "UNAVAILABLE", timeout, f"{model} to unload")

    def ready(self, model: str) -> bool:
        return self.get(f"/v2/models/{model}/ready")[0] == 200

    def output_names(self, model: str) -> list[str]:
        """The model's outputs as the server describes them (its metadata), in the model's order."""
        status, body = self.get(f"/v2/models/{model}")
        assert status == 200, body
        return [o["name"] for o in body["outputs"]]

    def index(self) -> dict[str, dict]:
        """The repository index: model name -> {"state": ..., "reason": ...}."""
        status, body = self.request("POST", "/v2/repository/index", {})
        assert status == 200, body
        return {m["name"]: m for m in body}

    def stubs(self, model: str) -> list[int]:
        """The process ids of the model's stub processes (one per instance), children of the server."""
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                ppid = int(re.search(rb"PPid:\s+(\d+)", (proc / "status").read_bytes()).group(1))
            except (OSError, AttributeError):  # gone meanwhile
                continue
            if ppid == self.process.pid and argv[0].endswith(STUB.encode()) and len(argv) > 1 and \
                    Path(argv[1].decode()).parent.parent.name == model:
                found.append(int(proc.name))
        return sorted(found)


CLIENT = Path(__file__).with_name("triton_client.py")


def set_parameter(model_dir: Path, key: str, value: str) -> None:
    """Adds a parameters { } entry to a model's config.pbtxt, as a user tuning it would."""
    config = model_dir / "config.pbtxt"
    entry = f'parameters {{\n  key: "{key}"\n  value: {{ string_value: "{value}" }}\n}}\n'
    config.write_text(config.read_text() + entry)


def load_run(protocol: str, clients: int, per_client: int, **fault) -> dict:
    """One run of run_client: `clients` closed-loop clients over "http" or "grpc", `per_client`
    requests each; fault: kill=PID, kill_after=N answers."""
    return {"name": f"{protocol} x{clients}", "protocol": protocol, "clients": clients, "per_client": per_client,
            **fault}


def run_client(server: Server, model: str, inputs: list[dict], expected: list[list], runs: list[dict],
               workdir: Path, *, request_timeout: float = 30.0, timeout: float = 300.0) -> list[dict]:
    """triton_client.py in the server's environment, sending `inputs` to `model` as `runs` say
    and checking each answer against `expected` (request i's outputs in the model's order, None
    where the reference refused its inputs): its report, one dict per run. `timeout` bounds the
    whole client, `request_timeout` each request."""
    workdir.mkdir(parents=True, exist_ok=True)
    arrays = {f"in{i}_{k}": v for i, feed in enumerate(inputs) for k, v in enumerate(feed.values())}
    arrays.update({f"out{i}_{k}": v for i, outs in enumerate(expected) for k, v in enumerate(outs or [])})
    np.savez(workdir / "job.npz", **arrays)
    job = {"model": model, "http": server.http_url, "grpc": server.grpc_url, "timeout": request_timeout,
           "inputs": list(inputs[0]), "outputs": server.output_names(model), "count": len(inputs),
           "data": str(workdir / "job.npz"), "runs": runs}
    (workdir / "job.json").write_text(json.dumps(job))
    r = subprocess.run([str(server.python), str(CLIENT), str(workdir / "job.json")], capture_output=True,
                       text=True, timeout=timeout, env=dict(os.environ, PYTHONPATH=""))
    assert r.returncode == 0, f"the client failed:\n{r.stdout}{r.stderr}\n--- server log:\n{server.log_tail()}"
    return json.loads(r.stdout.splitlines()[-1])
