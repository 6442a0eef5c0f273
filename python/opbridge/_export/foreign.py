"""Code of other installed packages that an exporter cannot see into: a package's Python that hands
tensors to its own compiled extension (spconv's sparse convolution, a CUDA-only Function). The
dynamo exporter fails inside it on fake tensors; the TorchScript trace records what the extension
returned as constants and may drop the inputs it read. Either way the user needs to know which of
the package's functions to substitute, which is what this module finds: from an exception's
traceback, or by watching one eager call."""

from __future__ import annotations

import dataclasses
import sys
import sysconfig
from pathlib import Path

import torch

from .._library.errors import exception_chain

# Packages that are not the model's operators: PyTorch and its exporters, opbridge, numerics.
_OWN = {"torch", "opbridge", "onnx", "onnxscript", "onnx_ir", "onnxruntime", "numpy", "functorch", "sympy",
        "typing_extensions", "_pytest", "pytest", "pluggy"}
_STDLIB = str(Path(sysconfig.get_paths()["stdlib"]).resolve())


@dataclasses.dataclass(frozen=True)
class ForeignCall:
    entry: str  # "spconv.pytorch.conv.SparseConvolution.forward": where the model enters the package
    inner: str  # the innermost function of the package on the way to the failure (or the same)
    where: str  # the model's line that calls `entry`, "" when unknown

    def advice(self) -> str:
        return (f"  @opbridge.substitute({self.entry!r})\n  def replacement(...): ...  # the same arguments, on "
                "opbridge's or PyTorch's ops")


def _package(frame) -> str | None:
    """The top-level package of an installed package's frame, None for PyTorch's, opbridge's, the
    standard library's and the model's own code (files outside site-packages)."""
    name = frame.f_globals.get("__name__") or ""
    top = name.split(".")[0]
    path = frame.f_code.co_filename
    if top in _OWN or not top or ("site-packages" not in path and "dist-packages" not in path):
        return None
    return None if path.startswith(_STDLIB) and "site-packages" not in path else top


def _qualified(frame) -> str:
    return f"{frame.f_globals.get('__name__')}.{getattr(frame.f_code, 'co_qualname', frame.f_code.co_name)}"


# What PyTorch says when code hands a traced (fake) tensor to compiled code that reads its memory.
_UNTRACEABLE = ("Cannot access data pointer of Tensor", "Cannot access storage of", "doesn't have storage",
                "Cannot call sizes() on tensor", "data_ptr")


def failed_in_package(error: BaseException) -> ForeignCall | None:
    """The installed package whose code `error` (or an exception it wraps) was raised from, when
    the failure is PyTorch refusing to hand a traced tensor's memory to compiled code: where the
    model entered the package and its innermost frame. None otherwise."""
    chain = list(exception_chain(error))
    if not any(marker in str(e) for e, _ in chain for marker in _UNTRACEABLE):
        return None
    for _, frames in chain:
        packages = [_package(f) for f in frames]
        inner = next((k for k in range(len(frames) - 1, -1, -1) if packages[k]), None)
        if inner is not None:
            top = packages[inner]
            entry = inner
            while entry > 0 and packages[entry - 1] in (top, None) and not _is_model_code(frames[entry - 1]):
                entry -= 1
            while packages[entry] != top:
                entry += 1
            caller = next((f for f in reversed(frames[:entry]) if _is_model_code(f)), None)
            where = f"{caller.f_code.co_filename}:{caller.f_lineno}" if caller is not None else ""
            return ForeignCall(_qualified(frames[entry]), _qualified(frames[inner]), where)
    return None


def _is_model_code(frame) -> bool:
    """A frame of the model's own code: neither an installed package nor PyTorch nor the standard library."""
    path = frame.f_code.co_filename
    top = (frame.f_globals.get("__name__") or "").split(".")[0]
    return top not in _OWN and "site-packages" not in path and "dist-packages" not in path \
        and not path.startswith(_STDLIB) and not path.startswith("<frozen")


def called_operators(model, args: tuple, kwargs: dict) -> list[str]:
    """Runs the model once eagerly and lists what it calls that a trace cannot see into: the
    autograd.Functions (by qualified name), then the functions through which the model enters an
    installed package that calls compiled code. Watched with a profile function on this thread only."""
    functions: list[str] = []
    entries: dict[str, str] = {}  # entry function -> its package
    compiled: set[str] = set()  # packages seen calling compiled code of their own

    def profile(frame, event, arg):
        if event == "call":
            ctx = frame.f_locals.get("ctx") if frame.f_code.co_name == "forward" else None
            cls = getattr(ctx, "_forward_cls", None)
            if isinstance(cls, type) and issubclass(cls, torch.autograd.Function):
                name = f"{cls.__module__}.{cls.__qualname__}"
                if name not in functions:
                    functions.append(name)
            top = _package(frame)
            if top:
                caller = frame.f_back
                while caller is not None and _package(caller) is None and not _is_model_code(caller):
                    caller = caller.f_back
                if caller is not None and _is_model_code(caller):
                    entries.setdefault(_qualified(frame), top)
        elif event == "c_call":
            top = _package(frame)
            module = getattr(arg, "__module__", None) or ""
            if top and module.split(".")[0] not in _OWN and module not in ("builtins", ""):
                compiled.add(top)
        return None

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    except Exception:  # noqa: BLE001 - what was seen before the failure is still the answer
        pass
    finally:
        sys.setprofile(previous)
    return (functions + [e for e, top in entries.items() if top in compiled and e not in functions])[:6]
