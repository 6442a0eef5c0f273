"""What an ONNX model needs at run time, and who provides it.

Every node (main graph, control-flow subgraphs, model-local functions) gets a status:
  onnxruntime             a CPU kernel of the installed ONNX Runtime (its own kernel registry,
                          honouring the node's opset and, where known, its tensor types)
  onnxruntime (function)  an ONNX op without a kernel that ONNX Runtime expands into its ONNX
                          function body (whose ops are checked the same way)
  opbridge                a custom op of a loaded opbridge library (its *_ort.so)
  model function          a function defined in the model itself (its body is inspected too)
  MISSING                 nothing runs it; the verdict says what to do
The installed runtime is asked rather than a hand-kept list: kernels and schemas come from
onnxruntime's registry, and the IR version and opset imports are tried on ONNX Runtime itself.

Layers, each importing only those above it: onnx_types (ONNX spellings), report (statuses and
results), runtime (probing the installed ONNX Runtime), opbridge_nodes (what an op's shape rules
and checks say about its nodes), checker (one node), ov_frontend (for OpenVINO: its ONNX
frontend asked instead), analysis (the model, for either runtime).
"""

from .analysis import analyze, cannot_run, infer
from .checker import Checker
from .onnx_types import (dims, domain_name, elem_type_name, graph_types, short_type, subgraphs, type_string,
                         value_infos)
from .report import MISSING, MODEL_FUNCTION, OPBRIDGE, ORT, ORT_FUNCTION, ModelReport, OpUse, Value, Verdict
from .runtime import clean_ort_message

__all__ = [
    "MISSING",
    "MODEL_FUNCTION",
    "OPBRIDGE",
    "ORT",
    "ORT_FUNCTION",
    "Checker",
    "ModelReport",
    "OpUse",
    "Value",
    "Verdict",
    "analyze",
    "cannot_run",
    "clean_ort_message",
    "dims",
    "domain_name",
    "elem_type_name",
    "graph_types",
    "infer",
    "short_type",
    "subgraphs",
    "type_string",
    "value_infos",
]
