"""The ONNX Runtime compatibility matrix: libopbridge_ort.so in ONNX Runtime 1.17 (the floor),
1.20, 1.22 and the pinned version, each in a throwaway environment holding only onnxruntime and
numpy (made here with pip from PyPI, cached between runs), running the demo's three models and
OtherForms, DetectionForms, LidarForms and SparseForms (the ops those do not call), exported by this environment and compared with PyTorch
eager outputs saved beforehand.

The environments are tests/python/envs.py's (cached; without them and without PyPI the matrix
skips, saying so).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import envs
import opbridge
from opbridge._runtime.session import newer_than_runtime

ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("ort_versions_runner.py")
sys.path.insert(0, str(ROOT / "examples"))
import demo  # noqa: E402  (examples/demo.py)

pytestmark = pytest.mark.environments  # scripts/test.sh --environments


PINNED = envs.pinned("onnxruntime")
# The floor (the adapter's oldest C API), two releases Triton images carry, and the pinned one.
# onnxruntime wheels before 1.19 were built against numpy 1.
NUMPY = "numpy==" + envs.pinned("numpy")
RUNTIMES = {"1.17.3": "numpy<2", "1.20.1": NUMPY, "1.22.1": NUMPY, PINNED: NUMPY}
# ai.onnx DeformConv has a CPU kernel from ONNX Runtime 1.25.0 on (1.24.4 has none); for older
# runtimes a model is exported with custom_nodes=True (opbridge's own DeformConv2d node) or below
# opset 19.
DEFORMCONV_SINCE = (1, 25)
# KernelInfoGetAttributeArray_string (C API 25): below it a list of strings reads as an empty list.
STRING_LISTS_SINCE = (1, 25)


def _version(v: str) -> tuple[int, int]:
    major, minor = v.split(".")[:2]
    return int(major), int(minor)


# ---- the throwaway environments ---------------------------------------------------------------
def runtime_python(version: str) -> Path:
    """The python of an environment with onnxruntime==version and numpy alone."""
    return envs.python_with(f"onnxruntime-{version}", [f"onnxruntime=={version}", RUNTIMES[version]])


# ---- the models, their inputs and eager outputs -------------------------------------------------
DEMO = dict(input_names=["x", "y"], output_names=["out0", "out1"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
CATALOGUE = dict(input_names=demo.CATALOGUE_INPUTS, output_names=["idx", "dist", "cluster", "resized"],
                 dynamic_axes={"points": {0: "n"}})
POINT_CLOUD = dict(input_names=demo.POINT_INPUTS, output_names=demo.POINT_OUTPUTS, dynamic_axes=demo.POINT_AXES)


class OtherForms(torch.nn.Module):
    """The forward ops the demo's models do not call: pointops' and torch_cluster's layouts of
    sampling and grouping (data-dependent pick counts), pytorch3d's kNN, torch_scatter's other
    reductions, and Deformable DETR's attention."""

    def __init__(self):
        super().__init__()
        self.register_buffer("shapes", torch.tensor([[4, 5], [2, 3]]))
        self.register_buffer("starts", torch.tensor([0, 20]))

    def forward(self, xyz, offset, feats, value, locations, weights):
        ops = torch.ops.opbridge
        dists, idx = ops.knn_points(xyz[None], xyz[None], K=4)
        picks = ops.furthest_point_sampling_offset(xyz, offset, offset // 4)
        ptr = torch.cat([offset.new_zeros(1), offset]).long()
        sampled = ops.furthest_point_sampling_ratio(xyz, ptr, ratio=0.25)
        ball, ball_dist = ops.ball_query_offset(xyz, offset, nsample=8, max_radius=0.3)
        mean = ops.segment_csr(feats, ptr, "mean")
        top, top_row = ops.segment_csr_arg(feats, ptr, "max")
        low, low_row = ops.scatter_reduce_arg(feats, ball[:, 1].long().clamp(min=0) % 16, 16, "min")
        attention = ops.multi_scale_deformable_attention(value, self.shapes, self.starts, locations, weights)
        return dists, idx, picks, sampled, ball, ball_dist, mean, top, top_row, low, low_row, attention


OTHER_OUTPUTS = ["dists", "idx", "picks", "sampled", "ball", "ball_dist", "mean", "top", "top_row", "low", "low_row",
                 "attention"]
OTHER_FORMS = dict(input_names=["xyz", "offset", "feats", "value", "locations", "weights"], output_names=OTHER_OUTPUTS,
                   dynamic_axes={"xyz": {0: "n"}, "feats": {0: "n"}})


def other_forms_inputs(n: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed + n)
    return (torch.rand(n, 3, generator=g), torch.tensor([n // 2, n], dtype=torch.int32),
            torch.randn(n, 5, generator=g), torch.randn(1, 26, 2, 8, generator=g),
            torch.rand(1, 6, 2, 2, 3, 2, generator=g) * 1.2 - 0.1, torch.rand(1, 6, 2, 2, 3, generator=g))
class DetectionForms(torch.nn.Module):
    """The detection ops: NMS (a data-dependent count), soft-NMS, RoIAlign / RoIPool /
    position-sensitive RoIAlign, the rotated family, CARAFE and corner pooling."""

    def forward(self, boxes, scores, features, rois, rotated, rotated_rois, masks):
        ops = torch.ops.opbridge
        keep = ops.nms(boxes, scores, 0.5)
        soft, soft_idx = ops.softnms(boxes, scores, 0.3, 0.5, 0.001, 2)
        aligned = ops.roi_align(features, rois, [3, 3], 0.5, 2, "avg", True)
        maxed = ops.roi_align(features, rois, [2, 2], 0.5, 0, "max", False)
        pooled, argmax = ops.roi_pool(features, rois, [2, 2], 0.5)
        ps, channels = ops.ps_roi_align(features, rois, [2, 2], 0.5, 2)
        ious = ops.box_iou_rotated(rotated, rotated[:5])
        kept_dets, kept = ops.nms_rotated(rotated, scores, iou_threshold=0.3)
        turned = ops.roi_align_rotated(features, rotated_rois, [2, 2], 0.5, 2)
        up = ops.carafe(features[:, :4], masks, 3, 1, 2)
        corner = ops.corner_pool(features, "left")
        return keep, soft, soft_idx, aligned, maxed, pooled, argmax, ps, channels, ious, kept_dets, kept, turned, up, \
            corner


DETECTION_OUTPUTS = ["keep", "soft", "soft_idx", "aligned", "maxed", "pooled", "argmax", "ps", "channels", "ious",
                     "kept_dets", "kept", "turned", "up", "corner"]
DETECTION_FORMS = dict(input_names=["boxes", "scores", "features", "rois", "rotated", "rotated_rois", "masks"],
                       output_names=DETECTION_OUTPUTS,
                       dynamic_axes={"boxes": {0: "n"}, "scores": {0: "n"}, "rotated": {0: "n"}})


def detection_inputs(n: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed + n)
    centres, sizes = torch.rand(n, 2, generator=g) * 48, torch.rand(n, 2, generator=g) * 16 + 4
    boxes = torch.cat([centres - sizes / 2, centres + sizes / 2], 1)
    rois = torch.cat([torch.zeros(6, 1), torch.rand(6, 2, generator=g) * 12, torch.rand(6, 2, generator=g) * 12 + 14], 1)
    rotated = torch.cat([centres, sizes, torch.rand(n, 1, generator=g) * 3 - 1.5], 1)
    rotated_rois = torch.cat([torch.zeros(6, 1), torch.rand(6, 2, generator=g) * 20 + 6,
                              torch.rand(6, 2, generator=g) * 8 + 4, torch.rand(6, 1, generator=g) - 0.5], 1)
    return (boxes, torch.randperm(n, generator=g).float() / n, torch.randn(1, 8, 16, 16, generator=g), rois,
            rotated, rotated_rois, torch.softmax(torch.randn(1, 9, 32, 32, generator=g), 1))


class LidarForms(torch.nn.Module):
    """The 3-D detection ops: hard and dynamic voxelization, dynamic scatter (data-dependent voxel
    counts), points in boxes, the BEV overlap, the 3-D NMS family, and mmcv's point forms (FPS over
    a distance matrix, a ball query with a shell)."""

    def forward(self, points, feats, boxes, scores):
        ops = torch.ops.opbridge
        size, box = [0.16, 0.16, 4.0], [0.0, -40.0, -3.0, 70.4, 40.0, 1.0]
        voxels, coors, num = ops.hard_voxelize(points, size, box, 8, 5000)
        cells = ops.dynamic_voxelize(points, size, box)
        voxel_feats, voxel_coors, _, _ = ops.dynamic_scatter(feats, cells, "mean")
        xyz = points[None, :, :3]
        d = xyz[:, :64, None, :] - xyz[:, None, :64, :]  # F-FPS: sampling over a distance matrix
        return voxels, coors, num, voxel_feats, voxel_coors, ops.points_in_boxes_part(xyz, boxes[None]), \
            ops.points_in_boxes_all(xyz, boxes[None]), ops.boxes_overlap_bev(boxes, boxes[:5]), \
            ops.nms3d(boxes, scores, iou_threshold=0.3), ops.nms3d_normal(boxes, scores, iou_threshold=0.3), \
            ops.furthest_point_sampling_with_dist((d * d).sum(-1), 8), \
            ops.ball_query(xyz, xyz[:, :20].contiguous(), 3.0, 6, min_radius=1.0)


LIDAR_OUTPUTS = ["voxels", "coors", "num", "voxel_feats", "voxel_coors", "part", "mask", "overlap", "keep",
                 "keep_normal", "picks", "shell"]
LIDAR_FORMS = dict(input_names=["points", "feats", "boxes", "scores"], output_names=LIDAR_OUTPUTS,
                   dynamic_axes={"points": {0: "p"}, "feats": {0: "p"}, "boxes": {0: "n"}, "scores": {0: "n"}})


def lidar_inputs(n: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed + n)
    points = torch.cat([torch.rand(40 * n, 3, generator=g) * torch.tensor([80.0, 90.0, 5.0]) -
                        torch.tensor([5.0, 45.0, 3.5]), torch.rand(40 * n, 1, generator=g)], 1)
    boxes = torch.cat([torch.rand(n, 2, generator=g) * 12 + torch.tensor([20.0, -6.0]),
                       torch.rand(n, 1, generator=g) - 2, torch.rand(n, 3, generator=g) * 3 + 1,
                       torch.rand(n, 1, generator=g) * 6 - 3], 1)
    return points, torch.randn(40 * n, 8, generator=g), boxes, torch.randperm(n, generator=g).float() / n


class SparseForms(torch.nn.Module):
    """Sparse convolution: a strided and a submanifold rulebook (data-dependent site and pair
    counts), the convolution over one, max pooling over the other."""

    def forward(self, indices, features, filters):
        ops = torch.ops.opbridge
        sites, pairs, counts = ops.sparse_indice_pairs(indices, spatial_shape=[8, 8, 8], kernel_size=[3, 3, 3],
                                                       stride=[2, 2, 2], padding=[1, 1, 1])
        same, same_pairs, same_counts = ops.sparse_indice_pairs(indices, spatial_shape=[8, 8, 8], kernel_size=[3, 3, 3],
                                                                subm=True)
        return ops.sparse_indice_conv(features, filters, pairs, counts, sites), sites, \
            ops.sparse_indice_maxpool(features, same_pairs, same_counts, same)


SPARSE_FORMS = dict(input_names=["indices", "features", "filters"], output_names=["conv", "sites", "pooled"],
                    dynamic_axes={"indices": {0: "n"}, "features": {0: "n"}})


def sparse_inputs(n: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed + n)
    linear = torch.randperm(512, generator=g)[:n]
    indices = torch.stack([torch.zeros(n, dtype=torch.long), linear // 64, linear // 8 % 8, linear % 8], 1).int()
    return indices, torch.randn(n, 4, generator=g), torch.randn(3, 3, 3, 4, 5, generator=g)


# name -> (which model, export arguments)
CASES = {
    # Default opsets (dynamo 20, TorchScript 17): both load into ONNX Runtime 1.17.
    "demo_dynamo": ("demo", dict(exporter="dynamo", **DEMO)),
    "demo_torchscript": ("demo", dict(exporter="torchscript", **DEMO)),
    # deform_conv2d as opbridge's own node: below opset 19, or on request.
    "catalogue_torchscript": ("catalogue", dict(exporter="torchscript", **CATALOGUE)),
    "catalogue_dynamo_custom_nodes": ("catalogue", dict(exporter="dynamo", custom_nodes=True, **CATALOGUE)),
    # deform_conv2d as ai.onnx DeformConv (opset 19 on): only runtimes with that kernel.
    "catalogue_dynamo": ("catalogue", dict(exporter="dynamo", **CATALOGUE)),
    # The point-cloud ops, a data-dependent size among them.
    "point_cloud_dynamo": ("point_cloud", dict(exporter="dynamo", **POINT_CLOUD)),
    "point_cloud_torchscript": ("point_cloud", dict(exporter="torchscript", **POINT_CLOUD)),
    "other_forms_dynamo": ("other_forms", dict(exporter="dynamo", **OTHER_FORMS)),
    "other_forms_torchscript": ("other_forms", dict(exporter="torchscript", **OTHER_FORMS)),
    "detection_dynamo": ("detection", dict(exporter="dynamo", **DETECTION_FORMS)),
    "detection_torchscript": ("detection", dict(exporter="torchscript", **DETECTION_FORMS)),
    "lidar_dynamo": ("lidar", dict(exporter="dynamo", **LIDAR_FORMS)),
    "lidar_torchscript": ("lidar", dict(exporter="torchscript", **LIDAR_FORMS)),
    "sparse_dynamo": ("sparse", dict(exporter="dynamo", **SPARSE_FORMS)),
    "sparse_torchscript": ("sparse", dict(exporter="torchscript", **SPARSE_FORMS)),
    # A newer opset than older runtimes have (and IR version 10, which 1.17 lacks).
    "demo_dynamo_opset22": ("demo", dict(exporter="dynamo", opset=22, **DEMO)),
}
# The catalogue's float32 bicubic and deformable sampling round differently in each runtime.
TOLERANCE = {"demo": (1e-5, 1e-6), "catalogue": (1e-4, 1e-4), "point_cloud": (1e-5, 1e-6), "other_forms": (1e-5, 1e-6),
             "detection": (1e-5, 1e-5), "lidar": (1e-5, 1e-5),
             "sparse": (1e-5, 1e-5)}


def _model_and_inputs(kind: str):
    if kind == "demo":
        return demo.DemoModel().eval(), [demo.example_inputs(b, seed=1) for b in (4, 1, 7)]
    if kind == "point_cloud":
        return demo.PointCloudModel().eval(), [demo.point_cloud_inputs(n, seed=1) for n in (64, 500)]
    if kind == "other_forms":
        return OtherForms().eval(), [other_forms_inputs(n, seed=1) for n in (64, 400)]
    if kind == "detection":
        return DetectionForms().eval(), [detection_inputs(n, seed=1) for n in (40, 300)]
    if kind == "lidar":
        return LidarForms().eval(), [lidar_inputs(n, seed=1) for n in (30, 80)]
    if kind == "sparse":
        return SparseForms().eval(), [sparse_inputs(n, seed=1) for n in (40, 90)]
    return demo.CatalogueModel().eval(), [demo.catalogue_inputs(n, s, seed=1) for n, s in ((64, 2.0), (200, 1.5))]


def _string_list_model() -> onnx.ModelProto:
    """opbridge::DeformConv2d with a list of strings for its int list attribute 'stride'."""
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
              for n, s in [("input", [1, 1, 4, 4]), ("weight", [1, 1, 3, 3]), ("offset", [1, 18, 2, 2])]]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("DeformConv2d", ["input", "weight", "offset"], ["y"], domain="opbridge", name="n",
                            stride=["a", "b"])
    return helper.make_model(helper.make_graph([node], "g", inputs, [y]), ir_version=8,
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("opbridge", 1)])


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> list[dict]:
    """Every case exported by this environment, with its inputs and PyTorch eager's outputs saved
    as .npz, one job per input set."""
    out = tmp_path_factory.mktemp("ort_versions")
    found = []
    for case, (kind, kwargs) in CASES.items():
        model, inputs = _model_and_inputs(kind)
        path = out / f"{case}.onnx"
        opbridge.export(model, inputs[0], path, **kwargs)
        for i, args in enumerate(inputs):
            with torch.no_grad():
                want = model(*args)
            name = f"{case}#{i}"
            np.savez(out / f"{name}.inputs.npz", **{n: a.numpy() for n, a in zip(kwargs["input_names"], args)})
            np.savez(out / f"{name}.eager.npz", **{n: t.numpy() for n, t in zip(kwargs["output_names"], want)})
            found.append({"name": name, "case": case, "kind": kind, "model": str(path),
                          "inputs": str(out / f"{name}.inputs.npz"), "eager": str(out / f"{name}.eager.npz")})
    onnx.save(_string_list_model(), out / "string_list.onnx")
    np.savez(out / "string_list.inputs.npz", input=np.ones((1, 1, 4, 4), np.float32),
             weight=np.ones((1, 1, 3, 3), np.float32), offset=np.zeros((1, 18, 2, 2), np.float32))
    found.append({"name": "string_list", "case": "string_list", "kind": None, "model": str(out / "string_list.onnx"),
                  "inputs": str(out / "string_list.inputs.npz"), "eager": None})
    return found


@pytest.fixture(scope="module")
def matrix(jobs, tmp_path_factory):
    """runtime version -> (the version onnxruntime reports, {job name: error or None}, outputs dir),
    run on first use: the runner runs every job under that runtime in one process."""
    done: dict[str, tuple] = {}

    def run(version: str):
        if version not in done:
            python = runtime_python(version)
            out = tmp_path_factory.mktemp(f"onnxruntime-{version}")
            spec = {"library": str(opbridge.builtin.ort_path),
                    "jobs": [{"name": j["name"], "model": j["model"], "inputs": j["inputs"],
                              "outputs": str(out / f"{j['name']}.npz")} for j in jobs]}
            (out / "jobs.json").write_text(json.dumps(spec))
            r = subprocess.run([str(python), str(RUNNER), str(out / "jobs.json")], capture_output=True, text=True,
                               timeout=600, env={**os.environ, "PYTHONPATH": ""})
            assert r.returncode == 0, f"the runner failed under onnxruntime {version}:\n{r.stdout}{r.stderr}"
            report = json.loads(r.stdout)
            done[version] = (report["version"], report["errors"], out, r.stderr)
        return done[version]

    return run


# ---- the matrix ---------------------------------------------------------------------------------
def expected_refusal(case: str, version: str) -> str | None:
    """What ONNX Runtime `version` answers a case with: None when it runs it (and must match
    eager), else a pattern its refusal matches."""
    v = _version(version)
    if case == "catalogue_dynamo" and v < DEFORMCONV_SINCE:
        return r"Could not find an implementation for DeformConv\(19\) node"
    if case == "demo_dynamo_opset22" and v < (1, 18):
        return r"Unsupported model IR version: 10, max supported IR version: 9"
    if case == "demo_dynamo_opset22" and v < (1, 21):
        return r"Opset 22 is under development.*is till opset 21"
    if case == "string_list":
        if v >= STRING_LISTS_SINCE:
            return r"opbridge::deform_conv2d \(node 'n'\): attribute 'stride' must be int\[\], got str\[\]"
        # Below it the list reads as an empty one, which this op's own check refuses when it runs.
        return r"opbridge::deform_conv2d \(node 'n'\): attribute 'stride' needs at least 1 values, got 0"
    return None


# What opbridge.session() says instead of these refusals (ONNX Runtime's words differ by release).
EXPLAINED = {"catalogue_dynamo": "export with custom_nodes=True", "demo_dynamo_opset22": "or lower"}


@pytest.mark.parametrize("version", RUNTIMES)
def test_library_registers_in_the_runtime_asked_for(matrix, version):
    reported, errors, _, stderr = matrix(version)
    assert reported == version
    # The library asks for no API version the runtime lacks (ONNX Runtime prints a line for each).
    assert "requested API version" not in stderr, stderr


@pytest.mark.parametrize("case", [*CASES, "string_list"])
@pytest.mark.parametrize("version", RUNTIMES)
def test_runtime_matches_eager_or_refuses_as_expected(matrix, jobs, version, case):
    _, errors, out, _ = matrix(version)
    refusal = expected_refusal(case, version)
    for job in (j for j in jobs if j["case"] == case):
        error = errors[job["name"]]
        if refusal is not None:
            assert error is not None and re.search(refusal, error, re.S), \
                f"{job['name']} under onnxruntime {version}: expected a refusal matching {refusal!r}, got {error!r}"
            if case in EXPLAINED:  # opbridge.session() would say what to export instead
                assert EXPLAINED[case] in (newer_than_runtime(error) or ""), error
            continue
        assert error is None, f"{job['name']} under onnxruntime {version}: {error}"
        rtol, atol = TOLERANCE[job["kind"]]
        with np.load(job["eager"]) as want, np.load(out / f"{job['name']}.npz") as got:
            assert sorted(got.files) == sorted(want.files)
            for name in want.files:
                assert got[name].dtype == want[name].dtype, (job["name"], name)
                np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol,
                                           err_msg=f"{job['name']} output {name} under onnxruntime {version}")


# ---- targeting an older runtime from this environment -----------------------------------------
def test_export_writes_the_lowest_ir_version_its_opset_needs():
    model, (args, *_) = _model_and_inputs("demo")
    irs = {(exporter, opset): opbridge.export(model, args, exporter=exporter, opset=opset).ir_version
           for exporter, opset in (("dynamo", None), ("dynamo", 21), ("torchscript", None), ("torchscript", 13))}
    # Default opsets (dynamo 20, TorchScript 17) load into ONNX Runtime 1.17, which reads IR <= 9.
    assert irs == {("dynamo", None): 9, ("dynamo", 21): 10, ("torchscript", None): 8, ("torchscript", 13): 7}


def _identity_model(ir_version: int, opset: int) -> onnx.ModelProto:
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in "xy")
    return helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y]),
                             ir_version=ir_version, opset_imports=[helper.make_opsetid("", opset)])


def test_session_names_an_ir_version_newer_than_the_runtime():
    with pytest.raises(opbridge.OpbridgeError, match=rf"^the model has IR version 99; ONNX Runtime {PINNED} reads IR "
                                                     r"version \d+ at most: export it with opset=\d+ or lower"):
        opbridge.session(_identity_model(99, 17))


def test_session_names_an_opset_newer_than_the_runtime():
    with pytest.raises(opbridge.OpbridgeError, match=rf"^the model imports ai.onnx opset 99; ONNX Runtime {PINNED} "
                                                     r"runs ai.onnx up to opset (\d+): export it with opset=\1 or lower"):
        opbridge.session(_identity_model(10, 99))


def test_a_standard_op_the_runtime_lacks_points_to_custom_nodes():
    # ONNX Runtime 1.22.1's words for the catalogue model's DeformConv (the pinned runtime has it).
    raw = ("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for DeformConv(19) node with "
           "name 'node_deform_conv2d'")
    assert newer_than_runtime(raw) == (
        f"ONNX Runtime {PINNED} has no kernel for ai.onnx DeformConv-19 (node 'node_deform_conv2d'), which opbridge "
        "writes for opbridge::deform_conv2d from opset 19, torchvision::deform_conv2d from opset 19: export with "
        "custom_nodes=True (or below that opset) to run opbridge's own node instead, or use an onnxruntime that has "
        "DeformConv")
    assert newer_than_runtime("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for "
                              "Foo(1) node with name 'n'") is None  # no opbridge op writes Foo


# ---- the adapter's use of the C API ------------------------------------------------------------
ORT_HEADER = ROOT / "third_party" / "onnxruntime" / "include" / "onnxruntime_c_api.h"
ADAPTER = ROOT / "adapters" / "ort" / "ort_adapter.cc"
FLOOR = 17
# Entries newer than the floor: name -> (the adapter's constant for its version, the version); the
# adapter calls each only when the negotiated version reaches it.
GUARDED = {"KernelInfoGetAttributeArray_string": ("kStringListApiVersion", 25),
           "GetTensorElementTypeAndShapeDataReference": ("kShapeReferenceApiVersion", 24)}


def _api_entries_since(header: str) -> dict[str, int]:
    """OrtApi entry -> the ONNX Runtime minor version that added it, from the header's \\since
    notes; an entry without one counts from the last note before it (the table only grows)."""
    body = header[header.index("struct OrtApi {"):]
    body = body[:body.index("\n};")]
    entry = re.compile(r"(/\*\*(?:(?!\*/).)*\*/)?\s*(?:ORT_API2_STATUS\((\w+)|ORT_CLASS_RELEASE\((\w+)\)|"
                       r"ORT_API_T\([^,]+,\s*(\w+)|[\w\s*()]*?\(ORT_API_CALL\s*\*\s*(\w+)\))", re.S)
    since, found = 1, {}
    for m in entry.finditer(body):
        note = re.search(r"\\since (?:Version )?1\.(\d+)", m[1] or "")
        since = max(since, int(note[1])) if note else since
        name = m[2] or (m[3] and "Release" + m[3]) or m[4] or m[5]
        found[name] = since
    return found


@pytest.mark.skipif(not ORT_HEADER.is_file(), reason=f"{ORT_HEADER} is missing (scripts/setup.sh fetches it)")
def test_adapter_calls_only_entries_its_floor_has():
    since = _api_entries_since(ORT_HEADER.read_text())
    source = ADAPTER.read_text()
    assert f"kMinApiVersion = {FLOOR};" in source
    used = set(re.findall(r"\b(?:g_api|api|old)->(\w+)", source))
    assert used and used <= since.keys(), used - since.keys()
    too_new = {name: since[name] for name in used if since[name] > FLOOR and name not in GUARDED}
    assert not too_new, f"OrtApi entries newer than ONNX Runtime 1.{FLOOR}, called without a version guard: {too_new}"
    for name, (constant, version) in GUARDED.items():
        assert since[name] == version and f"{constant} = {version};" in source, name
        assert f"g_api_version < {constant}" in source, f"{name} is called without checking {constant}"
