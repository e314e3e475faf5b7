"""Supernodes stored beside their graph: round trip (non-ASCII names too), fixed-length strings
and checksums on disk, files of the older layout (variable-length strings), and every kind of
bad file as one GraphFileError sentence."""

import shutil

import h5py
import numpy as np
import pytest

from attrgraph.errors import GraphFileError
from attrgraph.graph.store import save_graph
from attrgraph.graph.supernode_store import load_supernodes, save_supernodes
from attrgraph.graph.supernodes import supernode
from tests.attrgraph.graph.test_neuronpedia import layered_graph


@pytest.fixture
def stored(tmp_path):
    g = layered_graph(0)
    feats = np.flatnonzero(g.nodes.kind == "feature")
    path = tmp_path / "g.h5"
    save_graph(g, path, "ioi")
    sns = [supernode(g, "say Mary", feats[:3]), supernode(g, "Ölfeld → ü", feats[3:4])]
    save_supernodes(path, sns, "ioi")
    return path, sns


def test_round_trip_fixed_length_strings_and_checksums(stored):
    path, sns = stored
    assert load_supernodes(path, "ioi") == sns
    with h5py.File(path) as f:
        g = f["supernodes/ioi"]
        for name in ("names", "kind"):
            assert g[name].dtype.kind == "S" and h5py.check_string_dtype(g[name].dtype).encoding == "utf-8"
        assert all(g[k].fletcher32 for k in ("names", "kind", "indptr", "layer", "position", "feature"))


def test_the_older_layout_with_variable_length_strings_reads(stored, tmp_path):
    path, sns = stored
    members = [m for sn in sns for m in sn.members]
    with h5py.File(path, "a") as f:  # what save_supernodes wrote before fixed-length strings
        del f["supernodes/ioi"]
        g = f.create_group("supernodes/ioi")
        g.attrs["schema_version"] = 1
        vlen = h5py.string_dtype("utf-8")
        g.create_dataset("names", data=np.array([s.name for s in sns], dtype=object), dtype=vlen)
        g.create_dataset("indptr", data=np.cumsum([0] + [len(s.members) for s in sns]).astype(np.int64))
        g.create_dataset("kind", data=np.array([m.kind for m in members], dtype=object), dtype=vlen)
        for name in ("layer", "position", "feature"):
            g.create_dataset(name, data=np.array([getattr(m, name) for m in members], np.int64))
    assert load_supernodes(path, "ioi") == sns


def _edit(path, fn):
    with h5py.File(path, "a") as f:
        fn(f["supernodes/ioi"])


def _flip_a_byte(path, dataset):
    with h5py.File(path) as f:
        offset = f[dataset].id.get_chunk_info(0).byte_offset
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.parametrize(
    "case, match",
    [
        ("missing file", "does not exist"),
        ("text file", "is not an HDF5 graph file"),
        ("truncated", "damaged or incomplete|is not an HDF5 graph file"),
        ("missing dataset", r"damaged or incomplete \(KeyError"),
        ("pointers", "do not fit together; the file is corrupt"),
        ("members", "do not fit together; the file is corrupt"),
        ("kind", r"unknown node kinds \['lorsa'\]"),
        ("checksum", "damaged or incomplete"),
        ("not utf-8", "damaged or incomplete"),
        ("version", "schema version 7"),
    ],
)
def test_bad_files_raise_one_sentence(stored, tmp_path, case, match):
    path, _ = stored
    if case == "missing file":
        path = tmp_path / "nothing.h5"
    elif case == "text file":
        path.write_text("supernodes, but as text")
    elif case == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif case == "missing dataset":
        _edit(path, lambda g: g.__delitem__("kind"))
    elif case == "pointers":
        _edit(path, lambda g: g["indptr"].__setitem__(1, 99))
    elif case == "members":

        def shorter(g):
            layer = g["layer"][()][:-1]
            del g["layer"]
            g["layer"] = layer

        _edit(path, shorter)
    elif case == "kind":
        _edit(path, lambda g: g["kind"].__setitem__(0, b"lorsa"))
    elif case == "checksum":
        _flip_a_byte(path, "supernodes/ioi/layer")
    elif case == "not utf-8":
        _edit(path, lambda g: g["names"].__setitem__(0, b"\xff\xfe"))
    else:
        _edit(path, lambda g: g.attrs.__setitem__("schema_version", 7))
    with pytest.raises(GraphFileError, match=match) as e:
        load_supernodes(path, "ioi")
    assert "\n" not in str(e.value)


def test_saving_into_a_bad_file_raises_one_sentence(stored, tmp_path):
    path, sns = stored
    with pytest.raises(GraphFileError, match="does not exist; write the graph with save_graph first"):
        save_supernodes(tmp_path / "nothing.h5", sns, "ioi")
    bad = tmp_path / "text.h5"
    bad.write_text("x")
    with pytest.raises(GraphFileError, match="is not an HDF5 graph file"):
        save_supernodes(bad, sns, "ioi")
    cut = tmp_path / "cut.h5"
    shutil.copyfile(path, cut)
    cut.write_bytes(cut.read_bytes()[:1000])
    with pytest.raises(GraphFileError) as e:
        save_supernodes(cut, sns, "ioi")
    assert "\n" not in str(e.value)


def test_supernodes_mixing_attention_and_mlp_members_keep_every_site(tmp_path):
    """A supernode with an attention and an MLP feature of the same (layer, position, feature)
    beside an MLP-only one: every member comes back with its own site."""
    from attrgraph.graph.supernodes import NodeKey, Supernode

    g = layered_graph(0)
    path = tmp_path / "g.h5"
    save_graph(g, path, "ioi")
    mixed = Supernode("mixed", (NodeKey("feature", 1, 2, 7, "attn"), NodeKey("feature", 1, 2, 7, "mlp")))
    mlp = Supernode("mlp only", (NodeKey("feature", 0, 1, 3, "mlp"), NodeKey("error", 0, 1, -1, "mlp")))
    attn = Supernode("attn err", (NodeKey("error", 1, 3, -1, "attn"),))
    save_supernodes(path, [mlp, mixed, attn], "ioi")
    back = load_supernodes(path, "ioi")
    assert back == [mlp, mixed, attn]
    assert [m.site for m in back[1].members] == ["attn", "mlp"]


def flipped_copies(before: bytes, after: bytes, tmp_path):
    """One file per byte of `after` that saving changed or added (against `before`), that byte
    XORed with 0xFF."""
    n = len(before)
    offsets = [i for i in range(len(after)) if i >= n or after[i] != before[i]]
    path = tmp_path / "flip.h5"
    for i in offsets:
        data = bytearray(after)
        data[i] ^= 0xFF
        path.write_bytes(bytes(data))
        yield i, path


@pytest.mark.slow  # ~9 s: one load per byte the save wrote
def test_a_flipped_byte_in_saved_supernodes_raises_never_reads_as_none(tmp_path):
    """Nine supernodes saved beside a graph; each byte the save wrote, flipped in turn: reading
    gives the nine groups or raises GraphFileError, never an empty list ("none saved") or other
    groups. A graph without supernodes still reads as []."""
    g = layered_graph(0)
    feats = np.flatnonzero(g.nodes.kind == "feature")
    path = tmp_path / "g.h5"
    save_graph(g, path, "ioi")
    assert load_supernodes(path, "ioi") == []
    before = path.read_bytes()
    sns = [supernode(g, f"group {i}", feats[3 * i : 3 * i + 3]) for i in range(9)]
    save_supernodes(path, sns, "ioi")
    outcomes = {"same": 0, "error": 0}
    for i, flipped in flipped_copies(before, path.read_bytes(), tmp_path):
        try:
            got = load_supernodes(flipped, "ioi")
        except GraphFileError as e:
            assert "\n" not in str(e)
            outcomes["error"] += 1
            continue
        assert got == sns, f"byte {i}: {len(got)} groups read without an error"
        outcomes["same"] += 1
    assert outcomes["error"] > 0
