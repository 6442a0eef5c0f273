"""opbridge: write a custom operator once in C++, get the PyTorch op, ONNX export with both
PyTorch exporters, ONNX schemas, and an ONNX Runtime kernel — and verify they agree.

    import opbridge, torch
    y = torch.ops.opbridge.my_add(a, b)
    onnx_model = opbridge.export(model, (a, b), "model.onnx")             # dynamo=True
    onnx_model = opbridge.export(model, (a, b), exporter="torchscript")   # dynamo=False
    print(opbridge.verify(model, (a, b), onnx_model))                     # ORT vs eager
"""

from ._api import EXPORTERS, OutputDiff, VerifyReport, export, session, session_options, verify
from ._exporters import add_functions, custom_opsets, torchscript_exporter_available, translation_table
from ._library import (
    Library,
    OpbridgeError,
    OpInfo,
    all_ops,
    cmake_prefix_path,
    libraries,
    load_builtin,
    load_library,
)

builtin = load_builtin()


def __getattr__(name: str):
    """opbridge.<op>: the PyTorch op of a built-in op (torch.ops.opbridge.<op>)."""
    for op in builtin.ops:
        if op.name == name and op.defines_torch_op:
            return getattr(getattr(__import__("torch").ops, builtin.torch_namespace), name)
    raise AttributeError(f"module 'opbridge' has no attribute or op named '{name}'")

__all__ = [
    "EXPORTERS",
    "Library",
    "add_functions",
    "OpInfo",
    "OpbridgeError",
    "OutputDiff",
    "VerifyReport",
    "all_ops",
    "builtin",
    "cmake_prefix_path",
    "custom_opsets",
    "export",
    "libraries",
    "load_library",
    "session",
    "session_options",
    "torchscript_exporter_available",
    "translation_table",
    "verify",
]
