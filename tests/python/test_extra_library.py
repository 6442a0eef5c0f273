"""A second op library, built outside this repository's CMake project with the installed
opbridge CMake package, loads into both PyTorch and ONNX Runtime beside the built-in one."""

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import opbridge

HERE = Path(__file__).parent / "extra_library"


@pytest.fixture(scope="module")
def extra(tmp_path_factory):
    src = tmp_path_factory.mktemp("extra_src")
    for f in HERE.iterdir():
        shutil.copy(f, src)
    build = src / "build"
    prefix = f"{opbridge.cmake_prefix_path()};{torch.utils.cmake_prefix_path}"
    subprocess.run(["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                    f"-DCMAKE_PREFIX_PATH={prefix}"], check=True, capture_output=True, text=True)
    subprocess.run(["cmake", "--build", str(build)], check=True, capture_output=True, text=True)
    return opbridge.load_library(build / "libextra_ops_torch.so")


class Axpy(torch.nn.Module):
    def forward(self, x, bias=None):
        return torch.ops.extra.axpy(x, bias, alpha=1.5) if bias is not None else torch.ops.extra.axpy(x, alpha=1.5)


def test_library_metadata(extra):
    assert extra.torch_namespace == "extra"
    assert extra.onnx_domain == "com.example.extra"
    assert [op.name for op in extra.ops] == ["axpy"]
    assert extra.ort_path.name == "libextra_ops_ort.so"
    # The built-in library is untouched by the second one.
    assert "axpy" not in [op.name for op in opbridge.builtin.ops]


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
