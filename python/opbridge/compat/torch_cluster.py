"""torch_cluster's public API on opbridge's ops: fps, knn, knn_graph, radius, radius_graph,
nearest and grid_cluster, with torch_cluster 1.6.3's signatures, defaults and return types.

    opbridge.compat.install("torch_cluster")   # `import torch_cluster` resolves here when it is absent
    from opbridge.compat.torch_cluster import knn_graph

Every function runs eagerly and exports with both exporters (3-D neighbour searches become one
custom node). Where opbridge differs from torch_cluster's CPU kernels is said per function;
docs/compat.md has the whole list.
"""

from __future__ import annotations

from typing import List, Optional, Union

import torch
from torch import Tensor

from . import _batches as b

__all__ = ["fps", "grid_cluster", "knn", "knn_graph", "nearest", "radius", "radius_graph"]

_ops = torch.ops.opbridge


def fps(src: Tensor, batch: Optional[Tensor] = None, ratio: Optional[Union[Tensor, float]] = None,
        random_start: bool = True, batch_size: Optional[int] = None,
        ptr: Optional[Union[Tensor, List[int]]] = None) -> Tensor:
    """Furthest point sampling (opbridge::furthest_point_sampling_ratio): ceil(n_i * ratio) rows of
    each example, as int64 indices into src. random_start draws opbridge's own random start."""
    if ratio is None:
        ratio = 0.5
    if isinstance(ratio, Tensor):
        if ratio.numel() != 1:
            raise b.unsupported("torch_cluster.fps", "a ratio tensor of more than one value")
        ratio = float(ratio)
    if ptr is not None:
        ptr_vec = torch.as_tensor(ptr, dtype=torch.long, device=src.device)
    elif batch is not None:
        count = b.batch_size_of(batch) if batch_size is None else batch_size
        ptr_vec = b.ptr_of(batch, src, count, "torch_cluster.fps", "batch")
    else:
        ptr_vec = b.whole(src)
    return _ops.furthest_point_sampling_ratio(b.flat(src), ptr_vec, float(ratio), bool(random_start))


def _ptrs(api: str, x: Tensor, y: Tensor, batch_x: Optional[Tensor], batch_y: Optional[Tensor],
          batch_size: Optional[int]) -> tuple[Tensor, Tensor]:
    if batch_size is None:
        batch_size = b.batch_size_of(batch_x, batch_y)
    return (b.ptr_of(batch_x, x, batch_size, api, "batch_x"),
            b.ptr_of(batch_y, y, batch_size, api, "batch_y"))


def knn(x: Tensor, y: Tensor, k: int, batch_x: Optional[Tensor] = None, batch_y: Optional[Tensor] = None,
        cosine: bool = False, num_workers: int = 1, batch_size: Optional[int] = None) -> Tensor:
    """For each row of y, the k nearest rows of x of the same example: (2, E) int64 [rows of y,
    rows of x], nearest first, fewer than k where an example has fewer points. cosine=True ranks
    by cosine distance (as Euclidean distance between the unit vectors: the same order)."""
    if b.empty(x, y):
        return torch.empty(2, 0, dtype=torch.long, device=x.device)
    x, y = b.flat(x).contiguous(), b.flat(y).contiguous()
    if cosine:
        x, y = torch.nn.functional.normalize(x, dim=-1), torch.nn.functional.normalize(y, dim=-1)
    ptr_x, ptr_y = _ptrs("torch_cluster.knn", x, y, batch_x, batch_y, batch_size)
    return b.pairs(b.neighbours("torch_cluster.knn", x, y, int(k), ptr_x, ptr_y))


def _graph(edge_index: Tensor, loop: bool, flow: str) -> Tensor:
    row, col = (edge_index[1], edge_index[0]) if flow == "source_to_target" else (edge_index[0], edge_index[1])
    if not loop:
        keep = row != col
        row, col = row[keep], col[keep]
    return torch.stack([row, col], dim=0)


def _flow(api: str, flow: str) -> None:
    if flow not in ("source_to_target", "target_to_source"):
        raise ValueError(f"{api}: flow is 'source_to_target' or 'target_to_source', got {flow!r}")


def knn_graph(x: Tensor, k: int, batch: Optional[Tensor] = None, loop: bool = False,
              flow: str = "source_to_target", cosine: bool = False, num_workers: int = 1,
              batch_size: Optional[int] = None) -> Tensor:
    """Edges from each point's k nearest points of its example: (2, E) int64 [source, target] for
    flow 'source_to_target'; without self-loops unless loop=True."""
    _flow("torch_cluster.knn_graph", flow)
    edges = knn(x, x, k if loop else k + 1, batch, batch, cosine, num_workers, batch_size)
    return _graph(edges, loop, flow)


def radius(x: Tensor, y: Tensor, r: float, batch_x: Optional[Tensor] = None, batch_y: Optional[Tensor] = None,
           max_num_neighbors: int = 32, num_workers: int = 1, batch_size: Optional[int] = None) -> Tensor:
    """For each row of y, the rows of x of the same example closer than r (opbridge::radius):
    (2, E) int64 [rows of y, rows of x]. Where a ball holds more than max_num_neighbors points
    the lowest rows are kept (torch_cluster's CPU kernel keeps those its tree visits first)."""
    if b.empty(x, y):
        return torch.empty(2, 0, dtype=torch.long, device=x.device)
    x, y = b.flat(x).contiguous(), b.flat(y).contiguous()
    return _ops.radius(x, y, batch_x, batch_y, r=float(r), max_num_neighbors=int(max_num_neighbors))


def radius_graph(x: Tensor, r: float, batch: Optional[Tensor] = None, loop: bool = False,
                 max_num_neighbors: int = 32, flow: str = "source_to_target", num_workers: int = 1,
                 batch_size: Optional[int] = None) -> Tensor:
    """Edges between the points of an example closer than r: (2, E) int64, as knn_graph."""
    _flow("torch_cluster.radius_graph", flow)
    edges = radius(x, x, r, batch, batch, max_num_neighbors if loop else max_num_neighbors + 1, num_workers,
                   batch_size)
    return _graph(edges, loop, flow)


def nearest(x: Tensor, y: Tensor, batch_x: Optional[Tensor] = None, batch_y: Optional[Tensor] = None) -> Tensor:
    """For each row of x, the nearest row of y of the same example (int64; ties to the lower
    row). An example with rows in x and none in y is a ValueError, as in torch_cluster."""
    api = "torch_cluster.nearest"
    x, y = b.flat(x), b.flat(y)
    if x.size(1) != y.size(1):
        raise ValueError(f"{api}: x has {x.size(1)} coordinates and y {y.size(1)}")
    if (batch_x is None) != (batch_y is None):
        batch_x = batch_x if batch_x is not None else x.new_zeros(x.size(0), dtype=torch.long)
        batch_y = batch_y if batch_y is not None else y.new_zeros(y.size(0), dtype=torch.long)
    ptr_x, ptr_y = _ptrs(api, x, y, batch_x, batch_y, None)
    b.check(lambda: torch.equal(ptr_x[1:] > ptr_x[:-1], ptr_y[1:] > ptr_y[:-1]), api, "Some batch indices occur in 'batch_x' that do not occur in 'batch_y'")
    if b.empty(x):
        return torch.empty(0, dtype=torch.long, device=x.device)
    return b.neighbours(api, y.contiguous(), x.contiguous(), 1, ptr_y, ptr_x)[:, 0].long()


def grid_cluster(pos: Tensor, size: Tensor, start: Optional[Tensor] = None, end: Optional[Tensor] = None) -> Tensor:
    """The voxel of each point (opbridge::grid_cluster, torch_cluster's numbering)."""
    return _ops.grid_cluster(pos, size, start, end)


