"""spconv.pytorch.modules: SparseModule (the base class SparseSequential hands the sparse tensor to),
SparseSequential, and the element-wise modules that take a SparseConvTensor or a tensor."""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

__all__ = ["SparseBatchNorm", "SparseIdentity", "SparseModule", "SparseReLU", "SparseSequential",
           "is_spconv_module"]


class SparseModule(nn.Module):
    """A module SparseSequential passes the SparseConvTensor itself (not its features)."""

    def __init__(self, name=None):
        super().__init__()
        self.name = name
        self._sparse_unique_name = ""


def _on_features(cls):
    """The dense module `cls` applied to a SparseConvTensor's features (a tensor as it is)."""

    class OnFeatures(cls):
        def forward(self, input):
            if hasattr(input, "replace_feature"):
                return input.replace_feature(super().forward(input.features))
            return super().forward(input)

    OnFeatures.__name__ = OnFeatures.__qualname__ = f"Sparse{cls.__name__.replace('1d', '')}"
    return OnFeatures


SparseBatchNorm = _on_features(nn.BatchNorm1d)
SparseReLU = _on_features(nn.ReLU)
SparseIdentity = _on_features(nn.Identity)


def is_spconv_module(module) -> bool:
    return isinstance(module, (SparseModule, SparseBatchNorm, SparseReLU))


class SparseSequential(SparseModule):
    """Modules in order (positional, an OrderedDict, or keywords): spconv's modules take the sparse
    tensor, the others its features."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        items = args[0].items() if len(args) == 1 and isinstance(args[0], OrderedDict) else \
            ((str(i), m) for i, m in enumerate(args))
        for key, module in items:
            self.add_module(key, module)
        for key, module in kwargs.items():
            if key in self._modules:
                raise ValueError(f"SparseSequential: name {key!r} exists")
            self.add_module(key, module)

    def __getitem__(self, idx):
        if not -len(self) <= idx < len(self):
            raise IndexError(f"index {idx} is out of range")
        return list(self._modules.values())[idx]

    def __len__(self):
        return len(self._modules)

    def add(self, module, name=None):
        name = str(len(self._modules)) if name is None else name
        if name in self._modules:
            raise KeyError("name exists")
        self.add_module(name, module)

    def forward(self, input):
        for module in self._modules.values():
            if is_spconv_module(module) or not hasattr(input, "replace_feature"):
                input = module(input)
            elif input.indices.shape[0] != 0:  # spconv's test (see opbridge.compat.spconv.rules on export)
                input = input.replace_feature(module(input.features))
        return input
