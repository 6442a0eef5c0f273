"""The request loop of a benchmark worker process (the *_worker.py scripts; common.Worker is the
other end): "ready <version>" once, then one answer line per request line — "ok" when done."""

import sys
from typing import Callable


def serve(version: str, handlers: dict[str, Callable[[str], object]]) -> None:
    """Answers `<command> [argument]` lines from stdin until it closes: handlers[command](argument),
    or nothing for "ping" (the pipe's own round trip)."""
    print("ready", version, flush=True)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd in handlers:
            handlers[cmd](arg)
        elif cmd != "ping":
            print(f"unknown command {cmd!r}", flush=True)
            continue
        print("ok", flush=True)
