"""Train the bundled default model on the generated task corpus: `python -m attrgraph.bundled.train_model`.

1. Build the word-level tokenizer over `tasks.vocabulary()`.
2. Stream training sequences: BOS, then task instances (`tasks.stream(seed)`)
   joined by <eos>, cut at n_ctx tokens.
3. Train a TransformerLens HookedTransformer (GPT-2 style: LayerNorm, GELU,
   learned positions) with AdamW, linear warm-up and cosine decay, next-token
   cross-entropy on every position.
4. Evaluate the quality bar (`task_eval.evaluate_tasks`) on fresh examples (a seed training
   does not use; not held out, see task_eval) and write config.json, model.safetensors,
   tokenizer/ and manifest.json (command, seed, config, corpus spec, token count, wall time,
   sha256 of each file, metrics and how they were evaluated).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from attrgraph.bundled import tasks
from attrgraph.bundled.paths import BUNDLED
from attrgraph.bundled.task_eval import EVAL_SEED, EVALUATION_NOTE, evaluate_tasks, shortfalls
from attrgraph.bundled.tokenizer import build_tokenizer
from attrgraph.errors import AttrgraphError, OptionError
from transcoders.command import INTERRUPTED, close_progress_bars, interrupt_once, restore_interrupt
from transcoders.config_cli import add_fields, parse_config
from transcoders.manifest import sha256
from transcoders.output_folder import check_output_folder


@dataclass(frozen=True)
class ModelTrainConfig:
    out: str = str(BUNDLED["default"])
    """Folder to write the model into (replaced if it exists)."""
    n_layers: int = 4
    """Transformer blocks."""
    d_model: int = 128
    """Residual stream width."""
    n_heads: int = 4
    """Attention heads per layer (d_head = d_model / n_heads)."""
    d_mlp: int = 512
    """MLP hidden width."""
    n_ctx: int = 128
    """Context length; training sequences are exactly this long."""
    steps: int = 3000
    """Optimizer steps."""
    batch_size: int = 32
    """Sequences per step."""
    lr: float = 2e-3
    """Peak learning rate (after warm-up; cosine decay to 5% of it)."""
    warmup: int = 100
    """Linear warm-up steps."""
    weight_decay: float = 0.05
    """AdamW weight decay (matrices only)."""
    seed: int = 0
    """Seeds the weights and the corpus stream."""
    eval_n: int = 300
    """Fresh examples per task for the final metrics (task_eval; drawn anew, not held out)."""
    threads: int = 2
    """torch CPU threads."""
    log_every: int = 500
    """Steps between quick evaluations (50 fresh examples per task) in the log (0: never)."""

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError("steps and batch_size must be positive")


def model_config(cfg: ModelTrainConfig, d_vocab: int) -> dict:
    """HookedTransformerConfig keyword arguments (saved as config.json)."""
    return dict(
        model_name="attrgraph-default",
        n_layers=cfg.n_layers,
        d_model=cfg.d_model,
        n_heads=cfg.n_heads,
        d_head=cfg.d_model // cfg.n_heads,
        d_mlp=cfg.d_mlp,
        d_vocab=d_vocab,
        d_vocab_out=d_vocab,
        n_ctx=cfg.n_ctx,
        act_fn="gelu",
        normalization_type="LN",
        positional_embedding_type="standard",
        tokenizer_name=None,
        default_prepend_bos=True,
        original_architecture="GPT2LMHeadModel",
        seed=cfg.seed,
    )


def sequences(vocab: dict[str, int], n_ctx: int, seed: int) -> Iterator[list[int]]:
    """Endless training sequences: BOS + instances joined by <eos>, exactly n_ctx tokens."""
    bos, eos = vocab["<bos>"], vocab["<eos>"]
    stream = tasks.stream(seed)
    carry: list[int] = []
    while True:
        seq = [bos]
        while len(seq) < n_ctx:
            if not carry:
                carry = [vocab[w] for w in next(stream).tokens] + [eos]
            take = n_ctx - len(seq)
            seq += carry[:take]
            carry = carry[take:]
        carry = []  # an instance cut at the end is dropped, so each sequence starts cleanly
        yield seq


def lr_at(step: int, cfg: ModelTrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))


def train(cfg: ModelTrainConfig, command: str = "") -> dict:
    torch.set_num_threads(cfg.threads)
    # AdamW moments of never-seen tokens' embedding rows decay geometrically towards float32
    # denormals, which are slow on CPUs; flushing them to zero changes nothing measurable.
    torch.set_flush_denormal(True)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out)
    check_output_folder(out.parent, OptionError)  # tmp and out are made beside each other there
    if out.exists() and not out.is_dir():
        raise OptionError(f"{out} is a file; pass a folder to write the model into (--out).")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        return _train_into(cfg, command, out, tmp)
    except BaseException:  # an error or Ctrl-C: no half-written tmp left beside the old model
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _train_into(cfg: ModelTrainConfig, command: str, out: Path, tmp: Path) -> dict:
    from safetensors.torch import save_file
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    tokenizer = build_tokenizer(tasks.vocabulary(), tmp / "tokenizer")
    vocab = tokenizer.get_vocab()
    kwargs = model_config(cfg, len(vocab))
    model = HookedTransformer(HookedTransformerConfig(**kwargs), tokenizer=tokenizer)

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.98),
    )
    data = sequences(vocab, cfg.n_ctx, cfg.seed)
    start = time.perf_counter()
    losses = []
    bar = tqdm(range(cfg.steps), desc="train", mininterval=5)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        batch = torch.tensor([next(data) for _ in range(cfg.batch_size)])
        loss = model(batch, return_type="loss")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0:
            bar.set_postfix(loss=f"{sum(losses[-50:]) / len(losses[-50:]):.3f}")
        if cfg.log_every and step % cfg.log_every == cfg.log_every - 1:
            model.eval()
            quick = evaluate_tasks(model, n=50)
            model.train()
            tqdm.write(f"step {step + 1}: " + " ".join(f"{k}={v:.2f}" for k, v in quick.items()))
    train_s = time.perf_counter() - start

    model.eval()
    metrics = evaluate_tasks(model, n=cfg.eval_n)
    metrics["final_train_loss"] = sum(losses[-50:]) / len(losses[-50:])
    with open(tmp / "config.json", "w") as f:
        json.dump(kwargs, f, indent=1)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, tmp / "model.safetensors")
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    manifest = dict(
        name="default",
        description="The bundled default model: a small GPT-2-style HookedTransformer trained on attrgraph.bundled.tasks.",
        command=command,
        seed=cfg.seed,
        config=dataclasses.asdict(cfg) | {"out": "data/default"},
        model_config=kwargs,
        corpus=dict(
            generator="attrgraph.bundled.tasks.stream",
            mix=tasks.DEFAULT_MIX,
            format="BOS + instances joined by <eos>, n_ctx tokens per sequence",
            vocabulary_size=len(vocab),
        ),
        tokens_seen=cfg.steps * cfg.batch_size * cfg.n_ctx,
        wall_time_s=round(train_s, 1),
        torch_version=torch.__version__,
        metrics={k: round(v, 4) for k, v in metrics.items()},
        evaluation=dict(
            function="attrgraph.bundled.task_eval.evaluate_tasks",
            examples_per_task=cfg.eval_n,
            seed=EVAL_SEED,
            note=EVALUATION_NOTE,
        ),
        shortfalls=shortfalls(metrics),
        files={str(p.relative_to(tmp)): sha256(p) for p in files},
    )
    with open(tmp / "manifest.json", "w") as f:
        json.dump(manifest, f, indent=1)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attrgraph.bundled.train_model", description=__doc__.split("\n")[0]
    )
    cfg = parse_config(add_fields(parser, ModelTrainConfig), ModelTrainConfig, argv)
    command = "python -m attrgraph.bundled.train_model " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    previous = interrupt_once()
    try:
        manifest = train(cfg, command=command.strip())
    except AttrgraphError as e:  # an output folder that cannot be written: one line
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        close_progress_bars()
        print(f"{parser.prog}: interrupted; {cfg.out} is left as it was.", file=sys.stderr)
        return INTERRUPTED
    finally:
        restore_interrupt(previous)
    print(json.dumps(manifest["metrics"], indent=1))
    if manifest["shortfalls"]:
        print("below the quality bar:", manifest["shortfalls"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
