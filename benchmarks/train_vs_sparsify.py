"""Train TopK transcoders with `python -m transcoders.train` and with EleutherAI's sparsify on one token stream.

Both trainers see the same activations of the bundled model, batch for batch, and are scored on the
same held-out activations:

1. Dump: the activation store of our trainer (`transcoders.activation_store`, the options of the
   command in step 2) writes the shuffled MLP input / output blocks of every layer of the bundled
   model to safetensors shards under `WORK/cache` (their paths in `dump.json`), and the held-out sequences (the trainer's held-out
   corpus seed) to `WORK/held_out.safetensors`, position 0 (BOS) dropped as in training.
2. Ours, in a fresh process: `python -m transcoders.train --kind plt --activation topk --k 32
   --d-sae 1024 --cache-dir WORK/cache ...`, which streams those shards (Adam, its defaults).
3. sparsify, in a fresh process of its own venv (`--sparsify-python`, which has `eai-sparsify`):
   its `Trainer` on a stand-in model whose module `layers.{l}` receives layer l's dumped MLP input
   and returns its dumped MLP output, so its forward hooks see exactly our batches in our order
   (one "sequence" of `--batch-size` tokens per step). It trains one transcoder per layer
   (`TranscoderConfig`, TopK k, `num_latents` = d_sae) with everything else at its defaults:
   signum (sign descent in a schedule-free wrapper), its learning rate `5e-3 / sqrt(d_sae / 2**14)`,
   FVU loss, no AuxK.
4. Score, in fresh processes (each library's own forward, one formula): per layer on the held-out
   tokens, FVU = sum ||y - y_hat||^2 / sum ||y - mean(y)||^2, L0, and the dead fraction (features
   that never fire on them). Tokens per second = training tokens / the trainer's wall time (our
   manifest's `wall_time_s`, sparsify's `Trainer.fit`): the same work on both sides, reading the
   dumped shards batch by batch and training on them; making the activations (step 1) is outside
   both. Peak RSS = ru_maxrss of each child (ours includes the command's own final evaluation).
   Where a step's time goes: benchmarks/train_profile.py.

With `--no-auxk`, ours also trains with `--auxk-coef 0`: sparsify's default has no auxiliary
loss, so that row does the same work per step as sparsify (the default row also trains AuxK, which
keeps fewer features dead and costs a second top-k and decode over the dead features).

Each trainer runs `--repeats` times, alternating; the table gives medians. Both run with
`--threads` torch threads (OMP_NUM_THREADS). Not part of the test suite: eai-sparsify is no
dependency of this project.

    python benchmarks/train_vs_sparsify.py --sparsify-python VENV/bin/python --n-tokens 2000000 --no-auxk

(`python3 -m venv VENV && VENV/bin/pip install torch==2.13.0 eai-sparsify`). Writes
benchmarks/results/train_vs_sparsify.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
BLOCK_TOKENS = 65536  # the trainer's default --block-tokens
HELD_OUT_SEQ = 256  # held-out sequences of 128 tokens (127 scored per sequence)


# ----------------------------------------------------------------------------- scoring (both venvs)
def score(forward, x, y) -> dict:
    """Step 4 on held-out `x, y` [tokens, n_layers, d_model]; `forward(x_l, l)` -> (y_hat, acts)."""
    import torch

    n_layers = x.shape[1]
    fvu, l0, dead = [], [], []
    with torch.no_grad():
        for l in range(n_layers):
            errs, fired, active = 0.0, None, 0.0
            for xb, yb in zip(x[:, l].split(4096), y[:, l].split(4096)):
                y_hat, acts = forward(xb, l)
                errs += float((y_hat.double() - yb.double()).pow(2).sum())
                on = acts > 0
                active += float(on.sum())
                fired = on.any(0) if fired is None else fired | on.any(0)
            yl = y[:, l].double()
            fvu.append(errs / float((yl - yl.mean(0)).pow(2).sum()))
            l0.append(active / x.shape[0])
            dead.append(1.0 - float(fired.double().mean()))
    return dict(
        fvu=fvu,
        fvu_mean=sum(fvu) / n_layers,
        l0=l0,
        dead_fraction=dead,
        dead_fraction_mean=sum(dead) / n_layers,
        held_out_tokens=int(x.shape[0]),
    )


def load_held_out(work: Path):
    from safetensors.torch import load_file

    d = load_file(str(work / "held_out.safetensors"))
    return d["x"], d["y"]


def score_ours(work: Path, run: str) -> dict:
    import torch

    from transcoders.formats import load_transcoders

    torch.set_num_threads(1)
    tc = load_transcoders(str(work / run / "set")).eval()
    x, y = load_held_out(work)

    def forward(xb, l):
        full = torch.zeros(xb.shape[0], tc.n_layers, xb.shape[1])
        full[:, l] = xb
        res = tc(full)
        return res.out[:, l], res.acts[:, l]

    return score(forward, x, y)


def score_sparsify(work: Path, run: str, device: str = "cpu") -> dict:
    """sparsify's own forward on the held-out tokens, on `device`: the CPU in a process of its own
    (where it trained does not matter), or the device it trained on, in its training process
    (`--_score-own`: one process a run, not two)."""
    if device == "cpu" and "sparsify" not in sys.modules:
        os.environ["SPARSIFY_DISABLE_TRITON"] = (
            "1"  # read at import: with a GPU present it decodes by triton, GPU only
        )
    import torch
    from sparsify import SparseCoder

    if device == "cpu":
        torch.set_num_threads(1)
    x, y = load_held_out(work)
    saes = [
        SparseCoder.load_from_disk(work / run / "ckpt" / run / f"layers.{l}", device=device).eval()
        for l in range(x.shape[1])
    ]

    def forward(xb, l):
        out = saes[l](xb.to(device))  # sae_out does not depend on the target (it only enters the losses)
        acts = torch.zeros(xb.shape[0], saes[l].num_latents, device=device)
        acts = acts.scatter(-1, out.latent_indices, out.latent_acts)
        return out.sae_out.cpu(), acts.cpu()

    return score(forward, x, y)


# ----------------------------------------------------------------------------- step 1 (our venv)
def dump(work: Path, n_tokens: int, batch_size: int, block_tokens: int, seed: int, threads: int = 1) -> dict:
    import torch
    from safetensors.torch import save_file

    import attrgraph.bundled  # noqa: F401  (registers the bundled model and corpus: a checkout not pip-installed)
    from transcoders.activation_store import ActivationStore
    from transcoders.sites import collect
    from transcoders.train import (
        TrainConfig,
        held_out_tokens,
        load_any_model,
        sequence_source,
        transcoder_config,
    )

    torch.set_num_threads(threads)
    cfg = TrainConfig(
        kind="plt", activation="topk", batch_size=batch_size, block_tokens=block_tokens, seed=seed
    )
    model = load_any_model(cfg.model)
    tcfg = transcoder_config(cfg, model)
    store = ActivationStore(
        model,
        tcfg,
        sequence_source(model, cfg.corpus, cfg.seed),
        cfg.batch_size,
        cfg.block_tokens,
        cfg.seed,
        cache_dir=work / "cache",
    )
    steps = n_tokens // batch_size
    n_blocks = math.ceil(steps / store.batches_per_block)
    for b in range(n_blocks):
        store.block(b)
    tokens = held_out_tokens(model, cfg.corpus, HELD_OUT_SEQ)
    x, y = collect(model, tokens, tcfg)
    save_file(
        {"x": x[:, 1:].flatten(0, 1).contiguous(), "y": y[:, 1:].flatten(0, 1).contiguous()},
        str(work / "held_out.safetensors"),
    )
    return dict(
        steps=steps,
        blocks=n_blocks,
        block_tokens=store.block_tokens,
        shards=[str(store.shard(b)) for b in range(n_blocks)],
        n_layers=tcfg.n_layers,
        d_model=tcfg.d_model,
    )


# ----------------------------------------------------------------------------- step 3 (sparsify venv)
def train_sparsify(
    work: Path, run: str, info: dict, d_sae: int, k: int, batch_size: int, seed: int = 0, device: str = "cpu"
) -> dict:
    import torch
    from datasets import Dataset
    from safetensors import safe_open
    from sparsify import TrainConfig, Trainer, TranscoderConfig

    n_layers, block_tokens, steps = info["n_layers"], info["block_tokens"], info["steps"]

    class Site(torch.nn.Module):
        """Stands in for layer l's MLP: called on its dumped input, returns its dumped output."""

        def forward(self, x, y):
            return y

    class Replay(torch.nn.Module):
        """The part of a transformers model sparsify's Trainer uses; token ids index the dump."""

        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(Site() for _ in range(n_layers))
            self.anchor = torch.nn.Parameter(torch.zeros(1))  # gives the model a device
            self.open: tuple[int, object] | None = None

        base_model = property(lambda self: self)
        device = property(lambda self: self.anchor.device)
        dummy_inputs = property(lambda self: {"input_ids": torch.arange(8)[None]})

        def forward(self, input_ids):
            ids = input_ids.flatten().cpu()
            start, n = int(ids[0]), ids.numel()
            b, r = divmod(start, block_tokens)
            assert bool((ids == torch.arange(start, start + n)).all()) and r + n <= block_tokens
            if self.open is None or self.open[0] != b:  # keep the current shard open, as ours does
                self.open = (b, safe_open(info["shards"][b], "pt"))
            f = self.open[1]
            x, y = f.get_slice("x")[r : r + n].to(self.device), f.get_slice("y")[r : r + n].to(self.device)
            for l, site in enumerate(self.layers):
                site(x[None, :, l], y[None, :, l])

    ids = torch.arange(steps * batch_size).reshape(steps, batch_size)
    dataset = Dataset.from_dict({"input_ids": ids.numpy()}).with_format("torch")
    cfg = TrainConfig(
        TranscoderConfig(activation="topk", k=k, num_latents=d_sae),
        batch_size=1,  # sequences per step; one sequence holds `batch_size` tokens
        hookpoints=[f"layers.{l}" for l in range(n_layers)],
        log_to_wandb=False,
        save_dir=str(work / run / "ckpt"),
        run_name=run,
        init_seeds=[seed],  # its default, [0], for this script's --seed 0
    )
    trainer = Trainer(cfg, dataset, Replay().to(device))
    lr = trainer.optimizers[0].param_groups[0]["lr"]
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    trainer.fit()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return dict(
        seconds=seconds,
        tokens=steps * batch_size,
        optimizer=f"{cfg.optimizer} ({type(trainer.optimizers[0]).__name__})",
        lr=lr,
    )


# ----------------------------------------------------------------------------- driver
def run_child(cmd: list[str], threads: int, cwd: Path = ROOT) -> tuple[str, float, float]:
    """Run `cmd` in a fresh process; its stdout, wall seconds and peak RSS (MB, its own ru_maxrss)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1", WANDB_MODE="disabled")
    env.pop("PYTHONPATH", None)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=cwd, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{stderr[-3000:]}")
    return stdout, wall, usage.ru_maxrss / 1024


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sparsify-python", help="Python of a venv with eai-sparsify (VENV/bin/python)")
    ap.add_argument("--n-tokens", type=int, default=2_000_000)
    ap.add_argument("--batch-size", type=int, default=1024, help="tokens per step, both trainers")
    ap.add_argument("--d-sae", type=int, default=1024)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--device", default="cpu", help="sparsify's worker trains there (benchmarks/frontier.py --device)"
    )
    ap.add_argument("--work", help="folder for shards and trained sets (default: a new temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--out", default=str(RESULTS / "train_vs_sparsify"))
    ap.add_argument("--rewrite", action="store_true", help="only rewrite --out's .md from its .json")
    ap.add_argument(
        "--no-auxk",
        action="store_true",
        help="also train ours with --auxk-coef 0 (sparsify's default has no AuxK: the same work per step)",
    )
    ap.add_argument("--_worker", help=argparse.SUPPRESS)
    ap.add_argument("--_run", help=argparse.SUPPRESS)
    ap.add_argument("--_score-own", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    work = Path(args.work) if args.work else None
    if args.rewrite:
        saved = json.loads(Path(args.out).with_suffix(".json").read_text())
        meta = saved["meta"]
        args.batch_size, args.d_sae, args.k, args.threads = (
            meta[k] for k in ("batch_size", "d_sae", "k", "threads")
        )
        info = dict(
            n_layers=len(saved["summary"]["ours"]["fvu"]), steps=meta["n_tokens"] // meta["batch_size"]
        )
        write_results(saved["runs"], info, meta["eai_sparsify_version"], args, meta)
        return 0
    if args._worker == "dump":
        print(json.dumps(dump(work, args.n_tokens, args.batch_size, BLOCK_TOKENS, args.seed)))
        return 0
    if args._worker == "sparsify":
        info = json.loads((work / "dump.json").read_text())
        r = train_sparsify(work, args._run, info, args.d_sae, args.k, args.batch_size, args.seed, args.device)
        if args._score_own:  # its own forward scored here, on its device (score_sparsify)
            r["own"] = score_sparsify(work, args._run, args.device)
        print(json.dumps(r))
        return 0
    if args._worker == "score-ours":
        print(json.dumps(score_ours(work, args._run)))
        return 0
    if args._worker == "score-sparsify":
        print(json.dumps(score_sparsify(work, args._run)))
        return 0
    if not args.sparsify_python or not Path(args.sparsify_python).is_file():
        ap.error("--sparsify-python must name the Python of a venv with eai-sparsify (VENV/bin/python).")

    work = work or Path(tempfile.mkdtemp(prefix="train_vs_sparsify_"))
    work.mkdir(parents=True, exist_ok=True)
    me = str(Path(__file__).resolve())
    common = ["--work", str(work), "--d-sae", str(args.d_sae), "--k", str(args.k)]
    common += ["--batch-size", str(args.batch_size)]
    t0 = time.perf_counter()
    dump_cmd = [sys.executable, me, "--_worker", "dump", *common, "--n-tokens", str(args.n_tokens)]
    stdout, _, _ = run_child([*dump_cmd, "--seed", str(args.seed)], 1)
    info = last_json(stdout)
    (work / "dump.json").write_text(json.dumps(info))
    print(f"dumped {info['blocks']} blocks in {time.perf_counter() - t0:.0f} s", flush=True)
    version = subprocess.run(
        [args.sparsify_python, "-c", "import importlib.metadata as m; print(m.version('eai-sparsify'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    sides = ("ours", "ours_no_auxk", "sparsify") if args.no_auxk else ("ours", "sparsify")
    runs = {side: [] for side in sides}
    for i in range(args.repeats):
        for side in sides:
            run = f"{side}{i}"
            shutil.rmtree(work / run, ignore_errors=True)
            if side.startswith("ours"):
                cmd = [sys.executable, "-m", "transcoders.train", "--kind", "plt", "--activation", "topk"]
                cmd += ["--k", str(args.k), "--d-sae", str(args.d_sae), "--n-tokens", str(args.n_tokens)]
                cmd += ["--batch-size", str(args.batch_size), "--seed", str(args.seed)]
                cmd += ["--cache-dir", str(work / "cache"), "--out", str(work / run)]
                cmd += ["--save-to", str(work / run / "set")]
                if side == "ours_no_auxk":  # sparsify's default: no auxiliary loss, so the same work
                    cmd += ["--auxk-coef", "0"]
                _, wall, rss = run_child(cmd, args.threads)
                manifest = json.loads((work / run / "set" / "manifest.json").read_text())
                r = dict(
                    seconds=manifest["wall_time_s"],
                    tokens=manifest["tokens_seen"],
                    optimizer="Adam",
                    lr=manifest["config"]["lr"],
                )
                score_cmd = [sys.executable, me, "--_worker", "score-ours"]
            else:
                cmd = [args.sparsify_python, me, "--_worker", "sparsify", "--_run", run, *common]
                stdout, wall, rss = run_child(cmd, args.threads)
                r = last_json(stdout)
                score_cmd = [args.sparsify_python, me, "--_worker", "score-sparsify"]
            r.update(process_s=round(wall, 1), peak_rss_mb=round(rss, 1))
            r["tokens_per_s"] = r["tokens"] / r["seconds"]
            r.update(last_json(run_child([*score_cmd, "--_run", run, "--work", str(work)], 1)[0]))
            runs[side].append(r)
            print(
                f"{run}: {r['tokens_per_s']:.0f} tok/s, peak {rss:.0f} MB, FVU {r['fvu_mean']:.4f}, "
                f"dead {r['dead_fraction_mean']:.3f}",
                flush=True,
            )
        write_results(
            runs, info, version, args
        )  # after every repeat: a long run interrupted keeps its figures
    if not args.keep and not args.work:
        shutil.rmtree(work)
    return 0


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def write_results(runs: dict, info: dict, version: str, args, saved_meta: dict | None = None) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = {}
    for side, rs in runs.items():
        summary[side] = {
            key: median([r[key] for r in rs])
            for key in ("tokens_per_s", "peak_rss_mb", "fvu_mean", "dead_fraction_mean", "seconds")
        }
        summary[side]["fvu"] = [median([r["fvu"][l] for r in rs]) for l in range(info["n_layers"])]
        summary[side]["dead_fraction"] = [
            median([r["dead_fraction"][l] for r in rs]) for l in range(info["n_layers"])
        ]
        summary[side]["l0"] = [median([r["l0"][l] for r in rs]) for l in range(info["n_layers"])]
    meta = dict(
        model="default (bundled, 4 layers, d_model 128)",
        sites="MLP input (ln2 output) -> MLP output, every layer, one transcoder per layer",
        n_tokens=info["steps"] * args.batch_size,
        batch_size=args.batch_size,
        d_sae=args.d_sae,
        k=args.k,
        threads=args.threads,
        repeats=len(runs["ours"]),
        held_out_tokens=runs["ours"][0]["held_out_tokens"],
        eai_sparsify_version=version,
        sparsify_optimizer=runs["sparsify"][0]["optimizer"],
        sparsify_lr=runs["sparsify"][0]["lr"],
        ours_optimizer=f"Adam, lr {runs['ours'][0]['lr']} (linear decay over the last 20%), grad clip 1, "
        "AuxK for dead features",
        date=time.strftime("%Y-%m-%d %H:%M"),
        load_average=os.getloadavg(),
    )
    if saved_meta is not None:  # --rewrite: the figures and circumstances of the run that made them
        meta = saved_meta
    out.with_suffix(".json").write_text(json.dumps(dict(meta=meta, summary=summary, runs=runs), indent=1))
    o, s = summary["ours"], summary["sparsify"]
    lines = [
        "# python -m transcoders.train vs EleutherAI sparsify (same activations, same batches)",
        "",
        f"Bundled model, MLP input -> MLP output of each of its {info['n_layers']} layers (one TopK transcoder "
        f"per layer), d_sae {args.d_sae}, k {args.k}, {meta['n_tokens']:,} training tokens in batches of "
        f"{args.batch_size}, {args.threads} torch thread(s); held-out FVU and dead fraction on "
        f"{meta['held_out_tokens']:,} held-out tokens; median of {meta['repeats']} fresh process(es) per trainer; "
        f"load average at the end {', '.join(f'{x:.1f}' for x in meta['load_average'])}.",
        f"eai-sparsify {version}: {meta['sparsify_optimizer']}, lr {meta['sparsify_lr']:.3g} (its default "
        f"for {args.d_sae} latents). Ours: {meta['ours_optimizer']}.",
        "Tokens/s count the same work on both sides: reading the dumped activation shards and training "
        "on them (making the activations is outside both). Where a step's time goes: train_profile.md.",
        "",
        "| trainer | held-out FVU (mean) | FVU per layer | dead fraction (mean) | tokens/s | peak RSS |",
        "|---|---|---|---|---|---|",
    ]
    rows = [("transcoders.train", o)]
    if "ours_no_auxk" in summary:
        rows.append(("transcoders.train --auxk-coef 0", summary["ours_no_auxk"]))
    for name, r in rows + [(f"sparsify {version}", s)]:
        per_layer = " / ".join(f"{v:.3f}" for v in r["fvu"])
        lines.append(
            f"| {name} | {r['fvu_mean']:.4f} | {per_layer} | "
            f"{r['dead_fraction_mean']:.3f} | {r['tokens_per_s']:,.0f} | {r['peak_rss_mb'] / 1024:.2f} GB |"
        )
    lines += [
        "",
        f"Ours / sparsify: FVU {o['fvu_mean'] / s['fvu_mean']:.2f}x, tokens/s {o['tokens_per_s'] / s['tokens_per_s']:.2f}x, "
        f"peak RSS {o['peak_rss_mb'] / s['peak_rss_mb']:.2f}x.",
    ]
    if "ours_no_auxk" in summary:
        n = summary["ours_no_auxk"]
        lines.append(
            f"Ours without AuxK / sparsify: FVU {n['fvu_mean'] / s['fvu_mean']:.2f}x, tokens/s "
            f"{n['tokens_per_s'] / s['tokens_per_s']:.2f}x, peak RSS {n['peak_rss_mb'] / s['peak_rss_mb']:.2f}x."
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
