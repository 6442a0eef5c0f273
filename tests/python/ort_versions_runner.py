"""Runs ONNX models with one ONNX Runtime and an opbridge op library, as a deployment would: in an
environment holding only onnxruntime and numpy (test_ort_versions.py makes one per runtime
version), registering the library through SessionOptions.register_custom_ops_library.

    python ort_versions_runner.py JOBS.json

JOBS.json: {"library": path, "jobs": [{"name", "model", "inputs": .npz, "outputs": .npz}, ...]}.
Each job's outputs are written to its "outputs" file; stdout gets one JSON object:
{"version": onnxruntime.__version__, "errors": {job name: ONNX Runtime's message, or null}}.
"""

import json
import sys

import numpy as np
import onnxruntime as ort


def run(library: str, job: dict) -> None:
    so = ort.SessionOptions()
    so.log_severity_level = 4  # refusals come back as exceptions; stderr is left for anything else
    so.register_custom_ops_library(library)
    sess = ort.InferenceSession(job["model"], so, providers=["CPUExecutionProvider"])
    with np.load(job["inputs"]) as feeds:
        outputs = sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})
    np.savez(job["outputs"], **{o.name: v for o, v in zip(sess.get_outputs(), outputs)})


def main(jobs_path: str) -> int:
    with open(jobs_path) as f:
        spec = json.load(f)
    errors = {}
    for job in spec["jobs"]:
        try:
            run(spec["library"], job)
            errors[job["name"]] = None
        except Exception as e:  # noqa: BLE001 - every refusal is a result to report
            errors[job["name"]] = str(e)
    json.dump({"version": ort.__version__, "errors": errors}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
