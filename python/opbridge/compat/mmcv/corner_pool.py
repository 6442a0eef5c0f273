"""mmcv's `CornerPool.forward(self, x)` (CornerNet's and CentripetalNet's corner pooling) on
opbridge's corner_pool op, as a substitution rule (opbridge.export and opbridge.substitutions()
apply it).

mmcv computes it as torch.cummax along H or W (flipped before and after for 'top' and 'left'),
which neither ONNX exporter translates. The module keeps its mode in `self.mode`, so the rule is a
method of the module here, not a definition's `replaces()` (which binds call arguments only).
"""

from __future__ import annotations

import torch
from torch import Tensor

import opbridge

opbridge.load_torch()  # torch.ops.opbridge.* exist from here on

__all__ = ["TARGET", "corner_pool_forward"]

TARGET = "mmcv.ops.corner_pool.CornerPool.forward"


def corner_pool_forward(self, x: Tensor) -> Tensor:
    """CornerPool(mode)(x) for (N, C, H, W) x: the running maximum towards `self.mode`'s side."""
    return torch.ops.opbridge.corner_pool(x, mode=self.mode)


opbridge.substitute(TARGET, corner_pool_forward,
                    doc="opbridge.compat.mmcv.corner_pool: opbridge::corner_pool with the module's mode")
