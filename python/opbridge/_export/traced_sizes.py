"""The TorchScript exporter's route for symbolic attributes (AttributeInfo.symbolic): a value
models compute from sizes, such as FPS's npoint = N // 4.

While the exporter traces, `x.shape[1] // 4` is a traced 0-dim tensor, but passing it to a torch
op's int (even SymInt) argument records a constant: the node would hold the example's value at
every size. So each op with a symbolic attribute gets a substitution rule on its PyTorch callable
(`torch.ops.<namespace>.<op>`, substitution.py: the rule applies on the exporting thread only):
a call whose symbolic attribute arrives as a traced tensor runs through one generic
autograd.Function instead, and every other call goes to the op as it is. (A TorchFunctionMode
would see the calls too, but it would stand between the model and every torch function, and the
trace's TracerWarnings would then point at the mode instead of the model's lines.)
The Function's forward calls the op on the value as an int; its `symbolic`, which the TorchScript
exporter honours, writes the op's node with the traced value as the attribute's input
(torchscript.symbolic_for). Calls made through an op definition's own rules (an autograd.Function
of a model's package routed to the op) reach the op through torch.ops too. Nothing here names an
op."""

from __future__ import annotations

import contextlib

import torch

from .._library.manifest import OpInfo
from .._library.registry import all_ops
from .rules import split_args
from .substitution import substitute, substitution_rules
from .torchscript import symbolic_for


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
            symbolic = {a.name for a in op.symbolic_attributes}
            attrs = {a.name: (int(v) if a.name in symbolic else v.item()) if isinstance(v, torch.Tensor) else v
                     for a, v in zip(op.attributes, args[n:]) if v is not None}
            return op.overload(*args[:n], **attrs)
        finally:
            torch._C._set_tracing_state(state)

    @staticmethod
    def symbolic(g, qualified_name: str, *args):
        return symbolic_for(_op(qualified_name))(g, *args)


def _op(qualified_name: str) -> OpInfo:
    return next(o for o in all_ops() if o.qualified_name == qualified_name and o.defines_torch_op)


def _rule(op: OpInfo):
    """The op's packet as a rule's replacement: traced tensors for symbolic attributes take the
    Function's route, and everything else calls the op."""
    packet = op.overload.overloadpacket

    def call(*args, **kwargs):
        if torch.jit.is_tracing():
            inputs, attrs = split_args(op, tuple(args), dict(kwargs))
            if any(isinstance(attrs.get(a.name), torch.Tensor) for a in op.symbolic_attributes):
                values = [attrs.get(a.name, a.default) for a in op.attributes]
                return _SizeAttributeCall.apply(op.qualified_name, *inputs, *values)
        return packet(*args, **kwargs)

    call.__name__ = call.__qualname__ = op.name
    call.__doc__ = f"{op.qualified_name}: symbolic attributes as graph values under the TorchScript trace"
    return call


@contextlib.contextmanager
def traced_sizes():
    """Makes sure every loaded op with a symbolic attribute has its rule (substitution applies it;
    a rule of the user's own for the same op is left as it is)."""
    known = {r.target for r in substitution_rules()}
    for op in all_ops():
        target = f"torch.ops.{op.qualified_name.replace('::', '.')}"
        if op.defines_torch_op and op.symbolic_attributes and op.available and target not in known:
            substitute(target, _rule(op), doc=f"{op.qualified_name} (symbolic attributes under the TorchScript trace)")
    yield
