"""The end-to-end demo, with both PyTorch exporters, the ONNX checker, ONNX Runtime (with the
opbridge library) and a comparison with PyTorch eager; exits non-zero on any mismatch:

1. DemoModel (my_add, dual_residual, asinh) at several batch sizes (the batch axis stays dynamic);
2. CatalogueModel: a point cloud (knn_query, grid_cluster) and an image (deform_conv2d, selu as an
   ONNX function, resize_bicubic by scales fed at run time) at two point counts and two scales;
3. PointCloudModel: PointNet++'s set abstraction and feature propagation (furthest_point_sampling,
   ball_query, three_nn, three_interpolate) with torch_cluster's radius pairs (a data-dependent
   size) counted by segment_coo, at two point counts.

    python examples/demo.py [--out DIR] [--export-only DIR]
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


class CatalogueModel(torch.nn.Module):
    """The seed notes' operators in one model: neighbours and voxel clusters of a point cloud, and
    a deformable convolution whose output is resized by a factor given at run time."""

    def __init__(self, channels: int = 4):
        super().__init__()
        g = torch.Generator().manual_seed(7)
        self.register_buffer("weight", torch.randn(channels, channels, 3, 3, generator=g) * 0.2)
        self.register_buffer("bias", torch.randn(channels, generator=g))
        self.register_buffer("voxel", torch.tensor([0.25, 0.25, 0.25]))

    def forward(self, points, offset, image, shifts, mask, scales):
        idx, dist = torch.ops.opbridge.knn_query(points, offset, k=4)
        cluster = torch.ops.opbridge.grid_cluster(points, self.voxel)
        feat = torch.ops.opbridge.deform_conv2d(image, self.weight, shifts, self.bias, mask, padding=[1, 1])
        return idx, dist, cluster, torch.ops.opbridge.resize_bicubic(torch.nn.functional.selu(feat), scales)


CATALOGUE_INPUTS = ["points", "offset", "image", "shifts", "mask", "scales"]


def catalogue_inputs(n_points: int, scale: float, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed + n_points)
    points = torch.rand(n_points, 3, generator=g)
    offset = torch.tensor([n_points // 2, n_points], dtype=torch.int32)  # two point clouds
    image = torch.randn(1, 4, 12, 12, generator=g)
    shifts = torch.randn(1, 18, 12, 12, generator=g)
    mask = torch.rand(1, 9, 12, 12, generator=g)
    return points, offset, image, shifts, mask, torch.tensor([1.0, 1.0, scale, scale])


def run_catalogue(out: Path) -> list[tuple[str, str, object]]:
    model = CatalogueModel().eval()
    rows = []
    print("[opbridge] exporting CatalogueModel (knn_query, grid_cluster, deform_conv2d, selu, resize_bicubic)")
    for exporter in opbridge.EXPORTERS:
        path = out / f"catalogue_{exporter}.onnx"
        opbridge.export(model, catalogue_inputs(64, 2.0), path, exporter=exporter, input_names=CATALOGUE_INPUTS,
                        output_names=["idx", "dist", "cluster", "resized"], dynamic_axes={"points": {0: "n"}})
        m = onnx.load(path)
        kinds = sorted({f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in m.graph.node
                        if n.domain or n.op_type in ("DeformConv", "Resize")})
        opset = next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
        print(f"[opbridge] {exporter:<11} {path.name} (opset {opset}): {', '.join(kinds)}; "
              f"functions: {', '.join(f.name for f in m.functions) or 'none'}; checker ok")
        sess = opbridge.session(path)
        for n_points, scale in ((64, 2.0), (200, 1.5)):
            # float32 bicubic and deformable sampling round differently in each runtime.
            report = opbridge.verify(model, catalogue_inputs(n_points, scale, seed=1), path, sess=sess, rtol=1e-4,
                                     atol=1e-4)
            rows += [(exporter, f"n={n_points} x{scale:g}", o) for o in report.outputs]
    return rows


POINT_FEATURES = 8


class PointCloudModel(torch.nn.Module):
    """One set abstraction and one feature propagation step of PointNet++, as its model code writes
    them: centres by furthest point sampling, a ball of neighbours per centre grouped with
    torch.gather, a shared MLP and a max over each ball; then the pooled features interpolated back
    to every point from its three nearest centres (weights 1 / (d + 1e-8), normalised). Also the
    pairs within the radius as torch_cluster's radius gives them, counted per centre."""

    def __init__(self, npoint: int = 16, radius: float = 0.3, nsample: int = 8, channels: int = POINT_FEATURES):
        super().__init__()
        g = torch.Generator().manual_seed(11)
        self.npoint, self.radius, self.nsample = npoint, radius, nsample
        self.register_buffer("mlp", torch.randn(channels, channels + 3, generator=g) * 0.3)

    def forward(self, xyz, features):  # xyz (B, N, 3), features (B, C, N)
        ops = torch.ops.opbridge
        b, c, _ = features.shape
        centres = ops.furthest_point_sampling(xyz, self.npoint).long()
        new_xyz = torch.gather(xyz, 1, centres[..., None].expand(-1, -1, 3))
        ball = ops.ball_query(xyz, new_xyz, self.radius, self.nsample).long().reshape(b, 1, -1)
        grouped = torch.gather(features, 2, ball.expand(-1, c, -1))
        offsets = torch.gather(xyz.transpose(1, 2), 2, ball.expand(-1, 3, -1)) - \
            new_xyz.transpose(1, 2).repeat_interleave(self.nsample, dim=2)
        h = torch.relu(torch.einsum("oc,bcx->box", self.mlp, torch.cat([grouped, offsets], 1)))
        pooled = h.reshape(b, -1, self.npoint, self.nsample).amax(-1)  # (B, C, npoint)
        dist, nearest = ops.three_nn(xyz, new_xyz)
        weight = 1.0 / (dist + 1e-8)
        weight = weight / weight.sum(-1, keepdim=True)
        upsampled = ops.three_interpolate(pooled, nearest, weight)  # (B, C, N)
        pairs = ops.radius(xyz[0], new_xyz[0], r=self.radius, max_num_neighbors=self.nsample)
        counts = ops.segment_coo(torch.ones(pairs.shape[1], 1, dtype=xyz.dtype), pairs[0], self.npoint)
        return upsampled, pooled, counts


POINT_INPUTS, POINT_OUTPUTS = ["xyz", "features"], ["upsampled", "pooled", "counts"]
POINT_AXES = {"xyz": {1: "n"}, "features": {2: "n"}}


def point_cloud_inputs(n_points: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + n_points)
    return torch.rand(2, n_points, 3, generator=g), torch.randn(2, POINT_FEATURES, n_points, generator=g)


def run_point_cloud(out: Path) -> list[tuple[str, str, object]]:
    model = PointCloudModel().eval()
    rows = []
    print("[opbridge] exporting PointCloudModel (furthest_point_sampling, ball_query, three_nn, three_interpolate, "
          "radius, segment_coo)")
    for exporter in opbridge.EXPORTERS:
        path = out / f"point_cloud_{exporter}.onnx"
        opbridge.export(model, point_cloud_inputs(64), path, exporter=exporter, input_names=POINT_INPUTS,
                        output_names=POINT_OUTPUTS, dynamic_axes=POINT_AXES)
        m = onnx.load(path)
        kinds = sorted({n.op_type for n in m.graph.node if n.domain == "opbridge"})
        pairs = next(v for v in m.graph.value_info if v.name == "edge_index").type.tensor_type.shape.dim[1]
        print(f"[opbridge] {exporter:<11} {path.name}: opbridge::{', '.join(kinds)}; pairs dimension "
              f"'{pairs.dim_param}'; checker ok")
        sess = opbridge.session(path)
        for n_points in (64, 500):
            report = opbridge.verify(model, point_cloud_inputs(n_points, seed=1), path, sess=sess)
            rows += [(exporter, f"n={n_points}", o) for o in report.outputs]
    return rows


def print_rows(title: str, rows, case_head: str) -> bool:
    print(f"\n{title}")
    head = f"{'exporter':<12} {case_head:<14} {'output':<10} {'shape':<16} {'dtype':<8} {'max abs diff':>12} {'max rel diff':>12}  result"
    print(head + "\n" + "-" * len(head))
    for exporter, case, o in rows:
        verdict = "ok" if o.ok else f"MISMATCH {o.note}".rstrip()
        print(f"{exporter:<12} {case:<14} {o.name:<10} {str(list(o.shape)):<16} {o.dtype:<8} "
              f"{o.max_abs:>12.3e} {o.max_rel:>12.3e}  {verdict}")
    return all(o.ok for _, _, o in rows)


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

    ok = print_rows(f"ONNX Runtime vs PyTorch eager (rtol {report.rtol:g}, atol {report.atol:g})",
                    [(e, str(b), o) for e, b, o in rows], "batch")
    ok &= print_rows("CatalogueModel: ONNX Runtime vs PyTorch eager (rtol 1e-4, atol 1e-4)", run_catalogue(out),
                     "points, scale")
    ok &= print_rows(f"PointCloudModel: ONNX Runtime vs PyTorch eager (rtol {report.rtol:g}, atol {report.atol:g})",
                     run_point_cloud(out), "points")
    print("\n[opbridge] " + ("PASS: ONNX Runtime matches PyTorch on every output" if ok else "FAIL: mismatch"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
