"""opbridge: write a custom operator once in C++, get the PyTorch op, ONNX export with both
PyTorch exporters, ONNX schemas, and an ONNX Runtime kernel — and verify they agree.

    import opbridge, torch
    y = torch.ops.opbridge.<op>(a, b)                                     # or opbridge.<op>(a, b)
    onnx_model = opbridge.export(model, (a, b), "model.onnx")             # dynamo=True
    onnx_model = opbridge.export(model, (a, b), exporter="torchscript")   # dynamo=False
    print(opbridge.verify(model, (a, b), onnx_model))                     # ORT vs eager

The package is four wings (docs/architecture.md): _library (what an op library is), _runtime
(ONNX Runtime sessions, inspection, verification), _export (PyTorch to ONNX) and _tools (the
command line, drawings, Triton repositories, run-time builds, the test suite). This module ties
them into the public API. `import opbridge` loads the built-in library's PyTorch side, so
torch.ops.opbridge.* exist right after it; with OPBRIDGE_DEFER_TORCH=1 (or without PyTorch
installed) it reads the library from its ONNX Runtime side instead, and what needs PyTorch loads
it on first use.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

from ._library import files as _files
from ._library import registry as _registry
from ._library.errors import OpbridgeError
from ._library.files import build_info, cmake_prefix_path
from ._library.manifest import Library, OpInfo
from ._library.registry import all_ops, libraries

__version__: str = build_info()["opbridge"]

# The rest of the public API, by module, imported on first use. Those of the export wing, build
# and verify need PyTorch: its side of the built-in library is loaded first.
_API = {
    "._runtime.session": ("session", "session_options"),
    "._runtime.verify": ("OutputDiff", "VerifyReport", "verify"),
    "._runtime.second_size": ("UnprovenWarning",),
    "._runtime.agreement": ("ReorderedRowsWarning",),
    "._export.exporter": ("EXPORTERS", "export"),
    "._export.dynamo": ("translation_table",),
    "._export.functions": ("add_functions",),
    "._export.schemas": ("declare_node",),
    "._export.torchscript": ("custom_opsets", "torchscript_exporter_available"),
    "._export.loading": ("load_library",),
    "._export.substitution": ("Substitution", "substitute", "substitution_rules", "substitutions"),
    "._tools.build": ("load", "load_inline"),
}
_MODULE_OF = {name: module for module, names in _API.items() for name in names}
_TORCH_FREE = ("._runtime.session",)


def torch_deferred() -> bool:
    """Whether PyTorch is not loaded yet: OPBRIDGE_DEFER_TORCH=1 was set when opbridge was
    imported (the `opbridge` command sets it), or PyTorch is not installed."""
    return "builtin" not in globals()


def load_torch() -> Library:
    """Loads PyTorch and the built-in library's PyTorch side (once); the built-in library."""
    if "builtin" not in globals():
        if importlib.util.find_spec("torch") is None:
            raise OpbridgeError("this needs PyTorch, which is not installed: opbridge's ONNX Runtime side "
                                "(opbridge.session, opbridge inspect) works without it; pip install torch for the rest")
        from ._export.loading import load_builtin

        globals()["builtin"] = load_builtin()
    return globals()["builtin"]


def __getattr__(name: str):
    """The rest of the public API, and opbridge.<op>: the PyTorch op of a built-in op."""
    module = _MODULE_OF.get(name)
    if module is not None:
        if module not in _TORCH_FREE:
            load_torch()
        value = getattr(importlib.import_module(module, __name__), name)
        globals()[name] = value
        return value
    if name == "builtin":
        return load_torch()
    builtin_lib = next(iter(_registry.libraries()), None)
    for op in builtin_lib.ops if builtin_lib else ():
        if op.name == name and op.defines_torch_op:
            load_torch()
            return getattr(getattr(importlib.import_module("torch").ops, builtin_lib.torch_namespace), name)
    raise AttributeError(f"module 'opbridge' has no attribute or op named '{name}'")


def _read_builtin_ort_side() -> None:
    ort_path = _files.builtin_library_dir() / "libopbridge_ort.so"
    if not ort_path.exists():
        raise OpbridgeError(f"the opbridge op libraries are not built ({ort_path} is missing); run scripts/setup.sh")
    _registry.add(_files.read_manifest(ort_path, None, ort_path))


if os.environ.get("OPBRIDGE_DEFER_TORCH", "") not in ("", "0") or importlib.util.find_spec("torch") is None:
    _read_builtin_ort_side()
else:
    load_torch()


__all__ = [
    "__version__",
    "EXPORTERS",
    "Library",
    "OpInfo",
    "OpbridgeError",
    "OutputDiff",
    "ReorderedRowsWarning",
    "Substitution",
    "UnprovenWarning",
    "VerifyReport",
    "add_functions",
    "all_ops",
    "build_info",
    "builtin",
    "cmake_prefix_path",
    "custom_opsets",
    "declare_node",
    "export",
    "libraries",
    "load",
    "load_inline",
    "load_library",
    "load_torch",
    "session",
    "session_options",
    "substitute",
    "substitution_rules",
    "substitutions",
    "torch_deferred",
    "torchscript_exporter_available",
    "translation_table",
    "verify",
]
