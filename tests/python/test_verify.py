"""opbridge.verify's comparison: integers and bools exactly, floating point within tolerance, each
mismatch located (how many elements, the worst one's index and both values); outputs random by
declaration (an op's random_when, read from the manifest) held to their dtypes and shapes, and
OpTest under the same rule. The graphs are built by hand with onnx.helper, or exported and then
perturbed, so the expected verdict is known independently of the exporter."""

import ctypes
import json

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as T, helper

from cli_inline import run_cli
import opbridge
from opbridge._library import files
from opbridge._library.registry import find_op, libraries
from opbridge._runtime.verify import compare, random_outputs
from opbridge.testing import OpCase, Sample, op_test_suite, random_tensor


def _model(nodes, inputs, outputs, inits=(), opsets=(("", 17),)):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = 8
    return m


class Times1(torch.nn.Module):
    def forward(self, x):
        return x * 1


def _plus(elem, values, shape):
    """x + c in ONNX, c a constant of `shape`: what eager's x * 1 becomes where c is not zero."""
    return _model([helper.make_node("Add", ["x", "c"], ["out"])], [helper.make_tensor_value_info("x", elem, shape)],
                  [helper.make_tensor_value_info("out", elem, shape)], [helper.make_tensor("c", elem, shape, values)])


# --- integers and bools exactly ------------------------------------------------------------------


def test_an_index_off_by_one_at_large_values_fails_naming_the_index_and_both_values():
    # rtol * |value| >= 1 from 1e5 on: the float rule passed these.
    idx = torch.tensor([150000, 250000, 999999])
    report = opbridge.verify(Times1(), (idx,), _plus(T.INT64, [1], []))
    assert not report.ok, report.table()
    out = report.outputs[0]
    assert (out.mismatches, out.index, out.got, out.want, out.max_abs) == (3, (0,), 150001, 150000, 1.0)
    row = report.table().splitlines()[-1]
    assert "MISMATCH 3 of 3 elements differ; worst at [0]: ONNX Runtime 150001, PyTorch 150000 (off by 1)" in row


@pytest.mark.parametrize("dtype,elem", [(torch.int32, T.INT32), (torch.int64, T.INT64), (torch.uint8, T.UINT8)])
def test_one_wrong_integer_is_found_at_its_multi_index_whatever_the_tolerance(dtype, elem):
    c = np.zeros((2, 3, 4), np.int64)
    c[1, 2, 3], c[0, 1, 1] = 2, 1  # two elements off, the worst by 2
    x = torch.arange(24, dtype=torch.int64).reshape(2, 3, 4).mul(7).to(dtype)
    report = opbridge.verify(Times1(), (x,), _plus(elem, c.ravel().tolist(), [2, 3, 4]), rtol=0.5, atol=10.0)
    out = report.outputs[0]
    want = int(x[1, 2, 3])
    assert not report.ok and (out.mismatches, out.index, out.got, out.want) == (2, (1, 2, 3), want + 2, want)
    assert "2 of 24 elements differ; worst at [1, 2, 3]" in out.note
    assert opbridge.verify(Times1(), (x,), _plus(elem, [0] * 24, [2, 3, 4])).ok


class Positive(torch.nn.Module):
    def forward(self, x):
        return x > 0


def test_bools_are_compared_exactly_and_the_flipped_one_is_named():
    graph = _model([helper.make_node("GreaterOrEqual", ["x", "zero"], ["out"])],  # >= where eager has >
                   [helper.make_tensor_value_info("x", T.FLOAT, [2, 3])], [helper.make_tensor_value_info("out", T.BOOL, [2, 3])],
                   [helper.make_tensor("zero", T.FLOAT, [], [0.0])])
    x = torch.tensor([[1.0, -1.0, 2.0], [-3.0, 0.0, 4.0]])
    report = opbridge.verify(Positive(), (x,), graph, atol=1.0)  # a tolerance says nothing for bools
    out = report.outputs[0]
    assert not report.ok and (out.mismatches, out.index, out.got, out.want) == (1, (1, 1), True, False)
    assert "1 of 6 elements differ; worst at [1, 1]: ONNX Runtime True, PyTorch False" in out.note
    x[1, 1] = 0.5
    assert opbridge.verify(Positive(), (x,), graph).ok


def test_floats_keep_their_tolerance_and_a_mismatch_is_located():
    c = np.zeros((3, 2), np.float32)
    c[2, 0], c[0, 1] = 1e-3, 1e-4
    x = torch.full((3, 2), 1.0)
    graph = _plus(T.FLOAT, c.ravel().tolist(), [3, 2])
    loose = opbridge.verify(Times1(), (x,), graph, rtol=1e-2, atol=0.0)
    assert loose.ok and loose.outputs[0].mismatches == 0 and loose.outputs[0].index is None
    tight = opbridge.verify(Times1(), (x,), graph)
    out = tight.outputs[0]
    assert not tight.ok and (out.mismatches, out.index, out.want) == (2, (2, 0), 1.0)
    assert out.got == pytest.approx(1.001) and out.max_abs == pytest.approx(1e-3, rel=1e-3)
    assert "2 of 6 elements differ; worst at [2, 0]" in out.note


def test_compare_says_where_onnx_runtime_gives_a_nan():
    want = np.array([1.0, 2.0, 3.0], np.float32)
    got = np.array([1.0, np.nan, 3.0], np.float32)
    out = compare("y", got, want, 1e-5, 1e-6)
    assert not out.ok and (out.mismatches, out.index, out.want) == (1, (1,), 2.0) and np.isnan(out.got)
    assert "1 NaN where PyTorch has none" in out.note and "worst at [1]" in out.note
    assert compare("y", want.copy(), want, 0, 0).ok


def test_verify_on_the_command_line_compares_integers_exactly(tmp_path):
    onnx.save(_plus(T.INT64, [0, 0, 1], [3]), tmp_path / "idx.onnx")
    (tmp_path / "m.py").write_text("import torch\n\nclass Times1(torch.nn.Module):\n"
                                   "    def forward(self, x):\n        return x * 1\n")
    np.savez(tmp_path / "in.npz", x=np.array([100000, 200000, 300000], np.int64))
    r = run_cli("verify", tmp_path / "idx.onnx", "--torch", f"{tmp_path / 'm.py'}:Times1", "--inputs",
                tmp_path / "in.npz")  # in this process, stdout and stderr as a process's
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "worst at [2]: ONNX Runtime 300001, PyTorch 300000 (off by 1)" in r.stdout
    assert "FAIL: mismatch in out" in r.stdout


# --- random by declaration -----------------------------------------------------------------------


def test_random_when_is_in_the_manifest():
    op = find_op("furthest_point_sampling_ratio")
    assert op.random_when == "random_start"
    lib = next(lib for lib in libraries() if op in lib.ops)
    manifest = getattr(ctypes.CDLL(str(lib.ort_path)), files.manifest_symbol())  # the JSON as the library writes it
    manifest.restype = ctypes.c_char_p
    raw = json.loads(manifest())
    assert {o["name"]: o["random_when"] for o in raw["ops"]}["furthest_point_sampling_ratio"] == "random_start"
    assert all(o["random_when"] == "" for o in raw["ops"] if o["name"] != "furthest_point_sampling_ratio")
    assert op.random_with({"random_start": True}) == "furthest_point_sampling_ratio with random_start=1"
    assert op.random_with({"random_start": 0}) == op.random_with({}) == ""  # the default is False
    assert find_op("knn_query").random_with({}) == ""


class Sampled(torch.nn.Module):
    """FPS, the sampled points, and something that does not depend on the sampling."""

    def __init__(self, random_start):
        super().__init__()
        self.random_start = random_start

    def forward(self, src, ptr):
        idx = torch.ops.opbridge.furthest_point_sampling_ratio(src, ptr, 0.25, self.random_start)
        return idx, src[idx] * 2, src.sum(0)


def _clouds():
    return random_tensor([400, 3], seed=4), torch.tensor([0, 150, 400])


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_verify_holds_outputs_random_by_declaration_to_shape_and_dtype(exporter):
    src, ptr = _clouds()
    proto = opbridge.export(Sampled(True), (src, ptr), exporter=exporter)
    report = opbridge.verify(Sampled(True), (src, ptr), proto)
    assert report.ok, report.table()
    why = "furthest_point_sampling_ratio with random_start=1"
    assert [o.random for o in report.outputs] == [why, why, ""]  # the sum does not depend on the sampling
    assert report.outputs[2].max_rel <= 1e-5  # compared by value
    rows = report.table().splitlines()[2:]
    assert all(f"random by declaration: {why}; shape and dtype compared" in r for r in rows[:2])
    assert rows[2].rstrip().endswith("ok")
    # Two eager calls start elsewhere (the sum of 2 x 75 random starts is checked, not one start
    # that may be row 0 by chance): these outputs are random indeed.
    firsts = [torch.ops.opbridge.furthest_point_sampling_ratio(src, ptr, 0.25, True)[[0, 38]] for _ in range(75)]
    assert len({tuple(f.tolist()) for f in firsts}) > 1
    # Without the random start, the values are compared.
    fixed = opbridge.export(Sampled(False), (src, ptr), exporter=exporter)
    plain = opbridge.verify(Sampled(False), (src, ptr), fixed)
    assert plain.ok and [o.random for o in plain.outputs] == ["", "", ""] and plain.outputs[0].max_abs == 0


def _appended(proto: onnx.ModelProto, k: int, node_type: str, **attrs) -> onnx.ModelProto:
    """The model with graph output k passed through one more node (same name for the result)."""
    m = onnx.ModelProto()
    m.CopyFrom(proto)
    out = m.graph.output[k]
    inputs = [out.name + "_pre"] * (2 if node_type == "Concat" else 1)
    for node in m.graph.node:
        node.output[:] = [out.name + "_pre" if o == out.name else o for o in node.output]
        node.input[:] = [out.name + "_pre" if i == out.name else i for i in node.input]
    m.graph.node.append(helper.make_node(node_type, inputs, [out.name], **attrs))
    if node_type == "Cast":
        out.type.tensor_type.elem_type = attrs["to"]
    out.type.tensor_type.ClearField("shape")
    return m


def test_a_random_output_still_fails_on_its_dtype_or_shape():
    src, ptr = _clouds()
    proto = opbridge.export(Sampled(True), (src, ptr))
    wrong_dtype = opbridge.verify(Sampled(True), (src, ptr), _appended(proto, 1, "Cast", to=T.DOUBLE))
    out = wrong_dtype.outputs[1]
    assert not wrong_dtype.ok and out.note.startswith("dtype float64 != float32 (random by declaration")
    wrong_shape = opbridge.verify(Sampled(True), (src, ptr), _appended(proto, 0, "Concat", axis=0))
    out = wrong_shape.outputs[0]
    assert not wrong_shape.ok and out.note.startswith("shape (202,) != (101,) (random by declaration")
    assert [o.ok for o in wrong_shape.outputs] == [False, True, True]


def test_the_graph_walk_follows_the_random_values_and_their_sizes():
    op = find_op("furthest_point_sampling_ratio")
    fps = helper.make_node(op.onnx_type, ["src", "ptr"], ["idx"], domain=op.onnx_domain, name="fps", ratio=0.5,
                           random_start=1)
    then = helper.make_graph([helper.make_node("Identity", ["idx"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", T.INT64, None)])
    nodes = [fps, helper.make_node("Gather", ["src", "idx"], ["picked"]),
             helper.make_node("NonZero", ["idx"], ["nz"], name="nonzero"),
             helper.make_node("Unsqueeze", ["idx", "axes"], ["column"]),  # sized by axes, not by idx
             helper.make_node("Identity", ["src"], ["plain"]),
             helper.make_node("If", ["cond"], ["branch"], name="choose", then_branch=then, else_branch=then)]
    m = _model(nodes, [helper.make_tensor_value_info("src", T.FLOAT, [None, 3]),
                       helper.make_tensor_value_info("ptr", T.INT64, [None]),
                       helper.make_tensor_value_info("cond", T.BOOL, [])],
               [helper.make_tensor_value_info(n, T.FLOAT, None) for n in ("picked", "nz", "plain", "branch", "column")],
               [helper.make_tensor("axes", T.INT64, [1], [1])], opsets=(("", 17), (op.onnx_domain, op.since_version)))
    why = "furthest_point_sampling_ratio with random_start=1"
    assert random_outputs(m) == {"picked": (why, ""), "nz": (why, "NonZero node 'nonzero'"), "column": (why, ""),
                                 "branch": (why, "If node 'choose'")}  # reads idx from the outer scope
    node = m.graph.node[0]
    k = next(k for k, a in enumerate(node.attribute) if a.name == "random_start")
    node.attribute[k].i = 0
    assert random_outputs(m) == {}
    del node.attribute[k]  # the default: False
    assert random_outputs(m) == {}


# --- OpTest under the same rule ------------------------------------------------------------------


def fps_from_row_0(src, ptr, ratio=0.5, random_start=False):
    """Furthest point sampling per segment from its first row, in float64 (the segments' sizes
    are what a random start keeps)."""
    out = []
    for a, b in zip(ptr[:-1], ptr[1:]):
        pts = src[a:b].astype(np.float64)
        m = int(np.ceil(np.float32(b - a) * np.float32(ratio))) if b > a else 0
        picked, dist = [0], np.full(b - a, np.inf)
        for _ in range(m - 1):
            dist = np.minimum(dist, ((pts - pts[picked[-1]]) ** 2).sum(1))
            picked.append(int(np.argmax(dist)))
        out += [a + p for p in picked[:m]]
    return np.array(out, np.int64)


def test_optest_holds_a_random_sample_to_shapes_and_dtypes_from_the_manifest():
    src, ptr = _clouds()
    fixed = Sample((src, ptr), {"ratio": 0.25}, name="from_row_0")
    random = Sample((src, ptr), {"ratio": 0.25, "random_start": True}, name="random_start")
    suite = op_test_suite(OpCase("furthest_point_sampling_ratio", fps_from_row_0, [fixed, random]))()
    suite.test_eager_matches_reference(fixed)  # the reference is right where values are compared
    assert suite._random(random) == "furthest_point_sampling_ratio with random_start=1" and not suite._random(fixed)
    suite.test_eager_matches_reference(random)
    suite.test_eager_non_contiguous(random)
    suite.test_opcheck(random)
    for exporter in opbridge.EXPORTERS:
        suite.test_export_runs_in_onnxruntime(random, exporter)
    suite.case.samples = [random]  # the eight-thread test runs the first sample
    suite.test_one_session_from_eight_threads()
