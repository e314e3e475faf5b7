"""Faults of a distributed run (gloo on localhost): a stalled or killed rank stops the run in
bounded time with one line naming it, instead of gloo's 30-minute wait in silence or its raw
"Connection reset by peer" in a traceback."""

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from tests.transcoders.tc_helpers import CLI_ARGS, free_port

ERROR = "python -m transcoders.train: error: "


def _run_rank0(root: str) -> None:
    """Rank 0 runs the CLI with --dist-timeout 2, its stderr (progress bar and error) to a file."""
    from transcoders.train import main

    with open(Path(root, "stderr.txt"), "w") as f, contextlib.redirect_stderr(f):
        try:
            code = main([*CLI_ARGS, "--parallel", "features", "--dist-timeout", "2", "--out", f"{root}/run"])
        except BaseException as e:  # before the fix: gloo's RuntimeError, or StalledRankError
            print(f"raised {type(e).__name__}: {e}", file=f)
            code = "raised"
    Path(root, "code.txt").write_text(str(code))


def _faulty_worker(rank: int, root: str, port: str, sig: int) -> None:
    """torchrun's environment by hand; rank 1 joins the group, waits for rank 0 to join, and then
    sends itself `sig`: SIGSTOP (a hung or suspended process) or SIGKILL (`kill -9`, or the OOM
    killer); rank 0 runs the CLI."""
    import torch

    from transcoders import distributed as tdist

    os.environ.update(
        RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=port
    )
    torch.set_num_threads(1)
    if rank == 1:
        tdist.init_from_env(2.0)
        from torch.distributed import distributed_c10d

        distributed_c10d._get_default_store().wait(["transcoders/progress/0"])  # rank 0 has joined
        os.kill(os.getpid(), sig)
        return
    _run_rank0(root)


def start(tmp_path, sig: int):
    """Both ranks started; returns rank 0's exit code, its stderr's error lines and the seconds it ran."""
    ctx = mp.start_processes(
        _faulty_worker,
        args=(str(tmp_path), str(free_port()), sig),
        nprocs=2,
        join=False,
        start_method="spawn",
    )
    rank0 = ctx.processes[0]
    try:
        t0 = time.monotonic()
        rank0.join(180)  # unbounded before (gloo's 30 minutes): a hang fails here
        assert rank0.exitcode == 0, "rank 0 did not end on its own"
        elapsed = time.monotonic() - t0
    finally:
        for p in ctx.processes:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
                p.join(10)
    stderr = (tmp_path / "stderr.txt").read_text()
    assert "Traceback" not in stderr and "raised" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if ERROR in line]
    assert len(errors) == 1 and errors[0].startswith(ERROR), stderr  # a line of its own
    assert not (tmp_path / "run" / "transcoders").exists()
    return (tmp_path / "code.txt").read_text(), errors[0], elapsed


@pytest.mark.slow  # ~12 s: waits out the collective's timeout
def test_a_stalled_rank_stops_the_run_naming_it(tmp_path):
    """SIGSTOP: rank 0's collective times out; it says so in one line (it was a `[rank0]:` traceback)."""
    code, message, elapsed = start(tmp_path, signal.SIGSTOP)
    assert code == "2"
    assert "rank 0 waited more than 2 s in a collective" in message
    assert "not answering: rank 1 (last seen: joined)" in message and "--dist-timeout" in message
    print(f"stalled run stopped after {elapsed:.1f} s (model load included)")


@pytest.mark.slow  # ~12 s: two ranks start, one is killed
def test_a_killed_rank_stops_the_run_naming_it(tmp_path):
    """SIGKILL: gloo's "Connection reset by peer" at once, turned into the one line naming rank 1
    (it was the raw RuntimeError), without waiting out the grace period for a rank whose process
    is gone."""
    code, message, elapsed = start(tmp_path, signal.SIGKILL)
    assert code == "2"
    assert "rank 0 lost its connection to a rank in a collective at joined" in message
    assert "not answering: rank 1 (last seen: joined; its process is gone)" in message
    print(f"killed run stopped after {elapsed:.1f} s (model load included)")


def _finishing_worker(rank: int, root: str, port: str) -> None:
    """Both ranks run the CLI (feature-sharded); each records whether rank 0's manifest (written
    after its evaluation, the last thing rank 0 does) existed when its own run() returned."""
    import torch

    from transcoders.train import main

    os.environ.update(
        RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=port
    )
    torch.set_num_threads(1)
    code = main([*CLI_ARGS, "--parallel", "features", "--out", f"{root}/run"])
    done = Path(root, "run", "transcoders", "manifest.json").exists()
    Path(root, f"rank{rank}.txt").write_text(f"{code} {done}")


@pytest.mark.slow  # ~15 s: two ranks train, then rank 0 evaluates alone
def test_ranks_end_together_after_rank_0_evaluates(tmp_path):
    """Rank 1 used to leave (destroying its end of the process group) while rank 0 still evaluated;
    now no rank returns before rank 0's manifest is written, and both exit cleanly."""
    mp.start_processes(
        _finishing_worker, args=(str(tmp_path), str(free_port())), nprocs=2, join=True, start_method="spawn"
    )
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)] == ["0 True", "0 True"]


def _sigterm_worker(rank: int, root: str, port: str) -> None:
    """Rank 1 joins and kills itself; rank 0 joins and waits outside any collective (as a rank
    computing its batch does) until torchrun's SIGTERM, sent here by the test."""
    import torch

    from transcoders import StalledRankError
    from transcoders import distributed as tdist

    os.environ.update(
        RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=port
    )
    torch.set_num_threads(1)
    tdist.init_from_env(60.0)
    if rank == 1:
        from torch.distributed import distributed_c10d

        distributed_c10d._get_default_store().wait(["transcoders/progress/0"])  # rank 0 has joined
        os.kill(os.getpid(), signal.SIGKILL)
    d = tdist.Dist(0, 2, "features")
    tdist.mark(d, "step 7")
    try:
        with tdist.naming_dead_ranks(d):
            Path(root, "ready").touch()
            time.sleep(120)
    except StalledRankError as e:
        Path(root, "error.txt").write_text(str(e))


def test_torchruns_sigterm_after_a_rank_died_names_it(tmp_path):
    """torchrun stops the other ranks with SIGTERM as soon as one is killed, often before their
    next collective fails: they ended silently; now the SIGTERM raises the line naming the dead rank."""
    ctx = mp.start_processes(
        _sigterm_worker, args=(str(tmp_path), str(free_port())), nprocs=2, join=False, start_method="spawn"
    )
    rank0, rank1 = ctx.processes
    try:
        rank1.join(120)  # dead (and reaped, as torchrun reaps it) before the SIGTERM
        for _ in range(1200):
            if (tmp_path / "ready").exists():
                break
            time.sleep(0.1)
        os.kill(rank0.pid, signal.SIGTERM)
        rank0.join(60)
        assert rank0.exitcode == 0
    finally:
        for p in ctx.processes:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
                p.join(10)
    assert (tmp_path / "error.txt").read_text() == (
        "rank 0 was stopped (SIGTERM) at step 7 after a rank died: "
        "rank 1 (last seen: joined; its process is gone)."
    )
