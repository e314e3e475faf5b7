"""HDF5 storage: round trip, many graphs per file, atomic writes, clear errors on bad and damaged
files, older schema versions, temporaries of dead writers."""

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import h5py
import numpy as np
import pytest

from attrgraph.errors import GraphError, GraphFileError, SchemaVersionError
from attrgraph.graph.store import list_graphs, load_graph, remove_stale_temporaries, save_graph
from tests.attrgraph.ag_helpers import large_graph


def assert_same(a, b):
    for f in ("kind", "layer", "position", "feature", "activation", "token", "influence", "site"):
        np.testing.assert_array_equal(getattr(a.nodes, f), getattr(b.nodes, f))
    assert (a.adjacency != b.adjacency).nnz == 0
    assert a.adjacency.dtype == b.adjacency.dtype
    np.testing.assert_array_equal(a.prompt_ids, b.prompt_ids)
    assert a.prompt_tokens == b.prompt_tokens and a.logit_strings == b.logit_strings
    np.testing.assert_array_equal(a.logit_tokens, b.logit_tokens)
    np.testing.assert_array_equal(a.logit_probs, b.logit_probs)
    assert a.meta == b.meta


def test_round_trip(tmp_path, make_random_graph):
    g = make_random_graph(0, n_feat=200)
    g.nodes.influence = np.linspace(0, 1, g.n_nodes).astype(np.float32)
    path = tmp_path / "g.h5"
    assert save_graph(g, path) == "graph"
    assert_same(g, load_graph(path))


def test_many_graphs_per_file_and_replace(tmp_path, make_random_graph):
    path = tmp_path / "many.h5"
    g1, g2 = make_random_graph(1), make_random_graph(2, n_feat=7)
    save_graph(g1, path, name="one")
    save_graph(g2, path, name="two")
    assert list_graphs(path) == ["one", "two"]
    assert_same(g2, load_graph(path, "two"))
    with pytest.raises(GraphFileError, match="pass name="):
        load_graph(path)
    with pytest.raises(GraphFileError, match="no graph named"):
        load_graph(path, "three")
    save_graph(g1, path, name="two")
    assert_same(g1, load_graph(path, "two"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many.h5"]  # no temporaries, no lock file left


def test_other_schema_version_is_refused(tmp_path, make_random_graph):
    path = tmp_path / "g.h5"
    save_graph(make_random_graph(0), path)
    with h5py.File(path, "a") as f:
        f["graphs/graph"].attrs["schema_version"] = 99
    with pytest.raises(SchemaVersionError, match="version 99"):
        load_graph(path)


def test_non_hdf5_and_truncated_files(tmp_path, make_random_graph):
    bad = tmp_path / "notes.h5"
    bad.write_text("not a graph")
    with pytest.raises(GraphFileError, match="not an HDF5 file"):
        load_graph(bad)
    with pytest.raises(GraphFileError, match="does not exist"):
        load_graph(tmp_path / "missing.h5")
    path = tmp_path / "g.h5"
    save_graph(make_random_graph(0, n_feat=300), path)
    data = path.read_bytes()
    cut = tmp_path / "cut.h5"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(GraphFileError):
        load_graph(cut)


def test_failed_save_leaves_target_untouched(tmp_path, make_random_graph):
    bad = tmp_path / "notes.h5"
    bad.write_text("keep me")
    with pytest.raises(GraphFileError, match="not an HDF5 file"):
        save_graph(make_random_graph(0), bad)
    assert bad.read_text() == "keep me"
    g = make_random_graph(0)
    g.logit_probs = g.logit_probs[:1]  # inconsistent: refused before anything is written
    path = tmp_path / "g.h5"
    with pytest.raises(GraphError):
        save_graph(g, path)
    assert list(tmp_path.iterdir()) == [bad]


def test_corrupt_adjacency_is_explained(tmp_path, make_random_graph):
    path = tmp_path / "g.h5"
    save_graph(make_random_graph(0), path)
    with h5py.File(path, "a") as f:
        del f["graphs/graph/adjacency/indptr"]
        f["graphs/graph/adjacency/indptr"] = np.arange(5)
    with pytest.raises(GraphFileError, match="does not fit"):
        load_graph(path)


def test_saved_file_gets_the_permissions_of_a_plain_open(tmp_path, make_random_graph):
    import os
    import stat

    path = tmp_path / "g.h5"
    save_graph(make_random_graph(0), path)
    with open(tmp_path / "plain", "w"):
        pass
    mode = stat.S_IMODE(os.stat(path).st_mode)
    assert mode == stat.S_IMODE(os.stat(tmp_path / "plain").st_mode)
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


# ------------------------------------------------------------------ damaged files
def test_every_dataset_is_checksummed_in_a_checksummed_file_format(tmp_path, make_random_graph):
    """Step 2 of the store: fletcher32 on every dataset, the HDF5 1.10 format (checksummed
    metadata), and no variable-length strings (whose bytes HDF5 does not checksum)."""
    path = tmp_path / "g.h5"
    save_graph(make_random_graph(0, n_feat=60), path)
    objects = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: objects.append(obj))
        datasets = [o for o in objects if isinstance(o, h5py.Dataset)]
        assert len(datasets) == 13 and all(d.fletcher32 for d in datasets)
        strings = [h5py.check_string_dtype(d.dtype) for d in datasets]
        strings += [h5py.check_string_dtype(o.attrs.get_id(k).dtype) for o in objects for k in o.attrs]
        assert [s for s in strings if s is not None and s.length is None] == []
    assert path.read_bytes()[8] == 3  # superblock version 3: the 1.10 format, checksummed


def test_byte_flips_load_the_same_graph_or_raise_graph_file_error(tmp_path, make_random_graph):
    """Flip every 29th byte of a small graph file (about 500 flips), each loaded in a worker
    process (benchmarks/byte_flips.py): no flip may load different data, raise another exception,
    crash the interpreter or hang."""
    from benchmarks.byte_flips import fuzz

    path = tmp_path / "g.h5"
    g = make_random_graph(0, n_feat=60)
    g.meta["note"] = "naïve ✓"
    save_graph(g, path)
    # timeout: a guard against hangs only (a load takes milliseconds, on a busy machine seconds)
    results = fuzz(path, list(range(0, path.stat().st_size, 29)), timeout=120)
    outcomes = {r["outcome"] for r in results}
    bad = [r for r in results if r["outcome"] not in ("same", "ours")]
    assert not bad, bad[:5]
    assert outcomes == {"same", "ours"} and len(results) > 450
    ours = [r["detail"] for r in results if r["outcome"] == "ours"]
    assert all("\n" not in d and d.startswith("GraphFileError: ") for d in ours)


def write_v1(graph, path):
    """A file in the layout of schema version 1 (variable-length strings, meta as a string
    attribute, no checksums), as attrgraph 0.1.0 wrote it."""
    s = h5py.string_dtype("utf-8")
    with h5py.File(path, "w") as f:
        g = f.create_group("graphs/graph")
        g.attrs["schema_version"] = 1
        g.attrs["meta"] = json.dumps(graph.meta)
        for name in ("kind", "layer", "position", "feature", "activation", "token", "influence"):
            values = getattr(graph.nodes, name)
            g.create_dataset(
                f"nodes/{name}",
                data=values.astype(object) if name == "kind" else values,
                dtype=s if name == "kind" else None,
            )
        adj = graph.adjacency
        g.create_group("adjacency").attrs["shape"] = np.asarray(adj.shape, np.int64)
        for name in ("data", "indices", "indptr"):
            g.create_dataset(f"adjacency/{name}", data=getattr(adj, name))
        g["prompt_ids"] = graph.prompt_ids
        g["logit_tokens"] = graph.logit_tokens
        g["logit_probs"] = graph.logit_probs
        g.create_dataset("prompt_tokens", data=np.array(graph.prompt_tokens, dtype=object), dtype=s)
        g.create_dataset("logit_strings", data=np.array(graph.logit_strings, dtype=object), dtype=s)


def test_schema_version_1_files_are_still_read(tmp_path, make_random_graph):
    g = make_random_graph(3, n_feat=40)
    g.nodes.influence = np.linspace(0, 1, g.n_nodes).astype(np.float32)
    write_v1(g, tmp_path / "v1.h5")
    assert_same(g, load_graph(tmp_path / "v1.h5"))
    save_graph(make_random_graph(4), tmp_path / "v1.h5", name="new")  # a version 2 graph beside it
    assert_same(g, load_graph(tmp_path / "v1.h5", "graph"))
    assert_same(make_random_graph(4), load_graph(tmp_path / "v1.h5", "new"))


def test_damaged_json_attribute_is_our_error(tmp_path, make_random_graph):
    path = tmp_path / "g.h5"
    save_graph(make_random_graph(0), path)
    for key, value in (
        ("meta", b"{not json"),
        ("prompt_tokens", b'["x", "y"]'),
        ("logit_strings", b"[1, 2, 3]"),
        ("meta", b"[1, 2]"),
    ):
        with h5py.File(path, "a") as f:
            f["graphs/graph"].attrs.create(key, value, dtype=h5py.string_dtype("utf-8", len(value)))
        with pytest.raises(GraphFileError, match=key):
            load_graph(path)
        save_graph(make_random_graph(0), path)


# ------------------------------------------------------------------ temporaries of dead writers
ROOT = Path(__file__).resolve().parents[3]
HOLD = "import sys, time\nfrom attrgraph.graph.store import edit_h5\nwith edit_h5(sys.argv[1]):\n    print('inside', flush=True)\n    time.sleep(600)\n"


def test_a_killed_writers_temporary_is_removed_by_the_next_save(tmp_path, make_random_graph):
    path = tmp_path / "g.h5"
    save_graph(make_random_graph(0), path, name="one")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    writer = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, env=env)
    try:
        assert writer.stdout.readline().strip() == b"inside"
        (temp,) = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        assert temp.name.startswith(f".g.h5.{writer.pid}@")
        assert remove_stale_temporaries(path) == [] and temp.exists()  # its writer still runs
    finally:
        writer.kill()  # SIGKILL: kill -9
        writer.wait()
    assert temp.exists()  # nothing removes it ...
    save_graph(make_random_graph(2), path, name="two")
    assert not temp.exists()  # ... until the next save
    assert list_graphs(path) == ["one", "two"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.h5"]


WRITE = (
    "import sys\nfrom tests.attrgraph.ag_helpers import random_graph\n"
    "from attrgraph.graph.store import save_graph\nfor i in range(10):\n"
    "    save_graph(random_graph(i, n_feat=100), sys.argv[1], name=f'{sys.argv[2]}{i}')\n"
)


def test_writers_of_one_file_at_the_same_time_take_turns(tmp_path):
    """Three processes each adding 10 graphs to one file at once: all 30 are there (without the
    lock, a writer's copy of the file could miss another's graph and drop it on rename)."""
    path = tmp_path / "g.h5"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", WRITE, str(path), tag], env=env) for tag in "abc"]
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0]
    assert list_graphs(path) == sorted(f"{t}{i}" for t in "abc" for i in range(10))


def test_only_temporaries_of_dead_writers_on_this_host_are_removed(tmp_path, make_random_graph):
    from transcoders.h5file import host_tag as _host

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = os.getppid()
    names = {
        f".g.h5.{dead.pid}@{_host()}.abc123xy.tmp": False,  # removed
        f".g.h5.{live}@{_host()}.abc123xy.tmp": True,  # its writer runs
        f".g.h5.{dead.pid}@other-host.abc123xy.tmp": True,  # cannot be checked from here
        ".g.h5.q8z0abcd.tmp": True,  # an older name without a PID
        f".other.h5.{dead.pid}@{_host()}.abc123xy.tmp": True,  # another file's
    }
    for name in names:
        (tmp_path / name).write_bytes(b"half a graph")
    save_graph(make_random_graph(0), tmp_path / "g.h5")
    assert {name: (tmp_path / name).exists() for name in names} == names


def test_attention_nodes_round_trip_and_older_files_read_as_mlp(tmp_path, make_random_graph):
    from tests.attrgraph.ag_helpers import attention_graph

    g = attention_graph()[0]
    assert set(g.nodes.site) == {"", "attn", "mlp"}
    save_graph(g, tmp_path / "a.h5")
    back = load_graph(tmp_path / "a.h5")
    assert_same(g, back)
    with h5py.File(tmp_path / "a.h5") as f:
        assert f["graphs/graph"].attrs["schema_version"] == 3
        assert f["graphs/graph/nodes/site"].dtype.kind == "S"
    # a version 2 file (no site) reads with every feature and error node at site "mlp"
    plain = make_random_graph(5)
    save_graph(plain, tmp_path / "v2.h5")
    with h5py.File(tmp_path / "v2.h5", "a") as f:
        f["graphs/graph"].attrs["schema_version"] = 2
    old = load_graph(tmp_path / "v2.h5")
    assert_same(plain, old)
    assert (old.nodes.site[np.isin(old.nodes.kind, ["feature", "error"])] == "mlp").all()
    with h5py.File(tmp_path / "a.h5") as f:  # graphs without attention nodes need no site
        assert "site" in f["graphs/graph/nodes"]
    save_graph(plain, tmp_path / "v3.h5")
    with h5py.File(tmp_path / "v3.h5") as f:
        assert "site" not in f["graphs/graph/nodes"] and f["graphs/graph"].attrs["schema_version"] == 3
    assert_same(plain, load_graph(tmp_path / "v3.h5"))


def test_edges_are_saved_and_loaded_without_a_full_size_copy(tmp_path):
    """Indices are int32 on disk and in memory; saving casts slice by slice (the int64 copy of the
    indices and scores.py's float64 copy are gone); loading fills the final arrays in place."""
    g = large_graph()
    adj = g.adjacency
    path = tmp_path / "big.h5"
    tracemalloc.start()
    save_graph(g, path)
    saving = tracemalloc.get_traced_memory()[1]
    tracemalloc.reset_peak()
    loaded = load_graph(path)
    loading = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert saving < adj.data.nbytes / 2, saving
    held = adj.data.nbytes + adj.indices.nbytes + 4 * (adj.shape[0] + 1)
    assert loading < 1.2 * held, (loading, held)
    with h5py.File(path) as f:
        assert f["graphs/graph/adjacency/indices"].dtype == np.int32
        assert f["graphs/graph/adjacency/data"].compression is None  # float32 values: 10% for 5x time
    assert loaded.adjacency.indices.dtype == np.int32 and loaded.adjacency.indptr.dtype == np.int32
    assert_same(g, loaded)


def test_int64_indices_still_load_and_bad_ones_are_found(tmp_path, make_random_graph):
    """Files written before indices were int32 load the same; an index out of range is reported
    before the narrowing cast could hide it."""
    g = make_random_graph(5, n_feat=30)
    path = tmp_path / "g.h5"
    save_graph(g, path)
    with h5py.File(path, "a") as f:
        indices = f["graphs/graph/adjacency/indices"][()].astype(np.int64)
        del f["graphs/graph/adjacency/indices"]
        f["graphs/graph/adjacency/indices"] = indices
    assert_same(g, load_graph(path))
    with h5py.File(path, "a") as f:
        f["graphs/graph/adjacency/indices"][3] = 2**32 + 1  # 1 after a cast to int32
    with pytest.raises(GraphFileError, match="outside"):
        load_graph(path)


def test_a_pruned_graph_keeps_its_rule_thresholds_and_unpruned_influence(make_random_graph, tmp_path):
    """What the export needs of a pruned graph survives the file bit for bit; an unpruned graph
    stores no such fields (files keep the layout older readers know) and reads them as NaN."""
    from attrgraph.graph.prune import prune_graph

    g = make_random_graph(5, n_feat=40)
    p = prune_graph(g, 0.7, 0.95)
    path = tmp_path / "g.h5"
    save_graph(p, path, "pruned")
    save_graph(g, path, "full")
    back = load_graph(path, "pruned")
    assert {k: back.meta[k] for k in ("pruned", "node_threshold", "edge_threshold", "prune_rule")} == {
        "pruned": True,
        "node_threshold": 0.7,
        "edge_threshold": 0.95,
        "prune_rule": "circuit-tracer",
    }
    np.testing.assert_array_equal(back.nodes.unpruned_influence, p.nodes.unpruned_influence)
    np.testing.assert_array_equal(back.nodes.unpruned_share, p.nodes.unpruned_share)
    assert not np.isnan(back.nodes.unpruned_share).any()
    with h5py.File(path) as f:
        assert "unpruned_share" in f["graphs/pruned/nodes"] and "unpruned_share" not in f["graphs/full/nodes"]
    assert np.isnan(load_graph(path, "full").nodes.unpruned_share).all()
