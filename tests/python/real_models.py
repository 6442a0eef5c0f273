"""Real models from PyPI, run in the environment tests/python/envs.py makes for their package:

    python real_models.py <model> <report.json>

builds the model with random weights in eval mode (its code untouched), exports it with both
exporters through opbridge.export (which applies the substitutions), runs each export in ONNX
Runtime and writes a report: per exporter, the largest differences to eager (the model's own
path, and on opbridge's ops), the opbridge nodes written, and the median times of eager and ONNX
Runtime. tests/python/test_models.py judges the report.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import traceback

import numpy as np
import torch

import opbridge


def deformable_detr():
    """transformers' DeformableDetrModel, small: a ResNet backbone of transformers' own (no timm,
    nothing downloaded), two feature levels plus one, one encoder and one decoder layer."""
    from transformers import DeformableDetrConfig, DeformableDetrModel, ResNetConfig

    torch.manual_seed(0)
    backbone = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                            out_features=["stage2", "stage3", "stage4"])
    config = DeformableDetrConfig(d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                                  decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=20,
                                  backbone_config=backbone, use_pretrained_backbone=False, use_timm_backbone=False)
    model = DeformableDetrModel(config).eval()
    pixels = torch.rand(1, 3, 128, 160, generator=torch.Generator().manual_seed(1))

    class Outputs(torch.nn.Module):
        """The model's tensors as a tuple (its ModelOutput is a dict with optional entries)."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, pixel_values):
            out = self.inner(pixel_values=pixel_values)
            return out.last_hidden_state, out.encoder_last_hidden_state

    return Outputs(model), (pixels,), ["last_hidden_state", "encoder_last_hidden_state"]


MODELS = {"deformable_detr": deformable_detr}


def _median_ms(fn, runs: int = 5) -> float:
    fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main(name: str, report_path: str) -> None:
    model, args, names = MODELS[name]()
    with torch.no_grad():
        original = [t.numpy() for t in model(*args)]
        with opbridge.substitutions():
            substituted = [t.numpy() for t in model(*args)]
        eager_ms = _median_ms(lambda: model(*args))
    report = {"model": name, "opbridge": opbridge.__version__, "eager_ms": eager_ms,
              "eager_substituted_vs_original": max(float(np.abs(a - b).max()) for a, b in zip(substituted, original)),
              "exports": {}}
    for exporter in opbridge.EXPORTERS:
        entry = report["exports"][exporter] = {}
        try:
            proto = opbridge.export(model, args, exporter=exporter, input_names=["pixel_values"], output_names=names)
            sess = opbridge.session(proto)
            feeds = {"pixel_values": args[0].numpy()}
            got = sess.run(None, feeds)
            entry["nodes"] = sorted({f"{n.domain}::{n.op_type}" for n in proto.graph.node
                                     if n.domain.startswith("opbridge")})
            entry["grid_samples"] = sum(n.op_type == "GridSample" for n in proto.graph.node)
            entry["vs_original"] = max(float(np.abs(g - w).max()) for g, w in zip(got, original))
            entry["vs_substituted"] = max(float(np.abs(g - w).max()) for g, w in zip(got, substituted))
            entry["scale"] = max(float(np.abs(w).max()) for w in original)
            entry["ort_ms"] = _median_ms(lambda: sess.run(None, feeds))
        except Exception as e:  # the report says what failed; the test decides
            entry["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
    with open(report_path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
