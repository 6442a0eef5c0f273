"""The tensors of a call against an exported graph's inputs: which tensor feeds which input (by
order, or by name where an exporter dropped one), and where each tensor sits in the call."""

from __future__ import annotations

from typing import Sequence

import torch

from .._library.errors import OpbridgeError
from .._library.kinds import tensor_leaves


def match_inputs(graph_inputs: Sequence[str], model, args: tuple, kwargs: dict,
                 input_names: Sequence[str] | None) -> tuple[list[tuple[str, int]], tuple[str, ...]]:
    """Which tensor of the call (its index among the call's tensors, in order) feeds each graph
    input: in order when the counts agree; by name where the graph has fewer inputs (an exporter
    dropped one): `input_names` as given to export, else forward's parameter names. Returns the
    (graph input, tensor index) pairs and the names of the call's tensors the graph does not take."""
    tensors = tensor_leaves((args, kwargs))
    if len(graph_inputs) == len(tensors):
        return list(zip(graph_inputs, range(len(tensors)))), ()
    given = list(input_names) if input_names else parameter_names(model, args, kwargs, len(tensors))
    if given and len(given) == len(tensors) and set(graph_inputs) <= set(given):
        pairs = [(n, k) for k, n in enumerate(given) if n in graph_inputs]
        return pairs, tuple(n for n in given if n not in graph_inputs)
    raise OpbridgeError(f"the ONNX model has {len(graph_inputs)} inputs ({', '.join(graph_inputs)}), the call passes "
                        f"{len(tensors)} tensors" + (f" ({', '.join(given)})" if given else "") +
                        "; pass input_names= as given to export to match them by name")


def parameter_names(model, args: tuple, kwargs: dict, count: int) -> list[str] | None:
    """The names of forward's parameters, one per tensor of the call, when each tensor is a
    parameter's whole value (as the dynamo exporter names graph inputs); else None."""
    import inspect

    try:
        bound = inspect.signature(getattr(model, "forward", model)).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return None
    names = [n for n, v in bound.arguments.items() if isinstance(v, torch.Tensor)]
    return names if len(names) == count else None


def tensor_paths(args: tuple, kwargs: dict) -> list[str]:
    """Where each tensor of the call sits, as Python would index it: args[0]['pos'], kwargs['x']."""
    flat, _ = torch.utils._pytree.tree_flatten_with_path((args, kwargs))
    out = []
    for path, leaf in flat:
        if isinstance(leaf, torch.Tensor):
            text = torch.utils._pytree.keystr(path)  # "[0][0]['pos']"
            head, _, rest = text[1:].partition("]")
            out.append(("args" if head == "0" else "kwargs") + rest)
    return out
