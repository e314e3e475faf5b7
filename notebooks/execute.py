"""Execute the notebooks in place, so that they are committed with their outputs (figures included).

    python notebooks/execute.py                 # every notebooks/*.ipynb
    python notebooks/execute.py quickstart      # the ones whose file name contains an argument

Each notebook runs in a fresh kernel with notebooks/ as its working directory (as
tests/test_notebooks.py runs it in CI, comparing what it prints with what is committed) and the repository root first on PYTHONPATH, one thread, offline. Cell timings are
not recorded, so re-running an unchanged notebook changes only what its code prints. A notebook
that raises stops the script with the cell's error; the file is left as it was.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def run(nb, timeout: int = 600):
    """`nb` (a notebook node) executed in a fresh kernel, as this module's docstring says; returns it."""
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(HERE)}},
        record_timing=False,
    ).execute()
    nb.metadata.pop("widgets", None)
    return nb


def execute(path: Path, timeout: int = 600) -> float:
    """Run `path` and write it back with its outputs; returns the wall time in seconds."""
    t0 = time.perf_counter()
    nb = run(nbformat.read(path, as_version=4), timeout)
    seconds = time.perf_counter() - t0
    nbformat.write(nb, path)
    return seconds


def main(argv: list[str]) -> None:
    paths = sorted(HERE.glob("*.ipynb"))
    if argv:
        paths = [p for p in paths if any(a in p.name for a in argv)]
    for p in paths:
        print(f"{p.name}: {execute(p):.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
