"""opbridge.load_inline / load when something is wrong: names that are not plain, namespaces and
domains that belong to PyTorch or ONNX, sources that define nothing or crash while loading, a
damaged cache entry, a killed build, a read-only cache, no compiler, one name for two sources.
Each gets a clear error or is repaired, and the process and the cache's other entries survive."""

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import opbridge
from opbridge._library.files import jit_entry_problem

# One op, x + ADDEND: small, so each build here is a few seconds.
SOURCE = textwrap.dedent("""\
    #include <opbridge/op.h>

    namespace NAME_ops {
    using namespace opbridge;

    void add_kernel(KernelContext&, const TensorView& x, TensorView& y) {
      const float* px = x.data_as<float>();
      float* py = y.data_as<float>();
      for (int64_t i = 0; i < x.numel(); ++i) py[i] = px[i] + ADDEND;
    }

    OPBRIDGE_OP(add_const)
        .doc("x + a constant")
        .types("T", {DType::Float32})
        .input("x", "T", "input")
        .output("y", "T", shape::same({"x"}), "x + the constant")
        .cpu(add_kernel);
    }  // namespace NAME_ops
    """)


def source(name: str, addend: float = 1.0) -> str:
    return SOURCE.replace("NAME", name).replace("ADDEND", f"{addend:.1f}f")


# In a fresh process: load_inline(name, <stdin>) into the cache argv[2], then call the op on ones.
LOAD = ("import opbridge, sys, torch; name = sys.argv[1]; "
        "opbridge.load_inline(name, sys.stdin.read(), build_directory=sys.argv[2]); "
        "print(getattr(torch.ops, name).add_const(torch.ones(2)).tolist())")


def load_in_child(name: str, text: str, cache: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LOAD, name, str(cache)], input=text, capture_output=True, text=True,
                          timeout=600, **kw)


def entries(cache: Path, name: str) -> list[Path]:
    return sorted(p.parent for p in cache.glob(f"{name}-*/entry.json"))


# The library's sides load_inline builds here: the OpenVINO one where opbridge has it and this
# Python has the openvino package (requirements.txt installs it).
HAS_OPENVINO = bool(opbridge.build_info()["openvino"]) and importlib.util.find_spec("openvino") is not None
SIDES = ("torch", "ort", "ov") if HAS_OPENVINO else ("torch", "ort")


@pytest.mark.parametrize("kw, message", [
    (dict(name="a/b"), "op library name 'a/b' is not an identifier"),
    (dict(name=".."), "op library name '..' is not an identifier"),
    (dict(name="lib name"), "op library name 'lib name' is not an identifier"),
    (dict(torch_namespace="../up"), "torch namespace '../up' is not an identifier"),
    (dict(torch_namespace="a.b"), "torch namespace 'a.b' is not an identifier"),
    (dict(onnx_domain="a b/../c"), "ONNX domain 'a b/../c' is not dot-separated identifiers"),
    (dict(onnx_domain="com..example"), "ONNX domain 'com..example' is not dot-separated identifiers"),
    (dict(onnx_domain=""), "the empty domain is ONNX's standard one"),
])
def test_names_that_are_not_plain_are_refused_before_building(tmp_path, kw, message):
    name = kw.pop("name", "plainname")
    with pytest.raises(opbridge.OpbridgeError, match=message.replace(".", r"\.")):
        opbridge.load_inline(name, source("plainname"), build_directory=tmp_path, **kw)
    assert list(tmp_path.iterdir()) == []  # nothing built, nothing written


@pytest.mark.parametrize("kw, message", [
    (dict(torch_namespace="aten"), r"torch namespace 'aten' already holds ops that no opbridge library defined \(aten::"),
    (dict(torch_namespace="prims"), "torch namespace 'prims' "),
    (dict(torch_namespace="torch"), "torch namespace 'torch' is PyTorch's own"),
    (dict(torch_namespace="opbridge"), "torch namespace 'opbridge' is already loaded from .*libopbridge_torch.so"),
    (dict(onnx_domain="ai.onnx"), "ONNX domain 'ai.onnx' belongs to ONNX, ONNX Runtime or an exporter"),
    (dict(onnx_domain="com.microsoft.nchwc"), "ONNX domain 'com.microsoft.nchwc' belongs to ONNX"),
    (dict(onnx_domain="pkg.onnxscript.torch_lib"), "ONNX domain 'pkg.onnxscript.torch_lib' belongs to ONNX"),
    (dict(onnx_domain="opbridge"), "ONNX domain 'opbridge' is already used by op library 'opbridge'"),
])
def test_namespaces_and_domains_of_pytorch_onnx_and_loaded_libraries_are_refused(tmp_path, kw, message):
    with pytest.raises(opbridge.OpbridgeError, match=message):
        opbridge.load_inline("shadowing", source("shadowing"), build_directory=tmp_path, **kw)
    assert list(tmp_path.iterdir()) == []
    assert not hasattr(torch.ops.aten, "add_const")


def test_a_compiler_named_by_cxx_that_is_missing_is_never_replaced_silently(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    with pytest.raises(opbridge.OpbridgeError, match=r"the C\+\+ compiler \$CXX=.*no-such-g\+\+ is not found"):
        opbridge.load_inline("nocxx", source("nocxx"), build_directory=tmp_path / "cache")
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("PATH", str(tmp_path))  # no c++, g++, cmake or ninja
    with pytest.raises(opbridge.OpbridgeError, match=r"no C\+\+ compiler found .*install one"):
        opbridge.load_inline("nocxx", source("nocxx"), build_directory=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("case, extra, message", [
    ("noop", None, "the source defines no op"),
    ("aborts", "#include <cstdlib>\nnamespace { struct Boom { Boom() { std::abort(); } } boom; }\n",
     r"loading the built library failed \(signal SIGABRT\) before any op ran: the source's static initialisation"),
    ("throws", "#include <stdexcept>\nnamespace { struct Boom { Boom() { throw std::runtime_error(\"no config\"); } } "
               "boom; }\n", r"(?s)crashed or threw:.*what\(\):  no config"),
    ("segfaults", "namespace { struct Boom { Boom() { *static_cast<volatile int*>(nullptr) = 1; } } boom; }\n",
     r"loading the built library failed \(signal SIGSEGV\)"),
])
def test_a_source_that_defines_no_op_or_crashes_while_loading_is_refused(tmp_path, case, extra, message):
    # Loading such a library in this process would end it: the build loads it in a child first.
    text = "#include <opbridge/op.h>\nint unused() { return 1; }\n" if extra is None else source(case) + extra
    for _ in range(2 if case == "noop" else 1):  # nothing cached: a second call builds and fails again
        with pytest.raises(opbridge.OpbridgeError, match=message) as e:
            opbridge.load_inline(case, text, build_directory=tmp_path)
        log = Path(str(e.value).rsplit("(full log: ", 1)[1].rstrip(")"))
        assert log.is_file() and "loading" in log.read_text()
        assert entries(tmp_path, case) == []
        assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == []  # no half-built folder left
    assert case not in {lib.name for lib in opbridge.libraries()}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A cache holding one finished entry, built by a child process (this process never loads it,
    so each test may damage and rebuild it)."""
    cache = tmp_path_factory.mktemp("jitcache")
    r = load_in_child("intact", source("intact", 2.0), cache)
    assert r.returncode == 0 and r.stdout.strip() == "[3.0, 3.0]", r.stderr
    return cache


@pytest.mark.parametrize("damage", ["truncated record", "missing ONNX Runtime library", "changed library",
                                    pytest.param("missing OpenVINO library", marks=pytest.mark.skipif(
                                        not HAS_OPENVINO, reason="no OpenVINO side here"))])
def test_a_damaged_cache_entry_is_rebuilt(built, tmp_path, damage):
    cache = tmp_path / "cache"
    shutil.copytree(built, cache)
    [entry] = entries(cache, "intact")
    if damage == "truncated record":
        text = (entry / "entry.json").read_text()
        (entry / "entry.json").write_text(text[: len(text) // 2])
    elif damage == "missing ONNX Runtime library":
        (entry / "libintact_ort.so").unlink()
    elif damage == "missing OpenVINO library":
        (entry / "libintact_ov.so").unlink()
    else:  # a copy cut short: the size alone would not tell every change, the record's digest does
        with open(entry / "libintact_torch.so", "r+b") as f:
            f.truncate(1000)
    r = load_in_child("intact", source("intact", 2.0), cache)
    assert r.returncode == 0 and r.stdout.strip() == "[3.0, 3.0]", r.stderr
    assert f"the cache entry {entry} is damaged" in r.stderr and "rebuilding it" in r.stderr, r.stderr
    assert entries(cache, "intact") == [entry]
    record = json.loads((entry / "entry.json").read_text())
    assert set(record["files"]) == {f"libintact_{side}.so" for side in SIDES}
    assert jit_entry_problem(entry) is None  # the next process loads it without building


def test_a_build_killed_midway_leaves_nothing_that_loads_and_the_next_call_rebuilds(tmp_path):
    cache = tmp_path / "cache"
    child = subprocess.Popen([sys.executable, "-c", LOAD, "killed", str(cache)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    child.stdin.write(source("killed"))
    child.stdin.close()
    deadline = time.monotonic() + 300
    while not list(cache.glob(".killed-*/build")):  # the build folder: CMake is configuring
        assert child.poll() is None and time.monotonic() < deadline, child.stderr.read()
        time.sleep(0.05)
    os.killpg(child.pid, signal.SIGKILL)  # the builder and its compilers
    child.wait()
    assert entries(cache, "killed") == [] and list(cache.glob(".killed-*"))
    r = load_in_child("killed", source("killed"), cache)
    assert r.returncode == 0 and r.stdout.strip() == "[2.0, 2.0]", r.stderr
    assert len(entries(cache, "killed")) == 1
    assert not list(cache.glob(".killed-*")), "the killed build's folder is cleared"


def run_read_only(cache: Path, name: str, text: str) -> subprocess.CompletedProcess:
    """load_in_child with `cache` read-only for the child: a read-only bind mount in a user and mount
    namespace of its own (chmod alone does not stop root), else chmod for other users."""
    if os.geteuid() != 0:
        cache.chmod(0o555)
        try:
            return load_in_child(name, text, cache)
        finally:
            cache.chmod(0o755)
    if not shutil.which("unshare") or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("running as root without user namespaces: no way to make a folder read-only for this user")
    script = 'mount --bind -o ro "$1" "$1" && exec "$2" -c "$3" "$4" "$1"'
    return subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", str(cache), sys.executable, LOAD, name],
                          input=text, capture_output=True, text=True, timeout=600)


def test_a_read_only_cache_serves_finished_entries_and_names_the_way_out_for_new_ones(built, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(built, cache)
    before = sorted(p.name for p in cache.iterdir())
    r = run_read_only(cache, "intact", source("intact", 2.0))
    assert r.returncode == 0 and r.stdout.strip() == "[3.0, 3.0]", r.stderr
    r = run_read_only(cache, "fresh", source("fresh"))
    assert r.returncode == 1
    assert (f"op library 'fresh': cannot build in {cache}: Read-only file system" in r.stderr
            or f"op library 'fresh': cannot build in {cache}: Permission denied" in r.stderr), r.stderr
    assert "build_directory= or set OPBRIDGE_JIT_DIR" in r.stderr
    assert sorted(p.name for p in cache.iterdir()) == before


def test_one_name_for_two_sources_in_two_processes_keeps_both(tmp_path):
    # Each source is its own cache entry; each process gets the library of the source it gave.
    cache = tmp_path / "cache"
    procs = [subprocess.Popen([sys.executable, "-c", LOAD, "twosrc", str(cache)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(source("twosrc", addend), timeout=600) for p, addend in zip(procs, (1.0, 5.0))]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    assert [o[0].strip() for o in outs] == ["[2.0, 2.0]", "[6.0, 6.0]"]
    assert len(entries(cache, "twosrc")) == 2
