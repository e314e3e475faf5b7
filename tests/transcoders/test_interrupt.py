"""Ctrl-C on the transcoders package's commands (../shared/BAD_INPUTS.md: "Ctrl-C: exit 130", one
line): `python -m transcoders.train` says which step the run's checkpoint holds (the same command
resumes there) and `python -m transcoders.dashboards` that no file changed. Before, both ended in a
`KeyboardInterrupt` traceback, killed by SIGINT (exit -2).

Each test pauses the real command at a named call and sends two SIGINTs there (tests/interrupts.py)."""

from tests.interrupts import interrupted
from tests.transcoders.tc_helpers import CLI_ARGS


def last_line(res) -> str:
    assert res.returncode == 130, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "Exception ignored" not in res.stderr
    return res.stderr.strip().splitlines()[-1]


def test_ctrl_c_in_training_names_the_step_to_resume_from(tmp_path):
    """Paused at the second checkpoint write: the first (step 1) is the one to resume from, and the
    same command then resumes there and finishes."""
    out = tmp_path / "run"
    args = [*CLI_ARGS, "--checkpoint-every", "1", "--out", out]
    res = interrupted("transcoders.train", args, "transcoders.checkpoint", "write_checkpoint", nth=2)
    assert last_line(res) == (
        f"python -m transcoders.train: interrupted; the checkpoint in {out / 'checkpoint'} holds step 1: "
        "the same command resumes there."
    )
    from transcoders.train import main

    assert main(list(map(str, args))) == 0
    assert (out / "transcoders" / "weights.safetensors").is_file()


def test_ctrl_c_before_the_first_checkpoint_says_the_run_starts_afresh(tmp_path):
    out = tmp_path / "run"
    res = interrupted(
        "transcoders.train", [*CLI_ARGS, "--out", out], "transcoders.checkpoint", "write_checkpoint"
    )
    assert last_line(res) == (
        f"python -m transcoders.train: interrupted; no checkpoint of this run is in {out} yet "
        "(--checkpoint-every): the same command starts afresh."
    )


def test_ctrl_c_in_dashboards_changes_no_file(tmp_path):
    path = tmp_path / "d.h5"
    args = ["--transcoders", "default-plt", "--n-tokens", "4096", "--out", path]
    res = interrupted("transcoders.dashboards", args, "transcoders.dashboards", "accumulate")
    assert last_line(res) == "transcoders.dashboards: interrupted; no dashboards file was changed."
    assert list(tmp_path.iterdir()) == []
