"""Every notebook, re-executed, prints what is committed: a change to the library that moves a
number fails here until the notebook is re-run (`python notebooks/execute.py NAME`) and its prose
re-read.

Each notebook runs as `notebooks/execute.py` runs it (fresh kernel, notebooks/ as working directory,
one thread, offline). Compared, cell by cell: stdout, results and the text form of displayed
objects (a figure's `<Figure size ... with N Axes>`), with times (`0.07s`, `1.2 ms`, `3 seconds`),
memory addresses and temporary paths masked. Not compared: stderr (progress bars, warnings) and
image bytes. A cell that raises fails the test with its error.
"""

import difflib
import importlib.util
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MASKS = (
    (re.compile(r"\b\d+(\.\d+)?\s?(s|ms|seconds)\b"), "<time>"),
    (re.compile(r"0x[0-9a-f]{6,}"), "0x<address>"),
    (re.compile(r"/(tmp|var/folders)/[^\s'\"]*"), "<temp path>"),
)


def _execute_module():
    spec = importlib.util.spec_from_file_location("notebook_execute", ROOT / "notebooks" / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _masked(text: str) -> str:
    for pattern, mask in MASKS:
        text = pattern.sub(mask, text)
    return text


def text_outputs(nb) -> list[str]:
    """One line per output line, prefixed with its cell's number among the code cells."""
    lines = []
    code = [c for c in nb.cells if c.cell_type == "code"]
    for i, cell in enumerate(code):
        texts, stdout = [], []  # a kernel may send one printed line in several stream pieces: join them
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                stdout.append(out.text if out.name == "stdout" else "")
                continue
            texts.append("".join(stdout))
            stdout = []
            if out.output_type in ("execute_result", "display_data"):
                texts.append(out.get("data", {}).get("text/plain", ""))
            else:  # an error committed, or raised in the run
                texts.append(f"{out.get('ename')}: {out.get('evalue')}")
        texts.append("".join(stdout))
        lines += [f"[{i}] {line}" for text in texts for line in _masked(text).splitlines()]
    return lines


def test_a_line_printed_in_pieces_reads_as_one_line():
    """nbclient keeps the stream messages a kernel sends; one `print` may arrive in several."""
    whole = nbformat.v4.new_code_cell(
        outputs=[nbformat.v4.new_output("stream", name="stdout", text="a b\nc\n")]
    )
    pieces = [nbformat.v4.new_output("stream", name="stdout", text=t) for t in ("a ", "b\n", "c\n")]
    split = nbformat.v4.new_code_cell(outputs=pieces)
    assert text_outputs(nbformat.v4.new_notebook(cells=[split])) == ["[0] a b", "[0] c"]
    assert text_outputs(nbformat.v4.new_notebook(cells=[whole])) == ["[0] a b", "[0] c"]


def test_masks_hide_only_what_changes_between_runs():
    assert _masked("wall 0.07s, 12 ms, 3 seconds at 0x7f3a2b1c9d40 in /tmp/pytest-1/x.h5") == (
        "wall <time>, <time>, <time> at 0x<address> in <temp path>"
    )
    assert (
        _masked("L3/F310 influence 0.0712, 140 nodes, 2620 edges")
        == "L3/F310 influence 0.0712, 140 nodes, 2620 edges"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_prints_what_is_committed(path):
    committed = nbformat.read(path, as_version=4)
    fresh = _execute_module().run(nbformat.read(path, as_version=4))
    old, new = text_outputs(committed), text_outputs(fresh)
    if old != new:
        diff = "\n".join(difflib.unified_diff(old, new, "committed", "re-executed", lineterm="", n=1))
        pytest.fail(
            f"{path.name}'s outputs are stale: re-run `python notebooks/execute.py {path.stem}`, re-read "
            f"the prose around what moved, and commit it.\n{diff[:6000]}"
        )
