"""Training: the loss falls, folding is exact, resume reproduces, NaN stops with the documented error."""

import dataclasses
import itertools

import pytest
import torch

from tests.transcoders.tc_helpers import tiny_model
from transcoders import ConfigError, NonFiniteError
from transcoders.activation_store import ActivationStore, pack_sequences
from transcoders.checkpoint import load_checkpoint
from transcoders.metrics import reconstruction_metrics, replacement_metrics
from transcoders.sites import collect
from transcoders.train import TrainConfig, build_parser, train, transcoder_config


def random_sequences(n=1200, n_ctx=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 50, (n, n_ctx), generator=g)


def small_cfg(tmp_path, **kw):
    base = dict(
        kind="plt",
        d_sae=64,
        n_tokens=256 * 120,
        batch_size=256,
        block_tokens=2048,
        lr=3e-3,
        sparsity_coef=1e-3,
        out=str(tmp_path / "run"),
        checkpoint_every=40,
    )
    base.update(kw)
    return TrainConfig(**base)


def held_out(model, tc_cfg):
    x, y = collect(model, random_sequences(20, seed=99), tc_cfg)
    return x[:, 1:].flatten(0, 1), y[:, 1:].flatten(0, 1)


@pytest.mark.parametrize(
    "kind, activation",
    [("plt", "jumprelu"), ("clt", "jumprelu"), ("plt", "topk"), ("plt", "batchtopk"), ("sae", "relu")],
)
def test_training_reduces_reconstruction_error(tmp_path, kind, activation):
    model = tiny_model()
    hook = "blocks.{layer}.hook_attn_out" if kind == "sae" else ""
    cfg = small_cfg(tmp_path, kind=kind, activation=activation, hook=hook, k=8)
    from transcoders import build_transcoders

    untrained = build_transcoders(transcoder_config(cfg, model)).init_weights(
        torch.Generator().manual_seed(0)
    )
    x, y = held_out(model, untrained.cfg)
    before = reconstruction_metrics(untrained, x, y)["fvu_mean"]
    tc, info = train(cfg, model=model, sequences=random_sequences(), progress=False)
    after = reconstruction_metrics(tc, x, y)
    assert info["steps"] == 120
    assert after["fvu_mean"] < 0.5 * min(before, 1.0), (before, after["fvu_mean"])
    assert after["l0_mean"] > 0
    if activation == "batchtopk":  # the inference threshold keeps about k per token
        assert not tc.training and 0.5 * 8 < after["l0_mean"] < 2 * 8, after["l0_mean"]


def test_saved_weights_act_on_raw_activations(tmp_path):
    """The returned set (scales folded in) on raw x equals the checkpointed one on normalized x."""
    model = tiny_model()
    cfg = small_cfg(tmp_path, n_tokens=256 * 30)
    tc, _ = train(cfg, model=model, sequences=random_sequences(), progress=False)
    from transcoders import build_transcoders

    raw = build_transcoders(tc.cfg)
    opt = torch.optim.Adam(raw.parameters())
    _, scales, _ = load_checkpoint(tmp_path / "run" / "checkpoint", raw, opt)
    x, y = held_out(model, tc.cfg)
    normalized = raw(x / scales["in"][:, None])
    folded = tc(x)
    torch.testing.assert_close(folded.acts, normalized.acts, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(folded.out, normalized.out * scales["out"][:, None], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(scales["in"], torch.ones_like(scales["in"]))  # the test means something


def test_resume_reproduces_an_uninterrupted_run(tmp_path):
    model = tiny_model()
    seqs = random_sequences()
    straight, _ = train(
        small_cfg(tmp_path / "a", n_tokens=256 * 60), model=model, sequences=seqs, progress=False
    )
    cfg = small_cfg(tmp_path / "b", n_tokens=256 * 60)
    partial, info = train(cfg, model=model, sequences=seqs, progress=False, stop_after=25)
    assert info == {"stopped_at": 25}
    resumed, info = train(cfg, model=model, sequences=seqs, progress=False)
    assert info["steps"] == 60
    for k, v in straight.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[k], v, rtol=0, atol=0)


def test_resume_refuses_a_different_config(tmp_path):
    model = tiny_model()
    train(
        small_cfg(tmp_path, n_tokens=256 * 20),
        model=model,
        sequences=random_sequences(),
        progress=False,
        stop_after=5,
    )
    with pytest.raises(ConfigError, match="sparsity_coef"):
        train(
            small_cfg(tmp_path, n_tokens=256 * 20, sparsity_coef=0.5),
            model=model,
            sequences=random_sequences(),
        )


def test_auxk_coef_weights_the_auxiliary_loss(tmp_path, monkeypatch):
    """With features dead after 2 steps, AuxK changes the weights, by its weight; `auxk_coef=0` gives
    exactly the run in which no feature is ever dead (AuxK off, its work skipped); a negative weight is
    refused."""
    import transcoders.trainer as trainer_module

    model, seqs = tiny_model(), random_sequences()

    def run(name, dead_tokens, **kw):
        monkeypatch.setattr(trainer_module, "DEAD_TOKENS", dead_tokens)
        cfg = small_cfg(tmp_path / name, activation="topk", k=2, n_tokens=256 * 30, **kw)
        return train(cfg, model=model, sequences=seqs, progress=False)[0].state_dict()

    never_dead = run("never", 10**12)
    with_aux = run("aux", 512)
    without = run("off", 512, auxk_coef=0.0)
    heavier = run("heavy", 512, auxk_coef=1.0)
    for k, v in never_dead.items():
        torch.testing.assert_close(without[k], v, rtol=0, atol=0)
    assert not torch.equal(with_aux["W_enc"], never_dead["W_enc"])
    assert not torch.equal(heavier["W_enc"], with_aux["W_enc"])  # the weight is applied
    with pytest.raises(ConfigError, match="auxk_coef"):
        small_cfg(tmp_path, auxk_coef=-1.0)


def test_nan_activations_stop_training_and_keep_checkpoint(tmp_path):
    model = tiny_model()
    seqs = random_sequences()
    cfg = small_cfg(tmp_path, n_tokens=256 * 60, checkpoint_every=8)
    train(cfg, model=model, sequences=seqs, progress=False, stop_after=8)  # block 0 = batches 0..7
    ckpt = tmp_path / "run" / "checkpoint" / "state.safetensors"
    before = ckpt.read_bytes()
    with torch.no_grad():
        model.blocks[1].mlp.W_in[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="NaN or inf activations"):
        train(cfg, model=model, sequences=seqs, progress=False)
    assert ckpt.read_bytes() == before


def test_nan_weights_stop_training(tmp_path):
    cfg = small_cfg(tmp_path, n_tokens=256 * 20, lr=1e30)
    with pytest.raises(NonFiniteError, match="last good checkpoint"):
        train(cfg, model=tiny_model(), sequences=random_sequences(), progress=False)


def test_store_blocks_are_shuffled_reproducible_and_cached(tmp_path):
    model = tiny_model()
    tcfg = transcoder_config(TrainConfig(), model)
    seqs = random_sequences(100)
    a = ActivationStore(model, tcfg, seqs, batch_size=64, block_tokens=1024, seed=3, cache_dir=tmp_path)
    x0, y0 = a.block(1)
    assert x0.shape == (1024, 2, 32)
    b = ActivationStore(model, tcfg, seqs, batch_size=64, block_tokens=1024, seed=3)
    torch.testing.assert_close(b.block(1)[0], x0)
    assert a.shard(1).exists() and a.shard(1).parent.parent == tmp_path
    # unshuffled, consecutive tokens come from one sequence; shuffled, neighbours are unrelated
    xs, _ = collect(model, seqs[34:68], tcfg)  # block 1 = sequences 34..67 (ceil(1024 / 31) per block)
    flat = xs[:, 1:].flatten(0, 1)[:1024]
    assert not torch.allclose(flat, x0)
    assert torch.allclose(flat.sum(0), x0.sum(0), rtol=1e-4, atol=1e-3)  # same tokens, new order
    # the batch stream resumes at any batch index
    stream = list(zip(range(20), a.batches(0), strict=False))
    later = next(a.batches(18))
    torch.testing.assert_close(later[0], stream[18][1][0])


def test_sequences_shorter_than_the_context_fill_whole_blocks():
    """16-token sequences for a model whose context is 32 (a researcher's usual short contexts): block 1
    is the next ceil(1024 / 15) = 69 of them, every batch full. Sized by the model's context, a block
    took 34 sequences (510 tokens) and batches 8-15 of each block came out empty: the sparse TopK step
    then failed on a 0-row batch."""
    model = tiny_model()
    tcfg = transcoder_config(TrainConfig(), model)
    seqs = random_sequences(300, n_ctx=16)
    store = ActivationStore(model, tcfg, seqs, batch_size=64, block_tokens=1024, seed=3)
    assert [x.shape[0] for x, _ in itertools.islice(store.batches(0), 32)] == [64] * 32
    xs, _ = collect(model, seqs[69:138], tcfg)
    flat = xs[:, 1:].flatten(0, 1)[:1024]
    assert torch.allclose(flat.sum(0), store.block(1)[0].sum(0), rtol=1e-4, atol=1e-3)  # its tokens
    with pytest.raises(ValueError, match="longer than the model's context"):
        ActivationStore(model, tcfg, random_sequences(10, n_ctx=33), batch_size=64, block_tokens=1024)
    ragged = ActivationStore(model, tcfg, lambda: iter([[1] * 16, [1] * 12]), batch_size=64, block_tokens=64)
    with pytest.raises(ValueError, match="sequence 1 of the token source has 12 tokens and the first has 16"):
        ragged.block(0)


def test_pack_sequences():
    seqs = list(pack_sequences([[5, 6], [7, 8, 9], [10]], n_ctx=6, bos_id=0, eos_id=1))
    assert seqs == [[0, 5, 6, 1, 7, 8]]
    seqs = list(
        pack_sequences(
            ["a b", "c"], n_ctx=4, bos_id=0, eos_id=1, tokenize=lambda s: [ord(c) for c in s.split()[0]]
        )
    )
    assert seqs == [[0, 97, 1, 99]]


def test_cli_is_built_from_the_dataclass():
    """One option per TrainConfig field, and beside them only how a run shows itself (`--no-progress`)."""
    args = build_parser().parse_args(["--kind", "clt", "--d-sae", "256", "--skip", "--sparsity-coef", "0.01"])
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    cfg = TrainConfig(**{k: v for k, v in vars(args).items() if k in fields})
    assert cfg.kind == "clt" and cfg.d_sae == 256 and cfg.skip and cfg.sparsity_coef == 0.01
    assert set(vars(args)) == fields | {"no_progress"} and args.no_progress is False
    assert "20%" in build_parser().format_help()  # docstrings with % must not break --help


def test_replacement_metrics_identity_transcoder():
    """A 'transcoder' that reproduces the MLP exactly recovers all CE loss: one feature per MLP neuron
    is exact for a ReLU MLP (W_enc = W_in, W_dec = W_out)."""
    model = tiny_model(act_fn="relu")
    from transcoders import TranscoderConfig, build_transcoders

    cfg = TranscoderConfig(kind="plt", n_layers=2, d_model=32, d_sae=64, activation="relu")
    tc = build_transcoders(cfg)
    with torch.no_grad():
        for l in range(2):
            tc.W_enc[l] = model.blocks[l].mlp.W_in
            tc.b_enc[l] = model.blocks[l].mlp.b_in
            tc.W_dec[l] = model.blocks[l].mlp.W_out
            tc.b_dec[l] = model.blocks[l].mlp.b_out
    m = replacement_metrics(model, tc, random_sequences(8))
    assert abs(m["ce_replaced"] - m["ce_orig"]) < 1e-4 and m["kl_to_orig"] < 1e-5
    assert m["ce_loss_recovered"] == pytest.approx(1.0, abs=1e-3)
    assert m["ce_zero_ablated"] > m["ce_orig"]


def test_replacement_metrics_identity_clt():
    """A CLT whose same-layer decoders are the MLPs (and cross-layer decoders zero) is exact too;
    a nonzero cross-layer decoder then changes the replaced model's loss."""
    model = tiny_model(act_fn="relu")
    from transcoders import TranscoderConfig, build_transcoders

    cfg = TranscoderConfig(kind="clt", n_layers=2, d_model=32, d_sae=64, activation="relu")
    tc = build_transcoders(cfg)
    with torch.no_grad():
        for l in range(2):
            tc.W_enc[l] = model.blocks[l].mlp.W_in
            tc.b_enc[l] = model.blocks[l].mlp.b_in
            tc.W_dec[l][:, 0] = model.blocks[l].mlp.W_out
            tc.b_dec[l] = model.blocks[l].mlp.b_out
    seqs = random_sequences(8)
    m = replacement_metrics(model, tc, seqs)
    assert m["ce_loss_recovered"] == pytest.approx(1.0, abs=1e-3) and m["kl_to_orig"] < 1e-5
    with torch.no_grad():
        tc.W_dec[0][:, 1] = torch.randn(64, 32)
    assert replacement_metrics(model, tc, seqs)["kl_to_orig"] > 1e-3


def test_evaluate_splices_the_sets_of_splice_with(tmp_path):
    """An SAE's evaluation has the CE figures of its write hook alone and, with --splice-with, of it
    spliced in together with another set (`spliced_metrics` of both), under "spliced_with"."""
    import numpy as np

    from tests.transcoders.tc_helpers import random_set
    from transcoders import save_transcoders
    from transcoders.metrics import spliced_metrics
    from transcoders.train import evaluate, write_manifest

    model = tiny_model()
    corpus = tmp_path / "tokens.npy"
    np.save(corpus, random_sequences(40).numpy())
    plt = random_set("plt", seed=3)
    save_transcoders(plt, tmp_path / "plt")
    sae = random_set("sae", seed=4)
    hook = "blocks.{layer}.hook_attn_out"
    cfg = small_cfg(tmp_path, kind="sae", hook=hook, corpus=str(corpus), splice_with=(str(tmp_path / "plt"),))
    m = evaluate(model, sae, cfg, n_seq=8)
    tokens = random_sequences(40)[-8:]
    assert m["ce_replaced"] == pytest.approx(replacement_metrics(model, sae, tokens)["ce_replaced"], rel=1e-6)
    joint = spliced_metrics(model, [sae, plt], tokens)
    got = dict(m["spliced_with"])
    assert got.pop("sets") == [str(tmp_path / "plt")]
    assert got == pytest.approx(joint, rel=1e-6)
    assert m["spliced_with"]["ce_replaced"] != pytest.approx(m["ce_replaced"], rel=1e-3)
    (tmp_path / "out").mkdir()
    manifest = write_manifest(tmp_path / "out", cfg, m, {}, ["--kind", "sae"])
    assert manifest["description"].startswith(f"SAE (jumprelu, d_sae=64 per layer, on {hook})")
    assert build_parser().parse_args(["--splice-with", "a", "b"]).splice_with == ("a", "b")


def test_gradient_clipping_is_on_sae_lens_scale(tmp_path, monkeypatch):
    """`max_grad_norm` bounds the gradient norm of the MSE summed over the output dims (sae_lens's
    loss; ours averages over d_model, so the optimizer sees at most max_grad_norm / d_model); 0 turns
    clipping off. The norm is read off the gradients Adam receives."""
    model = tiny_model()
    d_model = model.cfg.d_model
    seen: list[float] = []
    step = torch.optim.Adam.step

    def spy(self, *a, **kw):
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        seen.append(
            float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(x) for x in grads])))
        )
        return step(self, *a, **kw)

    monkeypatch.setattr(torch.optim.Adam, "step", spy)

    def first_norms(m: float, run: str) -> list[float]:
        seen.clear()
        cfg = small_cfg(tmp_path, n_tokens=256 * 4, max_grad_norm=m, out=str(tmp_path / run))
        train(cfg, model=model, sequences=random_sequences(), progress=False)
        return list(seen)

    free = first_norms(0.0, "free")
    assert len(free) == 4 and min(free) * d_model > 1e-2  # unclipped, sae_lens's scale
    assert first_norms(1e9, "loose")[0] == pytest.approx(free[0], rel=1e-6)  # never binds
    tight = first_norms(1e-3, "tight")
    assert [n * d_model for n in tight] == pytest.approx([1e-3] * 4, rel=1e-4)
    with pytest.raises(ConfigError, match="max_grad_norm"):
        small_cfg(tmp_path, max_grad_norm=-1.0)


class _MatmulDtypes(torch.utils._python_dispatch.TorchDispatchMode):
    """The dtypes of the inputs of every matrix product dispatched."""

    PRODUCTS = ("mm", "addmm", "bmm", "baddbmm")

    def __init__(self):
        super().__init__()
        self.seen: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in self.PRODUCTS:
            self.seen |= {a.dtype for a in args if isinstance(a, torch.Tensor)}
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "kind, activation", [("plt", "jumprelu"), ("clt", "topk"), ("plt", "topk")]
)  # PLT TopK: sparse_topk.py's own step
def test_autocast_runs_the_products_in_bfloat16_and_keeps_float32_weights(tmp_path, kind, activation):
    """--autocast: the step's matrix products take bfloat16 inputs (seen by the dispatcher, not asked
    of the trainer), the weights and Adam stay float32, and the run ends within bfloat16's error of
    the float32 run (8 significant bits: a few per cent of FVU after 8 steps)."""
    from transcoders.trainer import Trainer

    model, runs = tiny_model(), {}
    for autocast in (False, True):
        cfg = small_cfg(
            tmp_path / str(autocast),
            kind=kind,
            activation=activation,
            k=8,
            n_tokens=256 * 8,
            autocast=autocast,
        )
        trainer = Trainer(cfg, model=model, sequences=random_sequences())
        with _MatmulDtypes() as products:
            trainer.fit(progress=False)
        assert (torch.bfloat16 in products.seen) == autocast, products.seen
        assert {p.dtype for p in trainer.tc.parameters()} == {torch.float32}
        assert all(
            v.dtype == torch.float32 for s in trainer.opt.state.values() for v in s.values() if v.dim()
        )
        tc, _ = trainer.finish()
        x, y = held_out(model, tc.cfg)
        runs[autocast] = reconstruction_metrics(tc, x, y)["fvu_mean"]
    assert runs[True] == pytest.approx(runs[False], rel=0.1)


def test_the_dead_fraction_is_logged_over_auxks_window_and_never_as_nan(tmp_path, monkeypatch):
    """The progress bar's `dead` counted features silent for 2000 steps and showed `dead=nan` in
    every run shorter than that (a run of 1,562 steps showed it throughout). It now uses the window
    AuxK calls dead (DEAD_TOKENS tokens, in steps) and is left out until a run is that long."""
    import math

    from transcoders import trainer

    model, seqs = tiny_model(), random_sequences()
    _, info = train(small_cfg(tmp_path / "a", n_tokens=256 * 4), model=model, sequences=seqs, progress=False)
    assert "dead" not in info["train_log"] and all(math.isfinite(v) for v in info["train_log"].values())
    monkeypatch.setattr(trainer, "DEAD_TOKENS", 256 * 2)  # a window of two steps
    cfg = small_cfg(tmp_path / "b", n_tokens=256 * 6)
    _, info = train(cfg, model=model, sequences=seqs, progress=False)
    from safetensors.torch import load_file

    # the step each feature last fired, as the final checkpoint keeps it: dead = silent past 2 steps
    fired = load_file(tmp_path / "b" / "run" / "checkpoint" / "state.safetensors")["last_fired"]
    assert info["train_log"]["dead"] == pytest.approx(((6 - fired) > 2).float().mean().item())


def test_runs_sharing_a_cache_dir_each_read_their_own_activations(tmp_path, monkeypatch):
    """Activation store step 4: a cached block is keyed by what it comes from. Before, shards were
    named by block number alone, so a run of another seed, model, set kind or corpus sharing the
    folder read the first run's activations as its own (a seed-1 run with seed 0's cache trained
    another set than seed 1 without it). Each store's blocks here equal those of the same store
    without a cache, and a block of unchanged tokens is read back, not recomputed."""
    import transcoders.activation_store as store_module

    model = tiny_model()
    tcfg = transcoder_config(TrainConfig(), model)
    seqs = random_sequences(100)
    kw = dict(batch_size=64, block_tokens=1024, cache_dir=tmp_path)
    first = ActivationStore(model, tcfg, seqs, seed=3, **kw)
    first.block(0), first.block(1)
    other_model = tiny_model()
    with torch.no_grad():
        other_model.blocks[0].mlp.W_in[0, 0] += 1.0
    edited = seqs.clone()
    edited[40, 5] = (edited[40, 5] + 1) % 50  # a token of block 1 (sequences 34..67)
    attn = transcoder_config(TrainConfig(kind="sae", hook="blocks.{layer}.hook_attn_out"), model)
    for m, cfg, s, seed in [
        (model, tcfg, seqs, 4),  # another seed
        (other_model, tcfg, seqs, 3),  # another model (one weight)
        (model, attn, seqs, 3),  # another set kind: attention output, same shapes
        (model, tcfg, edited, 3),  # another corpus
    ]:
        cached = ActivationStore(m, cfg, s, seed=seed, **kw)
        plain = ActivationStore(m, cfg, s, batch_size=64, block_tokens=1024, seed=seed)
        for b in (0, 1):
            for got, want in zip(cached.block(b), plain.block(b), strict=True):
                torch.testing.assert_close(got, want, rtol=0, atol=0)
    calls = []
    real = store_module.collect
    monkeypatch.setattr(store_module, "collect", lambda *a: calls.append(1) or real(*a))
    again = ActivationStore(model, tcfg, edited, seed=3, **kw)
    again.block(0), again.block(1)
    assert len(calls) == 0  # both blocks of the edited corpus were cached by its run above
    again = ActivationStore(model, tcfg, seqs, seed=3, **kw)
    for got, want in zip(again.block(1), first.block(1), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert len(calls) == 0
