"""ONNX Runtime sessions that can run every loaded op library."""

from __future__ import annotations

import os
import weakref

import onnx
import onnxruntime as ort

from ._registry import libraries

# Which op libraries each SessionOptions already has: ONNX Runtime refuses a second
# registration of the same domain, and options objects get reused.
_registered: "weakref.WeakKeyDictionary[ort.SessionOptions, set]" = weakref.WeakKeyDictionary()


def _register_libraries(so: ort.SessionOptions) -> ort.SessionOptions:
    done = _registered.setdefault(so, set())
    for lib in libraries():
        if lib.ort_path is not None and lib.ort_path not in done:
            so.register_custom_ops_library(str(lib.ort_path))
            done.add(lib.ort_path)
    return so


def session_options(threads: int | None = None) -> ort.SessionOptions:
    """SessionOptions with every loaded op library registered."""
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    return _register_libraries(so)


def session(
    model: str | os.PathLike | bytes | onnx.ModelProto,
    *,
    threads: int | None = None,
    options: ort.SessionOptions | None = None,
) -> ort.InferenceSession:
    """An ONNX Runtime CPU session that can run every opbridge op."""
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    elif not isinstance(model, bytes):
        model = os.fspath(model)
    so = _register_libraries(options) if options is not None else session_options(threads)
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
