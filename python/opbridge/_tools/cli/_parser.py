"""The command line: one parser with a sub-command per module, and main(), which turns every
failure into one line on stderr."""

from __future__ import annotations

import argparse
import sys
import traceback
from typing import Sequence

from . import export, graph, inspect, ops, triton, verify
from ._common import PROG, opbridge_api
from ._errors import CliError, UsageError, message

COMMANDS = {"ops": ops, "inspect": inspect, "graph": graph, "export": export, "verify": verify,  # in --help's order
            "triton": triton}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit status 2
        print(f"{PROG}: error: {message} (see '{self.prog} --help')", file=sys.stderr)
        sys.exit(2)


def _help_formatter(prog):
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32)


def _version() -> str:
    info = opbridge_api().build_info()
    torch = f"torch {info['torch']}" if info.get("torch") else "no PyTorch"
    return f"{PROG} {info['opbridge']} (built with {torch}, ONNX Runtime SDK {info['onnxruntime_sdk']})"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, formatter_class=_help_formatter,
                description="Which ops does a model need and will ONNX Runtime run it (inspect), the loaded "
                            "operators (ops), draw a graph (graph), export a PyTorch model (export), check "
                            "ONNX Runtime against PyTorch (verify), and write a Triton model repository (triton).",
                epilog="example:\n  opbridge inspect model.onnx\n  opbridge <command> --help")
    p.add_argument("--verbose", action="store_true", help="show tracebacks and the exporters' own output")
    p.add_argument("--version", action="version", version=_version(),
                   help="print the versions of opbridge and of what it was built with")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)

    for name, cmd in COMMANDS.items():
        c = sub.add_parser(name, help=cmd.HELP, description=cmd.DESCRIPTION, epilog=cmd.EPILOG,
                           formatter_class=_help_formatter)
        c.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                       help="show tracebacks and the exporters' own output")
        c.add_argument("--library", action="append", metavar="LIB_torch.so",
                       help="also load this opbridge op library (repeatable)")
        c.add_argument("--jit", action="append", metavar="NAME",
                       help="also load the op library opbridge.load_inline / load built as NAME, from its cache "
                            "(repeatable; an unknown NAME lists the cached ones)")
        cmd.add_arguments(c)
        c.set_defaults(func=cmd.run)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if COMMANDS[args.command].NEEDS_TORCH:
            opbridge_api().load_torch()
        return args.func(args)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `opbridge ops | head`
        return 0
    except Exception as e:  # noqa: BLE001 - every failure ends as a message, not a traceback
        if args.verbose:
            traceback.print_exc()
        hint = "" if args.verbose or isinstance(e, UsageError) else " (--verbose for the traceback)"
        if isinstance(e, CliError) and not isinstance(e, UsageError) and e.__cause__ is None:  # nothing beneath
            hint = ""
        print(f"{PROG}: error: {message(e)}{hint}", file=sys.stderr)
        return 2 if isinstance(e, UsageError) else 1
