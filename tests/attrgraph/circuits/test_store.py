"""Circuits in HDF5: round trip (positional or not, with scores), fixed-length strings and
checksums on disk, files of the older layout (variable-length strings), and every kind of bad
file as one GraphFileError sentence."""

import json

import h5py
import numpy as np
import pytest
import torch

from attrgraph.circuits.circuit import Circuit, EdgeLayout, EdgeScores
from attrgraph.circuits.graph import ComponentGraph
from attrgraph.circuits.store import list_circuits, load_circuit, save_circuit
from attrgraph.errors import GraphFileError


def circuit(positional: bool, seed: int = 0) -> tuple[Circuit, EdgeScores]:
    g = torch.Generator().manual_seed(seed)
    graph = ComponentGraph(2, 2, True)
    positions = ("BOS", "Märy", "end") if positional else None
    valid = torch.ones(3, 3, dtype=torch.bool).tril() if positional else None
    layout = EdgeLayout(graph, positions, valid)
    flat = torch.randn(layout.n_edges, generator=g)
    resid, attn = layout.unflatten(flat)
    scores = EdgeScores(layout, resid.float(), None if attn is None else attn.float(), "eap")
    return Circuit.from_flat(layout, flat > 0, "greedy", {"n": 7, "note": "é"}), scores


@pytest.fixture
def stored(tmp_path):
    path = tmp_path / "c.h5"
    for name, positional in (("plain", False), ("pos", True)):
        c, s = circuit(positional)
        save_circuit(c, path, name, s)
    return path


def test_round_trip_fixed_length_strings_and_checksums(stored):
    assert list_circuits(stored) == ["plain", "pos"]
    for name, positional in (("plain", False), ("pos", True)):
        c, s = circuit(positional)
        back, back_s = load_circuit(stored, name)
        assert torch.equal(back.flat(), c.flat()) and back.layout.positions == c.layout.positions
        assert back.method == "greedy" and back.meta == {"n": 7, "note": "é"}
        assert torch.equal(back_s.flat(), s.flat())
    with h5py.File(stored) as f:
        grp = f["circuits/pos"]
        for key in ("method", "meta", "positions"):
            assert grp.attrs.get_id(key).dtype.kind == "S", key  # fixed length, in the checksummed header
        assert all(grp[k].fletcher32 for k in ("resid", "attn", "attn_valid", "scores/resid", "scores/attn"))


def test_the_older_layout_with_variable_length_strings_reads(tmp_path):
    path = tmp_path / "old.h5"
    c, s = circuit(True)
    with h5py.File(path, "w") as f:  # what save_circuit wrote before fixed-length strings
        grp = f.create_group("circuits/old")
        grp.attrs.update(
            schema_version=1, method="greedy", n_layers=2, n_heads=2, has_mlp=True, meta=json.dumps(c.meta)
        )
        grp.attrs["positions"] = np.array(c.layout.positions, dtype=h5py.string_dtype())
        grp.create_dataset("resid", data=c.resid.numpy())
        grp.create_dataset("attn", data=c.attn.numpy())
        grp.create_dataset("attn_valid", data=c.layout.attn_valid.numpy())
        grp.create_dataset("scores/resid", data=s.resid.numpy())
        grp.create_dataset("scores/attn", data=s.attn.numpy())
    back, back_s = load_circuit(path, "old")
    assert torch.equal(back.flat(), c.flat()) and back.layout.positions == ("BOS", "Märy", "end")
    assert back.method == "greedy" and back.meta == c.meta and torch.equal(back_s.flat(), s.flat())


def _edit(path, fn):
    with h5py.File(path, "a") as f:
        fn(f["circuits/pos"])


def _replace(name, value):
    def fn(grp):
        del grp[name]
        grp[name] = value

    return fn


@pytest.mark.parametrize(
    "case, match",
    [
        ("missing file", "does not exist"),
        ("text file", "is not an HDF5 file"),
        ("truncated", "damaged or incomplete|is not an HDF5 file"),
        ("no circuit", r"holds no circuit 'pos'; it holds \['plain'\]"),
        ("missing dataset", r"damaged or incomplete \(KeyError"),
        ("missing attribute", r"damaged or incomplete \(KeyError"),
        ("bad meta", r"damaged or incomplete \(JSONDecodeError"),
        ("resid shape", r"pos/resid has shape \(2, 3\), expected"),
        ("attn shape", r"pos/attn has shape \(4,\), expected"),
        ("checksum", "damaged or incomplete"),
        ("version", "schema version 5"),
    ],
)
def test_bad_files_raise_one_sentence(stored, tmp_path, case, match):
    path = stored
    if case == "missing file":
        path = tmp_path / "nothing.h5"
    elif case == "text file":
        path.write_text("a circuit, but as text")
    elif case == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif case == "no circuit":
        _edit(path, lambda grp: grp.parent.__delitem__("pos"))
    elif case == "missing dataset":
        _edit(path, lambda grp: grp.__delitem__("attn"))
    elif case == "missing attribute":
        _edit(path, lambda grp: grp.attrs.__delitem__("n_heads"))
    elif case == "bad meta":
        _edit(path, lambda grp: grp.attrs.__setitem__("meta", "{not json"))
    elif case == "resid shape":
        _edit(path, _replace("resid", np.zeros((2, 3), bool)))
    elif case == "attn shape":
        _edit(path, _replace("attn", np.zeros(4, bool)))
    elif case == "checksum":
        with h5py.File(path) as f:
            offset = f["circuits/pos/scores/resid"].id.get_chunk_info(0).byte_offset
        with open(path, "r+b") as fh:
            fh.seek(offset)
            byte = fh.read(1)[0]
            fh.seek(offset)
            fh.write(bytes([byte ^ 0xFF]))
    else:
        _edit(path, lambda grp: grp.attrs.__setitem__("schema_version", 5))
    with pytest.raises(GraphFileError, match=match) as e:
        load_circuit(path, "pos")
    assert "\n" not in str(e.value)


def test_listing_and_saving_into_bad_files_raise_one_sentence(tmp_path):
    c, s = circuit(False)
    text = tmp_path / "t.h5"
    text.write_text("x")
    for call in (lambda: list_circuits(text), lambda: save_circuit(c, text, "c", s)):
        with pytest.raises(GraphFileError, match="is not an HDF5 file") as e:
            call()
        assert "\n" not in str(e.value)
    assert text.read_text() == "x"  # not overwritten
    with pytest.raises(GraphFileError, match="does not exist"):
        list_circuits(tmp_path / "nothing.h5")


@pytest.mark.slow  # ~15 s: one load per byte the save wrote
def test_a_flipped_byte_in_a_saved_circuit_raises_never_reads_as_none(tmp_path):
    """A circuit saved into a file holding another; each byte the save wrote, flipped in turn:
    listing and reading give the circuit or raise GraphFileError, never "none saved"."""
    path = tmp_path / "c.h5"
    c0, s0 = circuit(False)
    save_circuit(c0, path, "plain", s0)
    before = path.read_bytes()
    c, s = circuit(True, seed=1)
    save_circuit(c, path, "pos", s)
    after = path.read_bytes()
    errors = 0
    flipped = tmp_path / "flip.h5"
    for i in [i for i in range(len(after)) if i >= len(before) or after[i] != before[i]]:
        data = bytearray(after)
        data[i] ^= 0xFF
        flipped.write_bytes(bytes(data))
        try:
            names = list_circuits(flipped)
            back, back_s = load_circuit(flipped, "pos")
        except GraphFileError as e:
            assert "\n" not in str(e)
            errors += 1
            continue
        assert names == ["plain", "pos"], f"byte {i}: {names}"
        assert torch.equal(back.flat(), c.flat()) and torch.equal(back_s.flat(), s.flat()), f"byte {i}"
    assert errors > 0
