"""What an op's test file states (samples, bad inputs, the case) and the helpers every part of
the suite shares: exporting a case, the expected node, comparing with the reference."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..._export.exporter import export
from ..._library.kinds import DTYPES, dtype_of
from ..._library.manifest import OpInfo
from ..._library.registry import find_op
from ..._export.rules import ExportOptions, choose_target, input_dtypes
from ..._export.exporter import default_opset


def _ort_errors() -> tuple:
    from onnxruntime.capi import onnxruntime_pybind11_state as st

    return (st.Fail, st.InvalidArgument, st.InvalidGraph, st.RuntimeException)


ORT_ERRORS = _ort_errors()


@dataclasses.dataclass
class Sample:
    """One call: tensors for the inputs (None: an omitted optional input) and attributes."""

    inputs: tuple
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)
    name: str = ""
    # {input index: [axes]} that the dynamic-axis test marks dynamic and then resizes.
    dynamic: dict[int, list[int]] | None = None
    # Why ONNX Runtime cannot run this sample (e.g. a builtin kernel lacks the dtype); None: it can.
    no_onnxruntime: str | None = None
    # Why finite differences say nothing here (e.g. the op is not differentiable at these values,
    # such as a nearest-neighbour set with exact ties); None: gradcheck runs.
    no_gradcheck: str | None = None


@dataclasses.dataclass
class BadInput:
    """A call PyTorch must reject with a RuntimeError whose message matches `match`."""

    inputs: tuple
    attrs: dict[str, Any]
    match: str
    name: str


@dataclasses.dataclass
class OpCase:
    op: str
    reference: Callable[..., Any]  # numpy inputs (None for omitted), attrs as kwargs -> array(s)
    samples: Sequence[Sample]
    bad_inputs: Sequence[BadInput] = ()
    rtol: float = 1e-5
    atol: float = 1e-6
    # Resizes a sample for the dynamic-axis test: (sample, new size) -> sample.
    resize: Callable[[Sample, int], Sample] | None = None
    # Why OpenVINO cannot run the op's exported models (a dtype its CPU plugin converts, say);
    # None: the OpenVINO test runs every sample ONNX Runtime runs.
    no_openvino: str | None = None

    @property
    def info(self) -> OpInfo:
        return find_op(self.op)


def as_numpy(x):
    return None if x is None else x.detach().cpu().numpy()


def as_list(x) -> list:
    return list(x) if isinstance(x, (tuple, list)) else [x]


class OpModule(torch.nn.Module):
    """Calls one op; what the export tests export."""

    def __init__(self, info: OpInfo, attrs: dict[str, Any], present: list[bool]):
        super().__init__()
        self.overload = info.overload
        self.attrs = attrs
        self.present = present

    def forward(self, *tensors):
        it = iter(tensors)
        args = [next(it) if p else None for p in self.present]
        while args and args[-1] is None:
            args.pop()
        return self.overload(*args, **self.attrs)


def export_case(case: OpCase, sample: Sample, exporter: str, dynamic_axes=None, custom_nodes: bool = False,
                check: Sample | None = None):
    """Exports the op called on the sample; check: the sample at another size, for export's
    second-size proof of dynamic_axes (else it derives one)."""
    info = case.info
    present = [t is not None for t in sample.inputs]
    tensors = tuple(t for t in sample.inputs if t is not None)
    names = [i.name for i, p in zip(info.inputs, present) if p]
    model = OpModule(info, sample.attrs, present).eval()
    check_args = None if check is None else tuple(t for t in check.inputs if t is not None)
    proto = export(model, tensors, exporter=exporter, input_names=names, dynamic_axes=dynamic_axes,
                   custom_nodes=custom_nodes, check_args=check_args)
    return model, tensors, proto


def expected_node(info: OpInfo, exporter: str, inputs: Sequence = (), custom_nodes: bool = False) -> tuple[str, str]:
    """The node the exporter writes for the op called on these inputs (their dtypes choose)."""
    dtypes = [dtype_of(t.dtype).name if isinstance(t, torch.Tensor) else None for t in inputs]
    t = choose_target(info, ExportOptions(default_opset(exporter), custom_nodes), input_dtypes(info, dtypes))
    return t.domain, t.op_type


def reference_outputs(case: OpCase, sample: Sample) -> list[np.ndarray]:
    return [np.asarray(r) for r in as_list(case.reference(*[as_numpy(t) for t in sample.inputs], **sample.attrs))]


def assert_close(got, want, rtol, atol, what="", random: str = ""):
    """Integers and bools exactly, floating point within tolerance; outputs random by
    declaration (`random`, from OpInfo.random_with) by shape and dtype only."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if random:
        assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype} (random by declaration: {random})"
    elif want.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)


def random_tensor(shape: Sequence[int], dtype: str = "float32", seed: int = 0, low: float = -2.0,
                  high: float = 2.0) -> torch.Tensor:
    """Deterministic random test data."""
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(*shape, generator=g, dtype=torch.float64) * (high - low) + low
    return t.to(DTYPES[dtype].torch)


def aliased_variants(sample: Sample) -> list[tuple[str, Sample]]:
    """The sample with its tensor inputs sharing memory, as a user's example inputs may: views of
    one storage (same values), and one tensor object passed for two inputs of the same shape and
    dtype (the second input takes the first's values). Empty when no two inputs share a dtype."""
    present = [(k, t) for k, t in enumerate(sample.inputs) if t is not None and t.numel() > 0]
    out = []
    for dtype in {t.dtype for _, t in present}:
        group = [(k, t) for k, t in present if t.dtype == dtype]
        if len(group) < 2:
            continue
        buf = torch.cat([t.reshape(-1) for _, t in group])
        inputs, off = list(sample.inputs), 0
        for k, t in group:
            inputs[k] = buf[off:off + t.numel()].view(t.shape)
            off += t.numel()
        out.append(("views of one storage", dataclasses.replace(sample, inputs=tuple(inputs))))
        same = next(((a, b) for i, (a, ta) in enumerate(group) for b, tb in group[i + 1:] if ta.shape == tb.shape), None)
        if same is not None:
            inputs = list(sample.inputs)
            inputs[same[1]] = inputs[same[0]]
            out.append(("one tensor for two inputs", dataclasses.replace(sample, inputs=tuple(inputs))))
    return out
