"""Bad input, round 6 (docs/bad_inputs.md, "Round 6: indices and analysis calls"), the transcoders
package: coactivation statistics, dashboards and set configs. Each is one named exception with one
sentence, where it gave a foreign exception (torch's RuntimeError, numpy's IndexError, TypeError) or
ran: a negative `skip_first` that counted only the last position, float token ids cut to integers,
`feature(-1, 0)` read as the last layer's dashboard, a histogram up to infinity."""

import math
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from tests.transcoders.tc_helpers import random_set, tiny_model
from transcoders.coactivation import compute_coactivation, flat_index
from transcoders.config import TranscoderConfig
from transcoders.dashboard_file import dashboard_text, load_dashboards, set_labels
from transcoders.dashboards import DashboardConfig
from transcoders.errors import ConfigError, DashboardFileError, TranscoderMismatchError
from transcoders.sites import check_fits

DASHBOARDS = Path(__file__).resolve().parents[2] / "data" / "default-plt" / "dashboards.h5"


@pytest.fixture(scope="module")
def setup():
    model = tiny_model()
    tc = random_set(activation="relu", n_layers=model.cfg.n_layers, d_model=model.cfg.d_model, d_sae=8).eval()
    seqs = torch.randint(0, model.cfg.d_vocab, (3, 6), generator=torch.Generator().manual_seed(0))
    return model, tc, seqs


@pytest.mark.parametrize(
    "call,said",
    [
        (lambda tc: flat_index([tc], 1, 0, 0), "which is 1; pass an integer in [0, 1)."),
        (lambda tc: flat_index([tc], 0, 5, 0), "layer is 5; pass an integer in [0, 2)."),
        (lambda tc: flat_index([tc], 0, 0, 8), "feature is 8; pass an integer in [0, 8)."),
        (lambda tc: flat_index([tc], 0, 0, -1), "feature is -1; pass an integer in [0, 8)."),
        (lambda tc: flat_index([tc], 0, 0.5, 0), "layer is 0.5; pass an integer in [0, 2)."),
        (lambda tc: flat_index(tc, 0, 0, 0), "coders is a PerLayerTranscoder; pass a list of sets"),
    ],
)
def test_flat_index_of_a_feature_outside_the_sets(setup, call, said):
    """Before: `IndexError: list index out of range`, or a flat index of another set's feature."""
    with pytest.raises(ConfigError) as e:
        call(setup[1])
    assert str(e.value).startswith(said)


@pytest.mark.parametrize(
    "change,said",
    [
        (lambda kw: dict(chunk_seqs=0), "chunk_seqs is 0; pass an integer of at least 1."),
        (lambda kw: dict(skip_first=-1), "skip_first is -1; pass an integer of at least 0."),
        (lambda kw: dict(skip_first=6), "no position was counted (skip_first 6, or no sequences)"),
        (
            lambda kw: dict(pairs=np.array([0, 1, 2])),
            "pairs is a int64 array of shape (3,); pass [n_pairs, 2] integer",
        ),
        (lambda kw: dict(pairs=np.array([[0.0, 1.0]])), "pairs is a float64 array of shape (1, 2)"),
        (
            lambda kw: dict(sequences=kw["sequences"].float() + 0.5),
            "sequences hold torch.float32 values; pass integer",
        ),
        (
            lambda kw: dict(sequences=torch.tensor([[0, 1000]])),
            "sequences hold token ids in [0, 1000]; the model's vo",
        ),
        (lambda kw: dict(coders=kw["coders"][0]), "coders is a PerLayerTranscoder; pass a list of sets"),
    ],
)
def test_coactivation_arguments_that_make_no_sense(setup, change, said):
    """Before: torch's `split_size can only be 0 ...`; `skip_first=-1` counted the last position
    only, `skip_first` past the sequences counted nothing and returned zeros; float ids were cut to
    integers and ids outside the vocabulary were torch's IndexError; a 1-D pairs array was numpy's
    reshape error and one set not in a list a TypeError."""
    model, tc, seqs = setup
    kw = dict(coders=[tc], sequences=seqs, pairs=np.array([[0, 1]]))
    kw.update(change(kw))
    with pytest.raises(ConfigError) as e:
        compute_coactivation(model, kw.pop("coders"), kw.pop("sequences"), kw.pop("pairs"), **kw)
    assert str(e.value).startswith(said)


def test_coactivation_of_one_pair_counts_against_brute_force(setup):
    """One (source, target) pair as a plain tuple still works, and counts what a loop counts."""
    model, tc, seqs = setup
    got = compute_coactivation(model, [tc], seqs, (flat_index([tc], 0, 0, 1), flat_index([tc], 0, 1, 2)))
    from transcoders.sites import collect

    x, _ = collect(model, seqs, tc.cfg)
    acts = tc.activation(tc.encode(x))[:, 1:]  # [B, P - 1, L, S], the BOS left out
    s, t = acts[..., 0, 1] > 0, acts[..., 1, 2] > 0
    assert got.n_positions == seqs.shape[0] * (seqs.shape[1] - 1) and 0 < int(s.sum()) < s.numel()
    assert (int(got.n_both[0]), int(got.n_source[0]), int(got.n_target[0])) == (
        int((s & t).sum()),
        int(s.sum()),
        int(t.sum()),
    )


def test_dashboard_lookups_outside_the_set():
    """Before: `feature(-1, 0)` gave the last layer's dashboard labelled layer -1 (numpy's negative
    index), a float index numpy's IndexError; dashboard_text of the Dashboards object a TypeError."""
    d = load_dashboards(DASHBOARDS)
    for key, name in (((-1, 0), "L-1/F0"), ((0, -1), "L0/F-1"), ((4, 0), "L4/F0"), ((1.0, 0), "L1.0/F0")):
        for call in (d.feature, d.label):
            with pytest.raises(
                DashboardFileError, match=rf"^feature {name} is outside this set \(4 layers x 1024"
            ):
                call(*key)
    with pytest.raises(
        DashboardFileError, match=r"^dashboard_text takes one feature's dashboard, got a Dashboards"
    ):
        dashboard_text(d)
    assert dashboard_text(d.feature(np.int64(0), 1)).startswith("L0/F1")


def test_set_labels_refuses_a_float_feature_before_writing(tmp_path):
    """Before: `(0, 1.5)` labelled feature 1."""
    path = tmp_path / "dashboards.h5"
    path.write_bytes(DASHBOARDS.read_bytes())
    with pytest.raises(
        DashboardFileError, match=r"^feature \(0, 1\.5\) is neither \(layer, feature\) nor a name"
    ):
        set_labels(path, {(0, 1.5): "x"})
    assert path.read_bytes() == DASHBOARDS.read_bytes()


@pytest.mark.parametrize(
    "fields,said",
    [
        (dict(d_sae=1.5), "d_sae is 1.5; it must be a positive integer."),
        (dict(n_layers=True), "n_layers is True; it must be a positive integer."),
        (dict(activation="topk", k=2.5), "k is 2.5; pass an integer number of features."),
        (dict(bandwidth=math.nan), "bandwidth is nan; it must be a finite number above 0"),
        (dict(bandwidth=math.inf), "bandwidth is inf; it must be a finite number above 0"),
    ],
)
def test_transcoder_config_numbers(fields, said):
    """Before: a d_sae of 1.5 passed the check (`int(1.5)` is 1), and k 2.5 too; a NaN or infinite
    bandwidth was accepted, a straight-through kernel of no width or of all of it."""
    with pytest.raises(ConfigError) as e:
        TranscoderConfig(**{"kind": "plt", "n_layers": 2, "d_model": 8, "d_sae": 4, **fields})
    assert str(e.value).startswith(said)


@pytest.mark.parametrize(
    "fields,said",
    [
        (dict(hist_max=math.inf), "histogram range [0.001, inf] is empty or not finite"),
        (dict(hist_min=math.nan), "histogram range [nan, 1000.0] is empty or not finite"),
        (dict(n_tokens=2.5), "n_tokens is 2.5; pass an integer."),
        (dict(before=1.5), "before is 1.5; pass an integer."),
    ],
)
def test_dashboard_config_numbers(fields, said):
    """Before: accepted; log-spaced bins up to infinity, a window of 1.5 tokens."""
    with pytest.raises(ConfigError) as e:
        DashboardConfig(**fields)
    assert str(e.value).startswith(said)


def test_check_fits_names_what_is_not_a_model_or_a_set(setup):
    """Before: `AttributeError: 'str' object has no attribute 'cfg'`."""
    model, tc, _ = setup
    with pytest.raises(
        TranscoderMismatchError, match=r"^the model is a str, not a TransformerLens HookedTransformer"
    ):
        check_fits("default", tc)
    with pytest.raises(TranscoderMismatchError, match=r"^the transcoders are a str, not a set"):
        check_fits(model, "default-plt")
    check_fits(model, tc)


def test_dashboards_never_replace_a_file_that_is_not_dashboards(setup, tmp_path):
    """Before: `python -m transcoders.dashboards --out g.h5` on an attribution graph file replaced
    the whole file by dashboards (the graphs were lost); `--out DIR` was h5py's errno-21 message of
    several lines. Now one sentence, before the model or the set load (the set named does not exist,
    and its own error would come first otherwise), the file byte for byte as it was."""
    import h5py

    from transcoders.dashboards import compute_dashboards

    graphs = tmp_path / "g.h5"
    with h5py.File(graphs, "w") as f:  # what attrgraph's store writes: /graphs/<name>/...
        f.create_group("graphs/graph").create_dataset("x", data=np.arange(3))
    before = graphs.read_bytes()
    text = tmp_path / "notes.txt"
    text.write_text("not HDF5")
    for out, said in (
        (graphs, f"{graphs} exists and is not a dashboards file, and writing would replace it"),
        (text, f"{text} exists and is not a dashboards file"),
        (
            tmp_path,
            f"{tmp_path} is a folder; pass a file name to write, such as {tmp_path / 'dashboards.h5'}.",
        ),
    ):
        with pytest.raises(DashboardFileError) as e:
            compute_dashboards(transcoders=str(tmp_path / "no-such-set"), out=out)
        assert str(e.value).startswith(said)
    assert graphs.read_bytes() == before and text.read_text() == "not HDF5"
    model, tc, seqs = setup
    again = tmp_path / "d.h5"  # a dashboards file is replaced, as before
    for _ in range(2):
        compute_dashboards(model=model, tc=tc, sequences=seqs, out=again, n_tokens=18, progress=False)
    assert load_dashboards(again).n_layers == 2


@pytest.mark.parametrize(
    "fields,said",
    [
        (dict(n_tokens=1e6), "n_tokens is 1000000.0; pass an integer (1000000)."),
        (dict(batch_size=2.5), "batch_size is 2.5; pass an integer."),
        (dict(checkpoint_every=1.5), "checkpoint_every is 1.5; pass an integer."),
        (dict(seed=0.5), "seed is 0.5; pass an integer."),
        (dict(splice_with="default-attn-sae"), "splice_with is the string 'default-attn-sae'; pass a tuple of set names, e.g. ('default-attn-sae',)."),
        (dict(model=""), "model is empty; pass 'default', a model folder or a TransformerLens name."),
    ],
)  # fmt: skip
def test_train_config_values_python_writes_by_mistake(fields, said):
    """Before: accepted: a float `n_tokens=4e6` (Python's usual spelling), a batch size of 2.5, a
    seed of 0.5; `splice_with="default-attn-sae"` would be read letter by letter as set names at the
    evaluation after the whole run (train.py iterates it); an empty model name failed only when it
    loaded."""
    from transcoders.train_config import TrainConfig

    with pytest.raises(ConfigError) as e:
        TrainConfig(**fields)
    assert str(e.value) == said
    TrainConfig(
        splice_with=["default-attn-sae"], n_tokens=2048, batch_size=256, block_tokens=1024
    )  # still fine


def test_dashboards_of_another_set_are_not_replaced(setup, tmp_path):
    """Before: recomputing into another set's dashboards file (`--out` of the CLT's for the PLT, say)
    replaced them and kept their user labels, which then named other features. Now one sentence
    after the set loads and before the pass. A set of the same shape retrained was recomputed in
    place with its labels until round 8, which refuses that too where the file records its set's
    fingerprint (test_dashboards.py); a file that records none is still recomputed with them."""
    from transcoders.dashboards import compute_dashboards

    model, tc, seqs = setup
    path = tmp_path / "d.h5"
    kw = dict(model=model, sequences=seqs, out=path, n_tokens=18, progress=False)
    compute_dashboards(tc=tc, **kw)
    set_labels(path, {(1, 3): "mine"})
    before = path.read_bytes()
    wider = random_set(activation="relu", n_layers=2, d_model=model.cfg.d_model, d_sae=16, seed=1).eval()
    with pytest.raises(
        DashboardFileError,
        match=r"holds the dashboards of another set \(plt, 2 layers x 8 features; this one is plt, 2 x 16\)",
    ):
        compute_dashboards(tc=wider, **kw)
    assert path.read_bytes() == before
    retrained = random_set(activation="relu", n_layers=2, d_model=model.cfg.d_model, d_sae=8, seed=2).eval()
    with h5py.File(path, "a") as f:  # a file written before round 8: no fingerprint to tell the sets apart
        del f.attrs["transcoder_fingerprint"]
    compute_dashboards(tc=retrained, **kw)
    assert load_dashboards(path).label(1, 3) == "mine"


@pytest.mark.parametrize(
    "write,said",
    [
        (lambda p: np.save(p, np.random.default_rng(0).random((4, 16))), "holds a float64 array of shape (4, 16); pass integer token ids"),
        (lambda p: np.save(p, np.zeros((0, 16), np.int64)), "holds a int64 array of shape (0, 16); pass integer token ids"),
        (lambda p: np.save(p, np.zeros((2, 2, 2), np.int64)), "holds a int64 array of shape (2, 2, 2)"),
        (lambda p: np.save(p, np.array([{"a": 1}], dtype=object), allow_pickle=True), "is not a readable .npy of token ids"),
        (lambda p: p.with_suffix(".txt").write_bytes(b"\n\n"), "holds no text; pass a file of one text per line."),
        (lambda p: p.with_suffix(".txt").write_bytes(b"fine\n\xff bad\n"), "line 2 is not UTF-8 text (invalid start byte at byte 0)"),
    ],
)  # fmt: skip
def test_corpus_files_that_hold_no_tokens(tmp_path, write, said):
    """Before (`--corpus` of train and dashboards): a float array or an empty one gave dashboards of
    no tokens, written as if fine; a 1-D or object array and a byte that is not UTF-8 tracebacks
    (`TypeError: 'int' object is not iterable`, numpy's `ValueError`, `UnicodeDecodeError`)."""
    from transcoders.train_config import check_corpus, corpus_items

    path = tmp_path / "corpus.npy"
    write(path)
    corpus = str(path if path.exists() else path.with_suffix(".txt"))
    with pytest.raises(ConfigError) as e:
        check_corpus(corpus)
        list(corpus_items(corpus, 0))  # a bad line past the first is met while reading
    assert str(e.value).startswith(f"corpus {corpus!r} {said}")


def test_a_text_corpus_reads_windows_line_ends_as_text_mode_did(tmp_path):
    """The lines are decoded one by one (to name one that is not UTF-8); a CRLF file still gives
    its texts without the carriage return, as Python's text mode gave them before."""
    from transcoders.train_config import corpus_items

    path = tmp_path / "c.txt"
    path.write_bytes(b"When Mary went\r\n\r\nThe cat\n")
    assert list(corpus_items(str(path), 0)) == ["When Mary went", "The cat"]


def test_corpus_token_ids_are_checked_against_the_model_and_a_stream_is_one_document(setup, tmp_path):
    from transcoders.train_config import corpus_items, sequence_source

    model = setup[0]
    path = tmp_path / "ids.npy"
    np.save(path, np.full((2, model.cfg.n_ctx), model.cfg.d_vocab))
    with pytest.raises(
        ConfigError, match=r"holds token ids in \[50, 50\]; the model's vocabulary is \[0, 50\)"
    ):
        sequence_source(model, str(path), 0)
    np.save(path, np.arange(7))  # one stream of token ids
    assert list(corpus_items(str(path), 0)) == [list(range(7))]


def test_a_corpus_shorter_than_one_sequence(setup, tmp_path):
    """Before: dashboards of no tokens were written as if fine; training stopped on the activation
    store's bare `ValueError: the token source yields no sequences`."""
    from transcoders.activation_store import sequence_width
    from transcoders.dashboards import compute_dashboards

    model, tc, _ = setup
    with pytest.raises(
        ConfigError, match=r"^the corpus yields no sequence of 32 tokens \(all of it together is shorter\)"
    ):
        sequence_width(lambda: iter(()), 32)
    out = tmp_path / "d.h5"
    with pytest.raises(ConfigError, match=r"^the corpus gave no sequence of 32 tokens"):
        compute_dashboards(
            model=model, tc=tc, sequences=lambda: iter(()), out=out, n_tokens=64, progress=False
        )
    assert not out.exists()
