"""The shape of the code, read from the sources (imports inside functions count too):

- the Python package is four wings and the package level that ties them together. A wing imports
  only the wings before it: library (what an op library is) <- runtime (ONNX Runtime) <- export
  (PyTorch to ONNX) <- tools (the command line and the rest); the package level may import any
  wing, and only the tools wing may import the package level (its public API). Beside them,
  compat (the drop-in modules of other packages' APIs) is a client: it uses the public API only,
  as a user's code does, and is the one part that names ops;
- no import cycles between modules, inside a wing or across;
- C++ includes point one way: core <- ops <- adapters, and core's files (a header with its source
  as one unit) include each other without a cycle;
- generic code names no op; modules stay short; no module reaches into another's private names.
"""

import ast
import re
from pathlib import Path

import pytest

import opbridge

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "opbridge"

WINGS = ["_library", "_runtime", "_export", "_tools"]  # each imports only those before it
CLIENTS = ["compat"]  # built on the public API alone
PACKAGE_LEVEL = "package"  # opbridge/__init__.py, __main__.py, testing.py: the public API
MAX_LINES = 400


def _module_name(path: Path) -> str:
    """python/opbridge/_tools/cli/export.py -> '_tools.cli.export'; a package's __init__.py -> the
    package ('__init__' for opbridge itself)."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.glob("**/*.py")) if "_sdk" not in p.parts}


def _wing(module: str) -> str:
    first = module.split(".")[0]
    return first if first in WINGS or first in CLIENTS else PACKAGE_LEVEL


def _imports(name: str) -> list[tuple[str, str, str, int]]:
    """(module imported, name imported from it or "" for the module itself, the local name it
    is bound to, line) for every import of the package's own modules in module `name`; the
    package itself is '__init__'."""
    path = MODULES[name]
    package = name.split(".") if path.name == "__init__.py" and name != "__init__" else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "opbridge" or alias.name.startswith("opbridge."):
                    local = alias.asname or alias.name.split(".")[0]
                    found.append((alias.name[len("opbridge."):] or "__init__", "", local, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] + (node.module.split(".") if node.module else [])
            elif node.module == "opbridge" or (node.module or "").startswith("opbridge."):
                base = node.module.split(".")[1:]
            else:
                continue
            for alias in node.names:
                sub = ".".join(base + [alias.name])
                if sub in MODULES:  # `from . import kinds`: the module itself
                    found.append((sub, "", alias.asname or alias.name, node.lineno))
                else:
                    found.append((".".join(base) or "__init__", alias.name, alias.asname or alias.name, node.lineno))
    return found


def _edges() -> dict[str, set[str]]:
    return {m: {target for target, _, _, _ in _imports(m) if target != m} for m in MODULES}


def test_the_package_is_four_wings():
    wings = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name not in ("_sdk", "__pycache__")}
    assert wings == set(WINGS + CLIENTS), f"the package's folders are {sorted(wings)}, the wings {WINGS}, " \
                                          f"the clients {CLIENTS}"
    loose = sorted(m for m in MODULES if _wing(m) == PACKAGE_LEVEL)
    assert loose == ["__init__", "__main__", "testing"], f"modules outside the wings: {loose}"


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every cycle a depth-first walk of `graph` (node -> nodes it points at) meets, as a path."""
    cycles, state = [], {}

    def visit(u, stack):
        state[u] = "open"
        for v in sorted(graph.get(u, ())):
            if state.get(v) == "open":
                cycles.append(" -> ".join(stack[stack.index(v):] + [v]))
            elif v not in state and v in graph:
                visit(v, stack + [v])
        state[u] = "done"

    for u in sorted(graph):
        if u not in state:
            visit(u, [u])
    return cycles


def test_no_import_cycles():
    cycles = _cycles(_edges())
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_follow_the_wings(module):
    src = _wing(module)
    bad = []
    for target, _, _, line in _imports(module):
        where = f"{MODULES[module].relative_to(ROOT)}:{line} imports {target}"
        if target not in MODULES:
            bad.append(f"{where}, which does not exist")
            continue
        dst = _wing(target)
        if dst == src or src == PACKAGE_LEVEL:
            continue
        if src in CLIENTS:
            if dst != PACKAGE_LEVEL:
                bad.append(f"{where}: a client uses the package's public API only, not the {dst} wing")
            continue
        if dst in CLIENTS:
            bad.append(f"{where}: nothing in the package imports the {dst} client")
            continue
        if dst == PACKAGE_LEVEL:
            if src != "_tools":
                bad.append(f"{where}: only the tools wing uses the package's public API")
        elif WINGS.index(dst) > WINGS.index(src):
            bad.append(f"{where}: wing {dst} comes after {src} ({' <- '.join(WINGS)})")
    assert not bad, "\n".join(dict.fromkeys(bad))


def _include_graph(folder: str) -> dict[str, set[str]]:
    """Unit (a header and its source, by stem) -> units of `folder` it includes."""
    files = [p for p in (ROOT / folder).rglob("*") if p.suffix in (".h", ".cc")]
    stems = {p.stem for p in files}
    graph: dict[str, set[str]] = {}
    for p in files:
        for inc in re.findall(r'^#include [<"]([^>"]+)[>"]', p.read_text(), re.M):
            stem = Path(inc).stem
            if stem in stems and stem != p.stem:
                graph.setdefault(p.stem, set()).add(stem)
    return graph


def test_cpp_includes_point_one_way():
    """Each C++ file includes headers of its own folder, of core (<opbridge/...>) and of third
    parties: core nothing of ops or adapters, ops nothing of adapters, adapters nothing of ops,
    and no file reaches out of its folder with a relative path."""
    own_files = {layer: {p.name for p in (ROOT / layer).rglob("*.h")} for layer in ("ops", "adapters")}
    core_headers = {str(p.relative_to(ROOT / "core" / "include")) for p in (ROOT / "core" / "include").rglob("*.h")}
    bad = []
    for layer in ("core", "ops", "adapters"):
        for p in sorted((ROOT / layer).rglob("*")):
            if p.suffix not in (".h", ".cc"):
                continue
            for inc in re.findall(r'^#include [<"]([^>"]+)[>"]', p.read_text(), re.M):
                where = f"{p.relative_to(ROOT)} includes {inc}"
                if inc.startswith("opbridge/"):
                    if inc not in core_headers:
                        bad.append(f"{where}, which core does not have")
                elif ".." in inc.split("/"):
                    bad.append(f"{where}: out of its folder")
                elif not (p.parent / inc).exists():  # not its own folder's: a third party's
                    bad += [f"{where}, a header of {other}" for other in ("ops", "adapters")
                            if other != layer and Path(inc).name in own_files[other]]
                elif layer == "core" and not (p.parent / inc).resolve().is_relative_to(ROOT / "core"):
                    bad.append(f"{where}: core includes only core")
    assert core_headers and not bad, "\n".join(bad)


def test_core_includes_have_no_cycle():
    graph = _include_graph("core")
    cycles = _cycles(graph)
    assert graph and not cycles, "include cycles in core:\n" + "\n".join(cycles)


def test_generic_code_names_no_op():
    """Core, the adapters and every module of the Python package but its clients are generic:
    none names an op (by its name or its ONNX type)."""
    names = {n for op in opbridge.builtin.ops for n in (op.name, op.onnx_type)}
    files = sorted({*ROOT.glob("core/**/*.h"), *ROOT.glob("core/**/*.cc"),
                    *(p for p in ROOT.glob("adapters/**/*") if p.is_file()),
                    *(p for m, p in MODULES.items() if _wing(m) not in CLIENTS)})
    assert len(files) > 10 and PACKAGE / "__init__.py" in files
    found = [f"{path.relative_to(ROOT)} names op '{name}'" for path in files for name in sorted(names)
             if re.search(rf"\b{re.escape(name)}\b", path.read_text(errors="replace"))]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_is_short(module):
    n = len(MODULES[module].read_text().splitlines())
    assert n <= MAX_LINES, f"{MODULES[module].relative_to(ROOT)} has {n} lines (at most {MAX_LINES})"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_names_of_other_modules(module):
    """Names used across modules are public: importing `_name` from a sibling module, or
    reading `sibling._name`, fails (importing a private module or wing, `from . import _export`,
    is fine)."""
    imports = _imports(module)
    bad = [f"line {line}: from {target} import {name}" for target, name, _, line in imports
           if name and _private(name) and target != module]
    modules = {local for target, name, local, _ in imports if not name and target != module}
    bad += [f"line {node.lineno}: {node.value.id}.{node.attr}" for node in ast.walk(ast.parse(MODULES[module].read_text()))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
            and _private(node.attr)]
    assert not bad, f"{MODULES[module].relative_to(ROOT)} uses private names of other modules:\n" + "\n".join(bad)


def test_public_names_resolve():
    for name in opbridge.__all__:
        assert getattr(opbridge, name) is not None, name
    assert opbridge.builtin.ops and all(getattr(opbridge, op.name) is not None
                                        for op in opbridge.builtin.ops if op.defines_torch_op)
