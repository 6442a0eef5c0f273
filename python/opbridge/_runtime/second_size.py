"""The second-size proof: a model whose ONNX graph declares dynamic input axes runs eagerly and
in its runtime at the size it was exported at and at a second size of every dynamic axis, and the
two must agree at both. A graph that is right at the example and wrong elsewhere (a size baked into
an attribute or a Reshape constant, a Python loop unrolled by a trace) agrees at the first size
only; nothing short of running a second size tells.

The dynamic axes are read from the ONNX model (a graph input's dimension with a name, or with no
value), so opbridge.export and opbridge.verify share one rule: what the graph says is dynamic is
proven. The second inputs are the caller's (`check_args`), or derived from the example: each
dynamic axis resampled to another length (twice the size first, then +1 and 1.5x; the first the
model accepts eagerly is used). Resampling repeats entries (a sorted batch vector stays sorted, an
index stays in range) and moves repeated floating entries by a small random amount, so that no
exact tie decides an order differently in the two runtimes.

The agreement asked at the second size is the one seen at the example, in units of the tolerance
(rtol, atol): an output may be up to ten times further from eager than at the example, never less
close than the tolerance itself. Integer and boolean outputs must be equal. That bar means
nothing if the example itself is wrong: opbridge.export (example_must_agree) first refuses an
output that is wrong at the example beyond rounding (WRONG), with or without a dynamic axis.
Eager runs on copies of the inputs, so a model that writes into them does not change what the
runtime is fed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import warnings
from typing import Sequence

import numpy as np
import onnx
import torch

from .._library.errors import OpbridgeError
from .._library.kinds import tensor_leaves
from .agreement import Gap, gap, wrong_at_example
from .feeds import match_inputs, tensor_paths

log = logging.getLogger("opbridge")

# How much worse than at the example (in units of the tolerance) an output may agree at the second size.
SLACK = 10.0


class UnprovenWarning(UserWarning):
    """A dynamic axis of an exported model could not be run at a second size, so nothing shows
    the model is right at sizes other than the example's."""


@dataclasses.dataclass(frozen=True)
class DynamicAxis:
    input: str  # the graph input's name
    path: str  # where the tensor sits in the call: args[0]['pos']
    axis: int
    symbol: str  # the dimension's name in the graph
    size: int  # the example's size

    def __str__(self) -> str:
        where = f"input '{self.input}'" + (f" ({self.path})" if self.path and self.path != self.input else "")
        return f"{where} axis {self.axis} ('{self.symbol}')"


@dataclasses.dataclass
class Proof:
    """What the proof ran: the sizes per dimension name (example size, second size), or why
    nothing could be run."""

    sizes: dict[str, tuple[int, int]]
    axes: list[DynamicAxis]
    source: str  # "check_args", "derived", or "" when not run
    why_not: str = ""

    def __str__(self) -> str:
        if not self.source:
            return f"dynamic axes not proven at a second size: {self.why_not}"
        sizes = ", ".join(f"{sym}: {a} -> {b}" for sym, (a, b) in self.sizes.items())
        return f"dynamic axes proven at a second size ({self.source}): {sizes}"


def dynamic_axes(proto: onnx.ModelProto, pairs: list[tuple[str, int]], tensors: list,
                 paths: list[str]) -> list[DynamicAxis]:
    """The graph inputs' dimensions that are not fixed, with the example's sizes."""
    by_name = {i.name: i for i in proto.graph.input}
    out = []
    for name, k in pairs:
        dims = by_name[name].type.tensor_type.shape.dim if name in by_name else []
        t = tensors[k]
        for ax, d in enumerate(dims):
            if ax < t.dim() and not d.HasField("dim_value"):
                out.append(DynamicAxis(name, paths[k], ax, d.dim_param or f"{name}_dim{ax}", int(t.shape[ax])))
    return out


def _candidates(size: int) -> list[int]:
    """Second sizes to try, best first: doubling changes every size derived by division (n // 4)
    and every product; +1 and 1.5x catch what only an odd or non-power size shows. Sizes 0 and 1
    are special in PyTorch's tracing (broadcasting, specialisation) and are not tried."""
    out = []
    for c in (2 * size, size + 1, size + size // 2, size - 1):
        if c >= 2 and c != size and c not in out:
            out.append(c)
    return out


def _resampled(t: torch.Tensor, new_sizes: dict[int, int], gen: torch.Generator) -> torch.Tensor:
    """t with each axis in new_sizes resampled to its new length by repeating (or dropping)
    entries in order; repeated floating entries move by a small random amount."""
    for ax, new in new_sizes.items():
        old = t.shape[ax]
        index = torch.div(torch.arange(new) * old, new, rounding_mode="floor")
        t = t.index_select(ax, index)
        if t.is_floating_point() or t.is_complex():
            repeated = torch.zeros(new, dtype=torch.bool)
            repeated[1:] = index[1:] == index[:-1]
            if repeated.any():
                finite = t[torch.isfinite(t)] if t.numel() else t
                scale = float(finite.float().std()) if finite.numel() > 1 else 1.0
                scale = 1e-3 * (scale if np.isfinite(scale) and scale > 0 else 1.0)
                shape = [1] * t.dim()
                shape[ax] = new
                noise = torch.randn(t.shape, generator=gen, dtype=torch.float64) * scale
                t = t + (noise * repeated.view(shape)).to(t.dtype)
    return t


def _second_inputs(args: tuple, kwargs: dict, axes: list[DynamicAxis], indices: dict[str, int],
                   sizes: dict[str, int], seed: int = 0) -> tuple[tuple, dict]:
    """The call with every dynamic axis resampled to sizes[symbol]."""
    gen = torch.Generator().manual_seed(seed)
    per_tensor: dict[int, dict[int, int]] = {}
    for a in axes:
        per_tensor.setdefault(indices[a.input], {})[a.axis] = sizes[a.symbol]
    counter = iter(range(1 << 30))

    def resample(leaf):
        if not isinstance(leaf, torch.Tensor):
            return leaf
        k = next(counter)
        return _resampled(leaf.detach(), per_tensor[k], gen) if k in per_tensor else leaf

    return torch.utils._pytree.tree_map(resample, (args, kwargs))


@contextlib.contextmanager
def as_exported(model, exporter: str = ""):
    """The model as the exporter traced it, for eager runs beside the export: in eval mode for the
    TorchScript exporter (which traces in eval mode); and afterwards as it was, training flags and
    buffers (BatchNorm's running statistics, which a call in training mode updates) put back."""
    if not isinstance(model, torch.nn.Module):
        yield
        return
    modes = [(m, m.training) for m in model.modules()]
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        if exporter == "torchscript":
            model.eval()
        yield
    finally:
        for m, training in modes:
            m.training = training
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)


def _eager(model, args: tuple, kwargs: dict, quiet) -> list[np.ndarray]:
    # On copies: a model that writes into its inputs must not change what the runtime is fed.
    args, kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, torch.clone, (args, kwargs))
    with torch.no_grad(), quiet():
        return [t.detach().cpu().numpy() for t in tensor_leaves(model(*args, **kwargs))]


def _ort(sess, pairs: list[tuple[str, int]], args: tuple, kwargs: dict) -> list[np.ndarray]:
    tensors = tensor_leaves((args, kwargs))
    return sess.run(None, {n: tensors[k].detach().cpu().contiguous().numpy() for n, k in pairs})


def _compare(out_names, got, want, base: list[Gap] | None, rtol, atol, random: set, rt: str) -> list[str]:
    """The outputs that disagree, each with how; base: the gaps at the example (the bar); random:
    outputs random by their op's declaration, held to dtype and rank only."""
    if len(got) != len(want):
        return [f"{rt} gives {len(got)} outputs, eager {len(want)}"]
    bad = []
    for k, (name, g, w) in enumerate(zip(out_names, got, want)):
        if name in random:
            if g.dtype != w.dtype or g.ndim != w.ndim:
                bad.append(f"output '{name}' (random by declaration): dtype {g.dtype} rank {g.ndim} in {rt}, "
                           f"{w.dtype} rank {w.ndim} eagerly")
            continue
        here = gap(name, g, w, rtol, atol, rt)
        bar = 1.0 if base is None or not np.isfinite(base[k].excess) else max(1.0, SLACK * base[k].excess)
        if here.excess > bar:
            was = f"; at the example: {base[k].text or 'equal'}" if base is not None and base[k].text else ""
            bad.append(f"output '{name}' {list(w.shape)}: {here.text}{was}")
    return bad


def _suspects(proto: onnx.ModelProto, sizes: dict[str, int], limit: int = 8) -> list[str]:
    """Values in the graph that equal an example size, or an exact fraction of one (n / 2, n / 4,
    ... n / 32): attributes of custom nodes and small integer constants (Reshape shapes, Expand
    sizes) are where an exporter bakes a size the model computed from its input."""
    from onnx import numpy_helper

    def relation(v: int) -> str | None:
        for sym, s in sizes.items():
            for k in (1, 2, 3, 4, 8, 16, 32):
                if s % k == 0 and v == s // k and v > 1:
                    return f"= {sym} {s}" + (f" / {k}" if k > 1 else "")
        return None

    out: list[str] = []
    for node in proto.graph.node:
        custom = node.domain not in ("", "ai.onnx")
        if not custom and node.op_type != "Constant":
            continue
        label = f"{node.domain + '::' if node.domain else ''}{node.op_type} '{node.name}'"
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                arr = numpy_helper.to_array(a.t)
                vals, what = ([int(v) for v in arr.ravel()] if arr.dtype.kind in "iu" and arr.size <= 16 else []), "holds"
            elif custom and a.type in (onnx.AttributeProto.INT, onnx.AttributeProto.INTS):
                vals, what = (list(a.ints) if a.type == onnx.AttributeProto.INTS else [a.i]), f"attribute {a.name}="
            else:
                continue
            for v in vals:
                why = relation(int(v))
                if why:
                    out.append(f"{label} {what}{' ' if what == 'holds' else ''}{int(v)} ({why})")
                    break
    for init in proto.graph.initializer:
        if init.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) and np.prod(init.dims or [1]) <= 16:
            for v in numpy_helper.to_array(init).ravel():
                why = relation(int(v))
                if why:
                    out.append(f"constant '{init.name}' holds {int(v)} ({why})")
                    break
    return out[:limit] + ([f"... {len(out) - limit} more"] if len(out) > limit else [])


def prove(model, args: tuple, kwargs: dict | None, proto: onnx.ModelProto, *, sess=None,
          check_args: tuple | None = None, check_kwargs: dict | None = None,
          input_names: Sequence[str] | None = None, rtol: float = 1e-5, atol: float = 1e-6,
          exporter: str = "", who: str = "opbridge.export", random: set | None = None,
          example_must_agree: bool = False, quiet_eager=contextlib.nullcontext) -> Proof:
    """Runs the proof (see the module's doc). Raises OpbridgeError when the runtime fails or
    disagrees with eager at the second size; warns (UnprovenWarning) when no second size could be
    run; returns what was run. example_must_agree: also raises when the runtime disagrees with eager
    at the example itself (beyond WRONG, whether or not an axis is dynamic); opbridge.verify reports
    that itself. quiet_eager: the context the model runs eagerly in (opbridge.export hides that
    thread's warnings there: the caller had them once, from the trace)."""
    with as_exported(model, exporter):  # eager as traced, and the model left as it was
        return _prove(model, args, kwargs, proto, sess=sess, check_args=check_args, check_kwargs=check_kwargs,
                      input_names=input_names, rtol=rtol, atol=atol, exporter=exporter, who=who, random=random,
                      example_must_agree=example_must_agree, quiet_eager=quiet_eager)


def _prove(model, args: tuple, kwargs: dict | None, proto: onnx.ModelProto, *, sess=None,
          check_args: tuple | None = None, check_kwargs: dict | None = None,
          input_names: Sequence[str] | None = None, rtol: float = 1e-5, atol: float = 1e-6,
          exporter: str = "", who: str = "opbridge.export", random: set | None = None,
          example_must_agree: bool = False, quiet_eager=contextlib.nullcontext) -> Proof:

    from .session import runtime_name, session, session_options

    kwargs = kwargs or {}
    call = getattr(model, "module", None) if isinstance(model, torch.export.ExportedProgram) else None
    run = call() if call is not None else model
    tensors = tensor_leaves((args, kwargs))
    graph_inputs = [i.name for i in proto.graph.input]
    pairs, _ = match_inputs(graph_inputs, model, args, kwargs, input_names)
    axes = dynamic_axes(proto, pairs, tensors, tensor_paths(args, kwargs))
    # bfloat16 has no numpy dtype to feed the runtime with: such a model is not run here.
    if not axes and (not example_must_agree or any(t.dtype == torch.bfloat16 for t in tensors)):
        return Proof({}, [], "", "no dynamic axis")
    indices = dict(pairs)
    examples: dict[str, int] = {}
    for a in axes:
        examples.setdefault(a.symbol, a.size)
    if sess is None:
        options = session_options()
        options.log_severity_level = 4  # a failing run is reported below, once, with what to do
        sess = session(proto, options=options)
    rt = runtime_name(sess)
    out_names = [o.name for o in sess.get_outputs()]
    try:
        at_example = _ort(sess, pairs, args, kwargs)
    except Exception as e:  # noqa: BLE001 - reported with what to look at
        raise OpbridgeError(f"{who}: the exported model fails in {rt} at the example's own sizes: "
                            f"{_first_line(e)}") from None
    want_example = _eager(run, args, kwargs, quiet_eager)
    base = [gap(n, g, w, rtol, atol, rt) for n, g, w in zip(out_names, at_example, want_example)]
    if example_must_agree:
        # Layers that compute otherwise in training mode (batch statistics, dropout), left in it.
        modal = (torch.nn.modules.batchnorm._NormBase, torch.nn.modules.dropout._DropoutNd)
        training = call is None and isinstance(run, torch.nn.Module) and \
            any(m.training and isinstance(m, modal) for m in run.modules())
        wrong_at_example(who, rt, exporter, base, at_example, want_example, random or set(), training)
    if not axes:
        return Proof({}, [], "", "no dynamic axis")

    if check_args is not None or check_kwargs is not None:
        args2 = tuple(check_args) if check_args is not None else args
        kwargs2 = check_kwargs if check_kwargs is not None else kwargs
        t2 = tensor_leaves((args2, kwargs2))
        if len(t2) != len(tensors):
            raise OpbridgeError(f"{who}: check_args holds {len(t2)} tensors, the example {len(tensors)}")
        sizes = {}
        for a in axes:
            given = t2[indices[a.input]]
            if given.dim() <= a.axis:
                raise OpbridgeError(f"{who}: check_args gives {a} a tensor of rank {given.dim()}")
            sizes.setdefault(a.symbol, int(given.shape[a.axis]))
        want = _eager(run, args2, kwargs2, quiet_eager)
        source = "check_args"
        same = sorted(str(a) for a in axes if sizes[a.symbol] == a.size)
        if same:
            warnings.warn(UnprovenWarning(f"{who}: check_args has the example's size on {', '.join(same)}: that axis is "
                                          "not proven at a second size"), stacklevel=3)
    else:
        tried: list[str] = []
        cands = {sym: _candidates(s) for sym, s in examples.items()}
        want = None
        for k in range(max(len(c) for c in cands.values()) if all(cands.values()) else 0):
            sizes = {sym: c[min(k, len(c) - 1)] for sym, c in cands.items()}
            args2, kwargs2 = _second_inputs(args, kwargs, axes, indices, sizes)
            try:
                want = _eager(run, args2, kwargs2, quiet_eager)
                break
            except Exception as e:  # noqa: BLE001 - the model refusing a size is an answer: try another
                first = (str(e).strip().splitlines() or [""])[0][:200]
                tried.append(f"{_sizes_text(examples, sizes)}: {type(e).__name__}: {first}")
        if want is None:
            why = ("the model ran eagerly at none of the sizes tried (" + "; ".join(tried) + ")" if tried
                   else "an empty axis has no entries to make a second size of")
            proof = Proof({}, axes, "", why)
            warnings.warn(UnprovenWarning(
                f"{who}: {', '.join(str(a) for a in axes)} declared dynamic but not proven at a second size: {why}. "
                "Pass check_args= (inputs at other sizes) to prove them, or prove_dynamic=False to accept the risk"),
                stacklevel=3)
            return proof
        source = "derived"
    try:
        got = _ort(sess, pairs, args2, kwargs2)
    except Exception as e:  # noqa: BLE001 - reported with what to look at
        raise OpbridgeError(_failure(who, examples, sizes, axes, proto, exporter,
                                     [f"{rt} fails: {_first_line(e)}"])) from None
    bad = _compare(out_names, got, want, base, rtol, atol, random or set(), rt)
    if bad:
        raise OpbridgeError(_failure(who, examples, sizes, axes, proto, exporter, bad))
    proof = Proof({sym: (examples[sym], sizes[sym]) for sym in examples}, axes, source)
    log.info("%s: %s", who, proof)
    return proof


def _sizes_text(examples: dict[str, int], sizes: dict[str, int]) -> str:
    return ", ".join(f"{sym} {examples[sym]} -> {sizes[sym]}" for sym in examples)


def _first_line(e: BaseException) -> str:
    from .inspect import clean_ort_message

    text = clean_ort_message(str(e)).strip()
    return (text.splitlines() or [type(e).__name__])[0][:400]


def _failure(who, examples, sizes, axes, proto, exporter, bad: list[str]) -> str:
    lines = [f"{who}: the exported model is wrong at a second size of its dynamic axes "
             f"({_sizes_text(examples, sizes)}; right at the example's):"]
    lines += [f"  dynamic: {a} exported at {a.size}, run at {sizes[a.symbol]}" for a in axes]
    lines += [f"  {b}" for b in bad]
    suspects = _suspects(proto, examples)
    if suspects:
        lines.append("  likely cause, values in the graph that equal an example size:")
        lines += [f"    {s}" for s in suspects]
    if exporter == "torchscript":
        lines.append("  the TorchScript exporter's trace fixes Python loops over a size and sizes read as numbers "
                     "(its TracerWarnings name the lines): exporter='dynamo' refuses such models instead")
    lines.append("  Inputs at other sizes: check_args=...; to export anyway (at your own risk): prove_dynamic=False")
    return "\n".join(lines)
