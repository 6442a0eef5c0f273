"""opbridge.load_inline / opbridge.load: an op library compiled from a Python string (or files),
cached, exported with both exporters and run in ONNX Runtime from Python and from opbridge-run."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import opbridge
from cli_inline import run_cli

RUNNER = Path(opbridge.__file__).parent / "_sdk/bin/opbridge-run"

# A new op: two outputs and a float attribute.
SOURCE = textwrap.dedent("""\
    #include <opbridge/op.h>

    namespace jitdemo {
    using namespace opbridge;

    void split_scale_kernel(KernelContext& ctx, const TensorView& x, const TensorView& y, double alpha,
                            TensorView& plus_out, TensorView& minus_out) {
      visit_dtype<float, double>(x.dtype, [&](auto zero) {
        using T = decltype(zero);
        const T a = static_cast<T>(alpha);
        const T* px = x.data_as<T>();
        const T* py = y.data_as<T>();
        T* plus = plus_out.data_as<T>();
        T* minus = minus_out.data_as<T>();
        ctx.parallel_for(x.numel(), 4096, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) {
            plus[i] = px[i] + a * py[i];
            minus[i] = px[i] - a * py[i];
          }
        });
      });
    }

    OPBRIDGE_OP(split_scale)
        .doc("(x + alpha*y, x - alpha*y)")
        .types("T", {DType::Float32, DType::Float64})
        .input("x", "T", "first operand")
        .input("y", "T", "second operand, same shape")
        .float_attr("alpha", 1.0, "scale of y")
        .output("plus", "T", shape::same({"x", "y"}), "x + alpha*y")
        .output("minus", "T", shape::same({"x", "y"}), "x - alpha*y")
        .cpu(split_scale_kernel);
    }  // namespace jitdemo
    """)

LOAD = "import opbridge, sys; lib = opbridge.load_inline('jitdemo', sys.stdin.read(), build_directory=sys.argv[1]); " \
       "print(lib.torch_path)"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("jit")


@pytest.fixture(scope="module")
def lib(cache):
    return opbridge.load_inline("jitdemo", SOURCE, build_directory=cache)


class SplitScale(torch.nn.Module):
    def forward(self, x, y):
        return torch.ops.jitdemo.split_scale(x, y, alpha=0.75)


def _want(x, y):
    a = np.float32(0.75).astype(x.dtype)
    return x + a * y, x - a * y


def test_eager(lib):
    x, y = np.random.default_rng(0).standard_normal((2, 3, 4))
    plus, minus = torch.ops.jitdemo.split_scale(torch.from_numpy(x), torch.from_numpy(y), alpha=0.75)
    for got, want in zip((plus, minus), _want(x, y)):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-15)
    assert lib.ort_path.name == "libjitdemo_ort.so" and lib.torch_namespace == "jitdemo"


@pytest.mark.parametrize("exporter", opbridge.EXPORTERS)
def test_export_and_onnxruntime_from_python_and_opbridge_run(lib, exporter, tmp_path):
    x, y = (torch.randn(5, 4) for _ in range(2))
    m = opbridge.export(SplitScale(), (x, y), tmp_path / "m.onnx", exporter=exporter, input_names=["x", "y"])
    node = next(n for n in m.graph.node if n.op_type == "SplitScale")
    assert node.domain == "jitdemo" and list(node.output) == ["plus", "minus"]
    want = _want(x.numpy(), y.numpy())
    got = opbridge.session(m).run(None, {"x": x.numpy(), "y": y.numpy()})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)
    if not RUNNER.exists():
        pytest.skip(f"{RUNNER} is not installed")
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "y.npy", y.numpy())
    r = subprocess.run([str(RUNNER), str(tmp_path / "m.onnx"), "--library", str(lib.ort_path),
                        "--input", f"x={tmp_path / 'x.npy'}", "--input", f"y={tmp_path / 'y.npy'}",
                        "--output-dir", str(tmp_path / "out")], capture_output=True, text=True, env={}, timeout=120)
    assert r.returncode == 0, r.stderr
    for out, w in zip(("plus", "minus"), want):
        np.testing.assert_allclose(np.load(tmp_path / "out" / f"{out}.npy"), w, rtol=1e-6)


def test_second_load_in_a_new_process_hits_the_cache(lib, cache):
    before = lib.torch_path.stat()
    r = subprocess.run([sys.executable, "-c", LOAD, str(cache)], input=SOURCE, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(lib.torch_path)
    assert "building" not in r.stderr, r.stderr
    after = lib.torch_path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_relative_build_directory_is_taken_from_the_working_directory(tmp_path):
    # The generated CMake project names its sources by path: a relative folder reached CMake as
    # written and resolved against the project's own folder ("Cannot find source file").
    r = subprocess.run([sys.executable, "-c", LOAD, "rel"], input=SOURCE, cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).parent.parent == tmp_path / "rel"


def test_another_source_under_a_loaded_namespace_is_refused(lib, cache):
    with pytest.raises(opbridge.OpbridgeError, match="torch namespace 'jitdemo' is already loaded from .*; a process "
                                                     "holds one version of a namespace"):
        opbridge.load_inline("jitdemo", SOURCE + "// changed\n", build_directory=cache)


def test_compile_error_shows_the_compilers_lines(tmp_path):
    source = "#include <opbridge/op.h>\n\nnamespace bad {\nint f() {\n  return undefined_name + 1;\n}\n}\n"
    with pytest.raises(opbridge.OpbridgeError) as e:
        opbridge.load_inline("badlib", source, build_directory=tmp_path)
    msg = str(e.value)
    assert msg.startswith("op library 'badlib': compile failed:\n")
    assert "badlib.cc:5:10: error: " in msg and "undefined_name" in msg
    assert "CMake" not in msg and "ninja" not in msg and "(full log: " in msg
    assert not list(tmp_path.glob("badlib-*/entry.json")), "a failed build leaves no cache entry"


def test_two_processes_build_once_from_files(tmp_path):
    # opbridge.load from a file, called by two processes at once on an empty cache: one builds,
    # the other waits for it and loads the same library.
    src = tmp_path / "twin.cc"
    src.write_text(SOURCE.replace("jitdemo", "twin"))
    code = ("import opbridge, sys, torch; lib = opbridge.load('twin', [sys.argv[1]], build_directory=sys.argv[2]); "
            "print(torch.ops.twin.split_scale(torch.ones(2), torch.ones(2), alpha=2.0)[0].tolist(), lib.torch_path)")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(src), str(tmp_path / "cache")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    assert {o[0] for o in outs} == {outs[0][0]} and outs[0][0].startswith("[3.0, 3.0]")
    assert sum("building op library 'twin'" in o[1] for o in outs) == 1
    assert len(list((tmp_path / "cache").glob("twin-*/entry.json"))) == 1


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    from opbridge._tools.build import cache_root

    monkeypatch.setenv("OPBRIDGE_JIT_DIR", str(tmp_path / "x"))
    assert cache_root() == tmp_path / "x"
    monkeypatch.delenv("OPBRIDGE_JIT_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "opbridge" / "jit"
    with pytest.raises(opbridge.OpbridgeError, match="op library name 'no-dash' is not an identifier"):
        opbridge.load_inline("no-dash", "")


FLAGS_SOURCE = textwrap.dedent("""\
    #include <opbridge/op.h>
    #include "scales.h"  // SCALE_A, from extra_include_paths

    namespace jitflags {
    using namespace opbridge;

    void scaled_kernel(KernelContext&, const TensorView& x, TensorView& y) {
      const float* px = x.data_as<float>();
      float* py = y.data_as<float>();
      for (int64_t i = 0; i < x.numel(); ++i) py[i] = px[i] * (SCALE_A * SCALE_B * SCALE_C);
    }

    OPBRIDGE_OP(scaled)
        .doc("x times the constants the build was given")
        .types("T", {DType::Float32})
        .input("x", "T", "input")
        .output("y", "T", shape::same({"x"}), "x * SCALE_A * SCALE_B * SCALE_C")
        .cpu(scaled_kernel);
    }  // namespace jitflags
    """)


def test_load_inline_passes_include_paths_cmake_arguments_environment_and_link_flags(tmp_path):
    from elftools.elf.elffile import ELFFile

    headers = tmp_path / "include"
    headers.mkdir()
    (headers / "scales.h").write_text("#define SCALE_A 2.0f\n")
    lib = opbridge.load_inline(
        "jitflags", FLAGS_SOURCE, build_directory=tmp_path / "cache", extra_include_paths=[headers],
        extra_cmake_args=["-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG -DSCALE_B=3.0f"],  # CMake's own variable
        build_env={"CXXFLAGS": "-DSCALE_C=5.0f"},  # CMake reads CXXFLAGS from the environment
        extra_ldflags=["-Wl,--build-id=none"])
    x = torch.arange(4, dtype=torch.float32)
    assert torch.equal(torch.ops.jitflags.scaled(x), x * 30)
    for path in (lib.torch_path, lib.ort_path, lib.openvino_path):
        if path is None:  # no OpenVINO side here (test_openvino checks that one is built where it can be)
            continue
        with open(path, "rb") as f:
            assert ELFFile(f).get_section_by_name(".note.gnu.build-id") is None, path  # the link flag reached each


def test_the_command_loads_a_cached_library_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("OPBRIDGE_JIT_DIR", str(tmp_path / "jit"))
    opbridge.load_inline("jitcli", SOURCE.replace("jitdemo", "jitcli"))

    class Model(torch.nn.Module):
        def forward(self, x, y):
            return torch.ops.jitcli.split_scale(x, y, alpha=2.0)[0]

    x = torch.rand(3, 4)
    opbridge.export(Model(), (x, x), tmp_path / "m.onnx")

    def inspect(*extra):
        return subprocess.run([sys.executable, "-m", "opbridge", "inspect", str(tmp_path / "m.onnx"), *extra],
                              capture_output=True, text=True, timeout=300, env={**os.environ})

    assert "MISSING" in inspect().stdout  # not loaded: the command cannot know the op
    r = inspect("--jit", "jitcli")
    assert r.returncode == 0 and "MISSING" not in r.stdout and "SplitScale" in r.stdout, r.stdout + r.stderr
    # A name not in the cache is refused before anything loads: in this process (a process costs 2 s).
    r = run_cli("inspect", tmp_path / "m.onnx", "--jit", "nothere")
    assert r.returncode == 1 and "no op library 'nothere'" in r.stderr and "cached: jitcli" in r.stderr, r.stderr
