"""Drop-in modules with the public API of the packages point-cloud and detection models call,
backed by opbridge's ops: a model that imports them runs eagerly on opbridge's kernels and exports
with both exporters, with its code untouched.

- `opbridge.compat.torch_cluster`: torch_cluster 1.6's fps, knn, knn_graph, radius,
  radius_graph, nearest, grid_cluster;
- `opbridge.compat.torch_scatter`: torch_scatter 2.1's scatter and its named reductions,
  segment_csr, segment_coo;
- `opbridge.compat.pointnet2_ops.pointnet2_utils`: pointnet2_ops 3.0's sampling, grouping and
  interpolation functions, their Function classes, QueryAndGroup and GroupAll;
- `opbridge.compat.pointops`: Pointcept's pointops (knn_query, farthest_point_sampling,
  ball_query, grouping, interpolation and helpers);
- `opbridge.compat.mmcv.ops`: mmcv 2.x's deformable convolutions, where mmcv is not installed;
- `opbridge.compat.mmcv._ext`: mmcv's compiled extension, for mmcv installed without it
  (mmcv-lite): every function mmcv's Python ops load, those opbridge implements on its ops;
- `opbridge.compat.mmdet.core.export`: what installed mmdet 3.x imports while it is exported;
- `opbridge.compat.pyg_lib`: pyg-lib's torch.ops.pyg.fps / knn / radius / nearest, and PyG's flags;
- `opbridge.compat.spconv.pytorch`: spconv 2.x's sparse tensor, convolution, pooling and sequential
  modules on opbridge's sparse ops.

Importing opbridge.compat also adds substitution rules for the installed torch_cluster's and
torch_scatter's own functions: their TORCH_LIBRARY ops have no ONNX export (and, as catch-all C++
kernels, cannot be traced by torch.export), so opbridge.export traces the functions here instead.

`install(*names)` makes `import <name>` resolve to the module here when the real package is not
installed (or always, with force=True); for mmcv installed without its extension it makes `import
mmcv._ext` resolve here and leaves the rest of mmcv as it is; pyg_lib's install registers its ops
instead. docs/compat.md lists where each module differs from the package it stands in for.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

import opbridge
from opbridge import OpbridgeError

__all__ = ["PACKAGES", "install", "installed"]

PACKAGES = ("torch_cluster", "torch_scatter", "pointnet2_ops", "pointops", "mmcv", "mmdet", "pyg_lib", "spconv")

# Parts of an installed package it lacks and opbridge provides: package -> (the part whose absence
# says so, the modules provided). mmcv-lite is mmcv without its compiled extension; mmdet 3.x's
# box coders import a module of mmdet 2.x while an ONNX export traces them.
_PARTS = {"mmcv": ("_ext", ("mmcv._ext",)), "mmdet": ("core", ("mmdet.core", "mmdet.core.export"))}
_PARTS_ONLY = {"mmdet"}  # never stood in for as a whole


class _Alias(importlib.abc.Loader):
    """Loads `name` as the module opbridge.compat.<name> itself (one module object, one set of
    functions, whichever name imported it)."""

    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module) -> None:
        pass  # ran when the compat module was imported


class _Finder(importlib.abc.MetaPathFinder):
    """First on sys.meta_path: answers for the installed names and their submodules only."""

    def __init__(self):
        self.names: set[str] = set()
        self.modules: set[str] = set()  # single modules of a real package (mmcv._ext)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in self.names and fullname not in self.modules:
            return None
        local = f"{__name__}.{fullname}"
        spec = importlib.util.find_spec(local)
        if spec is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(local),
                                              is_package=spec.submodule_search_locations is not None)


_FINDER = _Finder()


def _real(name: str) -> bool:
    """Whether the real package is importable (asked of the finders after this one)."""
    if name in sys.modules and not getattr(sys.modules[name], "__name__", "").startswith(__name__):
        return True
    finders = [f for f in sys.meta_path if f is not _FINDER]
    return any(getattr(f, "find_spec", None) and f.find_spec(name, None) for f in finders)


def _package_dir(name: str) -> list[str]:
    """Where the installed package `name` lives (asked of the finders after this one)."""
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__path__", None):
        return list(module.__path__)
    for finder in (f for f in sys.meta_path if f is not _FINDER):
        spec = getattr(finder, "find_spec", None) and finder.find_spec(name, None)
        if spec:
            return list(spec.submodule_search_locations or [])
    return []


def _has_part(package: str, module: str) -> bool:
    """Whether the installed package has its module `module` (mmcv/_ext.*.so, mmdet/core/)."""
    return any(any(Path(d).glob(f"{module}.*")) or (Path(d) / module).is_dir() for d in _package_dir(package))


def install(*names: str, force: bool = False) -> dict[str, str]:
    """Makes `import name` (and `from name.sub import f`) resolve to opbridge.compat.<name> for
    each package in `names` (default: all of PACKAGES) that is not installed, or for every one
    with force=True (a package already imported keeps its module). mmcv installed without its
    compiled extension (mmcv-lite) gets opbridge's `mmcv._ext` and keeps the rest; mmcv with its
    extension is left alone. Installed mmdet 3.x gets `mmdet.core.export` (only that), also when
    only "mmcv" is named. pyg_lib is registered instead (its ops in torch.ops.pyg, PyG's flags).
    Returns, per name, "real" (left to the installed package), "compat" (resolves here),
    "extension" (the real package, with the parts it lacks from here), "absent" (mmdet not
    installed: nothing to add) or "registered"."""
    wanted = list(names or PACKAGES)
    if "mmcv" in wanted and "mmdet" not in wanted and _real("mmdet"):
        wanted.append("mmdet")  # mmdet's detectors are what mmcv-lite's users export
    unknown = [n for n in wanted if n not in PACKAGES]
    if unknown:
        raise OpbridgeError(f"opbridge.compat.install: no compat module for {', '.join(map(repr, unknown))}; "
                            f"there are {', '.join(PACKAGES)}")
    result = {}
    for name in wanted:
        if name == "pyg_lib":
            importlib.import_module(f"{__name__}.pyg_lib").register()
            result[name] = "registered"
        elif name in _PARTS and (not force or name in _PARTS_ONLY) and name not in _FINDER.names and _real(name):
            part, modules = _PARTS[name]
            if _has_part(name, part):
                result[name] = "real"
            else:
                _FINDER.modules.update(modules)
                result[name] = "extension"
        elif name in _PARTS_ONLY:
            result[name] = "absent"
        elif not force and name not in _FINDER.names and _real(name):
            result[name] = "real"
        else:
            _FINDER.names.add(name)
            result[name] = "compat"
    if (_FINDER.names or _FINDER.modules) and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    return result


def installed() -> list[str]:
    """The package and module names that resolve to compat modules."""
    return sorted(_FINDER.names | _FINDER.modules)


# The real packages' public functions with a compat twin of the same signature.
_TWINS = {"torch_cluster": ("fps", "knn", "knn_graph", "radius", "radius_graph", "nearest", "grid_cluster"),
          "torch_scatter": None}  # None: every function of the compat module


def _substitute_the_real_packages() -> None:
    for package, names in _TWINS.items():
        twin = importlib.import_module(f"{__name__}.{package}")
        for name in names or twin.__all__:
            opbridge.substitute(f"{package}.{name}", getattr(twin, name),
                                doc=f"opbridge.compat.{package}.{name}, on opbridge's ops")


_substitute_the_real_packages()

# transformers' module-level multi_scale_deformable_attention (Mask2Former, OneFormer), whose rule
# derives level_start_index: a definition's replaces() binds parameters one to one.
from . import deformable_attention  # noqa: E402,F401
# mmcv's box_iou_rotated picks one of two ops by its `aligned` flag: a Python rule.
from .mmcv import rotated as _mmcv_rotated  # noqa: E402,F401
from .mmcv import corner_pool as _mmcv_corner_pool  # noqa: E402,F401
# mmcv's Voxelization and DynamicScatter slice buffers by counts read as Python ints: rules that do not.
from .mmcv import voxel as _mmcv_voxel  # noqa: E402,F401
# mmcv's iou3d functions that are Python over other ops (boxes_iou3d, nms_bev, ...).
from .mmcv import boxes3d as _mmcv_boxes3d  # noqa: E402,F401
# mmcv's point Functions: ball query with a shell, grouping, and kNN (whose Python asks for CUDA).
from .mmcv import points as _mmcv_points  # noqa: E402,F401
# mmcv's sparse convolution modules read a count only the data knows as a Python int: rules that do not.
from .mmcv import sparse as _mmcv_sparse  # noqa: E402,F401
# spconv's sparse modules run compiled code and read a count only the data knows as a Python int.
from .spconv import rules as _spconv_rules  # noqa: E402,F401
# mmdet's RoI extractor branches on how many RoIs each level has: a rule that does not.
from .mmdet import roi_extractor as _mmdet_roi_extractor  # noqa: E402,F401
# mmdet3d's own copies of mmcv's voxelization and dynamic scatter: the same rules.
from .mmdet3d import voxelize as _mmdet3d_voxelize  # noqa: E402,F401
# mmdet3d's PointNet++ backbones number the points with a Python range over the point count.
from .mmdet3d import pointnet2 as _mmdet3d_pointnet2  # noqa: E402,F401
