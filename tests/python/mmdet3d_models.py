"""mmdet3d 1.4.0 LiDAR detectors built from the configs its wheel ships, on mmcv-lite with opbridge's
`mmcv._ext` (opbridge.compat.install("mmcv")), run in the environment tests/python/envs.py makes:

    python mmdet3d_models.py <config, relative to mmdet3d's configs/> <report.json> [exporter ...] [--timing]

The model is built with random weights (nothing downloaded), in eval mode, its code untouched. A
random cloud of 10-20k points in the config's point-cloud range: `mode="predict"` eagerly (the
data preprocessor's voxelization, the detector, the head's decoding and 3-D NMS), then the model
from raw points (RawPoints: points -> voxelization -> voxel encoder -> middle encoder -> backbone
-> neck -> head, the head's tensors out) exported through opbridge.export with each exporter asked
for (default both), the point count dynamic and proven at a second count, and run in ONNX Runtime
against eager at two other clouds and an empty one (and in OpenVINO). --timing adds eager and ONNX Runtime times on
the 17k-point cloud in 7 interleaved rounds. The report says, per stage, "ok" or the error's first
lines.
tests/python/test_mmdet3d.py and scripts/mmdet3d_sweep.py read it.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
import warnings
from pathlib import Path

import numpy as np
import torch

import opbridge
import opbridge.compat
from mmdet_models import calibrate_norms, error_text, interleaved_ms, leaves, missing_functions

COUNTS = (12_000, 17_000)  # the clouds compared; the export's example has 15k, its proof 10k
KITTI_RANGE = [0, -40, -3, 70.4, 40, 1]  # for a model whose data preprocessor does not voxelize


def configs_dir() -> Path:
    import mmdet3d
    return Path(mmdet3d.__file__).parent / ".mim" / "configs"


def build(config: str):
    """The detector of `config` with random weights, in eval mode, and its voxelization's range."""
    from mmengine.config import Config
    from mmengine.logging import MMLogger

    from mmdet3d.registry import MODELS
    from mmdet3d.utils import register_all_modules
    register_all_modules()
    MMLogger.get_current_instance().setLevel(logging.ERROR)
    cfg = Config.fromfile(str(configs_dir() / config))
    torch.manual_seed(0)
    model = MODELS.build(cfg.model).eval()
    layer = cfg.model.data_preprocessor.get("voxel_layer") or {}
    model.cloud_spec = (list(layer.get("point_cloud_range", KITTI_RANGE)), _channels(cfg.model))
    # Random weights with default statistics shrink a sparse encoder's features to 1e-14 (the
    # head then gives its biases, the same in any runtime): statistics from a cloud instead.
    if is_detector(model):
        raw = RawPoints(model)
        calibrate_norms(model, lambda: eager(raw, cloud(COUNTS[0], model.cloud_spec, 0)))
    return model, model.cloud_spec


def is_detector(model) -> bool:
    """A detector with one head (what RawPoints exports): not a segmentor, nor a two-stage detector."""
    return any(hasattr(model, head) for head in ("bbox_head", "pts_bbox_head"))


def _not_run(model) -> str:
    if hasattr(model, "decode_head"):
        return "not run: a 3-D segmentor (a decode head); this runner takes detectors"
    return ("not exported: a two-stage 3-D detector (an RPN head, then an RoI head that reads the points and the "
            "proposals); this runner exports a one-stage detector's head")


def _channels(cfg) -> int:
    """The point features the model reads: x, y, z and intensity (KITTI), or more (nuScenes' sweeps
    add a time offset), as the first encoder declares."""
    for key in ("voxel_encoder", "pts_voxel_encoder", "backbone", "pts_backbone"):
        channels = (cfg.get(key) or {}).get("in_channels")
        if isinstance(channels, int) and 3 <= channels <= 8:
            return channels
    return 4


def cloud(n: int, spec: tuple[list[float], int], seed: int) -> torch.Tensor:
    """n points (x, y, z, then intensity and any other feature in [0, 1]) uniform in the range of
    spec = (range, channels), a few per cent outside it (dropped by the voxelization, as a real
    scan's are)."""
    point_range, channels = spec
    g = np.random.default_rng(seed)
    low, high = np.array(point_range[:3]), np.array(point_range[3:])
    pad = 0.03 * (high - low)
    xyz = g.uniform(low - pad, high + pad, size=(n, 3))
    return torch.from_numpy(np.concatenate([xyz, g.uniform(0, 1, (n, channels - 3))], 1).astype(np.float32))


def _samples():
    from mmdet3d.structures import Det3DDataSample, LiDARInstance3DBoxes
    return [Det3DDataSample(metainfo={"box_type_3d": LiDARInstance3DBoxes, "box_mode_3d": 0})]


def eager(model, *args):
    """model(*args) eagerly as it is exported: with opbridge's substitution rules applied, since some
    of mmcv's Python (furthest_point_sample, knn) allocates CUDA tensors and runs only through them."""
    with opbridge.substitutions(model), torch.no_grad():
        return model(*args)


def predict(model, points: torch.Tensor):
    data = model.data_preprocessor({"inputs": {"points": [points]}, "data_samples": _samples()}, False)
    with opbridge.substitutions(model), torch.no_grad():
        found = model(**data, mode="predict")[0].pred_instances_3d
    return found.bboxes_3d.tensor, found.scores_3d, found.labels_3d


class RawPoints(torch.nn.Module):
    """One cloud's points (N, C) -> the head's tensors, flattened, as one function: the data
    preprocessor's voxelization, the detector's feature extraction and its head's forward."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.eval()  # the wrapper too: an exporter restores the mode it found, recursively

    def forward(self, points):
        m = self.model
        if not m.data_preprocessor.voxel:  # a point-based detector
            return leaves(m.bbox_head(m.extract_feat({"points": [points]})))
        voxels = m.data_preprocessor.voxelize([points], _samples())
        # The LiDAR branch of VoxelNet / DynamicVoxelNet / MVXTwoStageDetector.extract_feat, line
        # for line, but for the batch size: they read it from the data (coors[-1, 0] + 1, with
        # .item() in the first two) and loop over it; one cloud is a batch of one.
        p = "pts_" if hasattr(m, "pts_voxel_encoder") else ""
        encoder, middle = getattr(m, p + "voxel_encoder", None), getattr(m, p + "middle_encoder", None)
        if encoder is None or middle is None:
            return leaves(m.bbox_head(m.extract_feat({"voxels": voxels})))
        if "num_points" in voxels:  # hard voxelization: (voxels, points per voxel, coordinates)
            features, coors = encoder(voxels["voxels"], voxels["num_points"], voxels["coors"]), voxels["coors"]
        else:  # dynamic: a voxel coordinate per point; the encoder reduces them to voxels
            features, coors = encoder(voxels["voxels"], voxels["coors"])
        x = getattr(m, p + "backbone")(middle(features, coors, 1))
        if getattr(m, f"with_{p}neck"):
            x = getattr(m, p + "neck")(x)
        return leaves(getattr(m, p + "bbox_head")(x))


def _against_eager(session, cases: list) -> dict:
    """How `session` (either runtime) agrees with eager on each (points, eager outputs) case."""
    worst, integer_mismatches = 0.0, 0
    for points, expected in cases:
        got = session.run(None, {"points": points.numpy()})
        assert len(got) == len(expected), (len(got), len(expected))
        for g, e in zip(got, expected):
            assert g.shape == e.shape and g.dtype == e.dtype, (g.shape, e.shape, g.dtype, e.dtype)
            if not e.size:
                continue
            if e.dtype.kind in "iub":
                integer_mismatches += int((g != e).sum())
                continue
            scale = max(float(np.abs(e).max()), 1e-6)
            worst = max(worst, float(np.abs(g.astype(np.float64) - e).max()) / scale)
    return {"max_rel_diff": worst, "integer_mismatches": integer_mismatches}


def export_and_compare(model, spec, exporter: str, workdir: Path, timing: bool = False) -> dict:
    import onnx
    path = workdir / f"model_{exporter}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opbridge.export(model, (cloud(15_000, spec, 1),), str(path), exporter=exporter,
                        input_names=["points"], dynamic_axes={"points": {0: "points"}},
                        check_args=(cloud(10_000, spec, 2),))
    graph = onnx.load(str(path), load_external_data=False).graph
    nodes = sorted({f"{n.domain}::{n.op_type}" for n in graph.node if n.domain not in ("", "ai.onnx")})
    cases = []
    for i, n in enumerate(COUNTS):
        points = cloud(n, spec, 10 + i)
        cases.append((points, [t.numpy() for t in leaves(eager(model, points))]))
    # The smallest spread of an output: near 0, the head gave its biases and nothing was compared.
    spread = min(float(np.std(e)) for _, expected in cases for e in expected if e.size)
    empty = torch.zeros(0, spec[1])  # no point at all: no voxel, the graph still runs
    try:
        cases.append((empty, [t.numpy() for t in leaves(eager(model, empty))]))
        empty_cloud = "compared"
    except Exception as e:  # noqa: BLE001 - a model's own code indexes the last voxel, or samples points
        empty_cloud = "eager fails: " + error_text(e).splitlines()[0]
    report = {"nodes": nodes, "outputs": len(graph.output), "point_counts": list(COUNTS), "output_spread": spread,
              "empty_cloud": empty_cloud, **_against_eager(opbridge.session(str(path)), cases)}
    try:  # the same model in the second runtime
        report["openvino"] = _against_eager(opbridge.session(str(path), runtime="openvino"), cases)
    except Exception as e:  # noqa: BLE001 - reported
        report["openvino"] = error_text(e)
    if timing:
        report.update(interleaved_ms(model, (cases[1][0],), opbridge.session(str(path)), ["points"], rounds=7))
    return report


def run(config: str, exporters: tuple[str, ...], workdir: Path, timing: bool = False) -> dict:
    report: dict = {"config": config}
    opbridge.compat.install("mmcv")
    try:
        model, spec = build(config)
        report["build"] = "ok"
    except Exception as e:  # noqa: BLE001 - reported
        report["build"] = error_text(e)
        return missing_functions(report)
    if hasattr(model, "decode_head"):
        report["predict"] = _not_run(model)
        return missing_functions(report)
    try:
        boxes, scores, labels = predict(model, cloud(COUNTS[0], spec, 0))
        report["predict"] = "ok"
        report["detections"] = int(boxes.shape[0])
    except Exception as e:  # noqa: BLE001 - reported
        report["predict"] = error_text(e)
        report["predict_trace"] = traceback.format_exc()[-3000:]
    raw = RawPoints(model)
    for exporter in exporters:
        if not is_detector(model):
            report[exporter] = _not_run(model)
            continue
        try:
            report[exporter] = export_and_compare(raw, spec, exporter, workdir, timing)
        except Exception as e:  # noqa: BLE001 - reported
            report[exporter] = error_text(e)
            report[exporter + "_trace"] = traceback.format_exc()[-3000:]
    return missing_functions(report)


def main(argv: list[str]) -> None:
    import tempfile
    config, out = argv[0], Path(argv[1])
    exporters = tuple(a for a in argv[2:] if not a.startswith("--")) or ("torchscript", "dynamo")
    with tempfile.TemporaryDirectory() as tmp:
        report = run(config, exporters, Path(tmp), "--timing" in argv)
    out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
