"""opbridge.verify: a runtime (ONNX Runtime, or OpenVINO) against PyTorch eager on the same inputs."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch

from .._library.errors import OpbridgeError
from .._library.kinds import positional, tensor_leaves
from .inspect import cannot_run, clean_ort_message
from .feeds import match_inputs
from .second_size import prove
from .session import RUNTIME_NAMES, runtime_name, session


@dataclasses.dataclass
class OutputDiff:
    name: str
    shape: tuple
    dtype: str
    max_abs: float
    max_rel: float
    ok: bool
    note: str = ""
    # Elements out of tolerance (integers and bools: elements that differ at all).
    mismatches: int = 0
    # Where the worst of them is (its multi-index; the first such element on ties) and the two
    # values there; None when nothing mismatches or the shapes or dtypes differ.
    index: tuple[int, ...] | None = None
    got: Any = None  # the runtime's value there
    want: Any = None  # PyTorch's
    # Why the values were not compared ("random by declaration: <op> with <attr>=1"); "": compared.
    random: str = ""
    runtime: str = "ONNX Runtime"  # the runtime that computed `got`, as the note names it


@dataclasses.dataclass
class VerifyReport:
    outputs: list[OutputDiff]
    rtol: float
    atol: float
    # Why the runtime cannot run the model at all (no outputs then); "" when it ran.
    cannot_run: str = ""
    # Inputs of the call that the exported graph does not have (an exporter drops an input the
    # graph never reads); matched by name, the others were fed.
    dropped_inputs: tuple[str, ...] = ()
    # The second-size proof of the graph's dynamic axes: what it ran ("" when the graph has none or
    # it was not asked for), and whether it held.
    second_size: str = ""
    second_size_ok: bool = True
    runtime: str = "ONNX Runtime"  # the runtime that ran the model, as messages name it

    @property
    def ok(self) -> bool:
        return not self.cannot_run and all(o.ok for o in self.outputs) and self.second_size_ok

    def table(self) -> str:
        if self.cannot_run:
            return f"cannot run: {self.cannot_run}"
        head = f"{'output':<16} {'shape':<16} {'dtype':<8} {'max abs diff':>13} {'max rel diff':>13}  result"
        lines = [head, "-" * len(head)]
        if self.dropped_inputs:
            lines.insert(0, f"inputs the exported graph does not take (unused): {', '.join(self.dropped_inputs)}")
        for o in self.outputs:
            if o.ok:
                verdict = f"ok ({o.note})" if o.random else "ok"
            else:
                verdict = f"MISMATCH {o.note}".rstrip()
            diffs = (f"{'-':>13} {'-':>13}" if o.random else f"{o.max_abs:>13.3e} {o.max_rel:>13.3e}")
            lines.append(f"{o.name:<16} {str(list(o.shape)):<16} {o.dtype:<8} {diffs}  {verdict}")
        if self.second_size:
            lines.append(("" if self.second_size_ok else "SECOND SIZE: ") + self.second_size)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def compare(name: str, got: np.ndarray, want: np.ndarray, rtol: float, atol: float,
            runtime: str = "ONNX Runtime") -> OutputDiff:
    """Compares one output of `runtime` with its PyTorch reference: integers and bools exactly,
    floating point within atol + rtol * |want|. A mismatch says how many elements are out, where
    the worst one is and both values there."""
    if got.shape != want.shape:
        return OutputDiff(name, want.shape, str(want.dtype), np.inf, np.inf, False, f"shape {got.shape} != {want.shape}")
    if got.dtype != want.dtype:
        return OutputDiff(name, want.shape, str(want.dtype), np.inf, np.inf, False, f"dtype {got.dtype} != {want.dtype}")
    if got.size == 0:
        return OutputDiff(name, want.shape, str(want.dtype), 0.0, 0.0, True)
    if want.dtype.kind in "biu":
        return _compare_exact(name, got, want, runtime)
    g, w = got.astype(np.float64), want.astype(np.float64)
    same_nan = np.isnan(g) == np.isnan(w)
    # Equal values (infinities included) and NaN against NaN differ by nothing.
    with np.errstate(invalid="ignore"):
        diff = np.where((g == w) | (np.isnan(g) & np.isnan(w)), 0.0, np.abs(g - w))
    max_abs = float(np.max(diff))
    max_rel = float(np.max(diff / np.maximum(np.abs(w), np.finfo(np.float64).tiny)))
    with np.errstate(invalid="ignore"):  # rtol * inf is NaN for rtol=0: equal values pass anyway
        bad = ~(same_nan & ((diff == 0) | (diff <= atol + rtol * np.abs(w))))
    new_nans = int(np.count_nonzero(np.isnan(g) & ~np.isnan(w)))
    # A NaN only the runtime gives is most often a guard the graph lost on the way (x + 1e-8
    # folded into x): say where to look.
    nan_note = (f"{new_nans} NaN where PyTorch has none: a graph optimisation may have dropped a guard such as "
                "`+ 1e-8`; export with optimize=False to check" if new_nans else "")
    out = OutputDiff(name, want.shape, str(want.dtype), max_abs, max_rel, not bad.any(), nan_note, runtime=runtime)
    if bad.any():  # the worst element out of tolerance; a NaN on one side only counts as the worst
        _locate(out, bad, np.where(bad, np.nan_to_num(diff, nan=np.inf), -1.0), got, want)
        out.note = "; ".join(n for n in (_where(out), nan_note) if n)
    return out


def _compare_exact(name: str, got: np.ndarray, want: np.ndarray, runtime: str) -> OutputDiff:
    """Integers and bools: any difference is a mismatch (a float rule would pass an index off by
    one once it is >= 1 / rtol)."""
    bad = got != want
    if want.dtype.kind == "b":
        out = OutputDiff(name, want.shape, str(want.dtype), float(bad.any()), float(bad.any()), not bad.any(),
                         runtime=runtime)
        if bad.any():
            _locate(out, bad, bad.astype(np.float64), got, want)
            out.note = _where(out)
        return out
    # Ranked in float64 (exact up to 2**53); the reported difference is exact.
    diff = np.where(bad, np.abs(got.astype(np.float64) - want.astype(np.float64)), -1.0)
    out = OutputDiff(name, want.shape, str(want.dtype), 0.0, 0.0, not bad.any(), runtime=runtime)
    if bad.any():
        _locate(out, bad, diff, got, want)
        out.max_abs = float(abs(out.got - out.want))
        out.max_rel = float(np.max(np.where(bad, diff, 0.0) / np.maximum(np.abs(want.astype(np.float64)), 1.0)))
        out.note = _where(out)
    return out


def _locate(out: OutputDiff, bad: np.ndarray, score: np.ndarray, got: np.ndarray, want: np.ndarray) -> None:
    """Fills in how many elements are bad and the worst one (highest score; the first on ties)."""
    out.mismatches = int(np.count_nonzero(bad))
    out.index = tuple(int(i) for i in np.unravel_index(int(np.argmax(score)), want.shape))
    out.got, out.want = got[out.index].item(), want[out.index].item()


def _where(out: OutputDiff) -> str:
    total = int(np.prod(out.shape))
    by = ""
    if isinstance(out.got, (int, float)) and isinstance(out.want, (int, float)) and not isinstance(out.got, bool):
        by = f" (off by {abs(out.got - out.want):g})" if isinstance(out.got, float) else \
            f" (off by {abs(out.got - out.want)})"
    return (f"{out.mismatches} of {total} elements differ; worst at {list(out.index)}: "
            f"{out.runtime} {out.got!r}, PyTorch {out.want!r}{by}")


def compare_random(name: str, got: np.ndarray, want: np.ndarray, why: str, shape_why: str = "") -> OutputDiff:
    """An output whose values are random by declaration (see random_outputs): only its dtype, and
    its shape unless `shape_why` says the shape depends on the random values (then its rank)."""
    note = f"random by declaration: {why}; " + (f"dtype and rank compared, shape depends on it through {shape_why}"
                                                 if shape_why else "shape and dtype compared")
    out = OutputDiff(name, want.shape, str(want.dtype), np.nan, np.nan, True, note, random=why)
    if got.dtype != want.dtype:
        out.ok, out.note = False, f"dtype {got.dtype} != {want.dtype} ({note})"
    elif (got.ndim != want.ndim) if shape_why else (got.shape != want.shape):
        out.ok, out.note = False, f"shape {got.shape} != {want.shape} ({note})"
    return out


# Standard ops whose output size can depend on input values: the inputs whose values size it
# (None: any input, or a subgraph's).
_SIZED_BY = {
    "NonZero": (0,), "Unique": (0,), "Compress": (1,), "NonMaxSuppression": None, "Range": None,
    "ConstantOfShape": (0,), "Expand": (1,), "Reshape": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Pad": (1, 3),
    "Resize": (1, 2, 3), "Upsample": (1,), "OneHot": (1,), "TopK": (1,), "Squeeze": (1,), "Unsqueeze": (1,),
    "Split": (1,), "CenterCropPad": (1,), "Col2Im": (1, 2), "MaxUnpool": (2,), "DFT": (1,), "STFT": (2, 3),
    "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,),
    "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSum": (1,), "ReduceLogSumExp": (1,), "ReduceSumSquare": (1,),
    "Loop": None, "If": None, "Scan": None, "SplitToSequence": (1,), "SequenceAt": None,
    "ConcatFromSequence": None, "StringSplit": (0,)}


@dataclasses.dataclass(frozen=True)
class _Taint:
    why: str  # "<op> with <attr>=1": the random node it comes from
    shape_why: str = ""  # a node through which the size depends on the random values; "": it does not


def random_outputs(model: onnx.ModelProto) -> dict[str, tuple[str, str]]:
    """The graph outputs computed from a node of an op whose outputs are random by declaration
    (its manifest's random_when attribute is true on the node): output name -> (why, the node
    through which its shape depends on the random values, or ""). Walks the graph forwards from
    such nodes, through subgraphs and model-local functions."""
    from .._library.registry import all_ops
    from .inspect.onnx_types import registry_domain

    ops = {(registry_domain(op.onnx_domain), op.onnx_type): op for op in all_ops() if op.has_own_node}
    functions = {(f.domain, f.name): f for f in model.functions}

    def node_why(node: onnx.NodeProto, seen: frozenset) -> str:
        """Why the node draws random numbers itself (inside its subgraphs or function body too)."""
        op = ops.get((registry_domain(node.domain), node.op_type))
        if op is not None and op.random_when:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute if not a.ref_attr_name}
            why = op.random_with(attrs)
            ref = next((a.ref_attr_name for a in node.attribute if a.name == op.random_when and a.ref_attr_name), "")
            if why or ref:  # an attribute of the calling function's: it may be true
                return why or f"{op.name} with {op.random_when} from the function's attribute '{ref}'"
        fn = functions.get((node.domain, node.op_type))
        if fn is not None and (node.domain, node.op_type) not in seen:
            for inner in fn.node:
                why = node_why(inner, seen | {(node.domain, node.op_type)})
                if why:
                    return why
        for g in _subgraphs(node):
            for inner in g.node:
                why = node_why(inner, seen)
                if why:
                    return why
        return ""

    taint: dict[str, _Taint] = {}
    for node in model.graph.node:  # topologically sorted, as ONNX requires
        outer = [n for g in _subgraphs(node) for n in referenced(g) if n in taint]
        tainted = [k for k, n in enumerate(node.input) if n in taint]
        incoming = [taint[node.input[k]] for k in tainted] + [taint[n] for n in outer]
        own = node_why(node, frozenset())
        if not incoming and not own:
            continue
        why = own or incoming[0].why
        shape_why = next((t.shape_why for t in incoming if t.shape_why), "")
        op = ops.get((registry_domain(node.domain), node.op_type))
        direct = bool(own) and op is not None and bool(op.random_when)  # the random node itself
        # Its own outputs have the sizes its rules give. Past a node sized by the values of a
        # random input, or out of a subgraph or function body that draws the numbers, the size
        # may follow them.
        if op is not None:
            sized_by_values = op.data_dependent
        elif (node.domain, node.op_type) in functions:
            sized_by_values = True
        elif registry_domain(node.domain) == "" and node.op_type in _SIZED_BY:
            sizing = _SIZED_BY[node.op_type]
            sized_by_values = sizing is None or bool(outer) or any(k in sizing for k in tainted)
        else:
            sized_by_values = False
        if not shape_why and ((incoming and sized_by_values) or (own and not direct)):
            shape_why = f"{node.op_type} node '{node.name}'" if node.name else f"a {node.op_type} node"
        for o in node.output:
            if o:
                taint[o] = _Taint(why, shape_why)
    return {o.name: (taint[o.name].why, taint[o.name].shape_why) for o in model.graph.output if o.name in taint}


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    return [g for a in node.attribute for g in ([a.g] if a.HasField("g") else []) + list(a.graphs)]


def referenced(graph: onnx.GraphProto):
    """Every tensor name the graph's nodes (and theirs, nested) read: outer-scope ones among them."""
    for n in graph.node:
        yield from n.input
        for g in _subgraphs(n):
            yield from referenced(g)


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
    prove_dynamic: bool = True,
    check_args: tuple | None = None,
    check_kwargs: dict[str, Any] | None = None,
    runtime: str = "onnxruntime",
) -> VerifyReport:
    """Runs torch eager and ONNX Runtime on the same inputs; reports the largest absolute and
    relative difference per output. A model the runtime cannot load gives a report that is not
    ok and says why (`cannot_run`) instead of the runtime's exception. The tensors of args and
    kwargs (nested ones too, in order) feed the graph inputs in order. Where the graph has fewer
    inputs (an exporter dropped one it never reads), they are matched by name: `input_names` as
    given to export, else the names of forward's parameters that take a tensor; the report lists
    the dropped ones. Outputs are compared in order of their tensors.

    Where the graph has dynamic input axes, they are proven at a second size as opbridge.export
    proves them (prove_dynamic; check_args / check_kwargs give the inputs, else they are derived):
    the report's `second_size` says what ran, and a failure there makes the report not ok.

    runtime="openvino" runs the model in OpenVINO instead (opbridge.session's runtime=); `sess`,
    when given, is the runtime's session. The report and its messages name the runtime that ran."""
    args = positional(args)
    kwargs = kwargs or {}
    if sess is None:
        try:
            sess = session(onnx_model, runtime=runtime)
        except (OpbridgeError, ort.capi.onnxruntime_pybind11_state.Fail,
                ort.capi.onnxruntime_pybind11_state.NotImplemented, ort.capi.onnxruntime_pybind11_state.InvalidGraph) as e:
            return VerifyReport([], rtol, atol, _why_not(onnx_model, e, runtime),
                                runtime=RUNTIME_NAMES.get(runtime, runtime))
    name = runtime_name(sess)
    tensors = tensor_leaves((args, kwargs))
    try:
        pairs, dropped = match_inputs([i.name for i in sess.get_inputs()], model, args, kwargs, input_names)
    except OpbridgeError as e:
        raise OpbridgeError(f"verify: {e}") from None
    with torch.no_grad():
        want = [t.detach().cpu().numpy() for t in tensor_leaves(model(*args, **kwargs))]
    feeds = {n: tensors[k].detach().cpu().contiguous().numpy() for n, k in pairs}
    got = sess.run(None, feeds)
    if len(got) != len(want):
        raise OpbridgeError(f"verify: {name} returned {len(got)} outputs, PyTorch {len(want)}")
    out_names = [o.name for o in sess.get_outputs()]
    graph = _graph(onnx_model)
    report = VerifyReport(compare_outputs(out_names, got, want, rtol, atol, graph, name), rtol, atol,
                          dropped_inputs=dropped, runtime=name)
    if prove_dynamic and graph is not None:
        try:
            proof = prove(model, args, kwargs, graph, sess=sess, check_args=check_args, check_kwargs=check_kwargs,
                          input_names=input_names, rtol=rtol, atol=atol, who="opbridge.verify",
                          random=set(random_outputs(graph)))
            report.second_size = str(proof) if proof.source or proof.axes else ""
        except OpbridgeError as e:
            report.second_size, report.second_size_ok = str(e), False
    return report


def compare_outputs(names: list[str], got: list[np.ndarray], want: list[np.ndarray], rtol: float, atol: float,
                    model: onnx.ModelProto | None = None, runtime: str = "ONNX Runtime") -> list[OutputDiff]:
    """compare() per output (`got` computed by `runtime`), except that an output of `model` that
    is random by declaration (random_outputs) is held to its dtype and shape only, saying why."""
    random = random_outputs(model) if model is not None else {}
    return [compare_random(n, g, w, *random[n]) if n in random else compare(n, g, w, rtol, atol, runtime)
            for n, g, w in zip(names, got, want)]


def _graph(onnx_model) -> onnx.ModelProto | None:
    """The model's graph without its external weights (only its nodes are read); None when it
    cannot be read, and nothing is then random by declaration."""
    try:
        if isinstance(onnx_model, onnx.ModelProto):
            return onnx_model
        if isinstance(onnx_model, bytes):
            return onnx.load_from_string(onnx_model)
        return onnx.load(os.fspath(onnx_model), load_external_data=False)
    except Exception:  # noqa: BLE001 - ONNX Runtime loaded it; the comparison goes on value by value
        return None


def _why_not(onnx_model, error: Exception, runtime: str) -> str:
    """Why the runtime refused the model: inspect's verdict (for that runtime) per node it cannot
    run, else the runtime's own words."""
    try:
        model = onnx_model if isinstance(onnx_model, onnx.ModelProto) else (
            onnx.load_from_string(onnx_model) if isinstance(onnx_model, bytes) else onnx.load(os.fspath(onnx_model)))
        problems = cannot_run(model, runtime=runtime)
    except Exception:  # noqa: BLE001 - the runtime's own message is still an answer
        problems = []
    return "; ".join(problems) if problems else clean_ort_message(str(error))
