"""Loading op libraries: the torch library (ops + manifest), then everything derived from the
manifest — ONNX schemas and the export rules of both exporters."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch

_SDK = Path(__file__).resolve().parent / "_sdk"

# Manifest dtype names -> torch dtypes.
TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "int32": torch.int32, "int64": torch.int64,
                "bool": torch.bool, "uint8": torch.uint8}


class OpbridgeError(RuntimeError):
    """An opbridge usage error with a one-line explanation."""


@dataclasses.dataclass(frozen=True)
class OpInfo:
    """One op of a library, as its manifest describes it."""

    library: "Library"
    name: str
    torch_op: str  # "<namespace>::<name>", or an existing op such as "aten::<name>"
    defines_torch_op: bool
    doc: str
    export_kind: str  # "kernel" (own node + kernel) | "mapping" (rules only) | "function"
    onnx_domain: str  # the op's own node: library domain, type and version
    onnx_type: str
    since_version: int
    # Export rules by ascending ai.onnx opset: {"domain", "op_type", "min_opset", "inputs":
    # [{"name", "when"}], "attributes": [{"name", "kind", "from" | "value"}]}.
    export_rules: list[dict[str, Any]]
    function: dict[str, Any] | None  # {"opset", "body"} for export_kind == "function"
    types: dict[str, list[str]]  # constraint -> dtype names
    onnx_types: dict[str, list[str]]  # constraint -> "tensor(float)", ...
    inputs: list[dict[str, Any]]
    attributes: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    checks: list[str]

    @property
    def attr_kinds(self) -> dict[str, str]:
        return {a["name"]: a["kind"] for a in self.attributes}

    @property
    def overload(self) -> torch._ops.OpOverload:
        ns, name = self.torch_op.split("::")
        return getattr(getattr(torch.ops, ns), name).default

    @property
    def available(self) -> bool:
        """Whether PyTorch has the op now (a mapped op of another library, e.g. torchvision's,
        exists only once that library is imported)."""
        ns, name = self.torch_op.split("::")
        try:
            return hasattr(getattr(torch.ops, ns), name)
        except (AttributeError, RuntimeError):
            return False

    @property
    def has_own_node(self) -> bool:
        """Exported (at some opset) as a node of the library's domain: a kernel or a function."""
        return self.export_kind in ("kernel", "function")


@dataclasses.dataclass
class Library:
    name: str
    torch_namespace: str
    onnx_domain: str
    onnx_domain_version: int
    torch_path: Path
    ort_path: Path | None
    ops: list[OpInfo] = dataclasses.field(default_factory=list)

    def op(self, name: str) -> OpInfo:
        for op in self.ops:
            if op.name == name:
                return op
        raise OpbridgeError(f"library '{self.name}' has no op '{name}'")


_libraries: list[Library] = []


def libraries() -> list[Library]:
    """Every op library loaded so far (the built-in one first)."""
    return list(_libraries)


def all_ops() -> list[OpInfo]:
    return [op for lib in _libraries for op in lib.ops]


def _read_manifest(torch_path: Path) -> dict[str, Any]:
    handle = ctypes.CDLL(str(torch_path))
    try:
        fn = handle.opbridge_manifest_json
    except AttributeError:
        raise OpbridgeError(f"{torch_path} is not an opbridge op library (no manifest)") from None
    fn.restype = ctypes.c_char_p
    return json.loads(fn().decode())


def load_library(torch_path: str | os.PathLike, ort_path: str | os.PathLike | None = None) -> Library:
    """Loads an op library built with opbridge_add_op_library(): registers its torch ops, its
    ONNX schemas and its export rules. `ort_path` defaults to the sibling lib<name>_ort.so."""
    torch_path = Path(torch_path).resolve()
    for lib in _libraries:
        if lib.torch_path == torch_path:
            return lib
    if not torch_path.exists():
        raise OpbridgeError(f"op library not found: {torch_path}")
    torch.ops.load_library(str(torch_path))
    manifest = _read_manifest(torch_path)
    if manifest["errors"]:
        raise OpbridgeError(f"{torch_path.name}: invalid op definitions: " + "; ".join(manifest["errors"]))
    for other in _libraries:
        # ONNX Runtime takes one custom-op domain once per session: two libraries in one domain
        # would make every session fail.
        if other.onnx_domain == manifest["onnx_domain"]:
            raise OpbridgeError(
                f"{torch_path.name}: ONNX domain '{manifest['onnx_domain']}' is already used by op library "
                f"'{other.name}' ({other.torch_path}); give each op library its own ONNX_DOMAIN"
            )
    if ort_path is None:
        candidate = torch_path.with_name(torch_path.name.replace("_torch.so", "_ort.so"))
        ort_path = candidate if candidate.exists() else None
    lib = Library(
        name=manifest["library"],
        torch_namespace=manifest["torch_namespace"],
        onnx_domain=manifest["onnx_domain"],
        onnx_domain_version=manifest["onnx_domain_version"],
        torch_path=torch_path,
        ort_path=Path(ort_path).resolve() if ort_path else None,
    )
    for m in manifest["ops"]:
        ex = m["export"]
        lib.ops.append(
            OpInfo(
                library=lib,
                name=m["name"],
                torch_op=m["qualified_name"],
                defines_torch_op=m["defines_torch_op"],
                doc=m["doc"],
                export_kind=ex["kind"],
                onnx_domain=ex["domain"],
                onnx_type=ex["op_type"],
                since_version=ex["since_version"],
                export_rules=ex["rules"],
                function=ex.get("function"),
                types={t["name"]: t["dtypes"] for t in m["types"]},
                onnx_types={t["name"]: t["onnx"] for t in m["types"]},
                inputs=m["inputs"],
                attributes=m["attributes"],
                outputs=m["outputs"],
                checks=m["checks"],
            )
        )
    from . import _exporters, _fake, _schemas  # after the torch ops exist

    _fake.register_fakes(lib)
    _schemas.register(lib)
    _exporters.register_torchscript_symbolics(lib)
    _libraries.append(lib)
    return lib


def builtin_library_dir() -> Path:
    env = os.environ.get("OPBRIDGE_LIBRARY_DIR")
    return Path(env) if env else _SDK / "lib"


def load_builtin() -> Library:
    d = builtin_library_dir()
    torch_path = d / "libopbridge_torch.so"
    if not torch_path.exists():
        raise OpbridgeError(
            f"the opbridge op libraries are not built ({torch_path} is missing); run scripts/setup.sh"
        )
    return load_library(torch_path, d / "libopbridge_ort.so")


def cmake_prefix_path() -> str:
    """For find_package(opbridge) in a project that builds its own op library."""
    return str(_SDK / "lib" / "cmake")
