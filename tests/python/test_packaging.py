"""The pip route, against each torch a user may have: scripts/wheel.sh builds the wheel with
`pip wheel --no-build-isolation .` (the C++ through the project's own CMake, scikit-build-core)
and repairs it with auditwheel, which tags it with the lowest manylinux policy that holds. The
wheel has every library stored once, the torch version it was built against recorded and checked
at import, and the licences. Installed into a fresh virtual environment that has only torch,
outside the source tree, the package, `opbridge`, `opbridge-run`, export, ONNX Runtime sessions
and load_inline work.

Two torch builds: 2.13.0 (the CPU build, this environment's) and 2.14.1 (the CUDA build pip
installs by default, run on the CPU, with no CUDA toolkit on the machine; its headers need C++20).
2.14.1 lives in a cached environment (tests/python/envs.py) that also builds its wheel, as a user
with that torch would; its fresh environment sees that torch through a .pth file.
The wheels' CMake trees are build-wheel*/ in the repository (kept between runs)."""

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import textwrap
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

import opbridge

from envs import python_with

pytestmark = pytest.mark.environments  # scripts/test.sh --environments

ROOT = Path(__file__).resolve().parents[2]
THIS_TORCH = torch.__version__.split("+")[0]
# Another torch: built and installed from a cached environment.
OTHER_TORCHES = {"2.14.1": ["torch==2.14.1", "torchvision==0.29.1", "scikit-build-core==1.1.2"]}
# What a manylinux wheel may name (the policies' system libraries) besides its own files.
SYSTEM_LIBRARIES = {"libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2",
                    "libpthread.so.0", "libdl.so.2", "librt.so.1"}
# What the OpenVINO side names besides: the `openvino` package's own libraries (OpenVINO loads them
# before it loads an extension).
OPENVINO_LIBRARIES = re.compile(r"libopenvino\.so\.\d+|libtbb\.so\.12")


def run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{cmd} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r


@dataclass
class Build:
    torch: str  # the version built against
    python: Path  # the Python that built it (its torch)
    wheel: Path

    @property
    def openvino(self) -> str | None:
        """The `openvino` package of the Python that built it (None: none there)."""
        r = subprocess.run([str(self.python), "-c", "import importlib.metadata as m; print(m.version('openvino'))"],
                           capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None


@pytest.fixture(scope="module", params=[THIS_TORCH, *OTHER_TORCHES])
def build(request, tmp_path_factory):
    version = request.param
    python = Path(sys.executable) if version == THIS_TORCH else python_with(f"torch-{version}",
                                                                              OTHER_TORCHES[version])
    build_dir = ROOT / ("build-wheel" if version == THIS_TORCH else f"build-wheel-torch-{version}")
    out = tmp_path_factory.mktemp("wheelhouse")
    env = {**os.environ, "PYTHON": str(python), "OPBRIDGE_WHEEL_BUILD_DIR": str(build_dir)}
    run([ROOT / "scripts" / "wheel.sh", "-o", out], env=env)
    (path,) = out.glob("*.whl")
    print(f"\nwheel {path.name} (torch {version}): {path.stat().st_size / 2**20:.1f} MiB")
    return Build(version, python, path)


def test_wheel_is_manylinux_and_auditwheel_agrees(build):
    # The binaries load no Python API (py3-none); the platform is a manylinux policy, the lowest
    # that holds, which `auditwheel show` (an independent reading of the same files) confirms.
    m = re.fullmatch(rf"opbridge-{re.escape(opbridge.__version__)}-py3-none-(manylinux_2_(\d+)_x86_64)\.whl",
                     build.wheel.name)
    assert m, build.wheel.name
    shown = json.loads(run([ROOT / ".venv" / "bin" / "auditwheel", "show", "--json", build.wheel]).stdout)
    assert shown["sym_tag"] == m.group(1), shown
    # The OpenVINO side's OpenVINO libraries are left out on purpose (they are the openvino
    # package's): they alone may hold the overall tag down, and only where that side was built.
    external = set(shown["external_libs"])
    assert all(OPENVINO_LIBRARIES.fullmatch(lib) for lib in external) and bool(external) == bool(build.openvino), shown
    assert shown["overall_tag"] == (m.group(1) if not external else "linux_x86_64"), shown
    # The floor docs/serving.md and the README state: glibc 2.34 (a build on Debian 12).
    assert int(m.group(2)) <= 34


def test_binaries_name_only_system_libraries(build):
    # No libtorch_cpu / libc10 / libgomp: torch's libraries come from the process that loads the
    # PyTorch library; libonnxruntime.so.1 is the wheel's own, found through RUNPATH.
    with zipfile.ZipFile(build.wheel) as z:
        for name in z.namelist():
            data = z.read(name)
            if not data.startswith(b"\x7fELF"):
                continue
            elf = ELFFile(io.BytesIO(data))
            dyn = next((s for s in elf.iter_sections() if isinstance(s, DynamicSection)), None)
            needed = {t.needed for t in dyn.iter_tags() if t.entry.d_tag == "DT_NEEDED"} if dyn else set()
            if name.endswith("_ov.so"):
                needed = {n for n in needed if not OPENVINO_LIBRARIES.fullmatch(n)}
            assert needed <= SYSTEM_LIBRARIES | {"libonnxruntime.so.1"}, (name, needed - SYSTEM_LIBRARIES)


def test_wheel_stores_every_library_once(build):
    with zipfile.ZipFile(build.wheel) as z:
        names = z.namelist()
        big = [n for n in names if z.getinfo(n).file_size > 1 << 20]
        digests = [hashlib.sha256(z.read(n)).hexdigest() for n in big]
        info = json.loads(z.read("opbridge/_sdk/build_info.json"))
    assert len(digests) == len(set(digests)), f"stored twice: {big}"
    assert [n for n in names if "libonnxruntime" in n] == ["opbridge/_sdk/lib/libonnxruntime.so.1"]
    assert not [n for n in names if n.startswith("opbridge.libs/")], "auditwheel grafted a library"
    for lib in ("lib/libopbridge_torch.so", "lib/libopbridge_ort.so", "bin/opbridge-run",
                "lib/cmake/opbridge/opbridgeConfig.cmake", "lib/cmake/opbridge/OpBridgeTorch.cmake",
                "include/onnxruntime/onnxruntime_c_api.h"):
        assert f"opbridge/_sdk/{lib}" in names
    assert info["torch"] == build.torch and info["opbridge"] == opbridge.__version__
    # The OpenVINO side where the building Python had the `openvino` package, and only there.
    ov_files = {"lib/libopbridge_ov.so", "lib/libopbridge_ov_adapter.a", "lib/cmake/opbridge/OpBridgeOpenVINO.cmake",
                "lib/cmake/opbridge/opbridgeOpenVINOTargets.cmake"}
    assert info["openvino"] == build.openvino
    if build.openvino:
        assert {f"opbridge/_sdk/{f}" for f in ov_files} <= set(names)
    else:
        assert not [n for n in names if "_ov.so" in n or "OpenVINOTargets" in n]
    licences = {Path(n).name for n in names if "/licenses/" in n}
    assert {"LICENSE", "ONNXRuntime-LICENSE.txt", "Eigen-MPL-2.0.txt", "CLI11.txt", "nlohmann-json.txt"} <= licences
    assert not [n for n in names if n.startswith("opbridge/_sdk/") and "__pycache__" in n]


@pytest.fixture(scope="module")
def fresh_env(build, tmp_path_factory):
    """A new virtual environment: torch first (as a user has it), then the wheel, whose
    dependencies pip resolves with the project's pins as constraints."""
    env_dir = tmp_path_factory.mktemp("fresh") / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    site = Path(run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if build.torch == THIS_TORCH:
        run([*pip, f"torch=={build.torch}"])
    else:  # the cached environment's torch (5 GB), seen through a .pth rather than installed again
        base = run([build.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
        (site / "_torch_base.pth").write_text(base + "\n")
    run([*pip, build.wheel, "-c", ROOT / "requirements.txt"])
    size = sum(f.stat().st_size for f in (site / "opbridge").rglob("*") if f.is_file())
    print(f"\ninstalled opbridge: {size / 2**20:.1f} MiB in {site / 'opbridge'}")
    return env_dir


def in_env(env_dir, cmd, cwd, **kw):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OPBRIDGE_LIBRARY_DIR", "VIRTUAL_ENV")}
    env["PATH"] = f"{env_dir / 'bin'}:{env['PATH']}"
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd, env=env, **kw)


def test_commands_report_versions(build, fresh_env, tmp_path):
    r = in_env(fresh_env, ["opbridge", "--version"], tmp_path)
    assert r.returncode == 0, r.stderr
    info = opbridge.build_info()
    assert r.stdout.strip() == (f"opbridge {opbridge.__version__} (built with torch {build.torch}, "
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


# An op for load_inline in the fresh environment, and a script's function that builds it as
# library `name`, runs it eagerly and exports a model calling it, which runs in `runtime` (by
# default ONNX Runtime) equal to eager.
TWICE_SOURCE = textwrap.dedent("""\
    #include <opbridge/op.h>
    namespace twice_op {
    using namespace opbridge;
    void twice_kernel(KernelContext& ctx, const TensorView& x, TensorView& y) {
      const float* a = x.data_as<float>();
      float* b = y.data_as<float>();
      for (int64_t i = 0; i < x.numel(); ++i) b[i] = 2 * a[i];
    }
    OPBRIDGE_OP(twice).doc("2x.").types("T", {DType::Float32}).input("x", "T", "x")
        .output("y", "T", shape::same({"x"}), "2x").cpu(twice_kernel);
    }
""")
TWICE_IN_A_MODEL = textwrap.dedent("""\
    import numpy as np, torch, opbridge

    def twice_in_a_model(name, **session_kw):
        lib = opbridge.load_inline(name, open("twice.cc").read(), build_directory="jit")
        op = getattr(torch.ops, name).twice
        x = torch.randn(7)
        np.testing.assert_array_equal(op(x).numpy(), 2 * x.numpy())
        class M(torch.nn.Module):
            def forward(self, x):
                return op(x)
        opbridge.export(M(), (x,), f"{name}.onnx", input_names=["x"])
        (y,) = opbridge.session(f"{name}.onnx", **session_kw).run(None, {"x": x.numpy()})
        np.testing.assert_array_equal(y, 2 * x.numpy())
        return lib
""")


def run_script(fresh_env, tmp_path, script: str) -> None:
    """`script` after TWICE_IN_A_MODEL, run in the fresh environment; it prints ok at its end."""
    (tmp_path / "twice.cc").write_text(TWICE_SOURCE)
    (tmp_path / "check.py").write_text(TWICE_IN_A_MODEL + textwrap.dedent(script) + 'print("ok")\n')
    r = in_env(fresh_env, [fresh_env / "bin" / "python", "check.py"], tmp_path)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_load_inline_builds_against_the_installed_torch(fresh_env, tmp_path):
    # The installed CMake package finds this environment's torch headers (C++20 ones for 2.14)
    # without a CUDA toolkit, and the op runs eagerly, and in ONNX Runtime.
    run_script(fresh_env, tmp_path, 'twice_in_a_model("twice")\n')


def test_openvino_side_of_the_installed_wheel(build, fresh_env, tmp_path):
    # With the `openvino` the wheel was built with installed beside it: the built-in library's
    # OpenVINO side runs an exported model, and load_inline builds an inline op's OpenVINO side
    # through the installed CMake package (which finds the openvino package beside it).
    if not build.openvino:
        pytest.skip(f"the Python that built the torch {build.torch} wheel has no openvino: the wheel has no "
                    "OpenVINO side (test_wheel_stores_every_library_once checks that)")
    run([fresh_env / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
         f"openvino=={build.openvino}"])
    run_script(fresh_env, tmp_path, r'''
        lib = opbridge.builtin
        assert "site-packages" in str(lib.openvino_path) and lib.openvino_path.name == "libopbridge_ov.so", \
            (lib.ort_path, lib.openvino_path)
        class Block(torch.nn.Module):
            def forward(self, x, y):
                return torch.ops.opbridge.dual_residual(torch.ops.opbridge.my_add(x, y), y, alpha=0.5)
        x, y = torch.randn(3, 4), torch.randn(3, 4)
        opbridge.export(Block(), (x, y), "block.onnx", input_names=["x", "y"])
        got = opbridge.session("block.onnx", runtime="openvino").run(None, {"x": x.numpy(), "y": y.numpy()})
        for g, w in zip(got, Block()(x, y)):
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-6, atol=1e-6)
        lib = twice_in_a_model("twice_ov", runtime="openvino")
        assert lib.openvino_path is not None and lib.openvino_path.name == "libtwice_ov_ov.so", lib.ort_path
    ''')


TORCHVISION_DETECTION = textwrap.dedent("""
    import json, sys, warnings, numpy as np, torch, torchvision, opbridge
    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_resnet50_fpn(
        weights=None, weights_backbone=None, num_classes=5, box_score_thresh=0.0, min_size=320, max_size=320).eval()

    class Boxes(torch.nn.Module):  # the detections of one image, as tensors
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, image):
            found = self.model([image])[0]
            return found["boxes"], found["scores"], found["labels"]

    def unordered_difference(got, want):
        # Detections whose scores tie have no order two runtimes share: the detections (label,
        # score, box) are compared as sets.
        rows = [np.concatenate([o[2][:, None].astype(np.float64), o[1][:, None], o[0]], 1) for o in (got, want)]
        a, b = (r[np.lexsort(np.round(r, 3).T[::-1])] for r in rows)
        return float(np.abs(a - b).max()) if len(a) else 0.0

    image = torch.rand(3, 320, 320, generator=torch.Generator().manual_seed(1))
    # Random weights score every box alike, so which comes first would hang on the last bits of
    # two runtimes' convolutions: the classifiers' logits are spread to a standard deviation of 2.
    layers = [model.rpn.head.cls_logits, model.roi_heads.box_predictor.cls_score]
    seen = []
    hooks = [layer.register_forward_hook(lambda m, i, o: seen.append((m, o.detach().std()))) for layer in layers]
    with torch.no_grad():
        model([image])
    for hook in hooks:
        hook.remove()
    with torch.no_grad():
        for layer, std in dict(seen).items():
            layer.weight.mul_(2 / std)
    report = {}
    for exporter in ("torchscript", "dynamo"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                proto = opbridge.export(Boxes().eval(), (image,), f"frcnn_{exporter}.onnx", exporter=exporter,
                                        input_names=["image"])
        except opbridge.OpbridgeError as e:
            report[exporter] = str(e).splitlines()[0]
            continue
        def walk(graph):  # torchvision's NMS sits in an If branch
            for n in graph.node:
                yield n
                for a in n.attribute:
                    for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                        yield from walk(g)
        nodes = sorted({n.op_type for n in walk(proto.graph) if n.domain == "opbridge"})
        with torch.no_grad():
            want = [t.numpy() for t in Boxes().eval()(image)]
        got = opbridge.session(f"frcnn_{exporter}.onnx").run(None, {"image": image.numpy()})
        report[exporter] = {"nodes": nodes, "shapes": [list(g.shape) for g in got],
                            "eager_shapes": [list(w.shape) for w in want],
                            "boxes": unordered_difference(got, want) if got[0].shape == want[0].shape else None}
    json.dump(report, open(sys.argv[1], "w"))
""")


def test_torchvision_detection_model_exports_on_torchvisions_own_ops(build, fresh_env, tmp_path):
    # torchvision's Faster R-CNN (ResNet-50 FPN, random weights, at 320x320) calls torchvision::nms (batched_nms) and torchvision::roi_align
    # (MultiScaleRoIAlign), which opbridge's rules export as its Nms and RoiAlign nodes; torchvision
    # loads only beside torch 2.14.1 (the README says why).
    if build.torch == THIS_TORCH:
        pytest.skip(f"no torchvision loads beside torch {THIS_TORCH} (CPU build)")
    (tmp_path / "tv.py").write_text(TORCHVISION_DETECTION)
    r = in_env(fresh_env, [fresh_env / "bin" / "python", "tv.py", "out.json"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    report = json.loads((tmp_path / "out.json").read_text())
    exported = report["torchscript"]
    assert isinstance(exported, dict), report
    assert {"Nms", "RoiAlign"} <= set(exported["nodes"]), exported
    assert exported["shapes"] == exported["eager_shapes"] and exported["shapes"][0][0] > 0, exported
    assert exported["boxes"] < 0.05, exported  # pixels of a 320-pixel image, scores within 0.05 too


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
