"""A C++ application that only runs models builds against the installed opbridge tree with no
PyTorch: `find_package(opbridge COMPONENTS ort)` gives the ONNX Runtime headers and library the
tree was built with (opbridge::onnxruntime), the built-in op library (opbridge::opbridge_ort) and
opbridge_add_op_library() for its own ops, which then builds no PyTorch half. With
`OPTIONAL_COMPONENTS openvino` (where the tree and the machine have OpenVINO) it runs the same
models in OpenVINO: libopbridge_ov.so and its own library's OpenVINO side added to an ov::Core."""

import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import opbridge

HERE = Path(__file__).parent


def cmake(*args, check=True):
    r = subprocess.run(["cmake", *args], capture_output=True, text=True)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


@pytest.fixture(scope="module")
def consumer(tmp_path_factory):
    src = tmp_path_factory.mktemp("consumer")
    for f in (HERE / "consumer").iterdir():
        shutil.copy(f, src)
    build = src / "build"
    # Only opbridge's prefix, and torch explicitly out of reach: the ort component must not look.
    cmake("-S", str(src), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
          f"-DCMAKE_PREFIX_PATH={opbridge.cmake_prefix_path()}", "-DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON",
          f"-DEXTRA_OP_SOURCES={HERE / 'extra_library' / 'axpy.cc'}")
    cmake("--build", str(build))
    return build


def run_model(build, model, *libraries, program="run_model"):
    r = subprocess.run([str(build / program), str(model), *map(str, libraries)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    outputs = {name: np.array(values.split(), dtype=np.float32)
               for name, values in (line.split(":", 1) for line in lines[1:])}
    return lines[0], outputs


def test_ort_only_op_library_has_no_torch_half(consumer):
    assert (consumer / "libextra_ops_ort.so").is_file()
    assert not (consumer / "libextra_ops_torch.so").exists()


def test_application_runs_an_exported_model_with_the_builtin_library(consumer, tmp_path):
    class Block(torch.nn.Module):
        def forward(self, a, b):
            return torch.ops.opbridge.my_add(a, b)

    path = tmp_path / "my_add.onnx"
    opbridge.export(Block(), (torch.zeros(2, 3), torch.zeros(2, 3)), str(path), input_names=["a", "b"])
    version, outputs = run_model(consumer, path)
    assert version == f"onnxruntime {opbridge.build_info()['onnxruntime_sdk']}"  # the runtime the tree ships
    (values,) = outputs.values()
    a = b = np.arange(6, dtype=np.float32)  # run_model feeds 0, 1, 2, ... to every input
    np.testing.assert_array_equal(values, 2 * a + b)


def axpy_model(path):
    node = helper.make_node("Axpy", ["x"], ["y"], domain="com.example.extra", alpha=1.5)
    graph = helper.make_graph([node], "axpy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example.extra", 1)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_application_runs_its_own_ort_only_op(consumer, tmp_path):
    path = axpy_model(tmp_path / "axpy.onnx")
    _, outputs = run_model(consumer, path, consumer / "libextra_ops_ort.so")
    np.testing.assert_array_equal(outputs["y"], np.float32(1.5) * np.arange(6, dtype=np.float32))


def test_unknown_component_is_named(tmp_path):
    (tmp_path / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.24)\nproject(p LANGUAGES CXX)\nfind_package(opbridge REQUIRED COMPONENTS cuda)\n")
    r = cmake("-S", str(tmp_path), "-B", str(tmp_path / "b"), f"-DCMAKE_PREFIX_PATH={opbridge.cmake_prefix_path()}",
              check=False)
    assert r.returncode != 0
    assert "unknown component 'cuda' (opbridge has: ort, torch, openvino)" in r.stdout + r.stderr


@pytest.fixture(scope="module")
def consumer_ov(consumer):
    """The OpenVINO application, where this opbridge was built with OpenVINO (the set-up builds it
    where requirements.txt's openvino is installed)."""
    if not opbridge.build_info()["openvino"]:
        pytest.skip("this opbridge was built without OpenVINO")
    assert (consumer / "run_model_ov").is_file(), "find_package(opbridge ... openvino) found no OpenVINO"
    return consumer


def test_application_runs_an_exported_model_in_openvino(consumer_ov, tmp_path):
    class Block(torch.nn.Module):
        def forward(self, a, b):
            return torch.ops.opbridge.dual_residual(torch.ops.opbridge.my_add(a, b), b, alpha=0.5)

    path = tmp_path / "block.onnx"
    a, b = torch.arange(6.0).reshape(2, 3), torch.arange(6.0).reshape(2, 3)  # what run_model_ov feeds
    opbridge.export(Block(), (a, b), str(path), input_names=["a", "b"])
    version, outputs = run_model(consumer_ov, path, program="run_model_ov")
    assert version.startswith(f"openvino {opbridge.build_info()['openvino']}"), version
    for got, want in zip(outputs.values(), Block()(a, b)):
        np.testing.assert_allclose(got, want.numpy().ravel(), rtol=1e-6)


def test_application_runs_its_own_op_in_openvino(consumer_ov, tmp_path):
    # The op library the application built has its OpenVINO side, for its own domain's nodes.
    assert (consumer_ov / "libextra_ops_ov.so").is_file()
    path = axpy_model(tmp_path / "axpy.onnx")
    _, outputs = run_model(consumer_ov, path, consumer_ov / "libextra_ops_ov.so", program="run_model_ov")
    np.testing.assert_array_equal(outputs["y"], np.float32(1.5) * np.arange(6, dtype=np.float32))
    # Without it, OpenVINO cannot read the node, and says which.
    r = subprocess.run([str(consumer_ov / "run_model_ov"), str(path)], capture_output=True, text=True)
    assert r.returncode == 1 and "Axpy" in r.stderr, r.stdout + r.stderr
