"""transcoders is the lower package: it imports nothing from attrgraph. What both need lives here (the
error root `AttrgraphError`, the atomic HDF5 writer h5file.py); what attrgraph offers training (its
bundled model and corpus) reaches it through providers.py (entry points declared in pyproject.toml)."""

import ast
import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from transcoders import providers
from transcoders.train import corpus_items, load_any_model

ROOT = Path(__file__).resolve().parents[2]


def _attrgraph_imports(path: Path) -> list[str]:
    """Every import of attrgraph in `path`, at any depth (inside functions too), and every
    `import_module("attrgraph...")` / `__import__("attrgraph...")` with a literal name."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if fname in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names = [node.args[0].value]
        out += [
            f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] == "attrgraph"
        ]
    return out


def test_no_module_of_transcoders_imports_attrgraph():
    bad = [hit for path in sorted((ROOT / "transcoders").rglob("*.py")) for hit in _attrgraph_imports(path)]
    assert not bad, "transcoders must not import attrgraph:\n" + "\n".join(bad)


def test_the_scan_sees_imports_inside_functions():
    src = ROOT / "transcoders" / "train.py"
    fake = src.parent / "_scan_probe.py"
    code = "def f():\n    from attrgraph.bundled.tasks import stream\n    importlib.import_module('attrgraph.x')\n"
    try:
        fake.write_text(code)
        assert len(_attrgraph_imports(fake)) == 2
    finally:
        fake.unlink()


def test_importing_all_of_transcoders_loads_no_attrgraph_module():
    code = (
        "import importlib, pkgutil, sys, transcoders\n"
        "for info in pkgutil.walk_packages(transcoders.__path__, 'transcoders.'):\n"
        "    if not info.name.endswith('.__main__'):\n"
        "        importlib.import_module(info.name)\n"
        "bad = [m for m in sys.modules if m == 'attrgraph' or m.startswith('attrgraph.')]\n"
        "sys.exit(', '.join(bad) or None)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]


def test_the_shared_pieces_stay_light():
    """attrgraph's torch-free modules (its errors, the graph store) import transcoders.errors and
    transcoders.h5file: neither may pull in torch, and attrgraph's root error is transcoders'."""
    code = (
        "import sys, attrgraph.errors, attrgraph.graph.store, transcoders.errors, transcoders.h5file\n"
        "assert attrgraph.errors.AttrgraphError is transcoders.errors.AttrgraphError\n"
        "assert issubclass(transcoders.errors.TranscoderError, attrgraph.errors.AttrgraphError)\n"
        "sys.exit('torch' in sys.modules)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_pyproject_declares_what_attrgraph_provides():
    """The entry points resolve: attrgraph's model loader, and its task corpus as word tuples."""
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]

    def resolve(ref: str):
        module, _, attr = ref.partition(":")
        return getattr(importlib.import_module(module), attr)

    (loader,) = [resolve(r) for r in eps[providers.MODELS_GROUP].values()]
    from attrgraph.bundled.loading import load_model

    assert loader is load_model
    corpus = resolve(eps[providers.CORPORA_GROUP]["bundled"])
    first = next(iter(corpus(0)))
    assert isinstance(first, tuple) and all(isinstance(w, str) for w in first)
    assert next(iter(corpus(0))) == first  # the seed fixes it


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setattr(providers, "_model_loaders", [])
    monkeypatch.setattr(providers, "_corpora", {})
    return providers


def test_registered_providers_come_first(registry):
    calls = []
    registry.register_model_loader(lambda name, device="cpu": calls.append((name, device)) or "model")
    assert load_any_model("anything", "cpu") == "model" and calls == [("anything", "cpu")]
    registry.register_corpus("tiny", lambda seed: iter([("a", "b"), (str(seed),)]))
    assert list(corpus_items("tiny", 3)) == [("a", "b"), ("3",)]
    assert "tiny" in registry.corpus_names()


def test_without_a_provider_an_unknown_model_is_one_sentence(registry, monkeypatch):
    from transcoders import ConfigError

    monkeypatch.setattr(providers, "entry_points", lambda group: [])  # as before attrgraph is installed
    with pytest.raises(ConfigError, match="no installed package provides models") as e:
        load_any_model("default")
    assert "\n" not in str(e.value)


def test_an_unknown_corpus_is_one_sentence(registry, tmp_path):
    from transcoders import ConfigError

    with pytest.raises(ConfigError, match="is no file and no installed package provides it"):
        corpus_items(str(tmp_path / "missing.txt"), 0)
    text = tmp_path / "c.txt"
    text.write_text("one two\n\nthree\n")
    assert list(corpus_items(str(text), 0)) == ["one two", "three"]
