"""`python -m attrgraph.bundled.train_model`: a tiny run (seconds) lowers the loss and writes a loadable model."""

import json
import math

import pytest
import torch

from attrgraph.bundled import tasks
from attrgraph.bundled.loading import load_model
from attrgraph.bundled.train_model import main, sequences

ARGV = (
    "--n-layers 1 --d-model 32 --n-heads 2 --d-mlp 64 --n-ctx 32 --steps 30 --batch-size 8 "
    "--warmup 5 --lr 1e-2 --eval-n 5 --threads 1 --log-every 0 --seed 0"
).split()


def held_out_loss(model) -> float:
    """Next-token cross-entropy on 16 sequences of a corpus seed training never uses."""
    it = sequences(model.tokenizer.get_vocab(), model.cfg.n_ctx, seed=12345)
    with torch.no_grad():
        return model(torch.tensor([next(it) for _ in range(16)]), return_type="loss").item()


def test_tiny_run_lowers_the_loss_and_writes_a_loadable_model(tmp_path, capsys):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    out = tmp_path / "model"
    assert main([*ARGV, "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out.split("\nbelow the quality bar")[0])

    # the folder: what load_model needs, every file under the manifest's sha256, nothing left over
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "manifest.json",
        "model.safetensors",
        "tokenizer",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no model.tmp
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(manifest["files"]) == [
        "config.json",
        "model.safetensors",
        "tokenizer/tokenizer.json",
        "tokenizer/tokenizer_config.json",
    ]
    model = load_model(out)  # checks every sha256
    V = len(tasks.vocabulary()) + 4  # the words and <bos> <eos> <pad> <unk>
    assert (model.cfg.n_layers, model.cfg.d_model, model.cfg.n_ctx, model.cfg.d_vocab) == (1, 32, 32, V)
    assert manifest["command"] == "python -m attrgraph.bundled.train_model " + " ".join(
        [*ARGV, "--out", str(out)]
    )
    assert manifest["tokens_seen"] == 30 * 8 * 32 and manifest["seed"] == 0
    assert manifest["metrics"] == printed

    # the loss falls: guessing uniformly costs ln V = 6.08 and the untrained model (same config and
    # seed) does no better (6.46); 30 steps bring the held-out loss below ln V - 1
    untrained = HookedTransformer(HookedTransformerConfig(**json.loads((out / "config.json").read_text())))
    untrained.set_tokenizer(model.tokenizer)
    assert held_out_loss(untrained) > math.log(V) - 0.05
    assert held_out_loss(model) < math.log(V) - 1.0
    assert manifest["metrics"]["final_train_loss"] < math.log(V) - 0.5


def test_bad_shape_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--d-model", "30", "--n-heads", "4", "--out", str(tmp_path / "m")])
    assert e.value.code == 2
    assert "error: d_model=30 is not divisible by n_heads=4" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_ctrl_c_leaves_the_old_model_and_no_tmp_folder(tmp_path):
    """Before: a KeyboardInterrupt traceback, and `MODEL.tmp` (its tokenizer) left beside the model.
    Paused at the first evaluation (the real command, two SIGINTs there: no timing)."""
    from tests.interrupts import interrupted

    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text("{}")  # the model there before
    args = [*ARGV, "--out", out]
    res = interrupted(
        "attrgraph.bundled.train_model", args, "attrgraph.bundled.train_model", "evaluate_tasks"
    )
    assert res.returncode == 130, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1] == (
        f"python -m attrgraph.bundled.train_model: interrupted; {out} is left as it was."
    )
    assert (
        sorted(p.name for p in tmp_path.iterdir()) == ["model"] and (out / "config.json").read_text() == "{}"
    )


def test_an_out_that_is_a_file_is_one_line_before_training(tmp_path, capsys):
    (tmp_path / "m").write_text("a file")
    assert main([*ARGV, "--out", str(tmp_path / "m")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"python -m attrgraph.bundled.train_model: error: {tmp_path / 'm'} is a file; pass a folder to write "
        "the model into (--out)."
    )
