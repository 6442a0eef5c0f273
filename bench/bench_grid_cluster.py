"""grid_cluster: 1 000 000 points in 3-D (float32), voxel size given, start/end from min/max.

Rows, measured side by side in one process:
  opbridge (ONNX Runtime)   the subject: an exported one-op model in an ORT session (one
                            intra-op thread per core), and the same with one thread
  opbridge eager            torch.ops.opbridge.grid_cluster
  torch expression          torch_cluster's formula as vectorised torch ops (what torch_cluster's
                            Python/C++ does: min, max, subtract, divide, to long, cumprod, sum)
  floor: copy + fill        numpy: read pos once (a copy) and write n int64 once (a fill), the
                            memory traffic no implementation can avoid
"""

from __future__ import annotations

import numpy as np
import torch

from common import Row, measure, ort_session, progress


def torch_expression(pos: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
    start = pos.min(0).values
    end = pos.max(0).values
    num_voxels = ((end - start) / size).to(torch.long) + 1
    num_voxels = torch.cat([torch.ones(1, dtype=torch.long), num_voxels.cumprod(0)])[: size.numel()]
    out = ((pos - start) / size).to(torch.long)
    out *= num_voxels
    return out.sum(1)


class _GridModule(torch.nn.Module):
    def forward(self, pos, size):
        return torch.ops.opbridge.grid_cluster(pos, size)


def run(quick: bool) -> list[Row]:
    import opbridge

    n = 100_000 if quick else 1_000_000
    repeat = 5 if quick else 30
    name = f"grid_cluster n={n} d=3 float32"
    g = torch.Generator().manual_seed(0)
    pos = torch.rand(n, 3, generator=g) * 100.0 - 50.0
    size = torch.tensor([0.5, 0.75, 1.0])
    pos_np, size_np = pos.numpy(), size.numpy()

    progress("grid_cluster: export")
    proto = opbridge.export(_GridModule().eval(), (torch.zeros(4, 3), size), input_names=["pos", "size"],
                            dynamic_axes={"pos": {0: "n"}})
    sess = ort_session(proto)
    sess1 = ort_session(proto, threads=1)
    feeds = {"pos": pos_np, "size": size_np}

    # The peers agree with each other before anything is timed.
    want = torch_expression(pos, size).numpy()
    np.testing.assert_array_equal(sess.run(None, feeds)[0], want)
    np.testing.assert_array_equal(torch.ops.opbridge.grid_cluster(pos, size).numpy(), want)

    out = np.empty(n, np.int64)
    buf = np.empty_like(pos_np)

    def floor():
        np.copyto(buf, pos_np)
        out.fill(0)

    threads = torch.get_num_threads()
    rows = []
    for impl, fn in [
        ("opbridge (ONNX Runtime)", lambda: sess.run(None, feeds)),
        ("opbridge (ONNX Runtime, 1 thread)", lambda: sess1.run(None, feeds)),
        ("opbridge eager", lambda: torch.ops.opbridge.grid_cluster(pos, size)),
        ("torch expression (torch_cluster formula)", lambda: torch_expression(pos, size)),
        ("floor: numpy copy of pos + int64 fill", floor),
    ]:
        progress(f"grid_cluster: {impl}")
        note = f"torch threads={threads}" if "torch" in impl or "eager" in impl else ""
        rows.append(Row(name, impl, measure(fn, repeat=repeat), note))
    # How far each row is from the memory-traffic floor (median over median).
    floor_ms = rows[-1].median_ms
    for row in rows[:-1]:
        row.note = ", ".join(x for x in (row.note, f"{row.median_ms / floor_ms:.2f}x the floor") if x)
    return rows
