"""What lies on disk: the built-in libraries and what they were built with (build_info.json), and
op library files — which side of an op library a file is (told by the symbols it exports, read
with pyelftools without loading it) and the manifest it carries (read with ctypes)."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
from pathlib import Path

from .errors import OpbridgeError
from .manifest import Library, from_json

SDK = Path(__file__).resolve().parent.parent / "_sdk"


def builtin_library_dir() -> Path:
    env = os.environ.get("OPBRIDGE_LIBRARY_DIR")
    return Path(env) if env else SDK / "lib"


@functools.lru_cache(maxsize=None)
def _build_info(d: Path) -> dict:
    for path in (d / "build_info.json", d.parent / "build_info.json"):  # a build tree, an install tree
        if path.is_file():
            return json.loads(path.read_text())
    raise OpbridgeError(f"the opbridge op libraries are not built (no build_info.json in {d} or {d.parent}); "
                        "run scripts/setup.sh, or pip install opbridge")


def build_info() -> dict:
    """What the built-in libraries were built with (CMake writes build_info.json next to them):
    the opbridge version, the torch version (None without PyTorch), the ONNX Runtime SDK's, and
    the names of the symbols op libraries export."""
    return dict(_build_info(builtin_library_dir()))


def manifest_symbol() -> str:
    """The symbol both sides of an op library export their manifest under."""
    return build_info()["symbols"]["manifest"]


def ort_symbol() -> str:
    """The entry point ONNX Runtime looks up in a custom-op library (RegisterCustomOps)."""
    return build_info()["symbols"]["onnxruntime"]


def cmake_prefix_path() -> str:
    """For find_package(opbridge) in a project that builds its own op library."""
    return str(SDK / "lib" / "cmake")


def exported_symbols(path: str | os.PathLike, names: set[str]) -> set[str] | None:
    """Which of `names` the ELF shared library at `path` exports (defined, global or weak,
    visible symbols of its dynamic symbol table), read from the file: loading it would run its
    static initializers, and a PyTorch library does not even load without libtorch. None if it is
    not an ELF shared library."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            if elf["e_type"] != "ET_DYN":
                return None
            found = set()
            for section in elf.iter_sections(type="SHT_DYNSYM"):
                for name in names:
                    for sym in section.get_symbol_by_name(name) or ():
                        if (sym["st_shndx"] != "SHN_UNDEF" and sym["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK")
                                and sym["st_other"]["visibility"] in ("STV_DEFAULT", "STV_PROTECTED")):
                            found.add(name)
            return found
    except (ELFError, ValueError, OSError, KeyError):
        return None  # not ELF, or a truncated one


def sibling(path: Path, side: str) -> Path:
    """lib<name>_torch.so <-> lib<name>_ort.so: the other side of an op library, by its name."""
    other = "_ort.so" if side == "ort" else "_torch.so"
    for suffix in ("_torch.so", "_ort.so"):
        if path.name.endswith(suffix):
            return path.with_name(path.name[: -len(suffix)] + other)
    return path


def torch_library_problem(path: Path) -> str | None:
    """Why `path` is not the PyTorch side of an op library (its ONNX Runtime side, given in its
    place, is named with the right file), or None when it is."""
    manifest, ort = manifest_symbol(), ort_symbol()
    exports = exported_symbols(path, {manifest, ort})
    if exports is None:
        return f"{path} is not an op library: it is not an ELF shared library"
    if ort in exports:
        other = sibling(path, "torch")
        other_name = str(other) if other != path and other.exists() else "lib<name>_torch.so, built beside it"
        return (f"{path.name} is an ONNX Runtime custom-op library (it exports {ort}): load its PyTorch library "
                f"instead, {other_name} (the ONNX Runtime library beside it is found and registered with it)")
    if manifest in exports:
        return None
    return f"{path} is not an opbridge op library (it exports neither {manifest} nor {ort})"


def ort_library_problem(path: str | os.PathLike) -> str | None:
    """Why ONNX Runtime cannot register `path` as a custom-op library (an op library's PyTorch
    file passed for its ONNX Runtime sibling, a file that is neither), or None if it can."""
    path = Path(path).resolve()
    manifest, ort = manifest_symbol(), ort_symbol()
    exports = exported_symbols(path, {manifest, ort})
    if exports is None:
        return f"{path} is not an ONNX Runtime custom-op library: it is not an ELF shared library"
    if ort in exports:
        return None
    if manifest in exports:
        other = sibling(path, "ort")
        other_name = str(other) if other != path and other.exists() else "lib<name>_ort.so, built beside it"
        return (f"{path.name} is the PyTorch library of an op library (it exports {manifest}): ONNX Runtime takes "
                f"its ONNX Runtime library, {other_name} (or load this one with opbridge.load_library, which "
                "registers its sibling in every opbridge.session)")
    return f"{path} is not an ONNX Runtime custom-op library (it does not export {ort})"


def read_manifest(path: Path, torch_path: Path | None, ort_path: Path | None) -> Library:
    """The manifest of the op library file at `path` (either side; loaded with ctypes, so a
    PyTorch side needs PyTorch loaded first), as the Library of these two files."""
    handle = ctypes.CDLL(str(path))
    try:
        fn = getattr(handle, manifest_symbol())
    except AttributeError:
        raise OpbridgeError(f"{path} is not an opbridge op library (no manifest)") from None
    fn.restype = ctypes.c_char_p
    return from_json(json.loads(fn().decode()), torch_path, ort_path)


def read_ort_side(path: str | os.PathLike) -> Library:
    """An op library as its ONNX Runtime side describes it, for sessions and inspection without
    PyTorch: `path` is either side of the library (lib<name>_torch.so names its sibling)."""
    path = Path(path).resolve()
    if not path.exists():
        raise OpbridgeError(f"op library not found: {path}")
    ort_path = path
    if ort_library_problem(path) is not None:
        problem = torch_library_problem(path)
        if problem:
            raise OpbridgeError(problem)
        ort_path = sibling(path, "ort")
        if not ort_path.exists():
            raise OpbridgeError(f"{path.name} has no ONNX Runtime library beside it ({ort_path} is missing)")
    return read_manifest(ort_path, None, ort_path)


JIT_DONE = "entry.json"  # the last file of a finished load_inline / load build


def cache_root() -> Path:
    """Where load_inline / load cache their builds: $OPBRIDGE_JIT_DIR, else
    $XDG_CACHE_HOME/opbridge/jit (default ~/.cache/opbridge/jit). Deleting it clears the cache."""
    env = os.environ.get("OPBRIDGE_JIT_DIR")
    if env:
        return Path(env).absolute()  # the build names its sources by absolute path
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "opbridge" / "jit"


def jit_entry_problem(entry: Path) -> str | None:
    """Why the load_inline / load cache entry `entry` cannot be loaded as it is (never finished,
    or damaged since: a record that does not parse, a library file missing or changed), or None."""
    try:
        record = json.loads((entry / JIT_DONE).read_text())
    except FileNotFoundError:
        return "never finished"
    except (OSError, ValueError) as e:
        return f"{JIT_DONE} unreadable ({e})"
    digests = record.get("files") if isinstance(record, dict) else None
    if not isinstance(digests, dict) or not digests:
        return f"{JIT_DONE} names no library files"
    for file_name, digest in digests.items():
        try:
            data = (entry / file_name).read_bytes()
        except OSError:
            return f"{file_name} missing"
        if hashlib.sha256(data).hexdigest() != digest:
            return f"{file_name} changed since it was built"
    return None


def jit_libraries() -> dict[str, Path]:
    """The op libraries load_inline / load built into the cache, by name: the PyTorch side of the
    most recent intact build of each (a name built from other sources has one entry per source)."""
    found: dict[str, tuple[float, Path]] = {}
    root = cache_root()
    for done in root.glob(f"*/{JIT_DONE}") if root.is_dir() else ():
        if jit_entry_problem(done.parent):
            continue  # the next load_inline / load of its source rebuilds it
        name = json.loads(done.read_text()).get("name", "")
        torch_path = done.parent / f"lib{name}_torch.so"
        when = done.stat().st_mtime
        if name and torch_path.is_file() and when >= found.get(name, (-1.0, None))[0]:
            found[name] = (when, torch_path)
    return {name: path for name, (_, path) in sorted(found.items())}
