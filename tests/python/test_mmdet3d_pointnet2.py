"""mmdet3d 1.4.0's PointNet++ backbones (PointNet2SASSG, PointNet2SAMSG with 3DSSD's D-FPS / FS
samplers and shell ball queries) on opbridge, in the cached mmdet3d environment: exported with
both exporters, the point count dynamic, ONNX Runtime equal to eager at two counts; the rules of
opbridge.compat.mmdet3d.pointnet2 give what mmdet3d's own forward gives (with mmcv's point ops
substituted, as a CPU needs)."""

from __future__ import annotations

import subprocess
import textwrap

import numpy as np
import pytest

import envs
from test_mmdet3d import MMDET3D

pytestmark = pytest.mark.environments

SCRIPT = textwrap.dedent('''
    import sys
    import numpy as np, torch
    import opbridge, opbridge.compat
    opbridge.compat.install("mmcv")
    from mmdet3d.models.backbones import PointNet2SAMSG, PointNet2SASSG

    torch.manual_seed(0)
    ssg = PointNet2SASSG(in_channels=4, num_points=(64, 32), radius=(0.2, 0.4), num_samples=(16, 8),
                         sa_channels=((16, 16, 32), (32, 32, 64)), fp_channels=((64, 64),)).eval()
    msg = PointNet2SAMSG(in_channels=4, num_points=(64, 32), radii=((0.2, 0.4), (0.3, 0.6)),
                         num_samples=((8, 16), (8, 8)), sa_channels=(((8, 8), (8, 16)), ((16, 16), (16, 32))),
                         aggregation_channels=(32, 48), fps_mods=(("D-FPS",), ("FS",)),
                         fps_sample_range_lists=((-1,), (-1,)), dilated_group=(True, True),
                         out_indices=(0, 1)).eval()
    for m in (ssg, msg):  # statistics that keep the features apart
        for bn in m.modules():
            if isinstance(bn, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
                bn.running_var.fill_(0.05)

    class Both(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ssg, self.msg = ssg, msg

        def forward(self, points):
            a, b = self.ssg(points), self.msg(points)
            return (*a["fp_features"], *a["fp_indices"], *b["sa_features"], *b["sa_indices"])

    model = Both().eval()
    d = np.load(sys.argv[1])
    clouds = [torch.tensor(d[f"points{i}"]) for i in range(3)]
    out = {}
    with opbridge.substitutions() as applied:
        only = [t for t in applied if t.startswith("mmcv.ops.")]
    with torch.no_grad():
        # mmdet3d's own forward, mmcv's point ops substituted (their Python asks for CUDA)
        with opbridge.substitutions(model, only=only):
            for i, c in enumerate(clouds):
                for j, o in enumerate(model(c)):
                    out[f"own{i}_{j}"] = o.numpy()
        with opbridge.substitutions(model):
            for i, c in enumerate(clouds):
                for j, o in enumerate(model(c)):
                    out[f"eager{i}_{j}"] = o.numpy()
    for exporter in ("dynamo", "torchscript"):
        proto = opbridge.export(model, (clouds[0],), exporter=exporter, input_names=["points"],
                                dynamic_axes={"points": {1: "n"}}, check_args=(clouds[1],))
        session = opbridge.session(proto)
        for i, c in enumerate(clouds[1:], 1):
            for j, o in enumerate(session.run(None, {"points": c.numpy()})):
                out[f"ort_{exporter}{i}_{j}"] = o
    np.savez(sys.argv[2], **out)
''')


def test_pointnet2_backbones_export_with_the_point_count_dynamic(tmp_path):
    python = envs.python_with("mmdet3d-1.4.0", MMDET3D, on_top=True)
    g = np.random.default_rng(0)
    clouds = {f"points{i}": np.concatenate([g.uniform(0, 1, (2, n, 3)), g.uniform(0, 1, (2, n, 1))], 2)
              .astype(np.float32) for i, n in enumerate((400, 300, 520))}
    np.savez(tmp_path / "in.npz", **clouds)
    run = subprocess.run([str(python), "-c", SCRIPT, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    got = np.load(tmp_path / "out.npz")
    outputs = sorted({k.split("_")[1] for k in got if k.startswith("eager0_")}, key=int)
    assert len(outputs) == 10
    for i in range(3):
        for j in outputs:
            np.testing.assert_array_equal(got[f"eager{i}_{j}"], got[f"own{i}_{j}"])  # the rules = mmdet3d's forward
    for exporter in ("dynamo", "torchscript"):
        for i in (1, 2):
            for j in outputs:
                eager, ort = got[f"eager{i}_{j}"], got[f"ort_{exporter}{i}_{j}"]
                assert ort.shape == eager.shape and ort.dtype == eager.dtype, (exporter, i, j)
                if eager.dtype.kind in "iu":
                    np.testing.assert_array_equal(ort, eager)
                else:
                    np.testing.assert_allclose(ort, eager, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(eager).max()))
    # The numbering of the whole cloud (msg's first sa_indices), past the example's 400 points.
    for exporter in ("dynamo", "torchscript"):
        np.testing.assert_array_equal(got[f"ort_{exporter}2_7"], np.tile(np.arange(520), (2, 1)))
