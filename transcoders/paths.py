"""Where the bundled artefacts live (no attrgraph import).

The repository holds them once, in `data/` at its root. A wheel (`pip install .`, `python -m
build`) carries that folder as package data, at `attrgraph/_data/` beside this package (see
setup.py). `data_dir()` takes the installed copy where there is one, else the checkout's
`data/`: an editable install and a plain checkout both read `data/` in place. Paths rather
than `importlib.resources` traversables: safetensors and tokenizers open real files, and pip
installs a wheel unpacked.
"""

from pathlib import Path

# site-packages in an installed copy, the repository root in a checkout or an editable install
_ROOT = Path(__file__).resolve().parent.parent


def data_dir(root: Path = _ROOT) -> Path:
    """The folder holding default and the bundled sets (default-plt, ...), for the packages installed under `root`."""
    installed = root / "attrgraph" / "_data"
    return installed if installed.is_dir() else root / "data"


DATA_DIR = data_dir()
BUNDLED = {
    "default-plt": DATA_DIR / "default-plt",
    "default-clt": DATA_DIR / "default-clt",
    "default-attn-sae": DATA_DIR / "default-attn-sae",
}
