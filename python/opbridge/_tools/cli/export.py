"""`opbridge export`: a user's PyTorch model exported with opbridge's rules, then summarised."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Sequence

from ._common import (
    DTYPES,
    DynamicArg,
    InputArg,
    build_model,
    dynamic_arg,
    factory_arg,
    file_kind,
    input_arg,
    load_libraries,
    no_duplicate_names,
    opbridge_api,
    positive_int,
    progress,
    random_tensor,
    read_model,
)
from ._errors import CliError, UsageError

NEEDS_TORCH = True
HELP = "export a PyTorch model with opbridge's rules"
DESCRIPTION = ("Imports MODULE (a dotted module or path/to/file.py), calls FACTORY() for a torch.nn.Module, "
               "exports it on random example inputs with opbridge.export (which runs the ONNX checker) and "
               "prints a summary. Example data: normal floats, integers in [0, 10), random booleans.")
EPILOG = """example:
  opbridge export my_models.py:Block -o block.onnx --input x=4x8:float32 --input y=4x8:float32 \\
      --dynamic x:0:batch --dynamic y:0:batch
  opbridge export my_pkg.models:make_model -o m.onnx --input img=1x3x224x224:float32 \\
      --exporter torchscript --opset 17
"""


def add_arguments(c) -> None:
    c.add_argument("factory", type=factory_arg, metavar="MODULE:FACTORY")
    c.add_argument("-o", "--output", required=True, metavar="MODEL.onnx")
    c.add_argument("--input", type=input_arg, action="append", metavar="NAME=SHAPE:DTYPE",
                   help="one per forward argument, in order; SHAPE like 1x3x224x224, DTYPE one of "
                        + ", ".join(DTYPES))
    c.add_argument("--dynamic", type=dynamic_arg, action="append", metavar="NAME:AXIS[:DIM]",
                   help="keep this axis symbolic; axes with the same DIM name share a size")
    c.add_argument("--output-name", action="append", metavar="NAME", help="name the outputs, in order")
    c.add_argument("--opset", type=positive_int, help="ai.onnx opset (dynamo: 18 or newer)")
    c.add_argument("--exporter", choices=("dynamo", "torchscript"), default="dynamo",
                   help="PyTorch exporter (default dynamo)")
    c.add_argument("--seed", type=int, default=0, help="seed of the example inputs (default 0)")
    target = c.add_mutually_exclusive_group()
    target.add_argument("--custom-nodes", action="store_true",
                        help="keep opbridge's own nodes where a standard op could be written (for runtimes without it)")
    target.add_argument("--portable", action="store_true",
                        help="standard ops even where they run much slower in ONNX Runtime than opbridge's kernels "
                             "(a model that needs no opbridge library for them)")
    c.add_argument("--no-check-runtime", action="store_true",
                   help="do not refuse a model the installed ONNX Runtime cannot run (exporting for another runtime)")
    c.add_argument("--no-prove-dynamic", action="store_true",
                   help="do not prove the --dynamic axes at a second size (eager against ONNX Runtime); at your risk")
    c.add_argument("--allow-unused-inputs", action="store_true",
                   help="warn, instead of refusing, when the exported graph does not read an --input")
    c.add_argument("--no-optimize", action="store_true",
                   help="write the graph as the exporter makes it: no constant folding or rewrite rules")


def _dynamic_axes(inputs: Sequence[InputArg], dynamic: Sequence[DynamicArg]) -> dict[str, dict[int, str]] | None:
    by_name = {s.name: s for s in inputs}
    axes: dict[str, dict[int, str]] = {}
    for d in dynamic or ():
        spec = by_name.get(d.name)
        if spec is None:
            raise UsageError(f"--dynamic {d.name}:{d.axis}: no --input named '{d.name}' "
                             f"(inputs: {', '.join(by_name) or 'none'})")
        rank = len(spec.shape)
        if not -rank <= d.axis < rank:
            raise UsageError(f"--dynamic {d.name}:{d.axis}: input '{d.name}' has rank {rank}")
        axis = d.axis % rank
        axes.setdefault(d.name, {})[axis] = d.dim or f"{d.name}_dim{axis}"
    return axes or None


def summarize(path: Path, exporter: str | None = None) -> None:
    from ..._runtime import inspect as I

    model = read_model(str(path))
    report = I.analyze(model, str(path))
    by_domain: dict[str, int] = {}
    for u in report.ops:
        key = I.domain_name(u.domain)
        by_domain[key] = by_domain.get(key, 0) + u.count
    if exporter:
        print(f"exporter   {exporter}")
    print("opsets     " + ", ".join(f"{I.domain_name(d)} {v}" for d, v in report.opsets.items()))
    for title, values in (("inputs", report.inputs), ("outputs", report.outputs)):
        width = max((len(v.name) for v in values), default=0)
        for k, v in enumerate(values):
            print(f"{title if k == 0 else '':<10} {v.name:<{width}}  {v.describe()}")
    print("ops        " + (", ".join(f"{d} {n}" for d, n in sorted(by_domain.items())) or "none")
          + f" ({sum(by_domain.values())} nodes)")
    size = path.stat().st_size
    print(f"file       {path} ({size / 1e6:.2f} MB)" if size >= 1e5 else f"file       {path} ({size} bytes)")
    missing = report.missing
    print("runtime    " + (f"every op has a runtime ({report.runtime} with the opbridge libraries)" if not missing
                           else f"{len(missing)} MISSING: run 'opbridge inspect {path}'"))


def _output_path(output: str) -> Path:
    """-o as a Path the export can write: a new file, or a regular file it replaces."""
    out = Path(output)
    kind = file_kind(out)
    if kind:
        raise CliError(f"-o {output} is {kind}: give the path of the .onnx file to write"
                       + (f" (e.g. {out / 'model.onnx'})" if kind == "a directory" else ""))
    folder = out.parent
    folder_kind = file_kind(folder)
    if folder_kind == "":
        raise CliError(f"-o {output}: folder {folder} does not exist")
    if folder_kind != "a directory":
        raise CliError(f"-o {output}: {folder} is {folder_kind or 'a regular file'}, not a folder")
    if not os.access(folder, os.W_OK):
        raise CliError(f"-o {output}: folder {folder} is not writable")
    return out


def run(args) -> int:
    if not args.input:
        raise UsageError("give the model's example inputs with --input NAME=SHAPE:DTYPE (one per forward argument)")
    no_duplicate_names(args.input)
    dynamic_axes = _dynamic_axes(args.input, args.dynamic)
    out = _output_path(args.output)  # before the export, which can take minutes
    load_libraries(args.library, args.jit)
    ob = opbridge_api()
    model = build_model(args.factory)
    example = tuple(random_tensor(s, args.seed + k) for k, s in enumerate(args.input))
    progress(f"exporting with the {args.exporter} exporter"
             + (f" (opset {args.opset})" if args.opset else "") + ", then the ONNX checker")
    proven = _Said()
    logging.getLogger("opbridge").addHandler(proven)
    logging.getLogger("opbridge").setLevel(logging.INFO)  # this command is the application: it shows what was proven
    try:
        ob.export(model, example, out, exporter=args.exporter, opset=args.opset,
                  input_names=[s.name for s in args.input], output_names=args.output_name or None,
                  dynamic_axes=dynamic_axes, custom_nodes=args.custom_nodes, portable=args.portable,
                  check_runtime=not args.no_check_runtime, optimize=not args.no_optimize, verbose=args.verbose,
                  prove_dynamic=not args.no_prove_dynamic, allow_unused_inputs=args.allow_unused_inputs)
    finally:
        logging.getLogger("opbridge").removeHandler(proven)
    progress(f"wrote {out}")
    summarize(out, args.exporter)
    for line in proven.lines:
        print(f"dynamic    {line.split(': ', 1)[-1]}")
    return 0


class _Said(logging.Handler):
    """What opbridge.export says at INFO on this thread (the second-size proof's sizes)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.thread = threading.get_ident()

    def emit(self, record):
        if record.thread == self.thread and record.levelno >= logging.INFO:
            self.lines.append(record.getMessage())
