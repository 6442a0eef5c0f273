"""A whole Deformable DETR encoder layer in ONNX Runtime, with its multi-scale deformable attention
as the opbridge node (the subject) or as the pure-PyTorch grid_sample path, both exported by
opbridge.export: d_model 256, 8 heads, 4 levels, 4 points, FFN 1024, float32, batch 1, at an
800x1200 input (S = Q = 19 947) and at 512x512 (S = Q = 5 440), on 1 and 2 threads.

The layer is Deformable DETR's: value projection; sampling offsets and attention weights (a
softmax over levels and points) from the query; sampling locations around each query's reference
point, offsets divided by the level's size; the attention; output projection, residual and layer
norm; the FFN (linear, ReLU, linear), residual and layer norm. Weights are random, scaled as the
model initialises them (small offsets: a few pixels). Both rows run the same projections, so the
ratio shows what the attention is of the whole layer.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from bench_multi_scale_deformable_attention import every_case, grid_sample_path
from common import Row, interleaved, ort_session, progress

SUBJECT = "encoder layer, opbridge node (ONNX Runtime)"
D_MODEL, HEADS, POINTS, FFN = 256, 8, 4, 1024


class EncoderLayer(torch.nn.Module):
    def __init__(self, levels, fused: bool):
        super().__init__()
        torch.manual_seed(0)
        n_levels = len(levels)
        self.levels, self.fused = levels, fused
        shapes = torch.tensor(levels)
        areas = shapes[:, 0] * shapes[:, 1]
        self.register_buffer("shapes", shapes)
        self.register_buffer("starts", torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]]))
        self.register_buffer("normalizer", torch.tensor([[w, h] for h, w in levels], dtype=torch.float32))
        self.value_proj = torch.nn.Linear(D_MODEL, D_MODEL)
        self.sampling_offsets = torch.nn.Linear(D_MODEL, HEADS * n_levels * POINTS * 2)
        self.attention_weights = torch.nn.Linear(D_MODEL, HEADS * n_levels * POINTS)
        self.output_proj = torch.nn.Linear(D_MODEL, D_MODEL)
        self.norm1, self.norm2 = torch.nn.LayerNorm(D_MODEL), torch.nn.LayerNorm(D_MODEL)
        self.fc1, self.fc2 = torch.nn.Linear(D_MODEL, FFN), torch.nn.Linear(FFN, D_MODEL)
        with torch.no_grad():  # offsets of a few pixels, as the trained model's
            self.sampling_offsets.weight.mul_(0.05)
            self.sampling_offsets.bias.uniform_(-2, 2)

    def forward(self, hidden, reference_points):
        b, s, _ = hidden.shape
        n_levels = len(self.levels)
        value = self.value_proj(hidden).view(b, s, HEADS, D_MODEL // HEADS)
        offsets = self.sampling_offsets(hidden).view(b, s, HEADS, n_levels, POINTS, 2)
        weights = F.softmax(self.attention_weights(hidden).view(b, s, HEADS, n_levels * POINTS), -1)
        weights = weights.view(b, s, HEADS, n_levels, POINTS)
        locations = reference_points[:, :, None, :, None, :] + offsets / self.normalizer[None, None, None, :, None, :]
        if self.fused:
            attended = torch.ops.opbridge.multi_scale_deformable_attention(value, self.shapes, self.starts, locations,
                                                                           weights)
        else:
            attended = grid_sample_path(value, self.levels, locations, weights)
        hidden = self.norm1(hidden + self.output_proj(attended))
        return self.norm2(hidden + self.fc2(F.relu(self.fc1(hidden))))


def encoder_inputs(levels):
    """Hidden states, and each position's reference point (its pixel centre) on every level."""
    s = sum(h * w for h, w in levels)
    rng = np.random.default_rng(0)
    hidden = torch.from_numpy(rng.standard_normal((1, s, D_MODEL), dtype=np.float32))
    refs = np.concatenate([np.stack(np.meshgrid((np.arange(w) + 0.5) / w, (np.arange(h) + 0.5) / h), -1).reshape(-1, 2)
                           for h, w in levels]).astype(np.float32)
    reference = torch.from_numpy(np.repeat(refs[None, :, None, :], len(levels), axis=2))
    return hidden, reference


def _case(label: str, levels, threads: int, quick: bool) -> list[Row]:
    import opbridge

    args = encoder_inputs(levels)
    names = ["hidden", "reference_points"]
    feeds = {n: a.numpy() for n, a in zip(names, args)}
    fused, path = EncoderLayer(levels, True).eval(), EncoderLayer(levels, False).eval()
    with torch.no_grad():
        want = path(*args).numpy()
        np.testing.assert_allclose(fused(*args).numpy(), want, rtol=1e-4, atol=1e-4)
    sessions = {}
    for key, model in (("fused", fused), ("path", path)):
        sessions[key] = ort_session(opbridge.export(model, args, input_names=names), threads=threads, spinning=False)
        np.testing.assert_allclose(sessions[key].run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)
    name = (f"Deformable DETR encoder layer in ONNX Runtime {label} S=Q={args[0].shape[1]} d_model=256 H=8 L=4 P=4 "
            f"FFN=1024 float32, {threads} thread{'s' if threads > 1 else ''}")
    impls = {SUBJECT: lambda: sessions["fused"].run(None, feeds),
             "encoder layer, grid_sample path exported": lambda: sessions["path"].run(None, feeds)}
    progress(name)
    return interleaved(name, impls, rounds=3 if quick else 8, warmup=1, max_seconds=180)


def run(quick: bool) -> list[Row]:
    return every_case(_case, quick)
