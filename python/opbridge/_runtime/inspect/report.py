"""What inspection finds: the statuses, a verdict per node, uses of an op, the model's report."""

from __future__ import annotations

import dataclasses

import onnx

from .onnx_types import dims, domain_name, elem_type_name, type_string

ORT = "onnxruntime"
ORT_FUNCTION = "onnxruntime (function)"
OPBRIDGE = "opbridge"
MODEL_FUNCTION = "model function"
MISSING = "MISSING"
# In OpenVINO (inspect's runtime="openvino"): read by OpenVINO's own ONNX frontend, or a standard
# node it cannot read that is read as the opbridge op's own node (the op's export rule backwards).
OPENVINO = "openvino"
OWN_NODE = "opbridge (own node)"


@dataclasses.dataclass
class Value:
    name: str
    dtype: str  # "float", "seq(tensor(int64))", "?"
    shape: list[str | int] | None  # None: rank unknown

    def describe(self) -> str:
        shape = "rank unknown" if self.shape is None else "[" + ", ".join(str(d) for d in self.shape) + "]"
        return f"{self.dtype} {shape}"

    @classmethod
    def of(cls, vi: onnx.ValueInfoProto) -> "Value":
        t = vi.type
        if t.WhichOneof("value") == "tensor_type":
            dtype = elem_type_name(t.tensor_type.elem_type) if t.tensor_type.elem_type else "?"
        else:
            dtype = type_string(t) or "?"
        return cls(vi.name, dtype, dims(t))


@dataclasses.dataclass(frozen=True)
class Verdict:
    status: str
    detail: str = ""  # who provides it
    advice: str = ""  # for MISSING: the reason and what to do

    @property
    def missing(self) -> bool:
        return self.status == MISSING


@dataclasses.dataclass
class OpUse:
    """All nodes of one op (domain, type, opset in effect) that got the same verdict."""

    domain: str
    op_type: str
    opset: int | None
    since: int | None  # the version of the op's schema that the opset selects, when known
    verdict: Verdict
    count: int = 0
    where: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "domain": domain_name(self.domain),
            "op_type": self.op_type,
            "opset": self.opset,
            "since_version": self.since,
            "count": self.count,
            "status": self.verdict.status,
            "detail": self.verdict.detail,
            "advice": self.verdict.advice,
            "where": self.where,
        }


@dataclasses.dataclass
class ModelReport:
    path: str
    ir_version: int
    producer: str
    opsets: dict[str, int]
    inputs: list[Value]
    outputs: list[Value]
    initializers: int
    functions: list[dict]
    ops: list[OpUse]
    model_problems: list[Verdict]  # IR version / opset imports the runtime refuses
    notes: list[str]
    runtime: str
    libraries: list[dict]
    node_verdicts: dict[int, Verdict]  # main-graph node index -> verdict
    model: onnx.ModelProto  # after shape inference (when it succeeded)

    @property
    def missing(self) -> list:
        return self.model_problems + [u for u in self.ops if u.verdict.missing]

    @property
    def ok(self) -> bool:
        return not self.missing

    def to_json(self) -> dict:
        return {
            "model": self.path,
            "ir_version": self.ir_version,
            "producer": self.producer,
            "opset_imports": {domain_name(d): v for d, v in self.opsets.items()},
            "inputs": [dataclasses.asdict(v) for v in self.inputs],
            "outputs": [dataclasses.asdict(v) for v in self.outputs],
            "initializers": self.initializers,
            "functions": self.functions,
            "ops": [u.to_json() for u in self.ops],
            "model_problems": [dataclasses.asdict(p) for p in self.model_problems],
            "notes": self.notes,
            "runtime": self.runtime,
            "opbridge_libraries": self.libraries,
            "runnable": self.ok,
        }
