"""opbridge: write a custom operator once in C++, get the PyTorch op, ONNX export with both
PyTorch exporters, ONNX schemas, and an ONNX Runtime kernel — and verify they agree.

    import opbridge, torch
    y = torch.ops.opbridge.<op>(a, b)                                     # or opbridge.<op>(a, b)
    onnx_model = opbridge.export(model, (a, b), "model.onnx")             # dynamo=True
    onnx_model = opbridge.export(model, (a, b), exporter="torchscript")   # dynamo=False
    print(opbridge.verify(model, (a, b), onnx_model))                     # ORT vs eager
"""

from ._build import load, load_inline
from ._dynamo import translation_table
from ._errors import OpbridgeError
from ._export import EXPORTERS, export
from ._functions import add_functions
from ._loading import build_info, cmake_prefix_path, load_builtin, load_library
from ._manifest import Library, OpInfo
from ._registry import all_ops, libraries
from ._schemas import declare_node
from ._session import session, session_options
from ._torchscript import custom_opsets, torchscript_exporter_available
from ._verify import OutputDiff, VerifyReport, verify

builtin = load_builtin()
__version__: str = build_info()["opbridge"]


def __getattr__(name: str):
    """opbridge.<op>: the PyTorch op of a built-in op (torch.ops.<namespace>.<op>)."""
    for op in builtin.ops:
        if op.name == name and op.defines_torch_op:
            return getattr(getattr(__import__("torch").ops, builtin.torch_namespace), name)
    raise AttributeError(f"module 'opbridge' has no attribute or op named '{name}'")


__all__ = [
    "__version__",
    "EXPORTERS",
    "Library",
    "OpInfo",
    "OpbridgeError",
    "OutputDiff",
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
    "session",
    "session_options",
    "torchscript_exporter_available",
    "translation_table",
    "verify",
]
