"""opbridge.verify: ONNX Runtime against PyTorch eager on the same inputs."""

from __future__ import annotations

import dataclasses
import inspect
import os
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch

from .._library.errors import OpbridgeError
from .._library.kinds import positional, tensor_leaves
from .inspect import cannot_run, clean_ort_message
from .session import session


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
    # Why ONNX Runtime cannot run the model at all (no outputs then); "" when it ran.
    cannot_run: str = ""
    # Inputs of the call that the exported graph does not have (an exporter drops an input the
    # graph never reads); matched by name, the others were fed.
    dropped_inputs: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.cannot_run and all(o.ok for o in self.outputs)

    def table(self) -> str:
        if self.cannot_run:
            return f"cannot run: {self.cannot_run}"
        head = f"{'output':<16} {'shape':<16} {'dtype':<8} {'max abs diff':>13} {'max rel diff':>13}  result"
        lines = [head, "-" * len(head)]
        if self.dropped_inputs:
            lines.insert(0, f"inputs the exported graph does not take (unused): {', '.join(self.dropped_inputs)}")
        for o in self.outputs:
            verdict = "ok" if o.ok else f"MISMATCH {o.note}".rstrip()
            lines.append(
                f"{o.name:<16} {str(list(o.shape)):<16} {o.dtype:<8} {o.max_abs:>13.3e} {o.max_rel:>13.3e}  {verdict}"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


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
    with np.errstate(invalid="ignore"):  # rtol * inf is NaN for rtol=0: equal values pass anyway
        ok = bool(same_nan.all() and np.all((diff == 0) | (diff <= atol + rtol * np.abs(w))))
    new_nans = int(np.count_nonzero(np.isnan(g) & ~np.isnan(w)))
    # A NaN only ONNX Runtime gives is most often a guard the graph lost on the way (x + 1e-8
    # folded into x): say where to look.
    note = (f"{new_nans} NaN where PyTorch has none: a graph optimisation may have dropped a guard such as "
            "`+ 1e-8`; export with optimize=False to check" if new_nans else "")
    return OutputDiff(name, want.shape, str(want.dtype), max_abs, max_rel, ok, note)


def verify(
    model: torch.nn.Module,
    args: tuple,
    onnx_model: str | os.PathLike | bytes | onnx.ModelProto,
    *,
    kwargs: dict[str, Any] | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    sess: ort.InferenceSession | None = None,
    input_names: list[str] | None = None,
) -> VerifyReport:
    """Runs torch eager and ONNX Runtime on the same inputs; reports the largest absolute and
    relative difference per output. A model ONNX Runtime cannot load gives a report that is not
    ok and says why (`cannot_run`) instead of ONNX Runtime's exception. The tensors of args and
    kwargs (nested ones too, in order) feed the graph inputs in order. Where the graph has fewer
    inputs (an exporter dropped one it never reads), they are matched by name: `input_names` as
    given to export, else the names of forward's parameters that take a tensor; the report lists
    the dropped ones. Outputs are compared in order of their tensors."""
    args = positional(args)
    kwargs = kwargs or {}
    if sess is None:
        try:
            sess = session(onnx_model)
        except (OpbridgeError, ort.capi.onnxruntime_pybind11_state.Fail,
                ort.capi.onnxruntime_pybind11_state.NotImplemented, ort.capi.onnxruntime_pybind11_state.InvalidGraph) as e:
            return VerifyReport([], rtol, atol, _why_not(onnx_model, e))
    tensors = tensor_leaves((args, kwargs))
    names = [i.name for i in sess.get_inputs()]
    given = list(input_names) if input_names else _parameter_names(model, args, kwargs, len(tensors))
    if len(names) == len(tensors):
        pairs, dropped = list(zip(names, tensors)), ()
    elif given and len(given) == len(tensors) and set(names) <= set(given):
        pairs = [(n, t) for n, t in zip(given, tensors) if n in names]
        dropped = tuple(n for n in given if n not in names)
    else:
        raise OpbridgeError(f"verify: the ONNX model has {len(names)} inputs ({', '.join(names)}), the call passes "
                            f"{len(tensors)} tensors" + (f" ({', '.join(given)})" if given else "") +
                            "; pass input_names= as given to export to match them by name")
    with torch.no_grad():
        want = [t.detach().cpu().numpy() for t in tensor_leaves(model(*args, **kwargs))]
    feeds = {n: t.detach().cpu().contiguous().numpy() for n, t in pairs}
    got = sess.run(None, feeds)
    if len(got) != len(want):
        raise OpbridgeError(f"verify: ONNX Runtime returned {len(got)} outputs, PyTorch {len(want)}")
    out_names = [o.name for o in sess.get_outputs()]
    return VerifyReport([compare(n, g, w, rtol, atol) for n, g, w in zip(out_names, got, want)], rtol, atol,
                        dropped_inputs=dropped)


def _parameter_names(model, args: tuple, kwargs: dict, count: int) -> list[str] | None:
    """The names of forward's parameters, one per tensor of the call, when each tensor is a
    parameter's whole value (as the dynamo exporter names graph inputs); else None."""
    try:
        bound = inspect.signature(getattr(model, "forward", model)).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return None
    names = [n for n, v in bound.arguments.items() if isinstance(v, torch.Tensor)]
    return names if len(names) == count else None


def _why_not(onnx_model, error: Exception) -> str:
    """Why ONNX Runtime refused the model: inspect's verdict per node it cannot run, else the
    runtime's own words."""
    try:
        model = onnx_model if isinstance(onnx_model, onnx.ModelProto) else (
            onnx.load_from_string(onnx_model) if isinstance(onnx_model, bytes) else onnx.load(os.fspath(onnx_model)))
        problems = cannot_run(model)
    except Exception:  # noqa: BLE001 - the runtime's own message is still an answer
        problems = []
    return "; ".join(problems) if problems else clean_ort_message(str(error))
