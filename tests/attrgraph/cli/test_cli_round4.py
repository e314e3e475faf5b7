"""Bad input, round 4 (docs/bad_inputs.md, "Component circuits, group names and output folders"):
`attrgraph circuit`'s options, a group name HDF5 reads as a path, and output folders that cannot be
written. Each is one line on stderr and exit status 2, before the model loads (the tests pass a model
that does not exist, whose own error would come first otherwise), with nothing written; a schema
file that is not a schema is one `SchemaError` line."""

import json
import re

import pytest
import torch

from attrgraph.circuits.schema import read_schema
from attrgraph.errors import ExportError, GraphFileError, SchemaError
from attrgraph.graph.store import save_graph
from tests.attrgraph.ag_helpers import random_graph
from tests.attrgraph.cli.test_cli import error_line, run
from transcoders.output_folder import check_output_folder

NO_MODEL = ["--model", "/nonexistent/model"]


@pytest.mark.parametrize(
    "args,said",
    [
        (["--n", "0"], "n (--n) is 0; pass at least 1 example"),
        (["--n", "-3"], "n (--n) is -3"),
        (["--method", "eap", "--edges", "0"], "edges (--edges) is 0; pass the circuit's size"),
        (["--method", "peap", "--edges", "-1"], "edges (--edges) is -1"),
        (["--method", "ep", "--steps", "0"], "steps is 0; pass at least 1."),
        (["--method", "hap", "--steps", "-5"], "steps is -5"),
        (["--method", "ep", "--sparsity", "1.5"], "strictly between 0 and 1, got 1.5"),
        (["--method", "hap", "--keep-frac", "1.5"], "kept fraction must lie strictly between 0 and 1"),
        (["--method", "hap", "--keep-frac", "0.01"], "more than the 0.01 EAP keeps"),
        (
            ["--method", "peap", "--schema", "{tmp}/missing.json"],
            "schema file {tmp}/missing.json does not exist",
        ),
        (["--method", "eap", "--schema", "{tmp}/s.json"], "it does not apply to eap on ioi"),
        (
            ["--method", "eap", "--out", "{tmp}"],
            "is a folder; pass a file name to write, such as {tmp}/circuit.h5",
        ),
        (["--method", "eap", "--out", "{tmp}/s.json"], "is not an HDF5 file, so no circuit can be added"),
        (
            ["--method", "eap", "--out", "{tmp}/c.h5", "--name", "."],
            "circuit name '.' is empty, '.' or contains '/'",
        ),
        (["--method", "eap", "--out", "{tmp}/c.h5", "--name", "a/b"], "circuit name 'a/b'"),
    ],
)
def test_circuit_refuses_what_it_cannot_run_or_write_before_the_model_loads(tmp_path, capsys, args, said):
    (tmp_path / "s.json").write_text('{"spans": ["a"], "examples": []}')
    before = sorted(tmp_path.iterdir())
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    rc, out, err = run(capsys, "circuit", "--task", "ioi", *NO_MODEL, *args)
    assert rc == 2 and out == ""
    assert said.replace("{tmp}", str(tmp_path)) in error_line(err, "circuit")
    assert sorted(tmp_path.iterdir()) == before


@pytest.mark.parametrize(
    "name,text,said",
    [
        ("bad.json", "{not json", "is not a schema (JSONDecodeError"),
        ("list.json", "[1, 2]", "is not a schema (TypeError"),
        ("keys.json", '{"spans": ["a"]}', "is not a schema (KeyError: 'examples')"),
        (
            "float.json",
            '{"spans": ["a"], "examples": [{"a": [0, 2.5]}, {"a": [0, 3]}]}',
            "[0, 2.5], not [start, end]",
        ),
        (
            "three.json",
            '{"spans": ["a"], "examples": [{"a": [0, 1, 2]}, {"a": [0, 3]}]}',
            "[0, 1, 2], not [start, end]",
        ),
        (
            "count.json",
            '{"spans": ["a"], "examples": [{"a": [0, 3]}]}',
            "the schema has 1 examples but the data 2",
        ),
        (
            "neg.csv",
            "example,span,start,end\n-1,a,0,3\n",
            "example -1 does not exist; the data has examples 0-1",
        ),
        ("word.csv", "example,span,start,end\n0,a,zero,3\n", "is not a schema (ValueError"),
        ("cols.csv", "example,span\n0,a\n", "needs the CSV columns example,span,start,end"),
        ("binary.csv", b"\xff\xfe\x00", "is not a schema (UnicodeDecodeError"),
        ("folder.json", None, "does not exist or is not a file"),
    ],
)
def test_a_schema_file_that_is_not_a_schema_is_one_line(tmp_path, name, text, said):
    path = tmp_path / name
    if text is None:
        path.mkdir()
    elif isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(SchemaError) as e:
        read_schema(path, [3, 3])
    assert said in str(e.value) and "\n" not in str(e.value)


def test_a_good_schema_file_still_reads(tmp_path):
    """The JSON and CSV forms of one schema (hand-written) give the same span of every position."""
    spans = {"BOS": [0, 1], "X": [1, 3]}
    (tmp_path / "s.json").write_text(json.dumps({"spans": ["BOS", "X"], "examples": [spans, spans]}))
    rows = [f"{b},{s},{r[0]},{r[1]}" for b in (0, 1) for s, r in spans.items()]
    (tmp_path / "s.csv").write_text("\n".join(["example,span,start,end", *rows]) + "\n")
    for f in ("s.json", "s.csv"):
        schema = read_schema(tmp_path / f, [3, 3])
        assert schema.spans == ("BOS", "X") and torch.equal(schema.span_index, torch.tensor([[0, 1, 1]] * 2))


@pytest.mark.parametrize("name", [".", "a/b", ""])
def test_a_graph_name_hdf5_reads_as_a_path_is_refused(tmp_path, capsys, name):
    """`build --name .` ended in h5py's KeyError after the whole attribution; now one line before it."""
    rc, _, err = run(capsys, "build", "hello", "-o", tmp_path / "g.h5", "--name", name, *NO_MODEL)
    assert rc == 2 and "pass a plain name" in error_line(err, "build")
    with pytest.raises(GraphFileError, match="pass a plain name"):
        save_graph(random_graph(0), tmp_path / "g.h5", name=name)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["validate", "export"])
@pytest.mark.parametrize(
    "where,said",
    [
        ("a_file", "a_file is a file; pass a folder to write into"),
        ("a_file/sub", "a_file is a file, so the folder {tmp}/a_file/sub cannot be created"),
    ],
)
def test_an_output_folder_that_cannot_be_written_is_one_line_before_the_work(
    tmp_path, capsys, command, where, said
):
    """`validate -o FILE` ended in `FileExistsError` (`NotADirectoryError` under a file) after the
    whole validation, `export -o FILE/sub` in `NotADirectoryError`."""
    (tmp_path / "a_file").write_text("x")
    save_graph(random_graph(0), tmp_path / "g.h5")
    out = ["-o", tmp_path / where]
    rc, _, err = run(capsys, command, tmp_path / "g.h5", *out, *(NO_MODEL if command == "validate" else []))
    assert rc == 2 and said.replace("{tmp}", str(tmp_path)) in error_line(err, command)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "g.h5"]


def test_an_output_folder_is_tried_for_real(tmp_path, read_only_dir):
    """A folder this process cannot write into (root included, on a read-only tmpfs) is refused; a
    folder to be made under a writable one passes and nothing is left behind."""
    with pytest.raises(ExportError, match=f"cannot write into {read_only_dir} "):
        check_output_folder(read_only_dir / "new" / "deeper", ExportError)
    check_output_folder(tmp_path / "new" / "deeper", ExportError)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ro"]


def test_a_model_without_the_tasks_words_is_one_line(tmp_path, capsys):
    """The bundled tasks are written in the bundled model's words; a model whose vocabulary lacks
    them (here a word-level tokenizer of ten other words) was a bare `ValueError` traceback."""
    from safetensors.torch import save_file
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from attrgraph.bundled.tokenizer import build_tokenizer

    tok = build_tokenizer([f"w{i}" for i in range(10)], tmp_path / "m" / "tokenizer")
    kwargs = dict(
        n_layers=1, d_model=8, n_heads=2, d_head=4, d_mlp=16, d_vocab=len(tok), n_ctx=32, act_fn="gelu"
    )
    (tmp_path / "m" / "config.json").write_text(json.dumps(kwargs))
    state = HookedTransformer(HookedTransformerConfig(**kwargs)).state_dict()
    save_file(
        {k: v for k, v in state.items() if not k.endswith((".mask", ".IGNORE"))},
        tmp_path / "m" / "model.safetensors",
    )
    rc, _, err = run(capsys, "circuit", "--task", "ioi", "--model", tmp_path / "m", "--n", "2")
    assert rc == 2 and "of the bundled tasks are not in this model's vocabulary" in error_line(err, "circuit")


def test_engine_options_a_method_cannot_take_are_option_errors(make_tiny_model, make_tiny_transcoders):
    """attribute_adaptive's negative budget and an unknown backend or embedding were bare ValueErrors."""
    from attrgraph.engine.attribute import attribute
    from attrgraph.errors import OptionError

    model = make_tiny_model("gpt2")
    tc = make_tiny_transcoders(model)
    for kw, said in [
        (dict(method="adaptive", max_feature_nodes=-1), "max_feature_nodes is -1; pass 0 or more."),
        (dict(backend="fast"), "backend is 'fast'; pass one of"),
        (dict(embedding="words"), "embedding is 'words'; pass one of"),
    ]:
        with pytest.raises(OptionError, match=re.escape(said)):
            attribute(model, tc, [1, 2, 3, 4], **kw)
