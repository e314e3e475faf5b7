"""Where the bundled artefacts live: `data/` in a checkout, `attrgraph/_data/` in a wheel.

One lookup for both packages: `transcoders.paths.data_dir()`.
"""

from transcoders.paths import BUNDLED as _TRANSCODER_SETS
from transcoders.paths import DATA_DIR

BUNDLED = {"default": DATA_DIR / "default", **_TRANSCODER_SETS}
