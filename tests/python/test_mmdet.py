"""OpenMMLab's detection zoo on opbridge: mmdet 3.3.0 with mmcv-lite (mmcv without its compiled
extension) and mmengine 0.10.7, installed into an environment of their own (tests/python/envs.py),
their code untouched. opbridge.compat.install("mmcv") provides `mmcv._ext` and the one
module of mmdet 2.x that mmdet 3.x still imports while exported; the named models build from the
configs in the mmdet wheel, predict eagerly, and export (tests/python/mmdet_models.py runs each)."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

import envs

RUNNER = Path(__file__).with_name("mmdet_models.py")
# mmcv-lite and mmdet name opencv-python, which needs libGL: the headless build instead, so every
# dependency is named and installed without its own.
DEPENDENCIES = ["opencv-python-headless", "pycocotools", "shapely", "terminaltables", "rich", "six", "matplotlib",
                "addict", "yapf", "termcolor", "scipy", "tqdm", "pillow", "pyyaml", "packaging", "markdown-it-py",
                "mdurl", "pygments", "contourpy", "cycler", "fonttools", "kiwisolver", "pyparsing", "python-dateutil",
                "platformdirs", "tomli"]
MMDET = ["mmcv-lite==2.1.0", "mmengine==0.10.7", "mmdet==3.3.0", *DEPENDENCIES, "--no-deps"]

# Every function mmcv's Python ops load from mmcv._ext: each ops/*.py calls
# ext_loader.load_ext('_ext', [names]). Read from the installed sources, not imported.
LOADED = textwrap.dedent('''
    import ast, importlib.util, json, pathlib, sys
    root = pathlib.Path(importlib.util.find_spec("mmcv").submodule_search_locations[0])
    names = {}
    for f in sorted(root.rglob("*.py")):
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", "")) == "load_ext":
                names[str(f.relative_to(root.parent))] = [e.value for e in n.args[1].elts]
    import opbridge.compat.mmcv._ext as ext
    missing = sorted(n for ns in names.values() for n in ns if not callable(getattr(ext, n, None)))
    json.dump({"names": names, "missing": missing}, open(sys.argv[1], "w"))
''')


def _run(python: Path, args: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)})


@pytest.fixture(scope="module")
def mmdet_python():
    return envs.python_with("mmdet-3.3.0", MMDET, on_top=True)


def test_install_without_mmdet_or_mmcv_adds_nothing_of_mmdet():
    import importlib.util

    import opbridge.compat
    if importlib.util.find_spec("mmdet") is not None:
        pytest.skip("mmdet is installed here")
    assert opbridge.compat.install("mmdet") == {"mmdet": "absent"}
    assert "mmdet.core" not in opbridge.compat.installed()


@pytest.mark.environments
@pytest.mark.parametrize("version", ["2.1.0", "2.2.0"])
def test_mmcv_ext_has_every_function_mmcv_lite_loads(version, tmp_path):
    python = envs.python_with(f"mmcv-lite-{version}", [f"mmcv-lite=={version}", "--no-deps"], on_top=True)
    r = _run(python, ["-c", LOADED, str(tmp_path / "out.json")])
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert sum(len(v) for v in out["names"].values()) >= 112, out["names"]
    assert out["missing"] == []


INSTALL = textwrap.dedent('''
    import json, sys
    import opbridge.compat
    answer = opbridge.compat.install("mmcv")  # and mmdet's part, mmdet being installed
    import mmcv._ext, mmcv.ops, mmdet.models  # mmcv-lite alone: "No module named 'mmcv._ext'"
    from mmcv.ops import bbox_overlaps
    import torch
    try:
        bbox_overlaps(torch.rand(2, 4), torch.rand(3, 4))
        error = None
    except RuntimeError as e:
        error = f"{type(e).__name__}: {e}"
    json.dump({"answer": answer, "ext": mmcv._ext.__name__, "error": error,
               "again": opbridge.compat.install("mmcv")}, open(sys.argv[1], "w"))
''')


@pytest.mark.environments
def test_install_gives_mmcv_lite_its_extension_and_mmdet_imports(mmdet_python, tmp_path):
    r = _run(mmdet_python, ["-c", INSTALL, str(tmp_path / "out.json")])
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["answer"] == {"mmcv": "extension", "mmdet": "extension"}
    assert out["ext"] == "opbridge.compat.mmcv._ext"
    # A function opbridge does not provide: an error when called, naming it, its caller and what to do.
    assert out["error"].startswith("NotProvidedError: mmcv._ext.bbox_overlaps (called by mmcv.ops.bbox)"), out["error"]
    assert "docs/adding-an-op.md" in out["error"]
    assert out["again"] == {"mmcv": "extension", "mmdet": "extension"}


# config -> (the opbridge nodes its tensor-mode export must hold, whether the dynamo exporter can
# export it: None, or the text its refusal must name; docs/models.md says why)
NAMED = {
    "faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py": ({"opbridge::RoiAlign", "opbridge::Nms"}, "valid_mask.all()"),
    "dcnv2/faster-rcnn_r50-mdconv-c3-c5_fpn_1x_coco.py": ({"opbridge::RoiAlign", "opbridge::Nms"}, "valid_mask.all()"),
    "mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py": ({"opbridge::RoiAlign", "opbridge::Nms"}, "valid_mask.all()"),
    "deformable_detr/deformable-detr_r50_16xb2-50e_coco.py": ({"opbridge::MultiScaleDeformableAttention"},
                                                              "data is not allocated"),
    "carafe/faster-rcnn_r50_fpn-carafe_1x_coco.py": ({"opbridge::Carafe", "opbridge::RoiAlign"}, "valid_mask.all()"),
    "retinanet/retinanet_r50_fpn_1x_coco.py": (set(), None),
}


def _report(python: Path, config: str, tmp_path: Path, *flags: str) -> dict:
    out = tmp_path / "report.json"
    r = _run(python, [str(RUNNER), config, str(out), *flags])
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.environments
@pytest.mark.parametrize("config", list(NAMED))
def test_named_mmdet_model_predicts_and_exports_matching_eager(mmdet_python, config, tmp_path):
    nodes, dynamo_refusal = NAMED[config]
    report = _report(mmdet_python, config, tmp_path)
    assert report["build"] == "ok" and report["predict"] == "ok", report
    assert report["missing"] == [], report
    exported = report["torchscript"]
    assert isinstance(exported, dict), exported
    assert nodes <= set(exported["nodes"]), exported
    assert exported["grid_samples"] == 0
    assert exported["max_rel_diff"] < 1e-4 and exported["integer_mismatches"] == 0, exported
    # Proposals whose scores differ in the seventh digit may change places (or, overlapping, which
    # of them the RPN's NMS keeps) between two runtimes' roundings: a proposal or two of 1000.
    assert exported["differing_rows"] <= 2, exported
    # The same model in OpenVINO, held to the same bar.
    in_openvino = exported["openvino"]
    assert isinstance(in_openvino, dict), in_openvino
    assert in_openvino["max_rel_diff"] < 1e-4 and in_openvino["integer_mismatches"] == 0, in_openvino
    assert in_openvino["differing_rows"] <= 2, in_openvino
    if dynamo_refusal is None:
        exported = report["dynamo"]
        assert isinstance(exported, dict), exported
        assert exported["max_rel_diff"] < 1e-4 and exported["integer_mismatches"] == 0, exported
        assert exported["differing_rows"] <= 2, exported
    else:  # refused, naming the model's line that reads a value torch.export cannot trace
        assert isinstance(report["dynamo"], str) and dynamo_refusal in report["dynamo"], report["dynamo"]


@pytest.mark.environments
def test_retinanet_exports_end_to_end_boxes_scores_and_labels_after_nms(mmdet_python, tmp_path):
    report = _report(mmdet_python, "retinanet/retinanet_r50_fpn_1x_coco.py", tmp_path, "torchscript", "--end-to-end")
    assert report["predict"] == "ok" and report["detections"] > 0, report
    exported = report["torchscript"]
    assert isinstance(exported, dict), exported
    assert "opbridge::Nms" in exported["nodes"] and exported["outputs"] == 3
    # boxes (k, 4), scores (k,), labels (k,): k is decided by the NMS when the model runs
    assert all(isinstance(dims[0], str) for dims in exported["output_dims"]), exported["output_dims"]
    assert exported["max_rel_diff"] < 1e-4 and exported["integer_mismatches"] == 0, exported
    assert exported["differing_rows"] == 0 and exported["reordered_rows"] == 0, exported
    # OpenVINO's convolutions round otherwise: two detections whose scores differ in the seventh
    # digit may change places, and their labels with them (compared in place).
    in_openvino = exported["openvino"]
    assert isinstance(in_openvino, dict) and in_openvino["max_rel_diff"] < 1e-4, in_openvino
    assert in_openvino["differing_rows"] == 0 and in_openvino["reordered_rows"] <= 2, in_openvino
    assert in_openvino["integer_mismatches"] <= in_openvino["reordered_rows"], in_openvino


# mmdet's SingleRoIExtractor pools a pyramid level only where the example's RoIs reach it: traced
# as is, a level the example left empty yields zeros at every other input. opbridge's rule
# (compat/mmdet/roi_extractor.py) pools every level; the plain trace shows what it mends.
ROI_LEVELS = textwrap.dedent('''
    import json, sys
    import numpy as np, torch
    import opbridge, opbridge.compat
    opbridge.compat.install("mmcv")
    from mmdet.models.roi_heads.roi_extractors import SingleRoIExtractor
    from opbridge.compat.mmdet.roi_extractor import TARGET
    torch.manual_seed(0)
    ext = SingleRoIExtractor(roi_layer=dict(type="RoIAlign", output_size=7, sampling_ratio=0),
                             out_channels=8, featmap_strides=[4, 8, 16, 32]).eval()
    feats = tuple(torch.randn(2, 8, 128 // s, 128 // s) for s in (1, 2, 4, 8))
    def rois(sides):  # one RoI per side length: levels 0..3 from 56 * 2 ** (level + 1)
        n = len(sides)
        x1, y1 = torch.rand(n) * 100, torch.rand(n) * 100
        side = torch.tensor(sides, dtype=torch.float)
        return torch.stack([torch.arange(n) % 2, x1, y1, x1 + side, y1 + side], 1).float()
    examples = {"level 0 only": rois([20, 30, 40, 50]), "one at level 2": rois([20, 30, 300, 50])}
    every_level = rois([20, 150, 300, 600, 40, 160, 320, 700, 80])
    want = ext(feats, every_level).numpy()
    names = ["f0", "f1", "f2", "f3", "rois"]
    out = {}
    for name, example in examples.items():
        path = sys.argv[1] + name.replace(" ", "_") + ".onnx"
        opbridge.export(ext, (feats, example), path, exporter="torchscript", input_names=names,
                        dynamic_axes={"rois": {0: "k"}}, check_args=(feats, every_level))
        s = opbridge.session(path)
        got = s.run(None, dict(zip(names, [f.numpy() for f in feats] + [every_level.numpy()])))[0]
        row = np.abs(got - want).reshape(len(want), -1).max(1)
        out[name] = {"max": float(row.max()), "scale": float(np.abs(want).max())}
    # The same export with mmdet's own forward (the rule set to the original): the proof at the
    # second input must refuse it.
    opbridge.substitute(TARGET, SingleRoIExtractor.forward)
    for name, example in examples.items():
        try:
            opbridge.export(ext, (feats, example), None, exporter="torchscript", input_names=names,
                            dynamic_axes={"rois": {0: "k"}}, check_args=(feats, every_level))
            out[name]["unruled"] = "exported"
        except opbridge.OpbridgeError as e:
            out[name]["unruled"] = str(e)
    json.dump(out, open(sys.argv[1] + "out.json", "w"))
''')


@pytest.mark.environments
def test_roi_extractor_pools_every_level_at_any_input(mmdet_python, tmp_path):
    r = _run(mmdet_python, ["-c", ROI_LEVELS, str(tmp_path) + "/"])
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads((tmp_path / "out.json").read_text())
    for name, got in out.items():
        # opbridge's export: every RoI as eager pools it, whichever levels the example reached
        assert got["max"] <= 1e-5 * got["scale"], (name, got)
    # Without the rule the trace keeps the example's branches: the levels the example left empty
    # give zero rows (7 of the 9 RoIs sit there), and one RoI at a level bakes a reshape; the proof
    # at the second input refuses both exports.
    for name, got in out.items():
        assert got["unruled"] != "exported" and "rois" in got["unruled"], (name, got["unruled"][:2000])


# mmcv's CornerPool (CornerNet, CentripetalNet) runs torch.cummax, which neither exporter
# translates; opbridge's rule (compat/mmcv/corner_pool.py) runs opbridge::corner_pool with the
# module's mode.
CORNER_POOL = textwrap.dedent('''
    import json, sys
    import numpy as np, torch
    import opbridge, opbridge.compat
    opbridge.compat.install("mmcv")
    from mmcv.ops import CornerPool
    out = {}
    for mode in ("top", "bottom", "left", "right"):
        pool = CornerPool(mode).eval()
        x, x2 = torch.randn(1, 4, 9, 11), torch.randn(2, 4, 14, 6)
        with torch.no_grad():
            want, want2 = pool(x), pool(x2)
            with opbridge.substitutions(pool):
                same = bool(torch.equal(pool(x), want))
        proto = opbridge.export(pool, (x,), None, exporter="torchscript", input_names=["x"],
                                dynamic_axes={"x": {0: "n", 2: "h", 3: "w"}}, check_args=(x2,))
        s = opbridge.session(proto)
        got, got2 = (s.run(None, {"x": a.numpy()})[0] for a in (x, x2))
        out[mode] = {"same_eager": same, "nodes": [n.op_type for n in proto.graph.node],
                     "equal": bool(np.array_equal(got, want.numpy())), "equal2": bool(np.array_equal(got2, want2.numpy()))}
    # Without the rule (set to mmcv's own forward) the export meets torch.cummax.
    opbridge.substitute("mmcv.ops.corner_pool.CornerPool.forward", CornerPool.forward)
    try:
        opbridge.export(CornerPool("top").eval(), (torch.randn(1, 4, 9, 11),), None, exporter="torchscript")
        out["unruled"] = "exported"
    except Exception as e:
        out["unruled"] = str(e)
    json.dump(out, open(sys.argv[1], "w"))
''')


@pytest.mark.environments
def test_mmcv_corner_pool_exports_as_opbridge_corner_pool(mmdet_python, tmp_path):
    r = _run(mmdet_python, ["-c", CORNER_POOL, str(tmp_path / "out.json")])
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads((tmp_path / "out.json").read_text())
    for mode in ("top", "bottom", "left", "right"):
        got = out[mode]
        # One opbridge node, equal to mmcv's eager output at the example and at a second size
        # (other batch, height and width), and the substitution's eager output equal to mmcv's.
        assert got["nodes"] == ["CornerPool"], (mode, got)
        assert got["same_eager"] and got["equal"] and got["equal2"], (mode, got)
    assert "cummax" in out["unruled"], out["unruled"][:2000]
