"""Serving an opbridge model with Ray Serve: two replicas, each an ONNX Runtime session with
libopbridge_ort.so registered, answering over HTTP (JSON, or .npz bytes) and through a
DeploymentHandle.

    pip install "ray[serve]==2.60.0"       # beside torch, onnxruntime and opbridge
    python examples/ray_serve.py           # export, serve, a few requests checked against PyTorch
    python examples/ray_serve.py --serve   # ... then keep serving until stdin closes (Ctrl-D)

The driver (this process) exports demo.py's DemoModel (my_add, dual_residual, asinh) with
opbridge.export and hands the ONNX bytes and the op library's path to the replicas. A replica
imports numpy, onnxruntime and Ray alone: no PyTorch, no opbridge. On a cluster of several
machines the library must exist at that path on every node (ship it in the image), or point
`library` at where the nodes have it.

HTTP, with the app at http://127.0.0.1:8000/opbridge:

    curl -s localhost:8000/opbridge -H 'content-type: application/json' \\
         -d '{"inputs": {"x": [[1,2,3,4,5,6,7,8]], "y": [[0,0,0,0,0,0,0,1]]}}'
    -> {"replica": "9q7l7sr5", "pid": 3489, "torch_loaded": false, "outputs": {"out0": [[...]], "out1": [[...]]}}

JSON numbers carry float32 exactly (float32 -> float64 -> shortest repr -> back) but not NaN or
infinities; `content-type: application/octet-stream` takes an .npz of the inputs (np.savez) and
answers an .npz of the outputs, with the replica in the `x-opbridge-replica` and
`x-opbridge-pid` headers.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import sys
import tempfile
import urllib.request
from pathlib import Path

import numpy as np
import onnxruntime as ort
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

APP = "opbridge"
ROUTE = "/opbridge"
# ONNX Runtime's input type names -> numpy, for the inputs a request brings as JSON lists.
NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(int64)": np.int64,
               "tensor(int32)": np.int32, "tensor(bool)": np.bool_}


@serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 1})
class OpbridgeModel:
    """One ONNX Runtime session per replica, the opbridge op library registered."""

    def __init__(self, model: bytes, library: str, threads: int = 1):
        options = ort.SessionOptions()
        # One CPU per replica: a pool of one thread keeps replicas from contending for cores.
        options.intra_op_num_threads = threads
        options.register_custom_ops_library(library)
        self.session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        self.types = {i.name: NUMPY_TYPES.get(i.type) for i in self.session.get_inputs()}
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.pid = os.getpid()

    def infer(self, inputs: dict[str, np.ndarray]) -> dict:
        """For DeploymentHandle callers: named arrays in, named arrays out, and who answered
        (torch_loaded: whether anything imported PyTorch into this replica)."""
        missing = sorted(set(self.types) - set(inputs))
        if missing:
            raise ValueError(f"missing inputs {missing}; the model takes {sorted(self.types)}")
        results = self.session.run(self.outputs, {name: inputs[name] for name in self.types})
        return {"replica": self.replica, "pid": self.pid, "torch_loaded": "torch" in sys.modules,
                "outputs": dict(zip(self.outputs, results))}

    async def __call__(self, request: Request) -> Response:
        binary = request.headers.get("content-type", "").startswith("application/octet-stream")
        try:
            if binary:
                with np.load(io.BytesIO(await request.body()), allow_pickle=False) as npz:
                    inputs = {name: npz[name] for name in npz.files}
            else:
                given = (await request.json())["inputs"]
                inputs = {name: np.asarray(given[name], dtype=self.types[name]) for name in self.types if name in given}
            # The run holds this replica's event loop; with one CPU per replica nothing could overlap it.
            result = self.infer(inputs)
        except Exception as e:  # a bad request, or the session's refusal: say why, with 400
            return JSONResponse({"error": f"{type(e).__name__}: {e}"}, status_code=400)
        if binary:
            out = io.BytesIO()
            np.savez(out, **result["outputs"])
            return Response(out.getvalue(), media_type="application/octet-stream",
                            headers={"x-opbridge-replica": self.replica, "x-opbridge-pid": str(self.pid)})
        return JSONResponse({**result, "outputs": {k: v.tolist() for k, v in result["outputs"].items()}})


# PyTorch and opbridge are imported inside the driver's functions, not at the top: a replica
# that imports this module (as `serve run module:app` makes it do) then loads neither.
def export_model(out_dir: Path) -> Path:
    """demo.py's DemoModel exported with a dynamic batch axis."""
    import opbridge
    from demo import DemoModel, example_inputs

    path = out_dir / "demo.onnx"
    opbridge.export(DemoModel().eval(), example_inputs(4), path, exporter="dynamo", input_names=["x", "y"],
                    output_names=["out0", "out1"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    return path


def op_library() -> str:
    """The path of libopbridge_ort.so, the ONNX Runtime side of opbridge's built-in op library."""
    import opbridge

    return str(next(lib.ort_path for lib in opbridge.libraries() if lib.name == "opbridge"))


def post_json(url: str, inputs: dict[str, np.ndarray], timeout: float = 30) -> dict:
    body = json.dumps({"inputs": {k: v.tolist() for k, v in inputs.items()}}).encode()
    req = urllib.request.Request(url, body, {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def post_npz(url: str, inputs: dict[str, np.ndarray], timeout: float = 30) -> dict:
    buf = io.BytesIO()
    np.savez(buf, **inputs)
    req = urllib.request.Request(url, buf.getvalue(), {"content-type": "application/octet-stream"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        with np.load(io.BytesIO(r.read()), allow_pickle=False) as npz:
            outputs = {name: npz[name] for name in npz.files}
        return {"replica": r.headers["x-opbridge-replica"], "pid": int(r.headers["x-opbridge-pid"]),
                "outputs": outputs}


def check_requests(url: str, handle, model_path: Path, requests: int) -> bool:
    """Requests over HTTP (JSON and .npz) and the handle, each compared with PyTorch eager
    (float tolerance) and with opbridge.session (bit for bit). True when all match."""
    import torch

    import opbridge
    from demo import DemoModel, example_inputs

    model, session, ok = DemoModel().eval(), opbridge.session(model_path), True
    for i in range(requests):
        x, y = example_inputs(1 + i % 7, seed=i)
        inputs = {"x": x.numpy(), "y": y.numpy()}
        with torch.no_grad():
            eager = [t.numpy() for t in model(x, y)]
        direct = session.run(["out0", "out1"], inputs)
        for how, answer in (("http json", post_json(url, inputs)), ("http npz", post_npz(url, inputs)),
                            ("handle", handle.infer.remote(inputs).result(timeout_s=30))):
            got = [np.asarray(answer["outputs"][name], dtype=np.float32) for name in ("out0", "out1")]
            diff = max(float(np.abs(g - e).max()) for g, e in zip(got, eager))
            same = all(np.array_equal(g, d) for g, d in zip(got, direct))
            ok &= same and all(np.allclose(g, e, rtol=1e-5, atol=1e-5) for g, e in zip(got, eager))
            print(f"request {i} batch {x.shape[0]} {how:<9} replica {answer['replica']} (pid {answer['pid']}): "
                  f"max |serve - eager| {diff:.2e}, {'==' if same else '!='} opbridge.session")
    return ok


def serve_and_check(args: argparse.Namespace, out: Path) -> int:
    import ray

    model_path = export_model(out)
    # SIGTERM ends the process through the finally below, so Serve and Ray shut down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    # Two CPUs: one per replica (the controller and the HTTP proxy ask for none).
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 2**20)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        handle = serve.run(OpbridgeModel.bind(model_path.read_bytes(), op_library()), name=APP, route_prefix=ROUTE)
        url = f"http://127.0.0.1:{args.port}{ROUTE}"
        ok = check_requests(url, handle, model_path, args.requests)
        print("check:", "every answer matches PyTorch eager and opbridge.session" if ok else "MISMATCH", flush=True)
        if args.serve:
            print(json.dumps({"url": url, "model": str(model_path), "gcs": ray.get_runtime_context().gcs_address,
                              "app": APP, "driver_pid": os.getpid()}), flush=True)
            sys.stdin.read()  # until EOF: the caller closes stdin to stop the server
        return 0 if ok else 1
    finally:
        serve.shutdown()
        ray.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8000, help="Serve's HTTP port (on 127.0.0.1)")
    parser.add_argument("--out", type=Path, help="where the ONNX model goes (default: a temporary folder)")
    parser.add_argument("--requests", type=int, default=4, help="checked requests per way of asking")
    parser.add_argument("--serve", action="store_true", help="keep serving after the check, until stdin closes")
    args = parser.parse_args()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        return serve_and_check(args, args.out)
    with tempfile.TemporaryDirectory(prefix="opbridge-serve-") as tmp:
        return serve_and_check(args, Path(tmp))


if __name__ == "__main__":
    sys.exit(main())
