"""Checkpoints under a kill: the on-disk states `write_checkpoint`'s renames can be interrupted in
resume exactly (checkpoint.py step 3)."""

import dataclasses
import shutil

import pytest
import torch

from tests.transcoders.tc_helpers import tiny_model
from transcoders import ConfigError
from transcoders.checkpoint import resume_folder
from transcoders.train import TrainConfig, train


def sequences():
    return torch.randint(0, 50, (300, 32), generator=torch.Generator().manual_seed(0))


def config(out) -> TrainConfig:
    return TrainConfig(
        kind="clt", d_sae=32, n_tokens=128 * 6, batch_size=128, block_tokens=512, lr=3e-3,
        sparsity_coef=1e-2, checkpoint_every=1000, out=str(out),
    )  # fmt: skip


def run(out, stop_after=None):
    return train(
        config(out), model=tiny_model(), sequences=sequences(), progress=False, stop_after=stop_after
    )


def test_a_kill_between_the_renames_resumes_from_checkpoint_old(tmp_path):
    straight, _ = run(tmp_path / "straight")
    run(tmp_path / "cut", stop_after=3)  # writes checkpoint/ at step 3
    ckpt = tmp_path / "cut" / "checkpoint"
    # the next write was killed between its renames: checkpoint -> checkpoint.old done, tmp not yet moved
    ckpt.rename(ckpt.with_name("checkpoint.old"))
    (tmp_path / "cut" / "checkpoint.tmp").mkdir()
    assert resume_folder(ckpt) == ckpt.with_name("checkpoint.old")
    # it reads that checkpoint (a fresh start from step 0 would end with the same weights): one
    # written with another learning rate is refused
    other = dataclasses.replace(config(tmp_path / "cut"), lr=1e-3)
    with pytest.raises(ConfigError, match=r"different \['lr'\]"):
        train(other, model=tiny_model(), sequences=sequences(), progress=False)
    resumed, info = run(tmp_path / "cut")
    assert info["steps"] == 6
    for k, v in straight.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[k], v, rtol=0, atol=0, msg=k)
    assert resume_folder(ckpt) == ckpt and not ckpt.with_name("checkpoint.old").exists()


def test_a_kill_before_old_is_removed_leaves_both_and_the_next_write_goes_on(tmp_path):
    run(tmp_path / "cut", stop_after=3)
    ckpt = tmp_path / "cut" / "checkpoint"
    shutil.copytree(ckpt, ckpt.with_name("checkpoint.old"))  # the rmtree of .old never ran
    _, info = run(tmp_path / "cut")
    assert info["steps"] == 6 and not ckpt.with_name("checkpoint.old").exists()


def test_a_copied_run_folder_resumes_where_it_lies(tmp_path):
    """`--out` says where the run folder is, not how it trains: a copy resumes (it was refused as a
    run "with different ['out']", and rerunning with the old --out would have written to the old
    folder). Expected: the uninterrupted run."""
    straight, _ = run(tmp_path / "straight")
    run(tmp_path / "cut", stop_after=3)
    shutil.copytree(tmp_path / "cut", tmp_path / "copy")
    resumed, info = run(tmp_path / "copy")
    assert info["steps"] == 6
    for k, v in straight.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[k], v, rtol=0, atol=0, msg=k)


def test_the_cli_says_a_resume_that_does_not_match_in_one_line(tmp_path, capsys):
    """`python -m transcoders.train` resumed with another option: the sentence that explains it,
    as one line and exit 2 (it was a traceback ending in the same sentence)."""
    from tests.transcoders.tc_helpers import CLI_ARGS
    from transcoders.train import main

    args = [*CLI_ARGS, "--n-tokens", "256", "--out", str(tmp_path / "run")]
    assert main(args) == 0
    capsys.readouterr()
    assert main([*args, "--lr", "0.01"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"python -m transcoders.train: error: {tmp_path / 'run' / 'checkpoint'} was written by a run "
        "with different ['lr']; rerun with the same options to resume, or pass another --out to start afresh."
    ]


def test_the_cli_shows_the_steps_bar_unless_no_progress_and_a_resume_may_change_it(tmp_path, capsys):
    """`--no-progress` (as `attrgraph build` and `validate` take it) turns the step bar off; it says how
    the run shows itself, not what it trains, so the same run folder takes the command with or
    without it (not refused as a run with other options)."""
    from tests.attrgraph.ag_helpers import bars_finished, final_bars
    from tests.transcoders.tc_helpers import CLI_ARGS
    from transcoders.train import main

    args = [*CLI_ARGS, "--n-tokens", "512", "--out", str(tmp_path / "run")]
    assert main(args) == 0
    assert bars_finished(capsys.readouterr().err, "train") == 1
    assert main([*args, "--no-progress"]) == 0
    assert final_bars(capsys.readouterr().err, "train") == []
    assert main([*CLI_ARGS, "--n-tokens", "512", "--out", str(tmp_path / "quiet"), "--no-progress"]) == 0
    assert final_bars(capsys.readouterr().err, "train") == []
