"""A second op library, built outside this repository's CMake project with the installed
opbridge CMake package, loads into both PyTorch and ONNX Runtime beside the built-in one."""

import subprocess

import numpy as np
import pytest
import torch

import opbridge
from opbridge.testing import BadInput, OpCase, Sample, op_test_suite, random_tensor as r

@pytest.fixture(scope="module", autouse=True)
def extra(extra_ops):
    return extra_ops


def test_kernel_tests_build_and_pass_out_of_tree(extra):
    # The kernel harness is installed with the SDK headers: an out-of-tree library's C++ kernel
    # tests build against it and run under CTest like the built-in ones.
    build = extra.torch_path.parent
    r = subprocess.run(["ctest", "--test-dir", str(build), "--output-on-failure"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "100% tests passed, 0 tests failed out of 2" in r.stdout, r.stdout


class Axpy(torch.nn.Module):
    def forward(self, x, bias=None):
        return torch.ops.extra.axpy(x, bias, alpha=1.5) if bias is not None else torch.ops.extra.axpy(x, alpha=1.5)


def test_library_metadata(extra):
    assert extra.torch_namespace == "extra"
    assert extra.onnx_domain == "com.example.extra"
    assert sorted(op.name for op in extra.ops) == ["attr_mix", "axpy", "bias_gelu", "cst_dual_residual",
                                                   "radius_pairs", "scaled_add_rule"]
    assert extra.ort_path.name == "libextra_ops_ort.so"
    # The built-in library is untouched by the second one.
    assert not {op.name for op in extra.ops} & {op.name for op in opbridge.builtin.ops}


def test_eager(extra):
    x = torch.randn(3, 4)
    b = torch.randn(3, 4)
    a = np.float32(1.5)
    np.testing.assert_allclose(torch.ops.extra.axpy(x, b, alpha=1.5).numpy(), a * x.numpy() + b.numpy(), rtol=1e-6)
    np.testing.assert_allclose(torch.ops.extra.axpy(x, alpha=1.5).numpy(), a * x.numpy(), rtol=1e-6)
    with pytest.raises(RuntimeError, match="extra::axpy: inputs 'x' .* and 'bias' .* must have the same shape"):
        torch.ops.extra.axpy(x, torch.randn(4), alpha=1.0)
    torch.library.opcheck(torch.ops.extra.axpy.default, (x, b), {"alpha": 0.5})


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
@pytest.mark.parametrize("with_bias", [True, False])
def test_export_and_onnxruntime(extra, exporter, with_bias):
    x = torch.randn(2, 5, dtype=torch.float64)
    args = (x, torch.randn(2, 5, dtype=torch.float64)) if with_bias else (x,)
    model = Axpy()
    proto = opbridge.export(model, args, exporter=exporter)
    node = next(n for n in proto.graph.node if n.op_type == "Axpy")
    assert node.domain == "com.example.extra"
    # An omitted optional input is an omitted trailing input, not a dangling name.
    assert list(node.input) == ([proto.graph.input[0].name, proto.graph.input[1].name] if with_bias else [proto.graph.input[0].name])
    report = opbridge.verify(model, args, proto)
    assert report.ok, report.table()
    want = 1.5 * x.numpy() + (args[1].numpy() if with_bias else 0)
    got = opbridge.session(proto).run(None, {i.name: a.numpy() for i, a in zip(proto.graph.input, args)})[0]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_missing_required_attribute_in_onnxruntime(extra):
    from opbridge.testing import node_model

    x = np.ones((2, 2), np.float32)
    m = node_model(extra.op("axpy"), [x], {})
    with pytest.raises(Exception, match="extra::axpy .*required attribute 'alpha' \\(float\\) is missing"):
        opbridge.session(m).run(None, {"x": x})


# ---- the standard suite on the extra ops ---------------------------------------------------
def attr_mix_reference(x, i, f=1.0, ints=(1, 2), floats=(), b=False, s="ab", k=2):
    shift = np.float32(i + sum(ints) + sum(np.float32(v) for v in floats) + int(b) + len(s))
    return x * np.float32(f) + shift, x[: x.shape[0] // k]


TestAttrMix = op_test_suite(
    OpCase(
        "attr_mix",
        reference=attr_mix_reference,
        samples=[
            Sample((r([7]),), {"i": 3}, name="defaults", dynamic={0: [0]}),
            Sample((r([9]),), {"i": -1, "f": 0.5, "ints": [4], "floats": [0.25, 0.5], "b": True, "s": "xyz", "k": 4},
                   name="all_set"),
            Sample((r([5]),), {"i": 0, "ints": [], "floats": [], "k": 7}, name="empty_lists_and_empty_head"),
        ],
        bad_inputs=[
            BadInput((r([4]),), {"i": 1, "k": 0}, r"shape rule x\.shape\[0\] // k divides by zero \(k = 0\)", "k_zero"),
            BadInput((r([2, 2]),), {"i": 1}, "input 'x' must have rank 1", "wrong_rank"),
        ],
        rtol=1e-6,
        resize=lambda s, n: Sample((r([n], seed=n),), s.attrs),
    )
)

TestAxpy = op_test_suite(
    OpCase(
        "axpy",
        reference=lambda x, bias=None, alpha=None: np.float32(alpha).astype(x.dtype) * x + (0 if bias is None else bias),
        samples=[
            Sample((r([3, 4]), r([3, 4], seed=1)), {"alpha": 2.0}, name="with_bias", dynamic={0: [0], 1: [0]}),
            Sample((r([3, 4], "float64"), None), {"alpha": 0.3}, name="without_bias"),
        ],
        resize=lambda s, n: Sample((r([n, 4], seed=n), r([n, 4], seed=n + 1)), s.attrs),
    )
)


def test_meta_kernel_agrees_with_eager_on_errors():
    x = torch.empty(4, device="meta")
    with pytest.raises(RuntimeError, match=r"extra::attr_mix: shape rule x\.shape\[0\] // k divides by zero \(k = 0\)"):
        torch.ops.extra.attr_mix(x, 1, k=0)
    y, head = torch.ops.extra.attr_mix(torch.empty(7, device="meta"), 1, k=3)
    assert head.shape == (2,)


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_dimension_derived_from_a_dynamic_axis_stays_dynamic(exporter):
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.ops.extra.attr_mix(x, 1, k=2)

    proto = opbridge.export(M(), (torch.randn(8),), exporter=exporter, input_names=["x"], dynamic_axes={"x": {0: "n"}})
    head = proto.graph.output[1].type.tensor_type.shape.dim[0]
    assert not head.HasField("dim_value"), head
    sess = opbridge.session(proto)
    for n in (3, 10):
        x = np.arange(n, dtype=np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[1], x[: n // 2])


def test_second_library_in_the_same_domain_is_refused(extra):
    dup = extra.torch_path.with_name("libextra_dup_torch.so")
    with pytest.raises(opbridge.OpbridgeError, match="ONNX domain 'com.example.extra' is already used by op library 'extra_ops'"):
        opbridge.load_library(dup)
    # Sessions still work: the refused library was never registered with ONNX Runtime.
    x = np.ones((2, 2), np.float32)
    proto = opbridge.export(Axpy(), (torch.from_numpy(x),))
    assert opbridge.session(proto).run(None, {proto.graph.input[0].name: x})[0].tolist() == [[1.5, 1.5]] * 2


# ---- nodes named by the definition (reach.cc) -----------------------------------------------
def _gelu(v):
    from math import erf

    return np.vectorize(lambda t: 0.5 * t * (1 + erf(t / np.sqrt(2))))(v.astype(np.float64))


class BiasGelu(torch.nn.Module):
    def forward(self, x, bias):
        return torch.ops.extra.bias_gelu(x, bias)


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_rule_to_an_onnxruntime_contrib_op(extra, exporter):
    # float32: the node is ONNX Runtime's own com.microsoft BiasGelu, which a plain session runs
    # with no opbridge library; float64 (which BiasGelu lacks): the op's own node.
    import onnxruntime as ort

    for dtype, node in (("float32", ("com.microsoft", "BiasGelu")), ("float64", ("com.example.extra", "BiasGelu"))):
        args = (r([2, 3, 8], dtype, seed=1), r([8], dtype, seed=2))
        m = opbridge.export(BiasGelu(), args, exporter=exporter)
        assert [(n.domain, n.op_type) for n in m.graph.node] == [node]
        want = _gelu(args[0].numpy() + args[1].numpy())
        feeds = {i.name: a.numpy() for i, a in zip(m.graph.input, args)}
        sess = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
                if dtype == "float32" else opbridge.session(m))
        np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-5 if dtype == "float32" else 1e-12,
                                   atol=1e-6 if dtype == "float32" else 1e-14)
        np.testing.assert_allclose(BiasGelu()(*args).numpy(), want, rtol=1e-5, atol=1e-6)
    # custom_nodes=True keeps this library's node even for float32.
    m = opbridge.export(BiasGelu(), (r([1, 2, 4]), r([4])), exporter=exporter, custom_nodes=True)
    assert [(n.domain, n.op_type) for n in m.graph.node] == [("com.example.extra", "BiasGelu")]


class CstDualResidual(torch.nn.Module):
    def forward(self, x, y):
        return torch.ops.extra.cst_dual_residual(x, y, alpha=1.5)


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_own_node_in_a_vendor_domain(extra, exporter):
    op = extra.op("cst_dual_residual")
    assert (op.onnx_domain, op.onnx_type) == ("rknn_cst", "cstDualResidual")
    x, y = r([5], seed=3), r([5], seed=4)
    m = opbridge.export(CstDualResidual(), (x, y), exporter=exporter)
    (node,) = m.graph.node
    assert (node.domain, node.op_type, list(node.output)) == ("rknn_cst", "cstDualResidual", ["r1", "r2"])
    assert ("rknn_cst", 1) in {(o.domain, o.version) for o in m.opset_import}
    # This library's ONNX Runtime side registers the kernel in that domain too.
    r1, r2 = opbridge.session(m).run(None, {m.graph.input[0].name: x.numpy(), m.graph.input[1].name: y.numpy()})
    a = np.float32(1.5)
    np.testing.assert_allclose(r1, x.numpy() * a - y.numpy(), rtol=1e-6)
    np.testing.assert_allclose(r2, y.numpy() * a - x.numpy(), rtol=1e-6)


_thirdparty = None


class ScaledAdd(torch.nn.Module):
    def forward(self, a, b):
        return torch.ops.thirdparty.scaled_add(a, b)


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_rule_for_a_third_party_op_targets_another_librarys_op(extra, exporter):
    global _thirdparty
    if _thirdparty is None:  # a third party's op, as its own package would register it
        _thirdparty = torch.library.Library("thirdparty", "DEF")
        _thirdparty.define("scaled_add(Tensor a, Tensor b) -> Tensor")
        _thirdparty.impl("scaled_add", lambda a, b: 2 * a + b, "CompositeExplicitAutograd")
    a, b = r([3, 4], seed=5), r([4], seed=6)
    m = opbridge.export(ScaledAdd(), (a, b), exporter=exporter)
    assert [(n.domain, n.op_type) for n in m.graph.node] == [("opbridge", "MyAdd")]  # the built-in library's
    (got,) = opbridge.session(m).run(None, {m.graph.input[0].name: a.numpy(), m.graph.input[1].name: b.numpy()})
    np.testing.assert_allclose(got, 2 * a.numpy() + b.numpy(), rtol=1e-6)


def test_own_ops_run_in_openvino(extra):
    # opbridge_add_op_library in a project of its own (find_package(opbridge), OpenVINO found
    # beside it) builds the library's OpenVINO side too: its domain's nodes run in OpenVINO.
    assert extra.openvino_path is not None and extra.openvino_path.name == "libextra_ops_ov.so"
    x, b = torch.randn(3, 5), torch.randn(3, 5)
    for args in ((x, b), (x,)):
        proto = opbridge.export(Axpy(), args)
        feeds = {i.name: a.numpy() for i, a in zip(proto.graph.input, args)}
        (got,) = opbridge.session(proto, runtime="openvino").run(None, feeds)
        np.testing.assert_allclose(got, Axpy()(*args).numpy(), rtol=1e-6, atol=1e-6)
