"""grid_cluster: 1 000 000 and 10 000 000 points in 3-D (float32), voxel size given; start/end
either derived (the op's min/max pass over pos) or given (both: with start alone the op still
reduces pos for end). Each on 1 and 2 threads.

Rows, timed in interleaved rounds in one process:
  opbridge GridCluster (ONNX Runtime)  the subject: the exported one-op model in an ORT session
                                       with that many intra-op threads, spinning off
  opbridge eager                       torch.ops.opbridge.grid_cluster on that many torch threads
  torch formula                        torch_cluster's formula as vectorised torch ops (min, max,
                                       subtract, divide, to long, cumprod, sum)
  floor                                one pass over memory that reads pos once and writes the int64
                                       output once: out.copy_(pos[:, 0]) in torch, into a
                                       preallocated int64 tensor, on that many threads. Rows are
                                       12 bytes and cache lines 64, so it pulls every byte of pos
                                       while converting one value per row: no implementation can
                                       move less memory (the op also divides and sums, and without
                                       start/end reads pos twice)
"""

from __future__ import annotations

import numpy as np
import torch

from common import Row, interleaved, note_floor, on_torch_threads, ort_session, progress

SUBJECT = "opbridge GridCluster (ONNX Runtime)"
FLOOR = "floor: one pass, pos[:, 0] -> int64 out (torch copy_)"


def torch_formula(pos: torch.Tensor, size: torch.Tensor, start: torch.Tensor | None = None,
                  end: torch.Tensor | None = None) -> torch.Tensor:
    start = pos.min(0).values if start is None else start
    end = pos.max(0).values if end is None else end
    num_voxels = ((end - start) / size).to(torch.long) + 1
    num_voxels = torch.cat([torch.ones(1, dtype=torch.long), num_voxels.cumprod(0)])[: size.numel()]
    out = ((pos - start) / size).to(torch.long)
    out *= num_voxels
    return out.sum(1)


class _GridModule(torch.nn.Module):
    def forward(self, pos, size):
        return torch.ops.opbridge.grid_cluster(pos, size)


class _GridModuleGiven(torch.nn.Module):
    def forward(self, pos, size, start, end):
        return torch.ops.opbridge.grid_cluster(pos, size, start, end)


def run(quick: bool) -> list[Row]:
    import opbridge

    sizes = [100_000] if quick else [1_000_000, 10_000_000]
    rounds = 3 if quick else 20
    size = torch.tensor([0.5, 0.75, 1.0])

    progress("grid_cluster: export")
    derived = opbridge.export(_GridModule().eval(), (torch.zeros(4, 3), size), input_names=["pos", "size"],
                              dynamic_axes={"pos": {0: "n"}})
    given = opbridge.export(_GridModuleGiven().eval(), (torch.zeros(4, 3), size, torch.zeros(3), torch.ones(3)),
                            input_names=["pos", "size", "start", "end"], dynamic_axes={"pos": {0: "n"}})
    assert [nd.op_type for nd in derived.graph.node] == [nd.op_type for nd in given.graph.node] == ["GridCluster"]

    torch_threads = torch.get_num_threads()
    rows: list[Row] = []
    try:
        for n in sizes:
            g = torch.Generator().manual_seed(0)
            pos = torch.rand(n, 3, generator=g) * 100.0 - 50.0
            # Given: a grid a little wider than the points (what a caller with known bounds passes).
            bounds = {"start": torch.full((3,), -50.0), "end": torch.full((3,), 50.0)}
            floor_out = torch.empty(n, dtype=torch.int64)
            for extent, proto, extra in (("start/end derived", derived, {}), ("start/end given", given, bounds)):
                args = (pos, size, *extra.values())
                feeds = {"pos": pos.numpy(), "size": size.numpy(), **{k: v.numpy() for k, v in extra.items()}}
                want = torch_formula(*args).numpy()
                for threads in (1, 2):
                    name = f"grid_cluster n={n} d=3 float32 {extent}, {threads} thread(s)"
                    sess = ort_session(proto, threads=threads, spinning=False)
                    # The peers agree with each other before anything is timed.
                    np.testing.assert_array_equal(sess.run(None, feeds)[0], want)
                    np.testing.assert_array_equal(torch.ops.opbridge.grid_cluster(*args).numpy(), want)
                    progress(name)
                    rows += interleaved(name, {
                        SUBJECT: lambda: sess.run(None, feeds),
                        "opbridge eager (torch.ops)": on_torch_threads(
                            threads, lambda: torch.ops.opbridge.grid_cluster(*args)),
                        "torch formula (torch_cluster's, vectorised)": on_torch_threads(
                            threads, lambda: torch_formula(*args)),
                        FLOOR: on_torch_threads(threads, lambda: floor_out.copy_(pos[:, 0])),
                    }, rounds=rounds)
                    note_floor(rows[-4:], FLOOR)
    finally:
        torch.set_num_threads(torch_threads)
    return rows
