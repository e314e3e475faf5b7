"""SIGTERM while a set trains (a preempted job; transcoders/stop_signal.py): the run stops at a step,
writes that step's checkpoint and says so in one line, exit 143; the same command then resumes and
ends with the set an uninterrupted run trains. Before, SIGTERM killed the run (exit -15 to a
caller): the steps since the last checkpoint were lost, and no line said where it stood. A SIGTERM
outside the steps (loading, the final save and evaluation) ends on one line too."""

import contextlib
import json
import os
import signal
from pathlib import Path

from safetensors.torch import load_file

from tests.interrupts import paused
from tests.transcoders.tc_helpers import CLI_ARGS, two_ranks
from transcoders.train import main

ARGS = [
    *CLI_ARGS,
    "--n-tokens",
    "2560",
    "--checkpoint-every",
    "100",
]  # 10 steps; no checkpoint before the end
PROG = "python -m transcoders.train"


def weights(out: Path) -> dict:
    return load_file(out / "transcoders" / "weights.safetensors")


def terminated_line(command: str, args: list, module: str, name: str, nth: int = 1) -> str:
    """SIGTERM to `python -m COMMAND ARGS` where `paused` stops it: exit 143 without a traceback;
    its last line of stderr."""
    with paused(command, args, module, name, nth) as run:
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate("\n", timeout=600)
    assert run.returncode == 143 and "Traceback" not in err, err[-3000:]
    return err.strip().splitlines()[-1]


def assert_same_as_uninterrupted(out: Path, tmp_path: Path) -> None:
    """The set the run in `out` saved is, tensor for tensor, the one an uninterrupted run saves."""
    whole = tmp_path / "whole"
    assert main(list(map(str, [*ARGS, "--out", whole]))) == 0
    resumed, uninterrupted = weights(out), weights(whole)
    assert resumed.keys() == uninterrupted.keys()
    for name in resumed:
        assert resumed[name].equal(uninterrupted[name]), name


def test_sigterm_checkpoints_the_step_and_the_same_command_resumes_to_the_same_set(tmp_path):
    out = tmp_path / "run"
    args = [*ARGS, "--out", out]
    # sparsity_schedule's 6th call is step 5's (0-based), before that step's check
    assert terminated_line("transcoders.train", args, "transcoders.trainer", "sparsity_schedule", nth=6) == (
        f"{PROG}: terminated (SIGTERM); the checkpoint in {out / 'checkpoint'} holds step 5: "
        "the same command resumes there."
    )
    assert json.loads((out / "checkpoint" / "meta.json").read_text())["step"] == 5
    assert not (out / "transcoders").exists()
    assert main(list(map(str, args))) == 0
    assert_same_as_uninterrupted(out, tmp_path)


def test_attrgraph_train_transcoders_says_the_same(tmp_path):
    out = tmp_path / "run"
    args = ["train-transcoders", *ARGS, "--out", out]
    assert terminated_line("attrgraph.cli", args, "transcoders.trainer", "sparsity_schedule", nth=3) == (
        f"attrgraph train-transcoders: terminated (SIGTERM); the checkpoint in {out / 'checkpoint'} holds "
        "step 2: the same command resumes there."
    )


def test_sigterm_in_the_evaluation_after_the_steps_says_so_and_the_same_command_ends_the_run(tmp_path):
    """Paused in the evaluation after the last step (the set saved, no manifest yet): one line naming
    the last step's checkpoint, exit 143, no temp file; the same command then saves and evaluates
    the set an uninterrupted run saves. Before, SIGTERM killed the process there (exit -15),
    without a word."""
    out = tmp_path / "run"
    args = [*ARGS, "--out", out]
    assert terminated_line("transcoders.train", args, "transcoders.train", "evaluate") == (
        f"{PROG}: terminated (SIGTERM); the checkpoint in {out / 'checkpoint'} holds step 10: "
        "the same command resumes there."
    )
    assert not (out / "transcoders" / "manifest.json").exists()
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]
    assert main(list(map(str, args))) == 0
    assert (out / "transcoders" / "manifest.json").exists()
    assert_same_as_uninterrupted(out, tmp_path)


def test_sigterm_while_the_model_loads_says_no_checkpoint_is_there_yet(tmp_path):
    out = tmp_path / "run"
    assert terminated_line(
        "transcoders.train", [*ARGS, "--out", out], "transcoders.train", "load_any_model"
    ) == (
        f"{PROG}: terminated (SIGTERM); no checkpoint of this run is in {out} yet (--checkpoint-every): "
        "the same command starts afresh."
    )


def _rank(rank: int, root: str, port: str) -> None:
    """torchrun's environment by hand; rank 1 sends itself SIGTERM in step 3, before its check."""
    import torch

    import transcoders.trainer as trainer

    os.environ.update(
        RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=port
    )
    torch.set_num_threads(1)
    if rank == 1:
        real, calls = trainer.sparsity_schedule, []

        def schedule(*args):
            calls.append(1)
            if len(calls) == 4:
                os.kill(os.getpid(), signal.SIGTERM)
            return real(*args)

        trainer.sparsity_schedule = schedule
    with open(Path(root, f"stderr{rank}.txt"), "w") as f, contextlib.redirect_stderr(f):
        code = main([*ARGS, "--parallel", "features", "--dist-timeout", "60", "--out", f"{root}/run"])
    Path(root, f"code{rank}.txt").write_text(str(code))


def test_a_sigterm_on_one_rank_stops_every_rank_at_the_same_checkpointed_step(tmp_path):
    two_ranks(_rank, tmp_path)
    ckpt = tmp_path / "run" / "checkpoint"
    assert [(tmp_path / f"code{r}.txt").read_text() for r in (0, 1)] == ["143", "143"]
    assert (tmp_path / "stderr0.txt").read_text().strip().splitlines()[-1] == (
        f"{PROG}: terminated (SIGTERM); the checkpoint in {ckpt} holds step 3: the same command resumes there."
    )
    assert "terminated" not in (tmp_path / "stderr1.txt").read_text()  # rank 0's line alone
    meta = json.loads((ckpt / "meta.json").read_text())
    assert (meta["step"], meta["shards"]) == (3, 2)
