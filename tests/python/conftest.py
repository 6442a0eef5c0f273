"""Fixtures shared by the cross-cutting tests."""

import fcntl
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


@pytest.fixture(scope="session")
def extra_build(tmp_path_factory) -> Path:
    """tests/python/extra_library, a user's op libraries, built once against the installed opbridge
    CMake package, as a project outside this repository builds them: the build folder."""
    def make(src: Path) -> None:
        for f in EXTRA_LIBRARY.iterdir():
            shutil.copy(f, src)
        prefix = f"{opbridge.cmake_prefix_path()};{torch.utils.cmake_prefix_path}"
        subprocess.run(["cmake", "-S", str(src), "-B", str(src / "build"), "-G", "Ninja",
                        "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_PREFIX_PATH={prefix}"],
                       check=True, capture_output=True, text=True)
        subprocess.run(["cmake", "--build", str(src / "build")], check=True, capture_output=True, text=True)

    return made_once(tmp_path_factory, "extra_library", make) / "build"


@pytest.fixture(scope="session")
def extra_ops(extra_build):
    """The extra_ops library, loaded."""
    return opbridge.load_library(extra_build / "libextra_ops_torch.so")
