"""Real models from PyPI, run in the environment tests/python/envs.py makes for their package:

    python real_models.py <model> <report.json>

builds the model with random weights in eval mode (its code untouched), exports it with both
exporters through opbridge.export (which applies the substitutions), runs each export in ONNX
Runtime and writes a report: per exporter, the largest differences to eager (the model's own
path where it can run on a CPU, and on opbridge's ops), the opbridge nodes written, and eager (on
opbridge's ops) and ONNX Runtime timed in interleaved rounds (medians, and the median ratio with
its spread). tests/python/test_models.py judges it.
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
from opbridge._library.kinds import tensor_leaves


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


def _openpoints(model_cfg: dict):
    from openpoints.models import build_model_from_cfg
    from openpoints.utils import EasyConfig

    torch.manual_seed(0)
    cfg = EasyConfig()
    cfg.update({"model": model_cfg})
    return build_model_from_cfg(cfg.model).eval()


# PointNet++'s set abstraction as openpoints configures it: FPS, ball query, grouping, a shared
# MLP and max pooling per stage (its own configs, smaller).
_SA = {"NAME": "PointNet2Encoder", "width": None, "layers": 3, "use_res": False, "sampler": "fps",
       "aggr_args": {"NAME": "convpool", "feature_type": "dp_fj", "anisotropic": False, "reduction": "max"},
       "group_args": {"NAME": "ballquery", "use_xyz": True, "normalize_dp": False},
       "conv_args": {"order": "conv-norm-act"}, "act_args": {"act": "relu"}, "norm_args": {"norm": "bn"}}


def _cloud(n: int, channels: int):
    g = torch.Generator().manual_seed(2)
    xyz = torch.rand(2, n, 3, generator=g)
    extra = torch.rand(2, channels - 3, n, generator=g)
    return {"pos": xyz, "x": torch.cat([xyz.transpose(1, 2), extra], 1).contiguous()}


def pointnet2_cls():
    """openpoints' PointNet++ classifier (BaseCls: PointNet2Encoder, ClsHead), called with its data
    dict {"pos", "x"} as openpoints' training loop calls it."""
    model = _openpoints({"NAME": "BaseCls",
                         "encoder_args": {**_SA, "in_channels": 3, "strides": [4, 4, 1],
                                          "mlps": [[[32, 32, 64]], [[64, 64, 128]], [[128, 128, 256]]],
                                          "radius": [0.2, 0.4, None], "num_samples": [16, 16, None]},
                         "cls_args": {"NAME": "ClsHead", "num_classes": 10, "mlps": [64], "norm_args": {"norm": "bn1d"}}})
    return model, (_cloud(256, 3),), ["logits"]


def pointnet2_seg():
    """openpoints' PointNet++ segmentation (BaseSeg: PointNet2Encoder, PointNet2Decoder's feature
    propagation by three_nn and three_interpolate, SegHead)."""
    model = _openpoints({"NAME": "BaseSeg",
                         "encoder_args": {**_SA, "in_channels": 4, "strides": [4, 4, 4],
                                          "mlps": [[[32, 32, 64]], [[64, 64, 128]], [[128, 128, 256]]],
                                          "radius": 0.1, "radius_scaling": 2, "num_samples": 16},
                         "decoder_args": {"NAME": "PointNet2Decoder", "fp_mlps": [[64, 64], [128, 64], [128, 128]]},
                         "cls_args": {"NAME": "SegHead", "num_classes": 5, "in_channels": None,
                                      "norm_args": {"norm": "bn"}}})
    return model, (_cloud(512, 4),), ["logits"]


def _pyg_clouds():
    """Two point clouds of 256 points as PyG batches them (pos, sorted batch vector), split 128 +
    128; and another split (50 + 206) with other points, for the exports to be run at."""
    g = torch.Generator().manual_seed(3)
    first = (torch.rand(256, 3, generator=g), torch.repeat_interleave(torch.arange(2), torch.tensor([128, 128])))
    second = (torch.rand(256, 3, generator=g), torch.repeat_interleave(torch.arange(2), torch.tensor([50, 206])))
    return first, second


def pyg_dgcnn():
    """PyTorch Geometric 2.8's DynamicEdgeConv twice (kNN in feature space, recomputed per layer),
    a max pool per example and a linear head: a DGCNN classifier. PyG calls torch.ops.pyg.knn
    (pyg-lib, which has no wheels on PyPI): opbridge.compat.install("pyg_lib") registers it. Its
    MLPs have no BatchNorm: a BatchNorm over the edges, whose number is data-dependent, does
    not pass torch.export (its decomposition asks whether that number is 0)."""
    import opbridge.compat

    opbridge.compat.install("pyg_lib")
    from torch_geometric.nn import MLP, DynamicEdgeConv, global_max_pool

    class DGCNN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = DynamicEdgeConv(MLP([2 * 3, 32, 32], norm=None), k=10, aggr="max")
            self.conv2 = DynamicEdgeConv(MLP([2 * 32, 64], norm=None), k=10, aggr="max")
            self.head = torch.nn.Linear(64, 10)

        def forward(self, pos, batch):
            x = self.conv2(self.conv1(pos, batch), batch)
            return self.head(global_max_pool(x, batch, size=2))

    torch.manual_seed(0)
    first, second = _pyg_clouds()
    return DGCNN().eval(), first, ["logits"], second


def pyg_pointnet2():
    """PointNet++ set abstraction on PyTorch Geometric 2.8: fps and radius (torch.ops.pyg, see
    pyg_dgcnn), PointNetConv on the pairs, then a global max pool and a head."""
    import opbridge.compat

    opbridge.compat.install("pyg_lib")
    from torch_geometric.nn import MLP, PointNetConv, fps, global_max_pool, radius

    class SetAbstraction(torch.nn.Module):
        def __init__(self, ratio, r, channels):
            super().__init__()
            self.ratio, self.r = ratio, r
            self.conv = PointNetConv(MLP(channels, norm=None), add_self_loops=False)

        def forward(self, x, pos, batch):
            idx = fps(pos, batch, ratio=self.ratio, random_start=False)
            row, col = radius(pos, pos[idx], self.r, batch, batch[idx], max_num_neighbors=32)
            x = self.conv((x, None if x is None else x[idx]), (pos, pos[idx]), torch.stack([col, row], dim=0))
            return x, pos[idx], batch[idx]

    class PointNet2(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.sa1 = SetAbstraction(0.5, 0.2, [3, 32, 32])
            self.sa2 = SetAbstraction(0.25, 0.4, [32 + 3, 64, 64])
            self.head = torch.nn.Linear(64 + 3, 10)

        def forward(self, pos, batch):
            x, p, b = self.sa2(*self.sa1(None, pos, batch))
            return self.head(global_max_pool(torch.cat([x, p], 1), b, size=2))

    torch.manual_seed(0)
    first, second = _pyg_clouds()
    return PointNet2().eval(), first, ["logits"], second


MODELS = {"deformable_detr": deformable_detr, "pointnet2_cls": pointnet2_cls, "pointnet2_seg": pointnet2_seg,
          "pyg_dgcnn": pyg_dgcnn, "pyg_pointnet2": pyg_pointnet2}


def _outputs(out) -> list[np.ndarray]:
    return [t.numpy() for t in ((out,) if isinstance(out, torch.Tensor) else out)]


def _interleaved(model, args, sessions: dict, rounds: int = 9) -> dict:
    """Eager (on opbridge's ops) and each exporter's ONNX Runtime session timed in turn, round after
    round, so that a noisy machine slows both alike: median times, and per exporter the median of
    the rounds' eager / ONNX Runtime ratios with their spread."""
    runs = {"eager": lambda: model(*args), **{k: (lambda s=s, f=f: s.run(None, f)) for k, (s, f) in sessions.items()}}
    times: dict = {k: [] for k in runs}
    with torch.no_grad(), opbridge.substitutions(model):
        for fn in runs.values():
            fn()  # warm-up
        for _ in range(rounds):
            for k, fn in runs.items():
                t = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t)
    out = {"eager_ms": statistics.median(times["eager"]) * 1e3}
    for k in sessions:
        ratios = sorted(e / o for e, o in zip(times["eager"], times[k]))
        out[k] = {"ort_ms": statistics.median(times[k]) * 1e3, "speedup": statistics.median(ratios),
                  "speedup_spread": [ratios[0], ratios[-1]]}
    return out


def _median_ms(fn, runs: int = 5) -> float:
    fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main(name: str, report_path: str) -> None:
    model, args, names, *rest = MODELS[name]()
    second = rest[0] if rest else None  # other inputs of the same shapes, for the exports to be run at
    with torch.no_grad():
        try:  # the model's own path: a Function over a missing CUDA extension cannot run
            original = _outputs(model(*args))
        except Exception as e:  # noqa: BLE001 - the report says why
            original, why = None, f"{type(e).__name__}: {e}"
        with opbridge.substitutions(model):
            substituted = _outputs(model(*args))
        original_ms = None if original is None else _median_ms(lambda: model(*args))
    report = {"model": name, "opbridge": opbridge.__version__, "eager_original_ms": original_ms,
              "exports": {},
              "eager_substituted_vs_original": None if original is None else
              max(float(np.abs(a - b).max()) for a, b in zip(substituted, original))}
    if original is None:
        report["original_fails"] = why
        original = substituted
    sessions = {}
    for exporter in opbridge.EXPORTERS:
        entry = report["exports"][exporter] = {}
        try:
            proto = opbridge.export(model, args, exporter=exporter, output_names=names)
            sess = opbridge.session(proto)
            feeds = {i.name: t.numpy() for i, t in zip(sess.get_inputs(), tensor_leaves(args))}
            got = sess.run(None, feeds)
            entry["nodes"] = sorted({f"{n.domain}::{n.op_type}" for n in proto.graph.node
                                     if n.domain.startswith("opbridge")})
            entry["grid_samples"] = sum(n.op_type == "GridSample" for n in proto.graph.node)
            entry["vs_original"] = max(float(np.abs(g - w).max()) for g, w in zip(got, original))
            entry["vs_substituted"] = max(float(np.abs(g - w).max()) for g, w in zip(got, substituted))
            entry["scale"] = max(float(np.abs(w).max()) for w in original)
            # Timed with its threads not spinning after a run, which would slow the eager runs between.
            quiet = opbridge.session_options()
            quiet.add_session_config_entry("session.intra_op.allow_spinning", "0")
            sessions[exporter] = (opbridge.session(proto, options=quiet), feeds)
            if second is not None:  # what the trace read from the first inputs must not be baked in
                with torch.no_grad(), opbridge.substitutions(model):
                    want = _outputs(model(*second))
                got = sess.run(None, {i.name: t.numpy() for i, t in zip(sess.get_inputs(), tensor_leaves(second))})
                entry["second_vs_substituted"] = max(float(np.abs(g - w).max()) for g, w in zip(got, want))
        except Exception as e:  # the report says what failed; the test decides
            entry["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
    timing = _interleaved(model, args, sessions)
    report["eager_ms"] = timing.pop("eager_ms")
    for exporter, figures in timing.items():
        report["exports"][exporter].update(figures)
    with open(report_path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
