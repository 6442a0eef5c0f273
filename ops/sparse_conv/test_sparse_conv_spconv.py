"""A second opinion: spconv 2.3.8's CPU path (its own environment, tests/python/test_spconv.py) and
the sparse convolution ops compute the same SECOND-style encoder (bench_sparse_conv.py: SubM and
strided layers, 16 -> 32 -> 64 channels, rulebooks shared by indice_key) on the same voxels and
weights: the same output sites, the same features site by site."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

SCRIPT = '''
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
from bench_sparse_conv import Spconv, lidar_voxels, ours, weights
torch.set_num_threads(1)  # spconv's CPU path gives other results on two threads
idx = lidar_voxels(3000, seed=5)
x = torch.randn(len(idx), 16, generator=torch.Generator().manual_seed(2))
ws = weights(3)
with torch.no_grad():
    a, ai = ours(x, idx, ws)
    b = Spconv(ws).eval()(x, idx)
rows = {tuple(r): i for i, r in enumerate(ai.tolist())}
same_sites = sorted(rows) == sorted(map(tuple, b.indices.tolist()))
order = torch.tensor([rows.get(tuple(r), 0) for r in b.indices.tolist()])
json.dump({"sites": len(ai), "same_sites": same_sites, "scale": b.features.abs().max().item(),
           "difference": (a[order] - b.features).abs().max().item()}, open(sys.argv[2], "w"))
'''


@pytest.mark.environments
def test_spconv_computes_the_same_encoder(tmp_path):
    sys.path.insert(0, str(HERE.parents[1] / "tests" / "python"))
    import envs
    from test_spconv import SPCONV

    python = envs.python_with("spconv-2.3.8", SPCONV, on_top=True)
    run = subprocess.run([str(python), "-c", SCRIPT, str(HERE), str(tmp_path / "out.json")], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["same_sites"] and out["sites"] > 100, out
    assert out["difference"] <= 1e-5 * out["scale"] + 1e-7, out
