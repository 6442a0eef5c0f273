"""Edge values give the same bits in eager PyTorch and in ONNX Runtime: NaN, ±inf, -0.0, the
smallest subnormal, the largest finite value, values that round differently in float16 and
bfloat16, int8's -128 and 127.

Every op of the built-in library that takes floating-point inputs runs its test samples (its
OpCase's; a backward op those autograd derives from its forward op's) in each floating dtype its
definition allows, with the values of its floating-point inputs replaced by edge values (all of them
at once, and each alone; integer inputs such as indices and offsets keep theirs, so shapes and
indices stay valid), eagerly and as a one-node model in ONNX Runtime: both give the same bits (any
NaN equals any NaN), or both refuse, naming the op with the same reason. foo, my_add, asinh and
selu are also checked against numpy."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import opbridge
from opbridge._library.kinds import DTYPES, dtype_of
from opbridge._tools.testing._cases import ORT_ERRORS
from opbridge.testing import node_model
from op_cases import builtin_ops, op_cases, run_isolated, samples_of

FLOATS = ("float16", "bfloat16", "float32", "float64")


def special_values(dtype: torch.dtype) -> list[float]:
    """The values whose results are exact in any correct implementation: NaN, ±inf, ±0, the
    smallest subnormal, the smallest normal and the largest finite value, each with both signs."""
    fi = torch.finfo(dtype)
    sub = fi.smallest_normal * fi.eps  # the smallest subnormal: 2^-24, 2^-133, 2^-149, 2^-1074
    return [math.nan, math.inf, -math.inf, 0.0, -0.0, sub, -sub, fi.smallest_normal, -fi.smallest_normal,
            fi.max, -fi.max]


def edge_values(dtype: torch.dtype) -> torch.Tensor:
    """The special values, then ordinary ones: 1 and its neighbour 1+eps, eps and 3·eps (added to 1
    or 2 they tie between two neighbours), a small negative value, half the largest value, the
    largest subnormal."""
    fi = torch.finfo(dtype)
    ordinary = [1.0, 1.0 + fi.eps, -1.0, 0.5, 2.0, -3.5, 0.1, fi.eps, 3 * fi.eps, -1e-5, fi.max / 2, 1000.0,
                fi.smallest_normal * (1 - fi.eps)]
    return torch.tensor(special_values(dtype) + ordinary, dtype=torch.float64).to(dtype)


def filled(t: torch.Tensor, shift: int, which: str = "all") -> torch.Tensor:
    """A tensor of t's shape and dtype holding edge values cycled from `shift` on: all of them,
    only the special ones ("special") or only the finite ones ("finite")."""
    e = edge_values(t.dtype)
    if which == "special":
        e = e[: len(special_values(t.dtype))]
    elif which == "finite":
        e = e[torch.isfinite(e)]
    return e[(torch.arange(t.numel()) + shift) % len(e)].reshape(t.shape)


# ---- the two sides ------------------------------------------------------------------------------

def ort_value(t: torch.Tensor) -> ort.OrtValue:
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: its bits, typed by ONNX
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(t.view(torch.int16).numpy(), TensorProto.BFLOAT16)
    return ort.OrtValue.ortvalue_from_numpy(t.numpy())


def one_node_model(op, inputs, attrs) -> onnx.ModelProto:
    """The op's own node (opbridge.testing.node_model, with the function of a function op), its
    bfloat16 outputs cast to float32 (exact) for numpy."""
    m = node_model(op, list(inputs) + [None] * (len(op.inputs) - len(inputs)), attrs)
    opbridge.add_functions(m)
    return with_float_outputs(m)


def with_float_outputs(m: onnx.ModelProto) -> onnx.ModelProto:
    for k, out in enumerate(list(m.graph.output)):
        if out.type.tensor_type.elem_type == TensorProto.BFLOAT16:
            m.graph.node.append(helper.make_node("Cast", [out.name], [out.name + "_f32"], to=TensorProto.FLOAT))
            m.graph.output[k].CopyFrom(helper.make_tensor_value_info(out.name + "_f32", TensorProto.FLOAT, None))
    return m


class Runner:
    """ONNX Runtime sessions of one-node models, one per model (the edge-value variants of a
    sample share theirs)."""

    def __init__(self):
        self.sessions = {}
        self.options = opbridge.session_options()
        self.options.log_severity_level = 4  # the refusals checked below are expected

    def run(self, m: onnx.ModelProto, feeds: dict, want_dtypes) -> list[torch.Tensor]:
        key = m.SerializeToString()
        if key not in self.sessions:
            self.sessions[key] = opbridge.session(key, options=self.options)
        outs = self.sessions[key].run_with_ort_values(None, {k: ort_value(v) for k, v in feeds.items()})
        return [torch.from_numpy(o.numpy()) if d is None else torch.from_numpy(o.numpy()).to(d)
                for o, d in zip(outs, want_dtypes)]

    def run_op(self, op, inputs, attrs, want_dtypes) -> list[torch.Tensor]:
        feeds = {spec.name: t for spec, t in zip(op.inputs, inputs) if t is not None}
        return self.run(one_node_model(op, inputs, attrs), feeds, want_dtypes)


def as_list(x) -> list:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def bits(t: torch.Tensor) -> np.ndarray:
    """The tensor's bits as unsigned integers (its values for integer tensors), every NaN the
    same quiet NaN."""
    t = t.detach().contiguous()
    if not t.is_floating_point():
        return t.numpy()
    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    b = t.view(width).numpy().copy()
    b[torch.isnan(t).numpy()] = torch.tensor(math.nan, dtype=t.dtype).view(width).item()
    return b


def differences(got: torch.Tensor, want: torch.Tensor, inputs=None, limit: int = 4) -> str:
    """'' when the two have the same dtype, shape and bits; else where they differ."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"{got.dtype}{list(got.shape)} != {want.dtype}{list(want.shape)}"
    wrong = np.flatnonzero((bits(got) != bits(want)).reshape(-1))
    if not len(wrong):
        return ""
    g, w = got.reshape(-1), want.reshape(-1)
    shown = []
    for i in wrong[:limit]:
        at = "" if inputs is None else "(" + ", ".join(repr(x.reshape(-1)[i].item()) for x in inputs) + ") "
        shown.append(f"[{i}] {at}{g[i].item()!r} != {w[i].item()!r}")
    return f"{len(wrong)} of {g.numel()} differ: " + "; ".join(shown)


def reason(message: str, op) -> str:
    """The op's reason in an error message: what follows '<op>: ' (eager) or '<op> (node ...): '
    (ONNX Runtime), up to the end of its line."""
    line = next((ln for ln in message.splitlines() if op.qualified_name in ln), "")
    rest = line.split(op.qualified_name, 1)[1] if line else ""
    if rest.startswith(" (node "):
        rest = rest.split("): ", 1)[1] if "): " in rest else rest
    return rest.removeprefix(": ").strip()


# ---- every op: eager and ONNX Runtime give the same bits on edge values -------------------------

def _floating_ops():
    ops = []
    for op in builtin_ops():
        if op.export_kind not in ("kernel", "function") or not op.available:
            continue  # mappings of another package's op: no node of their own
        floating = sorted({d for i in op.inputs for d in op.type_constraint(i.type).dtypes if d in FLOATS},
                          key=FLOATS.index)
        ops += [(op, d) for d in floating]
    return ops


FLOATING_OPS = _floating_ops()


def test_every_floating_op_has_samples():
    # An op added without samples (or a backward op whose forward op has none) would escape the
    # edge-value check below.
    lacking = sorted({op.name for op, _ in FLOATING_OPS if not samples_of(op)})
    assert not lacking, f"no samples to fill with edge values: {lacking}"
    assert {"foo", "my_add", "asinh", "selu", "deform_conv2d_backward"} <= {op.name for op, _ in FLOATING_OPS}


def _in_dtype(op, sample, dtype: str):
    """The sample's inputs with every floating input whose type constraint allows `dtype` in it
    (the others as they are); None when none does."""
    converted, out = False, []
    for spec, t in zip(op.inputs, sample.inputs):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and dtype in op.type_constraint(spec.type).dtypes:
            out.append(t.detach().to(DTYPES[dtype].torch))
            converted = True
        else:
            out.append(t)
    return out if converted else None


SAMPLES_PER_OP = 3  # the first ones of the op's case: enough layouts and attributes, in modest time


def _samples_in_dtype(op, dtype: str):
    """(sample, its inputs in `dtype`) for the first samples that ONNX Runtime runs, have a
    non-empty floating input, and have an input that can be `dtype`."""
    found = []
    for sample in samples_of(op):
        base = None if sample.no_onnxruntime else _in_dtype(op, sample, dtype)
        if base is not None and any(isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() for t in base):
            found.append((sample, base))
    return found[:SAMPLES_PER_OP]


def edge_value_failures(name: str, dtype: str) -> dict:
    """The edge-value check of one op in one dtype (run in a child process, see below): how many
    calls it made, and what disagreed."""
    op = opbridge.builtin.op(name)
    runner, checked, failures = Runner(), 0, []
    for sample, base in _samples_in_dtype(op, dtype):
        floating = [k for k, t in enumerate(base) if isinstance(t, torch.Tensor) and t.is_floating_point()
                    and t.numel()]
        # Every floating input at once, then the finite values only (NaN and infinities make many
        # ops refuse the call before they compute), then each input alone. PyTorch's own ops (asinh,
        # selu) run other code in ONNX Runtime than eagerly: the same bits only where the special
        # values' rules fix the result (their other values are checked against numpy below).
        which = "all" if op.defines_torch_op else "special"
        variants = [("all floating inputs", floating, which)]
        if op.defines_torch_op:
            variants.append(("all floating inputs, finite values", floating, "finite"))
        variants += [(op.inputs[k].name, [k], which) for k in floating if len(floating) > 1]
        for what, replaced, values in variants:
            inputs = list(base)
            for j, k in enumerate(replaced):
                inputs[k] = filled(inputs[k], shift=5 * j, which=values)
            where = f"sample {sample.name or '?'}, edge values in {what}"
            try:
                eager, eager_error = as_list(op.overload(*inputs, **sample.attrs)), None
            except RuntimeError as e:
                eager, eager_error = None, str(e)
            try:
                dtypes = [t.dtype for t in eager] if eager is not None else [None] * len(op.outputs)
                got, ort_error = runner.run_op(op, inputs, sample.attrs, dtypes), None
            except ORT_ERRORS as e:
                got, ort_error = None, str(e)
            checked += 1
            if eager_error or ort_error:
                # A value the op refuses (a NaN coordinate, a negative scale): both refuse, with the
                # op's name and the same reason.
                if eager_error is None or ort_error is None:
                    failures.append(f"{where}: only {'eager' if eager_error else 'ONNX Runtime'} refused: "
                                    f"{(eager_error or ort_error).splitlines()[0]}")
                elif not eager_error.startswith(op.qualified_name + ": ") or op.qualified_name not in ort_error \
                        or reason(eager_error, op) != reason(ort_error, op):
                    failures.append(f"{where}: refused differently:\n  eager: {eager_error.splitlines()[0]}\n"
                                    f"  ONNX Runtime: {ort_error.splitlines()[0]}")
                continue
            for k, (g, e) in enumerate(zip(got, eager)):
                diff = differences(g, e)
                if diff:
                    failures.append(f"{where}: output {op.outputs[k].name}: ONNX Runtime vs eager: {diff}")
    return {"checked": checked, "failures": failures}


@pytest.fixture(scope="module")
def edge_value_results(request):
    """edge_value_failures of every (op, dtype) this run selected, in child processes: a kernel
    that crashes or hangs on edge values fails its own test, and the others still run."""
    keys = sorted({tuple(item.callspec.params["op_dtype"]) for item in request.session.items
                   if item.originalname == "test_eager_and_onnxruntime_agree_bit_for_bit_on_edge_values"})
    return run_isolated("test_edge_values", "edge_value_failures", keys, timeout=120)


OP_DTYPES = [(op.name, d) for op, d in FLOATING_OPS]


@pytest.mark.parametrize("op_dtype", OP_DTYPES, ids=[f"{n}-{d}" for n, d in OP_DTYPES])
def test_eager_and_onnxruntime_agree_bit_for_bit_on_edge_values(op_dtype, edge_value_results):
    name, dtype = op_dtype
    result = edge_value_results[op_dtype]
    if "died" in result:
        pytest.fail(f"opbridge::{name} ({dtype}) on edge values: {result['died']}")
    if not result["checked"]:
        pytest.skip(f"no sample of {name} has a floating input that can be {dtype}")
    assert not result["failures"], f"{name} ({dtype}):\n" + "\n".join(result["failures"])


GRID_OPS = ("ball_query", "ball_query_offset", "radius")


def _with_extremes(points: torch.Tensor) -> torch.Tensor:
    """The points with the first two (of each batch item) at the largest value and its negative in
    every coordinate: the widest cloud there is."""
    points = points.clone()
    if points.dim() >= 2 and points.shape[-2] >= 2:
        points[..., 0, :], points[..., 1, :] = torch.finfo(points.dtype).max, -torch.finfo(points.dtype).max
    return points


def largest_coordinates_mismatches(name: str) -> list[str]:
    """Where the grid op `name` disagrees with its numpy reference on its samples with the finite
    edge values (run in a child process: this used to hang)."""
    case = op_cases()[name]
    mismatches = []
    for dtype in ("float64", "float32"):
        for sample, base in _samples_in_dtype(case.info, dtype):
            inputs = [_with_extremes(filled(t, 7 * k, "finite")) if isinstance(t, torch.Tensor)
                      and t.is_floating_point() else t for k, t in enumerate(base)]
            got = as_list(case.info.overload(*inputs, **sample.attrs))
            want = as_list(case.reference(*[None if t is None else t.numpy() for t in inputs], **sample.attrs))
            for k, (g, w) in enumerate(zip(got, want)):
                if not np.array_equal(g.numpy(), np.asarray(w)):
                    mismatches.append(f"{dtype} sample {sample.name}: output {case.info.outputs[k].name} differs")
    return mismatches


def test_grid_ops_keep_every_ball_at_the_largest_coordinates():
    # ball_query, ball_query_offset and radius sort points into a grid of cells: float64 points
    # near the largest value of both signs are further apart than any double. The grid used to
    # widen its cells forever there (a hang); every point within the radius of a centre is found,
    # as the numpy reference (a scan over every point) finds it.
    results = run_isolated("test_edge_values", "largest_coordinates_mismatches", [[n] for n in GRID_OPS], timeout=60)
    for name in GRID_OPS:
        assert results[(name,)] == [], f"opbridge::{name} on the largest coordinates: {results[(name,)]}"


# ---- against numpy: foo, my_add, asinh, selu ----------------------------------------------------

def bfloat16_bits(x32: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 rounded to nearest, ties to even (NaN stays NaN), in numpy: the bits."""
    b = np.ascontiguousarray(x32, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x32), np.uint16(0x7FC0), rounded)


def numpy_rounded(x32: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A float32 (or float64) numpy result rounded once to `dtype`, without torch's conversions."""
    if dtype == torch.bfloat16:
        return torch.from_numpy(bfloat16_bits(x32.astype(np.float32)).view(np.int16)).view(torch.bfloat16)
    with np.errstate(over="ignore"):  # to inf, as it should
        return torch.from_numpy(np.asarray(x32).astype(DTYPES[dtype_of(dtype).name].numpy))


def pairs(a: torch.Tensor, b: torch.Tensor):
    """Every (a[i], b[j]): the two operands of a binary op, flattened."""
    return a.repeat_interleave(len(b)), b.repeat(len(a))


# Float32 values whose sum with 0, ±1 or 65504 rounds differently to float16 and bfloat16: ties to
# even at 1 in each format (2^-11 and 3·2^-11 for float16, 2^-8 and 3·2^-8 for bfloat16), below
# float16's smallest subnormal but not bfloat16's, past float16's largest value (65520 ties to inf)
# but not bfloat16's, and past bfloat16's largest (its tie to inf).
ROUNDING = [2.0**-11, 3 * 2.0**-11, 2.0**-8, 3 * 2.0**-8, 1e-8, 2.0**-25, 3 * 2.0**-25, 65519.0, 65520.0, 3e38,
            3.3961776e38, -2.0**-11, -3 * 2.0**-8, 1.0 + 2.0**-11, 1.0 + 2.0**-8]
INT8 = torch.tensor([-128, 127, 0, -1, 1, 100, -100], dtype=torch.int8)
X16 = {"float16": [0.0, 1.0, -1.0, 65504.0, 2.0**-24, -65504.0, 2048.0],
       "bfloat16": [0.0, 1.0, -1.0, 3.3895313892515355e38, 2.0**-133, 256.0],
       "float32": [0.0, 1.0, -1.0, 3.4028234663852886e38, 2.0**-149]}


def operand(dtype: str, role: str) -> torch.Tensor:
    """foo's x (`role` "x") or y values of a dtype: the edge values, and for x the values the
    rounding cases add to, for y (float32) those rounding cases; for int8 y, -128, 127, ..."""
    if dtype == "int8":
        return INT8
    d = DTYPES[dtype].torch
    extra = X16[dtype] if role == "x" else (ROUNDING if dtype == "float32" else [])
    return torch.cat([edge_values(d), torch.tensor(extra, dtype=torch.float64).to(d)])


FOO = [(x, y) for x in ("float32", "float16", "bfloat16") for y in ("float32", "float16", "bfloat16", "int8")]


@pytest.mark.parametrize("x_dtype, y_dtype", FOO, ids=[f"{x}-{y}" for x, y in FOO])
def test_foo_edge_values_against_numpy(x_dtype, y_dtype):
    # The sum in float32, rounded once to x's dtype: by numpy (float32 sum; float16 by numpy's
    # conversion, bfloat16 by round-to-nearest-even on the bits).
    x, y = pairs(operand(x_dtype, "x"), operand(y_dtype, "y"))
    eager = opbridge.foo(x, y)
    op = opbridge.builtin.op("foo")
    (got,) = Runner().run_op(op, [x, y], {}, [x.dtype])
    with np.errstate(over="ignore", invalid="ignore"):
        want = numpy_rounded(x.float().numpy() + y.float().numpy(), x.dtype)
    assert not differences(eager, want, (x, y)), "eager vs numpy: " + differences(eager, want, (x, y))
    assert not differences(got, want, (x, y)), "ONNX Runtime vs numpy: " + differences(got, want, (x, y))


@pytest.mark.parametrize("dtype", FLOATS)
def test_my_add_edge_values_against_numpy(dtype):
    # 2a+b computed in float32 (float64 for float64) and rounded once: every pair of edge values,
    # among them the largest finite a, whose 2a overflows to inf in 16 bits.
    d = DTYPES[dtype].torch
    a, b = pairs(edge_values(d), edge_values(d))
    compute = np.float64 if dtype == "float64" else np.float32
    with np.errstate(over="ignore", invalid="ignore"):
        want = numpy_rounded(2 * a.to(torch.float64).numpy().astype(compute) + b.to(torch.float64).numpy().astype(compute), d)
    eager = opbridge.my_add(a, b)
    (got,) = Runner().run_op(opbridge.builtin.op("my_add"), [a, b], {}, [d])
    assert not differences(eager, want, (a, b)), "eager vs numpy: " + differences(eager, want, (a, b))
    assert not differences(got, want, (a, b)), "ONNX Runtime vs numpy: " + differences(got, want, (a, b))
    if dtype == "float16":
        overflow = (a == 65504) & (b == 0)
        assert bool(overflow.any()) and bool(torch.isinf(eager[overflow]).all())


ALPHA, SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
NUMPY_REFERENCES = {
    "asinh": np.arcsinh,
    "selu": lambda x: SCALE * np.where(x > 0, x, ALPHA * np.expm1(x)),
}


def _routes(name: str, x: torch.Tensor):
    """The ONNX Runtime models of the op: its own node (opbridge's kernel, or its ONNX function),
    and what the exporter writes (a standard ONNX op where it has a rule for the dtype)."""
    op = opbridge.builtin.op(name)
    yield "own node", one_node_model(op, [x], {})

    class Model(torch.nn.Module):
        def forward(self, t):
            return op.overload(t)

    yield "exported", with_float_outputs(opbridge.export(Model(), (x,)))


def near(got: torch.Tensor, want: torch.Tensor, ulps: int = 4) -> torch.Tensor:
    """Where got is as near want as a correctly rounded result of other code can be: the same NaNs,
    infinities and signed zeros, and finite values at most `ulps` representable values apart."""
    width = {4: torch.int32, 8: torch.int64}[got.element_size()]
    exact = torch.isnan(want) | torch.isinf(want) | (want == 0)
    same = torch.from_numpy(bits(got) == bits(want))
    apart = (got.view(width).to(torch.float64) - want.view(width).to(torch.float64)).abs()
    return torch.where(exact, same, (torch.sign(got) == torch.sign(want)) & (apart <= ulps))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(NUMPY_REFERENCES))
def test_pytorch_ops_edge_values_against_onnxruntime_and_numpy(name, dtype):
    # asinh and selu are PyTorch's own ops (aten), run in ONNX Runtime by opbridge's kernel, a
    # standard op or opbridge's ONNX function: other code, so the same bits as eager where the
    # result is determined by the special values' own rules (NaN, ±inf, ±0, subnormals, the largest
    # value), and within 4 units in the last place of numpy's float64 result everywhere (ONNX
    # Runtime's float32 Exp and Log are that close), with the same NaNs, infinities and signed zeros.
    d = DTYPES[dtype].torch
    x = edge_values(d)
    special = torch.zeros(len(x), dtype=torch.bool)
    special[: len(special_values(d))] = True
    eager = getattr(torch, name)(x)
    with np.errstate(over="ignore", invalid="ignore"):
        want = torch.from_numpy(np.asarray(NUMPY_REFERENCES[name](x.numpy().astype(np.float64))).astype(x.numpy().dtype))
    for route, m in _routes(name, x):
        (got,) = Runner().run(m, {m.graph.input[0].name: x}, [d])
        diff = differences(got[special], eager[special], (x[special],))
        assert not diff, f"{route}: ONNX Runtime vs eager on special values: {diff}"
        for side, t in (("eager", eager), (f"{route} ONNX Runtime", got)):
            bad = ~near(t, want)
            assert not bool(bad.any()), f"{side} vs numpy: {x[bad].tolist()} -> {t[bad].tolist()} != {want[bad].tolist()}"
