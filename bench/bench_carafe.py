"""carafe: CARAFE's reassembly at a CARAFE neck's shape (features 1x256x50x50, k = 5, s = 2, one
group: masks 1x25x100x100), float32, on 1 and 2 threads.

Rows, in eager PyTorch:
    forward: torch.ops.opbridge.carafe (the subject) against two vectorised PyTorch references:
        unfold + einsum (the k×k windows by F.unfold, then one einsum that weights each window by
        its s×s output pixels' masks: a batched matmul per input pixel, nothing upsampled), and
        shifted views (the features upsampled by nearest and zero-padded, then k×k addcmul_ of a
        shifted view times its mask channel: the fastest PyTorch form found);
    forward + backward: the op's backward against autograd through both references.
And in ONNX Runtime: the opbridge node against the shifted-views reference exported with the same
exporter (the einsum form exports to a graph several times slower still).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from common import Row, input_gradients, interleaved, on_torch_threads, ort_session, progress

SUBJECT = "opbridge carafe"
SHAPE = dict(n=1, c=256, h=50, w=50, k=5, g=1, s=2)


def torch_reference(features, masks, k: int, g: int, s: int):
    """CARAFE by unfold + einsum: output[n, c, y*s+a, x*s+b] = sum over the window position p of
    window[n, c, p, y, x] * masks[n, group(c) * k*k + p, y*s+a, x*s+b]."""
    n, c, h, w = features.shape
    windows = F.unfold(features, k, padding=(k - 1) // 2).view(n, g, c // g, k * k, h, w)
    m = masks.view(n, g, k * k, h, s, w, s)
    return torch.einsum("ngcpyx,ngpyaxb->ngcyaxb", windows, m).reshape(n, c, h * s, w * s)


def torch_shifted_views(features, masks, k: int, g: int, s: int):
    """CARAFE by k×k shifted views: output row oy, column ox reads the upsampled features at
    (oy + (ky - r) * s, ox + (kx - r) * s), zero outside."""
    n, c, h, w = features.shape
    r = (k - 1) // 2
    padded = F.pad(F.interpolate(features, scale_factor=s, mode="nearest"), (r * s,) * 4)
    m = masks.view(n, g, 1, k * k, h * s, w * s)
    out = features.new_zeros(n, g, c // g, h * s, w * s)
    for ky in range(k):
        for kx in range(k):
            view = padded[:, :, ky * s:ky * s + h * s, kx * s:kx * s + w * s].reshape(n, g, c // g, h * s, w * s)
            out.addcmul_(view, m[:, :, :, ky * k + kx])
    return out.reshape(n, c, h * s, w * s)


class _Op(torch.nn.Module):
    def forward(self, features, masks):
        return torch.ops.opbridge.carafe(features, masks, SHAPE["k"], SHAPE["g"], SHAPE["s"])


class _Reference(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, features, masks):
        return self.fn(features, masks, SHAPE["k"], SHAPE["g"], SHAPE["s"])


def _inputs():
    n, c, h, w, k, g, s = (SHAPE[key] for key in "nchwkgs")
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(n, c, h, w, generator=gen)
    # Masks as CARAFEPack makes them: a softmax over each output pixel's window.
    masks = torch.randn(n, g, k * k, h * s, w * s, generator=gen).softmax(2).view(n, g * k * k, h * s, w * s)
    return features, masks


def _case(threads: int, quick: bool) -> list[Row]:
    import opbridge

    args = _inputs()
    op, ref, views = _Op().eval(), _Reference(torch_reference).eval(), _Reference(torch_shifted_views).eval()
    want = ref(*args)
    for model in (op, views):
        np.testing.assert_allclose(model(*args).numpy(), want.numpy(), rtol=1e-4, atol=1e-5)
    rounds = 3 if quick else 15
    n, c, h, w, k, g, s = (SHAPE[key] for key in "nchwkgs")
    tail = f"{n}x{c}x{h}x{w} k={k} s={s} group={g} float32, {threads} thread{'s' if threads > 1 else ''}"
    rows = []

    name = f"carafe forward eager {tail}"
    with torch.no_grad():
        impls = {SUBJECT: on_torch_threads(threads, lambda: op(*args)),
                 "torch unfold + einsum": on_torch_threads(threads, lambda: ref(*args)),
                 "torch shifted views": on_torch_threads(threads, lambda: views(*args))}
        progress(name)
        rows += interleaved(name, impls, rounds=rounds, warmup=2, max_seconds=90)

    grad = torch.randn_like(want)

    for model in (op, views):
        for a, b in zip(input_gradients(model, args, grad), input_gradients(ref, args, grad)):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-4)
    name = f"carafe forward + backward eager {tail}"
    impls = {SUBJECT + " + carafe_backward": on_torch_threads(threads, lambda: input_gradients(op, args, grad)),
             "torch unfold + einsum autograd": on_torch_threads(threads, lambda: input_gradients(ref, args, grad)),
             "torch shifted views autograd": on_torch_threads(threads, lambda: input_gradients(views, args, grad))}
    progress(name)
    rows += interleaved(name, impls, rounds=rounds, warmup=1, max_seconds=120)

    names = ["features", "masks"]
    feeds = {nm: a.numpy() for nm, a in zip(names, args)}
    sessions = {label: ort_session(opbridge.export(model, args, input_names=names), threads=threads, spinning=False)
                for label, model in ((SUBJECT + " node (ONNX Runtime)", op),
                                     ("torch shifted views exported (ONNX Runtime)", views))}
    for sess in sessions.values():
        np.testing.assert_allclose(sess.run(None, feeds)[0], want.numpy(), rtol=1e-4, atol=1e-5)
    name = f"carafe forward in ONNX Runtime {tail}"
    progress(name)
    rows += interleaved(name, {label: (lambda sess=sess: sess.run(None, feeds)) for label, sess in sessions.items()},
                        rounds=rounds, warmup=2, max_seconds=90)
    return rows


def run(quick: bool) -> list[Row]:
    threads = torch.get_num_threads()
    try:
        return _case(1, quick) if quick else _case(1, quick) + _case(2, quick)
    finally:
        torch.set_num_threads(threads)
