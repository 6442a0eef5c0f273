"""`opbridge triton`: a Triton Inference Server model repository entry for an ONNX model, with
the op libraries its custom ops need."""

from __future__ import annotations

import argparse
from pathlib import Path, PurePosixPath

from ._common import load_libraries, opbridge_api, positive_int, progress, read_model, table
from ._errors import CliError, UsageError

NEEDS_TORCH = False
MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"  # the python backend's stand-in for the model's folder
HELP = "write a Triton Inference Server model repository for a model"
DESCRIPTION = ("Writes DIR/NAME/config.pbtxt (platform onnxruntime_onnx), DIR/NAME/1/model.onnx "
               "and the ONNX Runtime op libraries the model's custom ops need (found as 'inspect' finds them, "
               "copied beside config.pbtxt and named in model_operations). Inputs and outputs are those ONNX "
               "Runtime reports for the model, -1 for a dynamic axis. Nothing is written when an op has no "
               "runtime. --backend python writes a python-backend model instead: the same files plus "
               "DIR/NAME/1/model.py, which runs the model with ONNX Runtime and the op libraries beside it.")
EPILOG = """batching: when the first axis is dynamic on every input and output, the model batches
(max_batch_size, default 4, dims without that axis, dynamic batching); otherwise max_batch_size is
0 and dims are the full shapes. --max-batch-size 0 turns batching off.

op libraries: ONNX Runtime opens op_library_filename as written (dlopen, not relative to the model's
folder), so the path is absolute: the repository's own path here, or --server-repository where the
server sees it (e.g. /models in a container). The python backend's model.py finds them beside
config.pbtxt instead (parameter op_libraries), and needs numpy and onnxruntime in the stub's
Python environment: --python-env PATH names one (EXECUTION_ENV_PATH, a folder or a conda-pack
archive, as the server sees it).

example:
  opbridge triton block.onnx --repository models
  opbridge triton block.onnx --repository models --name block --instances 2 --server-repository /models
  opbridge triton block.onnx --repository models --backend python --python-env /opt/envs/ort
"""


def non_negative_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {v}")
    return v


def add_arguments(c) -> None:
    c.add_argument("model", metavar="MODEL.onnx")
    c.add_argument("--repository", required=True, metavar="DIR", help="the model repository (created if needed)")
    c.add_argument("--name", metavar="NAME", help="the model's name and folder (default: the file name without .onnx)")
    c.add_argument("--max-batch-size", type=non_negative_int, metavar="N",
                   help="largest batch (default 4 when the model can batch, else 0; 0 turns batching off)")
    c.add_argument("--instances", type=positive_int, default=1, metavar="N",
                   help="model instances on the CPU (instance_group count, default 1)")
    c.add_argument("--server-repository", metavar="PATH",
                   help="the repository's absolute path on the server, for op_library_filename "
                        "(default: the absolute path of --repository)")
    c.add_argument("--backend", choices=("onnxruntime", "python"), default="onnxruntime",
                   help="Triton's ONNX Runtime backend (default), or its python backend running ONNX Runtime from "
                        "a model.py")
    c.add_argument("--python-env", metavar="PATH",
                   help="with --backend python: the stub's Python environment as the server sees it (a folder "
                        "or a conda-pack .tar.gz with numpy and onnxruntime; absolute, or under "
                        "$$TRITON_MODEL_DIRECTORY), written as EXECUTION_ENV_PATH")
    c.add_argument("--force", action="store_true", help="replace a different model folder of the same name")


def _session(path: str):
    from ..._runtime import inspect as I

    ob = opbridge_api()
    so = ob.session_options()
    so.log_severity_level = 3
    try:
        return ob.session(path, options=so)
    except Exception as e:  # noqa: BLE001 - the refusal is the message
        raise CliError(f"ONNX Runtime cannot create a session for {path}: {I.clean_ort_message(str(e))}") from None


def _shape(shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _check_backend_options(args) -> None:
    if args.backend == "python":
        if args.server_repository:
            raise UsageError("--server-repository is for the onnxruntime backend (absolute op library paths); the "
                             "python backend's model.py finds the op libraries beside config.pbtxt")
        env = args.python_env
        if env is not None and not (PurePosixPath(env).is_absolute() or env.startswith(MODEL_DIRECTORY)):
            raise UsageError(f"--python-env {env}: give an absolute path as the server sees it, or one under "
                             f"{MODEL_DIRECTORY} (the model's folder); the server resolves others against its "
                             "working directory")
    elif args.python_env is not None:
        raise UsageError("--python-env is for --backend python: the onnxruntime backend runs no Python (give "
                         "--backend python to serve the model from a model.py)")


def run(args) -> int:
    _check_backend_options(args)
    repository = Path(args.repository)
    served = PurePosixPath(args.server_repository or repository.resolve())
    if not served.is_absolute():
        raise UsageError(f"--server-repository {args.server_repository}: give an absolute path (ONNX Runtime opens "
                         "op libraries relative to the server's working directory, not the model's folder)")
    load_libraries(args.library, args.jit)
    from ..._runtime import inspect as I
    from .. import triton as T

    model = read_model(args.model)
    progress(f"inspecting {args.model}")
    report = I.analyze(model, args.model)
    problem = T.missing_problem(report)
    if problem:
        raise CliError(problem + "; nothing was written")
    progress("creating an ONNX Runtime session (its inputs and outputs are what Triton's backend checks)")
    sess = _session(args.model)
    try:
        plan = T.plan(Path(args.model), model, report, sess, name=args.name, max_batch_size=args.max_batch_size,
                      instances=args.instances, served_repository=served, backend=args.backend,
                      python_env=args.python_env)
        progress(f"writing {repository / plan.name}")
        status = T.write(plan, repository, force=args.force)
    except T.TritonError as e:
        raise CliError(str(e)) from None

    target = repository / plan.name
    print({"written": f"wrote {target}", "replaced": f"replaced {target}",
           "unchanged": f"{target} is up to date (the same files are there already)"}[status])
    batching = (f"max_batch_size {plan.max_batch_size}, dynamic batching" if plan.max_batch_size
                else "max_batch_size 0 (no batching)")
    python = plan.backend == "python"
    files = [[T.CONFIG_FILE, f"{'backend python' if python else 'platform ' + T.PLATFORM}, {batching}, "
              f"{plan.instances} instance{'s' if plan.instances != 1 else ''} (KIND_CPU)"],
             [f"{T.VERSION}/{T.MODEL_FILE}", f"{args.model} ({Path(args.model).stat().st_size} bytes)"
              + (f" + {len(plan.external)} external-data files" if plan.external else "")]]
    if python:
        files.append([f"{T.VERSION}/model.py", f"runs {T.MODEL_FILE} with ONNX Runtime (the stub needs numpy and "
                      "onnxruntime)"])
    files += [[lib.path.name, f"op library '{lib.name}' for {', '.join(lib.ops)}"] for lib in plan.libraries]
    width = max(len(f) for f, _ in files)
    print("\n".join(f"  {f:<{width}}  {what}" for f, what in files))
    rows = [[kind if k == 0 else "", t.name, t.data_type, "[" + ", ".join(map(str, t.dims)) + "]"
             + (" (reshape [])" if t.scalar_item else ""), _shape(t.shape)]
            for kind, tensors in (("inputs", plan.inputs), ("outputs", plan.outputs)) for k, t in enumerate(tensors)]
    print("\n".join("  " + ln for ln in table(rows, ["", "name", "data_type", "dims", "model shape"])))
    if python:
        if plan.libraries:
            print(f"op_libraries         {':'.join(lib.path.name for lib in plan.libraries)} (beside config.pbtxt)")
        print(f"EXECUTION_ENV_PATH   {plan.python_env or '(not set: the stub runs the Python it was built for)'}")
        served = repository.resolve()
    else:
        for lib in plan.libraries:
            print(f"op_library_filename  {plan.library_path(lib)}")
    print(f"serve                tritonserver --model-repository={served}")
    return 0
