"""pointnet2_ops (Pointnet2_PyTorch's CUDA extension) on opbridge's ops: its `pointnet2_utils`
module. The real package imports `pointnet2_modules` too; that module's set-abstraction layers are
Python on top of these functions and are not provided here."""

from . import pointnet2_utils

__all__ = ["pointnet2_utils"]
__version__ = "3.0.0"
