"""Two CPU processes (gloo) train like one: data parallel and feature-sharded, PLT and CLT; a
checkpoint written with 2 ranks resumes with 1 and with 2.

One spawn of 2 processes runs every case in one process group (starting processes is the
slow part); each case is compared with one process on the same global batches. Tolerance:
float32 training, `atol=1e-6, rtol=1e-5` on every weight (the ranks sum gradients / partial
reconstructions in another order than one process does; the observed gap, printed, is ~3e-8).
"""

import shutil
import sys

import pytest
import torch
import torch.multiprocessing as mp

from tests.transcoders.tc_helpers import tiny_model
from transcoders import ConfigError
from transcoders.train import TrainConfig, train

CASES = {
    "plt-data": dict(kind="plt", activation="jumprelu", parallel="data"),
    "plt-data-cached": dict(kind="plt", activation="relu", parallel="data", cache_dir="CACHE"),
    "plt-data-topk": dict(kind="plt", activation="topk", parallel="data", k=4),  # the sparse TopK step
    "clt-data": dict(kind="clt", activation="jumprelu", parallel="data", skip=True),
    "plt-features": dict(kind="plt", activation="jumprelu", parallel="features", skip=True),
    "clt-features": dict(kind="clt", activation="jumprelu", parallel="features"),
    "clt-features-relu": dict(kind="clt", activation="relu", parallel="features", preact_coef=1e-3),
}
STEPS = 6
ATOL, RTOL = 1e-6, 1e-5


def sequences():
    return torch.randint(0, 50, (300, 32), generator=torch.Generator().manual_seed(0))


def config(out, **kw):
    if kw.get("cache_dir") == "CACHE":  # shards beside the run (2 ranks: each produces and reads its own)
        kw["cache_dir"] = str(out) + "-cache"
    base = dict(
        d_sae=32,
        n_tokens=128 * STEPS,
        batch_size=128,
        block_tokens=512,
        lr=3e-3,
        sparsity_coef=1e-2,
        checkpoint_every=1000,
        out=str(out),
    )
    return TrainConfig(**{**base, **kw})


def _worker(rank: int, world: int, root: str) -> None:
    from pathlib import Path

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/pg", rank=rank, world_size=world)
    root = Path(root)
    model = tiny_model()
    for name, kw in CASES.items():
        tc, _ = train(config(root / "two" / name, **kw), model=model, sequences=sequences(), progress=False)
        if rank == 0:
            torch.save(tc.state_dict(), root / f"{name}.pt")
    # resume: stop after 3 steps with 2 ranks (sharded), copy the checkpoint for a 1-rank resume,
    # then finish with 2 ranks (data parallel: a checkpoint does not depend on how it was written)
    cfg = config(root / "resume2", kind="clt", activation="jumprelu", parallel="features")
    train(cfg, model=model, sequences=sequences(), progress=False, stop_after=3)
    if rank == 0:
        shutil.copytree(root / "resume2", root / "after3")
    dist.barrier()
    tc, _ = train(
        config(root / "resume2", kind="clt", activation="jumprelu", parallel="data"),
        model=model,
        sequences=sequences(),
        progress=False,
    )
    if rank == 0:
        torch.save(tc.state_dict(), root / "resume2.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp")
    mp.start_processes(_worker, args=(2, str(root)), nprocs=2, join=True, start_method="spawn")
    return root


def assert_same(got: dict, want: dict) -> float:
    gap = 0.0
    assert got.keys() == want.keys()
    for k, v in want.items():
        torch.testing.assert_close(got[k], v, atol=ATOL, rtol=RTOL, msg=lambda m, k=k: f"{k}: {m}")
        gap = max(gap, (got[k] - v).abs().max().item())
    print(f"max |two ranks - one| = {gap:.2e}", file=sys.stderr)
    return gap


@pytest.mark.parametrize("name", list(CASES))
def test_two_ranks_train_like_one(two_ranks, tmp_path, name):
    one, _ = train(
        config(tmp_path / "one", **CASES[name]), model=tiny_model(), sequences=sequences(), progress=False
    )
    two = torch.load(two_ranks / f"{name}.pt")
    assert_same(two, one.state_dict())


def test_checkpoint_from_two_ranks_resumes_with_one_and_two(two_ranks, tmp_path):
    kw = dict(kind="clt", activation="jumprelu")
    straight, _ = train(
        config(tmp_path / "s", **kw), model=tiny_model(), sequences=sequences(), progress=False
    )
    shutil.rmtree(two_ranks / "resume2")  # the checkpoint the 2 ranks wrote after 3 steps, back in place
    shutil.copytree(two_ranks / "after3", two_ranks / "resume2")
    one, info = train(
        config(two_ranks / "resume2", **kw), model=tiny_model(), sequences=sequences(), progress=False
    )
    assert info["steps"] == STEPS
    assert_same(one.state_dict(), straight.state_dict())
    assert_same(torch.load(two_ranks / "resume2.pt"), straight.state_dict())


def test_parallel_option_is_checked():
    with pytest.raises(ConfigError, match="parallel"):
        config("x", parallel="pipeline")


def test_sharding_refuses_what_it_cannot_do_exactly():
    from transcoders.distributed import Dist, check

    with pytest.raises(ConfigError, match="global top-k"):
        check(Dist(0, 2, "features"), 128, 32, "topk")
    with pytest.raises(ConfigError, match="d_sae 33"):
        check(Dist(0, 2, "features"), 128, 33, "relu")
    with pytest.raises(ConfigError, match="batch_size 127"):
        check(Dist(0, 2, "data"), 127, 32, "topk")
    check(Dist(0, 2, "data"), 128, 32, "topk")  # data parallel takes every activation


def test_torchrun_cli_matches_one_process(tmp_path):
    """The README's command: `python -m torch.distributed.run --standalone --nproc-per-node 2 -m transcoders.train ...`."""
    import os
    import subprocess

    from safetensors.torch import load_file

    from transcoders.train import main

    args = [
        "--kind",
        "plt",
        "--d-sae",
        "32",
        "--n-tokens",
        "1024",
        "--batch-size",
        "256",
        "--block-tokens",
        "1024",
    ]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "transcoders.train", *args, "--out", str(tmp_path / "two")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert '"saved_to"' in done.stdout and done.stdout.count('"saved_to"') == 1  # rank 0 alone reports
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    two = load_file(str(tmp_path / "two" / "transcoders" / "weights.safetensors"))
    one = load_file(str(tmp_path / "one" / "transcoders" / "weights.safetensors"))
    assert_same(two, one)


def test_ranks_produce_and_read_their_own_shards(tmp_path):
    """ActivationStore step 5, in one process: rank r builds blocks b % 2 == r and reads its half of each batch."""
    from transcoders.activation_store import ActivationStore
    from transcoders.train import transcoder_config

    model = tiny_model()
    tcfg = transcoder_config(TrainConfig(), model)
    kw = dict(batch_size=64, block_tokens=256, seed=3, cache_dir=tmp_path / "c")
    rank0 = ActivationStore(model, tcfg, sequences(), rank=0, world=2, wait_s=1.0, **kw)
    rank1 = ActivationStore(model, tcfg, sequences(), rank=1, world=2, wait_s=1.0, **kw)
    one = ActivationStore(model, tcfg, sequences(), batch_size=64, block_tokens=256, seed=3)
    r0 = rank0.batches(0)
    next(r0)
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["block_00000.safetensors"]
    with pytest.raises(TimeoutError, match="rank 1"):  # block 1 is rank 1's to produce
        list(zip(range(8), r0, strict=False))
    r1 = list(zip(range(8), rank1.batches(0), strict=False))  # produces block 1
    r0 = list(zip(range(8), rank0.batches(0), strict=False))
    for (_j, (x0, y0)), (_, (x1, y1)), (_, (x, y)) in zip(
        r0, r1, zip(range(8), one.batches(0), strict=False), strict=True
    ):
        assert x0.shape[0] == 32
        torch.testing.assert_close(torch.cat([x0, x1]), x, rtol=0, atol=0)
        torch.testing.assert_close(torch.cat([y0, y1]), y, rtol=0, atol=0)
