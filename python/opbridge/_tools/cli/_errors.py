"""The CLI's failures, on stderr: exit status 2 for a usage error, 1 for any other failure. A
failure is one line, except opbridge's own errors, whose lines below the first are the details
written for the user (the axes and outputs a second-size proof failed on, the nodes a runtime
cannot run)."""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # terminal colour codes some exporter messages carry


class CliError(Exception):
    """A failure explained in one line (exit status 1)."""


class UsageError(CliError):
    """A command line that cannot work (exit status 2)."""


def message(e: BaseException) -> str:
    """What the CLI says of a failure: opbridge's own errors whole, others as one_line."""
    if type(e).__name__ == "OpbridgeError":
        text = "\n".join(ln.rstrip() for ln in _ANSI.sub("", str(e)).strip().splitlines())
        return text or type(e).__name__
    return one_line(e)


def one_line(e: BaseException) -> str:
    """The first line of an exception's message. Messages written for the user (the CLI's and
    opbridge's own) stand alone; others keep their type name, which often says more."""
    text = _ANSI.sub("", str(e)).strip()
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if isinstance(e, CliError) or type(e).__name__ == "OpbridgeError":
        return first or type(e).__name__
    return f"{type(e).__name__}: {first}" if first else type(e).__name__
