"""torch_scatter's public reductions on opbridge's ops, with torch_scatter 2.1's signatures,
defaults and return types: scatter, scatter_sum/add/mul/mean/min/max, segment_csr, segment_coo
and their named forms (segment_sum_csr, segment_max_coo, ...).

A 1-D index (the form PyG's message passing uses) with a floating-point src runs on
opbridge::scatter_reduce / segment_csr / segment_coo and their arg forms, whatever `dim` is (the
other dimensions fold into columns), and exports as one custom node. Other shapes (an index with
src's own shape), integer src and `mul` run on PyTorch's scatter ops, as torch_scatter's own
sum and mean do. Without dim_size the output size is index.max() + 1, read from the data: pass
dim_size to export.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _batches as b

__all__ = ["scatter", "scatter_add", "scatter_max", "scatter_mean", "scatter_min", "scatter_mul", "scatter_sum",
           "segment_add_coo", "segment_add_csr", "segment_coo", "segment_csr", "segment_max_coo", "segment_max_csr",
           "segment_mean_coo", "segment_mean_csr", "segment_min_coo", "segment_min_csr", "segment_sum_coo",
           "segment_sum_csr"]

_ops = torch.ops.opbridge
_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_REDUCES = ("sum", "add", "mul", "mean", "min", "max")


def _check_reduce(api: str, reduce: str) -> None:
    if reduce not in _REDUCES:
        raise ValueError(f"{api}: reduce is one of {', '.join(_REDUCES)}, got {reduce!r}")


def _on_ops(src: Tensor, index: Tensor, reduce: str, size) -> bool:
    """Whether opbridge's ops take the call: their output size is an attribute, so it must be a
    plain int (under an exporter a size read from a data-dependent tensor is not: PyTorch's
    scatter then carries it)."""
    return index.dim() == 1 and src.dtype in _FLOATS and reduce != "mul" and type(size) is int


def _rows(src: Tensor, dim: int) -> Tensor:
    """src with `dim` first and the rest folded into columns: (n, f)."""
    moved = src.movedim(dim, 0)
    return moved.reshape(moved.size(0), math.prod(moved.shape[1:]))  # no -1: the rows may be data-dependent


def _unrows(out: Tensor, src: Tensor, dim: int) -> Tensor:
    shape = list(src.movedim(dim, 0).shape)
    shape[0] = out.size(0)
    return out.reshape(shape).movedim(0, dim)


def _broadcast(index: Tensor, src: Tensor, dim: int) -> Tensor:
    """torch_scatter's broadcast: a 1-D index runs along dim; trailing dimensions are added."""
    if index.dim() == 1:
        index = index.view([1] * dim + [-1])
    index = index.view(list(index.shape) + [1] * (src.dim() - index.dim()))
    return index.expand(src.shape)


def _dim_size(api: str, index: Tensor, dim_size: Optional[int]):
    """dim_size as given (under an exporter it may be a symbolic size), else index.max() + 1."""
    if dim_size is not None:
        return dim_size
    if index.is_meta:
        raise ValueError(f"{api}: an index on the meta device has no values to size the output by: pass dim_size")
    return index.max().item() + 1 if index.numel() > 0 else 0


def _check_inputs(api: str, src: Tensor, index: Tensor, index_name: str, reduce: str) -> None:
    """What torch_scatter's kernels refuse, refused here in the function's own words (PyTorch's
    scatter ops would otherwise fail deep inside, or run a bool src through an integer path)."""
    if src.device != index.device:
        raise ValueError(f"{api}: src is on {src.device} and {index_name} on {index.device}; both must be on one device")
    if index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool:
        raise ValueError(f"{api}: {index_name} must be an integer tensor, got {index.dtype}")
    if src.dtype == torch.bool and reduce not in ("sum", "add"):
        raise ValueError(f"{api}: a bool src supports reduce='sum' only (as torch_scatter's kernels), got {reduce!r}; "
                         "cast src to an integer or floating type")


def _torch_scatter(src: Tensor, index: Tensor, dim: int, size: int, reduce: str) -> Tuple[Tensor, Optional[Tensor]]:
    """torch_scatter's results on PyTorch's scatter ops: (out, arg or None)."""
    index = _broadcast(index, src, dim)
    shape = list(src.shape)
    shape[dim] = size
    if reduce in ("sum", "add"):
        return src.new_zeros(shape).scatter_add_(dim, index, src), None
    if reduce == "mul":
        return src.new_ones(shape).scatter_reduce_(dim, index, src, "prod"), None
    if reduce == "mean":
        total = src.new_zeros(shape).scatter_add_(dim, index, src)
        count = src.new_zeros(shape).scatter_add_(dim, index, torch.ones_like(src)).clamp_(min=1)
        return (total / count if total.is_floating_point() else total.div_(count, rounding_mode="floor")), None
    # torch_scatter's rule for min and max (docs/ops/segment_reduce.md), as opbridge's kernel
    # follows it: from the type's lowest finite value (max) or largest (min), a value counts only
    # if it beats that strictly, so NaN (and -inf for max, +inf for min) never does; a place no
    # value counted for is 0 with arg src.size(dim), and ties go to the first row.
    info = torch.finfo(src.dtype) if src.is_floating_point() else torch.iinfo(src.dtype)
    start = info.min if reduce == "max" else info.max
    counts = src > start if reduce == "max" else src < start
    taken = torch.where(counts, src, torch.full((), start, dtype=src.dtype, device=src.device))
    out = src.new_full(shape, start).scatter_reduce_(dim, index, taken, "amax" if reduce == "max" else "amin")
    out = torch.where(out == start, torch.zeros((), dtype=src.dtype, device=src.device), out)
    n = src.size(dim)
    pos = torch.arange(n, device=src.device).view([1] * dim + [-1] + [1] * (src.dim() - dim - 1)).expand(src.shape)
    won = torch.where(counts & (src == out.gather(dim, index)), pos, n)
    arg = torch.full(shape, n, dtype=torch.long, device=src.device).scatter_reduce_(dim, index, won, "amin")
    return out, arg


def _scatter(api: str, src: Tensor, index: Tensor, dim: int, out: Optional[Tensor], dim_size: Optional[int],
             reduce: str) -> Tuple[Tensor, Optional[Tensor]]:
    _check_reduce(api, reduce)
    _check_inputs(api, src, index, "index", reduce)
    dim = dim + src.dim() if dim < 0 else dim
    if out is not None:
        if reduce not in ("sum", "add"):
            raise b.unsupported(api, f"out= with reduce={reduce!r} (it is supported for sum)")
        return out.scatter_add_(dim, _broadcast(index, src, dim), src), None
    size = _dim_size(api, index, dim_size)
    if not _on_ops(src, index, reduce, size):
        if b.eager() and not index.is_meta and index.numel() and type(size) is int:  # as the op checks it
            low, high = int(index.min()), int(index.max())
            if low < 0 or high >= size:
                raise ValueError(f"{api}: index holds {low if low < 0 else high}, outside [0, dim_size = {size})")
        return _torch_scatter(src, index, dim, size, reduce)
    rows = _rows(src, dim)
    red = "sum" if reduce == "add" else reduce
    if red in ("min", "max"):
        values, arg = _ops.scatter_reduce_arg(rows, index, size, red)
        return _unrows(values, src, dim), _unrows(arg, src, dim)
    return _unrows(_ops.scatter_reduce(rows, index, size, red), src, dim), None


def scatter(src: Tensor, index: Tensor, dim: int = -1, out: Optional[Tensor] = None, dim_size: Optional[int] = None,
            reduce: str = "sum") -> Tensor:
    """Reduces the entries of src that index sends to one place along dim: out[index[i]] ∘= src[i]."""
    return _scatter("torch_scatter.scatter", src, index, dim, out, dim_size, reduce)[0]


def scatter_sum(src: Tensor, index: Tensor, dim: int = -1, out: Optional[Tensor] = None,
                dim_size: Optional[int] = None) -> Tensor:
    return _scatter("torch_scatter.scatter_sum", src, index, dim, out, dim_size, "sum")[0]


def scatter_add(src: Tensor, index: Tensor, dim: int = -1, out: Optional[Tensor] = None,
                dim_size: Optional[int] = None) -> Tensor:
    return _scatter("torch_scatter.scatter_add", src, index, dim, out, dim_size, "sum")[0]


def scatter_mul(src: Tensor, index: Tensor, dim: int = -1, out: Optional[Tensor] = None,
                dim_size: Optional[int] = None) -> Tensor:
    return _scatter("torch_scatter.scatter_mul", src, index, dim, out, dim_size, "mul")[0]


def scatter_mean(src: Tensor, index: Tensor, dim: int = -1, out: Optional[Tensor] = None,
                 dim_size: Optional[int] = None) -> Tensor:
    return _scatter("torch_scatter.scatter_mean", src, index, dim, out, dim_size, "mean")[0]


def scatter_min(src: Tensor, index: Tensor, dim: int = -1, out: Optional[Tensor] = None,
                dim_size: Optional[int] = None) -> Tuple[Tensor, Tensor]:
    """(values, arg): the smallest entry sent to each place and where it was along dim
    (src.size(dim) where nothing was sent)."""
    return _scatter("torch_scatter.scatter_min", src, index, dim, out, dim_size, "min")


def scatter_max(src: Tensor, index: Tensor, dim: int = -1, out: Optional[Tensor] = None,
                dim_size: Optional[int] = None) -> Tuple[Tensor, Tensor]:
    """(values, arg), as scatter_min."""
    return _scatter("torch_scatter.scatter_max", src, index, dim, out, dim_size, "max")


def _check_indptr(api: str, indptr: Tensor, rows: int) -> None:
    """torch_scatter's indptr, checked in an eager call as opbridge::segment_csr checks it."""
    if not b.eager() or indptr.is_meta:  # traced or meta: no values to read
        return
    if indptr.numel() == 0:
        raise ValueError(f"{api}: indptr is empty; it holds at least one row boundary")
    p = indptr.tolist()
    for i, v in enumerate(p):
        if not 0 <= v <= rows:
            raise ValueError(f"{api}: indptr[{i}] = {v} is not a row boundary of src ({rows} rows)")
        if i and v < p[i - 1]:
            raise ValueError(f"{api}: indptr must be non-decreasing, but indptr[{i - 1}] = {p[i - 1]} > indptr[{i}] = {v}")


def _segment(api: str, src: Tensor, pointers: Tensor, csr: bool, out: Optional[Tensor], dim_size: Optional[int],
             reduce: str) -> Tuple[Tensor, Optional[Tensor]]:
    """segment_csr (pointers = indptr) and segment_coo (pointers = a sorted index)."""
    _check_reduce(api, reduce)
    if out is not None:
        raise b.unsupported(api, "out=")
    if reduce == "mul":
        raise b.unsupported(api, "reduce='mul'")
    dim = pointers.dim() - 1
    if pointers.dim() != 1:
        raise b.unsupported(api, f"a {pointers.dim()}-D {'indptr' if csr else 'index'}")
    _check_inputs(api, src, pointers, "indptr" if csr else "index", reduce)
    size = None if csr else _dim_size(api, pointers, dim_size)
    if src.dtype not in _FLOATS or not (csr or type(size) is int):  # PyTorch's scatter on the rows' index
        if csr:
            _check_indptr(api, pointers, src.size(0))
            counts = pointers[1:] - pointers[:-1]
            rows = torch.arange(pointers.numel() - 1, device=src.device).repeat_interleave(counts)
            lead = src.narrow(0, int(pointers[0]), rows.numel())
            return _torch_scatter(lead, rows, 0, pointers.numel() - 1, reduce)
        # A sorted index is a batch vector: its row pointers come from opbridge::batch_pointers,
        # which refuses a negative or unsorted one in eager calls and exported graphs alike.
        if b.eager() and not pointers.is_meta and pointers.numel() and int(pointers.max()) >= size:
            raise ValueError(f"{api}: index holds {int(pointers.max())}, outside [0, dim_size = {size})")
        ptr = b.pointers(pointers, size, "index", api)
        sized = {"output_size": src.size(0)} if src.is_meta else {}  # meta: shapes only, no counts to read
        rows = torch.arange(size, device=src.device).repeat_interleave(ptr[1:] - ptr[:-1], **sized)
        return _torch_scatter(src.narrow(0, 0, rows.numel()), rows, 0, size, reduce)
    rows = _rows(src, dim)
    red = "sum" if reduce == "add" else reduce
    arg_form = red in ("min", "max")
    if csr:
        got = (_ops.segment_csr_arg if arg_form else _ops.segment_csr)(rows, pointers, red)
    else:
        got = (_ops.segment_coo_arg if arg_form else _ops.segment_coo)(rows, pointers, size, red)
    if arg_form:
        return _unrows(got[0], src, dim), _unrows(got[1], src, dim)
    return _unrows(got, src, dim), None


def segment_csr(src: Tensor, indptr: Tensor, out: Optional[Tensor] = None, reduce: str = "sum") -> Tensor:
    """Reduces the rows indptr[s] .. indptr[s + 1] - 1 of src into row s."""
    return _segment("torch_scatter.segment_csr", src, indptr, True, out, None, reduce)[0]


def segment_coo(src: Tensor, index: Tensor, out: Optional[Tensor] = None, dim_size: Optional[int] = None,
                reduce: str = "sum") -> Tensor:
    """scatter for a sorted index (each place's rows are one run)."""
    return _segment("torch_scatter.segment_coo", src, index, False, out, dim_size, reduce)[0]


def _named(reduce: str, csr: bool, with_arg: bool):
    kind = "csr" if csr else "coo"
    api = f"torch_scatter.segment_{reduce}_{kind}"
    if csr:
        def fn(src: Tensor, indptr: Tensor, out: Optional[Tensor] = None):
            got = _segment(api, src, indptr, True, out, None, reduce)
            return got if with_arg else got[0]
    else:
        def fn(src: Tensor, index: Tensor, out: Optional[Tensor] = None, dim_size: Optional[int] = None):
            got = _segment(api, src, index, False, out, dim_size, reduce)
            return got if with_arg else got[0]
    fn.__name__ = fn.__qualname__ = f"segment_{reduce}_{kind}"
    fn.__doc__ = f"segment_{kind}(..., reduce={reduce!r})" + (": (values, arg)" if with_arg else "")
    fn.__annotations__["return"] = Tuple[Tensor, Tensor] if with_arg else Tensor
    return fn


segment_sum_csr, segment_add_csr, segment_mean_csr = (_named(r, True, False) for r in ("sum", "add", "mean"))
segment_min_csr, segment_max_csr = (_named(r, True, True) for r in ("min", "max"))
segment_sum_coo, segment_add_coo, segment_mean_coo = (_named(r, False, False) for r in ("sum", "add", "mean"))
segment_min_coo, segment_max_coo = (_named(r, False, True) for r in ("min", "max"))
