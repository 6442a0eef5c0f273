"""A test harness for opbridge ops, for pytest. An op's test file states what only it knows —
its numpy reference, sample inputs and op-specific bad inputs — and gets the whole standard
suite, derived from the op's spec:

    eager vs reference (contiguous and not), torch.library.opcheck, export with both exporters
    (+ full ONNX checker), ONNX Runtime vs eager, the ONNX reference evaluator running the
    numpy reference on the exported graph, a dynamic batch axis, and bad-input tables for
    PyTorch (RuntimeError) and ONNX Runtime (hand-made nodes: wrong dtype, input count,
    missing / wrong-typed attributes), each followed by a good run to show the process survived.

    from opbridge.testing import OpCase, Sample, op_test_suite
    Test<Op> = op_test_suite(OpCase("<op>", reference=<numpy function>, samples=[Sample(...), ...]))
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Sequence

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from ._export import EXPORTERS, default_opset, export
from ._kinds import ATTR_KINDS, DTYPES, dtype_of
from ._manifest import OpInfo
from ._registry import find_op
from ._rules import ExportOptions, choose_target
from ._session import session
from ._verify import verify


def _ort_errors() -> tuple:
    from onnxruntime.capi import onnxruntime_pybind11_state as st

    return (st.Fail, st.InvalidArgument, st.InvalidGraph, st.RuntimeException)


_ORT_ERRORS = _ort_errors()


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

    @property
    def info(self) -> OpInfo:
        return find_op(self.op)


def _np(x):
    return None if x is None else x.detach().cpu().numpy()


def _as_list(x) -> list:
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


def _export_case(case: OpCase, sample: Sample, exporter: str, dynamic_axes=None, custom_nodes: bool = False):
    info = case.info
    present = [t is not None for t in sample.inputs]
    tensors = tuple(t for t in sample.inputs if t is not None)
    names = [i.name for i, p in zip(info.inputs, present) if p]
    model = OpModule(info, sample.attrs, present).eval()
    proto = export(model, tensors, exporter=exporter, input_names=names, dynamic_axes=dynamic_axes,
                   custom_nodes=custom_nodes)
    return model, tensors, proto


def _expected_node(info: OpInfo, exporter: str, custom_nodes: bool = False) -> tuple[str, str]:
    t = choose_target(info, ExportOptions(default_opset(exporter), custom_nodes))
    return t.domain, t.op_type


def _reference_outputs(case: OpCase, sample: Sample) -> list[np.ndarray]:
    return [np.asarray(r) for r in _as_list(case.reference(*[_np(t) for t in sample.inputs], **sample.attrs))]


def _assert_close(got, want, rtol, atol, what=""):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if want.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)


def node_model(info: OpInfo, inputs: Sequence[np.ndarray | None], attrs: dict[str, Any], *,
               n_inputs: int | None = None, raw_attrs: list[onnx.AttributeProto] | None = None,
               opset: int = 18) -> onnx.ModelProto:
    """A one-node ONNX model of the op, built by hand (not by an exporter). `raw_attrs`
    replaces the attributes entirely, for bad-attribute tests."""
    names, graph_inputs = [], []
    for spec, x in zip(info.inputs, inputs):
        if x is None:
            names.append("")
            continue
        names.append(spec.name)
        graph_inputs.append(helper.make_tensor_value_info(spec.name, dtype_of(x.dtype).onnx, list(x.shape)))
    while names and names[-1] == "":
        names.pop()
    if n_inputs is not None:
        names = names[:n_inputs]
        graph_inputs = [g for g in graph_inputs if g.name in names]
    node = helper.make_node(info.onnx_type, names, [o.name for o in info.outputs], domain=info.onnx_domain,
                            name=f"{info.name}_node")
    if raw_attrs is not None:
        node.attribute.extend(raw_attrs)
    else:
        node.attribute.extend(_node_attributes(info, attrs))
    # Output element types follow the spec: a fixed dtype, or the dtype of an input that shares
    # the type constraint. Shapes are left to shape inference.
    elem = {}
    for spec, x in zip(info.inputs, inputs):
        if x is not None:
            elem.setdefault(spec.type, dtype_of(x.dtype).onnx)
    try:  # output shapes from the op's own Meta kernel, when the inputs are valid
        metas = [None if x is None else torch.empty(x.shape, dtype=dtype_of(x.dtype).torch, device="meta")
                 for x in inputs]
        while metas and metas[-1] is None:
            metas.pop()
        shapes = [list(r.shape) for r in _as_list(info.overload(*metas, **attrs))]
    except Exception:  # invalid inputs, or sizes that depend on input values: left unknown
        shapes = [[] if o.fake_dims is None else [None] * len(o.fake_dims) for o in info.outputs]
    outputs = []
    for o, shape in zip(info.outputs, shapes):
        fixed = info.type_constraint(o.type).dtypes
        t = elem.get(o.type, DTYPES[fixed[0]].onnx if len(fixed) == 1 else TensorProto.UNDEFINED)
        outputs.append(helper.make_tensor_value_info(o.name, t, shape))
    graph = helper.make_graph([node], f"{info.name}_graph", graph_inputs, outputs)
    imports = [helper.make_opsetid("", opset)]
    if info.onnx_domain:
        imports.append(helper.make_opsetid(info.onnx_domain, info.since_version))
    # IR version 10 (ONNX 1.16): new enough for every feature used, old enough for any
    # ONNX Runtime that can load the op library.
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def _node_attributes(info: OpInfo, attrs: dict[str, Any], without: str | None = None) -> list[onnx.AttributeProto]:
    return [ATTR_KINDS[info.attribute(k).kind].attribute_proto(k, v) for k, v in attrs.items() if k != without]


def _feeds(model: onnx.ModelProto, inputs) -> dict[str, np.ndarray]:
    by_name = {g.name for g in model.graph.input}
    return {n: x for n, x in inputs if n in by_name}


def _reference_op_class(case: OpCase):
    """The case's numpy reference as an onnx.reference op, so the reference evaluator can run
    the exported graph: a second, independent oracle for the custom node."""
    from onnx.reference.op_run import OpRun

    info = case.info
    attr_names = [a.name for a in info.attributes]

    def _run(self, *inputs, **attrs):
        inputs = list(inputs) + [None] * (len(info.inputs) - len(inputs))
        kw = {k: getattr(self, k) for k in attr_names if getattr(self, k, None) is not None}
        return tuple(np.asarray(r) for r in _as_list(case.reference(*inputs, **kw)))

    cls = type(info.onnx_type, (OpRun,), {"op_domain": info.onnx_domain, "_run": _run})
    return cls


def op_test_suite(case: OpCase) -> type:
    """A pytest test class running the standard suite on `case`."""
    samples = list(case.samples)
    ids = [s.name or f"sample{i}" for i, s in enumerate(samples)]
    bad_ids = [b.name for b in case.bad_inputs]

    def info() -> OpInfo:
        return case.info

    class Suite:
        @pytest.mark.parametrize("sample", samples, ids=ids)
        def test_eager_matches_reference(self, sample):
            got = _as_list(info().overload(*sample.inputs, **sample.attrs))
            for k, (g, w) in enumerate(zip(got, _reference_outputs(case, sample))):
                _assert_close(_np(g), w, case.rtol, case.atol, f"output {k}")

        @pytest.mark.parametrize("sample", samples, ids=ids)
        def test_eager_non_contiguous(self, sample):
            def strided(t):
                if t is None or t.dim() == 0:
                    return t
                # Same values, every other element of a doubled last axis: not contiguous.
                wide = torch.zeros(*t.shape[:-1], t.shape[-1] * 2, dtype=t.dtype)
                wide[..., ::2] = t
                v = wide[..., ::2]
                assert not v.is_contiguous() or t.numel() <= 1
                return v

            s = Sample(tuple(strided(t) for t in sample.inputs), sample.attrs)
            got = _as_list(info().overload(*s.inputs, **s.attrs))
            for k, (g, w) in enumerate(zip(got, _reference_outputs(case, sample))):
                _assert_close(_np(g), w, case.rtol, case.atol, f"output {k}")

        @pytest.mark.parametrize("sample", samples, ids=ids)
        def test_opcheck(self, sample):
            if not info().defines_torch_op:
                pytest.skip(f"{info().qualified_name} is PyTorch's own op")
            torch.library.opcheck(info().overload, sample.inputs, sample.attrs)

        @pytest.mark.parametrize("exporter", EXPORTERS)
        @pytest.mark.parametrize("sample", samples, ids=ids)
        def test_export_runs_in_onnxruntime(self, sample, exporter):
            model, tensors, proto = _export_case(case, sample, exporter)
            if sample.no_onnxruntime:
                pytest.skip(sample.no_onnxruntime)  # exported and checked above
            types = {(n.domain, n.op_type) for n in proto.graph.node}
            assert _expected_node(info(), exporter) in types, f"exported graph has {types}"
            report = verify(model, tensors, proto, rtol=case.rtol, atol=case.atol)
            assert report.ok, "\n" + report.table()

        @pytest.mark.parametrize("exporter", EXPORTERS)
        def test_export_custom_nodes_on_request(self, exporter):
            # An op with its own kernel and a rule to a standard op: custom_nodes=True keeps the
            # opbridge node (for runtimes without the standard op), at any opset.
            if info().export_kind != "kernel" or not any(r.standard for r in info().export_rules):
                pytest.skip("no standard-op rule to pass over")
            sample = next((s for s in samples if not s.no_onnxruntime), samples[0])
            model, tensors, proto = _export_case(case, sample, exporter, custom_nodes=True)
            types = {(n.domain, n.op_type) for n in proto.graph.node}
            assert (info().onnx_domain, info().onnx_type) in types, f"exported graph has {types}"
            assert not any(r.op_type == t for r in info().export_rules for _, t in types)
            report = verify(model, tensors, proto, rtol=case.rtol, atol=case.atol)
            assert report.ok, "\n" + report.table()

        @pytest.mark.parametrize("exporter", EXPORTERS)
        def test_reference_evaluator_agrees(self, exporter):
            from onnx.reference import ReferenceEvaluator

            sample = samples[0]
            _, tensors, proto = _export_case(case, sample, exporter)
            own = (info().onnx_domain, info().onnx_type) == _expected_node(info(), exporter)
            new_ops = [_reference_op_class(case)] if own and info().export_kind == "kernel" else []
            ref = ReferenceEvaluator(proto, new_ops=new_ops)
            feeds = {i.name: _np(t) for i, t in zip(proto.graph.input, tensors)}
            got = ref.run(None, feeds)
            ort_out = session(proto).run(None, feeds)
            for k, (g, o) in enumerate(zip(got, ort_out)):
                _assert_close(o, g, case.rtol, case.atol, f"ORT vs reference evaluator, output {k}")

        @pytest.mark.parametrize("exporter", EXPORTERS)
        def test_dynamic_axis(self, exporter):
            sample = next((s for s in samples if s.dynamic), None)
            if sample is None or case.resize is None:
                pytest.skip("no dynamic sample")
            present = [t is not None for t in sample.inputs]
            names = [i.name for i, p in zip(info().inputs, present) if p]
            dyn = {info().inputs[i].name: {ax: f"d{ax}" for ax in axes} for i, axes in sample.dynamic.items()}
            model, _, proto = _export_case(case, sample, exporter, dynamic_axes=dyn)
            for g in proto.graph.input:
                if g.name in dyn:
                    for ax in dyn[g.name]:
                        d = g.type.tensor_type.shape.dim[ax]
                        assert d.dim_param and not d.HasField("dim_value"), f"{g.name} axis {ax} is static: {d}"
            sess = session(proto)
            for n in (1, 5, 9):
                s = case.resize(sample, n)
                tensors = tuple(t for t in s.inputs if t is not None)
                report = verify(model, tensors, proto, rtol=case.rtol, atol=case.atol, sess=sess)
                assert report.ok, f"size {n}\n" + report.table()
            assert names

        @pytest.mark.parametrize("bad", list(case.bad_inputs), ids=bad_ids)
        def test_torch_rejects_bad_input(self, bad):
            with pytest.raises(RuntimeError, match=re.escape(info().qualified_name) + r": .*" + bad.match):
                info().overload(*bad.inputs, **bad.attrs)
            self.test_eager_matches_reference(samples[0])  # still alive and computing

        def _every_attribute_rejects_other_kinds(self, op, sample, arrays, attrs):
            feeds_of = lambda m: _feeds(m, [(i.name, x) for i, x in zip(op.inputs, arrays) if x is not None])
            for a in op.attributes:
                for wrong in ATTR_KINDS[a.kind].other_kind_values:
                    raw = _node_attributes(op, attrs, without=a.name)
                    raw.append(helper.make_attribute(a.name, wrong))
                    model = node_model(op, arrays, attrs, raw_attrs=raw)
                    match = re.escape(op.qualified_name) + rf".*attribute '{a.name}' must be {re.escape(a.kind)}, got"
                    with pytest.raises(_ORT_ERRORS, match=match):
                        session(model).run(None, feeds_of(model))
            self._still_runs(op, sample, attrs)

        def _still_runs(self, op, sample, attrs):
            # The process survived: the well-formed node still runs and matches the reference.
            good_arrays = [_np(t) for t in sample.inputs]
            good = node_model(op, good_arrays, attrs)
            onnx.checker.check_model(good, full_check=True)  # the generated ONNX schema accepts it
            out = session(good).run(None, _feeds(good, [(i.name, x) for i, x in zip(op.inputs, good_arrays)
                                                         if x is not None]))
            for k, (g, w) in enumerate(zip(out, _reference_outputs(case, sample))):
                _assert_close(g, w, case.rtol, case.atol, f"output {k}")

        @pytest.mark.parametrize("kind", ["wrong_dtype", "missing_input", "missing_attribute", "wrong_attribute_type"])
        def test_onnxruntime_rejects_bad_node(self, kind):
            op = info()
            if op.export_kind != "kernel":
                pytest.skip("runs as a builtin ONNX Runtime op")
            sample = samples[0]
            arrays = [_np(t) for t in sample.inputs]
            arrays += [None] * (len(op.inputs) - len(arrays))
            attrs = dict(sample.attrs)
            n_inputs, raw, match = None, None, None
            if kind == "wrong_dtype":
                allowed = set(op.type_constraint(op.inputs[0].type).dtypes)
                bad = next((d for d in ("int64", "int32", "uint8", "float64") if d not in allowed), None)
                if bad is None:
                    pytest.skip("the first input takes every dtype tried")
                arrays[0] = arrays[0].astype(bad)
                match = rf"Type Error: Type '{re.escape(DTYPES[bad].onnx_type)}' of input parameter \({op.inputs[0].name}\)"
            elif kind == "missing_input":
                n_required = sum(not i.optional for i in op.inputs)
                n_inputs = n_required - 1
                match = rf"has input size {n_inputs} not in range"
            elif kind == "missing_attribute":
                required = [a for a in op.attributes if a.required]
                if not required:
                    pytest.skip("every attribute has a default")
                raw = _node_attributes(op, attrs, without=required[0].name)
                match = re.escape(op.qualified_name) + r".*required attribute '" + required[0].name + "'"
            else:
                if not op.attributes:
                    pytest.skip("no attributes")
                return self._every_attribute_rejects_other_kinds(op, sample, arrays, attrs)
            model = node_model(op, arrays, attrs, n_inputs=n_inputs, raw_attrs=raw)
            feeds = _feeds(model, [(i.name, x) for i, x in zip(op.inputs, arrays) if x is not None])
            with pytest.raises(_ORT_ERRORS, match=match):
                session(model).run(None, feeds)
            self._still_runs(op, sample, attrs)

    Suite.__name__ = Suite.__qualname__ = f"Test_{case.op}"
    return Suite


def random_tensor(shape: Sequence[int], dtype: str = "float32", seed: int = 0, low: float = -2.0,
                  high: float = 2.0) -> torch.Tensor:
    """Deterministic random test data."""
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(*shape, generator=g, dtype=torch.float64) * (high - low) + low
    return t.to(DTYPES[dtype].torch)
