"""The 3-D box ops as mmcv reaches them: mmcv._ext's points_in_boxes_* and iou3d_* functions called
exactly as mmcv 2.x's ops/points_in_boxes.py and iou3d.py call them (transcribed below), the
substitution rules for mmcv's Python functions (a stand-in mmcv.ops shaped as mmcv 2.x's, over an
extension that is not installed) exported with both exporters, the box and point counts dynamic, and
ONNX Runtime against the numpy references at two counts; and mmcv-lite 2.1.0's own Python running
on them in the cached mmdet environment."""

import contextlib
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import boxes3d_reference as ref
import opbridge
from opbridge.compat.mmcv import boxes3d as compat
from opbridge.compat.mmcv._ext import boxes3d as ext
from test_boxes3d import boxes, crowd, points, scores

HERE = Path(__file__).resolve().parent


def xyxyr(b):
    """(x, y, z, dx, dy, dz, h) rows as the (x1, y1, x2, y2, h) boxes nms_bev and boxes_iou_bev take."""
    return torch.stack([b[:, 0] - b[:, 3] / 2, b[:, 1] - b[:, 4] / 2, b[:, 0] + b[:, 3] / 2, b[:, 1] + b[:, 4] / 2,
                        b[:, 6]], 1)


def iou3d_reference(a, b):
    bev = ref.boxes_overlap_bev(a, b).astype(np.float64)
    top = np.minimum(a[:, None, 2] + a[:, None, 5] / 2, b[None, :, 2] + b[None, :, 5] / 2)
    bottom = np.maximum(a[:, None, 2] - a[:, None, 5] / 2, b[None, :, 2] - b[None, :, 5] / 2)
    inter = bev * np.clip(top - bottom, 0, None)
    vol_a, vol_b = np.prod(a[:, 3:6], 1)[:, None], np.prod(b[:, 3:6], 1)[None, :]
    return inter / np.clip(vol_a + vol_b - inter, 1e-6, None)


def corner_iou(kept, b):
    """mmcv's nms IoU (offset 0) of (x1, y1, x2, y2, ...) rows with b, in their type."""
    w = np.maximum(np.minimum(kept[:, 2], b[2]) - np.maximum(kept[:, 0], b[0]), 0)
    h = np.maximum(np.minimum(kept[:, 3], b[3]) - np.maximum(kept[:, 1], b[1]), 0)
    inter = w * h
    return inter / ((kept[:, 2] - kept[:, 0]) * (kept[:, 3] - kept[:, 1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


# ---- mmcv's calls, transcribed from mmcv 2.1's ops/points_in_boxes.py and iou3d.py -----------------

def mmcv_points_in_boxes_part(pts, bx):
    out = pts.new_zeros((pts.shape[0], pts.shape[1]), dtype=torch.int).fill_(-1)
    ext.points_in_boxes_part_forward(bx.contiguous(), pts.contiguous(), out)
    return out


def mmcv_points_in_boxes_all(pts, bx):
    out = pts.new_zeros((pts.shape[0], pts.shape[1], bx.shape[1]), dtype=torch.int).fill_(0)
    ext.points_in_boxes_all_forward(bx.contiguous(), pts.contiguous(), out)
    return out


def mmcv_points_in_boxes_cpu(pts, bx):
    out = pts.new_zeros((pts.shape[0], bx.shape[1], pts.shape[1]), dtype=torch.int)
    for b in range(pts.shape[0]):
        ext.points_in_boxes_cpu_forward(bx[b].float().contiguous(), pts[b].float().contiguous(), out[b])
    return out.transpose(1, 2)


def mmcv_boxes_overlap_bev(a, b):
    out = a.new_zeros(torch.Size((a.shape[0], b.shape[0])))
    ext.iou3d_boxes_overlap_bev_forward(a.contiguous(), b.contiguous(), out)
    return out


def mmcv_nms3d(bx, sc, thr, fn=ext.iou3d_nms3d_forward):
    order = sc.sort(0, descending=True)[1]
    bx = bx[order].contiguous()
    keep = bx.new_zeros(bx.size(0), dtype=torch.long)
    num_out = bx.new_zeros(size=(), dtype=torch.long)
    fn(bx, keep, num_out, nms_overlap_thresh=thr)
    return order[keep[:num_out]].contiguous()


# ---- the _ext functions --------------------------------------------------------------------------

def test_ext_points_in_boxes_as_mmcv_calls_them():
    pts, bx = points(2, 400, 1), boxes(10, 2, batch=2)
    want = ref.points_in_boxes_all(pts.numpy(), bx.numpy())
    assert want.sum() > 10
    np.testing.assert_array_equal(mmcv_points_in_boxes_all(pts, bx).numpy(), want)
    np.testing.assert_array_equal(mmcv_points_in_boxes_cpu(pts, bx).numpy(), want)
    np.testing.assert_array_equal(mmcv_points_in_boxes_part(pts, bx).numpy(),
                                  ref.points_in_boxes_part(pts.numpy(), bx.numpy()))


def test_ext_overlap_and_nms_as_mmcv_calls_them():
    a, b = boxes(30, 3, spread=4.0), boxes(20, 4, spread=4.0)
    np.testing.assert_allclose(mmcv_boxes_overlap_bev(a, b).numpy(), ref.boxes_overlap_bev(a.numpy(), b.numpy()),
                               rtol=1e-4, atol=1e-4)
    bx, sc = crowd(150, 5), scores(150, 6)
    np.testing.assert_array_equal(mmcv_nms3d(bx, sc, 0.25).numpy(), ref.nms3d(bx.numpy(), sc.numpy(), 0.25))
    np.testing.assert_array_equal(mmcv_nms3d(bx, sc, 0.25, ext.iou3d_nms3d_normal_forward).numpy(),
                                  ref.nms3d_normal(bx.numpy(), sc.numpy(), 0.25))


def test_ext_refuses_output_tensors_of_the_wrong_size():
    pts, bx = points(1, 5, 1), boxes(2, 2, batch=1)
    with pytest.raises(RuntimeError, match=r"mmcv._ext.points_in_boxes_all_forward: the output tensor is \(1, 5\)"):
        ext.points_in_boxes_all_forward(bx, pts, torch.zeros(1, 5, dtype=torch.int))
    with pytest.raises(RuntimeError, match=r"mmcv._ext.iou3d_nms3d_forward: keep must be \(N,\)"):
        ext.iou3d_nms3d_forward(boxes(4, 3, spread=50.0), torch.zeros(2, dtype=torch.long),
                                torch.zeros((), dtype=torch.long), nms_overlap_thresh=0.5)


# ---- the substitution rules, exported -------------------------------------------------------------

@contextlib.contextmanager
def standin(names, source):
    """Modules `names` (parents first) in sys.modules, the last ones holding `source`'s functions."""
    saved = {name: sys.modules.get(name) for name in names}
    for name in names:
        sys.modules[name] = types.ModuleType(name)
    for name in names:
        if name.count(".") >= 2:
            exec(compile(textwrap.dedent(source), f"<{name}>", "exec"), sys.modules[name].__dict__)
    try:
        yield [sys.modules[name] for name in names]
    finally:
        for name, old in saved.items():
            if old is None:
                del sys.modules[name]
            else:
                sys.modules[name] = old


@pytest.fixture
def mmcv_ops():
    """mmcv.ops.iou3d and mmcv.ops.points_in_boxes shaped as mmcv 2.x's (signatures and defaults),
    over an extension that is not installed here."""
    with standin(["mmcv", "mmcv.ops", "mmcv.ops.iou3d", "mmcv.ops.points_in_boxes"], '''
        def _missing(*args, **kwargs):
            raise ImportError("mmcv._ext is not installed")

        def nms3d(boxes, scores, iou_threshold): _missing()
        def nms3d_normal(boxes, scores, iou_threshold): _missing()
        def nms_bev(boxes, scores, thresh, pre_max_size=None, post_max_size=None): _missing()
        def nms_normal_bev(boxes, scores, thresh): _missing()
        def boxes_overlap_bev(boxes_a, boxes_b): _missing()
        def boxes_iou3d(boxes_a, boxes_b): _missing()
        def boxes_iou_bev(boxes_a, boxes_b): _missing()
        def points_in_boxes_part(points, boxes): _missing()
        def points_in_boxes_all(points, boxes): _missing()
        def points_in_boxes_cpu(points, boxes): _missing()
    ''') as modules:
        yield modules[2:]


def test_mmdet3d_copies_of_nms_bev_are_substituted():
    """mmdet3d 1.x's box3d_nms.nms_bev / nms_normal_bev (mmcv's, over mmcv's nms_rotated and nms)."""
    with standin(["mmdet3d", "mmdet3d.models", "mmdet3d.models.layers", "mmdet3d.models.layers.box3d_nms"], '''
        def nms_bev(boxes, scores, thresh, pre_max_size=None, post_max_size=None):
            raise ImportError("mmcv._ext is not installed")

        def nms_normal_bev(boxes, scores, thresh):
            raise ImportError("mmcv._ext is not installed")
    ''') as modules:
        box3d_nms = modules[-1]
        b, s = crowd(70, 46), scores(70, 47)
        with opbridge.substitutions():
            got = box3d_nms.nms_bev(xyxyr(b), s, 0.3, post_max_size=20)
            got_normal = box3d_nms.nms_normal_bev(xyxyr(b), s, 0.3)
        order = np.argsort(-s.numpy(), kind="stable")
        want = order[ref.greedy_nms(b.numpy()[order], s.numpy()[order], 0.3, ref.iou_bev, inclusive=True)][:20]
        np.testing.assert_array_equal(got.numpy(), want)
        np.testing.assert_array_equal(got_normal.numpy(), ref.greedy_nms(xyxyr(b).numpy(), s.numpy(), 0.3, corner_iou))


def expected(b, s, pts, pb):
    """What Head gives, from the references: nms_bev over the boxes' footprints, IoU >= 0.3
    suppressing (nms_rotated's rule), nms_normal_bev over their corners (mmcv's nms)."""
    bev = xyxyr(torch.from_numpy(b)).numpy()
    order = np.argsort(-s, kind="stable")[:40]
    kept_bev = order[ref.greedy_nms(b[order], s[order], 0.3, ref.iou_bev, inclusive=True)][:12]
    return [ref.nms3d(b, s, 0.3), ref.nms3d_normal(b, s, 0.3), ref.points_in_boxes_part(pts, pb),
            ref.points_in_boxes_all(pts, pb), iou3d_reference(b, b[:5]), kept_bev,
            ref.greedy_nms(bev, s, 0.3, corner_iou), ref.points_in_boxes_all(pts, pb)]


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_mmcv_functions_are_substituted_and_export(mmcv_ops, exporter):
    iou3d, pib = mmcv_ops

    class Head(torch.nn.Module):
        def forward(self, b, s, pts, pb):
            bev = torch.stack([b[:, 0] - b[:, 3] / 2, b[:, 1] - b[:, 4] / 2, b[:, 0] + b[:, 3] / 2,
                               b[:, 1] + b[:, 4] / 2, b[:, 6]], 1)
            return (iou3d.nms3d(b, s, 0.3), iou3d.nms3d_normal(b, s, iou_threshold=0.3),
                    pib.points_in_boxes_part(pts, pb), pib.points_in_boxes_all(pts, pb),
                    iou3d.boxes_iou3d(b, b[:5]), iou3d.nms_bev(bev, s, 0.3, pre_max_size=40, post_max_size=12),
                    iou3d.nms_normal_bev(bev, s, 0.3), pib.points_in_boxes_cpu(pts, pb))

    def args(n, m, seed):
        return crowd(n, seed), scores(n, seed + 1), points(1, m, seed + 2, spread=6.0), crowd(n, seed)[None]

    example, second = args(60, 200, 10), args(90, 320, 20)
    names = ["boxes", "scores", "points", "point_boxes"]
    m = opbridge.export(Head(), example, exporter=exporter, input_names=names, check_args=second,
                        dynamic_axes={"boxes": {0: "n"}, "scores": {0: "n"}, "points": {1: "p"},
                                      "point_boxes": {1: "n"}})
    ours = sorted({n.op_type for n in m.graph.node if n.domain == "opbridge"})
    assert ours == ["BoxesOverlapBev", "Nms", "Nms3d", "Nms3dNormal", "NmsRotated", "PointsInBoxesAll",
                    "PointsInBoxesPart"]
    sess = opbridge.session(m)
    for a in (example, second):  # two box and point counts in one model
        got = sess.run(None, dict(zip(names, (t.numpy() for t in a))))
        b, s, pts, pb = (t.numpy() for t in a)
        want = expected(b, s, pts, pb)
        for i in (0, 1, 2, 3, 5, 6, 7):
            np.testing.assert_array_equal(got[i], want[i])
        np.testing.assert_allclose(got[4], want[4], rtol=1e-4, atol=1e-5)
        assert 0 < len(got[0]) < len(b)
    with opbridge.substitutions():  # eager, on the ops
        np.testing.assert_array_equal(Head()(*example)[0].numpy(), ref.nms3d(*(t.numpy() for t in example[:2]), 0.3))


@pytest.mark.parametrize("pre, post", [(None, None), (25, None), (25, 6), (500, 3), (0, None)])
def test_nms_bev_cuts_at_pre_max_size_ties_to_the_lower_index(pre, post):
    b = crowd(80, 41)
    s = torch.from_numpy(np.random.default_rng(42).integers(0, 6, 80).astype(np.float32))  # many ties
    order = np.argsort(-s.numpy(), kind="stable")[:pre]
    want = order[ref.greedy_nms(b.numpy()[order], s.numpy()[order], 0.3, ref.iou_bev, inclusive=True)][:post]
    got = compat.nms_bev(xyxyr(b), s, 0.3, pre_max_size=pre, post_max_size=post)
    np.testing.assert_array_equal(got.numpy(), want)
    assert compat.nms_bev(xyxyr(b)[:0], s[:0], 0.3, pre_max_size=pre).shape == (0,)


def test_boxes_iou_bev_is_the_footprints_iou():
    b = crowd(40, 45, "float64")
    bev = xyxyr(b)
    inter = ref.boxes_overlap_bev(b.numpy(), b.numpy()[:10])
    area = b[:, 3].numpy() * b[:, 4].numpy()
    want = inter / (area[:, None] + area[None, :10] - inter)
    assert (want > 0.05).sum() > 40
    np.testing.assert_allclose(compat.boxes_iou_bev(bev, bev[:10]).numpy(), want, rtol=1e-9, atol=1e-9)


def test_nms_bev_refuses_a_nan_score_past_the_cut():
    s = scores(30, 43)
    s[29] = float("nan")
    with pytest.raises(RuntimeError, match=r"nms_rotated.*is NaN"):
        compat.nms_bev(xyxyr(crowd(30, 44)), s, 0.3, pre_max_size=5)


# ---- mmcv-lite itself -----------------------------------------------------------------------------

MMCV_SCRIPT = textwrap.dedent('''
    import sys, warnings
    import numpy as np, torch
    import opbridge.compat
    opbridge.compat.install("mmcv")
    from mmcv.ops import (boxes_iou3d, boxes_iou_bev, boxes_overlap_bev, nms3d, nms3d_normal, nms_bev,
                          nms_normal_bev, points_in_boxes_all, points_in_boxes_cpu, points_in_boxes_part)
    warnings.simplefilter("ignore", DeprecationWarning)
    d = {k: torch.from_numpy(v) for k, v in np.load(sys.argv[1]).items()}
    b, s, pts, pb, bev = d["b"], d["s"], d["pts"], d["pb"], d["bev"]
    out = {"cpu": points_in_boxes_cpu(pts, pb), "overlap": boxes_overlap_bev(b, b[:20]), "iou3d": boxes_iou3d(b, b[:20]),
           "iou_bev": boxes_iou_bev(bev, bev[:20]), "nms3d": nms3d(b, s, 0.3), "nms3d_normal": nms3d_normal(b, s, 0.3),
           "nms_bev": nms_bev(bev, s, 0.3, pre_max_size=100, post_max_size=40), "nms_normal_bev": nms_normal_bev(bev, s, 0.3)}
    # mmcv's points_in_boxes_part / _all ask torch.cuda for the current device before their
    # extension call, which a CPU build of torch refuses: answered as a CPU tensor's get_device().
    torch.cuda.current_device = lambda: -1
    out["part"], out["all"] = points_in_boxes_part(pts, pb), points_in_boxes_all(pts, pb)
    np.savez(sys.argv[2], **{k: v.numpy() for k, v in out.items()})
''')


@pytest.mark.environments
def test_real_mmcv_runs_its_3d_box_ops_on_opbridge(tmp_path):
    sys.path.insert(0, str(HERE.parents[1] / "tests" / "python"))
    import envs
    from test_mmdet import MMDET

    python = envs.python_with("mmdet-3.3.0", MMDET, on_top=True)
    b, s = crowd(150, 31).numpy(), scores(150, 32).numpy()
    pts, pb = points(2, 300, 33, spread=6.0).numpy(), boxes(12, 34, batch=2, spread=6.0).numpy()
    bev = xyxyr(torch.from_numpy(b)).numpy()
    np.savez(tmp_path / "in.npz", b=b, s=s, pts=pts, pb=pb, bev=bev)
    run = subprocess.run([str(python), "-c", MMCV_SCRIPT, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = np.load(tmp_path / "out.npz")
    mask = ref.points_in_boxes_all(pts, pb)
    np.testing.assert_array_equal(got["all"], mask)
    np.testing.assert_array_equal(got["cpu"], mask)
    np.testing.assert_array_equal(got["part"], ref.points_in_boxes_part(pts, pb))
    np.testing.assert_allclose(got["overlap"], ref.boxes_overlap_bev(b, b[:20]), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["iou3d"], iou3d_reference(b, b[:20]), rtol=1e-4, atol=1e-5)
    # boxes_iou_bev and nms_bev run on box_iou_rotated / nms_rotated (mmcv 2.x): the same footprints.
    xywhr = np.c_[(bev[:, 0] + bev[:, 2]) / 2, (bev[:, 1] + bev[:, 3]) / 2, np.zeros(150), bev[:, 2] - bev[:, 0],
                  bev[:, 3] - bev[:, 1], np.ones(150), bev[:, 4]].astype(np.float32)
    inter = ref.boxes_overlap_bev(xywhr, xywhr[:20]).astype(np.float64)
    area = xywhr[:, 3].astype(np.float64) * xywhr[:, 4]
    np.testing.assert_allclose(got["iou_bev"], inter / (area[:, None] + area[None, :20] - inter), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(got["nms3d"], ref.nms3d(b, s, 0.3))
    np.testing.assert_array_equal(got["nms3d_normal"], ref.nms3d_normal(b, s, 0.3))
    top = np.argsort(-s, kind="stable")[:100]  # nms_rotated's rule: IoU >= the threshold suppresses
    kept = top[ref.greedy_nms(xywhr[top], s[top], 0.3, ref.iou_bev, inclusive=True)]
    assert len(kept) > 40
    np.testing.assert_array_equal(got["nms_bev"], kept[:40])
    np.testing.assert_array_equal(got["nms_normal_bev"], ref.greedy_nms(bev, s, 0.3, corner_iou))
