"""One training run per run folder (transcoders/run_folder.py). Before, a second run with the `--out`
of a run still going trained too: both wrote `RUN/checkpoint.tmp` and renamed it over each other's
checkpoint, and both stopped at a checkpoint on a missing file (`cannot write
RUN/checkpoint.tmp/state.safetensors (No such file or directory)`), the checkpoint left holding
either run's step. Now the second is refused at once, before its model loads, naming the first's
process id, and the first goes on untouched."""

import contextlib
import os
import signal
from pathlib import Path

import transcoders.train as train
from tests.interrupts import paused
from tests.transcoders.tc_helpers import CLI_ARGS, two_ranks
from transcoders.errors import RunBusyError
from transcoders.h5file import pid_lock
from transcoders.run_folder import LOCK

ERROR = "python -m transcoders.train: error: "


def no_model(*args, **kwargs):
    raise AssertionError("the second run loaded its model")


def test_a_second_run_on_a_run_folder_in_use_is_refused_and_the_first_goes_on(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    args = [*CLI_ARGS, "--checkpoint-every", "1", "--out", str(out)]
    with paused("transcoders.train", args, "transcoders.checkpoint", "write_checkpoint", nth=2) as first:
        with monkeypatch.context() as m:
            m.setattr(train, "load_any_model", no_model)
            assert train.main(args) == 2  # the same command again, while the first writes a checkpoint
        err = capsys.readouterr().err.strip()
        assert err == (
            f"{ERROR}another training run (pid {first.pid}) is using the run folder {out}; "
            "wait for it to end, or pass another --out."
        )
        _, first_err = first.communicate("\n", timeout=600)
        assert first.returncode == 0, first_err[-3000:]
    assert (out / "transcoders" / "weights.safetensors").is_file()
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint", "transcoders"]  # the lock is gone
    assert train.main(args) == 0  # and the folder is free again: the same command resumes the run


def test_a_run_killed_leaves_its_folder_free(tmp_path):
    """kill -9 leaves the lock's file behind; the kernel dropped its lock, so the next run goes on."""
    out = tmp_path / "run"
    args = [*CLI_ARGS, "--checkpoint-every", "1", "--out", str(out)]
    with paused("transcoders.train", args, "transcoders.checkpoint", "write_checkpoint", nth=2) as first:
        first.send_signal(signal.SIGKILL)
        first.wait(60)
    assert (out / LOCK).exists()
    assert train.main(args) == 0
    assert not (out / LOCK).exists()


def test_a_run_that_fails_before_writing_removes_the_folders_it_made(tmp_path, capsys):
    bad = tmp_path / "model"
    bad.mkdir()
    (bad / "config.json").write_text("{")
    out = tmp_path / "new" / "run"
    assert train.main([*CLI_ARGS, "--model", str(bad), "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith(f"{ERROR}{bad}")
    assert list(tmp_path.iterdir()) == [bad]


def _rank(rank: int, root: str, port: str) -> None:
    """torchrun's environment by hand; each rank runs the CLI on a run folder the test holds."""
    import torch

    from transcoders.train import main

    os.environ.update(
        RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=port
    )
    torch.set_num_threads(1)
    with open(Path(root, f"stderr{rank}.txt"), "w") as f, contextlib.redirect_stderr(f):
        code = main([*CLI_ARGS, "--parallel", "features", "--dist-timeout", "60", "--out", f"{root}/run"])
    Path(root, f"code{rank}.txt").write_text(str(code))


def test_every_rank_of_a_torchrun_job_stops_on_a_run_folder_in_use(tmp_path):
    """Rank 0 alone takes the lock; rank 1 is told, so the job ends as one (not rank 1 waiting out
    --dist-timeout in its first collective, as it would for a refusal on rank 0 alone)."""
    (tmp_path / "run").mkdir()
    with pid_lock(tmp_path / "run" / LOCK, RunBusyError):
        two_ranks(_rank, tmp_path)
    for rank in (0, 1):
        assert (tmp_path / f"code{rank}.txt").read_text() == "2"
        err = (tmp_path / f"stderr{rank}.txt").read_text().strip()
        assert err == (
            f"{ERROR}another training run (pid {os.getpid()}) is using the run folder {tmp_path / 'run'}; "
            "wait for it to end, or pass another --out."
        )
    assert not (tmp_path / "run" / "transcoders").exists()
