"""opbridge.export proves declared dynamic axes at a second size: models that are right at the
example and wrong (or failing) elsewhere are refused, naming the axis, the sizes, the outputs and
what in the graph holds the example's size. Each refused model is also exported with
prove_dynamic=False and shown wrong at the second size by running it: the check is what catches it."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest
import torch

import opbridge


class BakedK(torch.nn.Module):
    """nsample computed from the point count (an attribute not declared symbolic): the TorchScript trace
    writes it as a fixed attribute, the dynamo exporter specializes the count."""

    def forward(self, xyz):
        return torch.ops.opbridge.ball_query(xyz, xyz, 0.3, xyz.shape[1] // 4)


class Loop(torch.nn.Module):
    """A Python loop over a dynamic axis: the TorchScript trace unrolls it at the example's size."""

    def forward(self, x):
        return torch.stack([torch.ops.opbridge.my_add(x[i], x[i]) for i in range(x.shape[0])])


class Sound(torch.nn.Module):
    def forward(self, x, y):
        return torch.ops.opbridge.my_add(x, y) * x.shape[0], y.sum(0)


class Offsets(torch.nn.Module):
    """An input whose values depend on another's size (cumulative segment ends): no second size can be
    derived by resampling, only given."""

    def forward(self, xyz, offset):
        return torch.ops.opbridge.knn_query(xyz, offset, k=2)[0]


def _export(model, args, exporter, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return opbridge.export(model, args, exporter=exporter, **kw)


def test_a_baked_attribute_is_refused_naming_axis_sizes_output_and_attribute():
    xyz = torch.rand(2, 64, 3)
    kw = dict(input_names=["xyz"], dynamic_axes={"xyz": {1: "n"}})
    with pytest.raises(opbridge.OpbridgeError) as e:
        _export(BakedK(), (xyz,), "torchscript", **kw)
    text = str(e.value)
    for part in ("second size", "input 'xyz'", "axis 1 ('n')", "exported at 64, run at 128", "shape [2, 128, 16] in ONNX Runtime, [2, 128, 32] eagerly", "BallQuery", "nsample=16 (= n 64 / 4)",
                 "TorchScript", "check_args", "prove_dynamic=False"):
        assert part in text, (part, text)
    # Without the proof the export goes through, and is wrong at 128 points.
    proto = _export(BakedK(), (xyz,), "torchscript", prove_dynamic=False, **kw)
    got = opbridge.session(proto).run(None, {"xyz": torch.rand(2, 128, 3).numpy()})[0]
    assert got.shape == (2, 128, 16)  # eager takes 32 per ball


def test_the_dynamo_exporter_refuses_the_same_model_with_torch_exports_guards():
    with pytest.raises(opbridge.OpbridgeError) as e:
        _export(BakedK(), (torch.rand(2, 64, 3),), "dynamo", input_names=["xyz"], dynamic_axes={"xyz": {1: "n"}})
    text = str(e.value)
    assert "axis 1 of input 'xyz'" in text and "fixed to 64" in text
    # The guard the model's code generated, and the line that generated it.
    assert "torch.export's guards on those sizes" in text and "//4), 16) at " in text, text
    assert "test_second_size.py:" in text and "xyz.shape[1] // 4)" in text, text


def test_an_unrolled_loop_is_refused():
    kw = dict(input_names=["x"], dynamic_axes={"x": {0: "batch"}})
    with pytest.raises(opbridge.OpbridgeError, match=r"(?s)batch 2 -> 4.*output '.*' \[4, 3\]: shape \[2, 3\]"):
        _export(Loop(), (torch.randn(2, 3),), "torchscript", **kw)
    proto = _export(Loop(), (torch.randn(2, 3),), "torchscript", prove_dynamic=False, **kw)
    assert opbridge.session(proto).run(None, {"x": np.ones((5, 3), np.float32)})[0].shape == (2, 3)


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_a_sound_model_is_proven_and_says_at_which_sizes(exporter, caplog):
    x, y = torch.rand(3, 4), torch.rand(3, 4)
    with caplog.at_level(logging.INFO, logger="opbridge"):
        proto = _export(Sound(), (x, y), exporter, input_names=["x", "y"], dynamic_axes={"x": {0: "b"}, "y": {0: "b"}})
    assert "proven at a second size (derived): b: 3 -> 6" in caplog.text
    out = opbridge.session(proto).run(None, {"x": np.ones((5, 4), np.float32), "y": np.ones((5, 4), np.float32)})
    np.testing.assert_allclose(out[0], np.full((5, 4), 15.0))


def test_check_args_give_the_second_size_and_must_match_the_call():
    x, y = torch.rand(3, 4), torch.rand(3, 4)
    kw = dict(input_names=["x", "y"], dynamic_axes={"x": {0: "b"}, "y": {0: "b"}})
    _export(Sound(), (x, y), "dynamo", check_args=(torch.rand(7, 4), torch.rand(7, 4)), **kw)
    with pytest.raises(opbridge.OpbridgeError, match="check_args holds 1 tensors, the example 2"):
        _export(Sound(), (x, y), "dynamo", check_args=(torch.rand(7, 4),), **kw)
    with pytest.warns(opbridge.UnprovenWarning, match="check_args has the example's size on input 'x'"):
        _export(Sound(), (x, y), "dynamo", check_args=(torch.rand(3, 4), torch.rand(3, 4)), **kw)


def test_an_axis_no_second_size_runs_for_is_a_warning_saying_how_to_prove_it():
    xyz, offset = torch.rand(8, 3), torch.tensor([8])
    kw = dict(input_names=["xyz", "offset"], dynamic_axes={"xyz": {0: "n"}})
    with pytest.warns(opbridge.UnprovenWarning, match=r"(?s)input 'xyz'.*not proven.*n 8 -> 16: RuntimeError: "
                                             r"opbridge::knn_query.*check_args="):
        _export(Offsets(), (xyz, offset), "dynamo", **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error", opbridge.UnprovenWarning)
        _export(Offsets(), (xyz, offset), "dynamo", check_args=(torch.rand(13, 3), torch.tensor([13])), **kw)
        _export(Offsets(), (xyz, offset), "dynamo", prove_dynamic=False, **kw)


class RepeatInterleave(torch.nn.Module):
    def forward(self, pos):
        return pos.reshape(-1, 3) * 2, torch.arange(pos.shape[0]).repeat_interleave(pos.shape[1])


def test_a_graph_that_fails_in_onnx_runtime_is_refused():
    """The dynamo exporter's Expand for repeat_interleave over a dynamic count: ONNX Runtime fails."""
    kw = dict(input_names=["pos"], dynamic_axes={"pos": {1: "n"}})
    with pytest.raises(opbridge.OpbridgeError, match="fails in ONNX Runtime.*Expand"):
        _export(RepeatInterleave(), (torch.rand(2, 5, 3),), "dynamo", **kw)


class DictInput(torch.nn.Module):
    def forward(self, data):
        return data["pos"] * 2, data["x"].sum(1)


class DictInputBaked(torch.nn.Module):
    def forward(self, data):
        pos = data["pos"]
        return torch.ops.opbridge.ball_query(pos, pos, 0.3, pos.shape[1] // 4), data["x"] * 2


def test_dynamic_axes_name_tensors_inside_a_dict_and_are_proven(caplog):
    data = {"pos": torch.rand(2, 64, 3), "x": torch.rand(2, 64, 5)}
    kw = dict(input_names=["pos", "x"], dynamic_axes={"pos": {1: "n"}, "x": {1: "n"}})
    for exporter in opbridge.EXPORTERS:
        with caplog.at_level(logging.INFO, logger="opbridge"):
            proto = _export(DictInput(), (data,), exporter, **kw)
        assert [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in proto.graph.input] == \
            [[2, "n", 3], [2, "n", 5]]
    assert "n: 64 -> 128" in caplog.text


def test_dynamic_shapes_that_the_model_fixes_are_refused_naming_the_path():
    data = {"pos": torch.rand(2, 64, 3), "x": torch.rand(2, 64, 5)}
    n = torch.export.Dim("n")
    with pytest.raises(opbridge.OpbridgeError) as e:
        _export(DictInputBaked(), (data,), "dynamo", dynamic_shapes=({"pos": {1: n}, "x": {1: n}},))
    text = str(e.value)
    assert "axis 1 of input" in text and "(args[0]['pos']) is fixed to 64" in text, text
    assert "L['data']['pos'].size()[1]//4), 16) at" in text, text  # torch.export's guard, with its line
    _export(DictInput(), (data,), "dynamo", dynamic_shapes=({"pos": {1: n}, "x": {1: n}},))


def test_verify_proves_the_graphs_dynamic_axes_too():
    xyz = torch.rand(2, 64, 3)
    kw = dict(input_names=["xyz"], dynamic_axes={"xyz": {1: "n"}})
    baked = _export(BakedK(), (xyz,), "torchscript", prove_dynamic=False, **kw)
    report = opbridge.verify(BakedK(), (xyz,), baked)
    assert all(o.ok for o in report.outputs)  # right at the example ...
    assert not report.ok and "nsample=16" in report.second_size and "SECOND SIZE" in report.table()  # ... not at 128
    assert opbridge.verify(BakedK(), (xyz,), baked, prove_dynamic=False).ok
    sound = _export(Sound(), (torch.rand(3, 4), torch.rand(3, 4)), "dynamo", input_names=["x", "y"],
                    dynamic_axes={"x": {0: "b"}, "y": {0: "b"}})
    report = opbridge.verify(Sound(), (torch.rand(3, 4), torch.rand(3, 4)), sound,
                             check_args=(torch.rand(9, 4), torch.rand(9, 4)))
    assert report.ok and "b: 3 -> 9" in report.second_size, report


class RandomStart(torch.nn.Module):
    def forward(self, src, ptr):
        return torch.ops.opbridge.furthest_point_sampling_ratio(src, ptr, ratio=0.5, random_start=True)


def test_outputs_random_by_declaration_are_held_to_dtype_and_rank_at_the_second_size():
    src = torch.rand(40, 3)
    ptr = torch.tensor([0, 40])
    kw = dict(input_names=["src", "ptr"], dynamic_axes={"src": {0: "n"}})
    # Random picks differ between runs; the proof must not call that a wrong model.
    proto = _export(RandomStart(), (src, ptr), "dynamo", check_args=(torch.rand(60, 3), torch.tensor([0, 60])), **kw)
    assert proto is not None


class TrainingBatchNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(4)

    def forward(self, x):
        return self.norm(x) * 2


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_the_proof_leaves_the_model_as_it_was(exporter):
    # A model left in training mode: the proof's eager calls would update BatchNorm's statistics.
    model = TrainingBatchNorm().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    if exporter == "torchscript":  # it traces in eval mode
        _export(model, (torch.randn(6, 4),), exporter, input_names=["x"], dynamic_axes={"x": {0: "b"}})
    else:  # the graph normalises by the running statistics, the model by the batch's: refused
        with pytest.raises(opbridge.OpbridgeError, match="in training mode .* call model.eval()"):
            _export(model, (torch.randn(6, 4),), exporter, input_names=["x"], dynamic_axes={"x": {0: "b"}})
    assert model.training and model.norm.training
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_a_value_eager_gives_as_infinite_or_nan_is_a_difference():
    from opbridge._runtime.agreement import gap as _gap

    for want, got in (([1.0, np.inf, 5.0], [1.0, 3.0, 500.0]), ([np.nan, 5.0], [0.0, 500.0])):
        gap = _gap("y", np.array(got), np.array(want), 1e-5, 1e-6)
        assert gap.excess == np.inf, (want, got, gap)
    assert _gap("y", np.array([1.0, np.inf]), np.array([1.0, np.inf]), 1e-5, 1e-6).excess == 0.0


class WriteThroughView(torch.nn.Module):
    """Writes into x through a view of it (`y = x[..., :3]; y[..., 0] = ...`): eagerly x changes too,
    the TorchScript exporter's graph changes only the copy it makes of y."""

    def forward(self, x, c):
        y = x[:, :, :3]
        y[:, :, 0] = y[:, :, 0] - c.unsqueeze(1)
        return torch.cat([x, y], -1)


@pytest.mark.parametrize("dynamic", [True, False])
def test_a_graph_wrong_at_the_example_itself_is_refused_with_or_without_dynamic_axes(dynamic):
    x, c = torch.rand(5, 4, 4), torch.rand(5)
    axes = {"x": {0: "n"}, "c": {0: "n"}} if dynamic else None
    with pytest.raises(opbridge.OpbridgeError, match=r"disagrees with eager in ONNX Runtime at the example's own "
                                                     r"inputs:\n  output .* \[5, 4, 7\]: max abs diff .*\n.*through a view"):
        _export(WriteThroughView(), (x, c), "torchscript", input_names=["x", "c"], dynamic_axes=axes)
    # The dynamo exporter functionalizes the write: right at both sizes.
    proto = _export(WriteThroughView(), (x, c), "dynamo", input_names=["x", "c"], dynamic_axes=axes)
    x2, c2 = torch.rand(7, 4, 4), torch.rand(7)
    got = opbridge.session(proto).run(None, {"x": x2.numpy(), "c": c2.numpy()})[0] if dynamic else None
    if dynamic:
        np.testing.assert_allclose(got, WriteThroughView()(x2.clone(), c2).numpy(), rtol=1e-6)


class WritesItsInput(torch.nn.Module):
    def forward(self, x):
        x.mul_(2)
        return x + 1


def test_a_model_that_writes_into_its_inputs_is_proven_on_what_the_caller_gave():
    # Eager ran on the example itself before: the runtime was then fed the doubled tensor at the
    # second size and the export was refused although the graph is right.
    x = torch.rand(6, 3)
    proto = _export(WritesItsInput(), (x,), "torchscript", input_names=["x"], dynamic_axes={"x": {0: "n"}})
    y = torch.rand(4, 3)
    np.testing.assert_allclose(opbridge.session(proto).run(None, {"x": y.numpy()})[0], (2 * y + 1).numpy(), rtol=1e-6)


def test_rows_in_another_order_are_named_in_a_warning_and_other_differences_refused():
    from opbridge._runtime.agreement import gap, wrong_at_example

    g = np.random.default_rng(0)
    want = g.normal(size=(40, 5)).astype(np.float32)
    swapped = want.copy()
    swapped[[3, 17]] = want[[17, 3]] * (1 + 1e-6)  # two proposals whose order hung on rounding
    gaps = [gap("rois", swapped, want, 1e-5, 1e-6)]
    assert gaps[0].excess > 1e3
    with pytest.warns(opbridge.ReorderedRowsWarning, match=r"output 'rois' \[40, 5\]: 2 rows in another order "
                                                        r"in ONNX Runtime than eagerly, 0 others differ"):
        wrong_at_example("opbridge.export", "ONNX Runtime", "dynamo", gaps, [swapped], [want], set(), False)
    changed = swapped.copy()
    changed[17] += 0.5  # a near tie NMS broke the other way: one row differs (at most 2 may)
    with pytest.warns(opbridge.ReorderedRowsWarning, match=r"1 rows in another order .*, 1 others differ"):
        wrong_at_example("opbridge.export", "ONNX Runtime", "dynamo", [gap("rois", changed, want, 1e-5, 1e-6)],
                         [changed], [want], set(), False)
    one_off = want.copy()
    one_off[9] += 0.5  # one row differs and none moved: no near tie, wrong
    with pytest.raises(opbridge.OpbridgeError, match=r"output 'rois' \[40, 5\]: max abs diff 0.5"):
        wrong_at_example("opbridge.export", "ONNX Runtime", "dynamo", [gap("rois", one_off, want, 1e-5, 1e-6)],
                         [one_off], [want], set(), False)
    changed[[5, 6]] += 0.5  # three rows differ: wrong
    with pytest.raises(opbridge.OpbridgeError, match=r"output 'rois' \[40, 5\]: max abs diff "):
        wrong_at_example("opbridge.export", "ONNX Runtime", "dynamo", [gap("rois", changed, want, 1e-5, 1e-6)],
                         [changed], [want], set(), False)
    # Integer outputs are never taken as reordered: equal or wrong.
    labels = np.arange(40)
    moved = labels.copy()
    moved[[3, 17]] = labels[[17, 3]]
    with pytest.raises(opbridge.OpbridgeError, match="2 of 40 values differ"):
        wrong_at_example("opbridge.export", "ONNX Runtime", "dynamo", [gap("labels", moved, labels, 1e-5, 1e-6)],
                         [moved], [labels], set(), False)
