"""Faults of a distributed run (gloo on localhost): a stalled rank stops the run in bounded time
with a message naming it, instead of gloo's 30-minute wait in silence."""

import os
import signal
import time
from pathlib import Path

import torch.multiprocessing as mp

from tests.transcoders.tc_helpers import CLI_ARGS, free_port


def _stalling_worker(rank: int, root: str, port: str) -> None:
    """torchrun's environment by hand; rank 1 joins the group and then stops itself (SIGSTOP),
    as a hung or suspended process would; rank 0 runs the CLI with --dist-timeout 2."""
    import torch

    from transcoders import StalledRankError
    from transcoders import distributed as tdist
    from transcoders.train import main

    os.environ.update(
        RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=port
    )
    torch.set_num_threads(1)
    if rank == 1:
        tdist.init_from_env(2.0)
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    try:
        main([*CLI_ARGS, "--parallel", "features", "--dist-timeout", "2", "--out", f"{root}/run"])
    except StalledRankError as e:
        Path(root, "error.txt").write_text(str(e))


def test_a_stalled_rank_stops_the_run_naming_it(tmp_path):
    ctx = mp.start_processes(
        _stalling_worker, args=(str(tmp_path), str(free_port())), nprocs=2, join=False, start_method="spawn"
    )
    rank0, rank1 = ctx.processes
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
    message = (tmp_path / "error.txt").read_text()
    assert "rank 0 waited more than 2 s in a collective" in message
    assert "not answering: rank 1 (last seen: joined)" in message and "--dist-timeout" in message
    assert not (tmp_path / "run" / "transcoders").exists()
    print(f"stalled run stopped after {elapsed:.1f} s (model load included)")


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


def test_ranks_end_together_after_rank_0_evaluates(tmp_path):
    """Rank 1 used to leave (destroying its end of the process group) while rank 0 still evaluated;
    now no rank returns before rank 0's manifest is written, and both exit cleanly."""
    mp.start_processes(
        _finishing_worker, args=(str(tmp_path), str(free_port())), nprocs=2, join=True, start_method="spawn"
    )
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)] == ["0 True", "0 True"]
