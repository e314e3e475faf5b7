"""transcoders/arguments.py on hand-built values: what a message quotes, what counts as a path and a
number in range."""

import math
from pathlib import Path

import numpy as np
import pytest

from transcoders.arguments import as_path, check_real, is_numbers, shown


class Many:
    def __repr__(self):
        return "Many(\n  a=1,\n)"


def test_shown_is_one_line_of_at_most_the_limit():
    assert shown(3) == "3" and shown("x") == "'x'" and shown(None) == "None"
    assert shown(Many()) == "Many(..."  # the first line, marked as cut
    assert shown("y" * 100) == "'" + "y" * 56 + "..." and len(shown("y" * 100)) == 60
    assert shown("a\nb") == "'a\\nb'"  # repr escapes a newline inside a string


def test_as_path_takes_str_and_pathlike_only():
    assert as_path("a/b.h5", "path", ValueError) == Path("a/b.h5")
    assert as_path(Path("c"), "path", ValueError) == Path("c")
    for bad, says in [
        (None, "path is a NoneType (None)"),
        (3, "path is a int (3)"),
        (b"x", "path is a bytes (b'x')"),
    ]:
        with pytest.raises(
            ValueError, match=r"^" + says.replace("(", r"\(").replace(")", r"\)") + "; pass a file path"
        ):
            as_path(bad, "path", ValueError)


def test_check_real_refuses_what_is_no_number_in_range():
    assert (
        check_real(np.float32(0.5), "t", ValueError, 0, 1) == 0.5
        and check_real(1, "t", ValueError, 0, 1) == 1.0
    )
    for bad in (True, "0.5", None, math.nan, 1.5, -0.1, [0.5]):
        with pytest.raises(ValueError, match=r"^t is .*; pass a number in \[0, 1\]\.$"):
            check_real(bad, "t", ValueError, 0, 1)
    with pytest.raises(ValueError, match=r"^t is nan; pass a number\.$"):
        check_real(math.nan, "t", ValueError)
    with pytest.raises(ValueError, match=r"pass a number in \[0, inf\)\.$"):
        check_real(-1, "t", ValueError, 0)


def test_is_numbers():
    assert is_numbers([1, 2.5]) and is_numbers(np.zeros(3, np.int32)) and is_numbers(3)
    assert not any(is_numbers(v) for v in ("x", [None], [[1], [1, 2]], {}, object(), [True]))
