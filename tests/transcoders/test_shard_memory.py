"""Feature-sharded training divides memory (issue 23, part 2): each rank creates, holds and
checkpoints only its slice of the features, and a checkpoint reads back as any rank's slice.

- `uniform_slice` / `init_weights(shard=...)`: a rank's initialization is the slice of one
  process's, drawn without the rest (expected values: the one-process draw, sliced).
- Checkpoints: n ranks write n files of their own features; read as rank r of m (m = 1, 2, 3) they
  give the slices of the whole state (expected: the whole state, sliced by `shard_state`).
- Two gloo ranks training a CLT: at every optimizer step each rank's parameters and Adam state
  are half of the sharded elements (plus the replicated ones), no live tensor has the full feature
  width, the checkpoint is one file per rank holding half the features, rank 1 returns its slice
  and rank 0 the gathered set; a one-process checkpoint resumes on the 2 ranks to the one-process
  weights.
"""

import gc
import json
import threading

import pytest
import torch
import torch.multiprocessing as mp

from tests.transcoders.tc_helpers import random_set, tiny_model
from transcoders import ConfigError, build_transcoders
from transcoders import distributed as tdist
from transcoders.base import uniform_slice
from transcoders.build import feature_dims_of
from transcoders.checkpoint import read_checkpoint, resume_folder, state_tensors, write_checkpoint
from transcoders.train import TrainConfig, train

D_SAE = 48  # no other axis of the tiny model, its batches or the set has this length
STEPS = 6


@pytest.mark.parametrize(("shape", "axis"), [((3, 5, 4), 2), ((4, 3, 5), 1), ((4, 3, 5), 0), ((7,), 0)])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_uniform_slice_is_the_slice_of_the_full_draw(shape, axis, world, monkeypatch):
    monkeypatch.setattr("transcoders.base.RAND_CHUNK", 4)  # draws split across and within rows
    full_shape = list(shape)
    full_shape[axis] *= world
    g = torch.Generator().manual_seed(1)
    full, after = torch.rand(full_shape, generator=g), torch.rand(3, generator=g)
    for rank in range(world):
        g = torch.Generator().manual_seed(1)
        got = uniform_slice(shape, axis, rank, world, g)
        assert torch.equal(got, full.chunk(world, axis)[rank])
        assert torch.equal(torch.rand(3, generator=g), after)  # the generator ends where the full draw does


def test_uniform_slice_at_full_chunk_size():
    """The same with draws of RAND_CHUNK values (vectorized kernels could draw large tensors differently)."""
    from transcoders.base import RAND_CHUNK

    shape = (2, RAND_CHUNK + 3)
    full = torch.rand(2, 2 * shape[1], generator=torch.Generator().manual_seed(4))
    for rank in range(2):
        got = uniform_slice(shape, 1, rank, 2, torch.Generator().manual_seed(4))
        assert torch.equal(got, full.chunk(2, 1)[rank])


@pytest.mark.parametrize("kind", ["plt", "clt", "sae"])
def test_a_ranks_initialization_is_its_slice_of_one_process(kind):
    whole = random_set(kind, d_sae=D_SAE, seed=0)
    whole = build_transcoders(whole.cfg).init_weights(torch.Generator().manual_seed(7))
    full_state = {f"tc.{k}": v for k, v in whole.state_dict().items()}
    for world in (2, 3):
        for rank in range(world):
            d = tdist.Dist(rank, world, "features")
            part = build_transcoders(tdist.local_config(whole.cfg, d))
            part.init_weights(torch.Generator().manual_seed(7), shard=(rank, world))
            want = tdist.shard_state(full_state, whole.feature_dims(), d)
            for k, v in part.state_dict().items():
                assert torch.equal(v, want[f"tc.{k}"]), (world, rank, k)


def adam_state(tc):
    """Named checkpoint tensors of `tc` after one Adam step (moments filled)."""
    opt = torch.optim.Adam(tc.parameters(), lr=1e-2)
    sum(p.pow(2).sum() for p in tc.parameters()).backward()
    opt.step()
    L = tc.n_layers
    scales = {"in": torch.rand(L) + 0.5, "out": torch.rand(L) + 0.5}
    return state_tensors(tc, opt, scales, torch.arange(L * tc.d_sae, dtype=torch.float32).reshape(L, -1))


def test_two_rank_files_read_back_as_any_ranks_slice(tmp_path):
    whole = random_set("clt", "jumprelu", skip=True, d_sae=D_SAE, seed=2)
    tensors, order, groups = adam_state(whole)
    cfg = TrainConfig(kind="clt", d_sae=D_SAE)
    sync = threading.Barrier(2)

    def write(rank):  # two "ranks" as threads, each with its own slice
        mine = tdist.shard_state(tensors, whole.feature_dims(), tdist.Dist(rank, 2, "features"))
        write_checkpoint(tmp_path / "ckpt", mine, 5, cfg, whole.cfg, order, groups, (rank, 2), sync.wait)

    threads = [threading.Thread(target=write, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    folder = resume_folder(tmp_path / "ckpt")
    assert sorted(p.name for p in folder.iterdir()) == [
        "meta.json",
        "state.0-of-2.safetensors",
        "state.1-of-2.safetensors",
    ]
    assert json.loads((folder / "meta.json").read_text())["shards"] == 2
    for world in (1, 2, 3):
        for rank in range(world):
            meta, got = read_checkpoint(folder, (rank, world))
            want = tdist.shard_state(tensors, whole.feature_dims(), tdist.Dist(rank, world, "features"))
            assert meta["step"] == 5 and got.keys() == want.keys()
            for k, v in want.items():
                assert torch.equal(got[k], v), (world, rank, k)


def test_a_rank_that_does_not_see_the_checkpoint_folder_says_so(tmp_path):
    """Ranks on filesystems of their own (here: other folders) cannot write one checkpoint."""
    whole = random_set("plt", d_sae=D_SAE, seed=2)
    tensors, order, groups = adam_state(whole)
    cfg = TrainConfig(kind="plt", d_sae=D_SAE)
    sync = threading.Barrier(2, timeout=60)
    errors = {}

    def write(rank):
        mine = tdist.shard_state(tensors, whole.feature_dims(), tdist.Dist(rank, 2, "features"))
        folder = tmp_path / f"node{rank}" / "ckpt"
        try:
            write_checkpoint(folder, mine, 5, cfg, whole.cfg, order, groups, (rank, 2), sync.wait)
        except (ConfigError, threading.BrokenBarrierError) as e:
            errors[rank] = e
            sync.abort()  # as torchrun stops the other ranks when one fails

    threads = [threading.Thread(target=write, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert isinstance(errors[1], ConfigError) and "filesystem every rank sees" in str(errors[1])
    assert not (tmp_path / "node0" / "ckpt").exists()  # nothing half-written replaced a checkpoint


# ---------------------------------------------------------------------- two ranks training
def sequences():
    return torch.randint(0, 50, (300, 32), generator=torch.Generator().manual_seed(0))


def config(out, **kw) -> TrainConfig:
    base = dict(
        kind="clt", d_sae=D_SAE, n_tokens=128 * STEPS, batch_size=128, block_tokens=512, lr=3e-3,
        sparsity_coef=1e-2, checkpoint_every=3, parallel="features", out=str(out),
    )  # fmt: skip
    return TrainConfig(**{**base, **kw})


def _held(opt) -> dict:
    """What a rank holds at an optimizer step: parameter and Adam-moment elements, and the shapes of
    live tensors with an axis of the full feature width."""
    moments = sum(v.numel() for st in opt.state.values() for k, v in st.items() if k != "step")
    params = sum(p.numel() for g in opt.param_groups for p in g["params"])
    wide = {tuple(o.shape) for o in gc.get_objects() if isinstance(o, torch.Tensor) and D_SAE in o.shape}
    return {"params": params, "moments": moments, "wide": sorted(wide)}


def _worker(rank: int, world: int, root: str) -> None:
    from pathlib import Path

    import torch.distributed as dist
    from safetensors import safe_open
    from torch.optim.optimizer import register_optimizer_step_post_hook

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/pg", rank=rank, world_size=world)
    root = Path(root)
    seen = []
    register_optimizer_step_post_hook(lambda opt, args, kwargs: seen.append(_held(opt)))
    tc, _ = train(
        config(root / "two"), model=tiny_model(), sequences=sequences(), progress=False, stop_after=3
    )
    ckpt = root / "two" / "checkpoint"
    files = {}
    for f in sorted(ckpt.glob("state*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            files[f.name] = {k: list(h.get_slice(k).get_shape()) for k in h.keys()}  # noqa: SIM118
    report = {"files": files, "returned_d_sae": tc.d_sae, "returned_W_enc": list(tc.W_enc.shape)}
    del tc  # rank 0's gathered set: not part of the next run
    # the one-process checkpoint at step 3 (the fixture's), resumed and finished by the 2 ranks
    resumed, info = train(config(root / "from1"), model=tiny_model(), sequences=sequences(), progress=False)
    if rank == 0:
        torch.save(resumed.state_dict(), root / "from1.pt")
    report.update(held=seen, resumed_steps=info["steps"])
    (root / f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("shardmem")
    one = config(root / "from1", parallel="data")  # one process: no process group here
    train(one, model=tiny_model(), sequences=sequences(), progress=False, stop_after=3)
    mp.start_processes(_worker, args=(2, str(root)), nprocs=2, join=True, start_method="spawn")
    return root, [json.loads((root / f"rank{r}.json").read_text()) for r in range(2)]


def set_sizes(cfg: TrainConfig) -> tuple[int, int]:
    """(elements with a feature axis, replicated elements) of the full set's parameters."""
    from transcoders.train import transcoder_config

    full = build_transcoders(transcoder_config(cfg, tiny_model()))
    full.nonlinearity.begin_training(full)
    sharded = sum(
        p.numel() for n, p in full.named_parameters() if tdist.feature_dim(n, full.feature_dims()) is not None
    )
    return sharded, sum(p.numel() for p in full.parameters()) - sharded


def test_each_rank_holds_only_its_slice_while_training(two_ranks):
    _, ranks = two_ranks
    sharded, replicated = set_sizes(config("x"))
    for report in ranks:
        assert len(report["held"]) == 6  # 3 steps, then 3 more resumed from one process's checkpoint
        for i, held in enumerate(report["held"]):
            assert held["wide"] == [], (
                f"step {i}: a tensor of the full feature width is alive during training"
            )
            assert held["params"] == sharded // 2 + replicated
            assert held["moments"] == 2 * (sharded // 2 + replicated)


def test_each_rank_checkpoints_only_its_slice(two_ranks):
    _, ranks = two_ranks
    files = ranks[0]["files"]
    assert ranks[1]["files"] == files and sorted(files) == [
        "state.0-of-2.safetensors",
        "state.1-of-2.safetensors",
    ]
    from transcoders.train import transcoder_config

    dims = feature_dims_of(transcoder_config(config("x"), tiny_model()))
    for name, shapes in files.items():
        for k, shape in shapes.items():
            dim = tdist.feature_dim(k, dims)
            assert dim is None or shape[dim] == D_SAE // 2, (name, k, shape)
        replicated = [k for k in shapes if tdist.feature_dim(k, dims) is None]
        assert bool(replicated) == (name == "state.0-of-2.safetensors")  # rank 0 alone keeps those


def test_rank_0_alone_gets_the_full_set(two_ranks):
    _, ranks = two_ranks
    assert ranks[0]["returned_d_sae"] == D_SAE and ranks[1]["returned_d_sae"] == D_SAE // 2
    assert ranks[1]["returned_W_enc"] == [2, 32, D_SAE // 2]


def test_a_one_process_checkpoint_resumes_on_two_ranks(two_ranks, tmp_path):
    root, ranks = two_ranks
    one, _ = train(
        config(tmp_path / "one", parallel="data"), model=tiny_model(), sequences=sequences(), progress=False
    )
    assert all(r["resumed_steps"] == STEPS for r in ranks)
    got = torch.load(root / "from1.pt")
    for k, v in one.state_dict().items():
        torch.testing.assert_close(got[k], v, atol=1e-6, rtol=1e-5, msg=lambda m, k=k: f"{k}: {m}")
