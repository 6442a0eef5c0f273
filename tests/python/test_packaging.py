"""The pip route: `pip wheel --no-build-isolation .` builds the C++ with the project's own CMake
(scikit-build-core) into a wheel with a platform tag, every library stored once, the torch version
it was built against recorded and checked at import, and the licences. Installed into a fresh
virtual environment that has only torch, outside the source tree, the package, `opbridge`,
`opbridge-run`, export and ONNX Runtime sessions work.

The wheel's CMake tree is build-wheel/ in the repository (kept between runs, so a rerun only
rebuilds what changed); the fresh environment is made per run."""

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest
import torch

import opbridge

pytestmark = pytest.mark.environments  # scripts/test.sh --environments

ROOT = Path(__file__).resolve().parents[2]


def run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{cmd} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheelhouse")
    run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", out, ROOT,
         f"-Cbuild-dir={ROOT / 'build-wheel'}"])
    (path,) = out.glob("*.whl")
    print(f"\nwheel {path.name}: {path.stat().st_size / 2**20:.1f} MiB")
    return path


def test_wheel_name_says_platform_not_python_abi(wheel):
    # The binaries load no Python API (py3-none) but are x86-64 Linux code (not "any").
    assert wheel.name == f"opbridge-{opbridge.__version__}-py3-none-linux_x86_64.whl"


def test_wheel_stores_every_library_once(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        big = [n for n in names if z.getinfo(n).file_size > 1 << 20]
        digests = [hashlib.sha256(z.read(n)).hexdigest() for n in big]
        info = json.loads(z.read("opbridge/_sdk/build_info.json"))
    assert len(digests) == len(set(digests)), f"stored twice: {big}"
    assert [n for n in names if "libonnxruntime" in n] == ["opbridge/_sdk/lib/libonnxruntime.so.1"]
    for lib in ("lib/libopbridge_torch.so", "lib/libopbridge_ort.so", "bin/opbridge-run",
                "lib/cmake/opbridge/opbridgeConfig.cmake", "include/onnxruntime/onnxruntime_c_api.h"):
        assert f"opbridge/_sdk/{lib}" in names
    assert info["torch"] == torch.__version__.split("+")[0] and info["opbridge"] == opbridge.__version__
    licences = {Path(n).name for n in names if "/licenses/" in n}
    assert {"LICENSE", "ONNXRuntime-LICENSE.txt", "Eigen-MPL-2.0.txt", "CLI11.txt", "nlohmann-json.txt"} <= licences
    assert not [n for n in names if n.startswith("opbridge/_sdk/") and "__pycache__" in n]


@pytest.fixture(scope="module")
def fresh_env(wheel, tmp_path_factory):
    """A new virtual environment: torch first (as a user has it), then the wheel, whose
    dependencies pip resolves with the project's pins as constraints."""
    env_dir = tmp_path_factory.mktemp("fresh") / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    pip = [py, "-m", "pip", "install", "-q"]
    run([*pip, f"torch=={torch.__version__.split('+')[0]}"])
    run([*pip, wheel, "-c", ROOT / "requirements.txt"])
    site = Path(run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"]).stdout.strip())
    size = sum(f.stat().st_size for f in (site / "opbridge").rglob("*") if f.is_file())
    print(f"\ninstalled opbridge: {size / 2**20:.1f} MiB in {site / 'opbridge'}")
    return env_dir


def in_env(env_dir, cmd, cwd, **kw):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OPBRIDGE_LIBRARY_DIR", "VIRTUAL_ENV")}
    env["PATH"] = f"{env_dir / 'bin'}:{env['PATH']}"
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd, env=env, **kw)


def test_commands_report_versions(fresh_env, tmp_path):
    r = in_env(fresh_env, ["opbridge", "--version"], tmp_path)
    assert r.returncode == 0, r.stderr
    info = opbridge.build_info()
    assert r.stdout.strip() == (f"opbridge {opbridge.__version__} (built with torch {info['torch']}, "
                                f"ONNX Runtime SDK {info['onnxruntime_sdk']})")
    r = in_env(fresh_env, ["opbridge-run", "--version"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"opbridge-run {opbridge.__version__} (ONNX Runtime {info['onnxruntime_sdk']})"


def test_export_session_and_inspect_outside_the_source_tree(fresh_env, tmp_path):
    script = textwrap.dedent("""
        import sys, numpy as np, torch, opbridge
        assert "site-packages" in opbridge.__file__, opbridge.__file__

        class Block(torch.nn.Module):
            def forward(self, x, y):
                s = torch.ops.opbridge.my_add(x, y)
                return torch.ops.opbridge.dual_residual(s, y, alpha=0.5)

        x, y = torch.randn(3, 4), torch.randn(3, 4)
        for exporter in ("dynamo", "torchscript"):
            opbridge.export(Block(), (x, y), f"block_{exporter}.onnx", exporter=exporter, input_names=["x", "y"])
            r1, r2 = opbridge.session(f"block_{exporter}.onnx").run(None, {"x": x.numpy(), "y": y.numpy()})
            s = 2 * x.numpy() + y.numpy()
            np.testing.assert_allclose(r1, s * 0.5 - y.numpy(), rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(r2, y.numpy() * 0.5 - s, rtol=1e-6, atol=1e-6)
        print("ok")
    """)
    (tmp_path / "check.py").write_text(script)
    r = in_env(fresh_env, [fresh_env / "bin" / "python", "check.py"], tmp_path)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
    r = in_env(fresh_env, ["opbridge", "inspect", "block_dynamo.onnx"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {line.split()[1]: line for line in r.stdout.splitlines() if line.startswith("opbridge ")}
    assert {"MyAdd", "DualResidual"} <= set(rows), r.stdout
    assert all("library opbridge (libopbridge_ort.so)" in row for row in rows.values()), r.stdout
    assert "OK: onnxruntime" in r.stdout and "MISSING" not in r.stdout
    r = in_env(fresh_env, ["opbridge-run", "block_dynamo.onnx", "--random", "--repeat", "1"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_another_torch_is_refused_at_import(tmp_path):
    # The installed libraries, with a build record that names another torch.
    lib = opbridge.build_info()
    d = tmp_path / "lib"
    d.mkdir()
    here = Path(opbridge.__file__).parent / "_sdk" / "lib"
    for name in ("libopbridge_torch.so", "libopbridge_ort.so"):
        (d / name).symlink_to(here / name)
    (d / "build_info.json").write_text(json.dumps({**lib, "torch": "2.0.1"}))
    env = {**os.environ, "OPBRIDGE_LIBRARY_DIR": str(d)}
    r = subprocess.run([sys.executable, "-c", "import opbridge"], capture_output=True, text=True, env=env)
    assert r.returncode != 0
    assert (f"opbridge {opbridge.__version__} was built against torch 2.0.1, but this environment has torch "
            f"{torch.__version__}; install torch==2.0.1") in r.stderr
