"""How far a runtime's outputs are from eager's, and whether the exported graph is right at the
example itself (opbridge.export's first runtime check, before any second size).

An output is wrong at the example when it is further from eager than rounding explains: a shape,
dtype or integer that differs, or a floating value off by more than WRONG units of the tolerance.
One exception is named, not refused: rows in another order. A detector's proposals sorted by score
put two rows whose scores differ in the seventh digit in either order, by how each runtime's
convolutions round, and where two such proposals overlap, which one NMS keeps changes too. Where
at most a tenth of an output's rows (its first axis, of 10 or more) differ, some of them equal to
another of them (within 1e-4 of the output's scale) and at most max(2, 1%) not, a warning
(ReorderedRowsWarning) names the output and both counts; more is an error. A row differs when it is
further from eager's than 1e-4 of the output's scale (float32 rounding through a deep network).
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from .._library.errors import OpbridgeError

# How far from eager (in units of the tolerance) an output at the example itself is wrong, not
# rounding: 1e3 units of rtol 1e-5 is a relative error of 1e-2.
WRONG = 1e3
# Rows that changed places match within this fraction of the output's largest magnitude.
ROW_MATCH = 1e-4


class ReorderedRowsWarning(UserWarning):
    """An output holds eager's rows, some in another order (ties the two runtimes broke apart)."""


@dataclasses.dataclass
class Gap:
    output: str
    shape: tuple
    text: str  # how the output differs
    excess: float  # distance in units of the tolerance (inf: shape, dtype or an integer differs)


def gap(name: str, got: np.ndarray, want: np.ndarray, rtol: float, atol: float, rt: str = "ONNX Runtime") -> Gap:
    """How far the output of the runtime (named `rt`) is from eager's, in units of the tolerance."""
    if got.shape != want.shape:
        return Gap(name, want.shape, f"shape {list(got.shape)} in {rt}, {list(want.shape)} eagerly", np.inf)
    if got.dtype != want.dtype:
        return Gap(name, want.shape, f"dtype {got.dtype} in {rt}, {want.dtype} eagerly", np.inf)
    if got.size == 0:
        return Gap(name, want.shape, "", 0.0)
    if not (np.issubdtype(want.dtype, np.floating) or np.issubdtype(want.dtype, np.complexfloating)):
        wrong = got != want
        if not wrong.any():
            return Gap(name, want.shape, "", 0.0)
        at = tuple(int(i) for i in np.argwhere(wrong)[0])
        return Gap(name, want.shape, f"{int(wrong.sum())} of {want.size} values differ; first at {list(at)}: "
                                      f"{got[at]} in {rt}, {want[at]} eagerly", np.inf)
    g, w = got.astype(np.float64), want.astype(np.float64)
    both_nan = np.isnan(g) & np.isnan(w)
    with np.errstate(invalid="ignore"):
        diff = np.where((g == w) | both_nan, 0.0, np.abs(g - w))
        diff = np.where(np.isnan(diff), np.inf, diff)
        units = diff / (atol + rtol * np.abs(w))
    units = np.where(diff == 0, 0.0, units)
    units = np.where(np.isnan(units), np.inf, units)  # inf against a finite value, NaN against a number
    worst = float(np.max(units))
    at = tuple(int(i) for i in np.unravel_index(int(np.argmax(units)), units.shape))
    return Gap(name, want.shape, f"max abs diff {float(np.max(diff)):.3g} (at {list(at)}: {got[at]:.6g} in {rt}, "
                                  f"{want[at]:.6g} eagerly)", worst)


def reordered_rows(got: np.ndarray, want: np.ndarray, atol: float) -> tuple[int, int] | None:
    """(rows that changed places, rows that differ otherwise) of a floating output whose differences
    are a near tie's (see the module's doc); None where they are not, or nothing differs."""
    if got.shape != want.shape or want.ndim < 2 or want.shape[0] < 10 or not np.issubdtype(want.dtype, np.floating):
        return None
    g, w = got.reshape(len(got), -1).astype(np.float64), want.reshape(len(want), -1).astype(np.float64)
    if not (np.isfinite(g).all() and np.isfinite(w).all()):
        return None
    # A row differs when it is further from eager's than rounding in a long chain of float32
    # operations takes it (1e-4 of the output's scale, not the element's own tolerance).
    scale = max(float(np.abs(w).max()), atol) * ROW_MATCH
    differ = np.flatnonzero((np.abs(g - w) > scale).any(1))
    if not 0 < len(differ) <= len(g) // 10:
        return None
    free, moved = list(differ), 0
    for i in differ:
        match = next((j for j in free if j != i and np.all(np.abs(g[i] - w[j]) <= scale)), None)
        if match is not None:
            free.remove(match)
            moved += 1
    other = len(differ) - moved
    # No row that moved, no near tie: rows that differ otherwise are wrong, however few.
    return (moved, other) if moved and other <= max(2, len(g) // 100) else None


def wrong_at_example(who: str, rt: str, exporter: str, gaps: list[Gap], got: list[np.ndarray],
                     want: list[np.ndarray], random: set, training: bool, atol: float = 1e-6) -> None:
    """Raises OpbridgeError naming every output wrong at the example (see the module's doc); warns
    for outputs whose rows only changed places."""
    wrong = []
    for g, out, expected in zip(gaps, got, want):
        if g.output in random or g.excess <= WRONG:
            continue
        rows = reordered_rows(out, expected, atol)
        if rows:
            warnings.warn(ReorderedRowsWarning(
                f"{who}: output '{g.output}' {list(g.shape)}: {rows[0]} rows in another order in {rt} than eagerly, "
                f"{rows[1]} others differ (near ties: rows ordered or kept by values equal to about 7 digits, "
                f"which the runtimes round apart); the other {len(out) - sum(rows)} rows agree"), stacklevel=4)
            continue
        wrong.append(f"output '{g.output}' {list(g.shape)}: {g.text}")
    if not wrong:
        return
    lines = [f"{who}: the exported model disagrees with eager in {rt} at the example's own inputs:"]
    lines += [f"  {w}" for w in wrong]
    if training:
        lines.append("  the model is in training mode (batch statistics, dropout), which the graph does not "
                     "compute: call model.eval() before exporting")
    if exporter == "torchscript":
        lines.append("  the TorchScript exporter loses writes made through a view of another tensor "
                     "(`y = x[:, :3]; y[..., 0] = ...` changes x eagerly, not in the graph) and records sizes "
                     "and branches of the example: exporter='dynamo' functionalizes such writes")
    raise OpbridgeError("\n".join(lines))
