"""three_nn + three_interpolate: PointNet++'s feature propagation from 25 000 known points to
100 000 (64 channels, float32, uniform in the unit cube): the three nearest known points of each
point, inverse-distance weights, the weighted sum of their features.

Rows, the whole propagation from scratch:
    opbridge through ONNX Runtime (the subject; thread spinning off), opbridge eager, and PyTorch
    ops (cdist + topk(3) in 1024-point chunks, the weights, a gather and a sum).
"""

from __future__ import annotations

import numpy as np
import torch

from common import Row, interleaved, ort_session, progress

SUBJECT = "opbridge (ONNX Runtime)"


class _Propagate(torch.nn.Module):
    def forward(self, unknown, known, features):
        dist, idx = torch.ops.opbridge.three_nn(unknown, known)
        weight = 1.0 / (dist + 1e-8)
        weight = weight / weight.sum(2, keepdim=True)
        return torch.ops.opbridge.three_interpolate(features, idx, weight)


def torch_reference(unknown: torch.Tensor, known: torch.Tensor, features: torch.Tensor, chunk: int = 1024):
    dists, idxs = [], []
    for q in unknown[0].split(chunk):
        d, i = torch.cdist(q, known[0]).topk(3, dim=1, largest=False)
        dists.append(d)
        idxs.append(i)
    dist, idx = torch.cat(dists)[None], torch.cat(idxs)[None]
    weight = 1.0 / (dist + 1e-8)
    weight = weight / weight.sum(2, keepdim=True)
    gathered = features[0][:, idx[0]]  # (c, n, 3)
    return (gathered * weight[0][None]).sum(2)[None]


def run(quick: bool) -> list[Row]:
    import opbridge

    m, n, c = (5_000, 20_000, 32) if quick else (25_000, 100_000, 64)
    rng = np.random.default_rng(0)
    known = torch.from_numpy(rng.random((1, m, 3), dtype=np.float32))
    unknown = torch.from_numpy(rng.random((1, n, 3), dtype=np.float32))
    features = torch.from_numpy(rng.standard_normal((1, c, m), dtype=np.float32))
    name = f"three_nn + three_interpolate {m} -> {n} c={c} float32"

    prop = _Propagate()
    args = (unknown, known, features)
    sess = ort_session(opbridge.export(prop, args, input_names=["unknown", "known", "features"]), spinning=False)
    feeds = {"unknown": unknown.numpy(), "known": known.numpy(), "features": features.numpy()}
    got = sess.run(None, feeds)[0]
    np.testing.assert_allclose(got, prop(*args).numpy(), rtol=1e-5, atol=1e-5)
    # cdist's matrix-product distances round differently: near-ties pick another neighbour (0.13%
    # of the values at the full size), which moves those values, not the rest.
    close = np.isclose(got, torch_reference(*args).numpy(), rtol=1e-3, atol=1e-3).mean()
    assert close > 0.995, f"PyTorch reference agrees on {close:.5f} of the values"

    impls = {SUBJECT: lambda: sess.run(None, feeds),
             "opbridge eager (torch.ops)": lambda: prop(*args),
             "PyTorch cdist + topk + gather (1024-point chunks)": lambda: torch_reference(*args)}
    progress(f"{name}: {', '.join(impls)}")
    return interleaved(name, impls, rounds=3 if quick else 10, max_seconds=240)
