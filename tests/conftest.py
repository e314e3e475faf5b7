"""Shared test set-up: offline, seeded, CPU."""

import os
import subprocess

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest_plugins = ["pytester"]
import torch  # noqa: E402

# Tests use tiny matrices, where a second OpenMP thread only adds synchronisation (it was
# 10-20x slower on a loaded 2-core machine); heavier tests may raise it locally.
torch.set_num_threads(1)


# ---------------------------------------------------------------------- devices
# Device-sensitive tests take the `device` fixture: they run on the CPU and, where CUDA is present,
# on the GPU; without CUDA the cuda case is skipped with the reason below (`pytest -rs` lists it).
NO_CUDA = "CUDA is not available on this machine"
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)),
]


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    """The device a test puts its model and transcoders on."""
    return torch.device(request.param)


@pytest.fixture
def foreign_default_device(device):
    """A context in which a tensor made without `device=` lands on a device the model is not on:
    the CPU when the model is on CUDA, the data-less `meta` device when it is on the CPU. Any such
    tensor that meets the model's tensors, or is read (`.item()`, `.numpy()`), then raises, so a
    CPU-only machine catches what would be a host/device mix on a GPU."""
    from contextlib import contextmanager

    @contextmanager
    def foreign():
        torch.set_default_device("meta" if device.type == "cpu" else "cpu")
        try:
            yield
        finally:
            torch.set_default_device(None)

    return foreign


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(0)
    np.random.seed(0)
    yield


# ---------------------------------------------------------------------- the bundled data
# Tests of the shipped model and transcoders carry `@pytest.mark.bundled("default", ...)`. When a
# folder is missing they fail with one line saying where and what to do; they never skip, so a
# broken checkout or wheel cannot pass by running fewer tests.


def bundled_problem(folder) -> str | None:
    """What is wrong with a bundled folder (None when it and every file its manifest lists exist)."""
    import json
    from pathlib import Path

    folder = Path(folder)
    manifest = folder / "manifest.json"
    if not manifest.is_file():
        return f"bundled data missing at {manifest}"
    listed = json.loads(manifest.read_text()).get("files", {})
    absent = [name for name in listed if not (folder / name).is_file() or (folder / name).stat().st_size == 0]
    if absent:
        return f"bundled data missing at {folder / absent[0]}" + (
            f" (and {len(absent) - 1} more)" if absent[1:] else ""
        )
    return None


def require_bundled(names, folders=None) -> None:
    """Fail the running test, never skip it, unless every bundled folder in `names` is complete."""
    from attrgraph.bundled.paths import BUNDLED

    folders = BUNDLED if folders is None else folders
    problems = [p for p in (bundled_problem(folders[n]) for n in names) if p]
    if problems:
        pytest.fail(
            "; ".join(problems) + "; these tests check the shipped data and do not skip: restore the "
            "repository's data/ folder (git checkout -- data/) and run them again.",
            pytrace=False,
        )


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "bundled(*names): needs data/<name> for each name; fails (never skips) when one is missing"
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before any fixture loads the data: check what the test's `bundled` markers name."""
    names = [n for mark in item.iter_markers("bundled") for n in mark.args]
    if names:
        require_bundled(dict.fromkeys(names))


@pytest.fixture
def bundled_check():
    """`require_bundled` itself, for the tests of this check."""
    return require_bundled


# ---------------------------------------------------------------------- folders
def _tmpfs(where, options: str, refused: str):
    """A real tmpfs mounted at `where` with `options` (root only), unmounted after; the test is
    skipped with `refused` and mount's own words where mounting is refused."""
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"{refused}: {res.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "--lazy", str(where)], check=True)  # lazy: even if a file is still open


@pytest.fixture
def read_only_dir(tmp_path):
    """A folder this process cannot create files in: mode 0555, or for root (who ignores modes) a
    read-only tmpfs; skipped where neither is possible."""
    where = tmp_path / "ro"
    where.mkdir()
    if os.geteuid() != 0:
        where.chmod(0o555)
        yield where
        where.chmod(0o755)
        return
    yield from _tmpfs(where, "ro,size=64k", "root ignores file modes and cannot mount a read-only tmpfs here")


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 3 MB tmpfs (root only: mount it, unmount after); skipped where mounting is refused."""
    where = tmp_path / "tmpfs"
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; the RLIMIT_FSIZE test covers a full disk here")
    yield from _tmpfs(where, "size=3m", "cannot mount a tmpfs here")
