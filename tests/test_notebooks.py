"""Every notebook, re-executed, prints what is committed: a change to the library that moves a
number fails here until the notebook is re-run (`python notebooks/execute.py NAME`) and its prose
re-read.

Each notebook runs as `notebooks/execute.py` runs it (fresh kernel, notebooks/ as working directory,
one thread, offline). The quickstart runs by default, the others with the slow tests (`pytest -m slow`,
which `.ci/run` runs too). Compared, cell by cell: stdout, results and the text form of displayed
objects (a figure's `<Figure size ... with N Axes>`), with times (`0.07s`, `1.2 ms`, `3 seconds`),
memory addresses and temporary paths masked. Not compared: stderr (progress bars, warnings) and
image bytes. A cell that raises fails the test with its error.

Numbers with a decimal point or an exponent compare within float noise (`same_line`): the same
notebook on a 2-core AMD EPYC with AVX2 and on the machine that committed it printed 27.985451 and
27.985458, a relative error of 3.8e-08 and 1.7e-07, KL 1.0e-09 and -4.4e-09 (the BLAS kernels sum in
another order). The text around them, and every integer (counts, ids, layers), must match exactly.
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


NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
REL_TOL, ABS_TOL = 1e-5, 1e-6
"""Float noise allowed between two printed decimals, beyond one unit of their last printed digit
(the two may round to either side of it): float32 results summed in another order differ by a few
1e-7 of the values they are taken from, and values of that size print as noise (residuals, KL)."""


def _last_digit(number: str) -> float:
    """One unit of the last printed digit: "27.985451" -> 1e-6, "1.0e-09" -> 1e-10, "2e-09" -> 1e-9."""
    mantissa, _, exponent = number.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def same_line(old: str, new: str) -> bool:
    """Equal text around the numbers, equal integers, and decimals equal within float noise."""
    if old == new:
        return True
    if NUMBER.split(old) != NUMBER.split(new):
        return False
    for a, b in zip(NUMBER.findall(old), NUMBER.findall(new), strict=True):
        if a == b:
            continue
        if not any(c in x for x in (a, b) for c in ".eE"):  # integers: counts, ids, layers
            return False
        x, y = float(a), float(b)
        noise = max(REL_TOL * max(abs(x), abs(y)), ABS_TOL) + max(_last_digit(a), _last_digit(b))
        if abs(x - y) > noise:
            return False
    return True


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


@pytest.mark.parametrize(
    "old, new",
    [  # printed by the same notebook on two machines (the module docstring)
        (
            "tau = -inf: leaves 27.985451 + bias -20.325972 = 7.659479, relative error 1.7e-07",
            "tau = -inf: leaves 27.985458 + bias -20.325976 = 7.659482, relative error 3.8e-08",
        ),
        (
            "residual -0.6565 with measured biases, +1.1e-14 inferred",
            "residual -0.6565 with measured biases, -7.1e-15 inferred",
        ),
        (
            "F_S 1.0000, F_H 1.00, KL 1.0e-09 (M model 14.12)",
            "F_S 1.0000, F_H 1.00, KL -4.4e-09 (M model 14.12)",
        ),
        (
            "Theorem 3.1 to float precision (relative error 2e-09): the",
            "Theorem 3.1 to float precision (relative error 5e-08): the",
        ),
        ("M corrupt 0.46", "M corrupt 0.47"),  # rounded to either side of 0.465
    ],
)
def test_float_noise_is_the_same_line(old, new):
    assert same_line(old, new)


@pytest.mark.parametrize(
    "old, new",
    [
        ("root value (logit difference) 7.6595", "root value (logit difference) 7.6612"),
        ("kept 128 features, detached 1345", "kept 129 features, detached 1345"),  # integers exactly
        ("L3/F310 influence 0.0712", "L3/F311 influence 0.0712"),
        ("relative error 1.7e-07", "relative error 3.1e-05"),
        ("features kept: model-based 128", "features kept: graph-based 128"),
        ("KL 1.0e-09", "KL 1.0e-09 (M model 14.12)"),
    ],
)
def test_a_moved_number_or_word_is_another_line(old, new):
    assert not same_line(old, new)


# the quickstart in the default run; the others (16-51 s each, 130 s in all) with the slow tests
@pytest.mark.parametrize(
    "path",
    [p if p.stem == "quickstart" else pytest.param(p, marks=pytest.mark.slow) for p in NOTEBOOKS],
    ids=lambda p: p.stem,
)
def test_notebook_prints_what_is_committed(path):
    committed = nbformat.read(path, as_version=4)
    fresh = _execute_module().run(nbformat.read(path, as_version=4))
    old, new = text_outputs(committed), text_outputs(fresh)
    if len(old) != len(new) or not all(same_line(a, b) for a, b in zip(old, new)):
        diff = "\n".join(difflib.unified_diff(old, new, "committed", "re-executed", lineterm="", n=1))
        pytest.fail(
            f"{path.name}'s outputs are stale: re-run `python notebooks/execute.py {path.stem}`, re-read "
            f"the prose around what moved, and commit it.\n{diff[:6000]}"
        )
