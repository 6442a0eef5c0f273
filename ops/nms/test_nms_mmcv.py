"""mmcv's NMS family on opbridge: mmcv._ext's nms, softnms and nms_match called exactly as
mmcv/ops/nms.py calls them, mmcv's NMSop and SoftNMSop substituted by the ops at export (both
exporters, ONNX Runtime against the numpy loops of test_nms.py), and mmcv-lite itself running on
them (its nms, soft_nms, nms_match and batched_nms) in the cached mmdet environment."""

import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import opbridge
from opbridge.compat.mmcv import _ext as ext  # what mmcv gets as mmcv._ext
from test_nms import boxes, nms_match_reference, nms_reference, scores, softnms_reference, ties

HERE = Path(__file__).resolve().parent


def groups(matched, group):
    return [matched[group == g].tolist() for g in range(int(group.max()) + 1)] if len(group) else []


def mmcv_nmsop(bboxes, score, iou_threshold, offset, score_threshold, max_num):
    """NMSop.forward's own steps (mmcv 2.x) over mmcv._ext.nms."""
    if score_threshold > 0:
        valid = score > score_threshold
        bboxes, score, valid_inds = bboxes[valid], score[valid], torch.nonzero(valid, as_tuple=False).squeeze(dim=1)
    inds = ext.nms(bboxes, score, iou_threshold=float(iou_threshold), offset=offset)
    if max_num > 0:
        inds = inds[:max_num]
    return valid_inds[inds] if score_threshold > 0 else inds


@pytest.mark.parametrize("offset", [0, 1])
def test_ext_nms_as_mmcv_calls_it(offset):
    b, s = boxes(120, 1, integer=True), scores(120, 2, levels=6)
    got = ext.nms(b, s, iou_threshold=float(0.4), offset=offset)
    np.testing.assert_array_equal(got.numpy(), nms_reference(b.numpy(), s.numpy(), 0.4, offset))
    # NMSop's score_threshold and max_num, as its forward applies them, are what the op folds in.
    for sthr, max_num in ((0.3, 7), (0.0, -1), (0.5, 0), (2.0, 3)):
        want = mmcv_nmsop(b, s, 0.4, offset, sthr, max_num)
        torch.testing.assert_close(torch.ops.opbridge.nms(b, s, 0.4, offset, sthr, max_num), want)
        np.testing.assert_array_equal(want.numpy(), nms_reference(b.numpy(), s.numpy(), 0.4, offset, sthr, max_num))


@pytest.mark.parametrize("method", [0, 1, 2])
def test_ext_softnms_fills_dets_in_place(method):
    b, s = ties(60, 3)
    dets = b.new_empty((b.size(0), 5), device="cpu")  # SoftNMSop.forward's buffer
    before = dets.clone()
    inds = ext.softnms(b.cpu(), s.cpu(), dets.cpu(), iou_threshold=float(0.3), sigma=float(0.5),
                       min_score=float(1e-3), method=int(method), offset=int(0))
    want_dets, want_inds = softnms_reference(b.numpy(), s.numpy(), 0.3, 0.5, 1e-3, method, 0)
    np.testing.assert_array_equal(inds.numpy(), want_inds)
    np.testing.assert_allclose(dets[:inds.size(0)].numpy(), want_dets, rtol=1e-6)
    assert inds.size(0) < b.size(0), "boxes were dropped"
    torch.testing.assert_close(dets[inds.size(0):], before[inds.size(0):], equal_nan=True)  # left as they were


def test_ext_nms_match_returns_lists_of_indices():
    d = torch.cat([boxes(90, 4), scores(90, 5)[:, None]], 1)
    got = ext.nms_match(d, iou_threshold=float(0.2))
    assert isinstance(got, list) and all(isinstance(g, list) and all(isinstance(i, int) for i in g) for g in got)
    assert got == groups(*nms_match_reference(d.numpy(), 0.2))
    assert max(len(g) for g in got) > 1 and sorted(sum(got, [])) == list(range(90))
    assert ext.nms_match(d[:0], iou_threshold=0.5) == []


def test_ext_softnms_refuses_a_dets_buffer_too_small():
    b, s = boxes(10, 6), scores(10, 7)
    with pytest.raises(RuntimeError, match=r"mmcv._ext.softnms: dets must be \(N, 5\)"):
        ext.softnms(b, s, b.new_empty((3, 5)), iou_threshold=0.3, sigma=0.5, min_score=1e-3, method=1, offset=0)


@pytest.fixture
def mmcv_nms():
    """mmcv.ops.nms shaped as mmcv's: NMSop.forward(ctx, bboxes, scores, iou_threshold, offset,
    score_threshold, max_num) and SoftNMSop.forward(ctx, boxes, scores, iou_threshold, sigma,
    min_score, method, offset), over an extension that is not installed here."""
    names = ["mmcv", "mmcv.ops", "mmcv.ops.nms"]
    saved = {name: sys.modules.get(name) for name in names}
    for name in names:
        sys.modules[name] = types.ModuleType(name)
    module = sys.modules[names[-1]]
    exec(compile(textwrap.dedent('''
        import torch

        class NMSop(torch.autograd.Function):
            @staticmethod
            def forward(ctx, bboxes, scores, iou_threshold, offset, score_threshold, max_num):
                raise ImportError("mmcv._ext is not installed")

        class SoftNMSop(torch.autograd.Function):
            @staticmethod
            def forward(ctx, boxes, scores, iou_threshold, sigma, min_score, method, offset):
                raise ImportError("mmcv._ext is not installed")
    '''), "<mmcv.ops.nms>", "exec"), module.__dict__)
    yield module
    for name, old in saved.items():
        if old is None:
            del sys.modules[name]
        else:
            sys.modules[name] = old


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_mmcv_nmsop_and_softnmsop_are_substituted(mmcv_nms, exporter):
    class Post(torch.nn.Module):
        def forward(self, b, s):  # as mmcv.ops.nms and soft_nms call them
            inds = mmcv_nms.NMSop.apply(b, s, 0.4, 1, 0.2, 12)
            dets, sinds = mmcv_nms.SoftNMSop.apply(b, s, 0.3, 0.5, 0.05, 2, 0)
            return torch.cat((b[inds], s[inds].reshape(-1, 1)), dim=1), inds, dets[:sinds.size(0)], sinds

    args = (boxes(80, 8, integer=True), scores(80, 9))
    m = opbridge.export(Post(), args, exporter=exporter)
    assert sorted(n.op_type for n in m.graph.node if n.domain == "opbridge") == ["Nms", "Softnms"]
    sess = opbridge.session(m)
    got = sess.run(None, {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)})
    b, s = args[0].numpy(), args[1].numpy()
    want = nms_reference(b, s, 0.4, 1, 0.2, 12)
    np.testing.assert_array_equal(got[1], want)
    np.testing.assert_array_equal(got[0], np.concatenate([b[want], s[want, None]], 1))
    want_dets, want_inds = softnms_reference(b, s, 0.3, 0.5, 0.05, 2, 0)
    np.testing.assert_array_equal(got[3], want_inds)
    np.testing.assert_allclose(got[2], want_dets, rtol=1e-6)
    with opbridge.substitutions():  # eager, on the ops
        np.testing.assert_array_equal(Post()(*args)[1].numpy(), want)


MMCV_SCRIPT = textwrap.dedent('''
    import sys
    import numpy as np, torch
    import opbridge.compat
    opbridge.compat.install("mmcv")
    from mmcv.ops import batched_nms, nms, nms_match, soft_nms
    d = np.load(sys.argv[1])
    b, s, labels = d["b"], d["s"], torch.tensor(d["labels"])
    out = {}
    out["nms_dets"], out["nms_inds"] = nms(b, s, 0.4, offset=1, score_threshold=0.2, max_num=15)
    for method in ("naive", "linear", "gaussian"):
        out[f"soft_{method}_dets"], out[f"soft_{method}_inds"] = soft_nms(torch.tensor(b), torch.tensor(s), 0.3,
                                                                          method=method, min_score=0.05)
    out["match"] = np.concatenate([np.r_[len(g), g] for g in nms_match(np.c_[b, s], 0.3)])
    out["batched_dets"], out["batched_keep"] = batched_nms(torch.tensor(b), torch.tensor(s), labels,
                                                           dict(iou_threshold=0.5))
    out["split_dets"], out["split_keep"] = batched_nms(torch.tensor(b), torch.tensor(s), labels,
                                                       dict(iou_threshold=0.5, split_thr=10))
    np.savez(sys.argv[2], **{k: np.asarray(v) for k, v in out.items()})
''')


@pytest.mark.environments
def test_real_mmcv_runs_its_nms_family_on_opbridge(tmp_path):
    sys.path.insert(0, str(HERE.parents[1] / "tests" / "python"))
    import envs
    from test_mmdet import MMDET

    python = envs.python_with("mmdet-3.3.0", MMDET, on_top=True)
    b, s = boxes(150, 10, integer=True).numpy(), scores(150, 11).numpy()
    labels = np.arange(150) % 4
    np.savez(tmp_path / "in.npz", b=b, s=s, labels=labels)
    run = subprocess.run([str(python), "-c", MMCV_SCRIPT, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = np.load(tmp_path / "out.npz")
    want = nms_reference(b, s, 0.4, 1, 0.2, 15)
    np.testing.assert_array_equal(got["nms_inds"], want)
    np.testing.assert_array_equal(got["nms_dets"], np.c_[b[want], s[want]])
    for i, method in enumerate(("naive", "linear", "gaussian")):
        dets, inds = softnms_reference(b, s, 0.3, 0.5, 0.05, i, 0)
        np.testing.assert_array_equal(got[f"soft_{method}_inds"], inds)
        np.testing.assert_allclose(got[f"soft_{method}_dets"], dets, rtol=1e-6)
    flat = np.concatenate([np.r_[len(g), g] for g in groups(*nms_match_reference(np.c_[b, s], 0.3))])
    np.testing.assert_array_equal(got["match"], flat)
    # Per label, apart: the kept boxes of each label, by descending score.
    keep = np.concatenate([np.nonzero(labels == k)[0][nms_reference(b[labels == k], s[labels == k], 0.5)]
                           for k in range(4)])
    keep = keep[np.lexsort((keep, -s[keep]))]
    for prefix in ("batched", "split"):  # one NMS over offset boxes, and mmcv's per-label loop
        np.testing.assert_array_equal(got[f"{prefix}_keep"], keep)
        np.testing.assert_array_equal(got[f"{prefix}_dets"], np.c_[b[keep], s[keep]])
