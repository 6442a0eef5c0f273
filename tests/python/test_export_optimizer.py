"""opbridge.export's graph optimization: each exporter's constant folding and, for dynamo,
onnxscript's rewrite rules, except where those rules would change a value (they take a scalar
constant within 1e-8 of 0 or 1e-5 of 1 for it)."""

import warnings

import numpy as np
import pytest
import torch

import opbridge


class InverseDistance(torch.nn.Module):
    """PointNet++'s interpolation weights: finite at d = 0 only through the 1e-8."""

    def forward(self, d):
        w = 1.0 / (d + 1e-8)
        return w / w.sum(-1, keepdim=True)


class ScaleNearOne(torch.nn.Module):
    def forward(self, x):
        return x * 1.000001


class ExactIdentities(torch.nn.Module):
    def forward(self, x):
        return torch.ops.opbridge.my_add(x + 0.0, x * 1.0)


def _ops(proto) -> list[str]:
    return [n.op_type for n in proto.graph.node]


def _run(proto, x: torch.Tensor) -> np.ndarray:
    return opbridge.session(proto.SerializeToString()).run(None, {proto.graph.input[0].name: x.numpy()})[0]


def test_a_constant_near_zero_is_kept_and_the_result_stays_finite():
    d = torch.tensor([[0.0, 0.5, 2.0], [1.0, 0.0, 0.0]])
    with pytest.warns(UserWarning, match=r"skipped onnxscript's rewrite rules \(constant folding ran\): they would "
                                         r"replace Add\(x, 1e-08\) \(node '[^']+'\) by x"):
        proto = opbridge.export(InverseDistance(), (d,))
    got = _run(proto, d)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, InverseDistance()(d).numpy(), rtol=1e-6)


def test_a_factor_near_one_is_kept():
    x = torch.full((4,), 1e6)
    with pytest.warns(UserWarning, match=r"Mul\(x, 1\.000001\) \(node '[^']+'\) by x"):
        proto = opbridge.export(ScaleNearOne(), (x,))
    assert "Mul" in _ops(proto)
    np.testing.assert_array_equal(_run(proto, x), ScaleNearOne()(x).numpy())


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_exact_identities_are_still_removed_and_optimize_false_keeps_them(exporter):
    x = torch.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no constant to protect: the rules run, silently
        optimized = opbridge.export(ExactIdentities(), (x,), exporter=exporter)
    raw = opbridge.export(ExactIdentities(), (x,), exporter=exporter, optimize=False)
    if exporter == "dynamo":  # the TorchScript exporter's folding leaves x + 0 and x * 1 alone
        assert _ops(optimized) == ["MyAdd"]
    assert {"Add", "Mul"} <= set(_ops(raw))
    for proto in (optimized, raw):
        np.testing.assert_allclose(_run(proto, x), ExactIdentities()(x).numpy(), rtol=1e-6)


def test_verify_points_at_the_optimizer_for_a_nan_eager_does_not_give():
    # The graph a user gets from onnxscript's rules: 1 / d for 1 / (d + 1e-8).
    d = torch.tensor([[0.0, 0.5, 2.0]])
    lost_guard = opbridge.export(LostGuard(), (d,), optimize=False)
    report = opbridge.verify(InverseDistance(), (d,), lost_guard)
    assert not report.ok
    assert ("1 NaN where PyTorch has none: a graph optimisation may have dropped a guard such as `+ 1e-8`; export "
            "with optimize=False to check") in report.outputs[0].note


class LostGuard(torch.nn.Module):
    def forward(self, d):
        w = 1.0 / d
        return w / w.sum(-1, keepdim=True)
