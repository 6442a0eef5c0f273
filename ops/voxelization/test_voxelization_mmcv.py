"""mmcv's voxelization and dynamic scatter on opbridge: mmcv._ext's hard_voxelize_forward,
dynamic_voxelize_forward and dynamic_point_to_voxel_forward / _backward called exactly as
mmcv/ops/voxelize.py and scatter_points.py call them, mmcv's Voxelization and DynamicScatter
substituted by the ops at export (both exporters, ONNX Runtime at two point counts against the
numpy loops), and mmcv-lite itself running on them in the cached mmdet environment."""

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
from test_voxelization import KITTI, PILLAR, SECOND, cloud, crowded, dynamic_reference, hard_reference

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "dynamic_scatter"))
from test_dynamic_scatter import backward_reference, reference as scatter_reference  # noqa: E402


def mmcv_hard(points, voxel_size, coors_range, max_points, max_voxels):
    """_Voxelization.forward's own steps (mmcv 2.x): max-size buffers, filled, then sliced."""
    voxels = points.new_zeros(size=(max_voxels, max_points, points.size(1)))
    coors = points.new_zeros(size=(max_voxels, 3), dtype=torch.int)
    num = points.new_zeros(size=(max_voxels,), dtype=torch.int)
    voxel_num = torch.zeros(size=(), dtype=torch.long)
    ext.hard_voxelize_forward(points, torch.tensor(voxel_size, dtype=torch.float), torch.tensor(coors_range,
                              dtype=torch.float), voxels, coors, num, voxel_num, max_points=max_points,
                              max_voxels=max_voxels, NDim=3, deterministic=True)
    return voxels[:voxel_num], coors[:voxel_num], num[:voxel_num]


@pytest.mark.parametrize("voxel_size,max_points,max_voxels", [(PILLAR, 4, 30), (SECOND, 2, 500), (PILLAR, 32, 5000)])
def test_ext_hard_and_dynamic_voxelize_fill_mmcvs_buffers(voxel_size, max_points, max_voxels):
    points = cloud(3000, 30)
    got = mmcv_hard(points, voxel_size, KITTI, max_points, max_voxels)
    for g, w in zip(got, hard_reference(points.numpy(), voxel_size, KITTI, max_points, max_voxels)):
        np.testing.assert_array_equal(g.numpy(), w)
    coors = points.new_zeros(size=(points.size(0), 3), dtype=torch.int)
    ext.dynamic_voxelize_forward(points, torch.tensor(voxel_size), torch.tensor(KITTI), coors, NDim=3)
    np.testing.assert_array_equal(coors.numpy(), dynamic_reference(points.numpy(), voxel_size, KITTI))


def test_ext_hard_voxelize_refuses_a_buffer_too_small():
    points = cloud(500, 31)
    small = points.new_zeros((2, 5, 4))
    with pytest.raises(RuntimeError, match=r"voxels must hold at least \d+ voxels of shape \(5, 4\), got \(2, 5, 4\)"):
        ext.hard_voxelize_forward(points, torch.tensor(PILLAR), torch.tensor(KITTI), small, torch.zeros(2, 3).int(),
                                  torch.zeros(2).int(), torch.zeros(()).long(), max_points=5, max_voxels=40, NDim=3,
                                  deterministic=True)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_ext_dynamic_point_to_voxel_forward_and_backward(reduce):
    g = torch.Generator().manual_seed(32)
    feats = torch.randn(400, 5, generator=g)
    coors = torch.randint(-1, 5, (400, 3), generator=g).int()
    got = ext.dynamic_point_to_voxel_forward(feats, coors, reduce)
    want = scatter_reference(feats.numpy(), coors.numpy(), reduce)
    np.testing.assert_allclose(got[0].numpy(), want[0], rtol=1e-5, atol=1e-6)
    for a, b in zip(got[1:], want[1:]):
        np.testing.assert_array_equal(a.numpy(), b)
    grad_voxel = torch.randn(got[0].shape, generator=g)
    grad_feats = torch.full_like(feats, 7.0)  # overwritten, as mmcv's kernel zeroes it first
    ext.dynamic_point_to_voxel_backward(grad_feats, grad_voxel, feats, got[0], got[2], got[3], reduce)
    want_grad = backward_reference(grad_voxel.numpy(), feats.numpy(), got[0].numpy(), got[2].numpy(), got[3].numpy(),
                                   reduce)
    np.testing.assert_allclose(grad_feats.numpy(), want_grad, rtol=1e-6)


# ---- mmcv's modules substituted at export ---------------------------------------------------------

# Stand-ins with mmcv 2.x's names and call structure (Voxelization.forward calls the module global
# `voxelization`, DynamicScatter's forward is replaced whole), over an extension that is absent.
STAND_IN = '''
import torch

class _Voxelization(torch.autograd.Function):
    @staticmethod
    def forward(ctx, points, voxel_size, coors_range, max_points=35, max_voxels=20000, deterministic=True):
        raise ImportError("mmcv._ext is not installed")

voxelization = _Voxelization.apply

class Voxelization(torch.nn.Module):
    def __init__(self, voxel_size, point_cloud_range, max_num_points, max_voxels=20000, deterministic=True):
        super().__init__()
        self.voxel_size, self.point_cloud_range, self.max_num_points = voxel_size, point_cloud_range, max_num_points
        self.max_voxels = max_voxels if isinstance(max_voxels, tuple) else (max_voxels, max_voxels)
        self.deterministic = deterministic

    def forward(self, input):
        max_voxels = self.max_voxels[0] if self.training else self.max_voxels[1]
        return voxelization(input, self.voxel_size, self.point_cloud_range, self.max_num_points, max_voxels,
                            self.deterministic)

class _DynamicScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, feats, coors, reduce_type="max"):
        raise ImportError("mmcv._ext is not installed")

dynamic_scatter = _DynamicScatter.apply

class DynamicScatter(torch.nn.Module):
    def __init__(self, voxel_size, point_cloud_range, average_points):
        super().__init__()
        self.voxel_size, self.point_cloud_range, self.average_points = voxel_size, point_cloud_range, average_points

    def forward(self, points, coors):
        raise ImportError("mmcv._ext is not installed")
'''


@pytest.fixture
def mmcv_voxel():
    names = ["mmcv", "mmcv.ops", "mmcv.ops.voxelize", "mmcv.ops.scatter_points"]
    saved = {name: sys.modules.get(name) for name in names}
    for name in names:
        sys.modules[name] = types.ModuleType(name)
    source = compile(textwrap.dedent(STAND_IN), "<mmcv.ops stand-in>", "exec")
    for name in names[2:]:
        exec(source, sys.modules[name].__dict__)
    yield sys.modules["mmcv.ops.voxelize"], sys.modules["mmcv.ops.scatter_points"]
    for name, old in saved.items():
        if old is None:
            del sys.modules[name]
        else:
            sys.modules[name] = old


def batch_coors(points, seed):
    """(N, 4) (batch, z, y, x): the dynamic voxels of two items, as mmdet3d pads them; a row of an
    item past the last row's is dropped by mmcv's loop, and so here."""
    coors = torch.from_numpy(dynamic_reference(points.numpy(), PILLAR, KITTI))
    batch = (torch.arange(len(points)) >= len(points) // 2).int()
    batch[len(points) // 3] = 2  # past the last row's item
    return torch.cat([batch[:, None], coors], 1)


def scatter_by_item(feats, coors, reduce):
    """mmcv's DynamicScatter.forward for batch-first rows: item by item, concatenated."""
    coors, out_f, out_c = np.asarray(coors), [], []
    for i in range(int(coors[-1, 0]) + 1):
        rows = coors[:, 0] == i
        f, c, _, _ = scatter_reference(feats[rows], coors[rows][:, 1:], reduce)
        out_f.append(f)
        out_c.append(np.concatenate([np.full((len(c), 1), i, c.dtype), c], 1))
    return np.concatenate(out_f), np.concatenate(out_c)


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_mmcv_voxelization_and_dynamic_scatter_export_with_the_point_count_dynamic(mmcv_voxel, exporter):
    voxelize, scatter = mmcv_voxel

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.hard = voxelize.Voxelization(PILLAR, KITTI, 6, (500, 300))
            self.dynamic = voxelize.Voxelization(PILLAR, KITTI, -1)
            self.scatter = scatter.DynamicScatter(PILLAR, KITTI, True)
            self.scatter_max = scatter.DynamicScatter(PILLAR, KITTI, False)

        def forward(self, points, coors4):
            voxels, coors, num = self.hard(points)
            mean, mean_coors = self.scatter(points, self.dynamic(points))
            top, top_coors = self.scatter_max(points, coors4)
            return voxels, coors, num, mean, mean_coors, top, top_coors

    model = Encoder().eval()
    args = (cloud(2000, 33), batch_coors(cloud(2000, 33), 34))
    m = opbridge.export(model, args, exporter=exporter, input_names=["points", "coors4"],
                        dynamic_axes={"points": {0: "n"}, "coors4": {0: "n"}})
    assert sorted(n.op_type for n in m.graph.node if n.domain == "opbridge") == [
        "DynamicScatter", "DynamicScatter", "DynamicVoxelize", "HardVoxelize"]
    sess = opbridge.session(m)
    for n in (2000, 3100):
        points = cloud(n, n)
        coors4 = batch_coors(points, n)
        got = sess.run(None, {"points": points.numpy(), "coors4": coors4.numpy()})
        p = points.numpy()
        for g, w in zip(got[:3], hard_reference(p, PILLAR, KITTI, 6, 300)):
            np.testing.assert_array_equal(g, w)
        mean, mean_coors, _, _ = scatter_reference(p, dynamic_reference(p, PILLAR, KITTI), "mean")
        np.testing.assert_allclose(got[3], mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(got[4], mean_coors)
        top, top_coors = scatter_by_item(p, coors4, "max")
        np.testing.assert_array_equal(got[5], top)
        np.testing.assert_array_equal(got[6], top_coors)
    with opbridge.substitutions():  # eager, on the ops
        np.testing.assert_array_equal(model(*args)[6].numpy(), scatter_by_item(args[0].numpy(), args[1], "max")[1])


# ---- the real mmcv-lite on mmcv._ext ---------------------------------------------------------------

MMCV_SCRIPT = textwrap.dedent('''
    import sys
    import numpy as np, torch
    import opbridge, opbridge.compat
    opbridge.compat.install("mmcv")
    from mmcv.ops import DynamicScatter, Voxelization, dynamic_scatter
    d = np.load(sys.argv[1])
    points, coors4 = torch.tensor(d["points"]), torch.tensor(d["coors4"])
    out = {}
    for name, size, max_points, max_voxels in (("pillar", d["pillar"], 32, 400), ("second", d["second"], 3, 900)):
        v, c, n = Voxelization(size.tolist(), d["range"].tolist(), max_points, max_voxels).eval()(points)
        out[name + "_voxels"], out[name + "_coors"], out[name + "_num"] = v.numpy(), c.numpy(), n.numpy()
    coors = Voxelization(d["pillar"].tolist(), d["range"].tolist(), -1)(points)
    out["dynamic"] = coors.numpy()
    feats = torch.tensor(d["feats"])
    for reduce in ("sum", "mean", "max"):
        f = feats.clone().requires_grad_()
        vf, vc = dynamic_scatter(f, coors, reduce)
        vf.backward(torch.tensor(d["grad_" + reduce]))
        out[reduce], out[reduce + "_coors"], out[reduce + "_grad"] = vf.detach().numpy(), vc.numpy(), f.grad.numpy()
    f = feats.clone().requires_grad_()
    vf, vc = DynamicScatter(d["pillar"].tolist(), d["range"].tolist(), False)(f, coors4)
    vf.backward(torch.ones_like(vf) * torch.arange(vf.shape[0], dtype=vf.dtype)[:, None])
    out["batched"], out["batched_coors"], out["batched_grad"] = vf.detach().numpy(), vc.numpy(), f.grad.numpy()
    model = Voxelization(d["pillar"].tolist(), d["range"].tolist(), 32, 400).eval()
    for exporter in ("dynamo", "torchscript"):
        proto = opbridge.export(model, (points,), exporter=exporter, input_names=["points"],
                                dynamic_axes={"points": {0: "n"}})
        got = opbridge.session(proto).run(None, {"points": d["points2"]})
        for i, g in enumerate(got):
            out[f"ort_{exporter}_{i}"] = g
    np.savez(sys.argv[2], **out)
''')


@pytest.mark.environments
def test_real_mmcv_voxelization_and_dynamic_scatter_run_on_opbridge(tmp_path):
    sys.path.insert(0, str(HERE.parents[1] / "tests" / "python"))
    import envs
    from test_mmdet import MMDET

    python = envs.python_with("mmdet-3.3.0", MMDET, on_top=True)
    # Spread points and a crowd in a few SECOND voxels (one pillar): both limits are reached.
    shuffle = torch.randperm(4000, generator=torch.Generator().manual_seed(41))
    points = torch.cat([cloud(3000, 35), crowded(1000, 40, SECOND, cells=8)])[shuffle]
    points2 = cloud(5200, 36)
    coors = dynamic_reference(points.numpy(), PILLAR, KITTI)
    coors4 = batch_coors(points, 37).numpy()
    g = torch.Generator().manual_seed(38)
    feats = torch.randn(4000, 6, generator=g, dtype=torch.float64).numpy()
    want = {r: scatter_reference(feats, coors, r) for r in ("sum", "mean", "max")}
    grads = {"grad_" + r: np.random.default_rng(39).standard_normal(want[r][0].shape) for r in want}
    np.savez(tmp_path / "in.npz", points=points.numpy(), points2=points2.numpy(), coors4=coors4, feats=feats,
             pillar=np.array(PILLAR), second=np.array(SECOND), range=np.array(KITTI), **grads)
    run = subprocess.run([str(python), "-c", MMCV_SCRIPT, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    got = np.load(tmp_path / "out.npz")
    p = points.numpy()
    for name, size, max_points, max_voxels in (("pillar", PILLAR, 32, 400), ("second", SECOND, 3, 900)):
        want_hard = hard_reference(p, size, KITTI, max_points, max_voxels)
        for key, w in zip(("_voxels", "_coors", "_num"), want_hard):
            np.testing.assert_array_equal(got[name + key], w)
    assert len(got["pillar_num"]) == 400 and got["pillar_num"].max() == 32 and got["second_num"].max() == 3
    np.testing.assert_array_equal(got["dynamic"], coors)
    for r, (vf, vc, p2v, count) in want.items():
        np.testing.assert_allclose(got[r], vf, rtol=1e-12)
        np.testing.assert_array_equal(got[r + "_coors"], vc)
        np.testing.assert_allclose(got[r + "_grad"], backward_reference(grads["grad_" + r], feats, vf, p2v, count, r),
                                   rtol=1e-12)
    batched, batched_coors = scatter_by_item(feats, torch.from_numpy(coors4), "max")
    np.testing.assert_array_equal(got["batched"], batched)
    np.testing.assert_array_equal(got["batched_coors"], batched_coors)
    # mmcv's loop over the items, backward: each item's max rule, voxel v's gradient v.
    want_grad, first = np.zeros_like(feats), 0
    for i in range(int(coors4[-1, 0]) + 1):
        rows = coors4[:, 0] == i
        f, c, p2v, count = scatter_reference(feats[rows], coors4[rows][:, 1:], "max")
        grad = np.repeat(np.arange(first, first + len(f), dtype=feats.dtype)[:, None], feats.shape[1], 1)
        want_grad[rows] = backward_reference(grad, feats[rows], f, p2v, count, "max")
        first += len(f)
    np.testing.assert_array_equal(got["batched_grad"], want_grad)
    for exporter in ("dynamo", "torchscript"):
        for i, w in enumerate(hard_reference(points2.numpy(), PILLAR, KITTI, 32, 400)):
            np.testing.assert_array_equal(got[f"ort_{exporter}_{i}"], w)
