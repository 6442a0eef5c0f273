"""The end-to-end demo: a model using my_add, dual_residual and asinh is exported with both
PyTorch exporters, checked, run in ONNX Runtime with the opbridge library at several batch
sizes (the batch axis stays dynamic), and compared with PyTorch. Exits non-zero on any mismatch.

    python -m opbridge.demo [--out DIR] [--export-only DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import onnx
import torch

import opbridge


class DemoModel(torch.nn.Module):
    """out0 = asinh((2x + y)·alpha − y), out1 = y·alpha − (2x + y)."""

    def __init__(self, alpha: float = 0.5):
        super().__init__()
        self.alpha = alpha

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        s = torch.ops.opbridge.my_add(x, y)
        r1, r2 = torch.ops.opbridge.dual_residual(s, y, alpha=self.alpha)
        return torch.asinh(r1), r2


FEATURES = 8
BATCHES = (4, 1, 7)  # the first is the export example; the others prove the axis is dynamic


def example_inputs(batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + batch)
    return torch.randn(batch, FEATURES, generator=g), torch.randn(batch, FEATURES, generator=g)


def export_all(out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    model = DemoModel().eval()
    paths = {}
    for exporter in opbridge.EXPORTERS:
        path = out_dir / f"demo_{exporter}.onnx"
        opbridge.export(
            model,
            example_inputs(BATCHES[0]),
            path,
            exporter=exporter,
            input_names=["x", "y"],
            output_names=["out0", "out1"],
            dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
        )
        paths[exporter] = path
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="where to write the ONNX models (default: a temporary folder)")
    p.add_argument("--export-only", type=Path, metavar="DIR", help="only export the models into DIR")
    a = p.parse_args(argv)
    if a.export_only:
        for exporter, path in export_all(a.export_only).items():
            print(f"[opbridge] {exporter:<12} -> {path}")
        return 0

    out = a.out or Path(tempfile.mkdtemp(prefix="opbridge-demo-"))
    model = DemoModel().eval()
    print(f"[opbridge] exporting DemoModel (my_add, dual_residual, asinh) with both exporters into {out}")
    rows = []
    for exporter, path in export_all(out).items():
        m = onnx.load(path)
        nodes = ", ".join(f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in m.graph.node)
        batch_dim = m.graph.input[0].type.tensor_type.shape.dim[0].dim_param
        print(f"[opbridge] {exporter:<11} {path.name}: {nodes}; checker ok; batch axis '{batch_dim}'")
        sess = opbridge.session(path)
        for batch in BATCHES:
            report = opbridge.verify(model, example_inputs(batch, seed=1), path, sess=sess)
            rows += [(exporter, batch, o) for o in report.outputs]

    print(f"\nONNX Runtime vs PyTorch eager (rtol {report.rtol:g}, atol {report.atol:g})")
    head = f"{'exporter':<12} {'batch':>5}  {'output':<7} {'shape':<9} {'dtype':<8} {'max abs diff':>12} {'max rel diff':>12}  result"
    print(head + "\n" + "-" * len(head))
    for exporter, batch, o in rows:
        verdict = "ok" if o.ok else f"MISMATCH {o.note}".rstrip()
        print(f"{exporter:<12} {batch:>5}  {o.name:<7} {str(list(o.shape)):<9} {o.dtype:<8} "
              f"{o.max_abs:>12.3e} {o.max_rel:>12.3e}  {verdict}")
    ok = all(o.ok for _, _, o in rows)
    print("\n[opbridge] " + ("PASS: ONNX Runtime matches PyTorch on every output" if ok else "FAIL: mismatch"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
