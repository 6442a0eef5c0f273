"""Every built-in op's test case (the OpCase its test file under ops/ states), and calls of the
backward ops derived from their forward op's samples: for the cross-cutting tests that run every op
(edge values, backward ops' bad inputs, double backward) on inputs whose shapes are valid. And
run_isolated, which runs such calls in child processes, so that one that crashes or hangs fails
its own test rather than ending the run."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import queue
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch

import opbridge
from opbridge._library.manifest import OpInfo
from opbridge.testing import OpCase, OpTest, Sample

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def op_cases() -> dict[str, OpCase]:
    """Op name -> the OpCase of its test class, read from ops/*/test_*.py. Each file is imported as
    pytest imports it (its folder first on sys.path, its name as module name), or taken from
    sys.modules where pytest already did: one module per file (a file may register a stand-in op
    library, which cannot happen twice), the one pytest runs."""
    cases = {}
    for path in sorted(ROOT.glob("ops/*/test_*.py")):
        module = sys.modules.get(path.stem)
        if module is None:
            sys.path.insert(0, str(path.parent))
            try:
                module = importlib.import_module(path.stem)
            finally:
                sys.path.remove(str(path.parent))
        assert Path(module.__file__).resolve() == path.resolve(), f"{path.stem} is another file: {module.__file__}"
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, OpTest) and isinstance(vars(value).get("case"), OpCase):
                cases.setdefault(value.case.op, value.case)
    return cases


def builtin_ops() -> list[OpInfo]:
    return list(opbridge.builtin.ops)


def backward_ops() -> list[OpInfo]:
    """The ops some op of the built-in library names as its backward op."""
    names = {op.backward for op in builtin_ops() if op.backward}
    return [op for op in builtin_ops() if op.name in names]


def forward_ops_of(bwd: OpInfo) -> list[OpInfo]:
    return [op for op in builtin_ops() if op.backward == bwd.name]


def _as_list(x) -> list:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def backward_call(op: OpInfo, sample: Sample) -> Sample | None:
    """The call of `op`'s backward op that autograd makes after `op` ran on `sample` (the
    gradients of the outputs all ones), as the generic autograd formula wires it: grad_<output>
    for each output gradient, the op's inputs and outputs by name, the attributes the backward op
    has. None where the sample cannot run or a saved input is absent."""
    bwd = op.library.op(op.backward)
    try:
        outs = _as_list(op.overload(*sample.inputs, **sample.attrs))
    except RuntimeError:
        return None
    given = {i.name: t for i, t in zip(op.inputs, sample.inputs)}
    given.update({o.name: t for o, t in zip(op.outputs, outs)})
    args = []
    for spec in bwd.inputs:
        if spec.name.startswith("grad_") and spec.name[5:] in given and spec.name[5:] in [o.name for o in op.outputs]:
            args.append(torch.ones_like(given[spec.name[5:]]))
        else:
            args.append(given.get(spec.name))
        if args[-1] is None and not spec.optional:
            return None
    while args and args[-1] is None:
        args.pop()
    attrs = {k: v for k, v in sample.attrs.items() if any(a.name == k for a in bwd.attributes)}
    return dataclasses.replace(sample, inputs=tuple(args), attrs=attrs, dynamic=None)


def samples_of(op: OpInfo) -> list[Sample]:
    """The op's samples: its case's, or for a backward op those derived from its forward ops'."""
    cases = op_cases()
    if op.name in cases:
        return list(cases[op.name].samples)
    found = []
    for fwd in forward_ops_of(op):
        if fwd.name in cases:
            for s in cases[fwd.name].samples:
                b = backward_call(fwd, s)
                if b is not None:
                    found.append(dataclasses.replace(b, name=f"{fwd.name}:{s.name}"))
    return found


_CHILD = r"""
import importlib, json, sys
sys.path.insert(0, sys.argv[1])
function = getattr(importlib.import_module(sys.argv[2]), sys.argv[3])
for line in sys.stdin:
    key = json.loads(line)
    print(json.dumps(["start", key]), flush=True)  # a crash or a hang names what it was running
    print(json.dumps(["done", key, function(*key)]), flush=True)
"""


def run_isolated(module: str, function: str, keys, timeout: float = 120.0) -> dict:
    """tuple(key) -> function(*key) (JSON values in, a JSON value out) of `module` here, computed in
    child processes, key after key: a key whose call kills the child (a crash) or runs past
    `timeout` seconds (a hang) gets {"died": why}, and a fresh child goes on with the next keys."""
    results, pending = {}, [list(k) for k in keys]
    while pending:
        with tempfile.TemporaryFile("w+") as err:
            child = subprocess.Popen([sys.executable, "-c", _CHILD, str(Path(__file__).parent), module, function],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
            lines: queue.Queue = queue.Queue()

            def read(out=child.stdout, lines=lines):
                for ln in out:
                    lines.put(ln)
                lines.put(None)

            threading.Thread(target=read, daemon=True).start()
            child.stdin.write("".join(json.dumps(k) + "\n" for k in pending))
            child.stdin.close()
            running, died = None, None
            while True:
                try:
                    line = lines.get(timeout=timeout)
                except queue.Empty:
                    child.kill()
                    died = f"still running after {timeout:.0f} s"
                    break
                if line is None:
                    if child.wait() != 0:
                        err.seek(0)
                        died = f"the process died (exit status {child.returncode}): {err.read()[-3000:]}"
                    break
                what, key, *value = json.loads(line)
                if what == "start":
                    running = key
                else:
                    results[tuple(key)] = value[0]
                    pending.remove(key)
                    running = None
            child.wait()
        if died is None:
            break
        # The key that was running died (or, if none was, the child did before any: all of them).
        for key in [running] if running is not None else list(pending):
            results[tuple(key)] = {"died": died}
            pending.remove(key)
    return results
