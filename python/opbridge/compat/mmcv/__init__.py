"""mmcv's deformable convolutions on opbridge's ops: the `mmcv.ops` module only (install("mmcv")
serves it where mmcv is absent; with mmcv installed, the real package's other parts stay)."""

from . import ops

__all__ = ["ops"]
