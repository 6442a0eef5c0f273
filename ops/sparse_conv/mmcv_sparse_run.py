"""Runs mmcv-lite's real sparse modules on opbridge (mmcv._ext from opbridge.compat) and saves what
they compute, for test_sparse_conv_mmcv.py to hold against dense PyTorch convolutions; then exports
a SECOND-style encoder of those modules (opbridge's substitution rules) with each exporter and
saves ONNX Runtime's outputs at another voxel count beside mmcv's eager ones.

    python mmcv_sparse_run.py in.npz out.npz   (in an environment with mmcv-lite and mmengine)
"""

import sys

import numpy as np
import torch

import opbridge
import opbridge.compat

opbridge.compat.install("mmcv")
from mmcv.ops import (SparseConv2d, SparseConv3d, SparseConvTensor, SparseInverseConv2d,  # noqa: E402
                      SparseInverseConv3d, SparseMaxPool2d, SparseMaxPool3d, SparseSequential, SubMConv2d,
                      SubMConv3d)

SHAPE3, SHAPE2 = [9, 10, 11], [12, 13]


def step(out, name, module, x, tensor, seed):
    """One module on `tensor` (whose features are x, a leaf): its output and, for a loss
    sum(features * G), the gradients of x and of the module's parameters."""
    y = module(tensor)
    g = torch.randn(y.features.shape, generator=torch.Generator().manual_seed(seed), dtype=y.features.dtype)
    (y.features * g).sum().backward()
    out[f"{name}_features"] = y.features.detach().numpy()
    out[f"{name}_indices"] = y.indices.numpy()
    out[f"{name}_shape"] = np.asarray(y.spatial_shape)
    out[f"{name}_g"] = g.numpy()
    out[f"{name}_x_grad"] = x.grad.numpy()
    for p, v in module.named_parameters():
        out[f"{name}_{p}"] = v.detach().numpy()
        out[f"{name}_{p}_grad"] = v.grad.numpy()
    return y


def leaf(a):
    return torch.tensor(a, requires_grad=True)


def modules(d, out):
    torch.manual_seed(0)
    sites3, sites2 = torch.tensor(d["sites3"]), torch.tensor(d["sites2"])
    x = leaf(d["x3"])
    step(out, "subm3", SubMConv3d(4, 5, 3, indice_key="s"), x, SparseConvTensor(x, sites3, SHAPE3, 2), 1)
    x = leaf(d["x3"])
    t = SparseConvTensor(x, sites3, SHAPE3, 2)
    down = step(out, "down3", SparseConv3d(4, 6, 3, stride=2, padding=1, indice_key="d"), x, t, 2)
    z = leaf(down.features.detach().numpy())
    couple = SparseConvTensor(z, down.indices, down.spatial_shape, 2)
    couple.indice_dict = t.indice_dict  # the chain's rulebook cache, as a network passes it on
    step(out, "inverse3", SparseInverseConv3d(6, 4, 3, indice_key="d"), z, couple, 3)
    x = leaf(d["x3"])
    step(out, "pool3", SparseMaxPool3d(2, 2), x, SparseConvTensor(x, sites3, SHAPE3, 2), 4)
    x = leaf(d["x2"])
    step(out, "subm2", SubMConv2d(3, 4, 3, indice_key="s2"), x, SparseConvTensor(x, sites2, SHAPE2, 2), 5)
    x = leaf(d["x2"])
    t = SparseConvTensor(x, sites2, SHAPE2, 2)
    down = step(out, "down2", SparseConv2d(3, 4, (3, 2), stride=2, padding=1, indice_key="p"), x, t, 6)
    z = leaf(down.features.detach().numpy())
    couple = SparseConvTensor(z, down.indices, down.spatial_shape, 2)
    couple.indice_dict = t.indice_dict
    step(out, "inverse2", SparseInverseConv2d(4, 3, (3, 2), indice_key="p"), z, couple, 7)
    x = leaf(d["x2"])
    step(out, "pool2", SparseMaxPool2d(3, 2, padding=1), x, SparseConvTensor(x, sites2, SHAPE2, 2), 8)


class Encoder(torch.nn.Module):
    """SECOND's sparse middle encoder in small: SubM blocks (BatchNorm, ReLU) sharing a rulebook, a
    strided block, a SubM block at its sites, then an inverse block back to the input sites (the
    strided layer's rulebook run backwards) and max pooling."""

    def __init__(self):
        super().__init__()

        def block(conv, cout):
            return [conv, torch.nn.BatchNorm1d(cout), torch.nn.ReLU()]

        self.net = SparseSequential(
            *block(SubMConv3d(4, 16, 3, padding=1, bias=False, indice_key="subm1"), 16),
            *block(SubMConv3d(16, 16, 3, padding=1, bias=False, indice_key="subm1"), 16),
            *block(SparseConv3d(16, 32, 3, stride=2, padding=1, bias=False, indice_key="down1"), 32),
            *block(SubMConv3d(32, 32, 3, padding=1, indice_key="subm2"), 32))
        self.up = SparseSequential(*block(SparseInverseConv3d(32, 16, 3, indice_key="down1"), 16))
        self.pool = SparseMaxPool3d(2, 2)
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, torch.nn.BatchNorm1d):
                    m.running_mean.uniform_(-0.2, 0.2)
                    m.running_var.uniform_(0.5, 1.5)

    def forward(self, features, indices):
        deep = self.net(SparseConvTensor(features, indices, SHAPE3, 2))
        up = self.up(deep)
        pooled = self.pool(deep)
        return deep.features, deep.indices, up.features, pooled.features, pooled.indices


def export(d, out):
    torch.manual_seed(1)
    model = Encoder().eval()
    first = (torch.tensor(d["x_first"]), torch.tensor(d["sites_first"]))
    second = (torch.tensor(d["x_second"]), torch.tensor(d["sites_second"]))
    with torch.no_grad():
        eager = model(*second)  # mmcv's own forward, on mmcv._ext
    for k, v in enumerate(eager):
        out[f"eager_{k}"] = v.numpy()
    for exporter in opbridge.EXPORTERS:
        proto = opbridge.export(model, first, exporter=exporter, input_names=["features", "indices"],
                                dynamic_axes={"features": {0: "voxels"}, "indices": {0: "voxels"}})
        out[f"{exporter}_nodes"] = np.array(sorted(n.op_type for n in proto.graph.node if n.domain == "opbridge"))
        sess = opbridge.session(proto)
        got = sess.run(None, {"features": second[0].numpy(), "indices": second[1].numpy()})
        for k, v in enumerate(got):
            out[f"{exporter}_{k}"] = v
        nothing = sess.run(None, {"features": np.zeros((0, 4), np.float32), "indices": np.zeros((0, 4), np.int32)})
        out[f"{exporter}_empty_shapes"] = np.array([v.shape for v in nothing])


if __name__ == "__main__":
    data = dict(np.load(sys.argv[1]))
    results = {}
    modules(data, results)
    if "x_first" in data:
        export(data, results)
    np.savez(sys.argv[2], **results)
