"""OpenVINO sessions that run every loaded op library: the second runtime beside ONNX Runtime.

`opbridge.session(model, runtime="openvino")` reads an ONNX model with OpenVINO's ONNX frontend,
each loaded op library's OpenVINO side (lib<name>_ov.so) added as an extension, and compiles it
for OpenVINO's CPU plugin in float32: the plugin's default on CPUs with bfloat16 arithmetic (AMX,
AVX-512 BF16) is to run float32 models in bfloat16, which would not compute what PyTorch computes.
The session answers ONNX Runtime's calls: run(output_names, feeds), get_inputs(), get_outputs().
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import onnx
import onnx.inliner

from .._library.errors import OpbridgeError
from .._library.files import build_info
from .._library.registry import libraries as loaded_libraries
from .own_nodes import with_own_nodes

OPENVINO = "openvino==2026.4.1"  # the release the OpenVINO side is built and tested with


@dataclasses.dataclass(frozen=True)
class NodeArg:
    """A model input or output as ONNX Runtime's NodeArg describes it."""

    name: str
    shape: list  # an int, or the dimension's name, or None, per axis
    type: str  # "tensor(float)", ...


# What OpenVINO's CPU plugin computes these element types in (it lowers a model's precisions when
# it compiles it, an opbridge node's inputs and outputs included): a model fed them matches PyTorch
# only to that type's precision. int64 is carried as int32 too, which is exact for values that fit
# (the adapter widens it back for ops that take int64 only, and refuses a value past int32).
COMPUTED_AS = {"float64": "float32", "float16": "float32", "bfloat16": "float32"}


def _node_args(values) -> list[NodeArg]:
    out = []
    for v in values:
        t = v.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
        name = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name if t.elem_type else "undefined"
        out.append(NodeArg(v.name, shape, f"tensor({'float' if name == 'float32' else name.replace('float64', 'double')})"))
    return out


def _openvino():
    try:
        import openvino
    except ImportError as e:
        raise OpbridgeError(f"runtime='openvino' needs OpenVINO: pip install {OPENVINO}") from e
    # The OpenVINO side links the versioned libopenvino.so it was built against: another version
    # would fail in the loader with a message that names neither opbridge nor the fix.
    built, found = build_info().get("openvino"), importlib.metadata.version("openvino")
    if built and found != built:
        raise OpbridgeError(f"runtime='openvino': opbridge's OpenVINO side was built against openvino {built}, "
                            f"and openvino {found} is installed: pip install openvino=={built}")
    return openvino


def extension_paths(extra: Sequence[str | os.PathLike] = (), domains: set[str] | None = None) -> list[Path]:
    """The OpenVINO side of every loaded op library that has one, then `extra` (lib<name>_ov.so
    files). A library without one (built without OpenVINO, or by load_inline) whose domain the
    model uses (`domains`; None: any) is an error naming it."""
    lacking = [lib.name for lib in loaded_libraries()
               if lib.openvino_path is None and (domains is None or lib.domains & domains)]
    if lacking:
        raise OpbridgeError(f"op librar{'ies' if len(lacking) > 1 else 'y'} {', '.join(lacking)} "
                            "ha{} no OpenVINO side (lib<name>_ov.so), and the model uses {}: it is built where "
                            "OpenVINO's CMake package is found (pip install {}, then rebuild it)".format("ve" if len(lacking) > 1 else "s",
                                                    "their ops" if len(lacking) > 1 else "its ops", OPENVINO))
    paths = [lib.openvino_path for lib in loaded_libraries() if lib.openvino_path is not None]
    for given in extra:
        path = Path(given).resolve()
        if not path.is_file():
            raise OpbridgeError(f"libraries: OpenVINO extension library not found: {path}")
        paths.append(path)
    return paths


def _domains(proto: onnx.ModelProto) -> set[str]:
    """Every node domain of the model, its functions' included."""
    nodes = [*proto.graph.node, *(n for f in proto.functions for n in f.node)]
    return {n.domain or "ai.onnx" for n in nodes}


def _read(core, model, proto: onnx.ModelProto):
    """OpenVINO's model of `model` (a path, bytes, or None: `proto`'s). Its ONNX frontend reads
    files, and does not expand a model's own functions: those are inlined first."""
    inline = bool(proto.functions)
    if isinstance(model, (str, os.PathLike)) and not inline:
        return core.read_model(os.fspath(model))
    if inline:
        if isinstance(model, (str, os.PathLike)):
            proto = onnx.load(os.fspath(model))  # with its external data
        proto = onnx.inliner.inline_local_functions(proto)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        path.write_bytes(model if isinstance(model, bytes) and not inline else proto.SerializeToString())
        return core.read_model(str(path))


class OpenVINOSession:
    """An ONNX model compiled by OpenVINO for the CPU, with opbridge's ops; called as an ONNX
    Runtime InferenceSession is. One inference at a time (calls from several threads queue)."""

    def __init__(self, model: str | os.PathLike | bytes | onnx.ModelProto, *, threads: int | None = None,
                 libraries: Sequence[str | os.PathLike] = ()):
        ov = _openvino()
        core = ov.Core()
        proto = model if isinstance(model, onnx.ModelProto) else \
            onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(os.fspath(model), load_external_data=False)
        for path in extension_paths(libraries, _domains(proto)):
            core.add_extension(str(path))
        self._inputs = _node_args(proto.graph.input)
        self._outputs = _node_args(proto.graph.output)
        try:
            try:
                read = _read(core, model, proto)
            except RuntimeError as e:
                # Standard ops OpenVINO cannot read, which an op's export rule writes: as its own node.
                lacking = set(re.findall(r"(\w+)-\d+", str(e).split("No conversion rule found for operations:")[-1])) \
                    if "No conversion rule found" in str(e) else set()
                if not lacking:
                    raise
                full = onnx.load(os.fspath(model)) if isinstance(model, (str, os.PathLike)) else proto
                read = _read(core, None, with_own_nodes(full, lacking))
            config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32"}
            if threads:
                config["INFERENCE_NUM_THREADS"] = int(threads)
            self._compiled = core.compile_model(read, "CPU", config)
        except RuntimeError as e:
            raise OpbridgeError(f"OpenVINO cannot read or compile the model: {e}") from e
        self._request = self._compiled.create_infer_request()
        # OpenVINO drops an input the outputs do not depend on (a size folded to a constant): a
        # feed for it is not an error, as in ONNX Runtime.
        self._fed = {name for port in self._compiled.inputs for name in port.get_names()}
        self._lock = threading.Lock()
        self._ports = {}
        for port in self._compiled.outputs:
            for name in port.get_names():
                self._ports[name] = port

    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def run(self, output_names: Sequence[str] | None, input_feed: dict[str, np.ndarray], run_options=None) -> list:
        names = list(output_names) if output_names else [o.name for o in self._outputs]
        unknown = [n for n in names if n not in self._ports]
        if unknown:
            raise OpbridgeError(f"run: no output named {', '.join(unknown)} (outputs: "
                                f"{', '.join(o.name for o in self._outputs)})")
        with self._lock:
            try:
                self._request.infer({k: np.ascontiguousarray(v) for k, v in input_feed.items() if k in self._fed})
            except RuntimeError as e:
                raise OpbridgeError(f"OpenVINO: {e}") from e
            # Copies: the request's tensors are overwritten by its next inference.
            return [np.array(self._request.get_tensor(self._ports[n]).data, copy=True) for n in names]
