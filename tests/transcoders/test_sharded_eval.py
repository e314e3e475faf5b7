"""Feature-sharded evaluation and saving (issue 23, part 2): each rank evaluates and saves only its
slice, and the results are those of the whole set in one process.

Two gloo ranks each take their half of a random set's features (`shard_state`) and evaluate it as
`distributed.FeatureShard`: held-out FVU, L0 and dead fractions (`reconstruction_metrics`), CE loss
recovered and KL with the set spliced in (`replacement_metrics`) and with another set spliced in
beside it (`spliced_metrics`), for a CLT (JumpReLU, skip), a PLT (TopK: the k largest over both
ranks' features), an attention SAE (BatchTopK's inference threshold) and a gated PLT. Expected values: the same
functions on the whole set in this process. While a rank evaluates, no live tensor has the full
feature width. Then `train.save_and_evaluate` (what the CLI runs): the set rank 0 writes, gathered
one tensor at a time, loads back as the whole set, and the metrics are `evaluate` of the whole set.

Tolerance: the ranks sum partial reconstructions in another order than one process's decode, so
values agree to float32 rounding (`rel=1e-5, abs=1e-6`); counts (L0, dead features) agree exactly.
CE loss recovered is checked as its formula on the CE values so checked: its denominator
`CE_zero - CE_orig` is small for the tiny model's attention SAE (0.02), which turns a 3e-7 gap in
`CE_replaced` into 2e-5.
"""

import gc
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from tests.transcoders.tc_helpers import random_set, tiny_model
from transcoders import build_transcoders
from transcoders import distributed as tdist
from transcoders.formats.native import load_native, save_native, save_native_streamed
from transcoders.metrics import reconstruction_metrics, replacement_metrics, spliced_metrics
from transcoders.sites import collect
from transcoders.train import TrainConfig, evaluate

D_SAE = 48  # no other axis of the tiny model, its tokens or the sets has this length
CASES = {
    "clt-jumprelu-skip": dict(kind="clt", activation="jumprelu", skip=True, seed=1),
    "plt-topk": dict(kind="plt", activation="topk", seed=2),
    "sae-batchtopk": dict(kind="sae", activation="batchtopk", seed=3),
    "plt-gated": dict(kind="plt", activation="gated", seed=4),  # its per-layer GateParams on each rank
}
HOOK = "blocks.{layer}.hook_attn_out"  # random_set's SAE site
EXACT = ("l0", "l0_mean", "dead_fraction", "dead_fraction_total", "n_tokens")


def whole_set(case: str):
    tc = random_set(d_sae=D_SAE, **CASES[case]).eval()
    if tc.cfg.activation == "batchtopk":  # an inference threshold that lets some features through
        with torch.no_grad():
            tc.threshold.copy_(
                0.05 + 0.1 * torch.rand(tc.threshold.shape, generator=torch.Generator().manual_seed(5))
            )
    return tc


def partner(case: str):
    """A set spliced in beside the evaluated one, writing other hooks."""
    other = "plt" if CASES[case]["kind"] == "sae" else "sae"
    return random_set(other, "relu", d_sae=16, seed=9).eval()


def tokens() -> torch.Tensor:
    return torch.randint(0, 50, (6, 32), generator=torch.Generator().manual_seed(3))


def metrics_of(model, tc, other) -> dict:
    """Every metric of metrics.py for `tc` (a whole set, or a rank's `FeatureShard`)."""
    toks = tokens()
    x, y = collect(model, toks, tc.cfg)
    return {
        "reconstruction": reconstruction_metrics(tc, x[:, 1:].flatten(0, 1), y[:, 1:].flatten(0, 1), 7),
        "replacement": replacement_metrics(model, tc, toks, 4),
        "spliced": spliced_metrics(model, [tc, other], toks, 4),
    }


def my_slice(tc, d: tdist.Dist):
    part = build_transcoders(tdist.local_config(tc.cfg, d))
    part.load_state_dict(tdist.shard_state(tc.state_dict(), tc.feature_dims(), d))
    return part.eval()


class Watched(tdist.FeatureShard):
    """A `FeatureShard` that records, at every call, the shapes of live tensors of the full width."""

    wide: set

    def _look(self):
        with warnings.catch_warnings():  # isinstance on some modules' lazy attributes warns
            warnings.simplefilter("ignore")
            seen = {
                tuple(o.shape) for o in gc.get_objects() if isinstance(o, torch.Tensor) and D_SAE in o.shape
            }
        self.wide |= seen

    def forward(self, x):
        self._look()
        return super().forward(x)

    __call__ = forward

    def decode_layer(self, acts, layer):
        self._look()
        return super().decode_layer(acts, layer)


def corpus_file(root: Path) -> Path:
    path = root / "held_out.npy"
    if not path.exists():
        np.save(path, torch.randint(0, 50, (80, 32), generator=torch.Generator().manual_seed(4)).numpy())
    return path


def train_config(case: str, root: Path, **kw) -> TrainConfig:
    """The options `evaluate` reads: the held-out tokens are the last 64 rows of the corpus file."""
    hook = HOOK if CASES[case]["kind"] == "sae" else ""
    return TrainConfig(kind=CASES[case]["kind"], d_sae=D_SAE, hook=hook, corpus=str(corpus_file(root)), **kw)


def _worker(rank: int, world: int, root: str) -> None:
    import torch.distributed as dist

    from transcoders.train import save_and_evaluate

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/pg", rank=rank, world_size=world)
    root = Path(root)
    d = tdist.Dist(rank, world, "features")
    model = tiny_model()
    report = {}
    for case in CASES:
        whole = whole_set(case)
        shard = Watched(my_slice(whole, d), d)
        del whole  # from here on the rank holds only its slice
        shard.wide = set()
        got = metrics_of(model, shard, partner(case))
        report[case] = {"metrics": got, "wide": sorted(shard.wide)}
        # what the CLI runs at the end of feature-sharded training: save (gathered to rank 0), evaluate
        cfg = train_config(case, root, save_to=str(root / case), parallel="features")
        _, metrics = save_and_evaluate(model, shard.tc, cfg, d)
        report[case]["cli_metrics"] = metrics
    (root / f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("shardeval")
    corpus_file(root)
    mp.start_processes(_worker, args=(2, str(root)), nprocs=2, join=True, start_method="spawn")
    return root, [json.loads((root / f"rank{r}.json").read_text()) for r in range(2)]


def assert_same(got: dict, want: dict, where: str) -> None:
    assert got.keys() == want.keys(), where
    for k, v in want.items():
        if isinstance(v, dict):
            assert_same(got[k], v, f"{where}.{k}")
        elif k == "ce_loss_recovered":  # its denominator may be small (0.02 in the SAE case)
            ce = (got["ce_zero_ablated"] - got["ce_replaced"]) / (got["ce_zero_ablated"] - got["ce_orig"])
            assert got[k] == pytest.approx(ce, rel=1e-12), f"{where}.{k}"
        elif isinstance(v, str) or k in EXACT:
            assert got[k] == v, f"{where}.{k}: {got[k]} != {v}"
        else:
            assert got[k] == pytest.approx(v, rel=1e-5, abs=1e-6), f"{where}.{k}"


@pytest.mark.slow  # the two_ranks fixture takes ~27 s
@pytest.mark.parametrize("case", list(CASES))
def test_sharded_metrics_are_the_whole_sets(two_ranks, case):
    _, ranks = two_ranks
    want = metrics_of(tiny_model(), whole_set(case), partner(case))
    assert want["reconstruction"]["l0_mean"] > 0 and want["reconstruction"]["dead_fraction_total"] < 1
    for rank, report in enumerate(ranks):
        assert_same(report[case]["metrics"], want, f"rank {rank}")


@pytest.mark.slow  # the two_ranks fixture takes ~27 s
@pytest.mark.parametrize("case", list(CASES))
def test_no_rank_holds_the_whole_set_while_evaluating(two_ranks, case):
    _, ranks = two_ranks
    for report in ranks:
        assert report[case]["wide"] == []


@pytest.mark.slow  # the two_ranks fixture takes ~27 s
@pytest.mark.parametrize("case", list(CASES))
def test_the_saved_set_is_the_whole_set_and_its_metrics_are_its_own(two_ranks, case):
    root, ranks = two_ranks
    whole = whole_set(case)
    saved = load_native(root / case).eval()
    assert saved.cfg == whole.cfg
    state = saved.state_dict()
    for k, v in whole.state_dict().items():
        assert torch.equal(state[k], v), k
    cfg = train_config(case, root)
    want = evaluate(tiny_model(), whole, cfg)
    for rank, report in enumerate(ranks):
        assert_same(report[case]["cli_metrics"], want, f"rank {rank}")


def test_a_streamed_save_reads_back_as_save_natives(tmp_path):
    """`save_native_streamed` (one tensor at a time) writes what `save_native` (the whole set) does."""
    tc = random_set("clt", "jumprelu", skip=True, d_sae=D_SAE, seed=6)
    state = tc.state_dict()
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    save_native(tc, tmp_path / "whole")
    save_native_streamed(tc.cfg, shapes, iter(sorted(state.items())), tmp_path / "streamed")
    assert (tmp_path / "streamed/config.json").read_text() == (tmp_path / "whole/config.json").read_text()
    a, b = load_native(tmp_path / "whole").state_dict(), load_native(tmp_path / "streamed").state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="expected tensor"):
        save_native_streamed(tc.cfg, shapes, iter(sorted(state.items(), reverse=True)), tmp_path / "bad")
