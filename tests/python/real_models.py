"""Real models from PyPI, run in the environment tests/python/envs.py makes for their package:

    python real_models.py <model> <report.json>

builds the model with random weights in eval mode (its code untouched), exports it with both
exporters through opbridge.export (which applies the substitutions), runs each export in ONNX
Runtime and in OpenVINO and writes a report: per exporter, the largest differences to eager (the model's own
path where it can run on a CPU, and on opbridge's ops), the opbridge nodes written, and eager (on
opbridge's ops) and ONNX Runtime timed in interleaved rounds (medians, and the median ratio with
its spread). tests/python/test_models.py judges it.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
import traceback

import numpy as np
import torch

import opbridge
from opbridge._library.kinds import tensor_leaves


class _Fields(torch.nn.Module):
    """A transformers model's output fields as a tuple (its ModelOutput is a dict with optional
    entries). In eval mode like the model: torch.onnx.export gives every submodule its top module's
    training mode back, so a wrapper left in training mode would put BatchNorm in training mode."""

    def __init__(self, inner, fields):
        super().__init__()
        self.inner, self.fields = inner, list(fields)
        self.eval()

    def forward(self, pixel_values):
        out = self.inner(pixel_values=pixel_values)
        return tuple(getattr(out, f) for f in self.fields)


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

    names = ["last_hidden_state", "encoder_last_hidden_state"]
    return _Fields(model, names), (pixels,), names


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


def pointnet2_seg_dynamic():
    """pointnet2_seg exported with the point count dynamic: its set abstraction samples
    npoint = N // stride centres, a size the model computes from its input, which both exporters
    must write as a graph value (a size-derived attribute) for the model to be right at another N."""
    model, cloud, names = pointnet2_seg()
    spec = {"input_names": ["pos", "x"], "dynamic_axes": {"pos": {1: "points"}, "x": {2: "points"}}}
    return model, cloud, names, (_cloud(768, 4),), spec


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


def pyg_pointnet2(fps_options=None):
    """PointNet++ set abstraction on PyTorch Geometric 2.8: fps and radius (torch.ops.pyg, see
    pyg_dgcnn), PointNetConv on the pairs, then a global max pool and a head. fps starts at each
    example's first point, so that values can be compared (pyg_pointnet2_random_start: PyG's
    default)."""
    fps_options = {"random_start": False} if fps_options is None else fps_options
    import opbridge.compat

    opbridge.compat.install("pyg_lib")
    from torch_geometric.nn import MLP, PointNetConv, fps, global_max_pool, radius

    class SetAbstraction(torch.nn.Module):
        def __init__(self, ratio, r, channels):
            super().__init__()
            self.ratio, self.r = ratio, r
            self.conv = PointNetConv(MLP(channels, norm=None), add_self_loops=False)

        def forward(self, x, pos, batch):
            idx = fps(pos, batch, ratio=self.ratio, **fps_options)
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


def pyg_pointnet2_random_start():
    """pyg_pointnet2 as PyG calls fps by default (random_start=True): every output is random by
    the declaration of furthest_point_sampling_ratio, which opbridge.verify reads."""
    return pyg_pointnet2(fps_options={})


def _mask2former(backbone):
    """transformers' Mask2FormerModel, tiny and random (nothing downloaded), on a backbone of
    transformers' own: its pixel decoder's deformable attention is the module-level
    multi_scale_deformable_attention, which opbridge.compat.deformable_attention substitutes (with
    the attention module's forward, whose divisor of the offsets a trace would fix). Exported with
    the image's height and width dynamic, and run at a second image size."""
    import opbridge.compat.deformable_attention  # noqa: F401  its rules
    from transformers import Mask2FormerConfig, Mask2FormerModel

    torch.manual_seed(0)
    config = Mask2FormerConfig(backbone_config=backbone, feature_size=32, mask_feature_size=32, hidden_dim=32,
                               encoder_feedforward_dim=64, encoder_layers=1, decoder_layers=2, num_attention_heads=4,
                               dim_feedforward=64, num_queries=8, use_pretrained_backbone=False)
    model = Mask2FormerModel(config).eval()
    first = (torch.rand(1, 3, 128, 160, generator=torch.Generator().manual_seed(1)),)
    second = (torch.rand(1, 3, 96, 128, generator=torch.Generator().manual_seed(2)),)
    names = ["pixel_decoder_last_hidden_state", "transformer_decoder_last_hidden_state"]
    return _Fields(model, names), first, names, \
        second, {"input_names": ["pixel_values"], "dynamic_axes": {"pixel_values": {2: "height", 3: "width"}}}


def mask2former_resnet():
    from transformers import ResNetConfig

    return _mask2former(ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                                     out_features=["stage1", "stage2", "stage3", "stage4"]))


def mask2former_swin():
    from transformers import SwinConfig

    return _mask2former(SwinConfig(embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 2, 2, 4], window_size=4,
                                   out_features=["stage1", "stage2", "stage3", "stage4"]))


def _pyg_point_counts():
    """Two clouds of 64 points (30 + 34) and, for the exports to be run at, three of 100 points
    (20 + 50 + 30): the point count and the number of examples both differ."""
    g = torch.Generator().manual_seed(4)
    first = (torch.rand(64, 3, generator=g), torch.repeat_interleave(torch.arange(2), torch.tensor([30, 34])))
    second = (torch.rand(100, 3, generator=g), torch.repeat_interleave(torch.arange(3), torch.tensor([20, 50, 30])))
    return first, second


def _radius_graph_reference(pos: np.ndarray, batch: np.ndarray, r: float, cap: int) -> np.ndarray:
    """PyG's radius_graph(loop=False) by brute force: for each point i, the (at most cap) lowest
    other rows j of its example closer than r, as edges [j, i] ordered by i, then j."""
    d = ((pos[:, None] - pos[None]) ** 2).sum(-1)
    edges = []
    for i in range(len(pos)):
        js = [j for j in np.nonzero((d[i] < r * r) & (batch == batch[i]))[0] if j != i][:cap]
        edges += [(j, i) for j in js]
    return np.array(edges, dtype=np.int64).reshape(-1, 2).T


def pyg_radius_graph():
    """PyTorch Geometric 2.8's radius_graph with its default loop=False (pyg::radius with
    ignore_same_index, see pyg_dgcnn) and a ball cap the clouds exceed, then the edges' lengths.
    Exported with the point count dynamic; the edges at the second inputs are also compared with
    a brute-force search."""
    import opbridge.compat

    opbridge.compat.install("pyg_lib")
    from torch_geometric.nn import radius_graph

    class RadiusGraph(torch.nn.Module):
        def forward(self, pos, batch):
            edge_index = radius_graph(pos, r=0.3, batch=batch, max_num_neighbors=6)
            return edge_index, (pos[edge_index[0]] - pos[edge_index[1]]).norm(dim=-1)

    first, second = _pyg_point_counts()

    def reference(inputs, outputs) -> bool:
        want = _radius_graph_reference(inputs[0].numpy(), inputs[1].numpy(), 0.3, 6)
        return want.shape == outputs[0].shape and bool((want == outputs[0]).all())

    return RadiusGraph().eval(), first, ["edge_index", "length"], second, {
        "input_names": ["pos", "batch"], "dynamic_axes": {"pos": {0: "n"}, "batch": {0: "n"}}, "reference": reference}


def pyg_schnet():
    """PyTorch Geometric 2.8's SchNet, small: radius_graph (loop=False) for the interaction graph,
    continuous-filter convolutions, and a sum readout per molecule whose size PyG reads as
    int(batch.max()) + 1 (substituted, see opbridge.compat.pyg_lib). Exported with the atom count
    dynamic; run at a second batch of another atom count and another number of molecules."""
    import opbridge.compat

    opbridge.compat.install("pyg_lib")
    from torch_geometric.nn.models import SchNet

    torch.manual_seed(0)
    model = SchNet(hidden_channels=32, num_filters=32, num_interactions=2, num_gaussians=16, cutoff=0.3,
                   max_num_neighbors=6).eval()
    (pos, batch), (pos2, batch2) = _pyg_point_counts()
    g = torch.Generator().manual_seed(5)
    first = (torch.randint(1, 10, (pos.size(0),), generator=g), pos, batch)
    second = (torch.randint(1, 10, (pos2.size(0),), generator=g), pos2, batch2)
    return model, first, ["energy"], second, {
        "input_names": ["z", "pos", "batch"], "dynamic_axes": {"z": {0: "n"}, "pos": {0: "n"}, "batch": {0: "n"}}}


MODELS = {"deformable_detr": deformable_detr, "pointnet2_cls": pointnet2_cls, "pointnet2_seg": pointnet2_seg,
          "pointnet2_seg_dynamic": pointnet2_seg_dynamic,
          "pyg_dgcnn": pyg_dgcnn, "pyg_pointnet2": pyg_pointnet2,
          "pyg_pointnet2_random_start": pyg_pointnet2_random_start, "pyg_radius_graph": pyg_radius_graph,
          "pyg_schnet": pyg_schnet, "mask2former_resnet": mask2former_resnet, "mask2former_swin": mask2former_swin}


def _outputs(out) -> list[np.ndarray]:
    return [t.numpy() for t in ((out,) if isinstance(out, torch.Tensor) else out)]


def _interleaved(model, args, sessions: dict, openvino: dict, rounds: int = 9) -> dict:
    """Eager (on opbridge's ops), each exporter's ONNX Runtime session and its OpenVINO one timed in
    turn, round after round, so that a noisy machine slows all alike: median times, and per
    exporter the median of the rounds' eager / ONNX Runtime and ONNX Runtime / OpenVINO ratios
    with their spread."""
    runs = {"eager": lambda: model(*args), **{k: (lambda s=s, f=f: s.run(None, f)) for k, (s, f) in sessions.items()},
            **{("openvino", k): (lambda s=s, f=f: s.run(None, f)) for k, (s, f) in openvino.items()}}
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
        if k in openvino:
            ratios = sorted(o / v for o, v in zip(times[k], times[("openvino", k)]))
            out[k].update({"openvino_ms": statistics.median(times[("openvino", k)]) * 1e3,
                           "ort_over_openvino": statistics.median(ratios),
                           "ort_over_openvino_spread": [ratios[0], ratios[-1]]})
    return out


def _run_against(sess, inputs, want: list[np.ndarray], prefix: str = "") -> dict:
    """A session's outputs at `inputs` against eager's `want`: the largest difference, and whether
    the integer outputs (indices, edges) are equal."""
    got = sess.run(None, {i.name: t.numpy() for i, t in zip(sess.get_inputs(), tensor_leaves(inputs))})
    if any(g.shape != w.shape for g, w in zip(got, want)):
        raise AssertionError(f"{prefix or 'at the example'}: shapes {[g.shape for g in got]}, "
                             f"eager {[w.shape for w in want]}")
    return {f"{prefix}vs_substituted": max(float(np.abs(g - w).max()) if g.size else 0.0 for g, w in zip(got, want)),
            f"{prefix}integers_equal": all(np.array_equal(g, w) for g, w in zip(got, want)
                                           if np.issubdtype(w.dtype, np.integer))}


def _in_openvino(model, proto, args, substituted: list[np.ndarray], second, timed: dict, exporter: str) -> dict:
    """The same export in OpenVINO (opbridge.session(..., runtime="openvino")), against eager on
    opbridge's ops as ONNX Runtime is: at the example and at the second inputs. The session goes
    into `timed` under the exporter's name."""
    try:
        sess = opbridge.session(proto, runtime="openvino")
        out = _run_against(sess, args, substituted)
        timed[exporter] = (sess, {i.name: t.numpy() for i, t in zip(sess.get_inputs(), tensor_leaves(args))})
        if second is not None:
            with torch.no_grad(), opbridge.substitutions(model):
                want = _outputs(model(*second))
            out.update(_run_against(sess, second, want, "second_"))
        return out
    except Exception as e:  # noqa: BLE001 - the report says what failed; the test decides
        return {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"}


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
    # Other inputs, for the exports to be run at: of the same shapes, or of other sizes along the
    # axes the model's spec (input_names, dynamic_axes) declares dynamic.
    second = rest[0] if rest else None
    spec = dict(rest[1]) if len(rest) > 1 else {}
    reference = spec.pop("reference", None)  # (inputs, ONNX Runtime's outputs) -> whether they are right
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
    sessions, in_openvino = {}, {}
    for exporter in opbridge.EXPORTERS:
        entry = report["exports"][exporter] = {}
        try:
            proto = opbridge.export(model, args, exporter=exporter, output_names=names, **spec)
            sess = opbridge.session(proto)
            feeds = {i.name: t.numpy() for i, t in zip(sess.get_inputs(), tensor_leaves(args))}
            got = sess.run(None, feeds)
            entry["nodes"] = sorted({f"{n.domain}::{n.op_type}" for n in proto.graph.node
                                     if n.domain.startswith("opbridge")})
            entry["grid_samples"] = sum(n.op_type == "GridSample" for n in proto.graph.node)
            entry["vs_original"] = max(float(np.abs(g - w).max()) for g, w in zip(got, original))
            entry["vs_substituted"] = max(float(np.abs(g - w).max()) for g, w in zip(got, substituted))
            entry["scale"] = max(float(np.abs(w).max()) for w in original)
            try:  # opbridge.verify's own verdict, which knows outputs random by declaration
                with torch.no_grad(), opbridge.substitutions(model):
                    entry["verify"] = [dataclasses.asdict(o) for o in opbridge.verify(model, args, proto, sess=sess).outputs]
            except Exception as e:  # noqa: BLE001 - the report says why; the test decides
                entry["verify_error"] = f"{type(e).__name__}: {e}"
            # Timed with its threads not spinning after a run, which would slow the eager runs between.
            quiet = opbridge.session_options()
            quiet.add_session_config_entry("session.intra_op.allow_spinning", "0")
            sessions[exporter] = (opbridge.session(proto, options=quiet), feeds)
            if second is not None:  # what the trace read from the first inputs must not be baked in
                with torch.no_grad(), opbridge.substitutions(model):
                    want = _outputs(model(*second))
                got = sess.run(None, {i.name: t.numpy() for i, t in zip(sess.get_inputs(), tensor_leaves(second))})
                if any(g.shape != w.shape for g, w in zip(got, want)):
                    raise AssertionError(f"at the second inputs ONNX Runtime gives shapes {[g.shape for g in got]}, "
                                         f"eager {[w.shape for w in want]}")
                entry["second_vs_substituted"] = max(float(np.abs(g - w).max()) if g.size else 0.0
                                                     for g, w in zip(got, want))
                # Integer outputs (indices, edges) must be equal, not close.
                entry["second_integers_equal"] = all(np.array_equal(g, w) for g, w in zip(got, want)
                                                     if np.issubdtype(w.dtype, np.integer))
                if reference is not None:
                    entry["second_vs_reference"] = reference(second, got)
                if spec.get("dynamic_axes"):  # opbridge.verify at the second size, as a user would run it
                    with opbridge.substitutions(model):  # eager as exported (openpoints' Functions need CUDA)
                        checked = opbridge.verify(model, second, proto)
                    entry["second_verify_ran"] = not checked.cannot_run
                    entry["second_verify_max_abs"] = max((o.max_abs for o in checked.outputs), default=None)
            entry["openvino"] = _in_openvino(model, proto, args, substituted, second, in_openvino, exporter)
        except Exception as e:  # the report says what failed; the test decides
            entry["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
    timing = _interleaved(model, args, sessions, in_openvino)
    report["eager_ms"] = timing.pop("eager_ms")
    for exporter, figures in timing.items():
        report["exports"][exporter].update(figures)
    with open(report_path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
