"""mmcv._ext on opbridge's ops: the module mmcv's Python ops load their compiled functions from,
for mmcv installed without it (mmcv-lite). `opbridge.compat.install("mmcv")` makes `import
mmcv._ext` resolve here.

Every function mmcv 2.x loads is defined (unprovided.CALLERS lists them). Those opbridge implements
keep mmcv's calling convention as mmcv's ops/*.py call them (outputs passed in and filled in place,
keyword attributes) and run opbridge's ops; each family of them is a module of this package
(deform, points, info, and one per op family: nms, roi, rotated, carafe, ...), collected here from
its __all__. The rest raise unprovided.NotProvidedError when called, naming the function and the
mmcv op that calls it, so mmcv.ops, and mmdet with it, import in full.
"""

from __future__ import annotations

import importlib
import pkgutil

from .unprovided import CALLERS, NotProvidedError, not_provided

PROVIDED: dict[str, str] = {}  # function name -> the module of this package defining it


def _collect() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name == "unprovided":
            continue
        family = importlib.import_module(f"{__name__}.{info.name}")
        for name in family.__all__:
            if name in PROVIDED:
                raise ImportError(f"mmcv._ext.{name} is defined by both {PROVIDED[name]} and {family.__name__}")
            PROVIDED[name] = family.__name__
            globals()[name] = getattr(family, name)
    for name in CALLERS:
        if name not in PROVIDED:
            globals()[name] = not_provided(name)


_collect()

__all__ = sorted(set(CALLERS) | set(PROVIDED)) + ["NotProvidedError", "PROVIDED"]
