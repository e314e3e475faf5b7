"""Where the bundled transcoder sets live: `data/` at the repository root (no attrgraph import)."""

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
BUNDLED = {
    "default-plt": DATA_DIR / "default-plt",
    "default-clt": DATA_DIR / "default-clt",
}
