"""torchvision::nms's export rule: opbridge's Nms node (offset 0). With torchvision installed the
tests run its real op; without it, a stand-in op of the same name and schema whose kernel is a
numpy loop of torchvision's semantics (greedy, IoU above the threshold suppresses, by descending
score) exercises the same rule: the mapping is under test, ONNX Runtime running the node is
compared with it. torchvision itself, in the cached environment with torch 2.14.1 (it does not
load with this torch), is the oracle for the semantics."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import opbridge

HERE = Path(__file__).resolve().parent

try:
    import torchvision  # noqa: F401

    HAVE_TORCHVISION = True
except Exception:  # absent, or a build that does not match this torch
    HAVE_TORCHVISION = False

_standin = None


def reference(dets, scores, iou_threshold):
    """Greedy NMS: by descending score (lowest index first on a tie), a box is dropped when its IoU
    with a kept box, inter / (area_a + area_b - inter) in float32, is above the threshold."""
    order = np.lexsort((np.arange(len(scores)), -scores))
    b = dets[order]
    area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    alive = np.ones(len(b), bool)
    keep = []
    for a in range(len(b)):
        if not alive[a]:
            continue
        keep.append(order[a])
        w = np.maximum(0, np.minimum(b[a, 2], b[a + 1:, 2]) - np.maximum(b[a, 0], b[a + 1:, 0]))
        h = np.maximum(0, np.minimum(b[a, 3], b[a + 1:, 3]) - np.maximum(b[a, 1], b[a + 1:, 1]))
        inter = w * h
        with np.errstate(invalid="ignore", divide="ignore"):
            alive[a + 1:] &= ~(inter / (area[a] + area[a + 1:] - inter) > b.dtype.type(np.float32(iou_threshold)))
    return np.array(keep, np.int64)


def _standin_nms(dets, scores, iou_threshold):
    return torch.from_numpy(reference(dets.numpy(), scores.numpy(), iou_threshold))


def _standin_fake(dets, scores, iou_threshold):
    return dets.new_empty((torch.library.get_ctx().new_dynamic_size(),), dtype=torch.int64)


def torchvision_nms():
    """torch.ops.torchvision.nms: torchvision's, or the stand-in."""
    global _standin
    if not HAVE_TORCHVISION and _standin is None:
        _standin = torch.library.Library("torchvision", "FRAGMENT")
        _standin.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _standin.impl("nms", _standin_nms, "CPU")
        torch.library.register_fake("torchvision::nms", _standin_fake, lib=_standin)
    return torch.ops.torchvision.nms


torchvision_nms()  # exists before export, as after `import torchvision`


def scene(n, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * 200
    wh = 4 + torch.rand(n, 2, generator=g) * 60
    return torch.cat([xy, xy + wh], 1).to(dtype), torch.rand(n, generator=g).to(dtype)


class Detect(torch.nn.Module):
    """Post-processing as torchvision's detection heads do it: NMS, then the kept boxes and scores."""

    def __init__(self, iou=0.5):
        super().__init__()
        self.iou = iou

    def forward(self, boxes, scores):
        keep = torchvision_nms()(boxes, scores, self.iou)
        return boxes[keep], scores[keep] * 2, keep


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_exports_as_the_nms_node_and_matches(exporter, dtype):
    args = scene(300, 1, dtype)
    m = opbridge.export(Detect(), args, exporter=exporter)
    assert [(n.domain, n.op_type) for n in m.graph.node if n.domain == "opbridge"] == [("opbridge", "Nms")]
    report = opbridge.verify(Detect(), args, m)
    assert report.ok, report.table()
    keep = opbridge.session(m).run(None, {i.name: a.numpy() for i, a in zip(m.graph.input, args)})[2]
    np.testing.assert_array_equal(keep, reference(args[0].numpy(), args[1].numpy(), 0.5))


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_a_dynamic_box_count_is_right_at_other_counts(exporter):
    m = opbridge.export(Detect(0.3), scene(200, 2), exporter=exporter, input_names=["boxes", "scores"],
                        dynamic_axes={"boxes": {0: "n"}, "scores": {0: "n"}})
    sess = opbridge.session(m)
    for n in (0, 1, 57, 900):
        args = scene(n, 3 + n)
        got = sess.run(None, {"boxes": args[0].numpy(), "scores": args[1].numpy()})[2]
        np.testing.assert_array_equal(got, reference(args[0].numpy(), args[1].numpy(), 0.3))


ORACLE = textwrap.dedent('''
    import json, sys
    import torch, torchvision
    out = {}
    for n, seed, iou in ((500, 1, 0.5), (3000, 2, 0.3), (6000, 3, 0.7)):
        g = torch.Generator().manual_seed(seed)
        xy = torch.rand(n, 2, generator=g) * 400
        wh = 2 + torch.rand(n, 2, generator=g) * 80
        boxes, scores = torch.cat([xy, xy + wh], 1), torch.rand(n, generator=g)
        out[f"{n}"] = dict(boxes=boxes.tolist(), scores=scores.tolist(), iou=iou,
                           keep=torchvision.ops.nms(boxes, scores, iou).tolist(),
                           batched=torchvision.ops.batched_nms(boxes, scores, torch.arange(n) % 7, iou).tolist())
    json.dump(out, open(sys.argv[1], "w"))
''')


@pytest.mark.environments
def test_torchvision_itself_keeps_the_same_boxes(tmp_path):
    sys.path.insert(0, str(HERE.parents[1] / "tests" / "python"))
    import envs

    python = envs.python_with("torch-2.14.1", ["torch==2.14.1", "torchvision==0.29.1", "scikit-build-core==1.1.2"])
    run = subprocess.run([str(python), "-c", ORACLE, str(tmp_path / "out.json")], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    for n, case in json.loads((tmp_path / "out.json").read_text()).items():
        boxes, scores = torch.tensor(case["boxes"]), torch.tensor(case["scores"])
        assert len(torch.unique(scores)) == len(scores), "no ties, whose order torchvision leaves undefined"
        got = torch.ops.opbridge.nms(boxes, scores, case["iou"])
        assert got.tolist() == case["keep"], n
        # batched_nms through mmcv's and torchvision's coordinate-offset trick (torchvision's own below 4000 boxes
        # on the CPU as well, its per-class loop above): the same boxes.
        offsets = (torch.arange(len(boxes)) % 7).to(boxes) * (boxes.max() + 1)
        got = torch.ops.opbridge.nms(boxes + offsets[:, None], scores, case["iou"])
        assert sorted(got.tolist()) == sorted(case["batched"]), n
        assert got.tolist() == case["batched"], n
