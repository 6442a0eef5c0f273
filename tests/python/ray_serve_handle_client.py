"""A second Ray driver for test_ray_serve.py: it joins the cluster that examples/ray_serve.py
started and calls the app through a DeploymentHandle, as another Ray program would.

    python ray_serve_handle_client.py GCS_ADDRESS APP INPUTS.npz OUTPUTS.npz

INPUTS.npz holds x<k>, y<k> for k = 0..n-1. Every input is sent once, then more (cycling) until
two replicas have answered or 60 seconds have passed. OUTPUTS.npz gets out0_<i>, out1_<i> of
request i; stdout gets one JSON object: {"requests": [{"input", "replica", "pid", "torch_loaded"}]}.
"""

import json
import sys
import time

import numpy as np
import ray
from ray import serve


def main(gcs: str, app: str, inputs_path: str, outputs_path: str) -> int:
    with np.load(inputs_path) as f:
        inputs = [{"x": f[f"x{k}"], "y": f[f"y{k}"]} for k in range(len(f.files) // 2)]
    ray.init(address=gcs, log_to_driver=False)
    try:
        handle = serve.get_app_handle(app)
        requests, outputs, deadline = [], {}, time.monotonic() + 60
        while len(requests) < len(inputs) or (len({r["replica"] for r in requests}) < 2
                                              and time.monotonic() < deadline):
            k = len(requests) % len(inputs)
            answer = handle.infer.remote(inputs[k]).result(timeout_s=30)
            for name, value in answer["outputs"].items():
                outputs[f"{name}_{len(requests)}"] = value
            requests.append({"input": k, "replica": answer["replica"], "pid": answer["pid"],
                             "torch_loaded": answer["torch_loaded"]})
    finally:
        ray.shutdown()
    np.savez(outputs_path, **outputs)
    json.dump({"requests": requests}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
