"""Grouping (PointNet++'s gather of neighbour features): does the standard export of torch
indexing need an opbridge op? float32 features, int64 indices from a ball query.

Two layouts, each its own benchmark:
    pointnet2_ops' (features (B, C, N), idx (B, S, K) -> (B, C, S, K)), written as torch.gather
    over the expanded index; both exporters give GatherElements.
    pointops' (feat (N, C), idx (M, K) -> (M, K, C)), written as feat[idx]; exported as Gather
    on axis 0.

Rows: the exported model in ONNX Runtime (the subject; thread spinning off), the same torch code
eager, numpy's take, and the floor: a copy of an output-sized array (np.copyto), which any
gather must at least write. If ONNX Runtime's node runs within reach of torch and the floor,
an op of our own has nothing to win. The channels-first layout also times opbridge's group_points
node (the op that pointnet2_ops' GroupingOperation is substituted by).
"""

from __future__ import annotations

import numpy as np
import torch

from common import Row, interleaved, note_floor, ort_session, progress

SUBJECT = "exported graph (ONNX Runtime)"
FLOOR = "floor: copy of the output (np.copyto)"


class _GroupChannelsFirst(torch.nn.Module):
    def forward(self, features, idx):
        b, c, _ = features.shape
        _, s, k = idx.shape
        flat = idx.reshape(b, 1, s * k).expand(b, c, s * k)
        return torch.gather(features, 2, flat).reshape(b, c, s, k)


class _GroupPoints(torch.nn.Module):
    def forward(self, features, idx):
        return torch.ops.opbridge.group_points(features, idx)


class _GroupChannelsLast(torch.nn.Module):
    def forward(self, feat, idx):
        return feat[idx]


def _case(name: str, model: torch.nn.Module, args: tuple, names: list[str], numpy_take, quick: bool,
          node: torch.nn.Module | None = None) -> list[Row]:
    import opbridge

    sess = ort_session(opbridge.export(model, args, input_names=names), spinning=False)
    ops = {n.op_type for n in opbridge.export(model, args, input_names=names).graph.node}
    feeds = {n: a.numpy() for n, a in zip(names, args)}
    want = model(*args).numpy()
    got = sess.run(None, feeds)[0]
    np.testing.assert_array_equal(got, want)  # a gather copies: bit for bit
    np.testing.assert_array_equal(numpy_take(), want)
    out = np.empty_like(want)
    src = np.ascontiguousarray(want)

    impls = {SUBJECT: lambda: sess.run(None, feeds),
             "the same torch code, eager": lambda: model(*args),
             "numpy take": numpy_take,
             FLOOR: lambda: np.copyto(out, src)}
    if node is not None:  # opbridge's own node for the same gather
        node_sess = ort_session(opbridge.export(node, args, input_names=names), spinning=False)
        np.testing.assert_array_equal(node_sess.run(None, feeds)[0], want)
        impls["opbridge group_points node (ONNX Runtime)"] = lambda: node_sess.run(None, feeds)
    label = f"{name} ({', '.join(sorted(ops))})"
    progress(f"{label}: {', '.join(impls)}")
    rows = interleaved(label, impls, rounds=3 if quick else 15, max_seconds=120)
    note_floor(rows, FLOOR)
    return rows


def run(quick: bool) -> list[Row]:
    rng = np.random.default_rng(0)
    b, c, n, s, k = (2, 32, 2048, 512, 32) if quick else (8, 64, 4096, 1024, 32)
    features = torch.from_numpy(rng.standard_normal((b, c, n), dtype=np.float32))
    idx = torch.from_numpy(rng.integers(0, n, (b, s, k)))
    fnp, inp = features.numpy(), idx.numpy()

    def take_first():
        return np.stack([fnp[i][:, inp[i]] for i in range(b)])

    rows = _case(f"group channels-first B={b} C={c} N={n} -> S={s} K={k}", _GroupChannelsFirst(), (features, idx),
                 ["features", "idx"], take_first, quick, node=_GroupPoints())

    m_total, n_total = b * s, b * n
    feat = torch.from_numpy(rng.standard_normal((n_total, c), dtype=np.float32))
    idx2 = torch.from_numpy(rng.integers(0, n_total, (m_total, k)))
    fnp2, inp2 = feat.numpy(), idx2.numpy()
    rows += _case(f"group channels-last N={n_total} C={c} -> M={m_total} K={k}", _GroupChannelsLast(), (feat, idx2),
                  ["feat", "idx"], lambda: np.take(fnp2, inp2, axis=0), quick)
    return rows
