"""Autograd from the definition: an op that names a backward op (OpBuilder::backward) gets a
PyTorch autograd formula that calls it. The backward op's arguments are named after the op's
(grad_<output>, saved inputs and outputs, attributes; outputs grad_<input>), so one generic
formula serves every op: it saves what the backward op reads, passes the incoming gradients,
and sums each input's gradient down to that input's shape where it broadcast. Integer outputs
are marked non-differentiable. Nothing here names an op."""

from __future__ import annotations

import torch

from .._library.errors import OpbridgeError
from .._library.kinds import DTYPES
from .._library.manifest import Library, OpInfo

_FLOATS = {name for name, d in DTYPES.items() if d.torch.is_floating_point}


def _formula(op: OpInfo, bwd: OpInfo):
    in_names = [i.name for i in op.inputs]
    out_names = [o.name for o in op.outputs]
    saved_inputs = [i.name for i in bwd.inputs if i.name in in_names]
    saved_outputs = [i.name for i in bwd.inputs if i.name in out_names]
    integer_outputs = [k for k, o in enumerate(op.outputs)
                       if not set(op.type_constraint(o.type).dtypes) & _FLOATS]

    def setup_context(ctx, inputs, output, keyword_only_inputs=None):
        # PyTorch passes keyword-only arguments (attributes after a default) separately.
        given = dict(zip(in_names + [a.name for a in op.attributes], inputs))
        given.update(keyword_only_inputs or {})
        outs = (output,) if isinstance(output, torch.Tensor) else tuple(output)
        by_output = dict(zip(out_names, outs))
        ctx.save_for_backward(*[given[n] for n in saved_inputs], *[by_output[n] for n in saved_outputs])
        ctx.shapes = [t.shape if isinstance(t, torch.Tensor) else None for t in inputs[: len(in_names)]]
        ctx.attrs = {a.name: given.get(a.name) for a in bwd.attributes if given.get(a.name) is not None}
        if integer_outputs:
            ctx.mark_non_differentiable(*[outs[k] for k in integer_outputs])

    def backward(ctx, *grads):
        saved = dict(zip(saved_inputs + saved_outputs, ctx.saved_tensors))
        args = []
        for i in bwd.inputs:
            if i.name.startswith("grad_") and i.name[5:] in out_names:
                args.append(grads[out_names.index(i.name[5:])])
            else:
                args.append(saved[i.name])
        result = bwd.overload(*args, **ctx.attrs)
        result = (result,) if isinstance(result, torch.Tensor) else tuple(result)
        out = [None] * (len(in_names) + len(op.attributes))
        for o, g in zip(bwd.outputs, result):
            k = in_names.index(o.name[5:])
            shape = ctx.shapes[k]
            if shape is None or not ctx.needs_input_grad[k]:
                continue
            out[k] = g.sum_to_size(shape) if g.shape != shape else g
        if torch.is_grad_enabled():  # create_graph: these gradients may be differentiated again
            sources = [t for t in (*ctx.saved_tensors, *grads) if isinstance(t, torch.Tensor) and t.requires_grad]
            out = [g if g is None else _NoGradOfGrad.apply(op.qualified_name, g, *sources) for g in out]
        return tuple(out)

    return setup_context, backward


class _NoGradOfGrad(torch.autograd.Function):
    """Stands on a gradient computed under create_graph=True: differentiating it again is an error
    that names the op (its backward op has no gradient), not PyTorch's "does not require grad"."""

    @staticmethod
    def forward(ctx, name, grad, *sources):
        ctx.name = name
        return grad.clone()

    @staticmethod
    def backward(ctx, *_):
        raise OpbridgeError(f"{ctx.name}: double backward (a gradient of its gradient) is not supported: its "
                            "backward op has no gradient of its own")


def register_autograd(lib: Library) -> None:
    for op in lib.ops:
        if op.backward and op.defines_torch_op:
            setup_context, backward = _formula(op, lib.op(op.backward))
            torch.library.register_autograd(op.qualified_name, backward, setup_context=setup_context)
