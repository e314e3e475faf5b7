"""`python -m transcoders.train` on bad input (docs/bad_inputs.md, round 4): every value the run
cannot use is one line and exit status 2 before the model loads, where it was a traceback (a zero
batch or checkpoint interval divided by, torch's Adam refusing a learning rate) or a run that
trained on nonsense (a negative sparsity coefficient); a corpus file that is not there and a run
folder that cannot be written are found before the model loads, not at the first checkpoint or
after the whole run. The tests point --model at nothing: a check after the load would meet that
error first."""

import pytest

from transcoders.train import main

NO_MODEL = ["--model", "/nonexistent/model", "--n-tokens", "4096"]


def _one_line(capsys, usage: bool = False) -> str:
    """The error's line; a value argparse's parser refuses comes after its usage lines, as every
    argparse error does."""
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err) and (usage or len(err) == 1), err
    assert err[-1].startswith("python -m transcoders.train: error: "), err
    return err[-1]


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--batch-size", "0"], "batch_size is 0; pass at least 1."),
        (["--checkpoint-every", "0"], "checkpoint_every is 0; pass at least 1."),
        (["--checkpoint-every", "-1"], "checkpoint_every is -1"),
        (["--lr", "-1"], "lr -1.0 is not a positive learning rate"),
        (["--lr", "nan"], "lr nan is not a positive learning rate"),
        (["--lr", "0"], "lr 0.0 is not a positive learning rate"),
        (["--sparsity-coef", "-1"], "sparsity_coef -1.0 is negative or not finite"),
        (["--sparsity-coef", "inf"], "sparsity_coef inf is negative or not finite"),
        (["--sparsity-c", "nan"], "sparsity_c nan is negative or not finite"),
        (["--preact-coef=-3e-6"], "preact_coef -3e-06 is negative or not finite"),
        (["--block-tokens", "0"], "block_tokens 0 is smaller than batch_size 1024"),
        (["--dist-timeout", "0"], "dist_timeout 0.0 is not a positive number of seconds."),
    ],
)
def test_a_value_the_run_cannot_use_is_one_line(capsys, tmp_path, argv, said):
    with pytest.raises(SystemExit) as e:
        main([*NO_MODEL, "--out", str(tmp_path / "run"), *argv])
    assert e.value.code == 2 and said in _one_line(capsys, usage=True)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--corpus", "{tmp}/missing.npy"], "corpus '{tmp}/missing.npy' is no file and no installed package"),
        (["--corpus", "{tmp}/missing.txt"], "corpus '{tmp}/missing.txt' is no file"),
        (["--out", "{tmp}/a_file"], "{tmp}/a_file is a file; pass a folder to write into"),
        (
            ["--save-to", "{tmp}/a_file/set"],
            "{tmp}/a_file is a file, so the folder {tmp}/a_file/set cannot be",
        ),
    ],
)
def test_a_corpus_or_folder_that_is_not_there_is_one_line_before_the_model_loads(
    capsys, tmp_path, argv, said
):
    (tmp_path / "a_file").write_text("x")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    out = [] if "--out" in argv else ["--out", str(tmp_path / "run")]
    assert main([*NO_MODEL, *out, *argv]) == 2
    assert said.replace("{tmp}", str(tmp_path)) in _one_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_a_read_only_run_folder_is_one_line(capsys, read_only_dir):
    assert main([*NO_MODEL, "--out", str(read_only_dir / "run")]) == 2
    assert f"cannot write into {read_only_dir} " in _one_line(capsys)
