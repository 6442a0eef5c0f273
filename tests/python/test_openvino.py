"""OpenVINO, the second runtime: opbridge's exported models read by OpenVINO's ONNX frontend with
each op library's OpenVINO side (lib<name>_ov.so) and run by its CPU plugin, against eager
PyTorch. The op suite (opbridge.testing) runs every op's samples this way too; here: the session's
calls, data-dependent and dynamic sizes, ai.onnx DeformConv (which OpenVINO cannot read), and the
errors of each stage, each naming the op and the node."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

import opbridge
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


def test_runtime_and_options_are_checked(detection_model):
    with pytest.raises(opbridge.OpbridgeError, match="runtime must be 'onnxruntime' or 'openvino', got 'tvm'"):
        opbridge.session(detection_model, runtime="tvm")
    with pytest.raises(opbridge.OpbridgeError, match="runtime='openvino' takes threads="):
        opbridge.session(detection_model, runtime="openvino", options=opbridge.session_options())


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
