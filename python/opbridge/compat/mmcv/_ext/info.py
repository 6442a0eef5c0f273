"""mmcv._ext's build information, which mmcv's environment report (mmcv.utils.collect_env) asks."""

from __future__ import annotations

import opbridge

__all__ = ["get_compiler_version", "get_compiling_cuda_version"]


def get_compiler_version() -> str:
    return f"opbridge {opbridge.__version__} (mmcv._ext on opbridge's ops)"


def get_compiling_cuda_version() -> str:
    return "not available"  # what mmcv's own extension answers when built without CUDA
