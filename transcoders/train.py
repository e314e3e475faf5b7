"""Train a transcoder set: `python -m transcoders.train --kind plt|clt|sae ...`.

Seed: circuit-tracing appendix, "ML details" (losses in losses.py, activations in
activation_store.py). One run:

1. Load the model (the bundled one by default) and a token source (the bundled task corpus
   by default; any `.npy` of token ids [n_seq, n_ctx] or `.txt` of one text per line). The
   bundled model and corpus are attrgraph's, found through providers.py (no attrgraph import).
2. Estimate per-layer scales on the first block: `s_in[l] = sqrt(E||x[l]||^2 / d_model)`, the
   same `s_out[l]` for targets; train on `x / s_in`, `y / s_out` ("we separately normalize the
   activation of each residual stream layer and each MLP output").
3. Initialize as the appendix gives (base.py); Adam; per step (trainer.py `Trainer.step`, the one
   step of one process and of every rank): MSE + lambda(t) * sparsity (each nonlinearity's: tanh for
   JumpReLU, L1 for ReLU; AuxK for TopK / BatchTopK), lambda ramping linearly 0 -> final
   over all of training; optional pre-activation loss; gradient clipping at norm max_grad_norm /
   d_model (sae_lens's norm 1 on its loss, summed over dims where ours averages), the global norm
   summed in float64 (distributed.py `clip_grad_norm`, the same with or without ranks). A TopK PLT or
   SAE (without the pre-activation loss, not feature-sharded) takes the sparse step of
   sparse_topk.py: the same loss and gradients from the k active features per token.
4. A NaN or inf in the loss or the weights stops the run with `NonFiniteError` before the bad
   step reaches a checkpoint; the last good checkpoint stays in `<out>/checkpoint`.
5. Checkpoints (weights, Adam state, step, scales) every `checkpoint_every` steps; rerunning the
   same command resumes from it and reproduces the uninterrupted run exactly (the data of step t
   is a pure function of the seed, activation_store.py step 3).
6. At the end the scales are folded into the weights (base.py `fold_scales`), so the saved set
   acts on raw activations; it is saved in our format with `metrics.json` / `manifest.json`
   (metrics.py on held-out sequences: FVU, L0, dead fraction, CE loss recovered, KL, with the
   set's write hooks replaced; with `--splice-with`, CE loss recovered and KL again with those
   sets spliced in at the same time, e.g. an attention SAE together with `default-plt`).
   Feature-sharded, no rank holds the whole set for this: it is gathered to rank 0 and written one
   tensor at a time, and every rank evaluates its slice (distributed.py step 3).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from transcoders import distributed as tdist
from transcoders import providers
from transcoders.activation_store import pack_sequences
from transcoders.block_layout import ATTN_OUTPUT
from transcoders.config import TranscoderConfig, check_device
from transcoders.config_cli import add_fields, parse_config
from transcoders.errors import AttrgraphError, ConfigError
from transcoders.formats.native import save_native, save_native_streamed
from transcoders.losses import PREACT_FORMS
from transcoders.manifest import sha256
from transcoders.metrics import reconstruction_metrics, replacement_metrics, spliced_metrics
from transcoders.nonlinearity import PENALTIES
from transcoders.sites import MLP_INPUT, MLP_OUTPUT

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from transcoders.base import SparseCoder

EVAL_ACTIVATIONS = 1 << 24
"""Evaluation runs the set on at most 4096 tokens (spliced into the model: 16 sequences) at a time,
fewer when tokens x layers x features would pass this (64 MB of float32 activations; a CLT of 16384
features per layer on the bundled model: 256 tokens, 2 sequences). Feature-sharded, the same tokens
at a time, each rank holding its features' share of the activations."""
HELD_OUT_SEED = 987_654  # corpus seed of held-out evaluation text (never a training seed)
RESUME_FREE = (
    "out",  # a run folder copied elsewhere resumes there
    "save_to",
    "checkpoint_every",
    "cache_dir",
    "parallel",
    "splice_with",
    "device",
    "dist_timeout",
)  # options a resumed run may change


@dataclass(frozen=True)
class TrainConfig:
    kind: str = "plt"
    """"plt" (per-layer transcoders), "clt" (cross-layer transcoder) or "sae" (on --hook)."""
    activation: str = "jumprelu"
    """"jumprelu" (tanh penalty), "relu" (L1 penalty), "topk", "batchtopk" or "matryoshka_batchtopk"
    (auxiliary loss; the last also --matryoshka-widths)."""
    d_sae: int = 1024
    """Features per layer."""
    model: str = "default"
    """The bundled model ("default"), a model folder, or a TransformerLens name."""
    corpus: str = "bundled"
    """"bundled" (the task corpus), a .npy of token ids [n_seq, n_ctx], or a .txt of one text per line."""
    n_tokens: int = 4_000_000
    """Training tokens (steps = n_tokens // batch_size)."""
    batch_size: int = 1024
    """Tokens per step."""
    lr: float = 1e-3
    """Adam learning rate (constant, linear decay to 0 over the last 20% of steps)."""
    sparsity_coef: float = 2e-3
    """Final lambda of the sparsity penalty (tanh / L1), reached at the last step."""
    sparsity_c: float = 1.0
    """The c inside tanh(c * a * ||W_dec||)."""
    penalty: str = "tanh"
    """JumpReLU's sparsity penalty: "tanh" (the appendix: tanh(c * a * ||W_dec||)) or "l0" (DeepMind's
    L0 through the step's straight-through estimator)."""
    bandwidth: float = 1.0
    """JumpReLU's kernel width eps in the straight-through estimator (the appendix: 1.0)."""
    threshold_init: float = 0.03
    """JumpReLU's initial threshold (the appendix: 0.03); trained as log(theta)."""
    ste_to_input: bool = False
    """JumpReLU: also send the estimator's gradient to the pre-activations (the appendix's variant);
    default: the paper's H(h - theta)."""
    max_grad_norm: float = 1.0
    """Gradient clipping, on sae_lens's scale: the gradient norm of the MSE summed over the output dims
    (sae_lens's loss, where ours averages over d_model) is held at most this, i.e. ours is clipped at
    max_grad_norm / d_model; 0 turns clipping off. Before the frontier (benchmarks/frontier.py) the
    trainer clipped its own loss at 1, which never bound: that is --max-grad-norm d_model (128 for the
    bundled model), how the bundled sets were trained."""
    preact_coef: float = 0.0
    """Coefficient of the pre-activation loss (the appendix used 3e-6; off by default, see --preact-form)."""
    preact_form: str = "appendix"
    """"appendix": sum_f ReLU(-h_f) over all features; "sae_lens": sum_f ReLU(theta_f - h_f) ||W_dec_f||
    over dead features only."""
    k: int = 32
    """Features kept per layer and token for --activation topk (on average: batchtopk)."""
    matryoshka_widths: tuple[int, ...] = ()
    """For --activation matryoshka_batchtopk: the nested widths below --d-sae whose feature prefixes must
    each reconstruct the target too (e.g. --matryoshka-widths 64 256 with --d-sae 1024)."""
    auxk_coef: float = 1 / 32
    """Weight of TopK's auxiliary loss (AuxK: the top 2k dead features reconstruct the residual); 0 turns it off, and with it the work it costs."""
    skip: bool = False
    """Learn a linear skip W_skip (PLT / CLT)."""
    hook: str = ""
    """For --kind sae: the hook template it reads and writes, e.g. blocks.{layer}.hook_attn_out."""
    block_tokens: int = 65536
    """Tokens per shuffle block (memory: block_tokens * n_layers * d_model * 8 bytes)."""
    seed: int = 0
    """Seed of initialization, corpus and shuffling."""
    out: str = "runs/transcoders"
    """Run folder: checkpoint/ lives here; the trained set goes to --save-to."""
    save_to: str = ""
    """Where the trained set is saved (default <out>/transcoders)."""
    checkpoint_every: int = 500
    """Steps between checkpoints."""
    cache_dir: str = ""
    """If set, activation blocks are cached here as safetensors shards and streamed back (under torchrun --parallel data, each rank produces and reads its own part)."""
    parallel: str = "data"
    """Under torchrun: "data" (DDP, each rank a slice of every batch) or "features" (each rank a slice of every layer's features)."""
    device: str = "cpu"
    """Where the model and the set run: cpu, cuda, cuda:N or mps (under torchrun, plain cuda means each rank's LOCAL_RANK GPU)."""
    dist_timeout: float = tdist.DEFAULT_TIMEOUT_S
    """Under torchrun: seconds a collective waits for the other ranks before the run stops with StalledRankError naming the ranks that did not answer (gloo's own default is 30 minutes)."""
    splice_with: tuple[str, ...] = ()
    """Sets (bundled names or folders) spliced in together with the trained one for a second held-out CE loss recovered in the manifest (metrics "spliced_with"), e.g. default-plt for an attention SAE."""

    def __post_init__(self):
        if self.kind not in ("plt", "clt", "sae"):
            raise ConfigError(f"kind {self.kind!r} is not 'plt', 'clt' or 'sae'; pick one.")
        if self.kind == "sae" and "{layer}" not in self.hook:
            raise ConfigError(f"an SAE needs --hook, a template with {{layer}}, e.g. {ATTN_OUTPUT!r}.")
        if self.parallel not in ("data", "features"):
            raise ConfigError(f"parallel {self.parallel!r} is not 'data' or 'features'; pick one.")
        check_device(self.device)  # one sentence when this machine lacks it
        if self.penalty not in PENALTIES:
            raise ConfigError(f"penalty {self.penalty!r} is not one of {PENALTIES}; pick one.")
        if self.preact_form not in PREACT_FORMS:
            raise ConfigError(f"preact_form {self.preact_form!r} is not one of {PREACT_FORMS}; pick one.")
        if not self.bandwidth > 0 or not self.threshold_init > 0:
            raise ConfigError(
                f"bandwidth {self.bandwidth} and threshold_init {self.threshold_init} must both be positive."
            )
        if not self.auxk_coef >= 0:
            raise ConfigError(f"auxk_coef {self.auxk_coef} is negative or NaN; pass 0 to turn AuxK off.")
        if not self.max_grad_norm >= 0:
            raise ConfigError(
                f"max_grad_norm {self.max_grad_norm} is negative or NaN; pass 0 to turn clipping off."
            )
        # the nonlinearity's own checks (activation name, k, Matryoshka widths) before any heavy work
        TranscoderConfig(
            kind="plt",
            n_layers=1,
            d_model=1,
            d_sae=self.d_sae,
            activation=self.activation,
            k=self.k,
            matryoshka_widths=self.matryoshka_widths,
        )
        if self.matryoshka_widths and max(self.matryoshka_widths) >= self.d_sae:
            raise ConfigError(
                f"matryoshka_widths {list(self.matryoshka_widths)} must stay below d_sae {self.d_sae} (the full "
                "width is always trained); drop or lower the last."
            )
        if self.n_tokens < self.batch_size:
            raise ConfigError(
                f"n_tokens {self.n_tokens} is less than one batch of {self.batch_size}; raise it."
            )


DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
"""Option defaults: a checkpoint written before an option existed resumes as if it had its default."""


def transcoder_config(cfg: TrainConfig, model: HookedTransformer) -> TranscoderConfig:
    """The set a TrainConfig trains, for `model`."""
    hooks = (cfg.hook, cfg.hook) if cfg.kind == "sae" else (MLP_INPUT, MLP_OUTPUT)
    return TranscoderConfig(
        kind=cfg.kind,
        n_layers=model.cfg.n_layers,
        d_model=model.cfg.d_model,
        d_sae=cfg.d_sae,
        activation=cfg.activation,
        input_hook=hooks[0],
        output_hook=hooks[1],
        skip=cfg.skip,
        k=cfg.k,
        matryoshka_widths=cfg.matryoshka_widths,
        bandwidth=cfg.bandwidth,
        ste_to_input=cfg.ste_to_input,
        output_before_post_norm=cfg.kind != "sae",
        model_name=str(model.cfg.model_name or cfg.model),
    )


# ---------------------------------------------------------------------- model and corpus
def load_any_model(name: str, device: str = "cpu"):
    """The model a package provides under `name` (attrgraph: its bundled model "default", a folder or a
    TransformerLens name; providers.py), else a TransformerLens name."""
    return providers.load_model(name, device)


def model_device(cfg: TrainConfig) -> str:
    """`cfg.device`, with plain "cuda" under torchrun meaning this rank's GPU (`LOCAL_RANK`)."""
    import os

    if cfg.device == "cuda" and "LOCAL_RANK" in os.environ:
        return f"cuda:{int(os.environ['LOCAL_RANK'])}"
    return cfg.device


def corpus_items(corpus: str, seed: int):
    """A provided corpus (attrgraph's endless "bundled" one; providers.py), or a file's texts / token-id
    lists."""
    provided = providers.corpus(corpus, seed)
    if provided is not None:
        return provided
    path = Path(corpus)
    if not path.is_file():
        raise ConfigError(
            f"corpus {corpus!r} is no file and no installed package provides it (provided: "
            f"{providers.corpus_names()}); pass a .npy or .txt file, or (re)install attrgraph (pip install -e .) for 'bundled'."
        )
    if path.suffix == ".npy":
        import numpy as np

        return (row.tolist() for row in np.load(path, allow_pickle=False))
    return (line.rstrip("\n") for line in path.open() if line.strip())


def sequence_source(model: HookedTransformer, corpus: str, seed: int):
    """A callable returning a fresh iterator of `n_ctx`-token sequences (activation_store step 1)."""
    tok = model.tokenizer
    n_ctx = model.cfg.n_ctx
    if corpus.endswith(".npy"):
        import numpy as np

        arr = np.load(corpus, allow_pickle=False)
        if arr.ndim == 2 and arr.shape[1] == n_ctx:
            return torch.from_numpy(arr.astype("int64"))

    vocab = tok.get_vocab()

    def tokenize(text: str):
        return tok(text, add_special_tokens=False)["input_ids"]

    def items():
        for item in corpus_items(corpus, seed):
            # the bundled corpus yields word tuples: map them through the vocabulary directly
            yield [vocab[w] for w in item] if isinstance(item, tuple) else item

    return lambda: pack_sequences(items(), n_ctx, tok.bos_token_id, tok.eos_token_id, tokenize)


def held_out_tokens(model: HookedTransformer, corpus: str, n_seq: int) -> torch.Tensor:
    if corpus.endswith(".npy"):
        src = sequence_source(model, corpus, 0)
        if isinstance(src, torch.Tensor):
            return src[-n_seq:]  # the last sequences of a token file are held out
    return first_sequences(sequence_source(model, corpus, HELD_OUT_SEED), n_seq)


def first_sequences(source, n: int) -> torch.Tensor:
    """[n, n_ctx] the first `n` sequences of a `sequence_source`: a token tensor's first rows, or
    the first `n` its stream yields (StopIteration when it holds fewer)."""
    if isinstance(source, torch.Tensor):
        return source[:n]
    it = source()  # token ids on the host: the activation store moves them to the model's device
    return torch.tensor([next(it) for _ in range(n)], dtype=torch.long, device="cpu")


# ---------------------------------------------------------------------- the loop
def train(
    cfg: TrainConfig,
    model: HookedTransformer = None,
    sequences=None,
    progress: bool = True,
    stop_after: int | None = None,
    gather: bool = True,
):
    """Run (or resume) training; returns the trained, folded set and its metrics (trainer.py `Trainer`).

    `model` / `sequences` override `cfg.model` / `cfg.corpus` (tests pass tiny ones);
    `stop_after` ends the run early after that many steps (as an interruption would).
    Inside an initialized torch.distributed process group it trains as `cfg.parallel` says
    (distributed.py). Data parallel: every rank returns the same full set, and rank 0 alone writes
    checkpoints. Feature-sharded: every rank creates, trains and checkpoints only its slice of the
    features; rank 0 returns the full set (gathered at the end), every other rank its own slice;
    with `gather=False` every rank returns its slice (the CLI saves and evaluates the slices,
    `save_and_evaluate`).
    """
    from transcoders.trainer import Trainer

    return Trainer(cfg, model, sequences).run(progress, stop_after, gather)


def dist_backend() -> str:
    import torch.distributed as dist

    return dist.get_backend()


def dist_barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


def _close_progress_bars() -> None:
    """End every open tqdm bar's line (the training bar of a run an error stopped)."""
    from tqdm import tqdm

    for bar in list(tqdm._instances):
        bar.close()


def _progress(total: int, start: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, initial=start, disable=not enabled, desc="train", mininterval=5.0)


def evaluate(model: HookedTransformer, tc: SparseCoder, cfg: TrainConfig, n_seq: int = 64) -> dict:
    """metrics.py on held-out sequences: the set alone, and spliced in with `cfg.splice_with`'s sets
    (under "spliced_with", their names first)."""
    from transcoders.formats import load_transcoders
    from transcoders.sites import check_fits, collect

    tokens = held_out_tokens(model, cfg.corpus, n_seq)
    metrics = {}
    x, y = collect(model, tokens, tc.cfg)
    # a wide set runs on fewer tokens at a time; a feature-sharded one as the whole set would, each
    # rank holding its share of the activations
    shards = tc.d.world if isinstance(tc, tdist.FeatureShard) else 1
    per_token = tc.n_layers * tc.d_sae * shards
    batch = max(1, min(4096, EVAL_ACTIVATIONS // per_token))
    metrics.update(reconstruction_metrics(tc, x[:, 1:].flatten(0, 1), y[:, 1:].flatten(0, 1), batch))
    seqs = max(1, min(16, EVAL_ACTIVATIONS // (per_token * tokens.shape[1])))
    metrics.update(replacement_metrics(model, tc, tokens, seqs))
    if cfg.splice_with:
        others = [load_transcoders(name, device=tc.device, dtype=tc.dtype) for name in cfg.splice_with]
        for other in others:
            check_fits(model, other)
        joint = spliced_metrics(model, [tc, *others], tokens, seqs)
        metrics["spliced_with"] = {"sets": list(cfg.splice_with), **joint}
    return metrics


def write_manifest(folder: Path, cfg: TrainConfig, metrics: dict, info: dict, argv: list[str] | None) -> dict:
    """manifest.json beside the weights, laid out like data/default's: how it was made, quality, sha256."""
    files = {p.name: sha256(p) for p in sorted(folder.iterdir()) if p.name != "manifest.json" and p.is_file()}
    manifest = {
        "name": folder.name,
        "description": f"{cfg.kind.upper()} ({cfg.activation}, d_sae={cfg.d_sae} per layer"
        + (f", on {cfg.hook}" if cfg.kind == "sae" else "")
        + f") for model {cfg.model!r}.",
        "command": "python -m transcoders.train " + " ".join(shlex.quote(a) for a in (argv or [])),
        "seed": cfg.seed,
        "config": dataclasses.asdict(cfg),
        "corpus": {"source": cfg.corpus, "held_out_seed": HELD_OUT_SEED},
        "tokens_seen": info.get("steps", 0) * cfg.batch_size,
        "wall_time_s": round(info.get("train_wall_s", 0.0), 1),
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "metrics": metrics,
        "files": files,
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def build_parser() -> argparse.ArgumentParser:
    return add_fields(
        argparse.ArgumentParser(prog="python -m transcoders.train", description=__doc__.split("\n")[0]),
        TrainConfig,
    )


def add_parser(sub) -> None:
    """`attrgraph train-transcoders ...` (the attrgraph CLI registry's hook)."""
    add_fields(sub.add_parser("train-transcoders", help=__doc__.split("\n")[0]), TrainConfig)


def run(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    """Train, save, evaluate and write the manifest for the options in `args`."""
    torch.set_flush_denormal(True)  # Adam moments of rarely active features decay into slow denormals
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    cfg = TrainConfig(**{k: v for k, v in vars(args).items() if k in fields})
    launched = tdist.init_from_env(cfg.dist_timeout)  # under torchrun: join the process group
    try:
        d = tdist.current(cfg.parallel)
        with tdist.naming_dead_ranks(d):  # torchrun's SIGTERM after a rank died: the line naming it
            model = load_any_model(cfg.model, model_device(cfg))
            sharded = d.mode == "features"
            tc, info = _naming_stalls(cfg, d, lambda: train(cfg, model=model, gather=False))
            if d.main or sharded:  # feature-sharded: every rank saves and evaluates its slice
                _naming_stalls(cfg, d, lambda: _save_and_report(model, tc, info, cfg, argv, d))
            tdist.finish_together(d)  # the others wait for rank 0's manifest, then all end at once
    finally:
        if launched:
            import torch.distributed as dist

            dist.destroy_process_group()
    return 0


def _naming_stalls(cfg: TrainConfig, d, fn):
    """`fn()`, with a collective that timed out or lost its connection (a rank stalled or died)
    turned into a `StalledRankError` naming the ranks that did not answer (distributed.py)."""
    try:
        return fn()
    except RuntimeError as e:
        if d.active and tdist.is_lost_rank(e):
            raise tdist.stalled_error(d, e, cfg.dist_timeout) from None
        raise


def save_and_evaluate(model, tc, cfg: TrainConfig, d=None) -> tuple[Path, dict]:
    """Save the trained set to `--save-to` and evaluate it (`evaluate`); returns the folder and metrics.

    Feature-sharded (`d.mode == "features"`, every rank calling with its slice `tc`): the set is
    gathered to rank 0 one tensor at a time and written as it comes (`save_native_streamed`), and
    every rank evaluates its slice (`distributed.FeatureShard`, metrics.py step 5): no rank holds
    the whole set. Every rank returns the metrics; rank 0's go into the manifest."""
    dest = Path(cfg.save_to or Path(cfg.out) / "transcoders")
    if d is not None and d.mode == "features":
        tensors = tdist.gathered_tensors(tc, d)
        if d.main:
            full_cfg = dataclasses.replace(tc.cfg, d_sae=tc.cfg.d_sae * d.world)
            save_native_streamed(full_cfg, tdist.full_shapes(tc, d), tensors, dest, tc.dtype)
        else:
            for _ in tensors:  # the gathers are collectives: take part, keep nothing
                pass
        return dest, evaluate(model, tdist.FeatureShard(tc, d), cfg)
    save_native(tc, dest)
    return dest, evaluate(model, tc, cfg)


def _save_and_report(model, tc, info, cfg: TrainConfig, argv: list[str] | None, d=None) -> None:
    """Save and evaluate the set (`save_and_evaluate`); rank 0 (or the only process) then writes the
    manifest and prints a summary."""
    dest, metrics = save_and_evaluate(model, tc, cfg, d)
    if d is not None and not d.main:
        return
    if argv is None:  # via `attrgraph train-transcoders ...`: record the equivalent module command
        argv = sys.argv[2:] if sys.argv[1:2] == ["train-transcoders"] else sys.argv[1:]
    manifest = write_manifest(dest, cfg, metrics, info, argv)
    summary = {k: v for k, v in metrics.items() if not isinstance(v, list | dict)}
    if "spliced_with" in metrics:
        summary["ce_loss_recovered_spliced"] = metrics["spliced_with"]["ce_loss_recovered"]
    print(json.dumps({"saved_to": str(dest), "tokens_seen": manifest["tokens_seen"], **summary}, indent=1))


def main(argv: list[str] | None = None) -> int:
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    parse_config(parser, TrainConfig, argv)  # a value TrainConfig refuses: one line, exit 2
    try:
        return run(parser.parse_args(argv), argv)
    except AttrgraphError as e:  # ours (a resume that does not match, a stalled rank): one line
        _close_progress_bars()  # so that the line starts a line of its own
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
