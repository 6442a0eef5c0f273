"""The `opbridge` command: which ops a model needs and whether ONNX Runtime runs it (inspect),
the loaded operators (ops), a drawing of the graph (graph), export of a user's model (export),
ONNX Runtime against PyTorch (verify) and a Triton Inference Server model repository (triton).

    opbridge ops [--json]
    opbridge inspect MODEL.onnx [--json] [--session]
    opbridge graph MODEL.onnx -o out.svg|out.png|out.dot [--max-nodes N]
    opbridge export MODULE:FACTORY -o model.onnx --input x=4x8:float32 [--dynamic x:0:batch]
    opbridge verify MODEL.onnx --torch MODULE:FACTORY [--inputs FILE.npz | --input x=2x8:float32]
    opbridge triton MODEL.onnx --repository DIR [--name NAME] [--max-batch-size N] [--instances N]
                    [--backend onnxruntime|python] [--python-env PATH]

Errors are one line (`opbridge: error: ...`), exit status 2 for usage errors and 1 for failures;
--verbose adds the traceback. Progress goes to stderr, results to stdout.

Layout: one module per command (ops, inspect, graph, export, verify, triton), _common for what
they share, _errors for the failures, _parser for the parser and main(). Commands import the
shared modules, the package's public API and the wings below (inspect, graph, triton), never each
other. A command that needs PyTorch says so (NEEDS_TORCH); main() loads it before running one, so
the others start without it (the `opbridge` launcher imports the package with PyTorch deferred).
"""

from ._errors import CliError, UsageError
from ._parser import build_parser, main

__all__ = ["CliError", "UsageError", "build_parser", "main"]
