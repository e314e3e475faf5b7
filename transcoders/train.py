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
   is a pure function of the seed, activation_store.py step 3). One run at a time uses a run
   folder: a second with the same `--out` is refused while the first goes (run_folder.py). A
   SIGTERM (a preempted job) stops the run at a step with its checkpoint (stop_signal.py).
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
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from transcoders import distributed as tdist
from transcoders.command import (
    INTERRUPTED,
    TERMINATED,
    close_progress_bars,
    interrupt_once,
    restore_interrupt,
)
from transcoders.config_cli import add_fields, parse_config
from transcoders.errors import AttrgraphError, Terminated, WriteError, resumes_at
from transcoders.formats.native import save_native, save_native_streamed
from transcoders.manifest import sha256
from transcoders.metrics import reconstruction_metrics, replacement_metrics, spliced_metrics
from transcoders.model_state import grad_mode
from transcoders.output_folder import replaced
from transcoders.run_folder import one_run
from transcoders.stop_signal import sigterm_raises
from transcoders.train_config import (
    DEFAULTS,
    HELD_OUT_SEED,
    RESUME_FREE,
    TrainConfig,
    check_paths,
    corpus_items,
    dist_backend,
    dist_barrier,
    first_sequences,
    held_out_tokens,
    load_any_model,
    model_device,
    sequence_source,
    transcoder_config,
)

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from transcoders.base import SparseCoder

__all__ = [  # the run's options and sources live in train_config.py; callers find them here too
    "add_parser",
    "build_parser",
    "corpus_items",
    "DEFAULTS",
    "dist_backend",
    "dist_barrier",
    "EVAL_ACTIVATIONS",
    "evaluate",
    "first_sequences",
    "HELD_OUT_SEED",
    "held_out_tokens",
    "load_any_model",
    "main",
    "model_device",
    "RESUME_FREE",
    "run",
    "save_and_evaluate",
    "sequence_source",
    "train",
    "TrainConfig",
    "transcoder_config",
    "write_manifest",
]

EVAL_ACTIVATIONS = 1 << 24
"""Evaluation runs the set on at most 4096 tokens (spliced into the model: 16 sequences) at a time,
fewer when tokens x layers x features would pass this (64 MB of float32 activations; a CLT of 16384
features per layer on the bundled model: 256 tokens, 2 sequences). Feature-sharded, the same tokens
at a time, each rank holding its features' share of the activations."""


# ---------------------------------------------------------------------- the loop
@grad_mode()  # inside a caller's torch.no_grad() or torch.inference_mode() too (model_state.py)
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
    with replaced(folder / "manifest.json") as tmp:
        tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def build_parser() -> argparse.ArgumentParser:
    return _run_options(
        add_fields(
            argparse.ArgumentParser(prog="python -m transcoders.train", description=__doc__.split("\n")[0]),
            TrainConfig,
        )
    )


def add_parser(sub) -> None:
    """`attrgraph train-transcoders ...` (the attrgraph CLI registry's hook)."""
    _run_options(add_fields(sub.add_parser("train-transcoders", help=__doc__.split("\n")[0]), TrainConfig))


def _run_options(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Options of how a run shows itself, not of what it trains: outside TrainConfig, so a resume
    may change them."""
    p.add_argument("--no-progress", action="store_true", help="no progress bar (the steps, on stderr)")
    return p


def run(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    """Train, save, evaluate and write the manifest for the options in `args`. A SIGTERM outside the
    steps (loading; saving and evaluating after them) is `Terminated` saying what the run folder
    holds (stop_signal.py step 4), as one at a step is."""
    with sigterm_raises(lambda: resume_hint(Path(args.out))):
        return _run(args, argv)


def _run(args: argparse.Namespace, argv: list[str] | None) -> int:
    torch.set_flush_denormal(True)  # Adam moments of rarely active features decay into slow denormals
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    cfg = TrainConfig(**{k: v for k, v in vars(args).items() if k in fields})
    check_paths(cfg)  # a missing corpus, a run folder that cannot be written: before the model loads
    launched = tdist.init_from_env(cfg.dist_timeout)  # under torchrun: join the process group
    try:
        d = tdist.current(cfg.parallel)
        with tdist.naming_dead_ranks(d), one_run(cfg.out, d):  # one run per run folder (run_folder.py)
            model = load_any_model(cfg.model, model_device(cfg))
            sharded = d.mode == "features"
            progress = not args.no_progress
            tc, info = _naming_stalls(
                cfg, d, lambda: train(cfg, model=model, gather=False, progress=progress)
            )
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
    try:
        dest, metrics = save_and_evaluate(model, tc, cfg, d)
        if d is not None and not d.main:
            return
        if argv is None:  # via `attrgraph train-transcoders ...`: record the equivalent module command
            argv = sys.argv[2:] if sys.argv[1:2] == ["train-transcoders"] else sys.argv[1:]
        manifest = write_manifest(dest, cfg, metrics, info, argv)
    except WriteError as e:  # the run's last checkpoint holds the trained set (trainer.py `fit`)
        raise WriteError(
            f"{e} The trained set is in {Path(cfg.out) / 'checkpoint'}: the same command saves it "
            "without training again."
        ) from None
    summary = {k: v for k, v in metrics.items() if not isinstance(v, list | dict)}
    if "spliced_with" in metrics:
        summary["ce_loss_recovered_spliced"] = metrics["spliced_with"]["ce_loss_recovered"]
    print(json.dumps({"saved_to": str(dest), "tokens_seen": manifest["tokens_seen"], **summary}, indent=1))


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    parse_config(parser, TrainConfig, argv)  # a value TrainConfig refuses: one line, exit 2
    args = parser.parse_args(argv)
    previous = interrupt_once()
    try:
        return run(args, argv)
    except Terminated as e:  # SIGTERM: stopped at a checkpointed step, or outside the steps (stop_signal.py)
        close_progress_bars()
        if os.environ.get("RANK", "0") == "0":
            print(f"{parser.prog}: {e}", file=sys.stderr)
        return TERMINATED
    except AttrgraphError as e:  # ours (a resume that does not match, a stalled rank): one line
        close_progress_bars()  # so that the line starts a line of its own
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line (rank 0's under torchrun), and where to resume from
        close_progress_bars()
        if os.environ.get("RANK", "0") == "0":
            print(f"{parser.prog}: interrupted; {resume_hint(Path(args.out))}", file=sys.stderr)
        return INTERRUPTED
    finally:
        restore_interrupt(previous)


def resume_hint(out: Path) -> str:
    """What the line after Ctrl-C says of the run folder `out`: the step its checkpoint holds (the
    same command resumes there), or that it holds none."""
    from transcoders.checkpoint import read_meta, resume_folder

    try:
        found = resume_folder(out / "checkpoint")
        step = read_meta(found)["step"] if found is not None else None
    except AttrgraphError:  # a checkpoint the interrupt left unreadable: the resume will say so
        step = None
    if step is None:
        return (
            f"no checkpoint of this run is in {out} yet (--checkpoint-every): the same command starts afresh."
        )
    return resumes_at(found, step)


if __name__ == "__main__":
    sys.exit(main())
