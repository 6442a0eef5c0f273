"""The model.py of a Triton python-backend model, as `opbridge triton --backend python` writes it
(copied unchanged into REPOSITORY/NAME/1/; the package never imports it).

ONNX Runtime runs model.onnx, beside this file, with the op libraries that config.pbtxt names
(parameter op_libraries: file names in the model's folder, ':'-separated) registered. The stub's
Python environment (EXECUTION_ENV_PATH) needs numpy and onnxruntime only: the op libraries are
plain ONNX Runtime custom-op libraries, so neither PyTorch nor opbridge is imported here.
"""

import json
import os
import struct

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

VERSION_DIR = os.path.dirname(os.path.abspath(__file__))
MODEL_DIR = os.path.dirname(VERSION_DIR)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.name = config["name"]
        self.batching = config.get("max_batch_size", 0) > 0
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        options = ort.SessionOptions()
        threads = params.get("intra_op_thread_count", "")  # the ONNX Runtime backend's parameter, same meaning
        if threads:
            if not threads.isdigit():
                raise self._failure(f"intra_op_thread_count must be a whole number, got '{threads}'")
            options.intra_op_num_threads = int(threads)
        libraries = [os.path.join(MODEL_DIR, f) for f in params.get("op_libraries", "").split(":") if f]
        for lib in libraries:
            self._register(options, lib)
        path = os.path.join(VERSION_DIR, "model.onnx")
        try:
            self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - an op no library provides is named in ONNX Runtime's reason
            raise self._failure(f"ONNX Runtime cannot load {path} with {', '.join(libraries) or 'no op library'} "
                                f"registered: {e}") from None
        self.inputs = [(i.name, i.type == "tensor(string)") for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]

    def _register(self, options, lib):
        if not os.path.isfile(lib):
            raise self._failure(f"op library {lib} (op_libraries in config.pbtxt) does not exist")
        short = cut_short(lib)
        if short:  # dlopen would map it anyway, and the stub die of SIGBUS reading past its end
            raise self._failure(f"op library {lib} cannot be loaded: {short}")
        try:
            options.register_custom_ops_library(lib)
        except Exception as e:  # noqa: BLE001 - ONNX Runtime's reason is the message
            raise self._failure(f"ONNX Runtime cannot load op library {lib}: {e}") from None

    def _failure(self, reason):
        """Raised from initialize: Triton reports the model's load as failed with this message."""
        return pb_utils.TritonModelException(f"model '{self.name}': {reason}")

    def execute(self, requests):
        responses = [None] * len(requests)
        groups = {}
        for k, request in enumerate(requests):
            try:
                feed = self._feed(request)
            except ValueError as e:
                responses[k] = self._error(str(e))
                continue
            # Requests merge into one run along axis 0 when their other axes agree.
            key = tuple((n, a.dtype.str, a.shape[1:]) for n, a in feed.items()) if self.batching and feed else k
            groups.setdefault(key, []).append((k, feed))
        for group in groups.values():
            self._run(group, responses)
        return responses

    def finalize(self):
        self.session = None

    def _feed(self, request):
        feed = {}
        for name, is_string in self.inputs:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is None:
                raise ValueError(f"input '{name}' is missing")
            value = tensor.as_numpy()
            if is_string:  # Triton hands BYTES as bytes objects, ONNX Runtime takes str
                value = np.array([v.decode() if isinstance(v, bytes) else v for v in value.ravel()],
                                 dtype=object).reshape(value.shape)
            feed[name] = value
        return feed

    def _run(self, group, responses):
        if len(group) == 1:
            k, feed = group[0]
            try:
                responses[k] = self._response(self.session.run(None, feed))
            except Exception as e:  # noqa: BLE001 - the request's error, for its client
                responses[k] = self._error(f"ONNX Runtime failed: {e}")
            return
        sizes = [next(iter(feed.values())).shape[0] for _, feed in group]
        merged = {name: np.concatenate([feed[name] for _, feed in group]) for name in group[0][1]}
        try:
            outputs = self.session.run(None, merged)
        except Exception:  # noqa: BLE001 - one bad request fails the merged run: each alone, so only it fails
            outputs = None
        if outputs is None or any(o.shape[:1] != (sum(sizes),) for o in outputs):
            for item in group:
                self._run([item], responses)
            return
        ends = np.cumsum(sizes)[:-1]
        for (k, _), parts in zip(group, zip(*(np.split(o, ends) for o in outputs))):
            responses[k] = self._response(parts)

    def _response(self, values):
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(n, np.ascontiguousarray(v)) for n, v in zip(self.outputs, values)])

    def _error(self, reason):
        error = pb_utils.TritonError(f"model '{self.name}': {reason}")
        return pb_utils.InferenceResponse(output_tensors=[], error=error)


def cut_short(path):
    """Why an ELF64 (little-endian) library is incomplete: a loadable segment that ends past the
    end of the file, as a copy cut short leaves it. None otherwise (dlopen judges the rest)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:6] != b"\x7fELF\x02\x01":
            return None
        (table_at,) = struct.unpack_from("<Q", head, 0x20)
        entry, count = struct.unpack_from("<HH", head, 0x36)
        f.seek(table_at)
        table = f.read(entry * count)
    if len(table) < entry * count:
        return f"the file is cut short: its program headers end past its {size} bytes"
    for k in range(count):
        (kind,) = struct.unpack_from("<I", table, k * entry)
        offset, _, _, length = struct.unpack_from("<QQQQ", table, k * entry + 8)
        if kind == 1 and offset + length > size:  # PT_LOAD
            return f"the file is cut short: a loadable segment ends at byte {offset + length}, the file has {size}"
    return None
