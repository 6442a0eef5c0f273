"""OpenVINO, the second runtime: opbridge's exported models read by OpenVINO's ONNX frontend with
each op library's OpenVINO side (lib<name>_ov.so) and run by its CPU plugin, against eager
PyTorch. The op suite (opbridge.testing) runs every op's samples this way too; here: the session's
calls, data-dependent and dynamic sizes, ai.onnx DeformConv (which OpenVINO cannot read), and the
errors of each stage, each naming the op and the node."""

from __future__ import annotations

import textwrap

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

import opbridge
from opbridge._runtime.inspect import analyze
from opbridge._runtime.own_nodes import with_own_nodes

opbridge.load_torch()
OPS = torch.ops.opbridge


class Detection(torch.nn.Module):
    """NMS (a data-dependent count), RoIAlign over a dynamic number of RoIs, an element-wise op."""

    def forward(self, boxes, scores, feats, rois):
        keep = OPS.nms(boxes, scores, 0.5)
        pooled = OPS.roi_align(feats, rois, [7, 7], 0.25, 0, "avg", True)
        return keep, pooled, OPS.my_add(feats, feats)


def detection_inputs(n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * 50
    boxes = torch.cat([xy, xy + 5 + torch.rand(n, 2, generator=g) * 20], 1)
    rois = torch.cat([torch.randint(0, 2, (k, 1), generator=g).float(), boxes[:k]], 1)
    return boxes, torch.rand(n, generator=g), torch.randn(2, 4, 16, 16, generator=g), rois


NAMES = ["boxes", "scores", "feats", "rois"]


@pytest.fixture(scope="module")
def detection_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("ov") / "detection.onnx"
    opbridge.export(Detection(), detection_inputs(50, 10, 0), path, exporter="torchscript", input_names=NAMES,
                    dynamic_axes={"boxes": {0: "n"}, "scores": {0: "n"}, "rois": {0: "k"}})
    return path


def test_builtin_library_has_its_openvino_side():
    (lib,) = [lib for lib in opbridge.libraries() if lib.name == "opbridge"]
    assert lib.openvino_path is not None and lib.openvino_path.name == "libopbridge_ov.so"


@pytest.mark.parametrize("n,k", [(50, 10), (200, 33), (3, 0)])
def test_detection_model_matches_eager_at_every_size(detection_model, n, k):
    sess = opbridge.session(detection_model, runtime="openvino")
    args = detection_inputs(n, k, n)
    got = sess.run(None, {name: t.numpy() for name, t in zip(NAMES, args)})
    want = Detection()(*args)
    assert len(got) == 3
    np.testing.assert_array_equal(got[0], want[0].numpy())  # NMS: the same boxes kept, the same order
    np.testing.assert_array_equal(got[1], want[1].numpy())  # RoIAlign: one kernel, bit for bit
    np.testing.assert_array_equal(got[2], want[2].numpy())
    assert got[0].dtype == np.int64 and got[1].shape == (k, 4, 7, 7)


def test_one_session_follows_the_sizes_from_run_to_run(detection_model):
    """The CPU plugin infers a dynamic model's shapes on every run by cloning opbridge's nodes, and
    the adapter keeps the last answer per input sizes: each run at new sizes, then the first again,
    has its own output shapes and values."""
    sess = opbridge.session(detection_model, runtime="openvino")
    for n, k in ((50, 10), (200, 33), (3, 0), (50, 10)):
        args = detection_inputs(n, k, n)
        got = sess.run(None, {name: t.numpy() for name, t in zip(NAMES, args)})
        for mine, eager in zip(got, Detection()(*args), strict=True):
            np.testing.assert_array_equal(mine, eager.numpy())


def test_session_answers_as_onnxruntimes_does(detection_model):
    ov_sess = opbridge.session(detection_model, runtime="openvino")
    ort_sess = opbridge.session(detection_model)
    for mine, theirs in ((ov_sess.get_inputs(), ort_sess.get_inputs()), (ov_sess.get_outputs(), ort_sess.get_outputs())):
        assert [(a.name, a.shape, a.type) for a in mine] == [(a.name, a.shape, a.type) for a in theirs]
    feeds = {name: t.numpy() for name, t in zip(NAMES, detection_inputs(20, 4, 1))}
    (pooled,) = ov_sess.run([ort_sess.get_outputs()[1].name], feeds)
    np.testing.assert_array_equal(pooled, ort_sess.run([ort_sess.get_outputs()[1].name], feeds)[0])
    with pytest.raises(opbridge.OpbridgeError, match="no output named nope"):
        ov_sess.run(["nope"], feeds)


def test_verify_runs_in_openvino(detection_model):
    report = opbridge.verify(Detection(), detection_inputs(30, 5, 2), detection_model, runtime="openvino")
    assert report.ok, report.table()


class Wrong(Detection):
    """Not what was exported: NMS's first index off by one, and the pooled features off by one at
    every number of RoIs but the example's (5), which only the second-size proof sees."""

    def forward(self, boxes, scores, feats, rois):
        keep, pooled, added = super().forward(boxes, scores, feats, rois)
        keep = keep.clone()
        keep[0] += 1
        return keep, pooled + float(rois.shape[0] != 5), added


@pytest.mark.parametrize("runtime,name,other", [("openvino", "OpenVINO", "ONNX Runtime"),
                                                ("onnxruntime", "ONNX Runtime", "OpenVINO")])
def test_verify_names_the_runtime_that_ran(detection_model, runtime, name, other):
    report = opbridge.verify(Wrong(), detection_inputs(30, 5, 2), detection_model, runtime=runtime)
    assert not report.ok and report.runtime == name
    keep = report.outputs[0]
    assert not keep.ok and f"worst at [0]: {name} {keep.got}, PyTorch {keep.want} (off by 1)" in keep.note
    assert not report.second_size_ok and f"in {name}, " in report.second_size, report.second_size
    assert other not in report.table(), report.table()


def test_runtime_and_options_are_checked(detection_model):
    with pytest.raises(opbridge.OpbridgeError, match="runtime must be 'onnxruntime' or 'openvino', got 'tvm'"):
        opbridge.session(detection_model, runtime="tvm")
    with pytest.raises(opbridge.OpbridgeError, match="runtime='openvino' takes threads="):
        opbridge.session(detection_model, runtime="openvino", options=opbridge.session_options())


def test_another_openvino_than_the_one_built_against_is_named(detection_model, monkeypatch):
    # The OpenVINO side links the versioned libopenvino.so of its build: the loader's own error
    # would name neither opbridge nor the version to install.
    import opbridge._runtime.openvino as ov_runtime
    built = dict(opbridge.build_info(), openvino="2025.1.0")
    monkeypatch.setattr(ov_runtime, "build_info", lambda: built)
    with pytest.raises(opbridge.OpbridgeError, match=r"built against openvino 2025\.1\.0, and openvino 2026\.4\.1 "
                                                     r"is installed: pip install openvino==2025\.1\.0"):
        opbridge.session(detection_model, runtime="openvino")


def test_kernel_error_at_run_names_the_op_and_node(detection_model):
    sess = opbridge.session(detection_model, runtime="openvino")
    boxes, scores, feats, rois = detection_inputs(10, 2, 3)
    feeds = {"boxes": boxes.numpy(), "scores": scores[:7].numpy(), "feats": feats.numpy(), "rois": rois.numpy()}
    # scores has 7 entries for 10 boxes: the op's check, at run time (both sizes are dynamic).
    with pytest.raises(opbridge.OpbridgeError, match=r"opbridge::nms \(node '[^']+'\): .*scores"):
        sess.run(None, feeds)
    # The session still runs.
    feeds["scores"] = scores.numpy()
    assert len(sess.run(None, feeds)) == 3


def test_static_shape_error_at_compile_names_the_op_and_node(tmp_path):
    node = helper.make_node("RoiAlign", ["x", "rois"], ["y"], domain="opbridge", name="pool", output_size=[2, 2])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 4, 4]),
                                            helper.make_tensor_value_info("rois", onnx.TensorProto.FLOAT, [3, 4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("opbridge", 1)])
    with pytest.raises(opbridge.OpbridgeError, match=r"opbridge::roi_align \(node 'pool'\): .*rois"):
        opbridge.session(model, runtime="openvino")


class Deform(torch.nn.Module):
    def forward(self, x, w, off, mask):
        return OPS.deform_conv2d(x, w, off, None, mask, [1, 1], [1, 1], [1, 1], 1, 1)


def deform_inputs(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 3, 6, 5, generator=g), torch.randn(4, 3, 3, 3, generator=g),
            torch.randn(n, 18, 6, 5, generator=g), torch.rand(n, 9, 6, 5, generator=g))


@pytest.mark.parametrize("opset", [19, 22])
def test_standard_deform_conv_runs_as_opbridges_node(tmp_path, opset):
    # OpenVINO's ONNX frontend has no DeformConv: the node becomes opbridge's by the op's rule.
    path = tmp_path / "deform.onnx"
    args = deform_inputs(2, 0)
    proto = opbridge.export(Deform(), args, path, exporter="torchscript", opset=opset,
                            input_names=["x", "w", "off", "mask"], dynamic_axes={"x": {0: "n"}, "off": {0: "n"},
                                                                                  "mask": {0: "n"}})
    assert "DeformConv" in {n.op_type for n in proto.graph.node if n.domain == ""}
    sess = opbridge.session(path, runtime="openvino")
    for n in (2, 3):
        args = deform_inputs(n, n)
        (got,) = sess.run(None, dict(zip(["x", "w", "off", "mask"], [t.numpy() for t in args])))
        np.testing.assert_allclose(got, Deform()(*args).numpy(), rtol=1e-5, atol=1e-5)


def _deform_conv_node(**attrs):
    node = helper.make_node("DeformConv", ["x", "w", "off"], ["y"], name="dc", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None)
                                            for n in ("x", "w", "off")],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def test_standard_node_the_rule_cannot_have_written_is_refused():
    full = dict(strides=[1, 1], dilations=[1, 1], group=1, offset_group=1)
    rewritten = with_own_nodes(_deform_conv_node(pads=[1, 2, 1, 2], **full), {"DeformConv"})
    (node,) = rewritten.graph.node
    assert (node.domain, node.op_type) == ("opbridge", "DeformConv2d")
    got = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert got["padding"] == [1, 2] and got["stride"] == [1, 1] and got["offset_groups"] == 1
    # Asymmetric pads: opbridge's op pads both sides alike.
    with pytest.raises(opbridge.OpbridgeError, match=r"DeformConv node 'dc': attribute 'pads' = \[1, 2, 0, 2\] gives "
                                                     r"opbridge::deform_conv2d's 'padding' two values"):
        with_own_nodes(_deform_conv_node(pads=[1, 2, 0, 2], **full), {"DeformConv"})
    with pytest.raises(opbridge.OpbridgeError, match="DeformConv node 'dc' has no attribute 'strides'"):
        with_own_nodes(_deform_conv_node(pads=[0, 0, 0, 0], dilations=[1, 1], group=1, offset_group=1),
                       {"DeformConv"})


class Sampling(torch.nn.Module):
    """A symbolic attribute computed from a size: npoint is a quarter of the points."""

    def forward(self, xyz):
        return OPS.furthest_point_sampling(xyz, xyz.shape[1] // 4)


@pytest.mark.parametrize("how", ["trace", "export"])
def test_convert_model_reads_a_pytorch_model_calling_opbridges_ops(how):
    # No ONNX in between: OpenVINO's PyTorch frontend, with the library's conversions.
    import openvino as ov

    (lib,) = [lib for lib in opbridge.libraries() if lib.name == "opbridge"]
    args = detection_inputs(50, 10, 0)
    source = torch.export.export(Detection(), args) if how == "export" else Detection()
    kwargs = {} if how == "export" else {"example_input": args}
    model = ov.convert_model(source, extension=[str(lib.openvino_path)], **kwargs)
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    for n, k in ((50, 10), (80, 3)) if how == "trace" else ((50, 10),):  # torch.export fixed the sizes
        args = detection_inputs(n, k, n)
        got = compiled([a.numpy() for a in args])
        for i, want in enumerate(Detection()(*args)):
            np.testing.assert_array_equal(got[compiled.outputs[i]], want.numpy())


def test_convert_model_takes_a_size_computed_attribute_as_an_input():
    # torch.export keeps npoint symbolic (a TorchScript trace, convert_model's own for a module,
    # would record the example's 16): the node takes it as an input, read when it runs.
    import openvino as ov

    (lib,) = [lib for lib in opbridge.libraries() if lib.name == "opbridge"]
    xyz = torch.rand(2, 64, 3, generator=torch.Generator().manual_seed(0))
    program = torch.export.export(Sampling(), (xyz,), dynamic_shapes=({1: torch.export.Dim("n", min=8)},))
    model = ov.convert_model(program, extension=[str(lib.openvino_path)])
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    for n in (64, 100):
        xyz = torch.rand(2, n, 3, generator=torch.Generator().manual_seed(n))
        got = compiled([xyz.numpy()])[compiled.outputs[0]]
        assert got.shape == (2, n // 4)
        np.testing.assert_array_equal(got, Sampling()(xyz).numpy())


def statuses(model: onnx.ModelProto, path: str = "") -> dict:
    """inspect's verdict for OpenVINO per (domain, op type)."""
    return {(u.domain, u.op_type): u.verdict for u in analyze(model, path, runtime="openvino").ops}


def test_inspect_for_openvino_inlines_the_models_functions(tmp_path):
    body = [helper.make_node("Add", ["a", "a"], ["b"])]
    function = helper.make_function("local", "Twice", ["a"], ["b"], body, [helper.make_opsetid("", 17)])
    graph = helper.make_graph([helper.make_node("Twice", ["x"], ["y"], domain="local")], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                              functions=[function])
    onnx.save(model, tmp_path / "f.onnx")
    for path in ("", str(tmp_path / "f.onnx")):  # read from the file, or from the model in memory
        got = {k: v.status for k, v in statuses(model, path).items()}
        assert got == {("local", "Twice"): "model function", ("", "Add"): "openvino"}, (path, got)
    x = np.array([1.5, -2], np.float32)
    np.testing.assert_array_equal(opbridge.session(model, runtime="openvino").run(None, {"x": x})[0], 2 * x)


def test_inspect_for_openvino_reads_deform_conv_as_opbridges_node(tmp_path):
    # Judged against OpenVINO itself: a session compiles exactly where inspect finds nothing missing.
    proto = opbridge.export(Deform(), deform_inputs(2, 0), tmp_path / "deform.onnx", exporter="torchscript", opset=19)
    assert statuses(proto)[("", "DeformConv")].status == "opbridge (own node)"
    assert "op deform_conv2d of library opbridge" in statuses(proto)[("", "DeformConv")].detail
    opbridge.session(proto, runtime="openvino")
    asymmetric = _deform_conv_node(pads=[1, 2, 0, 2], strides=[1, 1], dilations=[1, 1], group=1, offset_group=1)
    verdict = statuses(asymmetric)[("", "DeformConv")]
    assert verdict.missing and "'padding' two values" in verdict.advice
    with pytest.raises(opbridge.OpbridgeError, match="'padding' two values"):
        opbridge.session(asymmetric, runtime="openvino")


def test_inspect_for_openvino_names_a_node_whose_conversion_fails():
    # The TorchScript exporter's squeeze of a dynamic axis: If(size == 1, Squeeze, Identity), whose
    # rank OpenVINO's frontend cannot know; its Conv then fails to convert (ONNX Runtime runs it).
    T = onnx.TensorProto
    then = helper.make_graph([helper.make_node("Squeeze", ["x", "axis"], ["s"])], "then", [],
                             [helper.make_tensor_value_info("s", T.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["i"])], "else", [],
                              [helper.make_tensor_value_info("i", T.FLOAT, None)])
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "axis"], ["size"]),
             helper.make_node("Equal", ["size", "one"], ["is_one"]),
             helper.make_node("If", ["is_one"], ["y"], then_branch=then, else_branch=other),
             helper.make_node("Conv", ["y", "w"], ["z"], name="conv")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [1, 4, "n", 3])],
                              [helper.make_tensor_value_info("z", T.FLOAT, None)],
                              [helper.make_tensor("axis", T.INT64, [1], [2]),
                               helper.make_tensor("one", T.INT64, [1], [1]),
                               helper.make_tensor("w", T.FLOAT, [2, 4, 1, 1], [1.0] * 8)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    verdict = statuses(model)[("", "Conv")]
    assert verdict.missing and "failed to convert ai.onnx::Conv node 'conv': The input data tensor's rank" in \
        verdict.advice, verdict
    with pytest.raises(opbridge.OpbridgeError, match="Conv"):
        opbridge.session(model, runtime="openvino")
    x = np.ones((1, 4, 5, 3), np.float32)
    np.testing.assert_array_equal(opbridge.session(model).run(None, {"x": x})[0], np.full((1, 2, 5, 3), 4, np.float32))


# An op library load_inline builds (as `name`, torch namespace and ONNX domain alike).
def inline_source(name: str) -> str:
    return textwrap.dedent("""\
        #include <opbridge/op.h>

        namespace inline_ops {
        using namespace opbridge;

        void twice_kernel(KernelContext& ctx, const TensorView& x, TensorView& y) {
          const float* px = x.data_as<float>();
          float* py = y.data_as<float>();
          for (int64_t i = 0; i < x.numel(); ++i) py[i] = 2 * px[i];
        }

        OPBRIDGE_OP(twice)
            .doc("2 x")
            .types("T", {DType::Float32})
            .input("x", "T", "operand")
            .output("y", "T", shape::same({"x"}), "2 x")
            .cpu(twice_kernel);
        }  // namespace inline_ops
        """)


def twice(namespace: str) -> torch.nn.Module:
    class Twice(torch.nn.Module):
        def forward(self, x):
            return getattr(torch.ops, namespace).twice(x)

    return Twice()


def test_load_inline_builds_the_openvino_side(tmp_path):
    # load_inline builds lib<name>_ov.so beside the others where the openvino package is installed:
    # a model with the inline op runs in OpenVINO, at the example and at another size.
    lib = opbridge.load_inline("ovinline", inline_source("ovinline"), build_directory=tmp_path / "jit")
    assert lib.openvino_path is not None and lib.openvino_path.name == "libovinline_ov.so"
    assert lib.openvino_path.parent == lib.ort_path.parent
    path = tmp_path / "twice.onnx"
    opbridge.export(twice("ovinline"), (torch.randn(3, 4),), path, exporter="torchscript", input_names=["x"],
                    dynamic_axes={"x": {0: "n"}})
    sess = opbridge.session(path, runtime="openvino")
    for x in (torch.randn(3, 4), torch.randn(7, 4)):
        np.testing.assert_array_equal(sess.run(None, {"x": x.numpy()})[0], (2 * x).numpy())
    report = opbridge.verify(twice("ovinline"), (torch.randn(5, 4),), path, runtime="openvino")
    assert report.ok and report.runtime == "OpenVINO", report.table()
    assert statuses(onnx.load(path))[("ovinline", "Twice")].status == "opbridge"


def test_a_library_without_openvino_side_stops_only_the_models_using_it(detection_model, tmp_path):
    # Built with its OpenVINO side turned off (as where opbridge has none, or OpenVINO differs).
    lib = opbridge.load_inline("ovless", inline_source("ovless"), build_directory=tmp_path / "jit",
                               extra_cmake_args=["-DOPBRIDGE_WITH_OPENVINO=OFF"])
    assert lib.ort_path is not None and lib.openvino_path is None
    # A model of other libraries' ops runs in OpenVINO with it loaded.
    args = detection_inputs(40, 6, 4)
    got = opbridge.session(detection_model, runtime="openvino").run(None, dict(zip(NAMES, [t.numpy() for t in args])))
    for g, w in zip(got, Detection()(*args)):
        np.testing.assert_array_equal(g, w.numpy())
    assert statuses(onnx.load(detection_model))[("opbridge", "Nms")].status == "opbridge"
    # A model using its op is refused by name (ONNX Runtime, with the library's side for it, runs it).
    x = torch.randn(3, 4)
    path = tmp_path / "twice.onnx"
    opbridge.export(twice("ovless"), (x,), path)
    np.testing.assert_array_equal(opbridge.session(path).run(None, {"x": x.numpy()})[0], (2 * x).numpy())
    with pytest.raises(opbridge.OpbridgeError, match=r"op library ovless has no OpenVINO side \(lib<name>_ov.so\), "
                                                     "and the model uses its ops"):
        opbridge.session(path, runtime="openvino")
    report = opbridge.verify(twice("ovless"), (x,), path, runtime="openvino")
    assert not report.ok and report.runtime == "OpenVINO"
    assert report.cannot_run.startswith("ovless::Twice (1 node): ovless::Twice: op library 'ovless' has no "
                                        "OpenVINO side")
    verdict = statuses(onnx.load(path))[("ovless", "Twice")]
    assert verdict.missing and "op library 'ovless' has no OpenVINO side" in verdict.advice
