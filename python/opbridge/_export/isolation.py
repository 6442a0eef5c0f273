"""An export leaves the process as it found it: the exporters' chatter is hidden on the exporting
thread only, and exports run one at a time.

PyTorch's exporters print progress and notices, log through the torch.* loggers, issue warnings
about their own internals and, in the TorchScript exporter, write the graph at an error from C++
(its ONNX log, to the process's stdout). Hiding that by swapping sys.stdout, the loggers' levels or
file descriptors 1 and 2 would hide every other thread's output for the export's length, and two
exports that overlap restore each other's swaps in the wrong order. Instead each channel is routed
by thread, with hooks installed the first time an export runs and kept (they pass everything
through on any thread that is not exporting quietly):

- sys.stdout / sys.stderr: a stand-in that drops writes from an exporting thread and passes the
  rest to the stream it wraps; it is taken out again when the last export ends, unless something
  else replaced sys.stdout meanwhile (then it stays, passing everything through).
- the torch.onnx, torch.export, torch._dynamo, torch._subclasses and torch.fx loggers: a filter
  on each (and on the handlers of those loggers, of `torch` and of the root logger, for loggers
  made during an export) that drops their records below CRITICAL made on an exporting thread.
  Levels stay as they are.
- warnings: a filter entry at the front of warnings.filters that matches only on an exporting
  thread ("always", so every warning of the export is seen whatever the other filters say) and a
  hook on warnings' display that collects them there. When the export ends, the TorchScript
  trace's TracerWarnings are re-issued as trace_warnings (below) says; warnings raised in the
  model's own code (anything not attributed to PyTorch, ONNX, onnxscript, the standard library or
  opbridge's export code) are re-issued to the caller, once each, through the caller's filters.
- the TorchScript exporter's ONNX log: PyTorch writes it from C++ to the process's stdout, and
  calls it from Python only (the graph at an error; the exported graph when verbose). That call,
  torch._C._jit_onnx_log, is routed by thread like the rest; nothing else of the exporter writes to
  the file descriptors (a successful export writes nothing there).

Exports run one at a time (a process-wide lock): both exporters keep process-wide state while
they run (the TorchScript exporter's GLOBALS, its ONNX log switch, the torchlib registry opbridge
reuses), so two at once could write each other's opset or translations.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import sysconfig
import threading
import warnings
from pathlib import Path
from typing import Iterator

import torch


_LOCAL = threading.local()  # .exporting: exports running on this thread; .quiet: list of caught warnings lists
_EXPORT_LOCK = threading.RLock()  # one export at a time, process-wide
_HOOKS_LOCK = threading.Lock()  # installing and removing the hooks
_ROUTED_USERS = [0]  # quiet exports in progress that rely on the sys.stdout / sys.stderr stand-ins
_LOGGERS = ("torch.onnx", "torch.export", "torch._dynamo", "torch._subclasses", "torch.fx")


def exporting_here() -> bool:
    """Whether an opbridge export runs on this thread (substitutions() blocks entered by it serve
    its traces)."""
    return getattr(_LOCAL, "exporting", 0) > 0


def _quiet_here() -> bool:
    return bool(getattr(_LOCAL, "quiet", None))


@contextlib.contextmanager
def isolated(verbose: bool, native_output: bool = False) -> Iterator[list]:
    """The export's context: it waits for any other export to end, and unless verbose hides the
    exporters' own output (progress lines, deprecation notices, warnings about optional packages,
    the tracebacks fake tensors log before the error is raised) on this thread only; errors still
    propagate, as exceptions. native_output also hides the TorchScript exporter's ONNX log (the
    graph at an error). The model's own warnings and the trace's TracerWarnings reach the caller.
    Yields the list the warnings of the block are collected in (empty when verbose: they went to
    the caller as they came)."""
    with _EXPORT_LOCK:
        _LOCAL.exporting = getattr(_LOCAL, "exporting", 0) + 1
        try:
            if verbose:
                yield []
            else:
                with _quiet(native_output) as caught:
                    yield caught
        finally:
            _LOCAL.exporting -= 1


@contextlib.contextmanager
def _routed(native_output: bool, caught: list) -> Iterator[None]:
    """This thread's prints and warnings for the block go to `caught`, other threads' as they come."""
    with _HOOKS_LOCK:
        _install_hooks(native_output)
        _ROUTED_USERS[0] += 1
    stack = getattr(_LOCAL, "quiet", None)
    if stack is None:
        stack = _LOCAL.quiet = []
    stack.append(caught)
    try:
        yield
    finally:
        stack.pop()
        with _HOOKS_LOCK:
            _ROUTED_USERS[0] -= 1
            if _ROUTED_USERS[0] == 0:
                _unroute_streams()


@contextlib.contextmanager
def hidden_here() -> Iterator[None]:
    """This thread's prints and warnings for the block are dropped; other threads' pass as they
    come (warnings.catch_warnings would swap the process's filters, and drop theirs too). For the
    model run again after its export, whose warnings the caller had once already."""
    with _routed(False, []):
        yield


@contextlib.contextmanager
def _quiet(native_output: bool) -> Iterator[list]:
    caught: list = []
    done = False
    try:
        with _routed(native_output, caught):
            yield caught
            done = True
    finally:
        stack = _LOCAL.quiet
        if stack:  # a nested export: the outer one says what is to be said
            stack[-1].extend(caught)
        else:
            _reissue_model_warnings(caught)
            if done:  # a failed export says one thing: its error (and what the model itself warned)
                trace_warnings(caught)


# ---- sys.stdout / sys.stderr ---------------------------------------------------------------------
class _ThreadRouted:
    """Stands in for sys.stdout or sys.stderr: writes from a thread exporting quietly are dropped,
    everything else goes to the stream it wraps."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        if _quiet_here():
            return len(text)
        return self._stream.write(text)

    def writelines(self, lines):
        if not _quiet_here():
            self._stream.writelines(lines)

    def __getattr__(self, name):  # fileno, flush, encoding, buffer, isatty, ...
        return getattr(self._stream, name)


# Every stand-in made, by the stream it wraps, kept for good: print() holds sys.stdout without a
# reference of its own while it writes (CPython 3.11), so a stand-in freed when sys.stdout is set
# back would crash a thread printing at that moment.
_STANDINS: dict[int, _ThreadRouted] = {}


def _route_streams() -> None:
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _ThreadRouted):
            standin = _STANDINS.get(id(stream))
            if standin is None or standin._stream is not stream:
                standin = _STANDINS[id(stream)] = _ThreadRouted(stream)
            setattr(sys, name, standin)


def _unroute_streams() -> None:
    """sys.stdout / sys.stderr as they were, where the stand-in is still what they are (another
    replacement made meanwhile, e.g. contextlib.redirect_stdout saving the stand-in, is left alone:
    the stand-in passes everything through)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, _ThreadRouted):
            setattr(sys, name, stream._stream)


# ---- loggers -------------------------------------------------------------------------------------
class _DropOnQuietThread(logging.Filter):
    """Drops the records below CRITICAL that a thread exporting quietly makes on the exporters'
    loggers (filters run on the thread that logs)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.CRITICAL or not _quiet_here():
            return True
        return not _exporters_logger(record.name)


def _exporters_logger(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in _LOGGERS)


_LOG_FILTER = _DropOnQuietThread()


def _filter_loggers() -> None:
    """The filter on every logger of the exporters' namespaces that exists now (a logger's filters
    see only the records made on it, not its children's, so each gets one), and on the handlers
    of those loggers, of `torch` and of the root logger, for the records of loggers made during an
    export."""
    loggers = [logging.getLogger(n) for n, lg in list(logging.root.manager.loggerDict.items())
               if isinstance(lg, logging.Logger) and _exporters_logger(n)]
    loggers += [logging.getLogger(n) for n in _LOGGERS]
    for logger in loggers:
        if _LOG_FILTER not in logger.filters:
            logger.addFilter(_LOG_FILTER)
    for logger in {*loggers, logging.getLogger("torch"), logging.root}:
        for handler in list(logger.handlers):
            if _LOG_FILTER not in handler.filters:
                handler.addFilter(_LOG_FILTER)


# ---- warnings ------------------------------------------------------------------------------------
class _OnQuietThread:
    """The `module` pattern of a warnings filter entry that matches on a thread exporting quietly
    only (warnings calls its match() with the warning's module name)."""

    def match(self, module: str) -> bool:
        return _quiet_here()

    def __repr__(self) -> str:
        return "<opbridge: a thread exporting quietly>"


_WARNING_FILTER = ("always", None, Warning, _OnQuietThread(), 0)


def _collect(previous):
    def show(message: warnings.WarningMessage) -> None:
        stack = getattr(_LOCAL, "quiet", None)
        if stack:
            stack[-1].append(message)
        else:
            previous(message)

    show._opbridge_collects = True  # type: ignore[attr-defined]
    return show


def _hook_warnings() -> None:
    filters = warnings.filters
    if not filters or filters[0] is not _WARNING_FILTER:
        if _WARNING_FILTER in filters:
            filters.remove(_WARNING_FILTER)
        filters.insert(0, _WARNING_FILTER)
    if not getattr(warnings._showwarnmsg, "_opbridge_collects", False):  # type: ignore[attr-defined]
        warnings._showwarnmsg = _collect(warnings._showwarnmsg)  # type: ignore[attr-defined]


def _exporter_dirs() -> tuple[str, ...]:
    dirs = [Path(torch.__file__).parent, Path(__file__).parent]
    for name in ("onnx", "onnxscript", "onnx_ir", "onnxruntime"):
        module = sys.modules.get(name)
        if getattr(module, "__file__", None):
            dirs.append(Path(module.__file__).parent)
    for key in ("stdlib", "platstdlib"):
        try:
            dirs.append(Path(sysconfig.get_paths()[key]))
        except KeyError:
            pass
    return tuple(os.path.join(str(d), "") for d in dirs)


def _reissue_model_warnings(caught: list) -> None:
    """The warnings the model's own code raised during the export, re-issued to the caller once
    each through the caller's filters (as the module raising them would have); the rest (the
    exporters', attributed to their files) stay hidden. TracerWarnings are trace_warnings'."""
    exporters = _exporter_dirs()
    seen = set()
    for w in caught:
        if issubclass(w.category, torch.jit.TracerWarning) or not w.filename or w.filename.startswith(exporters) \
                or w.filename.startswith("<frozen "):
            continue
        key = (w.category, str(w.message), w.filename, w.lineno)
        if key in seen:
            continue
        seen.add(key)
        module = next((m for m in list(sys.modules.values())
                       if getattr(m, "__file__", None) == w.filename), None)
        registry = vars(module).setdefault("__warningregistry__", {}) if module is not None else None
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno,
                               module=getattr(module, "__name__", None), registry=registry)


# ---- the TorchScript exporter's ONNX log ---------------------------------------------------------
def _route_onnx_log() -> None:
    log = getattr(torch._C, "_jit_onnx_log", None)
    if log is None or getattr(log, "_opbridge_routes", False):
        return

    def onnx_log(*args):
        if not _quiet_here():
            return log(*args)
        return None

    onnx_log._opbridge_routes = True  # type: ignore[attr-defined]
    torch._C._jit_onnx_log = onnx_log


def _install_hooks(native_output: bool) -> None:
    _route_streams()
    _filter_loggers()
    _hook_warnings()
    if native_output:
        _route_onnx_log()


def trace_warnings(caught: list) -> None:
    """The TorchScript trace's TracerWarnings, the ones that explain a graph fixed to the example
    (a tensor read as a Python number or bool, a condition taken once): re-issued once per place in
    the model's code, on one line, where the rest of the exporters' warnings stay hidden."""
    seen = set()
    for w in caught:
        if not issubclass(w.category, torch.jit.TracerWarning):
            continue
        first = str(w.message).strip().split(". ")[0].rstrip(".")
        if (w.filename, w.lineno, first) not in seen:
            seen.add((w.filename, w.lineno, first))
            warnings.warn_explicit(f"the TorchScript trace fixed a value here: {first}", torch.jit.TracerWarning,
                                   w.filename, w.lineno)
