"""HDF5 storage: round trip, many graphs per file, atomic writes, clear errors on bad files."""

import h5py
import numpy as np
import pytest

from attrgraph.errors import GraphError, GraphFileError, SchemaVersionError
from attrgraph.graph.store import list_graphs, load_graph, save_graph


def assert_same(a, b):
    for f in ("kind", "layer", "position", "feature", "activation", "token", "influence"):
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
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many.h5"]  # no temp files left


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
