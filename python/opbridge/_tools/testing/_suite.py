"""The standard per-op test suite, derived from the op's definition: a base class whose tests an
op's test class gets by naming its case (see opbridge.testing)."""

from __future__ import annotations

import concurrent.futures
import re

import onnx
import pytest
import torch
from onnx import helper

from ..._export.exporter import EXPORTERS
from ..._library.kinds import ATTR_KINDS, DTYPES
from ..._library.manifest import OpInfo
from ..._runtime.openvino import COMPUTED_AS
from ..._runtime.session import session
from ..._runtime.verify import verify
from ._cases import (
    ORT_ERRORS,
    OpCase,
    Sample,
    aliased_variants,
    as_list,
    as_numpy,
    assert_close,
    expected_node,
    export_case,
    reference_outputs,
)
from ._nodes import feeds, mixed_pair, node_attributes, node_model, reference_op_class


class OpTest:
    """The standard suite for the op of `case`: eager against the reference (contiguous and not),
    opcheck (with autograd where the op has a gradient), gradcheck, export with both exporters and
    ONNX Runtime against eager, custom nodes on request, aliased examples, one session from eight
    threads, the reference evaluator, a dynamic axis, and the bad-input tables of PyTorch and ONNX
    Runtime. Tests taking `sample`, `exporter` or `bad` run once per sample, exporter or bad
    input."""

    case: OpCase

    def pytest_generate_tests(self, metafunc):
        samples = list(self.case.samples)
        if "sample" in metafunc.fixturenames:
            metafunc.parametrize("sample", samples, ids=[s.name or f"sample{i}" for i, s in enumerate(samples)])
        if "exporter" in metafunc.fixturenames:
            metafunc.parametrize("exporter", EXPORTERS)
        if "bad" in metafunc.fixturenames:
            metafunc.parametrize("bad", list(self.case.bad_inputs), ids=[b.name for b in self.case.bad_inputs])

    @property
    def info(self) -> OpInfo:
        return self.case.info

    def _exported(self, sample, exporter: str):
        """export_case(case, sample, exporter) with the defaults, once per test class (pytest makes
        an instance per test): the tests that take the exported model without changing how it is
        exported (threads, the reference evaluator) reuse the one test_export_runs_in_onnxruntime
        checked."""
        cache = type(self).__dict__.get("_export_cache")
        if cache is None:
            cache = {}
            setattr(type(self), "_export_cache", cache)
        key = (id(sample), exporter)
        if key not in cache:
            cache[key] = (sample, export_case(self.case, sample, exporter))
        return cache[key][1]

    def _random(self, sample) -> str:
        """Why the sample's outputs are random (the op's random_when attribute is true, from the
        manifest); "" when they are not. Such outputs are held to their shapes and dtypes."""
        return self.info.random_with(sample.attrs)

    def test_eager_matches_reference(self, sample):
        got = as_list(self.info.overload(*sample.inputs, **sample.attrs))
        for k, (g, w) in enumerate(zip(got, reference_outputs(self.case, sample))):
            assert_close(as_numpy(g), w, self.case.rtol, self.case.atol, f"output {k}", self._random(sample))

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
        got = as_list(self.info.overload(*s.inputs, **s.attrs))
        for k, (g, w) in enumerate(zip(got, reference_outputs(self.case, sample))):
            assert_close(as_numpy(g), w, self.case.rtol, self.case.atol, f"output {k}", self._random(sample))

    def test_opcheck(self, sample):
        if not self.info.defines_torch_op:
            pytest.skip(f"{self.info.qualified_name} is PyTorch's own op")
        torch.library.opcheck(self.info.overload, sample.inputs, sample.attrs, test_utils=self._opcheck_utils(sample))

    def _opcheck_utils(self, sample, aot: bool = True) -> list[str]:
        # opcheck's AOT check compares compiled outputs with eager values: random ones differ.
        return [u for u in torch.library._OPCHECK_DEFAULT_UTILS
                if not (u == "test_aot_dispatch_dynamic" and (not aot or self._random(sample)))]

    def _differentiable(self) -> set[str]:
        """The inputs the backward op gives a gradient for (its outputs are grad_<input>)."""
        return {o.name[len("grad_"):] for o in self.info.library.op(self.info.backward).outputs}

    def test_opcheck_autograd(self, sample):
        # opcheck with the differentiable inputs requiring grad: its autograd checks (the
        # registration, and AOT autograd tracing forward and backward with symbolic shapes)
        # run only then.
        if not self.info.backward:
            pytest.skip(f"{self.info.qualified_name} declares no gradient")
        differentiable = self._differentiable()
        inputs = [t.detach().clone().requires_grad_() if isinstance(t, torch.Tensor) and t.is_floating_point()
                  and spec.name in differentiable else t for t, spec in zip(sample.inputs, self.info.inputs)]
        inputs += list(sample.inputs[len(inputs):])
        if not any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs):
            pytest.skip("no floating-point input to differentiate")
        outs = as_list(self.info.overload(*sample.inputs, **sample.attrs))
        # opcheck's AOT check sums every output into one accumulator that starts as the
        # first: an integer first output (e.g. neighbour indices) cannot take a float one. Such ops
        # get the same check here: compiled with AOT autograd and dynamic shapes, the
        # gradients of their floating outputs equal eager's.
        aot_by_hand = not outs[0].is_floating_point() and any(o.is_floating_point() for o in outs)
        utils = self._opcheck_utils(sample, aot=not aot_by_hand)
        torch.library.opcheck(self.info.overload, tuple(inputs), sample.attrs, test_utils=utils)
        if aot_by_hand and not self._random(sample):
            def loss(*ts):
                return sum(o.sum() for o in as_list(self.info.overload(*ts, **sample.attrs)) if o.is_floating_point())

            diff = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
            want = torch.autograd.grad(loss(*inputs), diff, allow_unused=True)
            torch._dynamo.reset()  # every sample compiles the same code object afresh
            compiled = torch.compile(loss, backend="aot_eager", dynamic=True, fullgraph=True)
            got = torch.autograd.grad(compiled(*inputs), diff, allow_unused=True)
            for g, w in zip(got, want):
                assert (g is None) == (w is None)
                if w is not None:
                    torch.testing.assert_close(g, w)

    def test_gradcheck(self, sample):
        # The backward op against finite differences of the forward, in float64; opcheck
        # (above) checks the autograd registration itself.
        if not self.info.backward:
            pytest.skip(f"{self.info.qualified_name} declares no gradient")
        if sample.no_gradcheck:
            pytest.skip(sample.no_gradcheck)
        if self._random(sample):
            pytest.skip(f"random by declaration: {self._random(sample)}; finite differences need equal calls")
        # Inputs that can be float64 are; those the backward op differentiates get gradients
        # (others, e.g. float32 scales or RoI boxes without a gradient, stay fixed).
        differentiable = self._differentiable()
        doubles = ["float64" in self.info.type_constraint(s.type).dtypes for s in self.info.inputs]
        inputs = [(t.detach().double().requires_grad_() if s.name in differentiable else t.detach().double())
                  if isinstance(t, torch.Tensor) and t.is_floating_point() and d else t
                  for t, d, s in zip(sample.inputs, doubles, self.info.inputs)] + list(sample.inputs[len(doubles):])
        if not any(isinstance(t, torch.Tensor) and t.requires_grad and t.numel() for t in inputs):
            pytest.skip("no non-empty floating-point input")
        def finite_outputs(*ts):
            # The differentiable outputs; infinite values (e.g. padding distances) have no
            # finite differences, and their gradient is 0 either way.
            outs = as_list(self.info.overload(*ts, **sample.attrs))
            return tuple(torch.where(torch.isfinite(o), o, 0) for o in outs if o.is_floating_point())

        assert torch.autograd.gradcheck(finite_outputs, tuple(inputs))

    def test_export_runs_in_onnxruntime(self, sample, exporter):
        model, tensors, proto = self._exported(sample, exporter)
        if sample.no_onnxruntime:
            pytest.skip(sample.no_onnxruntime)  # exported and checked above
        types = {(n.domain, n.op_type) for n in proto.graph.node}
        assert expected_node(self.info, exporter, sample.inputs) in types, f"exported graph has {types}"
        report = verify(model, tensors, proto, rtol=self.case.rtol, atol=self.case.atol)
        assert report.ok, "\n" + report.table()
        # verify finds the random node in the graph by the same manifest rule.
        assert [o.random for o in report.outputs] == [self._random(sample)] * len(report.outputs), report.table()

    def test_export_runs_in_openvino(self, sample, exporter):
        # The same exported model in the second runtime, through the library's OpenVINO side.
        model, tensors, proto = self._exported(sample, exporter)
        why = sample.no_onnxruntime or self.case.no_openvino or \
            (self.info.library.openvino_path is None and f"library {self.info.library.name} has no OpenVINO side")
        lowered = sorted({str(t.dtype).removeprefix("torch.") for t in tensors} & set(COMPUTED_AS))
        if lowered:
            why = f"OpenVINO's CPU plugin computes {', '.join(lowered)} in {COMPUTED_AS[lowered[0]]}"
        if why:
            pytest.skip(why)
        report = verify(model, tensors, proto, rtol=self.case.rtol, atol=self.case.atol, runtime="openvino")
        assert report.ok, "\n" + report.table()

    def test_export_custom_nodes_on_request(self, exporter):
        # An op with its own kernel and a rule to a standard op: custom_nodes=True keeps the
        # opbridge node (for runtimes without the standard op), at any opset.
        if self.info.export_kind != "kernel" or not any(r.standard for r in self.info.export_rules):
            pytest.skip("no standard-op rule to pass over")
        sample = next((s for s in self.case.samples if not s.no_onnxruntime), self.case.samples[0])
        model, tensors, proto = export_case(self.case, sample, exporter, custom_nodes=True)
        types = {(n.domain, n.op_type) for n in proto.graph.node}
        assert (self.info.onnx_domain, self.info.onnx_type) in types, f"exported graph has {types}"
        assert not any(r.standard and ("", r.op_type) in types for r in self.info.export_rules)
        report = verify(model, tensors, proto, rtol=self.case.rtol, atol=self.case.atol)
        assert report.ok, "\n" + report.table()

    def test_export_with_aliased_examples(self, exporter):
        # Examples sharing memory still export one graph input per argument, wired as called:
        # the model is checked on distinct inputs with different values.
        sample = next((s for s in self.case.samples if not s.no_onnxruntime and aliased_variants(s)), None)
        if sample is None:
            pytest.skip("no sample with two tensor inputs of one dtype")
        for what, aliased in aliased_variants(sample):
            try:
                self.info.overload(*aliased.inputs, **aliased.attrs)
            except RuntimeError:
                continue  # the op refuses these values (e.g. equal bounds): nothing to export
            model, _, proto = export_case(self.case, aliased, exporter)
            tensors = tuple(t for t in sample.inputs if t is not None)
            report = verify(model, tensors, proto, rtol=self.case.rtol, atol=self.case.atol)
            assert report.ok, f"{what}\n" + report.table()

    def test_one_session_from_eight_threads(self):
        # Kernels are shared by every thread running a session: results stay bit for bit those
        # of a single-threaded run.
        sample = next((s for s in self.case.samples if not s.no_onnxruntime), None)
        if sample is None:
            pytest.skip("ONNX Runtime cannot run any sample")
        _, tensors, proto = self._exported(sample, "dynamo")
        sess = session(proto)
        feed = {i.name: as_numpy(t) for i, t in zip(sess.get_inputs(), tensors)}
        want = sess.run(None, feed)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            runs = list(pool.map(lambda _: sess.run(None, feed), range(32)))
        random = self._random(sample)
        for got in runs:
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and g.shape == w.shape and (random or g.tobytes() == w.tobytes())

    def test_reference_evaluator_agrees(self, exporter):
        from onnx.reference import ReferenceEvaluator

        sample = self.case.samples[0]
        _, tensors, proto = self._exported(sample, exporter)
        own = (self.info.onnx_domain, self.info.onnx_type) == expected_node(self.info, exporter, sample.inputs)
        new_ops = [reference_op_class(self.case)] if own and self.info.export_kind == "kernel" else []
        ref = ReferenceEvaluator(proto, new_ops=new_ops)
        feeds = {i.name: as_numpy(t) for i, t in zip(proto.graph.input, tensors)}
        got = ref.run(None, feeds)
        ort_out = session(proto).run(None, feeds)
        for k, (g, o) in enumerate(zip(got, ort_out)):
            assert_close(o, g, self.case.rtol, self.case.atol, f"ORT vs reference evaluator, output {k}",
                         self._random(sample))

    def test_dynamic_axis(self, exporter):
        sample = next((s for s in self.case.samples if s.dynamic), None)
        if sample is None or self.case.resize is None:
            pytest.skip("no dynamic sample")
        present = [t is not None for t in sample.inputs]
        names = [i.name for i, p in zip(self.info.inputs, present) if p]
        dyn = {self.info.inputs[i].name: {ax: f"d{ax}" for ax in axes} for i, axes in sample.dynamic.items()}
        model, _, proto = export_case(self.case, sample, exporter, dynamic_axes=dyn, check=self.case.resize(sample, 7))
        for g in proto.graph.input:
            if g.name in dyn:
                for ax in dyn[g.name]:
                    d = g.type.tensor_type.shape.dim[ax]
                    assert d.dim_param and not d.HasField("dim_value"), f"{g.name} axis {ax} is static: {d}"
        sess = session(proto)
        for n in (1, 5, 9):
            s = self.case.resize(sample, n)
            tensors = tuple(t for t in s.inputs if t is not None)
            report = verify(model, tensors, proto, rtol=self.case.rtol, atol=self.case.atol, sess=sess,
                            prove_dynamic=False)  # the sizes are this loop's
            assert report.ok, f"size {n}\n" + report.table()
        assert names

    def test_torch_rejects_bad_input(self, bad):
        with pytest.raises(RuntimeError, match=re.escape(self.info.qualified_name) + r": .*" + bad.match):
            self.info.overload(*bad.inputs, **bad.attrs)
        self.test_eager_matches_reference(self.case.samples[0])  # still alive and computing

    def _every_attribute_rejects_other_kinds(self, op, sample, arrays, attrs):
        feeds_of = lambda m: feeds(m, [(i.name, x) for i, x in zip(op.inputs, arrays) if x is not None])
        for a in op.attributes:
            for wrong in ATTR_KINDS[a.kind].other_kind_values:
                raw = node_attributes(op, attrs, without=a.name)
                raw.append(helper.make_attribute(a.name, wrong))
                model = node_model(op, arrays, attrs, raw_attrs=raw)
                match = re.escape(op.qualified_name) + rf".*attribute '{a.name}' must be {re.escape(a.kind)}, got"
                with pytest.raises(ORT_ERRORS, match=match):
                    session(model).run(None, feeds_of(model))
        self._still_runs(op, sample, attrs)

    def _still_runs(self, op, sample, attrs):
        # The process survived: the well-formed node still runs and matches the reference.
        good_arrays = [as_numpy(t) for t in sample.inputs]
        good = node_model(op, good_arrays, attrs)
        onnx.checker.check_model(good, full_check=True)  # the generated ONNX schema accepts it
        out = session(good).run(None, feeds(good, [(i.name, x) for i, x in zip(op.inputs, good_arrays)
                                                     if x is not None]))
        for k, (g, w) in enumerate(zip(out, reference_outputs(self.case, sample))):
            assert_close(g, w, self.case.rtol, self.case.atol, f"output {k}", self._random(sample))

    @pytest.mark.parametrize("kind", ["wrong_dtype", "mixed_dtypes", "missing_input", "missing_attribute",
                                      "wrong_attribute_type"])
    def test_onnxruntime_rejects_bad_node(self, kind):
        op = self.info
        if op.export_kind != "kernel":
            pytest.skip("runs as a builtin ONNX Runtime op")
        sample = self.case.samples[0]
        arrays = [as_numpy(t) for t in sample.inputs]
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
        elif kind == "mixed_dtypes":
            # Two inputs of one type constraint with different allowed dtypes: refused when the
            # session is created, naming both, as eager PyTorch does.
            pair = mixed_pair(op, arrays)
            if pair is None:
                pytest.skip("no two present inputs share a type constraint with several dtypes")
            k, other = pair
            first = next(i for i, x in zip(op.inputs, arrays) if x is not None and i.type == op.inputs[k].type)
            arrays[k] = arrays[k].astype(other)
            match = (re.escape(op.qualified_name) + rf".*inputs '{first.name}' \(\w+\) and '{op.inputs[k].name}' "
                     rf"\({other}\) must have the same dtype")
        elif kind == "missing_input":
            n_required = sum(not i.optional for i in op.inputs)
            n_inputs = n_required - 1
            match = rf"has input size {n_inputs} not in range"
        elif kind == "missing_attribute":
            required = [a for a in op.attributes if a.required]
            if not required:
                pytest.skip("every attribute has a default")
            raw = node_attributes(op, attrs, without=required[0].name)
            match = re.escape(op.qualified_name) + r".*required attribute '" + required[0].name + "'"
        else:
            if not op.attributes:
                pytest.skip("no attributes")
            return self._every_attribute_rejects_other_kinds(op, sample, arrays, attrs)
        model = node_model(op, arrays, attrs, n_inputs=n_inputs, raw_attrs=raw)
        feed = feeds(model, [(i.name, x) for i, x in zip(op.inputs, arrays) if x is not None])
        with pytest.raises(ORT_ERRORS, match=match):
            session(model).run(None, feed)
        self._still_runs(op, sample, attrs)


def op_test_suite(case: OpCase) -> type:
    """A pytest test class running the standard suite on `case` (the same as subclassing OpTest)."""
    return type(f"Test_{case.op}", (OpTest,), {"case": case})
