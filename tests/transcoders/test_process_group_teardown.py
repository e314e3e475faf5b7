"""Destroying the process group ends it (transcoders/distributed.py, step 2).

The CLI joins the group (`init_from_env`) and then loads the model, which imports transformer_lens,
which imports `torch.distributed.nn`; imported while a group exists, that module keeps the group as
its functions' default `group`, so `destroy_process_group` left gloo's threads running until
interpreter exit, where a rank could abort (SIGABRT, "terminate called without an active
exception") after a run that succeeded. Two gloo ranks here do what the CLI does, in that order.

Expected values: the kernel's list of each process's threads (/proc/self/task/*/comm): gloo's
threads are there while the group is, and none is left after `destroy_process_group`.

This module imports nothing of transformer_lens or transcoders at its top: a spawned rank imports
it first, and must start as `python -m transcoders.train` does.
"""

import json
import os
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from tests.transcoders.tc_helpers import free_port

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads Linux's /proc")


def gloo_threads() -> list[str]:
    tasks = Path("/proc/self/task")
    names = [(t / "comm").read_text().strip() for t in tasks.iterdir()]
    return sorted(n for n in names if "gloo" in n)


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    import torch
    import torch.distributed as dist

    from transcoders import distributed as tdist
    from transcoders.train import run  # noqa: F401  what `python -m transcoders.train` imports first

    torch.set_num_threads(1)
    assert tdist.init_from_env(timeout_s=60)
    import transformer_lens  # noqa: F401  the CLI's model, loaded after joining

    x = torch.ones(3)
    dist.all_reduce(x)
    during = gloo_threads()
    dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(
        json.dumps({"sum": x.tolist(), "during": during, "after": gloo_threads()})
    )


@pytest.mark.slow  # ~11 s: two ranks start, check their threads and stop
def test_destroying_the_group_ends_its_threads(tmp_path):
    mp.start_processes(
        _worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True, start_method="spawn"
    )
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["sum"] == [2.0, 2.0, 2.0]
        assert got["during"], "no gloo thread seen while the group exists: this check sees nothing"
        assert got["after"] == [], f"rank {rank}: {got['after']} still run after destroy_process_group"
