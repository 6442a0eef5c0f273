"""pyg-lib's point-cloud operators, `torch.ops.pyg.fps`, `knn`, `radius` and `nearest`, with
pyg-lib's schemas, on opbridge's ops.

PyTorch Geometric 2.8 calls these (no longer torch_cluster) from `torch_geometric.nn.pool`'s fps,
knn, knn_graph, radius, radius_graph and nearest, from DynamicEdgeConv, XConv and GravNetConv.
pyg-lib has no wheels on PyPI, so on a pip-installed CPU machine those raise
`ImportError: 'knn' requires 'pyg-lib>=0.6.0'`. `register()` (or
`opbridge.compat.install("pyg_lib")`) defines the four ops when pyg-lib has not, and sets the
`torch_geometric.typing` flags PyG reads at call time (WITH_FPS, WITH_KNN, WITH_RADIUS,
WITH_NEAREST). It does not fake a `pyg_lib` module: PyG's import of one reads far more than these
ops. Eager calls run opbridge's ops; opbridge.export substitutes the four ops with the functions
here, so that both exporters trace through them to opbridge's ops (custom nodes), and substitutes
PyG's index2ptr, scatter and Aggregation.__call__ so that the number of examples stays an input of
the graph. Row pointers that do not rise from 0 to the row count are refused, naming the op.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Optional

import torch
from torch import Tensor

import opbridge

from . import _batches as b

__all__ = ["SCHEMAS", "register"]

SCHEMAS = {  # pyg-lib's own definitions (pyg_lib/csrc/ops/*.cpp, 0.6.0 to 0.8.0)
    "fps": "fps(Tensor src, Tensor ptr, float ratio=0.5, bool random_start=True) -> Tensor",
    "knn": "knn(Tensor x, Tensor y, Tensor? ptr_x=None, Tensor? ptr_y=None, int k=1, bool cosine=False, "
           "int num_workers=1) -> Tensor",
    "radius": "radius(Tensor x, Tensor y, Tensor? ptr_x=None, Tensor? ptr_y=None, float r=1.0, "
              "int max_num_neighbors=32, int num_workers=1, bool ignore_same_index=False) -> Tensor",
    "nearest": "nearest(Tensor x, Tensor y, Tensor? ptr_x=None, Tensor? ptr_y=None) -> Tensor",
}
_FLAGS = ("WITH_FPS", "WITH_KNN", "WITH_RADIUS", "WITH_NEAREST")
_LIBRARY: list = []  # the torch.library.Library that holds the definitions, kept alive
_ORIGINALS: dict = {}  # PyG's functions that a substitution here wraps


def _check_ptr(api: str, ptr: Optional[Tensor], rows: int, name: str) -> None:
    """A ValueError naming `api` unless `ptr` (when given) is a 1-D integer tensor of row pointers
    that rises from 0 to `rows` without going down: a first entry other than 0 or a last other
    than the row count would move or drop rows of the segments in silence. Checked eagerly."""
    if ptr is None:
        return
    if ptr.dim() != 1 or ptr.is_floating_point() or ptr.dtype == torch.bool:
        raise ValueError(f"{api}: {name} is a 1-D integer tensor of row pointers, got {ptr.dtype} of shape "
                         f"{tuple(ptr.shape)}")
    if b.eager() and not (ptr.numel() >= 1 and int(ptr[0]) == 0 and int(ptr[-1]) == rows and
                          bool((ptr[1:] >= ptr[:-1]).all())):
        raise ValueError(f"{api}: {name} must rise from 0 to the row count {rows} without going down, got "
                         f"{ptr[:6].tolist()}{' ...' if ptr.numel() > 6 else ''}")


def _ptrs(x: Tensor, y: Tensor, ptr_x: Optional[Tensor], ptr_y: Optional[Tensor], api: str) -> tuple[Tensor, Tensor]:
    """Both pointers as int64 of one length: a missing one is one segment, and each is followed by
    as many empty segments as the other has entries (PyG passes the pointers of two batch vectors,
    whose lengths follow each one's max; padding both by the other's length needs no comparison
    of data-dependent sizes while exporting)."""
    _check_ptr(api, ptr_x, x.size(0), "ptr_x")
    _check_ptr(api, ptr_y, y.size(0), "ptr_y")
    px = b.whole(x) if ptr_x is None else ptr_x.long()
    if ptr_x is ptr_y and (ptr_x is not None or x is y):  # one batch vector's (knn_graph)
        return px, px
    py = b.whole(y) if ptr_y is None else ptr_y.long()
    return torch.cat([px, px[-1:].expand(py.size(0))]), torch.cat([py, py[-1:].expand(px.size(0))])


def _points(api: str, x: Tensor, y: Tensor, cosine: bool = False) -> tuple[Tensor, Tensor]:
    if x.dim() != 2 or y.dim() != 2 or x.size(1) != y.size(1):
        raise ValueError(f"{api}: x and y are (n, d) and (m, d) points, got {tuple(x.shape)} and {tuple(y.shape)}")
    if cosine:
        x, y = torch.nn.functional.normalize(x, dim=-1), torch.nn.functional.normalize(y, dim=-1)
    return x.contiguous(), y.contiguous()


def fps(src: Tensor, ptr: Tensor, ratio: float = 0.5, random_start: bool = True) -> Tensor:
    _check_ptr("pyg::fps", ptr, src.size(0), "ptr")
    return torch.ops.opbridge.furthest_point_sampling_ratio(src, ptr.long(), ratio, random_start)


def knn(x: Tensor, y: Tensor, ptr_x: Optional[Tensor] = None, ptr_y: Optional[Tensor] = None, k: int = 1,
        cosine: bool = False, num_workers: int = 1) -> Tensor:
    if b.empty(x, y):
        return torch.empty(2, 0, dtype=torch.long, device=x.device)
    x, y = _points("pyg::knn", x, y, cosine)
    px, py = _ptrs(x, y, ptr_x, ptr_y, "pyg::knn")
    return b.pairs(b.neighbours("pyg::knn", x, y, k, px, py))


def radius(x: Tensor, y: Tensor, ptr_x: Optional[Tensor] = None, ptr_y: Optional[Tensor] = None, r: float = 1.0,
           max_num_neighbors: int = 32, num_workers: int = 1, ignore_same_index: bool = False) -> Tensor:
    if b.empty(x, y):
        return torch.empty(2, 0, dtype=torch.long, device=x.device)
    x, y = _points("pyg::radius", x, y)
    if max_num_neighbors < 0:
        raise ValueError(f"pyg::radius: max_num_neighbors must be >= 0, got {max_num_neighbors}")
    px, py = _ptrs(x, y, ptr_x, ptr_y, "pyg::radius")
    batch_x, batch_y = b.segment_of(x, px), b.segment_of(y, py)
    cap = max_num_neighbors + 1 if ignore_same_index else max_num_neighbors
    edges = torch.ops.opbridge.radius(x, y, batch_x, batch_y, r=float(r), max_num_neighbors=cap)
    if not ignore_same_index:
        return edges
    # Drop each query's own row; it must not count towards max_num_neighbors, so one more was
    # asked for and the rest is cut to the first max_num_neighbors of each query (lowest rows).
    # The pairs come grouped by query, at most max_num_neighbors + 1 each: a pair is a query's
    # (max_num_neighbors + 1)-th exactly when the pair that many places before it has the same
    # query. A shifted comparison, which both exporters write as standard ops (a searchsorted
    # of the ranks has no ONNX export).
    edges = edges[:, edges[0] != edges[1]]
    query = edges[0]
    before = torch.cat([query.new_full((max_num_neighbors,), -1), query]).narrow(0, 0, query.size(0))
    return edges[:, before != query]


def nearest(x: Tensor, y: Tensor, ptr_x: Optional[Tensor] = None, ptr_y: Optional[Tensor] = None) -> Tensor:
    x, y = _points("pyg::nearest", x, y)
    if b.empty(x):
        return torch.empty(0, dtype=torch.long, device=x.device)
    px, py = _ptrs(x, y, ptr_x, ptr_y, "pyg::nearest")
    b.check(lambda: bool(((px[1:] > px[:-1]) <= (py[1:] > py[:-1])).all()), "pyg::nearest",
            "a segment has points in x and none in y")
    return b.neighbours("pyg::nearest", y, x, 1, py, px)[:, 0].long()


def _defined(name: str) -> bool:
    try:
        getattr(torch.ops.pyg, name)
        return True
    except (AttributeError, RuntimeError):
        return False


def index2ptr(index: Tensor, size: Optional[int] = None) -> Tensor:
    """torch_geometric.index.index2ptr (a sorted index's CSR pointers), with the size read so that
    neither exporter bakes it: PyG's own `int(index.max())` fails torch.export and fixes the
    number of examples in a trace. Substituted inside opbridge.export and substitutions()."""
    count = size
    if count is None:
        count = b.batch_size_of(index) if not b.empty(index) else 0
    ptr = b.pointers(index, count)
    return ptr if index.dtype == torch.int64 else ptr.int()


def batch_to_ptr(batch: Optional[Tensor], batch_size: Optional[int] = None) -> Optional[Tensor]:
    """torch_geometric.nn.pool's _batch_to_ptr, on index2ptr above."""
    return None if batch is None else index2ptr(batch, batch_size)


def _scatter_on_ops(original):
    """torch_geometric.utils.scatter with its sum/mean/min/max/mul reductions on
    opbridge.compat.torch_scatter (one opbridge::ScatterReduce node each in an export, where PyG's
    own ONNX branch fails under the TorchScript exporter); `any` stays PyG's."""
    from . import torch_scatter

    def scatter(src: Tensor, index: Tensor, dim: int = 0, dim_size: Optional[int] = None,
                reduce: str = "sum") -> Tensor:
        name = {"add": "sum", "amin": "min", "amax": "max"}.get(reduce, reduce)
        if name not in ("sum", "mean", "min", "max", "mul") or not isinstance(index, Tensor) or index.dim() != 1:
            return original(src, index, dim, dim_size, reduce)
        return torch_scatter.scatter(src, index, dim, dim_size=dim_size, reduce=name)

    return scatter


def _aggregation_call(original):
    """torch_geometric.nn.aggr.Aggregation.__call__ with the output size read so that neither
    exporter bakes it: without dim_size or ptr, PyG's `int(index.max()) + 1` fails torch.export
    (an int of a data-dependent value) and fixes the number of examples in a trace (SchNet's
    readout). Eagerly, PyG's own."""

    def __call__(self, x: Tensor, index: Optional[Tensor] = None, ptr: Optional[Tensor] = None,
                 dim_size: Optional[int] = None, dim: int = -2, **kwargs) -> Tensor:
        if not b.eager() and index is not None and ptr is None and dim_size is None:
            dim_size = b.batch_size_of(index)
        return original(self, x, index, ptr, dim_size, dim, **kwargs)

    return __call__


def register() -> list[str]:
    """Defines those of pyg::fps/knn/radius/nearest that nothing has defined (pyg-lib, when
    installed and imported, wins), and sets torch_geometric.typing's flags for them when PyTorch
    Geometric is installed (importing its typing module). It also adds the substitutions that
    opbridge.export applies to PyG's code: the four ops themselves (the exporters then trace these
    functions, whoever defined the ops), index2ptr, _batch_to_ptr and nn.aggr's
    Aggregation.__call__ (sizes read without baking them) and utils.scatter (on opbridge's scatter
    ops). The ops defined here, by name."""
    if importlib.util.find_spec("pyg_lib") is not None:
        import pyg_lib  # noqa: F401  its ops, where it has them
    added = [name for name in SCHEMAS if not _defined(name)]
    if added:
        lib = torch.library.Library("pyg", "FRAGMENT")
        for name in added:
            lib.define(SCHEMAS[name])
            lib.impl(name, getattr(sys.modules[__name__], name), "CompositeExplicitAutograd")
        _LIBRARY.append(lib)
    if importlib.util.find_spec("torch_geometric") is not None:
        import torch_geometric.typing as flags

        for flag in _FLAGS:
            setattr(flags, flag, True)
        if importlib.util.find_spec("torch_geometric.utils._scatter") is not None:  # where this PyG has it
            import torch_geometric.utils._scatter as pyg_scatter

            opbridge.substitute("torch_geometric.utils._scatter.scatter", _scatter_on_ops(pyg_scatter.scatter))
        if importlib.util.find_spec("torch_geometric.nn.aggr.base") is not None:
            from torch_geometric.nn.aggr.base import Aggregation

            # PyG's own, kept from the first call (a later one may run inside a substitutions() block).
            _ORIGINALS.setdefault("Aggregation.__call__", vars(Aggregation)["__call__"])
            opbridge.substitute("torch_geometric.nn.aggr.base.Aggregation.__call__",
                                _aggregation_call(_ORIGINALS["Aggregation.__call__"]),
                                doc="opbridge.compat.pyg_lib: Aggregation.__call__, its size read without baking it")
    for name in SCHEMAS:  # exports trace these functions, not the ops (pyg-lib's own have no export)
        opbridge.substitute(f"torch.ops.pyg.{name}", getattr(sys.modules[__name__], name))
    opbridge.substitute("torch_geometric.index.index2ptr", index2ptr)
    opbridge.substitute("torch_geometric.nn.pool._batch_to_ptr", batch_to_ptr)
    return added
