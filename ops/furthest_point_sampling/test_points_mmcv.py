"""mmcv's point ops on opbridge, run by mmcv-lite 2.1.0 itself in the cached mmdet environment:
furthest_point_sample (its Python allocates CUDA tensors: it runs substituted),
furthest_point_sample_with_dist and ball_query with a shell (min_radius > 0) eagerly on
mmcv._ext, knn (its Python asks for CUDA: substituted), grouping_operation and PointsSampler's
D-FPS / F-FPS / FS samplers, against the numpy loops of test_furthest_point_sampling.py and
test_ball_query.py; then a small model calling them exported with both exporters, the point count
dynamic, ONNX Runtime equal to eager at two counts."""

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from test_furthest_point_sampling import dist_reference, reference as fps_reference

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "ball_query"))
from test_ball_query import reference as ball_reference  # noqa: E402

SIZES = (300, 420)  # the exported model's example, then the second count ONNX Runtime runs

MMCV_SCRIPT = textwrap.dedent('''
    import sys
    import numpy as np, torch
    import opbridge, opbridge.compat
    opbridge.compat.install("mmcv")
    from mmcv.ops import (PointsSampler, ball_query, furthest_point_sample, furthest_point_sample_with_dist,
                          gather_points, grouping_operation, knn)
    d = np.load(sys.argv[1])
    out = {}
    xyz, feats, matrix = torch.tensor(d["xyz"]), torch.tensor(d["feats"]), torch.tensor(d["matrix"])
    centres = torch.tensor(d["centres"])
    # On mmcv._ext as mmcv calls it, no substitution.
    out["with_dist"] = furthest_point_sample_with_dist(matrix, 40).numpy()
    out["shell"] = ball_query(0.2, 0.45, 12, xyz, centres).numpy()
    out["grouped"] = grouping_operation(feats, torch.tensor(out["shell"])).numpy()
    try:
        furthest_point_sample(xyz, 40)
        out["plain_fps_error"] = np.array("")
    except Exception as e:  # its Python allocates torch.cuda tensors
        out["plain_fps_error"] = np.array(str(e))
    with opbridge.substitutions():
        out["fps"] = furthest_point_sample(xyz, 40).numpy()
        out["knn"] = knn(5, xyz, centres).numpy()
        out["knn_transposed"] = knn(5, xyz.transpose(1, 2).contiguous(), centres.transpose(1, 2).contiguous(),
                                    True).numpy()
        for name, mods, ranges, counts in (("dfps", ["D-FPS"], [-1], [24]), ("ffps", ["F-FPS"], [-1], [24]),
                                           ("fs", ["FS"], [-1], [16]), ("mixed", ["F-FPS", "D-FPS"], [120, -1],
                                                                          [16, 12])):
            out["sampler_" + name] = PointsSampler(counts, mods, ranges)(xyz, feats).numpy()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.sampler = PointsSampler([16, 12], ["F-FPS", "D-FPS"], [120, -1])
            self.fs = PointsSampler([8], ["FS"], [-1])

        def forward(self, xyz, feats):
            idx = self.sampler(xyz, feats)
            picked = gather_points(xyz.transpose(1, 2).contiguous(), idx).transpose(1, 2).contiguous()
            shell = ball_query(0.2, 0.45, 12, xyz, picked)
            return idx, shell, grouping_operation(feats, shell), knn(5, xyz, picked), self.fs(xyz, feats)

    net = Net().eval()
    clouds = [(torch.tensor(d[f"xyz{n}"]), torch.tensor(d[f"feats{n}"])) for n in (0, 1)]
    with opbridge.substitutions():
        for i, args in enumerate(clouds):
            for j, o in enumerate(net(*args)):
                out[f"eager{i}_{j}"] = o.numpy()
    for exporter in ("dynamo", "torchscript"):
        proto = opbridge.export(net, clouds[0], exporter=exporter, input_names=["xyz", "feats"],
                                dynamic_axes={"xyz": {1: "n"}, "feats": {2: "n"}})
        out[f"nodes_{exporter}"] = np.array(sorted(n.op_type for n in proto.graph.node if n.domain == "opbridge"))
        session = opbridge.session(proto)
        for i, (x, f) in enumerate(clouds):
            for j, o in enumerate(session.run(None, {"xyz": x.numpy(), "feats": f.numpy()})):
                out[f"ort_{exporter}{i}_{j}"] = o
    np.savez(sys.argv[2], **out)
''')


def cloud(b, n, seed):
    g = torch.Generator().manual_seed(seed)
    xyz = torch.rand(b, n, 3, generator=g)
    xyz[:, 5] = xyz[:, 2]  # a copy of a point: distance 0, kept by a shell
    return xyz, torch.randn(b, 4, n, generator=g)


def square_dist(xyz, feats):
    """What mmcv's F-FPS samples over: squared cdist of the points with their features."""
    a = torch.cat([xyz, feats.transpose(1, 2)], 2)
    return torch.square(torch.cdist(a, a))


def grouped(feats, idx):
    return np.stack([f[:, i] for f, i in zip(feats, idx)])


def knn_reference(xyz, centres, k):
    d2 = ((centres[:, :, None] - xyz[:, None]) ** 2).sum(-1)
    return np.argsort(d2, -1, kind="stable")[..., :k].transpose(0, 2, 1)


@pytest.mark.environments
def test_real_mmcv_point_ops_run_and_export_on_opbridge(tmp_path):
    sys.path.insert(0, str(HERE.parents[1] / "tests" / "python"))
    import envs
    from test_mmdet import MMDET

    python = envs.python_with("mmdet-3.3.0", MMDET, on_top=True)
    xyz, feats = cloud(2, 200, 1)
    centres = xyz[:, ::10].contiguous()
    matrix = square_dist(xyz, feats)
    sized = {}
    for i, n in enumerate(SIZES):
        sized[f"xyz{i}"], sized[f"feats{i}"] = (t.numpy() for t in cloud(2, n, 10 + i))
    np.savez(tmp_path / "in.npz", xyz=xyz.numpy(), feats=feats.numpy(), matrix=matrix.numpy(),
             centres=centres.numpy(), **sized)
    run = subprocess.run([str(python), "-c", MMCV_SCRIPT, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    got = np.load(tmp_path / "out.npz")
    x, f, c = xyz.numpy(), feats.numpy(), centres.numpy()

    assert "torch.cuda.IntTensor" in str(got["plain_fps_error"])  # why it runs substituted on a CPU
    np.testing.assert_array_equal(got["fps"], fps_reference(x, 40, 1024, False))
    np.testing.assert_array_equal(got["with_dist"], dist_reference(matrix.numpy(), 40))
    shell = ball_reference(x, c, 0.45, 12, min_radius=0.2)
    assert (shell != ball_reference(x, c, 0.45, 12)).any() and (shell == 5).any()  # a shell, the copy kept
    np.testing.assert_array_equal(got["shell"], shell)
    np.testing.assert_array_equal(got["grouped"], grouped(f, shell))
    np.testing.assert_array_equal(got["knn"], knn_reference(x, c, 5))
    np.testing.assert_array_equal(got["knn_transposed"], knn_reference(x, c, 5))

    dfps = fps_reference(x, 24, 1024, False)
    ffps = dist_reference(matrix.numpy(), 24)
    assert (dfps != ffps).any()
    np.testing.assert_array_equal(got["sampler_dfps"], dfps)
    np.testing.assert_array_equal(got["sampler_ffps"], ffps)
    np.testing.assert_array_equal(got["sampler_fs"], np.concatenate([ffps[:, :16], dfps[:, :16]], 1))
    head = dist_reference(square_dist(xyz[:, :120], feats[:, :, :120]).numpy(), 16)
    tail = 120 + fps_reference(x[:, 120:], 12, 1024, False)
    np.testing.assert_array_equal(got["sampler_mixed"], np.concatenate([head, tail], 1))

    for exporter in ("dynamo", "torchscript"):
        assert sorted(set(got[f"nodes_{exporter}"])) == [
            "BallQuery", "FurthestPointSampling", "FurthestPointSamplingWithDist", "GatherPoints", "GroupPoints",
            "KnnPoints"], got[f"nodes_{exporter}"]
        for i in range(len(SIZES)):
            for j in range(5):
                eager, ort = got[f"eager{i}_{j}"], got[f"ort_{exporter}{i}_{j}"]
                assert ort.shape == eager.shape and ort.dtype == eager.dtype, (exporter, i, j)
                np.testing.assert_array_equal(ort, eager, err_msg=f"{exporter}, cloud {i}, output {j}")
    # The eager model itself, at the second count, against the loops.
    x1 = got["eager1_0"]
    sx, sf = (torch.from_numpy(sized[k]) for k in ("xyz1", "feats1"))
    head = dist_reference(square_dist(sx[:, :120], sf[:, :, :120]).numpy(), 16)
    np.testing.assert_array_equal(x1, np.concatenate([head, 120 + fps_reference(sx[:, 120:].numpy(), 12, 1024, False)],
                                                     1))
    picked = np.stack([p[i] for p, i in zip(sx.numpy(), x1)])
    np.testing.assert_array_equal(got["eager1_1"], ball_reference(sx.numpy(), picked, 0.45, 12, min_radius=0.2))
