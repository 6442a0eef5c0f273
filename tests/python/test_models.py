"""Real models nobody here wrote, installed from PyPI into an environment made for them
(tests/python/envs.py: on top of this one, cached; skipped, saying why, when the package index
cannot be reached), run with their code untouched by tests/python/real_models.py.

transformers' Deformable DETR: its MultiScaleDeformableAttention module's forward (the grid_sample
path) is replaced, by the rule multi_scale_deformable_attention's definition declares, with one
opbridge node, in both exporters; ONNX Runtime then equals eager within float32 rounding.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import envs

RUNNER = Path(__file__).with_name("real_models.py")
TRANSFORMERS = ["transformers==5.23.0"]


def _report(python: Path, model: str, tmp_path: Path) -> dict:
    out = tmp_path / f"{model}.json"
    r = subprocess.run([str(python), str(RUNNER), model, str(out)], capture_output=True, text=True, timeout=900,
                       env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""})
    assert r.returncode == 0, f"{model} failed:\n{r.stdout}{r.stderr[-5000:]}"
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def deformable_detr(tmp_path_factory):
    python = envs.python_with("transformers-5.23", TRANSFORMERS, on_top=True)
    return _report(python, "deformable_detr", tmp_path_factory.mktemp("models"))


def test_deformable_detr_runs_eagerly_on_the_fused_op(deformable_detr):
    # The substituted model equals the model's own grid_sample path within float32 rounding.
    assert deformable_detr["eager_substituted_vs_original"] < 1e-4


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_deformable_detr_exports_one_node_per_attention_and_matches_eager(deformable_detr, exporter):
    entry = deformable_detr["exports"][exporter]
    assert "error" not in entry, entry.get("error")
    assert entry["nodes"] == ["opbridge::MultiScaleDeformableAttention"]
    assert entry["grid_samples"] == 0
    # Outputs of layer norms (scale about 4): a few float32 roundings per op over two layers.
    assert entry["vs_substituted"] < 1e-4 * max(1.0, entry["scale"]), entry
    assert entry["vs_original"] < 1e-4 * max(1.0, entry["scale"]), entry
