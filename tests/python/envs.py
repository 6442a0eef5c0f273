"""Throwaway Python environments the tests make with pip from the package index and cache
between runs: ONNX Runtime releases (tests/python/test_ort_versions.py) and the packages of real
models (tests/python/test_models.py). Each lives in $OPBRIDGE_TEST_ENVS, else
~/.cache/opbridge/envs, one folder per name and Python version; delete a folder to make it again.
Without it and without the index, the test that wants it skips, saying why.
"""

from __future__ import annotations

import fcntl
import functools
import importlib.metadata
import os
import re
import shutil
import site
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]


def pinned(package: str) -> str:
    """The version requirements.txt pins `package` to."""
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        m = re.match(rf"{package}==([\w.]+)", line.strip())
        if m:
            return m.group(1)
    raise AssertionError(f"requirements.txt pins no {package}")


def envs_dir() -> Path:
    env = os.environ.get("OPBRIDGE_TEST_ENVS")
    if env:
        return Path(env)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "opbridge" / "envs"


def index_url() -> str:
    r = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"], capture_output=True,
                       text=True)
    return os.environ.get("PIP_INDEX_URL") or (r.stdout.strip() if r.returncode == 0 else "") or \
        "https://pypi.org/simple/"


@functools.lru_cache(maxsize=None)
def unreachable(url: str, project: str) -> str | None:
    """Why the package index cannot be reached (asked for `project`), or None when it answers."""
    try:
        urllib.request.urlopen(url.rstrip("/") + f"/{project}/", timeout=15).close()
    except OSError as e:  # URLError, timeouts, refused connections
        return str(getattr(e, "reason", e))
    return None


def python_with(name: str, requirements: list[str], *, on_top: bool = False) -> Path:
    """The python of environment `name` holding `requirements` (made once, then reused). on_top:
    the environment also sees this one's packages (PyTorch, opbridge) at their versions, and pip
    installs only what they lack; otherwise it holds the requirements alone."""
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    home = envs_dir() / f"{py}-{name}"
    wanted = " ".join(requirements) + (" (on top)" if on_top else "") + "\n"
    if (home / "ready").is_file() and (home / "ready").read_text() == wanted:
        return home / "bin" / "python"
    # Test workers asking for one environment at once: one makes it, the others wait for it (a
    # second maker would delete the first one's environment while its tests use it).
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f".{home.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _make(home, requirements, on_top, wanted)


def _make(home: Path, requirements: list[str], on_top: bool, wanted: str) -> Path:
    python = home / "bin" / "python"
    if (home / "ready").is_file() and (home / "ready").read_text() == wanted:
        return python  # made while this process waited
    url = index_url()
    # The project's name alone: no extras ("ray[serve]") or version specifier.
    project = re.split(r"[\[<>=!~;\s]", requirements[0], maxsplit=1)[0]
    why = unreachable(url, project)
    if why:
        pytest.skip(f"the package index {url} is unreachable ({why}): cannot make an environment with "
                    f"{', '.join(requirements)}")
    # Made beside its final place and renamed, so an interrupted run leaves nothing half made.
    tmp = home.with_name(home.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(tmp)], check=True, capture_output=True)
    pins = []
    if on_top:  # a .pth that adds this environment's site-packages (and runs their .pth files)
        target = next((tmp / "lib").glob("python*/site-packages"))
        sites = [p for p in site.getsitepackages() if Path(p).is_dir()]
        (target / "_opbridge_base.pth").write_text(
            "import site; " + "; ".join(f"site.addsitedir({p!r})" for p in sites) + "\n")
        # What this environment has stays as it is (torch above all): pip may only add packages.
        (tmp / "pins.txt").write_text("".join(f"{d.metadata['Name']}=={d.version.split('+')[0]}\n"
                                              for d in importlib.metadata.distributions()
                                              if d.metadata["Name"] and d.metadata["Name"].lower() != "opbridge"))
        pins = ["-c", str(tmp / "pins.txt")]
    r = subprocess.run([str(tmp / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                        *pins, *requirements], capture_output=True, text=True)
    assert r.returncode == 0, f"pip could not install {' '.join(requirements)}:\n{r.stdout}{r.stderr}"
    # venv writes its folder into bin/ (the activate scripts, entry points' #! lines): name the final
    # one, which Triton's python backend sources (EXECUTION_ENV_PATH/bin/activate).
    for script in (tmp / "bin").iterdir():
        if script.is_file() and not script.is_symlink() and str(tmp).encode() in script.read_bytes():
            script.write_bytes(script.read_bytes().replace(str(tmp).encode(), str(home).encode()))
    (tmp / "ready").write_text(wanted)
    shutil.rmtree(home, ignore_errors=True)
    tmp.rename(home)
    return python
