"""Loading op libraries: the torch library (its ops and manifest), then everything derived from
the manifest — ONNX schemas, fake kernels and the TorchScript exporter's symbolics (the dynamo
exporter's translations are built per export call)."""

from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path

import torch

from . import _manifest, _registry
from ._autograd import register_autograd
from ._errors import OpbridgeError
from ._fake import register_fakes
from ._manifest import Library
from ._schemas import register_schemas
from ._torchscript import register_torchscript_symbolics

_SDK = Path(__file__).resolve().parent / "_sdk"


def load_library(torch_path: str | os.PathLike, ort_path: str | os.PathLike | None = None) -> Library:
    """Loads an op library built with opbridge_add_op_library(): registers its torch ops, its
    ONNX schemas and its export rules. `ort_path` defaults to the sibling lib<name>_ort.so."""
    torch_path = Path(torch_path).resolve()
    lib = _registry.loaded(torch_path)
    if lib is not None:
        return lib
    if not torch_path.exists():
        raise OpbridgeError(f"op library not found: {torch_path}")
    _check_is_torch_library(torch_path)
    torch.ops.load_library(str(torch_path))
    if ort_path is None:
        candidate = torch_path.with_name(torch_path.name.replace("_torch.so", "_ort.so"))
        ort_path = candidate if candidate.exists() else None
    lib = _manifest.read(torch_path, Path(ort_path).resolve() if ort_path else None)
    for other in _registry.libraries():
        # ONNX Runtime takes one custom-op domain once per session: two libraries in one domain
        # would make every session fail. A library owns its domain and those its ops name.
        shared = sorted(lib.domains & other.domains)
        if shared:
            raise OpbridgeError(
                f"{torch_path.name}: ONNX domain '{shared[0]}' is already used by op library "
                f"'{other.name}' ({other.torch_path}); give each op library its own ONNX_DOMAIN"
            )
    register_fakes(lib)
    register_autograd(lib)
    register_schemas(lib)
    register_torchscript_symbolics(lib)
    _registry.add(lib)
    return lib


def _check_is_torch_library(path: Path) -> None:
    """The PyTorch library exports opbridge_manifest_json; its ONNX Runtime sibling exports
    RegisterCustomOps. Passing one for the other is named, with the right file."""
    try:
        handle = ctypes.CDLL(str(path))
    except OSError as e:
        raise OpbridgeError(f"{path}: cannot be loaded as a shared library: {e}") from None
    if hasattr(handle, "opbridge_manifest_json"):
        return
    if hasattr(handle, "RegisterCustomOps"):
        sibling = path.with_name(path.name.replace("_ort.so", "_torch.so"))
        sibling_name = str(sibling) if sibling != path and sibling.exists() else "lib<name>_torch.so, built beside it"
        raise OpbridgeError(f"{path.name} is an ONNX Runtime custom-op library (it exports RegisterCustomOps): pass "
                            f"its PyTorch library ({sibling_name}) to opbridge.load_library, which finds this one "
                            "beside it")
    raise OpbridgeError(f"{path} is not an opbridge op library (it exports neither opbridge_manifest_json nor "
                        "RegisterCustomOps)")


def builtin_library_dir() -> Path:
    env = os.environ.get("OPBRIDGE_LIBRARY_DIR")
    return Path(env) if env else _SDK / "lib"


def build_info() -> dict:
    """What the built-in libraries were built with (CMake writes build_info.json next to them):
    the opbridge version, the torch version (None without PyTorch), the ONNX Runtime SDK's."""
    d = builtin_library_dir()
    for path in (d / "build_info.json", d.parent / "build_info.json"):  # a build tree, an install tree
        if path.is_file():
            return json.loads(path.read_text())
    raise OpbridgeError(f"the opbridge op libraries are not built (no build_info.json in {d} or {d.parent}); "
                        "run scripts/setup.sh, or pip install opbridge")


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
    d = builtin_library_dir()
    torch_path = d / "libopbridge_torch.so"
    if not torch_path.exists():
        raise OpbridgeError(
            f"the opbridge op libraries are not built ({torch_path} is missing); run scripts/setup.sh"
        )
    _check_torch(build_info())
    return load_library(torch_path, d / "libopbridge_ort.so")


def cmake_prefix_path() -> str:
    """For find_package(opbridge) in a project that builds its own op library."""
    return str(_SDK / "lib" / "cmake")
