"""opbridge.load_inline / opbridge.load: op definitions compiled at run time from a string or
files into the op library's sides (lib<name>_torch.so, lib<name>_ort.so, and lib<name>_ov.so where
the `openvino` package is installed and opbridge was built with it) through the installed CMake
package (opbridge_add_op_library, as an out-of-tree project uses it), then loaded.

Builds are cached by a hash of everything that decides the binaries (sources, names, flags, the
compiler, opbridge's build, torch, OpenVINO, Python): a second call, in this process or another, loads the
cached libraries without building. Each cache entry has a lock file; a build happens in a
temporary folder that is renamed into place when complete, so concurrent callers wait for one
build and a killed build leaves nothing that looks finished."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterable, Sequence

import torch

from .._export.loading import domain_in_use, load_library
from .._library.errors import OpbridgeError
from .._library.files import JIT_DONE, build_info, cache_root, cmake_prefix_path, jit_entry_problem, manifest_symbol
from .._library.manifest import Library, from_json
from .._library.registry import libraries

_LIBRARY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ONNX_DOMAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
# Namespaces PyTorch defines ops in (some only once a module that uses them is imported), and the
# ONNX domains of ONNX, ONNX Runtime and the exporters: ops there would shadow or clash with theirs.
_TORCH_NAMESPACES = {"aten", "prim", "prims", "torch", "onnx", "quantized", "quantized_decomposed", "inductor",
                     "higher_order", "profiler", "c10d", "_c10d_functional", "mkldnn", "_test"}
_ONNX_DOMAINS = ("ai.onnx", "com.microsoft", "com.ms", "org.pytorch", "pkg.onnxscript")
_DONE = JIT_DONE  # written last: an entry without it was never finished
# Run in a child process on a new build: loads its ONNX Runtime side (the same op objects as the
# PyTorch side, without needing PyTorch) and prints the manifest.
_PROBE = ("import ctypes, sys; f = getattr(ctypes.CDLL(sys.argv[1]), sys.argv[2]); f.restype = ctypes.c_char_p; "
          "sys.stdout.write(f().decode())")


@dataclasses.dataclass(frozen=True)
class _Options:
    """What load_inline / load pass to the build beyond the sources, as
    torch.utils.cpp_extension's extra_* arguments do; all of it is part of the cache key."""

    cflags: tuple[str, ...] = ()  # compile options of the ops' sources
    ldflags: tuple[str, ...] = ()  # link options of both libraries (-L..., -lfoo)
    include_paths: tuple[str, ...] = ()
    cmake_args: tuple[str, ...] = ()  # to CMake's configure step (-DFOO=1)
    env: tuple[tuple[str, str], ...] = ()  # added to the build's environment

    @classmethod
    def of(cls, cflags, ldflags, include_paths, cmake_args, env) -> "_Options":
        return cls(*(tuple(str(x) for x in v) for v in (cflags, ldflags, include_paths, cmake_args)),
                   tuple(sorted((str(k), str(v)) for k, v in (env or {}).items())))


def load_inline(name: str, source: str, *, torch_namespace: str | None = None, onnx_domain: str | None = None,
                extra_cflags: Sequence[str] = (), extra_ldflags: Sequence[str] = (),
                extra_include_paths: Sequence[str] = (), extra_cmake_args: Sequence[str] = (),
                build_env: dict[str, str] | None = None, build_directory: str | os.PathLike | None = None,
                verbose: bool = False) -> Library:
    """Compiles op definitions given as C++ source text (what an op file of an out-of-tree
    library holds: `#include <opbridge/op.h>` and OPBRIDGE_OP definitions) into an op library
    called `name` and loads it: torch.ops.<torch_namespace, default name>.<op>, ONNX domain
    `onnx_domain` (default the namespace), its ONNX Runtime library at `.ort_path`. Compiler
    errors name lines of `<name>.cc`, the source text. extra_cflags (compile options),
    extra_ldflags (link options), extra_include_paths, extra_cmake_args (CMake's configure step)
    and build_env (variables added to the build's environment) reach the build as
    torch.utils.cpp_extension's do, and are part of the cache key."""
    options = _Options.of(extra_cflags, extra_ldflags, extra_include_paths, extra_cmake_args, build_env)
    return _load(name, [(f"{name}.cc", source, None)], torch_namespace, onnx_domain, options, build_directory,
                 verbose)


def load(name: str, sources: Iterable[str | os.PathLike], *, torch_namespace: str | None = None,
         onnx_domain: str | None = None, extra_cflags: Sequence[str] = (), extra_ldflags: Sequence[str] = (),
         extra_include_paths: Sequence[str] = (), extra_cmake_args: Sequence[str] = (),
         build_env: dict[str, str] | None = None, build_directory: str | os.PathLike | None = None,
         verbose: bool = False) -> Library:
    """As load_inline, from source files (compiler errors name them)."""
    options = _Options.of(extra_cflags, extra_ldflags, extra_include_paths, extra_cmake_args, build_env)
    files = []
    for s in sources:
        path = Path(s).resolve()
        if not path.is_file():
            raise OpbridgeError(f"load('{name}'): no source file {path}")
        files.append((path.name, path.read_text(), path))
    if not files:
        raise OpbridgeError(f"load('{name}'): no sources")
    return _load(name, files, torch_namespace, onnx_domain, options, build_directory, verbose)


def _load(name, files, torch_namespace, onnx_domain, options: _Options, build_directory, verbose) -> Library:
    ns = name if torch_namespace is None else torch_namespace
    domain = ns if onnx_domain is None else onnx_domain
    _check_names(name, ns, domain)
    compiler = _compiler()
    key = _key(name, ns, domain, options, files, compiler)
    # Absolute: the generated CMake project names its sources by path, from its own folder.
    root = Path(build_directory).absolute() if build_directory is not None else cache_root()
    entry = root / f"{name}-{key[:16]}"
    torch_path = entry / f"lib{name}_torch.so"
    _check_loaded(name, ns, domain, torch_path.resolve())
    problem = jit_entry_problem(entry)
    if problem:
        try:
            root.mkdir(parents=True, exist_ok=True)
            with _locked(root / f"{entry.name}.lock"):
                problem = jit_entry_problem(entry)  # another process may have built it meanwhile
                if problem:
                    if problem != "never finished":
                        print(f"opbridge: the cache entry {entry} is damaged ({problem}): rebuilding it", file=sys.stderr)
                    _build(name, ns, domain, options, files, compiler, root, entry, verbose)
        except OSError as e:
            raise OpbridgeError(f"op library '{name}': cannot build in {root}: {e.strerror or e}; give "
                                "build_directory= or set OPBRIDGE_JIT_DIR to a folder this process can write") from None
    elif verbose:
        print(f"opbridge: op library '{name}' from the cache ({entry})", file=sys.stderr)
    return load_library(torch_path, entry / f"lib{name}_ort.so")


def _check_names(name: str, ns: str, domain: str) -> None:
    """Refuses names that would make paths, CMake arguments or registrations other than the plain
    ones (separators, `..`, spaces), and namespaces or domains that belong to PyTorch or ONNX."""
    if not _LIBRARY_NAME.fullmatch(name):
        raise OpbridgeError(f"op library name '{name}' is not an identifier (it names the library files and target)")
    if not _LIBRARY_NAME.fullmatch(ns):
        raise OpbridgeError(f"op library '{name}': torch namespace '{ns}' is not an identifier (torch.ops.<namespace>)")
    taken = _dispatcher_namespaces().get(ns)
    if ns in _TORCH_NAMESPACES or taken:
        what = f"already holds ops that no opbridge library defined ({taken})" if taken else "is PyTorch's own"
        raise OpbridgeError(f"op library '{name}': torch namespace '{ns}' {what}; the new ops would sit among "
                            "its ops: choose another torch_namespace")
    if not _ONNX_DOMAIN.fullmatch(domain):
        raise OpbridgeError(f"op library '{name}': ONNX domain '{domain}' is not dot-separated identifiers "
                            "(e.g. com.example.ops)" + ("; the empty domain is ONNX's standard one" if not domain else ""))
    if any(domain == d or domain.startswith(d + ".") for d in _ONNX_DOMAINS):
        raise OpbridgeError(f"op library '{name}': ONNX domain '{domain}' belongs to ONNX, ONNX Runtime or an exporter; "
                            "custom ops there clash with theirs: choose another onnx_domain")


def _dispatcher_namespaces() -> dict[str, str]:
    """Namespaces that hold ops in PyTorch's dispatcher now, but for opbridge's own libraries: one
    op of each, to name it."""
    ours = {lib.torch_namespace for lib in libraries()}
    found: dict[str, str] = {}
    for op in torch._C._dispatch_get_all_op_names():
        ns = op.split("::", 1)[0]
        if ns not in ours:
            found.setdefault(ns, op)
    return found


def _check_loaded(name: str, ns: str, domain: str, torch_path: Path) -> None:
    """A process holds one version of a namespace, and one library per ONNX domain: checked before
    building (load_library checks the domain again, from the built library's manifest)."""
    for lib in libraries():
        if lib.torch_namespace == ns and lib.torch_path != torch_path:
            raise OpbridgeError(f"op library '{name}': torch namespace '{ns}' is already loaded from {lib.torch_path}; "
                                "a process holds one version of a namespace: give the new source another name or "
                                "namespace, or start a new process")
    taken = domain_in_use({domain}, lambda lib: lib.torch_path == torch_path)
    if taken:
        raise OpbridgeError(f"op library '{name}': {taken}; give each op library its own onnx_domain")


def _compiler() -> str:
    chosen = os.environ.get("CXX")
    if chosen:  # the user's choice: never silently another compiler
        found = shutil.which(chosen)
        if not found:
            raise OpbridgeError(f"the C++ compiler $CXX={chosen} is not found: set CXX to an installed compiler, or "
                                "unset it to use c++ / g++")
        return found
    found = shutil.which("c++") or shutil.which("g++")
    if not found:
        raise OpbridgeError("no C++ compiler found (c++, g++, or $CXX): install one, e.g. apt-get install g++")
    return found


def _key(name, ns, domain, options: _Options, files, compiler) -> str:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    what = {"name": name, "namespace": ns, "domain": domain, "options": dataclasses.asdict(options),
            "sources": [(n, text, str(p) if p else None) for n, text, p in files],
            "compiler": [compiler, version], "opbridge": build_info(), "torch": torch.__version__,
            "openvino": _openvino_cmake_dir() and importlib.metadata.version("openvino"),
            "python": sys.version, "platform": sys.platform}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _cmake_lists(name, ns, domain, options: _Options, sources: list[str]) -> str:
    def listed(items) -> str:
        return " ".join('"' + i.replace("\\", "/").replace('"', '\\"') + '"' for i in items)

    text = (f"cmake_minimum_required(VERSION 3.24)\nproject({name}_jit LANGUAGES CXX)\nset(CMAKE_CXX_STANDARD 17)\n"
            "find_package(opbridge REQUIRED)\n"
            f"opbridge_add_op_library({name} SOURCES {listed(sources)} TORCH_NAMESPACE {ns} ONNX_DOMAIN {domain})\n")
    if options.cflags:
        text += f"target_compile_options({name}_ops PRIVATE {listed(options.cflags)})\n"
    if options.include_paths:
        text += f"target_include_directories({name}_ops PRIVATE {listed(options.include_paths)})\n"
    for target in (f"{name}_torch", f"{name}_ort", f"{name}_ov") if options.ldflags else ():
        text += f"if(TARGET {target})\n  target_link_options({target} PRIVATE {listed(options.ldflags)})\nendif()\n"
    return text


def _openvino_cmake_dir() -> str | None:
    """The CMake package of the `openvino` pip package of this Python (found without importing
    it), for the library's OpenVINO side; None without one."""
    spec = importlib.util.find_spec("openvino")
    for folder in (spec.submodule_search_locations or ()) if spec else ():
        if (Path(folder) / "cmake" / "OpenVINOConfig.cmake").is_file():
            return str(Path(folder) / "cmake")
    return None


def _build(name, ns, domain, options: _Options, files, compiler, root: Path, entry: Path, verbose: bool) -> None:
    for tool in ("cmake", "ninja"):
        if not shutil.which(tool):
            raise OpbridgeError(f"op library '{name}': building needs {tool}; install it, e.g. apt-get install "
                                f"{'ninja-build' if tool == 'ninja' else 'cmake'}")
    for stale in root.glob(f".{entry.name}-*"):  # a killed build's folder: the entry's lock is ours now
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=root))
    src, build, log_path = work / "src", work / "build", work / "build.log"

    def fail(message: str) -> OpbridgeError:
        kept = root / f"{entry.name}.failed.log"
        shutil.copy(log_path, kept)
        shutil.rmtree(work, ignore_errors=True)
        return OpbridgeError(message.replace("{log}", str(kept)))

    src.mkdir()
    sources = []
    for file_name, text, path in files:
        if path is None:  # inline text: a file of its own, so compiler errors name its lines
            (src / file_name).write_text(text)
            sources.append(str(src / file_name))
        else:
            sources.append(str(path))
    (src / "CMakeLists.txt").write_text(_cmake_lists(name, ns, domain, options, sources))
    print(f"opbridge: building op library '{name}' (first use of this source; cached in {entry})", file=sys.stderr)
    start = time.perf_counter()
    prefix = f"{cmake_prefix_path()};{torch.utils.cmake_prefix_path}"
    # The OpenVINO side where this Python has the `openvino` package (opbridge's CMake package
    # builds it when that is the OpenVINO opbridge was built with, and says so when it is not).
    ov_dir = _openvino_cmake_dir()
    ov = [f"-DOpenVINO_DIR={ov_dir}"] if ov_dir else ["-DOPBRIDGE_WITH_OPENVINO=OFF"]
    steps = [("configure", ["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                            f"-DCMAKE_CXX_COMPILER={compiler}", f"-DCMAKE_PREFIX_PATH={prefix}", *ov,
                            *options.cmake_args]),
             ("compile", ["cmake", "--build", str(build)])]
    with open(log_path, "w") as log:
        for step, cmd in steps:
            t0 = time.perf_counter()
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, **dict(options.env)})
            log.write(f"$ {' '.join(cmd)}\n{r.stdout}\n")
            if verbose:
                sys.stderr.write(r.stdout)
            if r.returncode != 0:
                log.flush()
                raise fail(_failure(name, step, r.stdout, src))
            print(f"opbridge:   {step}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        libs = [f"lib{name}_torch.so", f"lib{name}_ort.so"]
        libs += [f"lib{name}_ov.so"] if (build / f"lib{name}_ov.so").is_file() else []
        for lib in libs:
            shutil.copy2(build / lib, work / lib)
        shutil.rmtree(build)
        problem = _probe(work / libs[1])
        if problem:
            log.write(f"$ loading {libs[1]} in a child process\n{problem}\n")
            log.flush()
            raise fail(f"op library '{name}': {problem}\n(full log: {{log}})")
    seconds = time.perf_counter() - start
    digests = {lib: hashlib.sha256((work / lib).read_bytes()).hexdigest() for lib in libs}
    (work / _DONE).write_text(json.dumps({"name": name, "torch_namespace": ns, "onnx_domain": domain,
                                          "build_seconds": round(seconds, 2), "files": digests}))
    if entry.exists():  # an unfinished or damaged entry: never loaded as it is, replace it
        shutil.rmtree(entry)
    os.rename(work, entry)
    print(f"opbridge: built op library '{name}' in {seconds:.1f} s", file=sys.stderr)


def _probe(ort_path: Path) -> str | None:
    """Why the new library is of no use, found by loading it in a child process first: a source
    whose static initialisation crashes would otherwise take this process with it; one that
    defines no op, or refused definitions. None when it is fine."""
    r = subprocess.run([sys.executable, "-S", "-c", _PROBE, str(ort_path), manifest_symbol()], capture_output=True,
                       text=True, timeout=300)
    if r.returncode != 0:
        how = f"signal {signal.Signals(-r.returncode).name}" if r.returncode < 0 else f"exit status {r.returncode}"
        said = "\n".join(r.stderr.strip().splitlines()[-8:])
        return (f"loading the built library failed ({how}) before any op ran: the source's static initialisation "
                "(a global object's constructor, a static variable's initialiser) crashed or threw"
                + (f":\n{said}" if said else ""))
    try:
        lib = from_json(json.loads(r.stdout), None, ort_path)
    except OpbridgeError as e:
        return str(e)
    if not lib.ops:
        return "the source defines no op (an op is defined with OPBRIDGE_OP(name)...; see docs/authoring.md)"
    return None


def _failure(name: str, step: str, output: str, src: Path) -> str:
    """The compiler's own error lines (and the notes that follow them), with inline sources named
    by their file name, instead of the whole build log."""
    lines = output.replace(str(src) + "/", "").splitlines()
    picked, keep = [], 0
    for line in lines:
        if re.search(r":\d+:\d+: (fatal )?error:", line) or re.search(r"\berror:", line) and "CMake" not in line:
            picked.append(line)
            keep = 3  # the compiler's context: the source line and its caret
        elif keep and not line.startswith(("[", "ninja", "FAILED")):
            picked.append(line)
            keep -= 1
    if not picked or step == "configure":
        picked = [ln for ln in lines if ln.strip()][-20:]
    return (f"op library '{name}': {step} failed:\n" + "\n".join(picked[:40])
            + "\n(full log: {log})")
