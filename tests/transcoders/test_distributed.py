"""Two CPU processes (gloo) train like one: data parallel and feature-sharded, PLT and CLT
(Matryoshka BatchTopK both ways; gated feature-sharded; feature-sharded TopK and BatchTopK too, and TopK's auxiliary loss on its own; data-parallel
BatchTopK, whose budget is the global batch's); a checkpoint written with 2 ranks resumes with 1
and with 2.

One spawn of 2 processes runs every case in one process group (starting processes is the
slow part); each case is compared with one process on the same global batches. Tolerance:
float32 training, `atol=1e-6, rtol=1e-5` on every weight (the ranks sum gradients / partial
reconstructions in another order than one process does; the observed gap, printed, is 1.5e-8 to 1.2e-7).
"""

import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp

from tests.transcoders.tc_helpers import CLI_ARGS, free_port, tiny_model
from transcoders import ConfigError
from transcoders.train import TrainConfig, train

CASES = {
    "plt-data": dict(kind="plt", activation="jumprelu", parallel="data"),
    "plt-data-cached": dict(kind="plt", activation="relu", parallel="data", cache_dir="CACHE"),
    "plt-data-topk": dict(kind="plt", activation="topk", parallel="data", k=4),  # the sparse TopK step
    "clt-data": dict(kind="clt", activation="jumprelu", parallel="data", skip=True),
    "plt-data-batchtopk": dict(kind="plt", activation="batchtopk", parallel="data", k=4),
    "clt-data-batchtopk-cached": dict(
        kind="clt", activation="batchtopk", parallel="data", k=4, skip=True, cache_dir="CACHE"
    ),
    "plt-features": dict(kind="plt", activation="jumprelu", parallel="features", skip=True),
    "clt-features": dict(kind="clt", activation="jumprelu", parallel="features"),
    "clt-features-relu": dict(kind="clt", activation="relu", parallel="features", preact_coef=1e-3),
    "plt-features-topk": dict(kind="plt", activation="topk", parallel="features", k=4, skip=True),
    "clt-features-batchtopk": dict(kind="clt", activation="batchtopk", parallel="features", k=4),
    # nested prefixes: width 8 on rank 0 alone, 20 across both ranks' features
    "plt-features-matryoshka": dict(
        kind="plt",
        activation="matryoshka_batchtopk",
        matryoshka_widths=(8, 20),
        parallel="features",
        k=4,
        skip=True,
    ),
    "clt-data-matryoshka": dict(
        kind="clt", activation="matryoshka_batchtopk", matryoshka_widths=(8, 20), parallel="data", k=4
    ),
    # gated: r_mag, b_mag split by feature; the auxiliary reconstruction summed over ranks
    "plt-features-gated": dict(kind="plt", activation="gated", parallel="features", skip=True),
    "clt-features-gated": dict(kind="clt", activation="gated", parallel="features"),
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
    _sharded_functions(rank, world, root)
    _data_functions(rank, world, root)
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


def function_inputs():
    """A CLT set of 32 features per layer and inputs for the sharded TopK functions (ties in `tied`)."""
    from tests.transcoders.tc_helpers import random_set

    g = torch.Generator().manual_seed(5)
    tcs = {a: random_set("clt", a, d_sae=32, seed=1) for a in ("topk", "batchtopk")}
    pre = torch.randn(16, 2, 32, generator=g)
    dead = torch.rand(2, 32, generator=g) < 0.4
    residual = torch.randn(16, 2, 32, generator=g)
    tied = torch.ones(3, 2, 32)  # every value equal: the lowest global indices win
    return tcs, pre, dead, residual, tied


def _sharded_functions(rank: int, world: int, root) -> None:
    """Sharded TopK, BatchTopK (training) and TopK's auxiliary loss on fixed inputs, saved per rank."""
    from transcoders import distributed as tdist

    d = tdist.Dist(rank, world, "features")
    tcs, pre, dead, residual, tied = function_inputs()
    cut = slice(rank * 16, (rank + 1) * 16)
    out = {}
    for act, full in tcs.items():
        tc = type(full)(tdist.local_config(full.cfg, d))
        state = tdist.shard_state(
            {f"tc.{k}": v for k, v in full.state_dict().items()}, full.feature_dims(), d
        )
        tc.load_state_dict({k[3:]: v for k, v in state.items()})
        tc.train()
        h = pre[..., cut].clone().requires_grad_(True)
        acts = tdist.rank_activation(tc, h, d)
        (acts * torch.arange(16.0)).sum().backward()
        out[f"{act}.acts"], out[f"{act}.grad"] = acts.detach(), h.grad
        if act == "batchtopk":  # the running threshold after that one training batch
            out["batchtopk.threshold"] = tc.threshold.clone()
        out[f"{act}.tied"] = tdist.rank_activation(tc, tied[..., cut], d)
        if act == "topk":
            h = pre[..., cut].clone().requires_grad_(True)
            loss = tdist.sharded_topk_aux_loss(tc, h, residual, dead[:, cut], 5, d)
            loss.backward()
            out["aux.loss"], out["aux.grad"] = loss.detach(), h.grad
    torch.save(out, root / f"functions{rank}.pt")


def data_tied() -> torch.Tensor:
    """4 tokens, 2 layers, 32 features; rank 0 holds tokens 0-1, rank 1 tokens 2-3. Equal values 1.0:
    features 0-3 of tokens 0-1 and all of tokens 2-3 (the rest 0.5), so a budget of 8 * 4 = 32 per
    layer keeps rank 0's 8 ones and features 0-23 of token 2 (lower global index first)."""
    tied = torch.full((4, 2, 32), 0.5)
    tied[:2, :, :4] = 1.0
    tied[2:] = 1.0
    return tied


def _data_functions(rank: int, world: int, root) -> None:
    """Data-parallel BatchTopK (training) on fixed inputs, rank r holding rows [r*n, (r+1)*n): saved per rank."""
    from transcoders import distributed as tdist

    d = tdist.Dist(rank, world, "data")
    tcs, pre, _, _, _ = function_inputs()
    tc = tcs["batchtopk"].train()
    rows = slice(rank * 8, (rank + 1) * 8)
    h = pre[rows].clone().requires_grad_(True)
    acts = tdist.rank_activation(tc, h, d)
    (acts * torch.arange(32.0)).sum().backward()
    out = {"acts": acts.detach(), "grad": h.grad, "threshold": tc.threshold.clone()}
    out["tied"] = tdist.rank_activation(tc, data_tied()[rank * 2 : (rank + 1) * 2], d)
    torch.save(out, root / f"data{rank}.pt")


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


def test_sharded_topk_functions_match_one_process(two_ranks):
    """Per token / per batch global top-k over both ranks' features = the one-process activation."""
    from transcoders.losses import topk_aux_loss

    tcs, pre, dead, residual, tied = function_inputs()
    ranks = [torch.load(two_ranks / f"functions{r}.pt") for r in range(2)]

    def both(key):
        return torch.cat([r[key] for r in ranks], -1)

    for act, tc in tcs.items():
        tc.train()
        h = pre.clone().requires_grad_(True)
        acts = tc.activation(h)
        (acts * torch.arange(16.0).repeat(2)).sum().backward()
        torch.testing.assert_close(both(f"{act}.acts"), acts.detach(), rtol=0, atol=0)
        torch.testing.assert_close(both(f"{act}.grad"), h.grad, rtol=0, atol=0)
        assert (acts[..., :16] > 0).any() and (acts[..., 16:] > 0).any()  # kept entries on both ranks
        # ties: the k lowest global indices are kept (all of them on rank 0 here)
        kept = both(f"{act}.tied") > 0
        k = tc.cfg.k
        if act == "topk":
            assert kept[..., :k].all() and not kept[..., k:].any()
        else:
            assert (
                kept.sum() == 3 * 2 * k
                and kept.reshape(-1, 2, 32).transpose(0, 1).reshape(2, -1)[:, : 3 * k].all()
            )
    torch.testing.assert_close(both("batchtopk.threshold"), tcs["batchtopk"].threshold)
    h = pre.clone().requires_grad_(True)
    loss = topk_aux_loss(tcs["topk"], h, residual, dead, 5)
    loss.backward()
    for r in ranks:
        torch.testing.assert_close(r["aux.loss"], loss.detach(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(both("aux.grad"), h.grad, atol=1e-6, rtol=1e-5)


def test_data_parallel_batchtopk_matches_one_process(two_ranks):
    """BatchTopK's budget over both ranks' rows = the one-process activation on the whole batch."""
    tcs, pre, _, _, _ = function_inputs()
    tc = tcs["batchtopk"].train()
    ranks = [torch.load(two_ranks / f"data{r}.pt") for r in range(2)]

    def both(key):
        return torch.cat([r[key] for r in ranks], 0)

    h = pre.clone().requires_grad_(True)
    acts = tc.activation(h)
    (acts * torch.arange(32.0)).sum().backward()
    torch.testing.assert_close(both("acts"), acts.detach(), rtol=0, atol=0)
    torch.testing.assert_close(both("grad"), h.grad, rtol=0, atol=0)
    assert (acts[:8] > 0).sum() != (acts[8:] > 0).sum()  # unequal shares: a per-rank budget cannot give them
    for r in ranks:
        torch.testing.assert_close(r["threshold"], tc.threshold, rtol=0, atol=0)
    want = torch.zeros(4, 2, 32, dtype=torch.bool)  # ties: the lower global index (token, feature) first
    want[:2, :, :4] = True
    want[2, :, :24] = True
    assert torch.equal(both("tied") > 0, want)


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

    check(Dist(0, 2, "features"), 128, 32)  # every activation (TopK's top-k is global across the shards)
    with pytest.raises(ConfigError, match="d_sae 33"):
        check(Dist(0, 2, "features"), 128, 33)
    with pytest.raises(ConfigError, match="batch_size 127"):
        check(Dist(0, 2, "data"), 127, 32)
    check(Dist(0, 2, "data"), 128, 32)


def torchrun(flags: list[str], out) -> subprocess.Popen:
    """`python -m torch.distributed.run FLAGS -m transcoders.train CLI_ARGS --out OUT`, started."""
    cmd = [sys.executable, "-m", "torch.distributed.run", *flags]
    cmd += ["-m", "transcoders.train", *CLI_ARGS, "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def saved_weights(out) -> dict:
    from safetensors.torch import load_file

    return load_file(str(out / "transcoders" / "weights.safetensors"))


@pytest.fixture(scope="module")
def one_process_cli(tmp_path_factory):
    """The weights `python -m transcoders.train CLI_ARGS` saves in one process."""
    from transcoders.train import main

    out = tmp_path_factory.mktemp("one")
    assert main([*CLI_ARGS, "--out", str(out)]) == 0
    return saved_weights(out)


def test_torchrun_cli_matches_one_process(tmp_path, one_process_cli):
    """The README's command: `python -m torch.distributed.run --standalone --nproc-per-node 2 -m transcoders.train ...`."""
    run = torchrun(["--standalone", "--nproc-per-node", "2"], tmp_path / "two")
    stdout, stderr = run.communicate(timeout=300)
    assert run.returncode == 0, stderr[-3000:]
    assert '"saved_to"' in stdout and stdout.count('"saved_to"') == 1  # rank 0 alone reports
    assert_same(saved_weights(tmp_path / "two"), one_process_cli)


@pytest.mark.slow  # ~11 s; test_torchrun_cli_matches_one_process runs torchrun by default
def test_torchrun_two_nodes_match_one_process(tmp_path, one_process_cli):
    """The README's multi-node command, with two "nodes" on this machine: `--nnodes 2 --node-rank 0|1
    --nproc-per-node 1 --master-addr 127.0.0.1 --master-port PORT` (torchrun's static rendezvous)."""
    port = str(free_port())
    flags = ["--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", port]
    out = tmp_path / "nodes"  # the nodes share a filesystem here; node 0 (global rank 0) writes
    nodes = [torchrun([*flags, "--node-rank", str(r)], out) for r in range(2)]
    try:
        done = [node.communicate(timeout=300) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    for node, (_, stderr) in zip(nodes, done, strict=True):
        assert node.returncode == 0, stderr[-3000:]
    assert done[0][0].count('"saved_to"') == 1 and '"saved_to"' not in done[1][0]
    assert_same(saved_weights(out), one_process_cli)


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
    [folder] = (tmp_path / "c").iterdir()
    assert sorted(p.name for p in folder.iterdir()) == [rank0.shard(0).name, "key.json"]
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
