"""What the commands share: the argument types (input specs, factories, tolerances), the steps
(loading libraries, reading a model, importing a user's factory, example data) and progress."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any, Sequence

from ..._library import files, registry
from ..._library import kinds as _kinds
from ._errors import CliError, UsageError, one_line

PROG = "opbridge"


def progress(msg: str) -> None:
    """On stderr, so that stdout holds only the result (e.g. --json)."""
    print(f"[{PROG}] {msg}", file=sys.stderr, flush=True)


# --- argument values ---------------------------------------------------------------------------

# The dtypes an --input may name: those of the package's one dtype table.
DTYPES = tuple(_kinds.DTYPES)


@dataclasses.dataclass(frozen=True)
class InputArg:
    name: str
    shape: tuple[int, ...]
    dtype: str

    def __str__(self) -> str:
        return f"{self.name}={'x'.join(map(str, self.shape))}:{self.dtype}"


def input_arg(text: str) -> InputArg:
    """NAME=SHAPE:DTYPE, SHAPE like 1x3x224x224 (empty for a scalar)."""
    m = re.fullmatch(r"([^=\s]+)=([^:]*):(\w+)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"'{text}' is not NAME=SHAPE:DTYPE (e.g. x=1x3x224x224:float32)")
    name, shape, dtype = m.groups()
    if shape and not re.fullmatch(r"\d+(x\d+)*", shape):
        raise argparse.ArgumentTypeError(f"'{text}': SHAPE must be sizes joined by 'x' (e.g. 1x3x224x224), got '{shape}'")
    if dtype not in DTYPES:
        raise argparse.ArgumentTypeError(f"'{text}': DTYPE must be one of {', '.join(DTYPES)}, got '{dtype}'")
    return InputArg(name, tuple(int(d) for d in shape.split("x")) if shape else (), dtype)


@dataclasses.dataclass(frozen=True)
class DynamicArg:
    name: str
    axis: int
    dim: str | None


def dynamic_arg(text: str) -> DynamicArg:
    """NAME:AXIS or NAME:AXIS:DIM_NAME (axes with the same DIM_NAME share one size)."""
    m = re.fullmatch(r"([^:\s]+):(-?\d+)(?::([A-Za-z_]\w*))?", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"'{text}' is not NAME:AXIS or NAME:AXIS:DIM_NAME (e.g. x:0:batch)")
    return DynamicArg(m.group(1), int(m.group(2)), m.group(3))


def factory_arg(text: str) -> tuple[str, str]:
    """MODULE:FACTORY, MODULE a dotted module or a path to a .py file."""
    module, sep, attr = text.rpartition(":")
    if not sep or not module or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", attr):
        raise argparse.ArgumentTypeError(f"'{text}' is not MODULE:FACTORY (e.g. my_pkg.models:make_model or "
                                         "path/to/model.py:Model)")
    return module, attr


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {v}")
    return v


def tolerance(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


# --- shared steps ------------------------------------------------------------------------------


def opbridge_api():
    """The package's public API: the commands drive opbridge as a user's script would."""
    import opbridge

    return opbridge


def load_libraries(paths: Sequence[str] | None, jit: Sequence[str] | None = None) -> None:
    """Loads each op library given with --library, and with --jit by the name load_inline / load
    built it under (from the JIT cache): whole when PyTorch is loaded (the commands that need it
    load it first), else its ONNX Runtime side, all that inspection and sessions need."""
    ob = opbridge_api()
    cached = files.jit_libraries() if jit else {}
    for name in jit or ():
        if name not in cached:
            raise CliError(f"--jit {name}: no op library '{name}' in the cache {files.cache_root()} (built by "
                           f"opbridge.load_inline / load; cached: {', '.join(cached) or 'none'})")
    for p in [*(paths or ()), *(str(cached[n]) for n in jit or ())]:
        progress(f"loading op library {p}")
        try:
            if ob.torch_deferred():
                lib = files.read_ort_side(p)
                if registry.loaded(ort_path=lib.ort_path) is None:
                    registry.add(lib)
            else:
                ob.load_library(p)
        except ob.OpbridgeError as e:
            raise CliError(f"--library {p}: {e}") from e


def file_kind(p: Path) -> str | None:
    """What is at `p` when it is not a regular file ("a directory", "a FIFO (named pipe)", ...), None
    for a regular file; "" when nothing is there. Told by stat() alone: a FIFO is never opened (that
    would block until a writer came)."""
    try:
        mode = p.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):  # the latter: a path through a file
        return ""
    except OSError as e:  # e.g. a loop of symbolic links
        return f"unreadable ({e.strerror})"
    if stat.S_ISREG(mode):
        return None
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return kind
    return "not a regular file"


def regular_file(path: str, what: str = "") -> Path:
    """`path` as a Path, or a CliError saying what is there instead of a regular file."""
    p = Path(path)
    kind = file_kind(p)
    if kind == "":
        raise CliError(f"{what}{path}: no such file")
    if kind is not None:
        raise CliError(f"{what}{path} is {kind}, not a regular file")
    return p


def read_model(path: str):
    import onnx
    from google.protobuf.message import DecodeError

    p = Path(path)
    if p.is_dir():
        raise CliError(f"{path} is a directory, not an ONNX model file")
    regular_file(path)
    try:
        model = onnx.load(str(p), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as e:
        raise CliError(f"{path} is not an ONNX model (cannot parse it as a ModelProto: {one_line(e)})") from e
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise CliError(f"{path} is not an ONNX model (no IR version or no graph)")
    return model


def import_factory(module: str, attr: str):
    """The callable `attr` of a module given as a dotted name or a path to a .py file."""
    if module.endswith(".py") or os.sep in module or "/" in module:
        path = Path(module).resolve()
        if not path.is_file():
            raise CliError(f"{module}: no such file")
        sys.path.insert(0, str(path.parent))  # the file's own imports of its siblings
        name = "_opbridge_user_" + re.sub(r"\W", "_", path.stem)
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise CliError(f"{module}: cannot be imported as a Python module")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except Exception as e:
            raise CliError(f"importing {module} failed: {one_line(e)}") from e
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # the console script does not put it there
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and module.startswith(e.name):
                raise CliError(f"cannot import module '{module}': {e}") from e
            raise CliError(f"importing {module} failed: {one_line(e)}") from e
        except Exception as e:
            raise CliError(f"importing {module} failed: {one_line(e)}") from e
    obj: Any = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CliError(f"module '{module}' has no attribute '{attr}'")
        obj = getattr(obj, part)
    if not callable(obj):
        raise CliError(f"'{module}:{attr}' is not callable (FACTORY must be a class or a function)")
    return obj


def build_model(spec: tuple[str, str]):
    import torch

    module, attr = spec
    progress(f"importing {module}")
    factory = import_factory(module, attr)
    progress(f"calling {attr}()")
    try:
        model = factory()
    except Exception as e:
        raise CliError(f"{attr}() raised {one_line(e)}") from e
    if not isinstance(model, torch.nn.Module):
        raise CliError(f"{attr}() returned {type(model).__name__}, not a torch.nn.Module")
    return model.eval()


def random_tensor(spec: InputArg, seed: int):
    """Reproducible example data: normal floats, integers in [0, 10), random booleans."""
    import torch

    g = torch.Generator().manual_seed(seed)
    dtype = _kinds.DTYPES[spec.dtype].torch
    try:
        if dtype.is_floating_point:
            return torch.randn(spec.shape, generator=g, dtype=torch.float32).to(dtype)
        if dtype == torch.bool:
            return torch.randint(0, 2, spec.shape, generator=g).bool()
        return torch.randint(0, 10, spec.shape, generator=g, dtype=torch.int64).to(dtype)
    except RuntimeError as e:  # the allocator's message alone would not say which input
        elements = 1
        for d in spec.shape:
            elements *= d
        raise CliError(f"input '{spec.name}' of shape {list(spec.shape)} ({elements} elements of {spec.dtype}) cannot "
                       f"be made: {one_line(e)}; give smaller data with --input {spec.name}=SHAPE:DTYPE or "
                       "--inputs FILE.npz") from None


def no_duplicate_names(specs: Sequence[InputArg]) -> None:
    seen = set()
    for s in specs:
        if s.name in seen:
            raise UsageError(f"--input {s.name} is given twice")
        seen.add(s.name)


def table(rows: list[list[str]], head: list[str]) -> list[str]:
    """Columns padded to their widest cell, under the head and a rule of dashes."""
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    fmt = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return [fmt(head), fmt(["-" * w for w in widths]), *[fmt(r) for r in rows]]
