"""`opbridge inspect`: which ops a model needs and who runs each, as a report or as JSON."""

from __future__ import annotations

import json
import os
import shutil
import textwrap

from ._common import load_libraries, opbridge_api, progress, read_model, table
from ._errors import CliError

NEEDS_TORCH = False
HELP = "which ops a model needs and whether ONNX Runtime (or OpenVINO) runs it"
DESCRIPTION = ("Every op the model uses (main graph, subgraphs, model-local functions) with the opset in "
               "effect, the count and who runs it in the runtime (--runtime: onnxruntime, the default, or "
               "openvino); the model's IR version, opsets, inputs and outputs. Exit status 1 when anything "
               "is MISSING.")
EPILOG = """statuses:
  onnxruntime             a CPU kernel of the installed ONNX Runtime (its kernel registry, the node's
                          opset version and input types)
  onnxruntime (function)  no kernel: ONNX Runtime expands the op's ONNX function body
  opbridge                a custom op of a loaded opbridge library
  model function          a function defined in the model
  openvino                (--runtime openvino) read by OpenVINO's own ONNX frontend
  opbridge (own node)     (--runtime openvino) a standard op OpenVINO cannot read, read as the
                          opbridge op's own node (the op's export rule read backwards)
  MISSING                 nothing runs it; the advice says what to do (exit status 1)

example:
  opbridge inspect model.onnx
  opbridge inspect model.onnx --json --library build/libmy_ops_torch.so
  opbridge inspect model.onnx --runtime openvino --session
"""


def add_arguments(c) -> None:
    c.add_argument("model", metavar="MODEL.onnx")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.add_argument("--runtime", choices=("onnxruntime", "openvino"), default="onnxruntime",
                   help="the runtime to judge the model for (default onnxruntime)")
    c.add_argument("--session", action="store_true",
                   help="also create an ONNX Runtime session (catches kernels that refuse an attribute value); "
                        "with --runtime openvino, compile the model with OpenVINO for the CPU")


def _wrap(text: str, indent: str) -> str:
    width = max(60, min(shutil.get_terminal_size((110, 20)).columns, 130))
    return textwrap.fill(text, width=width, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False, break_long_words=False)


def print_report(report, session_result: str | None) -> None:
    from ..._runtime import inspect as I

    print(f"model      {report.path}")
    print(f"format     IR version {report.ir_version}" + (f", producer {report.producer}" if report.producer else ""))
    print("opsets     " + (", ".join(f"{I.domain_name(d)} {v}" for d, v in report.opsets.items()) or "(none)"))
    libs = ", ".join(f"{lib['name']} ({lib['onnx_domain']}{_openvino_side(lib)})" for lib in report.libraries) or "none"
    print(f"runtime    {report.runtime}; opbridge libraries: {libs}")
    for title, values in (("inputs", report.inputs), ("outputs", report.outputs)):
        width = max((len(v.name) for v in values), default=0)
        for k, v in enumerate(values):
            print(f"{title if k == 0 else '':<10} {v.name:<{width}}  {v.describe()}")
        if not values:
            print(f"{title:<10} (none)")
    print(f"weights    {report.initializers} initializers")
    if report.functions:
        fs = [f"{f['domain']}::{f['name']}{'(' + f['overload'] + ')' if f['overload'] else ''} "
              f"({f['nodes']} nodes{'' if f['used'] else ', unused'})" for f in report.functions]
        print("functions  " + ", ".join(fs))
    print()
    rows = []
    for u in report.ops:
        where = [w for w in u.where if w != "graph"]
        note = u.verdict.detail if not u.verdict.missing else "see below"
        if where:
            note = (note + "; " if note else "") + "in " + ", ".join(where)
        rows.append([I.domain_name(u.domain), u.op_type, "-" if u.opset is None else str(u.opset), str(u.count),
                     u.verdict.status, note])
    if rows:
        print("\n".join(table(rows, ["domain", "op", "opset", "count", "status", "provided by"])))
    else:
        print("(the graph has no nodes)")
    for note in report.notes:
        print("\n" + _wrap(f"note: {note}", ""))
    missing = report.missing
    if missing:
        print(f"\nMISSING ({len(missing)}):")
        for m in missing:
            if isinstance(m, I.OpUse):
                print(_wrap(f"{I.domain_name(m.domain)}::{m.op_type} (opset {m.opset}, {m.count} "
                            f"node{'s' if m.count != 1 else ''}): {m.verdict.advice}", "  "))
            else:
                print(_wrap(f"{m.detail}: {m.advice}", "  "))
    runtime = report.runtime.split(" (")[0]
    if session_result is not None:
        done = "OpenVINO compiled the model for the CPU" if runtime.startswith("openvino") else \
            "ONNX Runtime created a session for the model"
        print("\n" + _wrap(f"session: {session_result or done}", ""))
    if report.ok and not session_result:
        print(f"\nOK: {runtime} can run every op of this model"
              + (" (with the opbridge libraries registered)" if any(u.verdict.status == I.OPBRIDGE for u in report.ops)
                 else ""))
    elif report.ok:
        print(f"\nFAIL: every op has a runtime, but {runtime} refused to "
              f"{'compile the model' if runtime.startswith('openvino') else 'create a session'} (see above)")
    else:
        print(f"\nFAIL: {runtime} cannot run this model: {len(missing)} problem{'s' if len(missing) != 1 else ''}")


def _openvino_side(lib: dict) -> str:
    """For OpenVINO's report: the library's OpenVINO side and how many ops it converts."""
    if "openvino_library" not in lib:
        return ""
    if lib["openvino_library"] is None:
        return "; no OpenVINO side"
    return f"; {os.path.basename(lib['openvino_library'])}, {len(lib['openvino_ops'])} ops"


def session_check(path: str, runtime: str = "onnxruntime") -> str:
    """Creates a real session of the runtime (opbridge libraries registered; OpenVINO: compiles
    the model for the CPU): "" or the refusal. Catches what a static check cannot (e.g. a kernel
    that rejects an attribute value, an op's check on static shapes)."""
    from ..._runtime import inspect as I

    ob = opbridge_api()
    try:
        if runtime == "openvino":
            ob.session(path, runtime="openvino")
            return ""
        so = ob.session_options()
        so.log_severity_level = 3
        ob.session(path, options=so)
    except Exception as e:  # noqa: BLE001 - the refusal is the answer
        return I.clean_ort_message(str(e))
    return ""


def run(args) -> int:
    load_libraries(args.library, args.jit)
    from ..._runtime import inspect as I

    model = read_model(args.model)
    progress(f"inspecting {args.model}")
    try:
        report = I.analyze(model, args.model, runtime=args.runtime)
    except opbridge_api().OpbridgeError as e:  # OpenVINO is not installed
        raise CliError(str(e)) from e
    session_result = None
    if args.session:
        progress("compiling the model with OpenVINO" if args.runtime == "openvino" else
                 "creating an ONNX Runtime session")
        session_result = session_check(args.model, args.runtime)
    if args.json:
        out = report.to_json()
        if args.session:
            out["session"] = {"ok": not session_result, "error": session_result or None}
            out["runnable"] = out["runnable"] and not session_result
        print(json.dumps(out, indent=2))
    else:
        print_report(report, session_result)
    return 0 if report.ok and not session_result else 1
