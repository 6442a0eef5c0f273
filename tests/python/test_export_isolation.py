"""An export leaves the process as it found it, and substitution is scoped to the calls it serves.

The exporters' chatter is hidden on the exporting thread only: other threads' prints, log records
and warnings arrive while an export runs, two exports on two threads both succeed, and stdout,
stderr (file descriptors included) and the loggers' levels are what they were afterwards. The
model's own warnings reach the caller of opbridge.export.

A substitutions() block applies its rules on its own thread: another thread calling the original
meanwhile gets the original, a deepcopy made inside the block runs the original outside it, a
torch.jit.trace made inside records the original, and a nested block's only= is honoured.
"""

import copy
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
import types
import warnings
from pathlib import Path

import pytest
import torch

import opbridge

ROOT = Path(__file__).resolve().parents[2]
LOGGERS = ("torch.onnx", "torch.export", "torch._dynamo", "torch._subclasses", "torch.fx")


class _Add(torch.nn.Module):
    def forward(self, x):
        return torch.ops.opbridge.my_add(x, x)


class _Warns(torch.nn.Module):
    def forward(self, x):
        warnings.warn("the model's own warning: scale is deprecated", UserWarning)
        return torch.ops.opbridge.my_add(x, x) * 2


def _module(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    sys.modules[name] = module
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


@pytest.fixture(scope="module")
def pkg():
    """A package with a Function (x * 2) and a function (x + 1), rules that compute x * 3 and
    x + 100 instead (so which one ran shows in the value), and a model that keeps the function in
    an attribute: original 1 -> 3, substituted 1 -> 103."""
    _module("opbridge_iso_pkg", '''
import torch

class Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

twice = Twice.apply

def plus_one(x):
    return x + 1

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fn = plus_one

    def forward(self, x):
        return self.fn(twice(x))
''')
    opbridge.substitute("opbridge_iso_pkg.Twice", lambda x: x * 3)
    opbridge.substitute("opbridge_iso_pkg.plus_one", lambda x: x + 100)
    yield sys.modules["opbridge_iso_pkg"]
    del sys.modules["opbridge_iso_pkg"]


# ---- output, loggers and warnings ----------------------------------------------------------------
CONCURRENT = textwrap.dedent("""
    import logging, os, sys, threading, time
    import torch, opbridge

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.ops.opbridge.my_add(x, x)

    LOGGERS = ("torch.onnx", "torch.export", "torch._dynamo", "torch._subclasses", "torch.fx")
    stop = threading.Event()
    results = []

    def chatter():  # another thread's prints while the exports run
        i = 0
        while not stop.is_set():
            print(f"chatter {i}", flush=True)
            i += 1
            time.sleep(0.01)
        print(f"chatter total {i}", flush=True)

    def export(exporter, delay):
        time.sleep(delay)
        opbridge.export(M(), (torch.randn(2, 3),), exporter=exporter)
        results.append(exporter)

    talker = threading.Thread(target=chatter)
    talker.start()
    jobs = [threading.Thread(target=export, args=(sys.argv[i], float(sys.argv[i + 1]))) for i in (1, 3)]
    [t.start() for t in jobs]
    [t.join() for t in jobs]
    stop.set()
    talker.join()
    print("print after:", sorted(results))
    sys.stdout.flush()
    os.write(1, b"fd 1 after\\n")
    os.write(2, b"fd 2 after\\n")
    print("stderr after", file=sys.stderr)
    print("streams:", sys.stdout is sys.__stdout__, sys.stderr is sys.__stderr__)
    print("levels:", [logging.getLogger(n).level for n in LOGGERS])
    logging.getLogger("torch.onnx").warning("a torch.onnx record after the exports")
""")


@pytest.mark.parametrize("first, second, delay", [("torchscript", "torchscript", 0.05),
                                                  ("dynamo", "torchscript", 0.3),
                                                  ("torchscript", "dynamo", 0.0)])
def test_two_exports_on_two_threads_leave_the_process_output_intact(tmp_path, first, second, delay):
    script = tmp_path / "two_exports.py"
    script.write_text(CONCURRENT)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    r = subprocess.run([sys.executable, str(script), first, "0", second, str(delay)], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout.splitlines()
    assert f"print after: {sorted([first, second])}" in out  # both exports succeeded
    assert "fd 1 after" in out and "streams: True True" in out
    assert f"levels: {[0] * len(LOGGERS)}" in out
    assert "fd 2 after" in r.stderr and "stderr after" in r.stderr
    assert "a torch.onnx record after the exports" in r.stderr
    # Every line the other thread printed during the exports is there, in order.
    total = int(next(ln for ln in out if ln.startswith("chatter total")).split()[-1])
    assert total > 0 and [ln for ln in out if ln.startswith("chatter ") and "total" not in ln] == \
        [f"chatter {i}" for i in range(total)]


def _during_export(exporter, work, model=None, args=None):
    """Runs work() on another thread in a loop while an export runs on this one: its results."""
    stop, seen = threading.Event(), []
    started = threading.Event()

    def loop():
        while not stop.is_set():
            seen.append(work())
            started.set()
            time.sleep(0.002)

    t = threading.Thread(target=loop)
    t.start()
    started.wait(10)
    try:
        opbridge.export(model or _Add(), args or (torch.randn(2, 3),), exporter=exporter)
    finally:
        stop.set()
        t.join()
    return seen


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_another_threads_prints_reach_stdout_during_an_export(capfd, exporter):
    counter = iter(range(10 ** 9))

    def say():
        i = next(counter)
        print(f"other thread {i}", flush=True)
        return i

    said = _during_export(exporter, say)
    out = capfd.readouterr().out
    assert len(said) > 1 and [ln for ln in out.splitlines() if ln.startswith("other thread")] == \
        [f"other thread {i}" for i in said]


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_logger_levels_and_other_threads_records_survive_an_export(exporter):
    before = [logging.getLogger(n).level for n in LOGGERS]
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger("torch.onnx")
    handler = Keep(logging.WARNING)
    logger.addHandler(handler)
    try:
        counter = iter(range(10 ** 9))

        def log():
            i = next(counter)
            logger.warning("record %d from another thread", i)
            return [logging.getLogger(n).level for n in LOGGERS]

        levels = _during_export(exporter, log)
    finally:
        logger.removeHandler(handler)
    assert all(seen == before for seen in levels)  # as another thread sees them, during the export
    assert [logging.getLogger(n).level for n in LOGGERS] == before
    mine = [r for r in records if "from another thread" in r]
    assert mine == [f"record {i} from another thread" for i in range(len(levels))]
    assert all("from another thread" in r for r in records)  # the exporter's own stay hidden


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_the_models_own_warnings_reach_the_caller(exporter):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opbridge.export(_Warns(), (torch.randn(2, 3),), exporter=exporter)
    mine = [w for w in caught if "the model's own warning" in str(w.message)]
    assert len(mine) == 1 and mine[0].category is UserWarning and mine[0].filename == __file__
    # The exporters' own stay hidden (the TorchScript exporter's deprecation notice, torch's internals).
    assert not [w for w in caught if "legacy TorchScript" in str(w.message) or "torch" + os.sep in w.filename]


def test_another_threads_warnings_reach_their_caller_during_an_export():
    counter = iter(range(10 ** 9))

    def warn():
        i = next(counter)
        warnings.warn(f"warning {i} from another thread", UserWarning)
        return i

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        said = _during_export("torchscript", warn)
    got = [str(w.message) for w in caught if "from another thread" in str(w.message)]
    assert len(said) > 1 and got == [f"warning {i} from another thread" for i in said]


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_another_threads_warning_during_the_proofs_eager_run_reaches_its_caller(exporter):
    # opbridge.export runs the model again to compare it with the runtime, hiding the model's own
    # warnings there (the caller had them from the trace): another thread's must still pass.
    said = []

    class WarnsFromAnotherThread(torch.nn.Module):
        def forward(self, x):
            if not (torch.jit.is_tracing() or torch.compiler.is_compiling()):  # an eager run
                message = f"eager run {len(said)}, from another thread"
                t = threading.Thread(target=lambda: warnings.warn(message, UserWarning))
                t.start()
                t.join()
                said.append(message)
            return x + 1

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opbridge.export(WarnsFromAnotherThread(), (torch.randn(2, 3),), exporter=exporter)
    got = [str(w.message) for w in caught if "from another thread" in str(w.message)]
    assert said and got == said


def test_another_threads_warning_while_symbolics_are_registered_reaches_its_caller(monkeypatch):
    # A TorchScript export registers the exporter's rules again first, hiding the exporter's own
    # notices there: another thread's warnings in that moment must still pass.
    said, register = [], torch.onnx.register_custom_op_symbolic

    def registering(*args, **kwargs):
        if not said:
            message = "warned while symbolics were registered, from another thread"
            t = threading.Thread(target=lambda: warnings.warn(message, UserWarning))
            t.start()
            t.join()
            said.append(message)
        return register(*args, **kwargs)

    monkeypatch.setattr(torch.onnx, "register_custom_op_symbolic", registering)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opbridge.export(_Add(), (torch.randn(2, 3),), exporter="torchscript")
    got = [str(w.message) for w in caught if "from another thread" in str(w.message)]
    assert said and got == said


def test_the_torchscript_exporters_graph_at_an_error_stays_hidden(capfd):
    """The TorchScript exporter writes the graph to the process's stdout from C++ when it fails."""
    lib = torch.library.Library("isolation_test", "DEF")
    lib.define("mystery(Tensor x) -> Tensor")
    lib.impl("mystery", lambda x: x * 3, "CompositeExplicitAutograd")

    class Unknown(torch.nn.Module):
        def forward(self, x):
            return torch.ops.isolation_test.mystery(x) + 1

    with pytest.raises(opbridge.OpbridgeError, match="isolation_test::mystery: no ONNX symbolic"):
        opbridge.export(Unknown(), (torch.randn(2, 3),), exporter="torchscript")
    out, err = capfd.readouterr()
    assert "Torch IR graph" not in out + err and "isolation_test" not in out + err


# ---- substitution scoped to its thread and block ---------------------------------------------------
def test_another_thread_calling_the_original_during_an_export_gets_the_original(pkg):
    model, x = pkg.Model(), torch.ones(1)
    seen = _during_export("torchscript", lambda: model(x).item(), model, (x,))
    assert len(seen) > 1 and set(seen) == {3.0}
    with opbridge.substitutions(model):
        assert model(x).item() == 103.0  # and the export's own thread got the replacement


def test_blocks_on_two_threads_apply_their_own_rules(pkg):
    model, x = pkg.Model(), torch.ones(1)
    inside, go = threading.Barrier(2), {}

    def run(name, only):
        with opbridge.substitutions(model, only=only):
            inside.wait(10)  # both blocks active at once
            go[name] = model(x).item()
            inside.wait(10)

    threads = [threading.Thread(target=run, args=("both", None)),
               threading.Thread(target=run, args=("plus_one", ["opbridge_iso_pkg.plus_one"]))]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert go == {"both": 103.0, "plus_one": 102.0}
    assert model(x).item() == 3.0 and model.fn is pkg.plus_one and "apply" not in vars(pkg.Twice)


def test_a_deepcopy_made_inside_the_block_runs_the_original_after_it(pkg):
    model, x = pkg.Model(), torch.ones(1)
    with opbridge.substitutions(model):
        copied = copy.deepcopy(model)
        assert copied(x).item() == 103.0  # inside, the copy is substituted as the model is
    assert copied(x).item() == 3.0 and model(x).item() == 3.0


def test_a_trace_made_inside_the_block_records_the_original(pkg):
    model, x = pkg.Model(), torch.ones(1)
    with opbridge.substitutions(model):
        with pytest.warns(UserWarning, match="torch.jit.trace made inside the block records opbridge_iso_pkg"):
            traced = torch.jit.trace(model, (x,), check_trace=False)
    # (Inside a block the trace's call of the Function, which it keeps as a Python op, is a call
    # of the target like any other.)
    assert traced(x).item() == 3.0 and traced(2 * x).item() == 5.0


def test_a_program_torch_export_makes_inside_the_block_records_the_replacement(pkg):
    """torch.export inside a block is how a program for opbridge.export gets the substitutions
    (dynamo traces the dispatcher, strict or not)."""
    model, x = pkg.Model(), torch.ones(1)
    with opbridge.substitutions(model):
        strict = torch.export.export(model, (x,), strict=True)
        non_strict = torch.export.export(model, (x,), strict=False)
    assert strict.module()(x).item() == 103.0 and non_strict.module()(x).item() == 103.0
    assert model(x).item() == 3.0


def test_a_nested_only_is_honoured_and_unknown_rules_are_refused(pkg):
    model, x = pkg.Model(), torch.ones(1)
    with opbridge.substitutions(model):
        with opbridge.substitutions(model, only=["opbridge_iso_pkg.plus_one"]) as applied:
            assert applied == ["opbridge_iso_pkg.plus_one"]
            assert model(x).item() == 102.0  # Twice runs its original in the inner block
        assert model(x).item() == 103.0
        with pytest.raises(opbridge.OpbridgeError, match="no rule for opbridge_iso_pkg.no_such_rule"):
            with opbridge.substitutions(only=["opbridge_iso_pkg.no_such_rule"]):
                pass
        assert model(x).item() == 103.0
    assert model(x).item() == 3.0


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_export_inside_a_block_with_only_applies_every_rule(pkg, exporter):
    model, x = pkg.Model(), torch.ones(1)
    with opbridge.substitutions(only=["opbridge_iso_pkg.plus_one"]):
        proto = opbridge.export(model, (x,), exporter=exporter)
    sess = opbridge.session(proto)
    assert sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0].item() == 103.0
