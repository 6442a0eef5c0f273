"""The shape of the code: generic code names no op; the modules of python/opbridge form layers
that import only downwards and never in a cycle; modules stay short; no module reaches into
another module's private names. Read from the sources with `ast` (imports inside functions
count too)."""

import ast
import re
from pathlib import Path

import pytest

import opbridge

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "opbridge"

# Bottom to top. A module imports only modules of lower layers; tools may import anything below
# the tools, and a tool imports another only where TOOL_USES says so (`cli/...` is the cli;
# `__main__` is the cli's entry point). Nothing imports the cli or the test harness.
LAYERS = [
    ("base", {"_errors", "_kinds"}),  # the exception; the dtype and attribute-kind tables
    ("manifest", {"_manifest"}),  # a library and its ops, read once from its manifest
    ("registry", {"_registry"}),  # the libraries loaded in this process
    ("rules", {"_rules"}),  # which node writes an op at an opset; argument mapping
    ("exporters", {"_schemas", "_fake", "_autograd", "_dynamo", "_torchscript", "_functions", "_naming"}),
    ("loading", {"_loading"}),  # load_library wires the exporters to a library
    ("inspect", {"_inspect"}),  # what the installed ONNX Runtime can run (export checks it)
    ("api", {"_export", "_session", "_build"}),
    ("verify", {"_verify"}),  # export's input order + a session
    ("package", {"__init__"}),
    ("tools", {"testing", "cli", "_graph", "_triton", "__main__"}),
]
LAYER = {m: k for k, (_, modules) in enumerate(LAYERS) for m in modules}
TOOLS = {"testing", "cli", "_graph", "_triton"}
# The tools built on other tools: the cli runs the drawing and the Triton repository writer.
TOOL_USES = {("cli", "_graph"), ("cli", "_triton"), ("__main__", "cli")}
MAX_LINES = 400


def _module_name(path: Path) -> str:
    """python/opbridge/cli/commands.py -> 'cli.commands'; a package's __init__.py -> the package
    ('__init__' for opbridge itself)."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.glob("**/*.py"))}


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
                if sub in MODULES:  # `from . import _export`: the module itself
                    found.append((sub, "", alias.asname or alias.name, node.lineno))
                else:
                    found.append((".".join(base) or "__init__", alias.name, alias.asname or alias.name, node.lineno))
    return found


def _edges() -> dict[str, set[str]]:
    return {m: {target for target, _, _, _ in _imports(m) if target != m} for m in MODULES}


def _family(module: str) -> str:
    return module.split(".")[0]


def test_generic_code_names_no_op():
    """Core, the adapters and every module of the Python package are generic: none names an
    op (by its name or its ONNX type)."""
    names = {n for op in opbridge.builtin.ops for n in (op.name, op.onnx_type)}
    files = sorted({*ROOT.glob("core/**/*.h"), *ROOT.glob("core/**/*.cc"),
                    *(p for p in ROOT.glob("adapters/**/*") if p.is_file()), *PACKAGE.glob("**/*.py")})
    assert len(files) > 10 and PACKAGE / "__init__.py" in files
    found = [f"{path.relative_to(ROOT)} names op '{name}'" for path in files for name in sorted(names)
             if re.search(rf"\b{re.escape(name)}\b", path.read_text(errors="replace"))]
    assert not found, "\n".join(found)


def test_every_module_has_a_layer():
    missing = sorted(m for m in MODULES if _family(m) not in LAYER)
    assert not missing, f"modules without a layer in LAYERS: {missing}"


def test_no_import_cycles():
    edges = _edges()
    cycles, state = [], {}

    def visit(m, stack):
        state[m] = "open"
        for t in sorted(edges.get(m, ())):
            if state.get(t) == "open":
                cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state and t in edges:
                visit(t, stack + [t])
        state[m] = "done"

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_follow_the_layers(module):
    src = _family(module)
    bad = []
    for target, _, _, line in _imports(module):
        dst = _family(target)
        where = f"{MODULES[module].relative_to(ROOT)}:{line} imports {target}"
        if target not in MODULES:
            bad.append(f"{where}, which does not exist")
        elif dst == src or dst not in LAYER or src not in LAYER:
            continue  # the module's own family; a module without a layer fails its own test
        elif dst in TOOLS:
            if (src, dst) not in TOOL_USES:
                bad.append(f"{where}: only {dst}'s own modules and the tools of TOOL_USES import it")
        elif LAYER[dst] >= LAYER[src]:
            bad.append(f"{where}: layer '{LAYERS[LAYER[dst]][0]}' is not below '{LAYERS[LAYER[src]][0]}'")
    assert not bad, "\n".join(dict.fromkeys(bad))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_is_short(module):
    n = len(MODULES[module].read_text().splitlines())
    assert n <= MAX_LINES, f"{MODULES[module].relative_to(ROOT)} has {n} lines (at most {MAX_LINES})"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_names_of_other_modules(module):
    """Names used across modules are public: importing `_name` from a sibling module, or
    reading `sibling._name`, fails (importing a private module, `from . import _export`, is
    fine)."""
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
