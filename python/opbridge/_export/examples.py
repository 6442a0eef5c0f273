"""The example inputs as the exporters must be given them."""

from __future__ import annotations

import torch


def distinct_examples(args: tuple, kwargs: dict | None) -> tuple[tuple, dict | None]:
    """Example tensors that share memory (one tensor passed for several arguments, or views of
    one storage) become copies of their own: an exporter may wire every use of shared memory to
    one graph input, and the model would then compute with one value where the caller has
    several."""
    seen: set[int] = set()

    def own(t):
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            return t
        key = t.untyped_storage().data_ptr()
        if key in seen:
            return t.clone()
        seen.add(key)
        return t

    args, kwargs = torch.utils._pytree.tree_map(own, (args, kwargs))
    return args, kwargs


class KeywordsBound(torch.nn.Module):
    """Calls `model(*args, **kwargs)` with the tensors of args and kwargs taken positionally (in
    the order opbridge names graph inputs) and everything else fixed."""

    def __init__(self, model, args: tuple, kwargs: dict):
        super().__init__()
        self.model = model
        self.spec = torch.utils._pytree.tree_flatten((args, kwargs))
        self.is_tensor = [isinstance(v, torch.Tensor) for v in self.spec[0]]

    def forward(self, *tensors):
        it = iter(tensors)
        leaves = [next(it) if t else v for v, t in zip(self.spec[0], self.is_tensor)]
        args, kwargs = torch.utils._pytree.tree_unflatten(leaves, self.spec[1])
        return self.model(*args, **kwargs)
