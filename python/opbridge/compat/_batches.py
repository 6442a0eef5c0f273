"""What the compat modules share: batch vectors and CSR pointers turned into the segment offsets
opbridge's point-cloud ops take, checks that run only when a call is eager (a trace or an export
must not branch on data), and a dense search for the shapes the tree-backed ops do not take."""

from __future__ import annotations

from typing import Callable

import torch

import opbridge
from opbridge import OpbridgeError

opbridge.load_torch()  # torch.ops.opbridge.* exist from here on


def eager() -> bool:
    """Whether the call runs eagerly: not under torch.jit.trace (the TorchScript exporter) nor
    dynamo (torch.export, torch.compile), where a check that reads values would be a guard."""
    return not (torch.jit.is_tracing() or torch.compiler.is_compiling())


def empty(*tensors: torch.Tensor) -> bool:
    """Whether an eager call has an empty tensor (the real packages return early then). Not asked
    while tracing: a size there may be data-dependent, and the ops take empty inputs anyway."""
    return eager() and any(t.numel() == 0 for t in tensors)


def check(ok: Callable[[], object], api: str, reason: str) -> None:
    """A ValueError naming `api` when the eager check `ok()` fails (the real packages raise
    ValueError or assert for these); not evaluated while tracing."""
    if eager() and not bool(ok()):
        raise ValueError(f"{api}: {reason}")


def flat(t: torch.Tensor) -> torch.Tensor:
    """torch_cluster's points: a 1-D tensor is n points of one coordinate."""
    return t.view(-1, 1) if t.dim() == 1 else t


def batch_size_of(*batches: torch.Tensor | None):
    """The number of examples the batch vectors name (torch_cluster's default: max + 1): an int
    when eager, an unbacked size under torch.export, and a 0-d tensor under torch.jit.trace, so
    that neither exporter bakes the example's count into the graph."""
    maxima = [b.max() for b in batches if b is not None and (not eager() or b.numel())]
    if not maxima:
        return 1
    top = torch.stack(maxima).max() + 1
    if torch.jit.is_tracing():
        return top
    count = top.item()
    if not eager():
        torch._check(count >= 1)  # batch ids are >= 0: torch.export may then simplify the sizes
    return count


def traced_nonempty(count) -> None:
    """State, under torch.export, that an op's data-dependent row count (voxels, sparse sites) is
    not 0. The layers after such an op (batch_norm, for one) branch on an empty input, which
    torch.export cannot decide for a size only the data gives; traced as nonzero, the graph has no
    such branch, and zero rows still run through it as zero rows (an empty cloud is tested so)."""
    if isinstance(count, torch.SymInt):
        torch._check(count > 0)


def whole(points: torch.Tensor) -> torch.Tensor:
    """[0, n] for n = points.size(0): one example, written so that a trace keeps n symbolic."""
    return torch.arange(2, device=points.device) * points.size(0)


def ptr_of(batch: torch.Tensor | None, points: torch.Tensor, batch_size, api: str, name: str) -> torch.Tensor:
    """(batch_size + 1,) int64 row boundaries of the points' batch vector (None: one example). The
    vector is checked non-negative and sorted by opbridge::batch_pointers, in eager calls and in
    the exported graph alike."""
    if batch is None:
        check(lambda: batch_size == 1, api, f"{name} is needed for {batch_size} examples")
        return whole(points)
    check(lambda: batch.numel() == points.size(0), api,
          f"{name} has {batch.numel()} entries for {points.size(0)} points")
    return pointers(batch, batch_size, name, api)


def pointers(index: torch.Tensor, count, name: str = "index", api: str = "") -> torch.Tensor:
    """(count + 1,) int64: how many entries of the sorted `index` are below 0, 1, ..., count, by
    opbridge::batch_pointers, which refuses a negative or unsorted `index` (its error names `api`
    and `name`) in eager calls and in ONNX Runtime alike: a batch vector becomes segments nowhere
    else."""
    if eager():
        count = max(int(count), 0)  # ids all negative: the op reports them, not arange
    bounds = torch.arange(count + 1, device=index.device)
    return torch.ops.opbridge.batch_pointers(index, bounds, name=name, caller=api)


def neighbours(api: str, x: torch.Tensor, y: torch.Tensor, k: int, ptr_x: torch.Tensor,
               ptr_y: torch.Tensor) -> torch.Tensor:
    """(m, k) rows of x nearest each row of y in its example, -1 padded: the k-d tree of
    opbridge::knn_query for 3-D points, a dense search for other dimensions and dtypes."""
    if x.size(1) == 3 and x.dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        # No example has more than n points: slots past n would all be padding, which pairs()
        # drops, so an eager call asks for at most n (a k far above n would size the tables by k).
        # Traced, k stays: an attribute must not carry the example's size.
        kk = max(1, min(k, int(x.size(0)))) if eager() else k
        idx, _ = torch.ops.opbridge.knn_query(x, ptr_x[1:], y, ptr_y[1:], k=kk)
        return idx
    if not x.is_floating_point():
        raise unsupported(api, f"points of dtype {x.dtype}")
    return dense_knn(x, y, k, ptr_x, ptr_y)


def segment_of(points: torch.Tensor, ptr: torch.Tensor) -> torch.Tensor:
    """The segment of each row: the number of segment ends at or before it (a comparison, which
    torch.export takes with data-dependent segment counts; examples are few)."""
    rows = torch.arange(points.size(0), device=points.device)
    return (rows[:, None] >= ptr[None, 1:]).sum(1)


def dense_knn(x: torch.Tensor, y: torch.Tensor, k: int, ptr_x: torch.Tensor, ptr_y: torch.Tensor) -> torch.Tensor:
    """For each row of y, the k nearest rows of x of the same example, by brute force: (m, k) int64
    with -1 padding. The tree-backed opbridge::knn_query takes 3-D points; feature-space neighbours
    (DynamicEdgeConv's 64-D) come here. Queries go in blocks whose differences (block x n x d)
    stay near 2^26 values, whatever n and d are."""
    seg_x, seg_y = segment_of(x, ptr_x), segment_of(y, ptr_y)
    kk = min(k, x.size(0))
    chunk = max(1, (1 << 26) // max(1, int(x.size(0)) * int(x.size(1))))
    parts = []
    for start in range(0, y.size(0), chunk):
        q = y[start:start + chunk]
        d = (q.unsqueeze(1) - x.unsqueeze(0)).pow(2).sum(-1)
        d = d.masked_fill(seg_y[start:start + chunk, None] != seg_x[None, :], float("inf"))
        dist, idx = torch.topk(d, kk, dim=1, largest=False, sorted=True)
        parts.append(idx.masked_fill(torch.isinf(dist), -1))
    return torch.cat(parts) if parts else torch.empty(0, kk, dtype=torch.long, device=x.device)


def pairs(idx: torch.Tensor) -> torch.Tensor:
    """(2, E) int64 [query row, point row] of an (m, k) neighbour table, -1 slots dropped, in
    query order then the table's order."""
    m, k = idx.shape
    rows = torch.arange(m, device=idx.device).repeat_interleave(k)
    cols = idx.reshape(-1).long()
    keep = cols >= 0
    return torch.stack([rows[keep], cols[keep]])


def unsupported(api: str, what: str) -> OpbridgeError:
    return OpbridgeError(f"{api}: {what} is not supported by opbridge's compat module")
