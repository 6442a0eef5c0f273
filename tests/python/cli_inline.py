"""The `opbridge` command run inside the test's process: the main() that `python -m opbridge` and the
installed script run, with file descriptors 1 and 2 captured (what Python prints and what C and C++
libraries write alike), the working directory and environment given, and what a fresh process
starts with where that decides what reaches the streams: Python's default warning filters, shown
on stderr; no handler on the root logger (so a record at WARNING or above reaches stderr); log
handlers writing to stderr writing to the captured one. A process costs 2-3 s (importing PyTorch
and ONNX Runtime); the tests that are about the process itself (its imports, exit on signals,
the installed script) still start one."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch

from opbridge._tools import cli


def _show_warning(message, category, filename, lineno, file=None, line=None):
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


@contextlib.contextmanager
def _fresh_process_streams():
    """Warnings and log records reach stderr as in a process that configured neither; the loggers'
    levels are put back after."""
    loggers = [lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)]
    # Handlers made with the default stream (stderr, or pytest's capture of it when they were made).
    handlers = {h for lg in loggers for h in lg.handlers if type(h) is logging.StreamHandler
                and (h.stream is sys.__stderr__ or type(h.stream).__module__.startswith("_pytest"))}
    streams = [(h, h.stream) for h in handlers]
    root_handlers = logging.root.handlers[:]
    levels = [(lg, lg.level) for lg in [logging.root, *loggers]]  # a command may set its own (export: INFO)
    with warnings.catch_warnings():
        warnings.resetwarnings()  # Python's own start-up filters (no -W, no PYTHONWARNINGS):
        warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", category, append=True)
        warnings.showwarning = _show_warning
        logging.root.handlers[:] = []
        for h, _ in streams:
            h.stream = sys.stderr  # not setStream: it flushes the old stream, which may be closed
        try:
            yield
        finally:
            for h, s in streams:
                h.stream = s
            logging.root.handlers[:] = root_handlers
            for lg, level in levels:
                lg.setLevel(level)


@contextlib.contextmanager
def _captured_fds(out, err):
    sys.stdout.flush()
    sys.stderr.flush()
    saved_fds = os.dup(1), os.dup(2)
    saved_streams = sys.stdout, sys.stderr
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = saved_streams
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
        os.close(saved_fds[0])
        os.close(saved_fds[1])


@contextlib.contextmanager
def _user_code_forgotten():
    """Undoes what importing a user's factory leaves in the process (sys.path entries, the module,
    the torch.library ops it defined), as the end of a process would, so that the next command
    imports the file afresh."""
    path, modules = list(sys.path), set(sys.modules)
    try:
        yield
    finally:
        added = [Path(p).resolve() for p in sys.path if p not in path]
        for name in set(sys.modules) - modules:
            mod = sys.modules[name]
            file = getattr(mod, "__file__", None)
            if name.startswith("_opbridge_user_") or (file and Path(file).resolve().parent in added):
                for value in list(vars(mod).values()):
                    if isinstance(value, torch.library.Library):
                        value._destroy()
                del sys.modules[name]
        sys.path[:] = path


def run_cli(*args, env: dict | None = None, cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """`opbridge ARGS...` as a process would run it: its exit status, stdout and stderr."""
    argv = [str(a) for a in args]
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            if env is not None:
                os.environ.clear()
                os.environ.update(env)
            if cwd is not None:
                os.chdir(cwd)
            importlib.invalidate_caches()  # files the test just wrote are importable
            with _user_code_forgotten(), _captured_fds(out, err), _fresh_process_streams():
                try:
                    code = cli.main(argv)
                except SystemExit as e:  # argparse: usage errors, --help, --version
                    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        finally:
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(["opbridge", *argv], code, out.read().decode("utf-8", "replace"),
                                           err.read().decode("utf-8", "replace"))
