"""The three calls a deployment engineer makes: export(), session(), verify()."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import logging
import os
import warnings
import weakref
from typing import Any, Sequence

import numpy as np
import onnx
import onnxruntime as ort
import torch

from ._exporters import custom_opsets, torchscript_exporter_available, translation_table
from ._library import OpbridgeError, libraries

EXPORTERS = ("dynamo", "torchscript")
DEFAULT_TORCHSCRIPT_OPSET = 17


def export(
    model: torch.nn.Module,
    args: tuple,
    f: str | os.PathLike | None = None,
    *,
    exporter: str = "dynamo",
    opset: int | None = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    dynamic_axes: dict[str, dict[int, str]] | None = None,
    kwargs: dict[str, Any] | None = None,
    check: bool = True,
    verbose: bool = False,
) -> onnx.ModelProto:
    """Exports `model` with opbridge's rules using either PyTorch exporter, runs the ONNX checker
    with full shape inference, saves to `f` if given, and returns the model.

    dynamic_axes: {"input name": {axis: "dim name"}} — kept symbolic in the ONNX model.
    """
    if exporter not in EXPORTERS:
        raise OpbridgeError(f"exporter must be one of {', '.join(EXPORTERS)}, got '{exporter}'")
    if not isinstance(args, tuple):
        args = (args,)
    if exporter == "dynamo":
        with _quiet(verbose):
            program = torch.onnx.export(
                model,
                args,
                kwargs=kwargs,
                dynamo=True,
                custom_translation_table=translation_table(),
                opset_version=opset,
                input_names=list(input_names) if input_names else None,
                output_names=list(output_names) if output_names else None,
                dynamic_shapes=_dynamic_shapes(model, args, input_names, dynamic_axes),
                verbose=verbose,
            )
        proto = program.model_proto
    else:
        if not torchscript_exporter_available():
            raise OpbridgeError(
                f"torch {torch.__version__} has no TorchScript-based ONNX exporter (dynamo=False); "
                "use exporter='dynamo'"
            )
        buf = io.BytesIO()
        with _quiet(verbose):
            torch.onnx.export(
                model,
                args,
                buf,
                kwargs=kwargs,
                dynamo=False,
                opset_version=opset or DEFAULT_TORCHSCRIPT_OPSET,
                custom_opsets=custom_opsets(),
                input_names=list(input_names) if input_names else None,
                output_names=list(output_names) if output_names else None,
                dynamic_axes=dynamic_axes,
                verbose=verbose,
            )
        proto = onnx.load_from_string(buf.getvalue())
    if check:
        onnx.checker.check_model(proto, full_check=True)
    if f is not None:
        onnx.save(proto, os.fspath(f))
    return proto


@contextlib.contextmanager
def _quiet(verbose: bool):
    """Hides the exporters' own chatter (progress lines, deprecation notices, warnings about
    optional packages) unless verbose; errors still propagate."""
    if verbose:
        yield
        return
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo")]
    levels = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _dynamic_shapes(model: torch.nn.Module, args: tuple, input_names, dynamic_axes):
    """dynamic_axes ({"x": {0: "batch"}}) as torch.export dynamic_shapes, one torch.export.Dim
    per axis name, so axes that share a name share a symbol (and keep the name in ONNX)."""
    if not dynamic_axes:
        return None
    names = list(input_names or [])
    unknown = set(dynamic_axes) - set(names)
    if unknown:
        raise OpbridgeError(f"dynamic_axes names {sorted(unknown)}, which are not in input_names {names}")
    dims: dict[str, torch.export.Dim] = {}
    shapes = []
    for i, a in enumerate(args):
        axes = dynamic_axes.get(names[i]) if i < len(names) else None
        if not isinstance(a, torch.Tensor) or not axes:
            shapes.append(None)
            continue
        if isinstance(axes, (list, tuple)):
            axes = {ax: f"{names[i]}_dim{ax}" for ax in axes}
        shapes.append({ax: dims.setdefault(n, torch.export.Dim(n)) for ax, n in axes.items()})
    # torch.export matches dynamic_shapes to forward's parameters: `forward(self, *xs)` takes
    # them as one tuple.
    params = list(inspect.signature(model.forward).parameters.values())
    if params and params[0].kind is inspect.Parameter.VAR_POSITIONAL:
        return (tuple(shapes),)
    return tuple(shapes)


# Which op libraries each SessionOptions already has: ONNX Runtime refuses a second
# registration of the same domain, and options objects get reused.
_registered: "weakref.WeakKeyDictionary[ort.SessionOptions, set]" = weakref.WeakKeyDictionary()


def _register_libraries(so: ort.SessionOptions) -> ort.SessionOptions:
    done = _registered.setdefault(so, set())
    for lib in libraries():
        if lib.ort_path is not None and lib.ort_path not in done:
            so.register_custom_ops_library(str(lib.ort_path))
            done.add(lib.ort_path)
    return so


def session_options(threads: int | None = None) -> ort.SessionOptions:
    """SessionOptions with every loaded op library registered."""
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    return _register_libraries(so)


def session(
    model: str | os.PathLike | bytes | onnx.ModelProto,
    *,
    threads: int | None = None,
    options: ort.SessionOptions | None = None,
) -> ort.InferenceSession:
    """An ONNX Runtime CPU session that can run every opbridge op."""
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    elif not isinstance(model, bytes):
        model = os.fspath(model)
    so = _register_libraries(options) if options is not None else session_options(threads)
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


@dataclasses.dataclass
class OutputDiff:
    name: str
    shape: tuple
    dtype: str
    max_abs: float
    max_rel: float
    ok: bool
    note: str = ""


@dataclasses.dataclass
class VerifyReport:
    outputs: list[OutputDiff]
    rtol: float
    atol: float

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    def table(self) -> str:
        head = f"{'output':<16} {'shape':<16} {'dtype':<8} {'max abs diff':>13} {'max rel diff':>13}  result"
        lines = [head, "-" * len(head)]
        for o in self.outputs:
            verdict = "ok" if o.ok else f"MISMATCH {o.note}".rstrip()
            lines.append(
                f"{o.name:<16} {str(list(o.shape)):<16} {o.dtype:<8} {o.max_abs:>13.3e} {o.max_rel:>13.3e}  {verdict}"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _flatten(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _flatten(o)]
    raise OpbridgeError(f"verify: model returned {type(out).__name__}; expected tensors")


def compare(name: str, got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> OutputDiff:
    """Compares one ONNX Runtime output with its PyTorch reference."""
    if got.shape != want.shape:
        return OutputDiff(name, want.shape, str(want.dtype), np.inf, np.inf, False, f"shape {got.shape} != {want.shape}")
    if got.dtype != want.dtype:
        return OutputDiff(name, want.shape, str(want.dtype), np.inf, np.inf, False, f"dtype {got.dtype} != {want.dtype}")
    if got.size == 0:
        return OutputDiff(name, want.shape, str(want.dtype), 0.0, 0.0, True)
    g, w = got.astype(np.float64), want.astype(np.float64)
    same_nan = np.isnan(g) == np.isnan(w)
    # Equal values (infinities included) and NaN against NaN differ by nothing.
    with np.errstate(invalid="ignore"):
        diff = np.where((g == w) | (np.isnan(g) & np.isnan(w)), 0.0, np.abs(g - w))
    max_abs = float(np.max(diff))
    max_rel = float(np.max(diff / np.maximum(np.abs(w), np.finfo(np.float64).tiny)))
    ok = bool(same_nan.all() and np.all(diff <= atol + rtol * np.abs(w)))
    return OutputDiff(name, want.shape, str(want.dtype), max_abs, max_rel, ok)


def verify(
    model: torch.nn.Module,
    args: tuple,
    onnx_model: str | os.PathLike | bytes | onnx.ModelProto,
    *,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    sess: ort.InferenceSession | None = None,
) -> VerifyReport:
    """Runs torch eager and ONNX Runtime on the same inputs; reports the largest absolute and
    relative difference per output. Tensor arguments feed the graph inputs in order."""
    if not isinstance(args, tuple):
        args = (args,)
    sess = sess or session(onnx_model)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    names = [i.name for i in sess.get_inputs()]
    if len(names) != len(tensors):
        raise OpbridgeError(f"verify: the ONNX model has {len(names)} inputs, the call passes {len(tensors)} tensors")
    with torch.no_grad():
        want = [t.detach().cpu().numpy() for t in _flatten(model(*args))]
    feeds = {n: t.detach().cpu().contiguous().numpy() for n, t in zip(names, tensors)}
    got = sess.run(None, feeds)
    if len(got) != len(want):
        raise OpbridgeError(f"verify: ONNX Runtime returned {len(got)} outputs, PyTorch {len(want)}")
    out_names = [o.name for o in sess.get_outputs()]
    return VerifyReport([compare(n, g, w, rtol, atol) for n, g, w in zip(out_names, got, want)], rtol, atol)
