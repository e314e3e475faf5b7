"""Feature-sharded AuxK (`distributed.sharded_topk_aux_loss`) on two CPU processes (gloo) where the dead
features are few or lopsided: fewer than `k_aux` dead features per rank (so `k = min(k_aux, dead count)`
must use the count over all ranks), and every dead feature on one rank (the other rank holds none, yet
must take part and contribute nothing).

Expected values: with at least `k_aux` >= the number of dead features, AuxK uses every dead feature,
so its loss is written out directly (`relu(h)` on the dead features, decoded, normalized MSE against
the residual), with no top-k; the lopsided case is compared with one process's `losses.topk_aux_loss`
on the unsharded set. Each dead feature gets a positive pre-activation, so that dropping one changes
the loss.
"""

import datetime

import torch
import torch.multiprocessing as mp

from tests.transcoders.tc_helpers import random_set
from transcoders.losses import topk_aux_loss

S, L, D, N = 32, 2, 32, 16  # features (16 per rank), layers, d_model, tokens
# dead features per layer, global indices (rank 0 holds 0-15, rank 1 16-31)
FEW = [[1, 7, 18, 30], [3, 9, 20, 25]]  # 2 per rank and layer, 4 in all: below k_aux = 5
ONE_RANK = [[17, 20, 28], [22]]  # all on rank 1; k_aux = 2 (layer 0 selects, layer 1 takes all)
CASES = {"few": (FEW, 5), "one_rank": (ONE_RANK, 2)}


def inputs(case: str):
    dead_lists, k_aux = CASES[case]
    g = torch.Generator().manual_seed(7)
    tc = random_set("clt", "topk", d_sae=S, d_model=D, seed=1)
    pre = torch.randn(N, L, S, generator=g)
    residual = torch.randn(N, L, D, generator=g)
    dead = torch.zeros(L, S, dtype=torch.bool)
    for layer, features in enumerate(dead_lists):
        dead[layer, features] = True
    pre = torch.where(dead, pre.abs() + 0.1, pre)  # every dead feature's pre-activation is positive
    return tc, pre, residual, dead, k_aux


def _worker(rank: int, world: int, root: str, case: str) -> None:
    import torch.distributed as dist

    from transcoders import distributed as tdist

    torch.set_num_threads(1)
    # a rank that skips a collective makes the other fail within a minute, not hang
    dist.init_process_group(
        "gloo",
        init_method=f"file://{root}/pg",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    d = tdist.Dist(rank, world, "features")
    cut = slice(rank * (S // world), (rank + 1) * (S // world))
    full, pre, residual, dead, k_aux = inputs(case)
    tc = type(full)(tdist.local_config(full.cfg, d))
    state = tdist.shard_state({f"tc.{k}": v for k, v in full.state_dict().items()}, full.feature_dims(), d)
    tc.load_state_dict({k[3:]: v for k, v in state.items()})
    h = pre[..., cut].clone().requires_grad_(True)
    loss = tdist.sharded_topk_aux_loss(tc, h, residual, dead[:, cut], k_aux, d)
    if loss.requires_grad:  # a rank's constant 0 has no graph (the tests then see its loss differ)
        loss.backward()
    grad = torch.zeros_like(h) if h.grad is None else h.grad
    torch.save({"loss": loss.detach(), "grad": grad}, f"{root}/rank{rank}.pt")
    dist.destroy_process_group()


def two_ranks(root, case: str) -> list[dict]:
    """Each rank's loss and gradient on its slice, one spawn of 2 processes per case."""
    mp.start_processes(_worker, args=(2, str(root), case), nprocs=2, join=True, start_method="spawn")
    return [torch.load(root / f"rank{r}.pt") for r in range(2)]


def test_fewer_dead_features_than_k_aux_per_rank_uses_them_all(tmp_path):
    ranks = two_ranks(tmp_path, "few")
    tc, pre, residual, dead, k_aux = inputs("few")
    assert int(dead.sum(-1).max()) < k_aux
    h = pre.clone().requires_grad_(True)
    aux_acts = h.relu() * dead  # every dead feature, no selection
    want = (tc.decode(aux_acts) - tc.b_dec - residual).pow(2).sum() / residual.pow(2).sum()
    want.backward()
    for r in ranks:
        torch.testing.assert_close(r["loss"], want.detach(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(torch.cat([r["grad"] for r in ranks], -1), h.grad, atol=1e-6, rtol=1e-5)
    assert (h.grad[..., 16:] != 0).any() and (h.grad[..., :16] != 0).any()  # dead features on both ranks


def test_all_dead_features_on_one_rank(tmp_path):
    ranks = two_ranks(tmp_path, "one_rank")
    tc, pre, residual, dead, k_aux = inputs("one_rank")
    assert not dead[:, :16].any() and dead[:, 16:].any()
    h = pre.clone().requires_grad_(True)
    want = topk_aux_loss(tc, h, residual, dead, k_aux)
    want.backward()
    assert want.item() > 0
    for r in ranks:
        torch.testing.assert_close(r["loss"], want.detach(), atol=1e-6, rtol=1e-5)
    grad = torch.cat([r["grad"] for r in ranks], -1)
    torch.testing.assert_close(grad, h.grad, atol=1e-6, rtol=1e-5)
    assert not grad[..., :16].any()  # rank 0 has no dead feature: no gradient there
    # layer 0 keeps the 2 largest of its 3 dead features per token, layer 1 its one
    assert ((grad[:, 0] != 0).sum(-1) == 2).all() and ((grad[:, 1] != 0).sum(-1) == 1).all()
