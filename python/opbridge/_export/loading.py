"""Loading an op library's PyTorch side: its torch ops, then everything derived from its manifest —
fake kernels, autograd formulas, ONNX schemas and the TorchScript exporter's symbolics (the dynamo
exporter's translations are built per export call). A library known from its ONNX Runtime side
alone (PyTorch deferred) is completed in place."""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import torch

from .._library import files, registry
from .._library.errors import OpbridgeError
from .._library.manifest import Library
from .autograd import register_autograd
from .fake import register_fakes
from .rules import check_library_rules
from .schemas import register_schemas
from .torchscript import register_torchscript_symbolics


def load_library(torch_path: str | os.PathLike, ort_path: str | os.PathLike | None = None) -> Library:
    """Loads an op library built with opbridge_add_op_library(): registers its torch ops, its
    ONNX schemas and its export rules. `ort_path` defaults to the sibling lib<name>_ort.so."""
    torch_path = Path(torch_path).resolve()
    lib = registry.loaded(torch_path=torch_path)
    if lib is not None:
        return lib
    if not torch_path.exists():
        raise OpbridgeError(f"op library not found: {torch_path}")
    problem = files.torch_library_problem(torch_path)
    if problem:
        raise OpbridgeError(problem)
    if ort_path is None:
        candidate = files.sibling(torch_path, "ort")
        ort_path = candidate if candidate != torch_path and candidate.exists() else None
    elif not Path(ort_path).exists():
        raise OpbridgeError(f"ort_path: ONNX Runtime library not found: {Path(ort_path).resolve()}")
    else:
        problem = files.ort_library_problem(ort_path)
        if problem:
            raise OpbridgeError(f"ort_path: {problem}")
    ort_path = Path(ort_path).resolve() if ort_path else None
    _expose_torch_symbols()
    try:
        torch.ops.load_library(str(torch_path))
    except OSError as e:
        raise OpbridgeError(f"{torch_path.name} could not be loaded into this torch {torch.__version__}: {e}") from None
    lib = files.read_manifest(torch_path, torch_path, ort_path)
    # This library may be known so far from its ONNX Runtime side.
    taken = domain_in_use(lib.domains, lambda other: ort_path is not None and other.ort_path == ort_path)
    if taken:
        raise OpbridgeError(f"{torch_path.name}: {taken}; give each op library its own ONNX_DOMAIN")
    check_library_rules(lib)
    register_fakes(lib)
    register_autograd(lib)
    register_schemas(lib)
    register_torchscript_symbolics(lib)
    registry.add(lib)
    return lib


@functools.cache
def _expose_torch_symbols() -> None:
    """An op library's PyTorch side links no torch library (cmake/OpBridgeTorch.cmake says why):
    its references to libtorch_cpu and libc10 bind to the torch this process imported. torch
    loads them privately (RTLD_LOCAL), so they are made global here; RTLD_NOLOAD reopens the
    loaded copy by its soname and never loads another. Its dependencies (libc10, the OpenMP
    runtime) become global with it."""
    try:
        ctypes.CDLL("libtorch_cpu.so", mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
    except OSError as e:
        raise OpbridgeError(f"cannot reach the loaded torch's libtorch_cpu.so to load op libraries ({e}): this "
                            f"torch ({torch.__file__}) is not a build opbridge knows") from None


def domain_in_use(domains: set[str], is_self) -> str | None:
    """Which of `domains` a loaded library other than the one `is_self(library)` names already owns,
    said as "ONNX domain 'd' is already used by op library 'x' (path)", or None. ONNX Runtime takes
    one custom-op domain once per session: two libraries in one domain would make every session
    fail, so a library owns its domain and those its ops name."""
    for other in registry.libraries():
        shared = sorted(domains & other.domains)
        if shared and not is_self(other):
            return (f"ONNX domain '{shared[0]}' is already used by op library '{other.name}' "
                    f"({other.torch_path or other.ort_path})")
    return None


def _check_torch(info: dict) -> None:
    # A library built against another torch fails to load with undefined C++ symbols at best.
    built, have = info.get("torch"), torch.__version__.split("+")[0]
    if built and built != have:
        raise OpbridgeError(
            f"opbridge {info['opbridge']} was built against torch {built}, but this environment has torch "
            f"{torch.__version__}; install torch=={built}, or rebuild opbridge here "
            "(pip install --no-build-isolation --force-reinstall <opbridge source>)"
        )


def load_builtin() -> Library:
    """The built-in op library, its PyTorch side loaded."""
    d = files.builtin_library_dir()
    torch_path = d / "libopbridge_torch.so"
    if not torch_path.exists():
        raise OpbridgeError(
            f"the opbridge op libraries are not built ({torch_path} is missing); run scripts/setup.sh"
        )
    _check_torch(files.build_info())
    return load_library(torch_path, d / "libopbridge_ort.so")
