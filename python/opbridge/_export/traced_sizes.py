"""The TorchScript exporter's route for symbolic attributes (AttributeInfo.symbolic): a value
models compute from sizes, such as FPS's npoint = N // 4.

While the exporter traces, `x.shape[1] // 4` is a traced 0-dim tensor, but passing it to a torch
op's int (even SymInt) argument records a constant: the node would hold the example's value at
every size. So, for the export's duration and on the exporting thread only (a TorchFunctionMode,
whose stack is per thread), a call of an op with a symbolic attribute that arrives as a traced
tensor runs through one generic autograd.Function instead. Its forward calls the op on the value
as an int; its `symbolic`, which the TorchScript exporter honours, writes the op's node with the
traced value as the attribute's input (torchscript.symbolic_for). Calls made through substitution
rules (an autograd.Function of a model's package routed to the op) reach the op the same way.
Nothing here names an op."""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

from .._library.manifest import OpInfo
from .._library.registry import all_ops
from .rules import split_args
from .torchscript import symbolic_for


def _ops_by_callable() -> dict:
    """The ops with a symbolic attribute, by their PyTorch callables (overload and packet)."""
    out: dict = {}
    for op in all_ops():
        if op.defines_torch_op and op.symbolic_attributes and op.available:
            out[op.overload] = op
            out[op.overload.overloadpacket] = op
    return out


class _SizeAttributeCall(torch.autograd.Function):
    """An op call whose symbolic attributes are traced tensors: arguments (op's qualified name,
    the op's inputs, then every attribute in the op's order)."""

    @staticmethod
    def forward(ctx, qualified_name: str, *args):
        op = _op(qualified_name)
        n = len(op.inputs)
        # The int conversions are the op's eager call, not part of the traced graph (the symbolic
        # writes that): pause the tracer so they neither record nor warn.
        state = torch._C._get_tracing_state()
        torch._C._set_tracing_state(None)
        try:
            attrs = {a.name: int(v) if isinstance(v, torch.Tensor) else v
                     for a, v in zip(op.attributes, args[n:]) if v is not None}
            return op.overload(*args[:n], **attrs)
        finally:
            torch._C._set_tracing_state(state)

    @staticmethod
    def symbolic(g, qualified_name: str, *args):
        return symbolic_for(_op(qualified_name))(g, *args)


def _op(qualified_name: str) -> OpInfo:
    return next(o for o in all_ops() if o.qualified_name == qualified_name and o.defines_torch_op)


class _TracedSizes(TorchFunctionMode):
    def __init__(self, ops: dict):
        super().__init__()
        self.ops = ops

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = self.ops.get(func)
        if op is not None and torch.jit.is_tracing():
            inputs, attrs = split_args(op, tuple(args), dict(kwargs))
            if any(isinstance(attrs.get(a.name), torch.Tensor) for a in op.symbolic_attributes):
                values = [attrs.get(a.name, a.default) for a in op.attributes]
                return _SizeAttributeCall.apply(op.qualified_name, *inputs, *values)
        return func(*args, **kwargs)


@contextlib.contextmanager
def traced_sizes():
    """Within: the calling thread's traced calls of ops with symbolic attributes take the route
    above (nothing changes where no loaded op has one)."""
    ops = _ops_by_callable()
    if not ops:
        yield
        return
    with _TracedSizes(ops):
        yield
