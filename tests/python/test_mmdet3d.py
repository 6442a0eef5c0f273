"""OpenMMLab's LiDAR detectors on opbridge: mmdet3d 1.4.0 with mmcv-lite (mmcv without its compiled
extension), mmdet 3.3.0 and mmengine 0.10.7, installed into an environment of their own
(tests/python/envs.py), their code untouched. opbridge.compat.install("mmcv") provides `mmcv._ext`
(the voxelization, the sparse convolutions, the 3-D boxes' ops); the named models build from the
configs in the mmdet3d wheel, predict eagerly from a raw cloud, and export from raw points as one
ONNX model (tests/python/mmdet3d_models.py runs each)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import envs
from test_mmdet import MMDET

pytestmark = pytest.mark.environments

RUNNER = Path(__file__).with_name("mmdet3d_models.py")
# What mmdet3d 1.4.0 imports beyond mmdet's environment, each named (installed without its own
# dependencies, so no other torch is pulled).
DEPENDENCIES = ["numba", "llvmlite", "pyquaternion", "lyft_dataset_sdk", "pandas", "scikit-learn", "nuscenes-devkit",
                "trimesh", "joblib", "threadpoolctl", "cloudpickle", "narwhals", "cachetools"]
MMDET3D = [*MMDET[:-1], "mmdet3d==1.4.0", *DEPENDENCIES, "--no-deps"]

# config: the opbridge nodes its raw-points export holds, and for an exporter that cannot export
# it, what opbridge.export says instead.
NAMED = {
    "pointpillars/pointpillars_hv_secfpn_8xb6-160e_kitti-3d-car.py": (
        {"opbridge::HardVoxelize"},
        # PillarFeatureNet (legacy=True, the default) writes the pillar-centre offsets into its
        # input through a view; the TorchScript exporter's graph loses that write. The export is
        # refused at the example instead of writing a wrong model.
        {"torchscript": "loses writes made through a view"}),
    "second/second_hv_secfpn_8xb6-80e_kitti-3d-car.py": (
        {"opbridge::HardVoxelize", "opbridge::SparseIndicePairs", "opbridge::SparseIndiceConv"}, {}),
}


@pytest.fixture(scope="module")
def mmdet3d_python():
    return envs.python_with("mmdet3d-1.4.0", MMDET3D, on_top=True)


def _report(python: Path, config: str, tmp_path: Path, *exporters: str) -> dict:
    out = tmp_path / "report.json"
    r = subprocess.run([str(python), str(RUNNER), config, str(out), *exporters], capture_output=True, text=True,
                       timeout=1500, env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)})
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("config", sorted(NAMED))
def test_named_mmdet3d_model_predicts_and_exports_from_raw_points(mmdet3d_python, config, tmp_path):
    nodes, refused = NAMED[config]
    report = _report(mmdet3d_python, config, tmp_path)
    assert report["build"] == "ok" and report["predict"] == "ok" and report["detections"] > 0, report
    for exporter in ("torchscript", "dynamo"):
        exported = report[exporter]
        if exporter in refused:
            assert isinstance(exported, str) and refused[exporter] in exported, exported
            continue
        assert isinstance(exported, dict), (exporter, exported, report.get(exporter + "_trace"))
        assert nodes <= set(exported["nodes"]), exported
        # The point count is dynamic (proven by opbridge.export at a second count) and each runtime
        # equals eager at two more, and at an empty cloud.
        assert exported["point_counts"] == [12_000, 17_000] and exported["output_spread"] > 0.05, exported
        assert exported["empty_cloud"] == "compared", exported
        for runtime in (exported, exported["openvino"]):
            assert isinstance(runtime, dict), runtime
            assert runtime["max_rel_diff"] < 1e-4 and runtime["integer_mismatches"] == 0, exported
