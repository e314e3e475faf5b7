"""Bad input round 7 (docs/bad_inputs.md "Round 7"): a dashboards file whose attributes or arrays
break the layout of transcoders/dashboard_file.py's docstring (a damaged copy, another tool's writer).
`load_dashboards` refuses each with one `DashboardFileError` line naming the file and what breaks;
before this round each was a `KeyError` or numpy's `ValueError` / `IndexError` from deep inside the
decoding, or loaded and showed labels of another vocabulary."""

import shutil

import h5py
import numpy as np
import pytest

from transcoders import DashboardFileError, load_dashboards
from transcoders.paths import BUNDLED

pytestmark = pytest.mark.bundled("default-plt")


@pytest.fixture
def copy(tmp_path):
    path = tmp_path / "d.h5"
    shutil.copyfile(BUNDLED["default-plt"] / "dashboards.h5", path)
    return path


def replace(f, name, make):
    value = f[name][()]
    del f[name]
    f[name] = make(value)


def refused(path, pattern):
    with pytest.raises(DashboardFileError, match=pattern) as e:
        load_dashboards(path)
    message = str(e.value)
    assert message.startswith(f"{path} is damaged: ") and "\n" not in message
    assert message.endswith("recompute it with `python -m transcoders.dashboards`.")


def test_the_bundled_files_keep_the_layout():
    for name in ("default-plt", "default-clt", "default-attn-sae"):
        d = load_dashboards(BUNDLED[name] / "dashboards.h5")
        assert d["top/tokens"].shape[:2] == (d.n_layers, d.d_sae)


@pytest.mark.parametrize(
    "edit, pattern",
    [
        (
            lambda f: f.attrs.__delitem__("n_layers"),
            r"its attribute n_layers is None, not a whole number of at least 1",
        ),
        (
            lambda f: f.attrs.__setitem__("d_sae", "x"),
            r"its attribute d_sae is x, not a whole number of at least 1",
        ),
        (
            lambda f: f.attrs.__setitem__("before", -1),
            r"its attribute before is -1, not a whole number of at least 0",
        ),
        (lambda f: f.attrs.__delitem__("n_counted"), r"its attribute n_counted is None"),
        (
            lambda f: f.attrs.__setitem__("before", 100),
            r"its attribute before is 100, but the example windows hold 5 tokens",
        ),
        (
            lambda f: f.attrs.__setitem__("n_layers", 3),
            r"stats/count has shape \(4, 1024\): its axis L is 4, other arrays make it 3",
        ),
    ],
)
def test_attributes_that_break_the_layout(copy, edit, pattern):
    with h5py.File(copy, "r+") as f:
        edit(f)
    refused(copy, pattern)


@pytest.mark.parametrize(
    "name, make, pattern",
    [
        (
            "stats/max",
            lambda a: a[:2],
            r"stats/max has shape \(2, 1024\): its axis L is 2, other arrays make it 4",
        ),
        (
            "top/tokens",
            lambda a: a[:, :10],
            r"top/tokens has shape \(4, 10, 4, 5\): its axis S is 10, other arrays make it 1024",
        ),
        (
            "top/token_acts",
            lambda a: a[..., 0, 0],
            r"top/token_acts has shape \(4, 1024\), not \[L, S, K, W\]",
        ),
        ("stats/count", lambda a: a.astype(np.float32), r"stats/count holds float32 values, not integers"),
        ("vocab", lambda a: np.arange(len(a)), r"vocab holds int64 values, not text"),
        ("vocab", lambda a: a[:10], r"top/tokens holds token ids in \[-1, \d+\], outside its vocab of 10"),
        (
            "logits/top_tokens",
            lambda a: a * 0 + 30000,
            r"logits/top_tokens holds token ids in \[30000, 30000\], outside its vocab of 435",
        ),
        ("stats/max", lambda a: a * np.nan, r"stats/max holds NaN or inf"),
    ],
)
def test_arrays_that_break_the_layout(copy, name, make, pattern):
    with h5py.File(copy, "r+") as f:
        replace(f, name, make)
    refused(copy, pattern)


def test_a_schema_version_that_is_not_a_number(copy):
    with h5py.File(copy, "r+") as f:
        f.attrs["schema_version"] = "x"
    with pytest.raises(
        DashboardFileError, match=r"has dashboards schema version x, this code reads version 2"
    ):
        load_dashboards(copy)
