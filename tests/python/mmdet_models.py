"""mmdet 3.3.0 detectors built from the configs its wheel ships, on mmcv-lite with opbridge's
`mmcv._ext` (opbridge.compat.install("mmcv")), run in the environment tests/python/envs.py makes:

    python mmdet_models.py <config, relative to mmdet's configs/> <report.json> [exporter ...]
        [--end-to-end] [--timing]

The model is built with random weights and nothing downloaded (pretrained initialisations are
dropped), its batch norms' statistics set from the image, in eval mode, its code untouched. One 1x3x320x320 image: `mode="predict"` eagerly,
then `mode="tensor"` exported through opbridge.export with each exporter asked for (default both)
and run in ONNX Runtime and in OpenVINO against eager. --end-to-end exports `predict` instead: the boxes, scores
and labels after the head's NMS, with the score threshold at 0 (random weights score every box
near the classifier's prior, 0.01, below a config's usual 0.05). --timing adds eager and ONNX
Runtime times in interleaved rounds. The report says, per stage, what happened: "ok", or the
error's type and first lines, and the functions of mmcv._ext the model called that opbridge does
not provide. tests/python/test_mmdet.py and scripts/mmdet_sweep.py read it.
"""

from __future__ import annotations

import json
import logging
import re
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import torch

import opbridge
import opbridge.compat

SIZE = 320


def configs_dir() -> Path:
    import mmdet
    return Path(mmdet.__file__).parent / ".mim" / "configs"


def _drop_pretrained(cfg) -> None:
    """Every init_cfg that loads weights (Pretrained, a checkpoint) set to None, recursively."""
    if isinstance(cfg, dict):
        init = cfg.get("init_cfg")
        if isinstance(init, dict) and (init.get("type") == "Pretrained" or "checkpoint" in init):
            cfg["init_cfg"] = None
        for key in ("pretrained",):
            if key in cfg:
                cfg[key] = None
        for value in cfg.values():
            _drop_pretrained(value)
    elif isinstance(cfg, (list, tuple)):
        for value in cfg:
            _drop_pretrained(value)


def calibrate_norms(model, run) -> None:
    """Random weights with a batch norm's default statistics (mean 0, variance 1) let activations
    grow layer by layer (HRNet's features reach 1e9, and every box the RPN decodes is degenerate).
    A trained model's statistics match its activations: here each batch norm's running mean and
    variance are set, in the order the model runs them, from the input it gets when `run()` calls
    the model (a hook before the layer normalises, in eval mode, so SyncBN needs no process group)."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]

    def calibrate(module, args):
        x = args[0].detach()
        if module.track_running_stats and x.dim() >= 2 and x.numel() > x.shape[1]:
            dims = [d for d in range(x.dim()) if d != 1]
            module.running_mean.copy_(x.mean(dims))
            module.running_var.copy_(x.var(dims, unbiased=False))
        handle[module].remove()  # the first input only: a layer shared by levels keeps it

    handle = {m: m.register_forward_pre_hook(calibrate) for m in norms}
    try:
        with torch.no_grad():
            run()
    except Exception:  # noqa: BLE001 - a model that fails there keeps its statistics
        pass
    finally:
        for h in handle.values():
            h.remove()


def _spread_scores(model, inputs, samples) -> None:
    """Random weights score every box near the classifier's prior (0.01, to within 1e-5), so the
    order of the boxes kept would hang on the last bits of the convolutions, which two runtimes
    round differently. The classifiers' weights (the layers named *_cls) are scaled so that their
    logits spread with a standard deviation of 2 on this image, as a trained model's scores spread
    (neither all near 0.01 nor all saturated at 1)."""
    layers = {name: module for name, module in model.named_modules()
              if name.endswith("_cls") and isinstance(module, (torch.nn.Conv2d, torch.nn.Linear))}
    spread: dict[str, list] = {name: [] for name in layers}
    hooks = [module.register_forward_hook(lambda m, i, out, name=name: spread[name].append(out.detach()))
             for name, module in layers.items()]
    try:
        with torch.no_grad():
            model(inputs, samples, mode="tensor")
    except Exception:  # noqa: BLE001 - a model whose tensor mode fails keeps its weights; run() reports it
        return
    finally:
        for hook in hooks:
            hook.remove()
    with torch.no_grad():
        for name, module in layers.items():
            outs = [o.flatten() for o in spread[name]]
            std = float(torch.cat(outs).std()) if outs else 0.0
            if std > 0:
                module.weight.mul_(2.0 / std)


def build(config: str, score_thr: float | None = None):
    """(model in eval mode, its preprocessed inputs, data samples) for one random image."""
    from mmengine.config import Config
    from mmdet.registry import MODELS
    from mmdet.structures import DetDataSample
    from mmdet.utils import register_all_modules

    register_all_modules()
    cfg = Config.fromfile(str(configs_dir() / config))
    _drop_pretrained(cfg.model)
    if score_thr is not None:
        cfg.model.test_cfg.score_thr = score_thr
    logging.getLogger("mmengine").setLevel(logging.WARNING)  # init_weights reports every parameter
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.eval()
    image = torch.randint(0, 256, (3, SIZE, SIZE), generator=torch.Generator().manual_seed(1)).float()
    meta = dict(img_shape=(SIZE, SIZE), ori_shape=(SIZE, SIZE), pad_shape=(SIZE, SIZE), scale_factor=(1.0, 1.0),
                batch_input_shape=(SIZE, SIZE), img_id=0)
    data = model.data_preprocessor({"inputs": [image], "data_samples": [DetDataSample(metainfo=meta)]}, False)
    if takes_proposals(model):
        data["data_samples"][0].proposals = _instances(proposals(300, 2))
    calibrate_norms(model, lambda: model(data["inputs"], data["data_samples"], mode="tensor"))
    _spread_scores(model, data["inputs"], data["data_samples"])
    return model, data["inputs"], data["data_samples"]


def takes_proposals(model) -> bool:
    """A two-stage detector built without an RPN (Fast R-CNN's configs) reads its RoIs from the
    data sample's `proposals`, which a dataset loads from a file."""
    return getattr(model, "with_rpn", True) is False


def proposals(n: int, seed: int) -> torch.Tensor:
    """(n, 4) boxes (x1, y1, x2, y2) inside the image, of sides 8 to 256."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * (SIZE - 8)
    side = 8 + torch.rand(n, 2, generator=g) * 248
    return torch.cat([xy, torch.minimum(xy + side, torch.tensor(float(SIZE)))], 1)


def _instances(boxes: torch.Tensor):
    from mmengine.structures import InstanceData
    return InstanceData(bboxes=boxes, scores=torch.ones(len(boxes)))


class TensorMode(torch.nn.Module):
    """model(inputs, data_samples, mode="tensor") as a function of the image alone: the data
    samples hold the image's metadata (sizes), the same for every image of this size."""

    def __init__(self, model, data_samples):
        super().__init__()
        self.model, self.data_samples = model, data_samples
        self.eval()

    def samples(self, proposals):
        """The data samples, with `proposals` as theirs where the model takes them (an input of
        the export, not a constant)."""
        if proposals is None:
            return self.data_samples
        samples = [s.clone() for s in self.data_samples]
        samples[0].proposals = _instances(proposals)
        return samples

    def forward(self, inputs, proposals=None):
        return self.model(inputs, self.samples(proposals), mode="tensor")


class Predict(TensorMode):
    """model.predict on the image: the first image's boxes, scores and labels after NMS."""

    def forward(self, inputs, proposals=None):
        found = self.model(inputs, self.samples(proposals), mode="predict")[0].pred_instances
        return found.bboxes, found.scores, found.labels


def leaves(out) -> list:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in leaves(o)]
    if isinstance(out, dict):
        return [t for v in out.values() for t in leaves(v)]
    return []


def error_text(e: BaseException) -> str:
    lines = [line for line in f"{type(e).__name__}: {e}".splitlines() if line.strip()]
    return "\n".join(lines[:12])


def interleaved_ms(model, args: tuple, session, names: list[str], rounds: int = 5) -> dict:
    eager, ort, ratios = [], [], []
    feeds = {name: a.numpy() for name, a in zip(names, args)}
    for _ in range(rounds):
        t = time.perf_counter()
        with torch.no_grad():
            model(*args)
        e = time.perf_counter() - t
        t = time.perf_counter()
        session.run(None, feeds)
        o = time.perf_counter() - t
        eager.append(e * 1e3), ort.append(o * 1e3), ratios.append(e / o)
    return {"eager_ms": statistics.median(eager), "ort_ms": statistics.median(ort),
            "eager_over_ort": statistics.median(ratios), "ratio_spread": [min(ratios), max(ratios)]}


def export_and_compare(model, inputs, exporter: str, workdir: Path, timing: bool) -> dict:
    import onnx
    path = workdir / f"model_{exporter}.onnx"
    # A model that takes proposals takes them as a second input, of any number (proven at 200).
    given = takes_proposals(model.model)
    names = ["inputs", "proposals"] if given else ["inputs"]
    args = (inputs, proposals(300, 2)) if given else (inputs,)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opbridge.export(model, args, str(path), exporter=exporter, input_names=names,
                        dynamic_axes={"proposals": {0: "proposals"}} if given else None,
                        check_args=(inputs, proposals(200, 3)) if given else None)
    graph = onnx.load(str(path), load_external_data=False).graph
    nodes = sorted({f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in graph.node if n.domain not in ("", "ai.onnx")})
    session = opbridge.session(str(path))
    # The image, and its mirror image: what a trace took from the first one's values (a count of
    # boxes, say) shows at the second (with other proposals, where the model takes them).
    cases = (args, (inputs.flip(-1).contiguous(), proposals(250, 4))[:len(args)])
    agreement = _against_eager(model, session, cases, names)
    dims = [[d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in graph.output]
    report = {"nodes": nodes, "outputs": len(graph.output), **agreement, "output_dims": dims,
              "grid_samples": sum(n.op_type == "GridSample" for n in graph.node)}
    try:  # the same model in the second runtime
        report["openvino"] = _against_eager(model, opbridge.session(str(path), runtime="openvino"), cases, names)
    except Exception as e:  # noqa: BLE001 - reported
        report["openvino"] = error_text(e)
    if timing:
        report.update(interleaved_ms(model, args, session, names))
    return report


def _against_eager(model, session, cases, names: list[str]) -> dict:
    """How `session` (either runtime) agrees with eager on each case: _compare's figures."""
    worst, integer_mismatches, reordered, differing = 0.0, 0, 0, 0
    for case in cases:
        with torch.no_grad():
            expected = [t.numpy() for t in leaves(model(*case))]
        got = session.run(None, {name: a.numpy() for name, a in zip(names, case)})
        worst, mismatches, moved, other = _compare(got, expected, worst)
        integer_mismatches, reordered, differing = integer_mismatches + mismatches, reordered + moved, max(differing,
                                                                                                        other)
    return {"max_rel_diff": worst, "integer_mismatches": integer_mismatches, "reordered_rows": reordered,
            "differing_rows": differing}


def _compare(got: list, expected: list, worst: float) -> tuple[float, int, int, int]:
    """(the largest difference relative to an output's scale, so far; unequal integers; rows in
    another order; the most rows of one output that differ). An output with a NaN or an infinity
    where the other has another value differs infinitely. Proposals are ordered by score, and two
    whose scores differ in the seventh digit change places between two runtimes' roundings; where
    such a pair overlaps, which of the two the NMS keeps changes too. So in an output of 100 rows
    or more, where at most 1 in 10 rows differ, those rows are matched one to one (a linear
    assignment) to eager's: a pair within 1e-4 of the scale counts as reordered, a row left over
    as differing (and is left out of the largest difference, the caller bounding their number)."""
    from scipy.optimize import linear_sum_assignment

    integer_mismatches = reordered = most_differing = 0
    if len(got) != len(expected):
        raise AssertionError(f"{len(got)} outputs from ONNX Runtime, {len(expected)} from eager")
    for i, (a, b) in enumerate(zip(got, expected)):
        if a.shape != b.shape:
            raise AssertionError(f"output {i}: shape {a.shape} in ONNX Runtime, {b.shape} eagerly")
        if not np.issubdtype(b.dtype, np.floating):  # labels, indices: equal or wrong
            integer_mismatches += int((a != b).sum())
            continue
        if not a.size:
            continue
        a, b = a.astype(np.float64).reshape(len(a), -1), b.astype(np.float64).reshape(len(b), -1)
        same_special = (np.isnan(a) & np.isnan(b)) | (np.isinf(b) & (a == b))
        finite = np.isfinite(a) & np.isfinite(b)
        if not (finite | same_special).all():
            return float("inf"), integer_mismatches, reordered, most_differing
        scale = max(float(np.abs(np.where(finite, b, 0)).max()), 1.0)
        rows = np.where(finite, np.abs(a - b), 0).max(1) / scale
        moved = np.flatnonzero(rows > 1e-4)
        if len(a) >= 100 and 0 < len(moved) <= len(a) // 10:
            cost = np.where(finite[moved][:, None], np.abs(a[moved][:, None, :] - b[moved][None, :, :]), 0).max(2)
            mine, theirs = linear_sum_assignment(cost / scale)
            close = cost[mine, theirs] / scale <= 1e-4
            reordered += int(close.sum())
            most_differing = max(most_differing, int(len(moved) - close.sum()))
            rows[moved] = 0.0
            rows[moved[mine[close]]] = cost[mine, theirs][close] / scale
        worst = max(worst, float(rows.max()))
    return worst, integer_mismatches, reordered, most_differing


def run(config: str, exporters: tuple[str, ...], workdir: Path, timing: bool = False,
        end_to_end: bool = False) -> dict:
    report: dict = {"config": config}
    try:
        model, inputs, samples = build(config, 0.0 if end_to_end else None)
        report["build"] = "ok"
    except Exception as e:  # noqa: BLE001 - reported
        report["build"] = error_text(e)
        return missing_functions(report)
    try:
        with torch.no_grad():
            result = model(inputs, samples, mode="predict")[0]
        instances = getattr(result, "pred_instances", None)
        report["predict"] = "ok"
        report["detections"] = int(len(instances)) if instances is not None else None
    except Exception as e:  # noqa: BLE001
        report["predict"] = error_text(e)
    exported = (Predict if end_to_end else TensorMode)(model, samples)
    for exporter in exporters:
        try:
            report[exporter] = export_and_compare(exported, inputs, exporter, workdir, timing)
        except Exception as e:  # noqa: BLE001
            report[exporter] = error_text(e)
    return missing_functions(report)


def missing_functions(report: dict) -> dict:
    """The mmcv._ext functions the model reached that opbridge does not provide, from the errors."""
    text = json.dumps(report)
    report["missing"] = sorted(set(re.findall(r"mmcv\._ext\.(\w+) \(called by", text)))
    return report


def main(argv: list[str]) -> None:
    config, out, *exporters = argv
    flags = {e for e in exporters if e.startswith("--")}
    exporters = tuple(e for e in exporters if e not in flags) or ("torchscript", "dynamo")
    print(opbridge.compat.install("mmcv"), file=sys.stderr)
    try:
        report = run(config, exporters, Path(out).parent, "--timing" in flags, "--end-to-end" in flags)
    except Exception:  # noqa: BLE001 - a crash of the runner itself is reported too
        report = {"config": config, "build": traceback.format_exc()[-3000:]}
    Path(out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
