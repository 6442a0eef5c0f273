"""`opbridge graph`: a Graphviz drawing of the main graph, coloured by what inspect finds."""

from __future__ import annotations

import shutil
from pathlib import Path

from ._common import load_libraries, positive_int, progress, read_model
from ._errors import CliError, UsageError

NEEDS_TORCH = False
HELP = "draw the graph with Graphviz"
DESCRIPTION = ("Draws the main graph: op nodes coloured by the status 'inspect' computes, edges labelled "
               "with dtype and shape.")
EPILOG = """Custom nodes are coloured by status (opbridge blue, model function yellow, ONNX function
grey, MISSING red); edges carry dtype[shape] after ONNX shape inference; initializers are listed
inside their consumer's box. Above --max-nodes, runs of consecutive standard ONNX ops collapse
into one box each.

example:
  opbridge graph model.onnx -o model.svg
  opbridge graph big.onnx -o big.dot --max-nodes 150
"""


def add_arguments(c) -> None:
    c.add_argument("model", metavar="MODEL.onnx")
    c.add_argument("-o", "--output", required=True, metavar="OUT.svg|OUT.png|OUT.dot")
    c.add_argument("--max-nodes", type=positive_int, default=300, metavar="N",
                   help="collapse runs of standard ops above N nodes (default 300)")


def run(args) -> int:
    load_libraries(args.library, args.jit)
    from .. import graph as _graph
    from ..._runtime import inspect as I

    out = Path(args.output)
    fmt = out.suffix.lower().lstrip(".")
    if fmt not in ("svg", "png", "dot"):
        raise UsageError(f"-o {args.output}: the file name must end in .svg, .png or .dot")
    dot = None
    if fmt != "dot":
        dot = shutil.which("dot")
        if dot is None:
            raise CliError("Graphviz 'dot' is not installed (Debian: apt-get install graphviz); "
                           f"or write the DOT text with -o {out.with_suffix('.dot')}")
    model = read_model(args.model)
    progress(f"inspecting {args.model}")
    report = I.analyze(model, args.model)
    drawing = _graph.to_dot(report, max_nodes=args.max_nodes)
    if drawing.collapsed:
        progress(f"{drawing.op_nodes} nodes > --max-nodes {args.max_nodes}: collapsed {drawing.collapsed} runs of "
                 f"standard ops, {drawing.drawn_nodes} boxes drawn")
        if drawing.drawn_nodes > args.max_nodes:
            progress(f"still {drawing.drawn_nodes} boxes after collapsing: the drawing will be large")
    if fmt == "dot":
        out.write_text(drawing.text)
    else:
        progress(f"rendering with {dot}")
        try:
            _graph.render(drawing.text, out, fmt, dot)
        except _graph.GraphvizError as e:
            raise CliError(str(e))  # no cause: the message says it all (no --verbose hint)
    counts = ", ".join(f"{n} {s}" for s, n in sorted(drawing.status_counts.items()))
    print(f"wrote {out} ({drawing.drawn_nodes} boxes for {drawing.op_nodes} nodes: {counts or 'no nodes'})")
    return 0 if report.ok else 1
