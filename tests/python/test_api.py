"""opbridge.export / session / verify, and the library loader: behaviour and error messages."""

import warnings

import numpy as np
import onnx
import onnxscript
import pytest
import torch

import opbridge


class MyAdd(torch.nn.Module):
    def forward(self, a, b):
        return torch.ops.opbridge.my_add(a, b)


def test_unknown_exporter_is_one_clear_error():
    with pytest.raises(opbridge.OpbridgeError, match="exporter must be one of dynamo, torchscript"):
        opbridge.export(MyAdd(), (torch.ones(2), torch.ones(2)), exporter="onnx")


def test_dynamic_axes_must_name_inputs():
    with pytest.raises(opbridge.OpbridgeError, match=r"dynamic_axes names \['z'\]"):
        opbridge.export(MyAdd(), (torch.ones(2), torch.ones(2)), input_names=["a", "b"], dynamic_axes={"z": {0: "n"}})


def test_export_saves_a_checked_model(tmp_path):
    path = tmp_path / "m.onnx"
    proto = opbridge.export(MyAdd(), (torch.ones(2, 3), torch.ones(3)), path, input_names=["a", "b"])
    loaded = onnx.load(path)
    onnx.checker.check_model(loaded, full_check=True)
    assert loaded.graph.node[0].op_type == proto.graph.node[0].op_type == "MyAdd"
    assert {(o.domain, o.version) for o in loaded.opset_import} >= {("opbridge", 1)}


def test_torchscript_export_declares_the_custom_opset():
    proto = opbridge.export(MyAdd(), (torch.ones(2), torch.ones(2)), exporter="torchscript")
    assert ("opbridge", 1) in {(o.domain, o.version) for o in proto.opset_import}


def test_verify_reports_a_mismatch():
    class Wrong(torch.nn.Module):
        def forward(self, a, b):
            return torch.ops.opbridge.my_add(a, b) + 1e-3 * (a > 0)

    args = (torch.randn(4, 3), torch.randn(4, 3))
    proto = opbridge.export(MyAdd(), args)  # the graph computes my_add only
    report = opbridge.verify(Wrong(), args, proto)
    assert not report.ok
    assert report.outputs[0].max_abs == pytest.approx(1e-3, rel=1e-3)
    assert "MISMATCH" in report.table()
    good = opbridge.verify(MyAdd(), args, proto)
    assert good.ok and good.outputs[0].max_abs == 0.0


def test_verify_input_count_mismatch():
    proto = opbridge.export(MyAdd(), (torch.ones(2), torch.ones(2)))
    with pytest.raises(opbridge.OpbridgeError, match=r"the ONNX model has 2 inputs \(a, b\), the call passes 1 tensors"):
        opbridge.verify(MyAdd(), (torch.ones(2),), proto)


class IgnoresScale(torch.nn.Module):
    def forward(self, a, scale, b):  # scale is never read: an exporter may drop the input
        return torch.ops.opbridge.my_add(a, b)


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_verify_matches_inputs_by_name_and_lists_the_dropped_ones(exporter):
    a, scale, b = torch.randn(2, 3), torch.randn(1), torch.randn(2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unused input, allowed here: tests/python/test_dropped_inputs.py tests the warning
        proto = opbridge.export(IgnoresScale(), (a, scale, b), exporter=exporter, input_names=["a", "scale", "b"],
                                allow_unused_inputs=True)
    report = opbridge.verify(IgnoresScale(), (a, scale, b), proto)  # names from forward's parameters
    assert report.ok, report
    graph_inputs = [i.name for i in proto.graph.input]
    if "scale" not in graph_inputs:
        assert report.dropped_inputs == ("scale",) and "scale" in report.table()
    sess = opbridge.session(proto)
    got = sess.run(None, {n: t.numpy() for n, t in zip(["a", "scale", "b"], (a, scale, b)) if n in graph_inputs})[0]
    np.testing.assert_allclose(got, 2 * a.numpy() + b.numpy(), rtol=1e-6)


def test_verify_without_names_to_match_says_how():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proto = opbridge.export(IgnoresScale(), (torch.ones(2), torch.ones(1), torch.ones(2)), exporter="torchscript",
                                input_names=["a", "scale", "b"], allow_unused_inputs=True)
    if len(proto.graph.input) == 3:
        pytest.skip("this exporter kept the unused input")
    with pytest.raises(opbridge.OpbridgeError, match="pass input_names= as given to export"):
        opbridge.verify(lambda *t: IgnoresScale()(*t), (torch.ones(2), torch.ones(1), torch.ones(2)), proto)


class TakesADict(torch.nn.Module):
    def forward(self, data):
        return torch.ops.opbridge.my_add(data["a"], data["b"])


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_a_dict_argument_is_positional_in_export_and_verify_alike(exporter):
    data = {"a": torch.randn(2, 3), "b": torch.randn(2, 3)}
    for args in ((data,), (data, {})):  # torch.onnx.export's trailing "no keywords" marker too
        proto = opbridge.export(TakesADict(), args, exporter=exporter)
        assert len(proto.graph.input) == 2
        report = opbridge.verify(TakesADict(), (data,), proto)
        assert report.ok and report.outputs[0].max_abs <= 1e-6, report


def test_session_runs_custom_ops_and_threads_option():
    proto = opbridge.export(MyAdd(), (torch.ones(2, 3), torch.ones(2, 3)), input_names=["a", "b"])
    sess = opbridge.session(proto, threads=1)
    a, b = np.random.rand(2, 3).astype(np.float32), np.random.rand(2, 3).astype(np.float32)
    np.testing.assert_array_equal(sess.run(None, {"a": a, "b": b})[0], 2 * a + b)


def test_plain_onnxruntime_without_the_library_fails_clearly():
    import onnxruntime as ort

    proto = opbridge.export(MyAdd(), (torch.ones(2), torch.ones(2)))
    with pytest.raises(Exception, match="MyAdd"):
        ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


def test_load_library_errors(tmp_path):
    with pytest.raises(opbridge.OpbridgeError, match="op library not found"):
        opbridge.load_library(tmp_path / "libnothing_torch.so")


def test_load_library_is_idempotent():
    again = opbridge.load_library(opbridge.builtin.torch_path)
    assert again is opbridge.builtin
    assert opbridge.libraries()[0] is opbridge.builtin


def test_large_input_parallel_path_matches_numpy():
    # Big enough for several chunks on ONNX Runtime's and PyTorch's thread pools.
    a, b = torch.randn(1 << 18), torch.randn(1 << 18)
    want = 2 * a.numpy() + b.numpy()
    np.testing.assert_array_equal(torch.ops.opbridge.my_add(a, b).numpy(), want)
    proto = opbridge.export(MyAdd(), (a, b), input_names=["a", "b"])
    got = opbridge.session(proto, threads=2).run(None, {"a": a.numpy(), "b": b.numpy()})[0]
    np.testing.assert_array_equal(got, want)


def test_missing_torchscript_exporter_is_one_line(monkeypatch):
    import opbridge._export.exporter as export_module

    monkeypatch.setattr(export_module, "torchscript_exporter_available", lambda: False)
    with pytest.raises(opbridge.OpbridgeError, match=r"has no TorchScript-based ONNX exporter \(dynamo=False\); use exporter='dynamo'"):
        opbridge.export(MyAdd(), (torch.ones(2), torch.ones(2)), exporter="torchscript")


def test_one_session_many_threads():
    # Kernels keep no mutable state: concurrent runs of one session agree with numpy.
    from concurrent.futures import ThreadPoolExecutor

    class Dual(torch.nn.Module):
        def forward(self, x, y):
            return torch.ops.opbridge.dual_residual(x, y, alpha=0.25)

    proto = opbridge.export(Dual(), (torch.ones(2, 3), torch.ones(2, 3)), input_names=["x", "y"],
                            dynamic_axes={"x": {0: "n"}, "y": {0: "n"}})
    sess = opbridge.session(proto, threads=4)  # each run also splits over the intra-op pool

    def run(seed):
        rng = np.random.default_rng(seed)
        n = 40_000 + 97 * seed  # several 16K-element chunks per run
        x, y = rng.random((n, 3), np.float32), rng.random((n, 3), np.float32)
        r1, r2 = sess.run(None, {"x": x, "y": y})
        a = np.float32(0.25)
        return np.array_equal(r1, x * a - y) and np.array_equal(r2, y * a - x)

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(run, range(32)))


def test_session_options_can_be_reused():
    proto = opbridge.export(MyAdd(), (torch.ones(2), torch.ones(2)))
    so = opbridge.session_options(threads=2)
    for _ in range(2):  # the op library is registered once per options object
        sess = opbridge.session(proto, options=so)
        assert sess.run(None, {i.name: np.ones(2, np.float32) for i in sess.get_inputs()})[0].tolist() == [3.0, 3.0]


def test_verify_treats_equal_infinities_as_equal():
    big = torch.tensor([3e38, -3e38, 1.0])
    proto = opbridge.export(MyAdd(), (big, big))
    report = opbridge.verify(MyAdd(), (big, big), proto)
    assert report.ok and report.outputs[0].max_abs == 0.0, report.table()


def test_misspelled_attribute_is_caught_by_the_checker_not_onnxruntime():
    # ONNX Runtime's C API cannot list a node's attributes, so an unknown name there falls back
    # to the default; the ONNX checker, which knows opbridge's schema, rejects it.
    from onnx import helper

    from opbridge.testing import node_model

    x = np.ones(2, np.float32)
    m = node_model(opbridge.builtin.op("dual_residual"), [x, x], {}, raw_attrs=[helper.make_attribute("alhpa", 0.5)])
    with pytest.raises(onnx.checker.ValidationError, match="Unrecognized attribute: alhpa for operator DualResidual"):
        onnx.checker.check_model(m, full_check=True)


class WithKwargs(torch.nn.Module):
    def forward(self, a, scale: int, *, b):
        return torch.ops.opbridge.my_add(a, b) * scale


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_keyword_and_non_tensor_arguments(exporter):
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    proto = opbridge.export(WithKwargs(), (a, 3), kwargs={"b": b}, exporter=exporter, input_names=["a", "b"],
                            dynamic_axes={"a": [0], "b": {0: "a_dim0"}})
    assert [i.name for i in proto.graph.input] == ["a", "b"]
    for i in proto.graph.input:
        assert i.type.tensor_type.shape.dim[0].dim_param, i
    report = opbridge.verify(WithKwargs(), (a, 3), proto, kwargs={"b": b})
    assert report.ok, report.table()
    a6, b6 = torch.randn(6, 3), torch.randn(6, 3)
    assert opbridge.verify(WithKwargs(), (a6, 3), proto, kwargs={"b": b6}).ok


def test_dynamic_axis_errors():
    args = (torch.ones(2, 3), torch.ones(2, 3))
    with pytest.raises(opbridge.OpbridgeError, match="input 'a' has rank 2; it has no axis 2"):
        opbridge.export(MyAdd(), args, input_names=["a", "b"], dynamic_axes={"a": [2]})



def test_specialized_axis_is_refused():
    # The model fixes the batch size: exporting with that axis dynamic must not succeed quietly.
    class Reshape(torch.nn.Module):
        def forward(self, a, b):
            return torch.ops.opbridge.my_add(a, b).reshape(2, 3)

    args = (torch.ones(2, 3), torch.ones(2, 3))
    with pytest.raises(Exception, match="Constraints violated|was asked to be dynamic|asks for dynamic axes that the exported model fixes"):
        opbridge.export(Reshape(), args, input_names=["a", "b"], dynamic_axes={"a": [0], "b": [0]})


def test_dynamo_opset_floor_is_one_line():
    with pytest.raises(opbridge.OpbridgeError, match="the dynamo exporter writes opset 18 or newer, got opset=17"):
        opbridge.export(MyAdd(), (torch.ones(2), torch.ones(2)), opset=17)
    assert opbridge.export(MyAdd(), (torch.ones(2), torch.ones(2)), exporter="torchscript", opset=13).opset_import


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_op_error_during_export_is_the_ops_own_message(exporter):
    with pytest.raises(opbridge.OpbridgeError, match=r"^opbridge::my_add: input 'a' has dtype int64; expected float32, float64, float16 or bfloat16$"):
        opbridge.export(MyAdd(), (torch.ones(2, dtype=torch.long), torch.ones(2, dtype=torch.long)), exporter=exporter)


def test_verify_nested_outputs():
    class Nested(torch.nn.Module):
        def forward(self, x, y):
            r1, r2 = torch.ops.opbridge.dual_residual(x, y, 0.5)
            return {"first": r1, "rest": (r2,)}

    args = (torch.randn(3), torch.randn(3))
    proto = opbridge.export(Nested(), args)
    report = opbridge.verify(Nested(), args, proto)
    assert report.ok and len(report.outputs) == 2


def test_dynamo_exports_fill_the_torchlib_registry_once_per_set_of_ops(monkeypatch):
    # torch.onnx.export(dynamo=True) would parse torchlib's sources on every call; opbridge.export
    # fills the registry once and gives each export a copy. A translation table one export adds
    # stays in its copy.
    from torch.onnx._internal.exporter import _registration

    from opbridge._export import dynamo

    args = (torch.randn(3, 4), torch.randn(3, 4))
    opbridge.export(MyAdd(), args)  # a process's first export imports modules that register ops
    filled = []
    original = _registration.ONNXRegistry.__dict__["from_torchlib"].__func__

    def counting(cls, *args, **kwargs):
        filled.append(args or tuple(kwargs.values()))
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(_registration.ONNXRegistry, "from_torchlib", classmethod(counting))
    monkeypatch.setattr(dynamo, "_TORCHLIB_REGISTRIES", {})
    first = opbridge.export(MyAdd(), args)
    again = opbridge.export(MyAdd(), args)
    assert len(filled) == 1 and first.graph.node[0].op_type == again.graph.node[0].op_type == "MyAdd"

    def as_sub(a, b, **_):  # an export-only translation: my_add written as ai.onnx Sub
        return onnxscript.opset18.Sub(a, b)

    # (Sub is not my_add: the export's comparison with eager at the example would refuse it.)
    swapped = opbridge.export(MyAdd(), args, extra_translations={torch.ops.opbridge.my_add.default: as_sub},
                              prove_dynamic=False)
    assert [n.op_type for n in swapped.graph.node] == ["Sub"] and len(filled) == 1
    assert opbridge.export(MyAdd(), args).graph.node[0].op_type == "MyAdd"  # the Sub stayed in its copy

    # Another opset: the same fill, cleaned for it by the registry's own rule, holds what torch
    # fills for that opset itself.
    assert opbridge.export(MyAdd(), args, opset=21) is not None and len(filled) == 1

    def functions(registry):
        return {t: [(d.onnx_function, d.opset_introduced) for d in ds] for t, ds in registry.functions.items()}

    with dynamo.reused_torchlib_registry():
        for opset in (18, 21, 23):
            ours = _registration.ONNXRegistry.from_torchlib(opset_version=opset)
            assert ours.opset_version == opset
            assert functions(ours) == functions(original(_registration.ONNXRegistry, opset_version=opset))
    assert len(filled) == 1

    # An op torchlib has a function for, registered since, is filled in; one it has none for
    # leaves the registry as it is.
    from onnxscript.function_libs.torch_lib import registration

    monkeypatch.setitem(registration.default_registry._registry, "opbridge_registry_test::twice",
                        registration.default_registry["aten::abs"])
    lib = torch.library.Library("opbridge_registry_test", "DEF")
    lib.define("other(Tensor x) -> Tensor")
    opbridge.export(MyAdd(), args)
    assert len(filled) == 1
    lib.define("twice(Tensor x) -> Tensor")
    opbridge.export(MyAdd(), args)
    assert len(filled) == 2
    twice = torch.ops.opbridge_registry_test.twice.default
    with dynamo.reused_torchlib_registry():
        assert twice.name() in _registration.ONNXRegistry.from_torchlib().functions



def test_dynamo_exports_look_up_torchs_cia_ops_once_per_call_and_get_torchs_set(monkeypatch):
    # torch.export asks for the valid CompositeImplicitAutograd ops twice per export, and looks
    # every such op up in torch.ops once per op namespace each time; opbridge.export has it looked
    # up once per call. The set is torch's own, also for an op registered between two calls and
    # never touched from Python (only the look-up makes its Python object).
    from opbridge._export import dynamo
    from torch._export import utils
    from torch.export import decomp_utils, exported_program

    assert dynamo._valid_cia_ops() == utils._collect_all_valid_cia_ops()
    lib = torch.library.Library("opbridge_cia_test", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CompositeImplicitAutograd")
    assert torch.ops.opbridge_cia_test._dir == []  # nothing made the op's Python object yet
    ours = dynamo._valid_cia_ops()
    assert "opbridge_cia_test::twice" in {op.name() for op in ours}
    assert ours == utils._collect_all_valid_cia_ops()
    lib._destroy()

    calls = []
    monkeypatch.setattr(dynamo, "_valid_cia_ops", lambda: calls.append(1) or utils._collect_all_valid_cia_ops())
    opbridge.export(MyAdd(), (torch.ones(2, 3), torch.ones(2, 3)))
    assert len(calls) == 2  # both of torch's callers asked opbridge's look-up
    assert exported_program._collect_all_valid_cia_ops is decomp_utils._collect_all_valid_cia_ops \
        is utils._collect_all_valid_cia_ops  # torch's own again after the export


def test_exports_on_two_threads_leave_torchs_exporter_as_it_was():
    # The dynamo export patches two of torch's functions for its duration. Two exports that
    # overlap (A in, B in, A out, B out) must leave torch's own in place, not A's patch.
    import threading

    from opbridge._export import dynamo
    from torch.export import decomp_utils, exported_program
    from torch.onnx._internal.exporter import _registration

    def current():
        return (_registration.ONNXRegistry.__dict__["from_torchlib"], exported_program._collect_all_valid_cia_ops,
                decomp_utils._collect_all_valid_cia_ops)

    before, seen = current(), []
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

    def first():
        with dynamo.reused_torchlib_registry(), dynamo.cia_ops_collected_once():
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def second():
        a_in.wait(10)
        with dynamo.reused_torchlib_registry(), dynamo.cia_ops_collected_once():
            b_in.set()
            a_out.wait(10)
            seen.append(current())  # still patched while this one is inside

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert seen and all(x is not y for x, y in zip(seen[0], before))
    assert all(x is y for x, y in zip(current(), before))
