"""The architecture as a test: dependencies point one way, no cycles, no private imports across
modules, no submodule shadowed by a name of its package, one exported error hierarchy, and tests
that mirror the packages."""

import ast
import importlib
import inspect
import pkgutil
import sys
import types
from pathlib import Path

import pytest

import attrgraph
import attrgraph.errors
import transcoders
from attrgraph.errors import AttrgraphError

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("attrgraph", "transcoders")
# a module of a layer may import from its own layer and the layers after it, never before
LAYERS = [
    "attrgraph.cli",
    "attrgraph.viewer",
    "attrgraph.analysis",
    "attrgraph.circuits",
    "attrgraph.engine",
    "attrgraph.graph",
    "attrgraph.bundled",
    "attrgraph.errors",
]
BLOCK_LAYOUT = "transcoders/block_layout.py"
"""The one module that spells TransformerLens's per-block hook names (`blocks.{layer}...`)."""


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            out[name] = path
    return out


def _imports(path: Path) -> list[tuple[str, str, int]]:
    """(module, imported name or '', line) of every absolute import, type-checking ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.module, a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, "", node.lineno) for a in node.names]
    return out


def _edges(modules: dict[str, Path]) -> dict[str, set[str]]:
    edges = {}
    for name, path in modules.items():
        deps = set()
        for mod, attr, _ in _imports(path):
            target = f"{mod}.{attr}" if f"{mod}.{attr}" in modules else mod
            # a package's __init__ and its own submodules are one unit here
            if target in modules and not (target.startswith(name + ".") or name.startswith(target + ".")):
                deps.add(target)
        edges[name] = deps
    return edges


def _layer(name: str) -> int | None:
    for i, prefix in enumerate(LAYERS):
        if name == prefix or name.startswith(prefix + "."):
            return i
    return None


def test_no_import_cycles():
    edges = _edges(_modules())
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(v):
        state[v] = 1
        stack.append(v)
        for w in sorted(edges[v]):
            if state.get(w) == 1:
                pytest.fail("import cycle: " + " -> ".join(stack[stack.index(w) :] + [w]))
            if w not in state:
                visit(w)
        stack.pop()
        state[v] = 2

    for v in sorted(edges):
        if v not in state:
            visit(v)


def test_dependencies_point_one_way():
    bad = [
        f"{name} imports {dep}"
        for name, deps in _edges(_modules()).items()
        for dep in deps
        if _layer(name) is not None and _layer(dep) is not None and _layer(dep) < _layer(name)
    ]
    assert not bad, "imports against the layering " + " -> ".join(LAYERS) + ":\n" + "\n".join(bad)


def test_every_subpackage_has_a_layer():
    subpackages = {p.parent.name for p in (ROOT / "attrgraph").glob("*/__init__.py")}
    modules = {p.stem for p in (ROOT / "attrgraph").glob("*.py") if p.stem != "__init__"}
    placed = {name.split(".")[1] for name in LAYERS}
    assert subpackages | modules == placed, (
        f"attrgraph subpackages without a layer: {sorted(subpackages | modules - placed)}; add them to LAYERS"
    )


def _strings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string literal in `path` that is no docstring (f-string parts included)."""
    tree = ast.parse(path.read_text())
    bodies = [b for node in ast.walk(tree) if isinstance(b := getattr(node, "body", None), list)]
    docs = {
        id(x.value)
        for body in bodies
        for x in body
        if isinstance(x, ast.Expr) and isinstance(x.value, ast.Constant)
    }
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def test_only_the_block_layout_names_block_hooks():
    """A hook name such as `blocks.{l}.ln2.hook_scale` spelled in place is where a new architecture
    breaks (issue 32): every module asks `transcoders.block_layout` instead. Docstrings may mention them."""
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {text[:60]!r}"
        for path in _modules().values()
        if path.relative_to(ROOT).as_posix() != BLOCK_LAYOUT
        for line, text in _strings(path)
        if "blocks." in text
    ]
    assert not bad, "hook names spelled outside " + BLOCK_LAYOUT + ":\n" + "\n".join(bad)


def test_no_module_imports_another_modules_private_names():
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {attr} from {mod}"
        for path in _modules().values()
        for mod, attr, line in _imports(path)
        if attr.startswith("_") and mod.split(".")[0] in PACKAGES
    ]
    assert not bad, "\n".join(bad)


def test_no_submodule_is_shadowed_by_a_name_of_its_package():
    for pkg_name in PACKAGES:
        pkg = importlib.import_module(pkg_name)
        for info in pkgutil.walk_packages(pkg.__path__, pkg_name + "."):
            if not info.name.endswith(".__main__"):  # running it would run the command
                importlib.import_module(info.name)
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] not in PACKAGES or "." not in name:
            continue
        parent, child = name.rsplit(".", 1)
        value = getattr(sys.modules[parent], child, module)
        assert isinstance(value, types.ModuleType), f"{parent}.{child} is {value!r}, not the module {name}"
    import attrgraph.circuits.eap

    assert isinstance(attrgraph.circuits.eap, types.ModuleType)
    assert attrgraph.to_networkx is not attrgraph.circuits.circuit_to_networkx


def test_one_error_hierarchy_exported_from_its_package():
    errors = {
        name: cls
        for module in list(sys.modules.values())
        if getattr(module, "__name__", "").split(".")[0] in PACKAGES
        for name, cls in vars(module).items()
        if inspect.isclass(cls) and issubclass(cls, BaseException) and cls.__module__ == module.__name__
    }
    assert errors, "no error classes found"
    for name, cls in errors.items():
        # warnings (PromptWarning) are exported too, but are no errors
        assert issubclass(cls, (AttrgraphError, Warning)), (
            f"{cls.__module__}.{name} is outside the AttrgraphError hierarchy"
        )
        package = attrgraph if cls.__module__.startswith("attrgraph") else transcoders
        assert getattr(package, name, None) is cls, f"{name} is not exported from {package.__name__}"
    assert all(
        issubclass(c, (AttrgraphError, Warning))
        for c in vars(attrgraph.errors).values()
        if inspect.isclass(c)
    )


def test_public_api_resolves_and_import_is_light():
    for name in attrgraph.__all__:
        assert getattr(attrgraph, name) is not None
    code = "import sys, attrgraph; sys.exit('torch' in sys.modules or 'h5py' in sys.modules)"
    import subprocess

    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_tests_mirror_the_packages():
    tests = ROOT / "tests"
    for d in [p for p in tests.rglob("*") if p.is_dir() and p.name != "__pycache__"]:
        rel = d.relative_to(tests)
        assert (ROOT / rel).is_dir() and (ROOT / rel / "__init__.py").exists(), (
            f"tests/{rel} mirrors no package {rel}"
        )
        assert (d / "__init__.py").exists(), f"tests/{rel} is not a package (its names would shadow others)"
