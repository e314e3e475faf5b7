"""Models and corpora that other packages provide for training; transcoders imports none of them.

1. A package offers a model loader under the entry-point group `transcoders.models`: a callable
   `(name, device=...) -> HookedTransformer` that loads any name it is given (attrgraph's
   `load_model`: its bundled model "default", a model folder, or a TransformerLens name), and named
   corpora under `transcoders.corpora`: `(seed) -> iterable of texts, token-id lists or word tuples`
   (attrgraph's "bundled", its task corpus). attrgraph declares both in pyproject.toml, so they are
   found once it is installed (an editable install too; reinstall one made before they existed).
2. `register_model_loader(fn)` and `register_corpus(name, fn)` add providers at run time (a package
   used without being installed, tests); they come before the entry points.
3. `load_model(name, device)`: the first loader (registered ones, latest first, then the entry
   points by name), else TransformerLens's `HookedTransformer.from_pretrained_no_processing(name)` (a name it
   cannot load: `ConfigError`, saying where the bundled model comes from).
4. `corpus(name, seed)`: the items of the corpus of that name, or None when none is provided.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from importlib.metadata import entry_points

from transcoders.errors import ConfigError

MODELS_GROUP = "transcoders.models"
CORPORA_GROUP = "transcoders.corpora"

_model_loaders: list[Callable] = []
_corpora: dict[str, Callable[[int], Iterable]] = {}


def register_model_loader(loader: Callable) -> None:
    """Step 2: `loader(name, device=...)` loads models from now on, before any entry point's."""
    _model_loaders.insert(0, loader)


def register_corpus(name: str, items: Callable[[int], Iterable]) -> None:
    """Step 2: `items(seed)` is the corpus `name` from now on."""
    _corpora[name] = items


def model_loaders() -> list[Callable]:
    """Step 3's order: registered loaders, latest first, then the entry points' by name."""
    found = sorted(entry_points(group=MODELS_GROUP), key=lambda e: e.name)
    return _model_loaders + [e.load() for e in found]


def corpus_names() -> list[str]:
    """Every corpus provided, registered or by an entry point."""
    return sorted(set(_corpora) | {e.name for e in entry_points(group=CORPORA_GROUP)})


def load_model(name: str, device: str = "cpu"):
    """Step 3: `name` loaded by the first provided loader, else by TransformerLens."""
    loaders = model_loaders()
    if loaders:
        return loaders[0](name, device=device)
    from transformer_lens import HookedTransformer

    try:
        # unprocessed, as attrgraph's loader and circuit-tracer load it (sites.py step 4)
        return HookedTransformer.from_pretrained_no_processing(name, device=device).eval()
    except (ValueError, OSError) as e:  # an unknown name; offline without it in the cache
        raise ConfigError(
            f"no installed package provides models (entry points {MODELS_GROUP!r}) and TransformerLens "
            f"cannot load {name!r} ({type(e).__name__}); (re)install attrgraph (pip install -e .) for its "
            "bundled model, or pass a TransformerLens model name."
        ) from e


def corpus(name: str, seed: int) -> Iterable | None:
    """Step 4: the items of corpus `name` for `seed`, or None when no package provides it."""
    if name in _corpora:
        return _corpora[name](seed)
    for e in entry_points(group=CORPORA_GROUP):
        if e.name == name:
            return e.load()(seed)
    return None
