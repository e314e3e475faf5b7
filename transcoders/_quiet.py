"""One warnings filter, installed on import (first thing `transcoders` and `attrgraph` import).

transformer_lens imports `tqdm.auto`, which in a Jupyter kernel without ipywidgets warns "IProgress not
found" and then uses the text bar it would use anyway. The warning says nothing to a user of these
packages, and in a notebook it was the first output. Only that message from tqdm is filtered.
"""

import warnings

warnings.filterwarnings("ignore", message="IProgress not found", module="tqdm")
