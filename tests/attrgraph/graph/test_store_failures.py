"""Bad input round 2 for the store (../shared/BAD_INPUTS.md): a disk that fills during a save, and
an output that cannot be written. Each must be one `GraphFileError` line, with the old file intact
and no temporary or lock file left; never a crash of the interpreter (h5py's close after a failed
write segfaulted). Writes that could crash run in a subprocess, so a crash fails the test instead
of killing pytest.

Two real ways to fill a disk: `RLIMIT_FSIZE` (any user; writes past it fail with EFBIG once SIGXFSZ
is ignored) and, where this process may mount (root), a real tmpfs of a few MB (ENOSPC)."""

import os
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

from attrgraph.errors import GraphFileError
from attrgraph.graph import store
from attrgraph.graph.store import list_graphs, save_graph
from tests.attrgraph.ag_helpers import large_graph, random_graph

ROOT = Path(__file__).resolve().parents[3]
SAVE = """
import resource, signal, sys
from attrgraph.errors import GraphFileError
from attrgraph.graph.store import save_graph
from tests.attrgraph.ag_helpers import large_graph, random_graph
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the process at the limit
if int(sys.argv[2]):
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
try:
    graph = large_graph(n_feat=2000) if sys.argv[3] == "large" else random_graph(1)
    save_graph(graph, sys.argv[1], name="big")
except GraphFileError as e:
    print(f"GraphFileError: {e}", file=sys.stderr)
    sys.exit(2)
"""


def save_in_subprocess(path: Path, fsize_limit: int = 0, graph: str = "large") -> subprocess.CompletedProcess:
    """Save a graph ("large": ~8 MB; "small": ~50 kB) into `path` in a subprocess."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-c", SAVE, str(path), str(fsize_limit), graph]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


def assert_one_error_and_old_file_intact(res, path: Path, before: bytes, words: str):
    assert res.returncode == 2, (res.returncode, res.stderr[-3000:])  # a segfault is -11
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("GraphFileError: cannot write") and words in lines[0], (
        lines
    )
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir() if p.name != "filler") == [path.name]


def test_a_file_size_limit_during_a_save_is_one_error_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "g.h5"
    save_graph(random_graph(0), path, name="small")
    before = path.read_bytes()
    res = save_in_subprocess(path, fsize_limit=len(before) + 200_000)  # the new graph needs ~8 MB
    assert_one_error_and_old_file_intact(res, path, before, "size limit")
    assert list_graphs(path) == ["small"]


def test_a_full_disk_during_a_save_is_one_error_and_keeps_the_old_file(small_tmpfs):
    path = small_tmpfs / "g.h5"
    save_graph(random_graph(0), path, name="small")
    before = path.read_bytes()
    res = save_in_subprocess(path)  # ~8 MB into 3 MB
    assert_one_error_and_old_file_intact(res, path, before, "no space left")
    # the disk is not left full: the same save of a graph that fits works at once
    save_graph(random_graph(1), path, name="next")
    assert list_graphs(path) == ["next", "small"]


def test_a_nearly_full_disk_refuses_even_a_small_save(small_tmpfs):
    path = small_tmpfs / "g.h5"
    save_graph(random_graph(0), path, name="small")
    before = path.read_bytes()
    free = os.statvfs(small_tmpfs).f_bavail * os.statvfs(small_tmpfs).f_frsize
    (small_tmpfs / "filler").write_bytes(b"\0" * (free - 16_384))
    res = save_in_subprocess(path, graph="small")
    assert_one_error_and_old_file_intact(res, path, before, "no space left")


@pytest.mark.parametrize("graph", [random_graph(0), random_graph(3, n_feat=200), large_graph(n_feat=900)])
def test_the_space_reserved_for_a_save_bounds_what_it_writes(tmp_path, graph):
    """What a save adds to a file (measured) never passes the bytes reserved for it beforehand."""
    path = tmp_path / "g.h5"
    save_graph(random_graph(5), path, name="first")
    size = path.stat().st_size
    save_graph(graph, path, name="second")
    added = path.stat().st_size - size
    assert 0 < added <= store._size_bound(graph)
    with h5py.File(path) as f:  # HDF5 truncated the reservation: the file ends at its end of data
        assert path.stat().st_size == int.from_bytes(path.read_bytes()[28:36], "little")  # superblock v3 EOF
        assert list(f["graphs"]) == ["first", "second"]


# ------------------------------------------------------------------ outputs that cannot be written
def test_a_read_only_folder_is_one_error_before_writing(read_only_dir):
    for call in (lambda p: store.check_output(p), lambda p: save_graph(random_graph(0), p)):
        with pytest.raises(
            GraphFileError, match=r"cannot write in .*; pass an output in a folder you can write"
        ):
            call(read_only_dir / "g.h5")
        with pytest.raises(GraphFileError, match="cannot write in"):
            call(read_only_dir / "new" / "g.h5")
    assert list(read_only_dir.iterdir()) == []


def test_outputs_that_are_no_graph_files_are_refused_in_words_for_writing(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(GraphFileError, match=r"is a folder; pass a file name to write"):
        store.check_output(tmp_path)
    with pytest.raises(GraphFileError, match=r"exists and is not an HDF5 file, so no graph can be added"):
        store.check_output(tmp_path / "notes.txt")
    with pytest.raises(GraphFileError, match=r"is a file, so .* cannot be created"):
        store.check_output(tmp_path / "notes.txt" / "g.h5")
    store.check_output(tmp_path / "new" / "deeper" / "g.h5")  # missing folders are created by the save
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


# ------------------------------------------------------------------ outputs that are symbolic links
def test_a_save_through_a_symbolic_link_writes_the_file_it_points_to(tmp_path):
    """The link stays a link (to the same name) and its target gets the new graph beside its old
    ones; the temporary and the lock live beside the target, and nothing is left after."""
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "g.h5"
    save_graph(random_graph(0), target, name="old")
    link = tmp_path / "link.h5"
    link.symlink_to(Path("real") / "g.h5")
    save_graph(random_graph(1), link, name="new")
    assert link.is_symlink() and os.readlink(link) == str(Path("real") / "g.h5")
    assert list_graphs(target) == ["new", "old"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.h5", "real"]
    assert [p.name for p in target.parent.iterdir()] == ["g.h5"]
    chained = tmp_path / "chained.h5"  # a link to a link
    chained.symlink_to(link)
    save_graph(random_graph(2), chained, name="third")
    assert chained.is_symlink() and link.is_symlink() and list_graphs(target) == ["new", "old", "third"]


def test_a_dangling_symbolic_link_creates_the_file_it_names(tmp_path):
    link = tmp_path / "link.h5"
    link.symlink_to(tmp_path / "new" / "g.h5")
    save_graph(random_graph(0), link, name="first")
    assert link.is_symlink() and list_graphs(tmp_path / "new" / "g.h5") == ["first"]
