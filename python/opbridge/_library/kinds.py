"""The two translation tables of the package, each in one place:

- DTYPES: a dtype name as the manifest (and the `opbridge` command) spells it -> the torch
  dtype, the numpy dtype, the ONNX TensorProto element type and its "tensor(float)" spelling;
- ATTR_KINDS: an attribute kind of the manifest ("int", "bool", "float", "str", "int[]",
  "float[]") -> how ONNX schemas, AttributeProtos, the TorchScript exporter and onnxscript
  each write it.

Neither imports torch, onnx or onnx_ir until a column that needs it is read: the tables serve the
commands that start without them too.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class DType:
    name: str  # "float32", as the manifest names it
    numpy: np.dtype | None  # None: numpy has no such type
    onnx_name: str  # "float", as ONNX spells the element type
    proto_name: str  # "FLOAT", the TensorProto.DataType member

    @functools.cached_property
    def torch(self):
        import torch

        return getattr(torch, self.name)

    @functools.cached_property
    def onnx(self) -> int:
        """The TensorProto element type."""
        from onnx import TensorProto

        return getattr(TensorProto, self.proto_name)

    @property
    def onnx_type(self) -> str:
        """'tensor(float)': how ONNX schemas and ONNX Runtime name the tensor type."""
        return f"tensor({self.onnx_name})"


DTYPES: dict[str, DType] = {d.name: d for d in (
    DType("float32", np.dtype(np.float32), "float", "FLOAT"),
    DType("float64", np.dtype(np.float64), "double", "DOUBLE"),
    DType("float16", np.dtype(np.float16), "float16", "FLOAT16"),
    DType("bfloat16", None, "bfloat16", "BFLOAT16"),
    DType("int8", np.dtype(np.int8), "int8", "INT8"),
    DType("int16", np.dtype(np.int16), "int16", "INT16"),
    DType("int32", np.dtype(np.int32), "int32", "INT32"),
    DType("int64", np.dtype(np.int64), "int64", "INT64"),
    DType("uint8", np.dtype(np.uint8), "uint8", "UINT8"),
    DType("bool", np.dtype(np.bool_), "bool", "BOOL"),
)}


def dtype_of(dtype) -> DType:
    """The table's entry for a torch or numpy dtype."""
    if type(dtype).__module__ == "torch":  # a torch.dtype, told apart without importing torch
        found = [d for d in DTYPES.values() if d.torch == dtype]
    else:
        found = [d for d in DTYPES.values() if d.numpy is not None and d.numpy == np.dtype(dtype)]
    if found:
        return found[0]
    raise KeyError(f"opbridge has no dtype {dtype}")


def positional(args) -> tuple:
    """A call's positional arguments, one convention for export and verify: a tuple (a single
    value is wrapped), a dict in it is an argument like any other (keyword arguments go in
    kwargs=), and a trailing empty dict, torch.onnx.export's marker for "no keyword arguments",
    is dropped."""
    if not isinstance(args, tuple):
        args = (args,)
    return args[:-1] if args and isinstance(args[-1], dict) and not args[-1] else args


def tensor_leaves(tree) -> list:
    """The tensors in a nest of arguments, in order: what an exported graph takes as inputs (and
    gives as outputs), in the order both exporters and verify() use."""
    import torch

    return [t for t in torch.utils._pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _scalar(value):
    return value


def _as_int(value):
    return int(bool(value))


def _as_float(value):
    return float(value)


def _as_floats(value):
    return [float(v) for v in value]


@dataclasses.dataclass(frozen=True)
class AttrKind:
    name: str  # "int[]", as the manifest names it
    proto_name: str  # the AttributeProto.AttributeType member: "INTS"
    torchscript_kind: str  # symbolic_helper._maybe_get_const's kind: "i", "b", "f", "s", "is", "fs"
    symbolic_suffix: str  # the keyword suffix of g.op in a TorchScript symbolic: alpha_f=0.5
    onnx_value: Callable[[Any], Any]  # a Python value as ONNX stores it (bools are ints, floats float)
    onnx_ir_list: str | None  # list kinds: onnx_ir's typed attribute class
    other_kind_values: tuple  # node attribute values of other kinds (as onnx.helper types them)

    @functools.cached_property
    def proto_type(self) -> int:
        """AttributeProto.AttributeType."""
        from onnx import AttributeProto

        return getattr(AttributeProto, self.proto_name)

    @functools.cached_property
    def schema_type(self):
        """The type of a required attribute of an ONNX OpSchema."""
        from onnx import defs

        return getattr(defs.OpSchema.AttrType, self.proto_name)

    def attribute_proto(self, name: str, value):
        """The attribute typed explicitly: make_attribute cannot tell what an empty list holds."""
        from onnx import helper

        return helper.make_attribute(name, self.onnx_value(value), attr_type=self.proto_type)

    def onnxscript_value(self, name: str, value):
        """The attribute as an onnxscript call takes it: lists typed explicitly (an empty Python
        list would otherwise become INTS)."""
        value = self.onnx_value(value)
        if not self.onnx_ir_list:
            return value
        import onnx_ir

        return getattr(onnx_ir, self.onnx_ir_list)(name, value)


ATTR_KINDS: dict[str, AttrKind] = {k.name: k for k in (
    AttrKind("int", "INT", "i", "i", _scalar, None, ("s", 1.5, [1, 2])),
    AttrKind("bool", "INT", "b", "i", _as_int, None, ("s", 1.5, [1, 2])),
    AttrKind("float", "FLOAT", "f", "f", _as_float, None, ("s", 3, [1.0, 2.0])),
    AttrKind("str", "STRING", "s", "s", _scalar, None, (3, 1.5, [1, 2])),
    AttrKind("int[]", "INTS", "is", "i", _scalar, "AttrInt64s", (3, 1.5, "s", [1.5, 2.5])),
    AttrKind("float[]", "FLOATS", "fs", "f", _as_floats, "AttrFloat32s", (3, 1.5, "s", [1, 2])),
)}
