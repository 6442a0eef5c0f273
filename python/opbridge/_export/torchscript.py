"""dynamo=False (the TorchScript exporter, deprecated upstream): one symbolic function per op,
registered with torch.onnx.register_custom_op_symbolic when the library loads, and
`custom_opsets` for the custom domains. Nothing here names an op."""

from __future__ import annotations

import contextlib
import contextvars
from typing import Callable

import torch

from .._library.errors import OpbridgeError
from .._library.kinds import ATTR_KINDS, DTYPES, dtype_of
from .._library.manifest import Library, OpInfo
from .._library.registry import all_ops
from .._library.shapes import output_shapes
from .isolation import hidden_here
from .rules import ExportOptions, choose_target, input_dtypes, map_call, split_args

# One symbolic for every opset: registered at the exporter's base opset, which its registry also
# serves to older targets. Below an op's lowest rule the symbolic says which opset it needs.
TORCHSCRIPT_BASE_OPSET = 9
# The exporter takes, for a target opset, the symbolic registered at the highest opset not above
# it: a rule for an op that PyTorch or a package already has is registered at every opset up to
# this, so that the package's own symbolic at a higher opset (torchvision registers some at 11 and
# 16, writing standard ONNX ops that compute something else) does not take over from there.
try:
    from torch.onnx._constants import ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET as TORCHSCRIPT_MAX_OPSET
except ImportError:  # a torch that names it otherwise
    TORCHSCRIPT_MAX_OPSET = 20


def torchscript_exporter_available() -> bool:
    return hasattr(torch.onnx, "register_custom_op_symbolic") and hasattr(torch.onnx, "symbolic_helper")


# custom_nodes and portable for the TorchScript exporter, whose symbolics are registered once:
# set around an export by opbridge.export (a context variable: concurrent exports do not see
# each other's). The target opset comes from the graph being built.
_requested: contextvars.ContextVar[tuple[bool, bool]] = contextvars.ContextVar("opbridge_export_options",
                                                                              default=(False, False))


@contextlib.contextmanager
def options_requested(custom_nodes: bool, portable: bool):
    token = _requested.set((custom_nodes, portable))
    try:
        yield
    finally:
        _requested.reset(token)


def symbolic_for(op: OpInfo) -> Callable:
    """The op's symbolic function for the TorchScript exporter."""
    from torch.onnx import symbolic_helper as sh

    n_out = len(op.outputs)

    def symbolic(g, *args):
        inputs, attrs = split_args(op, args, {})
        dtypes = [None if v is None or sh._is_none(v) else _dtype(v) for v in inputs]
        target = choose_target(op, ExportOptions(g.opset, *_requested.get()), input_dtypes(op, dtypes))
        consts, computed = {}, {}
        for a in op.attributes:
            v = attrs.get(a.name)
            if isinstance(v, torch._C.Value):
                if sh._is_none(v):
                    continue
                v = sh._maybe_get_const(v, ATTR_KINDS[a.kind].torchscript_kind)
                if isinstance(v, torch._C.Value) and a.symbolic:
                    computed[a.name] = _int64(g, v)  # a size the graph computes: the node's input
                    continue
                if isinstance(v, torch._C.Value):
                    raise OpbridgeError(f"{op.qualified_name}: attribute '{a.name}' must be a constant to export")
            if isinstance(v, torch.Tensor):
                v = v.tolist()
            if v is not None:
                consts[a.name] = v
        is_none = lambda v: v is None or sh._is_none(v)  # noqa: E731
        node_inputs, node_attrs = map_call(op, target, inputs, {**consts, **computed}, is_none,
                                           lambda v: isinstance(v, torch._C.Value))
        node_inputs = [_none_value(g) if v is None else v for v in node_inputs]
        kw = {f"{k}_{ATTR_KINDS[kind].symbolic_suffix}": ATTR_KINDS[kind].onnx_value(v)
              for k, (kind, v) in node_attrs.items()}
        name = target.op_type if target.standard else f"{target.domain}::{target.op_type}"
        outs = g.op(name, *node_inputs, outputs=n_out, **kw)
        _set_output_types(op, [None if is_none(v) else v for v in inputs], consts, [outs] if n_out == 1 else list(outs))
        return outs

    return symbolic


def _int64(g, value):
    """A traced integer as the int64 value a symbolic attribute's input takes."""
    return value if _dtype(value) == "int64" else g.op("Cast", value, to_i=DTYPES["int64"].onnx)


def _dtype(value) -> str | None:
    """The dtype name of a traced value, when the exporter knows it."""
    try:
        dtype = value.type().dtype()
        return dtype_of(dtype).name if dtype is not None else None
    except (RuntimeError, AttributeError, KeyError):
        return None


def _none_value(g):
    # A None-typed value: the TorchScript exporter writes it as an empty input name.
    v = g.op("prim::Constant")
    v.setType(torch._C.NoneType.get())
    return v


def _set_output_types(op: OpInfo, inputs: list, consts: dict, outs: list) -> None:
    """Types the node's outputs from the traced input types (None: an absent optional input) by
    the op's shape rules and type constraints, so the TorchScript exporter's shape inference knows
    them: a dimension that follows a dynamic input dimension, or that only the kernel knows, stays
    dynamic. Best effort: where an input's rank or dtype is unknown the outputs stay untyped."""
    typed = [None if v is None else (v.type().varyingSizes(), v.type().dtype()) for v in inputs]
    if any(t is not None and (t[0] is None or t[1] is None) for t in typed):
        return
    try:
        shapes = output_shapes(op, [None if t is None else t[0] for t in typed], consts)
    except OpbridgeError:
        return  # a call the op refuses: eager already said so while tracing
    if any(isinstance(d, int) and d < 0 for shape in shapes for d in shape):
        return
    dtypes = op.output_dtypes([None if t is None else dtype_of(t[1]).name for t in typed])
    for value, shape, dtype in zip(outs, shapes, dtypes):
        if dtype is None:
            continue
        sizes = [d if isinstance(d, int) else None for d in shape]
        like = torch.empty([1 if d is None else d for d in sizes], dtype=DTYPES[dtype].torch, device="meta")
        value.setType(torch._C.TensorType.create_from_tensor(like).with_sizes(sizes))


def _register(ops) -> None:
    # Only this thread's warnings are hidden (an exporter's deprecation notice per op, where the
    # torch has one): this runs before every TorchScript export, and warnings.catch_warnings would
    # swap the process's filters and drop other threads' warnings meanwhile.
    with hidden_here():
        for op in ops:
            symbolic = symbolic_for(op)
            top = TORCHSCRIPT_BASE_OPSET if op.defines_torch_op else TORCHSCRIPT_MAX_OPSET
            for opset in range(TORCHSCRIPT_BASE_OPSET, top + 1):
                torch.onnx.register_custom_op_symbolic(op.qualified_name, symbolic, opset)


def register_torchscript_symbolics(lib: Library) -> None:
    if torchscript_exporter_available():  # else export(exporter="torchscript") says so in one line
        _register(lib.ops)


def claim_existing_ops() -> None:
    """Before a TorchScript export: the rules for ops PyTorch or a package already has, registered
    again over what a package imported since the library loaded registered for them (torchvision
    registers its symbolics when it is imported)."""
    _register([op for op in all_ops() if not op.defines_torch_op])


def custom_opsets() -> dict[str, int]:
    """The custom domain versions to tell the TorchScript exporter. It assumes version 1 for a
    domain it is not told about, and warns about every domain it is told about that the model
    does not use; so only versions above 1 are listed."""
    out: dict[str, int] = {}
    for op in all_ops():
        if op.has_own_node and op.since_version > 1:
            out[op.onnx_domain] = max(out.get(op.onnx_domain, 1), op.since_version)
    return out
