"""`opbridge verify`: ONNX Runtime, or OpenVINO (with the opbridge libraries), against PyTorch
eager on the same inputs."""

from __future__ import annotations

from ..._library import kinds as _kinds
from ._common import (
    DTYPES,
    InputArg,
    build_model,
    factory_arg,
    input_arg,
    load_libraries,
    no_duplicate_names,
    opbridge_api,
    progress,
    random_tensor,
    read_model,
    regular_file,
    tolerance,
)
from ._errors import CliError, UsageError, one_line

NEEDS_TORCH = True
HELP = "compare ONNX Runtime (or OpenVINO) with PyTorch eager"
DESCRIPTION = ("Runs the PyTorch model (FACTORY() from MODULE) and the ONNX model in ONNX Runtime (or "
               "OpenVINO: --runtime openvino) with the opbridge libraries on the same inputs; prints the "
               "per-output difference. Exit status 1 on "
               "mismatch. Inputs: from an .npz (keys = the model's input names, or arr_0, arr_1, ...), from "
               "--input specs (random), or random from the model's static input shapes.")
EPILOG = """example:
  opbridge verify block.onnx --torch my_models.py:Block --input x=9x8:float32 --input y=9x8:float32
  opbridge verify block.onnx --torch my_models.py:Block --inputs batch.npz --rtol 1e-4 --atol 1e-5
  opbridge verify block.onnx --torch my_models.py:Block --runtime openvino
"""


def add_arguments(c) -> None:
    c.add_argument("model", metavar="MODEL.onnx")
    c.add_argument("--torch", required=True, type=factory_arg, metavar="MODULE:FACTORY")
    c.add_argument("--inputs", metavar="FILE.npz", help="input arrays by name")
    c.add_argument("--input", type=input_arg, action="append", metavar="NAME=SHAPE:DTYPE",
                   help="a random input of this shape and dtype (repeatable)")
    c.add_argument("--rtol", type=tolerance, default=1e-5, help="relative tolerance (default 1e-5)")
    c.add_argument("--atol", type=tolerance, default=1e-6, help="absolute tolerance (default 1e-6)")
    c.add_argument("--seed", type=int, default=0, help="seed of random inputs (default 0)")
    c.add_argument("--runtime", choices=("onnxruntime", "openvino"), default="onnxruntime",
                   help="the runtime to run the ONNX model in (default onnxruntime)")
    c.add_argument("--no-prove-dynamic", action="store_true",
                   help="do not also run the model's dynamic axes at a second size (derived from the inputs)")


def _verify_inputs(args, sess) -> list:
    import numpy as np
    import onnx
    import torch

    model_inputs = sess.get_inputs()
    names = [i.name for i in model_inputs]
    if args.inputs:
        path = regular_file(args.inputs, "--inputs ")
        try:
            with np.load(path, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
        except Exception as e:
            raise CliError(f"--inputs {args.inputs} is not a readable .npz file ({one_line(e)})") from e
        if all(n in arrays for n in names):
            keys = names
        elif all(f"arr_{k}" in arrays for k in range(len(names))):  # np.savez(f, a, b): positional
            keys = [f"arr_{k}" for k in range(len(names))]
        else:
            missing = [n for n in names if n not in arrays]
            raise CliError(f"--inputs {args.inputs} lacks {', '.join(repr(m) for m in missing)} (it has "
                           f"{', '.join(arrays) or 'no arrays'}; the model's inputs are {', '.join(names)})")
        # An array the model does not take is most likely a misnamed input: never dropped in silence.
        extra = [k for k in arrays if k not in keys]
        if extra:
            raise CliError(f"--inputs {args.inputs} has {', '.join(repr(k) for k in extra)}, which the model does "
                           f"not take (the model's inputs are {', '.join(names) or 'none'}"
                           + (f", given as {', '.join(keys)}" if keys != names else "") + ")")
        chosen = [arrays[k] for k in keys]
        tensors = []
        for i, a in zip(model_inputs, chosen):
            if a.dtype.kind not in "biuf":
                raise CliError(f"--inputs {args.inputs}: array '{i.name}' has dtype {a.dtype}, not a number or bool")
            tensors.append(torch.from_numpy(np.ascontiguousarray(a)))
        return tensors
    specs = {s.name: s for s in args.input or ()}
    unknown = [n for n in specs if n not in names]
    if unknown:
        raise UsageError(f"--input {unknown[0]}: the model has no input '{unknown[0]}' (its inputs: {', '.join(names)})")
    tensors = []
    proto_inputs = {i.name: i for i in read_model(args.model).graph.input}
    for k, i in enumerate(model_inputs):
        spec = specs.get(i.name)
        if spec is None:
            t = proto_inputs[i.name].type.tensor_type
            shape = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
            if not t.HasField("shape") or None in shape:
                raise UsageError(f"the model's input '{i.name}' has shape {i.shape}: give --input "
                                 f"{i.name}=SHAPE:DTYPE or --inputs FILE.npz")
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)).name
            if dtype not in DTYPES:
                raise UsageError(f"the model's input '{i.name}' is {dtype}: give it in --inputs FILE.npz")
            spec = InputArg(i.name, tuple(shape), dtype)
        tensors.append(random_tensor(spec, args.seed + k))
    return tensors


def _onnx_type(t) -> str | None:
    """'tensor(float)' for a torch tensor, as ONNX Runtime names its inputs' types."""
    try:
        return _kinds.dtype_of(t.dtype).onnx_type
    except KeyError:
        return None


def run(args) -> int:
    if args.inputs and args.input:
        raise UsageError("give either --inputs FILE.npz or --input NAME=SHAPE:DTYPE, not both")
    no_duplicate_names(args.input or ())
    load_libraries(args.library, args.jit)
    ob = opbridge_api()
    read_model(args.model)  # a clear error for a missing or malformed file
    from ..._runtime.session import RUNTIME_NAMES

    name = RUNTIME_NAMES[args.runtime]
    progress(f"creating an ONNX Runtime session for {args.model}" if args.runtime == "onnxruntime" else
             f"compiling {args.model} with OpenVINO")
    try:
        sess = ob.session(args.model, runtime=args.runtime)
    except Exception as e:
        from ..._runtime import inspect as I

        more = " --runtime openvino" if args.runtime == "openvino" else ""
        raise CliError(f"{name} cannot load {args.model}: {I.clean_ort_message(str(e))} "
                       f"(run 'opbridge inspect {args.model}{more}')") from e
    tensors = _verify_inputs(args, sess)
    for i, t in zip(sess.get_inputs(), tensors):
        given = _onnx_type(t)
        if given and i.type != given:
            raise CliError(f"input '{i.name}' is {i.type} in the model, the given data is {given}")
    model = build_model(args.torch)
    progress(f"running PyTorch eager and {name}")
    try:
        report = ob.verify(model, tuple(tensors), args.model, rtol=args.rtol, atol=args.atol, sess=sess,
                           prove_dynamic=not args.no_prove_dynamic)
    except ob.OpbridgeError:
        raise
    except Exception as e:
        from ..._runtime import inspect as I

        raise CliError(f"running the model failed: {I.clean_ort_message(one_line(e))}") from e
    print(f"{name} vs PyTorch eager (rtol {args.rtol:g}, atol {args.atol:g}), inputs: "
          + ", ".join(f"{i.name} {list(t.shape)} {str(t.dtype).replace('torch.', '')}"
                      for i, t in zip(sess.get_inputs(), tensors)))
    print(report.table())
    bad = [o.name for o in report.outputs if not o.ok]
    # Outputs random by declaration were held to their dtypes and shapes: the verdict says so.
    random = [o.name for o in report.outputs if o.random and o.ok]
    held = f" ({', '.join(random)}: shape and dtype only, random by declaration)" if random else ""
    print(f"\n{'PASS: every output matches' + held if not bad else 'FAIL: mismatch in ' + ', '.join(bad)}")
    return 0 if not bad else 1
