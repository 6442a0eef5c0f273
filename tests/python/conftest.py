"""Fixtures shared by the cross-cutting tests."""

import fcntl
import filecmp
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import opbridge

EXTRA_LIBRARY = Path(__file__).parent / "extra_library"


def made_once(tmp_path_factory, name: str, make) -> Path:
    """The folder `name`, made by make(folder) once per test run however many pytest-xdist
    workers ask (in the folder the workers' temporary folders share), under a lock."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    if (folder / ".made").is_file():
        return folder
    with open(folder.parent / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".made").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            (folder / ".made").touch()
    return folder


def _build_extra_library(folder: Path) -> None:
    """tests/python/extra_library copied into `folder` (files whose content changed only, so that
    Ninja rebuilds only what they touch) and built in folder/build, configured against the
    installed opbridge CMake package and this torch (configured afresh when either moves)."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in EXTRA_LIBRARY.iterdir():
        if not (folder / f.name).is_file() or not filecmp.cmp(f, folder / f.name, shallow=False):
            shutil.copy(f, folder)
    prefix = f"{opbridge.cmake_prefix_path()};{torch.utils.cmake_prefix_path}"
    configured = folder / "build" / "opbridge-prefix.txt"
    if not configured.is_file() or configured.read_text() != prefix:
        shutil.rmtree(folder / "build", ignore_errors=True)
        subprocess.run(["cmake", "-S", str(folder), "-B", str(folder / "build"), "-G", "Ninja",
                        "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_PREFIX_PATH={prefix}"],
                       check=True, capture_output=True, text=True)
        configured.write_text(prefix)
    subprocess.run(["cmake", "--build", str(folder / "build")], check=True, capture_output=True, text=True)


@pytest.fixture(scope="session")
def extra_build(tmp_path_factory) -> Path:
    """tests/python/extra_library, a user's op libraries, built against the installed opbridge CMake
    package as a project outside this repository builds them: the build folder. Built once per
    test run, or, where OPBRIDGE_TEST_EXTRA_BUILD names a folder (scripts/test.sh: build/
    extra_library), kept there between runs and brought up to date by Ninja."""
    kept = os.environ.get("OPBRIDGE_TEST_EXTRA_BUILD")
    if kept:
        folder = Path(kept).resolve()
        folder.parent.mkdir(parents=True, exist_ok=True)
        with open(folder.parent / f"{folder.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # pytest-xdist's workers: one builds, the other waits
            _build_extra_library(folder)
        return folder / "build"
    return made_once(tmp_path_factory, "extra_library", _build_extra_library) / "build"


@pytest.fixture(scope="session")
def extra_ops(extra_build):
    """The extra_ops library, loaded."""
    return opbridge.load_library(extra_build / "libextra_ops_torch.so")
