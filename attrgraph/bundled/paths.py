"""Where the bundled artefacts live: `data/` at the repository root."""

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
BUNDLED = {
    "default": DATA_DIR / "default",
    "default-plt": DATA_DIR / "default-plt",
    "default-clt": DATA_DIR / "default-clt",
}
