"""Gradients from the definition: ops that name a backward op train in PyTorch (eager and
torch.compile), with broadcasting reduced; ops that do not say so clearly."""

import pytest
import torch

import opbridge


class Residual(torch.nn.Module):
    """A learnable scale and shift around dual_residual and my_add."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
        self.shift = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))

    def forward(self, x, y):
        r1, r2 = opbridge.dual_residual(x * self.scale, y, alpha=0.5)
        return opbridge.my_add(r1, self.shift) - r2


def _reference(m, x, y):
    """The same model in plain torch ops."""
    xs = x * m.scale
    r1, r2 = xs * 0.5 - y, y * 0.5 - xs
    return 2 * r1 + m.shift - r2


def test_gradients_match_plain_torch_with_broadcasting():
    m = Residual()
    with torch.no_grad():
        m.scale.copy_(torch.tensor([0.5, 2.0, -1.0], dtype=torch.float64))
        m.shift.copy_(torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64))
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    y = torch.randn(3, dtype=torch.float64, requires_grad=True)  # broadcasts over the rows
    (m(x, y) ** 2).sum().backward()
    got = [t.grad.clone() for t in (x, y, m.scale, m.shift)]
    for t in (x, y, m.scale, m.shift):
        t.grad = None
    (_reference(m, x, y) ** 2).sum().backward()
    for g, t in zip(got, (x, y, m.scale, m.shift)):
        torch.testing.assert_close(g, t.grad, rtol=1e-12, atol=1e-12)
        assert g.shape == t.shape


def test_a_model_trains():
    torch.manual_seed(0)
    m = Residual()
    x, y = torch.randn(64, 3, dtype=torch.float64), torch.randn(64, 3, dtype=torch.float64)
    target = _reference(m, x, y).detach() * 0 + 1.0
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    losses = []
    for _ in range(40):
        opt.zero_grad()
        loss = ((m(x, y) - target) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(b < a for a, b in zip(losses, losses[1:])) and losses[-1] < 0.7 * losses[0], losses


def test_torch_compile_sees_the_gradient():
    m = Residual()
    x, y = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
    compiled(x, y).sum().backward()
    want = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    m(x, y).sum().backward()
    for w, p in zip(want, m.parameters()):
        torch.testing.assert_close(w, p.grad)


def test_ops_without_a_gradient_say_so():
    x = torch.randn(2, 3, requires_grad=True)
    y = opbridge.foo(x, torch.randn(2, 3))
    with pytest.raises(RuntimeError, match="derivative for opbridge::foo is not implemented"):
        y.sum().backward()


def test_backward_ops_are_listed_with_their_op():
    op = opbridge.builtin.op("dual_residual")
    assert op.backward == "dual_residual_backward"
    bwd = opbridge.builtin.op(op.backward)
    assert [i.name for i in bwd.inputs] == ["grad_r1", "grad_r2"]
    assert [o.name for o in bwd.outputs] == ["grad_x", "grad_y"]


def test_resize_gradient_is_pytorchs_interpolate_gradient():
    x = torch.randn(2, 3, 7, 5, dtype=torch.float64, requires_grad=True)
    scales = torch.tensor([1.0, 1.0, 1.5, 2.5])
    y = opbridge.resize_bicubic(x, scales)
    g = torch.randn_like(y)
    (got,) = torch.autograd.grad(y, x, g)
    xr = x.detach().requires_grad_()
    want_y = torch.nn.functional.interpolate(xr, scale_factor=[1.5, 2.5], mode="bicubic", align_corners=False)
    (want,) = torch.autograd.grad(want_y, xr, g)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    # The scales get no gradient.
    s = scales.clone().requires_grad_()
    assert torch.autograd.grad(opbridge.resize_bicubic(x, s).sum(), s, allow_unused=True) == (None,)


@pytest.mark.parametrize("queries", ["new_xyz", "self"])
def test_knn_distance_gradient_is_that_of_the_distances(queries):
    torch.manual_seed(1)
    xyz = torch.rand(40, 3, dtype=torch.float64, requires_grad=True)
    offset = torch.tensor([25, 40], dtype=torch.int32)
    new_xyz = torch.rand(12, 3, dtype=torch.float64, requires_grad=True) if queries == "new_xyz" else None
    new_offset = torch.tensor([5, 12], dtype=torch.int32) if new_xyz is not None else None
    idx, dist = opbridge.knn_query(xyz, offset, new_xyz, new_offset, k=4)
    g = torch.rand_like(dist)
    inputs = (xyz,) if new_xyz is None else (xyz, new_xyz)
    got = torch.autograd.grad(dist, inputs, g)
    # The same distances from torch ops on the returned neighbours.
    q = xyz if new_xyz is None else new_xyz
    want_dist = (q[:, None, :] - xyz[idx.long()]).norm(dim=-1)
    torch.testing.assert_close(want_dist, dist)
    want = torch.autograd.grad(want_dist, inputs, g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert idx.grad_fn is None and not idx.requires_grad


def test_double_backward_is_refused_naming_the_op():
    x = torch.randn(1, 2, 5, 5, requires_grad=True, dtype=torch.float64)
    w = torch.randn(3, 2, 3, 3, requires_grad=True, dtype=torch.float64)
    offset = torch.randn(1, 18, 3, 3, dtype=torch.float64, requires_grad=True)
    out = torch.ops.opbridge.deform_conv2d(x, w, offset, None, None, [1, 1], [0, 0], [1, 1], 1, 1)
    (g,) = torch.autograd.grad((out ** 2).sum(), x, create_graph=True)
    with pytest.raises(opbridge.OpbridgeError, match=r"opbridge::deform_conv2d: double backward .* not supported"):
        torch.autograd.grad(g.sum(), x)
    (plain,) = torch.autograd.grad((out ** 2).sum(), x, retain_graph=True)  # without create_graph: as before
    torch.testing.assert_close(plain, g.detach())
