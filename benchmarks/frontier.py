"""FVU / L0 frontier of per-layer transcoders: our trainer's nonlinearities against sae_lens's JumpReLU
and sparsify's TopK, on identical activations of the bundled model, scored by one function.

Seed: circuit-tracing appendix ("Efficiency relative to alternatives": the (MSE, L0) and (replacement
KL, L0) frontiers); Rajamanoharan et al. 2024 (JumpReLU, L0 penalty); Gao et al. 2024 (TopK);
Bussmann et al. 2024 (BatchTopK). Issue 20, part 2.

1. Dump (benchmarks/train_vs_sparsify.py's `dump`, imported), once per seed of `--seeds` (default
   0, 1, 2; `WORK/seed{s}/`): the MLP input / output blocks of all 4 layers of the bundled model for
   `--n-tokens` training tokens, shuffled by that seed, and 256 held-out sequences (the trainer's
   held-out corpus seed, the same for every seed; 32,512 tokens after dropping BOS).
2. For each seed, train one per-layer transcoder set (PLT, d_sae 1024, every layer) per method and
   sparsity setting, every method on that seed's batches of `--batch-size` tokens in the same order,
   for the same number of tokens, initialized from that seed:
   - ours (`transcoders.train.train`, reading the dumped shards): JumpReLU with the tanh penalty,
     JumpReLU with the L0 penalty (`--penalty l0`), ReLU + L1, TopK (AuxK on), BatchTopK (AuxK on),
     Matryoshka BatchTopK (Bussmann et al. 2025; nested widths 64 and 256, AuxK on), Gated
     (Rajamanoharan et al. 2024; the gate's L1 weighted by decoder norms);
     Adam at `--lr`, the trainer's defaults otherwise (bandwidth 1.0, initial threshold 0.03,
     sparsity coefficient ramped 0 -> final over training, lr decay over the last 20%).
   - ours with sae_lens's settings (below: tanh scale 4, bandwidth 2, initial threshold 0.1,
     `--ste-to-input`, `--preact-form sae_lens` at 3e-6 / 128, coefficients / 128 because sae_lens's
     MSE sums over the 128 dims where ours averages): separates the settings from the code.
   - sae_lens's JumpReLU (`JumpReLUTrainingSAE`, one per layer, d_in = d_out = d_model): its
     `encode_with_hidden_pre` (its JumpReLU autograd function and threshold), its `decode`, its
     `calculate_aux_loss` (sparsity penalty and pre-activation loss), plus MSE to the MLP output as
     its `training_forward_pass` computes it (summed over dims, mean over tokens), driven as its
     `SAETrainer` does: Adam (0.9, 0.999) at `--lr`, gradient clipping at 1 per SAE, its
     `get_lr_scheduler` (constant, linear decay over the last 20%) and `CoefficientScheduler`,
     the threshold projected to >= 0 before each step. Its "Anthropic setup" from its docs
     (`jumprelu_sparsity_loss_mode="tanh"`, tanh scale 4, bandwidth 2, initial threshold 0.1,
     `pre_act_loss_coefficient=3e-6`, `jumprelu_ste_to_input=True`, decoder init norm 0.1),
     `l0_warm_up_steps` = all steps (Anthropic's ramp over training, as ours). Inputs and targets
     are normalized as ours are (`x / s_in`, `y / s_out`, `E||.||^2 = d_model`, sae_lens's
     "expected_average_only_in" idea applied to both sides of a transcoder), and the scales are
     folded into the converted set. Features dead (silent for 100k tokens, our rule) enter its
     pre-activation loss; its default window, 1000 steps, would never fire within this run.
   - sparsify's TopK (`eai-sparsify` in its own venv, train_vs_sparsify.py's `--_worker sparsify`
     as a child process): its `Trainer` with every default (signum, its lr for 1024 latents, no
     AuxK) but `init_seeds=[seed]`, `TranscoderConfig(k=...)`.
3. Foreign weights become a `PerLayerTranscoder` (sae_lens: `W_enc`, `b_enc`, `threshold`, `W_dec`,
   `b_dec` per layer; sparsify: `encoder.weight.T`, `encoder.bias`, `W_dec`, `b_dec`, TopK k), and
   each library's own forward on the held-out tokens is checked to give the same FVU (`own_fvu_mean`;
   sparsify's scored in its training process, on its training device).
4. Score every set with the same function: `transcoders.metrics.reconstruction_metrics` on the
   held-out activations (FVU, L0, dead fraction = features never active on them) and
   `replacement_metrics` on the held-out sequences (every layer's MLP output replaced at once:
   CE loss recovered, KL(original || spliced)), on the device the sets trained on (`--device`). Each
   run records its training time (`train_s`, the tokens/s), its scoring time and its whole wall time
   (`run_s`: child processes, conversion and scoring included), what a device call spends on it.
5. Each setting's point is the mean over its seeds (L0, FVU, KL, ...), with the range over the seeds
   (bars in the plot). "At equal L0": each method's FVU (and KL) interpolated linearly in log FVU
   against log L0 between its two sweep points around an L0, only inside its measured range,
   compared with ours (the ratio's range over seeds: each seed's run against that seed's curve);
   "Against sae_lens": each of our methods at sae_lens's points' L0.

What made the difference between ours and sae_lens's JumpReLU: gradient clipping. Both clipped the
gradient norm at 1, but sae_lens's loss sums the MSE over the 128 dims where ours averages, so its
clipping bound and ours (a loss 128x smaller) never did. Checks made before the fix (one run each,
sae_lens l0_coefficient 0.035 = L0 23.1, FVU 0.0147; a scratch script monkeypatching
`torch.nn.utils.clip_grad_norm_` / the sae_lens class):
- sae_lens with its threshold trained as log(theta) (ours): L0 26.3, FVU 0.0133 (on its curve);
- sae_lens with our initialization: L0 20.3, FVU 0.0164 (on its curve);
- sae_lens without clipping: L0 26.8, FVU 0.0171 (on our old curve, 1.25x its own);
- sae_lens with log(theta), our init and the clip norm x128 (= our old trainer): L0 30.3, FVU 0.0173.
`TrainConfig.max_grad_norm` (`--max-grad-norm`, default 1) now clips on sae_lens's scale (the norm of
the gradient of the dim-summed loss, i.e. ours at max_grad_norm / d_model); the results files were
measured with it. Before the fix our JumpReLU (tanh) sat at 1.23-1.39x sae_lens's FVU at equal L0;
with it, within 0.95-1.00x.

Not part of the test suite (eai-sparsify is no dependency). One thread; run it niced:

    OMP_NUM_THREADS=1 nice -n 5 python benchmarks/frontier.py --sparsify-python /tmp/sparsify-venv/bin/python

On two cores, one process per seed (`--seeds 0` and `--seeds 1,2` beside it, same `--work`): each
seed's runs go to `WORK/seed{s}/runs_*.json` and every process writes the outputs from all of them.
Writes benchmarks/results/frontier.{json,md,png}; results are saved after every run and a rerun with
the same `--work` skips the runs already saved.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import train_vs_sparsify as tvs  # noqa: E402  (dump, the sparsify worker and its own scoring)

RESULTS = ROOT / "benchmarks" / "results"
DEAD_TOKENS = 100_000  # our trainer's rule (transcoders.trainer.DEAD_TOKENS)


@dataclass(frozen=True)
class Method:
    label: str
    trainer: str
    """"ours", "sae_lens" or "sparsify"."""
    param: str
    """The swept sparsity setting: "sparsity_coef", "k" or "l0_coefficient"."""
    values: tuple
    options: dict = field(default_factory=dict)
    """TrainConfig fields for ours."""


METHODS = {
    "jumprelu_tanh": Method(
        "ours: JumpReLU, tanh penalty",
        "ours",
        "sparsity_coef",
        (6e-4, 1.5e-3, 4e-3),
        {"activation": "jumprelu", "penalty": "tanh"},
    ),
    "jumprelu_l0": Method(
        "ours: JumpReLU, L0 penalty",
        "ours",
        "sparsity_coef",
        (4e-4, 8e-4, 2.5e-3),
        {"activation": "jumprelu", "penalty": "l0"},
    ),
    "relu_l1": Method(
        "ours: ReLU + L1", "ours", "sparsity_coef", (4e-3, 1.2e-2, 3e-2), {"activation": "relu"}
    ),
    "topk": Method("ours: TopK", "ours", "k", (12, 30, 60), {"activation": "topk"}),
    "batchtopk": Method("ours: BatchTopK", "ours", "k", (12, 30, 60), {"activation": "batchtopk"}),
    "matryoshka_batchtopk": Method(  # Bussmann et al. 2025's nesting; widths fit the default --d-sae 1024
        "ours: Matryoshka BatchTopK",
        "ours",
        "k",
        (12, 30, 60),
        {"activation": "matryoshka_batchtopk", "matryoshka_widths": (64, 256)},
    ),
    "gated": Method(  # Rajamanoharan et al. 2024: the gate's L1 weighted by decoder norms
        "ours: Gated", "ours", "sparsity_coef", (4e-3, 1e-2, 2.5e-2), {"activation": "gated"}
    ),
    "sae_lens_jumprelu": Method(
        "sae_lens: JumpReLU (tanh)", "sae_lens", "l0_coefficient", (0.015, 0.035, 0.08)
    ),
    "sparsify_topk": Method("sparsify: TopK", "sparsify", "k", (12, 30, 60)),
    "jumprelu_tanh_sl": Method(
        "ours: JumpReLU, tanh, sae_lens's settings",
        "ours",
        "sparsity_coef",
        tuple(v / 128 for v in (0.015, 0.035, 0.08)),  # sae_lens's MSE sums over d_model = 128 dims
        {
            "activation": "jumprelu",
            "penalty": "tanh",
            "sparsity_c": 4.0,
            "bandwidth": 2.0,
            "threshold_init": 0.1,
            "ste_to_input": True,
            "preact_coef": 3e-6 / 128,
            "preact_form": "sae_lens",
        },
    ),
}
SAE_LENS_SETUP = dict(
    jumprelu_sparsity_loss_mode="tanh",
    jumprelu_tanh_scale=4.0,
    jumprelu_bandwidth=2.0,
    jumprelu_init_threshold=0.1,
    pre_act_loss_coefficient=3e-6,
    jumprelu_ste_to_input=True,
    decoder_init_norm=0.1,
)


def run_name(method: str, value, seed: int) -> str:
    return f"{method}_{value:g}_seed{seed}"


# ----------------------------------------------------------------------------- step 4: one scorer
def held_out(work: Path, model):
    from transcoders.train import held_out_tokens

    x, y = tvs.load_held_out(work)
    return x, y, held_out_tokens(model, "bundled", tvs.HELD_OUT_SEQ)


def score(model, tc, x, y, tokens) -> dict:
    """Step 4 on `model`'s device (the set goes there; the held-out blocks go batch by batch)."""
    from transcoders.metrics import reconstruction_metrics, replacement_metrics

    tc = tc.to(model.cfg.device).eval()
    r = reconstruction_metrics(tc, x, y)
    r.update(replacement_metrics(model, tc, tokens))
    r["n_tokens_fvu"] = int(x.shape[0])
    return r


def plt_config(model, activation: str, k: int = 32):
    from transcoders.train import TrainConfig, transcoder_config

    return transcoder_config(TrainConfig(kind="plt", activation=activation, k=k), model)


def plt_from_layers(model, activation: str, layers: list[dict], k: int = 32):
    """A `PerLayerTranscoder` from per-layer `W_enc` [d, s], `b_enc`, `W_dec` [s, d], `b_dec` (and
    `threshold`) tensors (step 3)."""
    from transcoders import build_transcoders

    tc = build_transcoders(plt_config(model, activation, k))
    state = {name: torch.stack([layer[name].detach().float() for layer in layers]) for name in layers[0]}
    missing, unexpected = tc.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"conversion left {missing} unset, {unexpected} unused")
    return tc.eval()


def fvu_mean(y_hat_fn, x, y) -> float:
    """Mean over layers of the FVU of `y_hat_fn(x_l, l)` (each library's own forward, step 3)."""
    out = []
    with torch.no_grad():
        for l in range(x.shape[1]):
            err = sum(
                float((y_hat_fn(xb, l).double() - yb.double()).pow(2).sum())
                for xb, yb in zip(x[:, l].split(4096), y[:, l].split(4096), strict=True)
            )
            yl = y[:, l].double()
            out.append(err / float((yl - yl.mean(0)).pow(2).sum()))
    return sum(out) / len(out)


# ----------------------------------------------------------------------------- step 2: trainers
def synchronize(device: str) -> None:
    """Wait for the device's queued work, so that a wall time covers it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def train_ours(work: Path, model, name: str, method: Method, value, args) -> tuple:
    """Our trainer on `model`'s device (`--device`: the trainer trains where the model runs), bf16
    autocast with `--autocast`; the set stays there, where it is scored."""
    from transcoders.train import TrainConfig, train

    out = work / "runs" / name
    shutil.rmtree(out, ignore_errors=True)
    cfg = TrainConfig(
        kind="plt",
        d_sae=args.d_sae,
        n_tokens=args.n_tokens,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        cache_dir=str(work / "cache"),
        out=str(out),
        checkpoint_every=10**9,
        device=args.device,
        autocast=args.autocast,
        **method.options,
        **{method.param: value},
    )
    synchronize(args.device)
    t0 = time.perf_counter()
    tc, info = train(cfg, model=model, progress=False)
    synchronize(args.device)
    seconds = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    return tc, dict(train_s=seconds, steps=info["steps"])


def scales_of(store) -> tuple[torch.Tensor, torch.Tensor]:
    """Our trainer's per-layer scales (transcoders.train step 2), from the first block."""
    x0, y0 = store.block(0)
    d = x0.shape[-1]
    return x0.pow(2).sum(-1).mean(0).div(d).sqrt(), y0.pow(2).sum(-1).mean(0).div(d).sqrt()


def import_sae_lens_training() -> None:
    """Import sae_lens so that its training SAE classes load, on a machine without its runner's
    packages too. sae_lens's `__init__` imports its whole training runner (wandb, plotly, nltk, babe:
    about 35 MB of wheels, more than a GPU machine's call carries beside circuit-tracer); the frontier
    needs only the JumpReLU training SAE and the optimizer schedules, whose modules read two names
    from the package (`__version__`, `logger`) and its class registry. Where the full import fails for
    a missing package, the package is a module holding those two names, over sae_lens's own folder,
    and the JumpReLU classes are registered as its `__init__` registers them."""
    import importlib.metadata as md
    import importlib.util
    import logging
    import types

    try:
        import sae_lens  # noqa: F401
    except ModuleNotFoundError as e:
        spec = importlib.util.find_spec("sae_lens")
        if spec is None:
            raise
        print(f"sae_lens: importing its SAE modules alone ({e.name} is missing)", flush=True)
        for name in [m for m in sys.modules if m == "sae_lens" or m.startswith("sae_lens.")]:
            del sys.modules[name]  # what the failed import left half made
        pkg = types.ModuleType("sae_lens")
        pkg.__path__, pkg.__spec__ = list(spec.submodule_search_locations), spec
        pkg.__version__, pkg.logger = md.version("sae-lens"), logging.getLogger("sae_lens")
        sys.modules["sae_lens"] = pkg
        from sae_lens.registry import register_sae_class, register_sae_training_class
        from sae_lens.saes import jumprelu_sae as j

        register_sae_class("jumprelu", j.JumpReLUSAE, j.JumpReLUSAEConfig)  # as its __init__ does
        register_sae_training_class("jumprelu", j.JumpReLUTrainingSAE, j.JumpReLUTrainingSAEConfig)


def train_sae_lens(work: Path, model, value: float, args, x_ho, y_ho) -> tuple:
    import_sae_lens_training()
    from sae_lens.saes.jumprelu_sae import JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig
    from sae_lens.saes.sae import TrainStepInput
    from sae_lens.training.optim import CoefficientScheduler, get_lr_scheduler

    from transcoders.activation_store import ActivationStore
    from transcoders.train import sequence_source

    tcfg = plt_config(model, "jumprelu")
    L, D = tcfg.n_layers, tcfg.d_model
    store = ActivationStore(
        model,
        tcfg,
        sequence_source(model, "bundled", args.seed),
        args.batch_size,
        tvs.BLOCK_TOKENS,
        args.seed,
        cache_dir=work / "cache",
    )
    s_in, s_out = scales_of(store)
    total = args.n_tokens // args.batch_size
    dead_after = max(1, DEAD_TOKENS // args.batch_size)
    torch.manual_seed(args.seed)
    saes, opts, lrs, coefs = [], [], [], []
    for _ in range(L):
        cfg = JumpReLUTrainingSAEConfig(
            d_in=D,
            d_sae=args.d_sae,
            apply_b_dec_to_input=False,
            normalize_activations="none",
            l0_coefficient=value,
            l0_warm_up_steps=total,
            **SAE_LENS_SETUP,
        )
        sae = JumpReLUTrainingSAE(cfg).to(args.device)
        opt = torch.optim.Adam(sae.parameters(), lr=args.lr, betas=(0.9, 0.999))
        saes.append(sae)
        opts.append(opt)
        lrs.append(
            get_lr_scheduler(
                "constant",
                optimizer=opt,
                training_steps=total,
                lr=args.lr,
                warm_up_steps=0,
                decay_steps=total // 5,
                lr_end=args.lr / 10,
                num_cycles=1,
            )
        )
        coefs.append(CoefficientScheduler(warm_up_steps=total, final_value=value))
    since_fired = torch.zeros(L, args.d_sae, device=args.device)
    dev = torch.device(args.device)
    s_in_d, s_out_d = s_in.to(dev), s_out.to(dev)
    synchronize(args.device)
    t0 = time.perf_counter()
    for step, (x, y) in enumerate(store.batches(0)):
        if step >= total:
            break
        xn, yn = x.to(dev) / s_in_d[:, None], y.to(dev) / s_out_d[:, None]
        for l, sae in enumerate(saes):
            sae.train()
            with torch.no_grad():
                sae.threshold.data.clamp_(min=0.0)  # its training_forward_pass's projection
            dead = since_fired[l] > dead_after
            step_input = TrainStepInput(
                sae_in=xn[:, l],
                coefficients={"l0": coefs[l].value},
                dead_neuron_mask=dead,
                n_training_steps=step,
                is_logging_step=False,
            )
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.autocast):
                acts, hidden_pre = sae.encode_with_hidden_pre(xn[:, l])
                out = sae.decode(acts)
                mse = sae.mse_loss_fn(out, yn[:, l]).sum(dim=-1).mean()  # to the MLP output
                aux = sae.calculate_aux_loss(step_input, acts, hidden_pre, out)
                loss = mse + sum(aux.values())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(sae.parameters(), 1.0)
            opts[l].step()
            opts[l].zero_grad()
            lrs[l].step()
            coefs[l].step()
            fired = (acts > 0).any(0)
            since_fired[l] += 1
            since_fired[l][fired] = 0
    synchronize(args.device)
    seconds = time.perf_counter() - t0
    for sae in saes:
        sae.threshold.data.clamp_(min=0.0)
        sae.eval().to("cpu")
    layers = [
        dict(W_enc=s.W_enc, b_enc=s.b_enc, threshold=s.threshold, W_dec=s.W_dec, b_dec=s.b_dec) for s in saes
    ]
    tc = plt_from_layers(model, "jumprelu", layers)
    tc.fold_scales(s_in, s_out)

    def own(xb, l):  # sae_lens's own encode / decode, on its normalized inputs
        return saes[l].decode(saes[l].encode(xb / s_in[l])) * s_out[l]

    return tc, dict(train_s=seconds, steps=total, own_fvu_mean=fvu_mean(own, x_ho, y_ho))


def train_sparsify(work: Path, model, value: int, args) -> tuple:
    from safetensors.torch import load_file

    run = run_name("sparsify_topk", value, args.seed)
    shutil.rmtree(work / run, ignore_errors=True)
    me = str(ROOT / "benchmarks" / "train_vs_sparsify.py")
    common = ["--work", str(work), "--d-sae", str(args.d_sae), "--k", str(value)]
    common += ["--batch-size", str(args.batch_size), "--seed", str(args.seed)]
    train_only = ["--device", args.device]
    # one process trains and scores sparsify's own forward, on the training device (a process of
    # its own for the scoring cost each run 10-20 s more on the CPU)
    worker = ["--_worker", "sparsify", "--_run", run, "--_score-own"]
    stdout, _, _ = tvs.run_child([args.sparsify_python, me, *worker, *common, *train_only], 1)
    r = tvs.last_json(stdout)
    own = r["own"]
    layers = []
    for l in range(model.cfg.n_layers):
        w = load_file(str(work / run / "ckpt" / run / f"layers.{l}" / "sae.safetensors"))
        if "W_skip" in w:
            raise RuntimeError("sparsify trained a skip connection; this benchmark expects none")
        layers.append(
            dict(W_enc=w["encoder.weight"].T, b_enc=w["encoder.bias"], W_dec=w["W_dec"], b_dec=w["b_dec"])
        )
    tc = plt_from_layers(model, "topk", layers, k=value)
    return tc, dict(
        train_s=r["seconds"],
        steps=r["tokens"] // args.batch_size,
        own_fvu_mean=own["fvu_mean"],
        optimizer=r["optimizer"],
        lr=r["lr"],
    )


# ----------------------------------------------------------------------------- step 5 and outputs
def at_l0(points: list[tuple[float, float]], l0: float) -> float | None:
    """log-log interpolation of (L0, value) points at `l0`; None outside their range."""
    pts = sorted(p for p in points if p[0] > 0 and p[1] > 0)
    for (a, fa), (b, fb) in zip(pts, pts[1:]):
        if a <= l0 <= b:
            t = 0.0 if b == a else (math.log(l0) - math.log(a)) / (math.log(b) - math.log(a))
            return math.exp(math.log(fa) + t * (math.log(fb) - math.log(fa)))
    return None


def points(runs: dict) -> dict[str, list[dict]]:
    """Each method's sweep points, one per setting, averaged over its seeds: the means of every
    metric, the seeds' runs (`runs`) and the min / max of L0 and FVU over them; sorted by mean L0."""
    by_method = {}
    for m in METHODS:
        groups: dict = {}
        for r in runs.values():
            if r["method"] == m:
                groups.setdefault(r["value"], []).append(r)
        pts = []
        for value, rs in groups.items():
            rs = sorted(rs, key=lambda r: r.get("seed", 0))

            def mean(k: str, rs=rs) -> float:
                return sum(r[k] for r in rs) / len(rs)

            pt = {k: mean(k) for k in ("l0_mean", "fvu_mean", "kl_to_orig", "ce_loss_recovered", "train_s")}
            pt.update(
                value=value,
                runs=rs,
                dead_fraction_total=mean("dead_fraction_total"),
                fvu=[sum(r["fvu"][l] for r in rs) / len(rs) for l in range(len(rs[0]["fvu"]))],
                fvu_range=(min(r["fvu_mean"] for r in rs), max(r["fvu_mean"] for r in rs)),
                l0_range=(min(r["l0_mean"] for r in rs), max(r["l0_mean"] for r in rs)),
            )
            if all("own_fvu_mean" in r for r in rs):
                pt["own_fvu_mean"] = mean("own_fvu_mean")
            pts.append(pt)
        by_method[m] = sorted(pts, key=lambda p: p["l0_mean"])
    return by_method


def curve(pts: list[dict], key: str, seed: int | None = None) -> list[tuple[float, float]]:
    """(L0, `key`) of the seed-mean points, or of one seed's runs."""
    if seed is None:
        return [(p["l0_mean"], p[key]) for p in pts]
    return [(r["l0_mean"], r[key]) for p in pts for r in p["runs"] if r.get("seed", 0) == seed]


def ratio_cell(pt: dict, ref: list[dict]) -> str:
    """`pt` against the reference method at its mean L0: FVU and KL, theirs vs the reference's, their
    ratio, and the range of that ratio over the seeds (each seed's run against the same seed's curve)."""
    cell = f"L0 {pt['l0_mean']:.1f}: FVU {pt['fvu_mean']:.4f}"
    f = at_l0(curve(ref, "fvu_mean"), pt["l0_mean"])
    k = at_l0(curve(ref, "kl_to_orig"), pt["l0_mean"])
    if f is None:
        return cell
    per_seed = []
    for r in pt["runs"]:
        g = at_l0(curve(ref, "fvu_mean", r.get("seed", 0)), r["l0_mean"])
        if g is not None:
            per_seed.append(r["fvu_mean"] / g)
    spread = f"; seeds {min(per_seed):.2f}-{max(per_seed):.2f}x" if len(per_seed) > 1 else ""
    return cell + (
        f" vs {f:.4f} ({pt['fvu_mean'] / f:.2f}x{spread}), KL {pt['kl_to_orig']:.3f} vs {k:.3f} "
        f"({pt['kl_to_orig'] / k:.2f}x)"
    )


def write_outputs(out: Path, meta: dict, runs: dict, with_plot: bool = True) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    seeds = sorted({r.get("seed", 0) for r in runs.values()})
    meta = {**meta, "seeds": seeds}
    out.with_suffix(".json").write_text(json.dumps(dict(meta=meta, runs=runs), indent=1))
    by_method = points(runs)
    lines = [
        "# FVU / L0 frontier of per-layer transcoders (benchmarks/frontier.py)",
        "",
        f"Bundled model, one transcoder per layer on all {meta['n_layers']} layers (MLP input -> MLP output), "
        f"d_sae {meta['d_sae']}; every method trains on the same {meta['n_tokens']:,} dumped tokens in the same "
        f"batches of {meta['batch_size']} (Adam at lr {meta['lr']} for ours and sae_lens; sparsify its own "
        f"signum default), once per seed ({', '.join(map(str, seeds))}: each seed its own shuffle of the "
        "tokens and its own initialization). Each row is the mean over the seeds; the FVU's range over "
        f"them in brackets. Held-out FVU, L0 and dead fraction (never active) on {meta['held_out_tokens']:,} "
        "tokens; CE loss recovered and KL(original || spliced) with every layer's MLP output replaced at "
        f"once, on {meta['held_out_sequences']} held-out sequences. "
        + (
            "One thread per run, niced, on a shared 2-core machine (train time is indicative only)"
            if meta.get("device", "cpu") == "cpu"
            else f"Trained on {meta['device']}"
            + (" under bfloat16 autocast (ours and sae_lens's)" if meta.get("autocast") else "")
            + f", scored on {meta.get('scored_on', 'the CPU')}; sparsify runs its forward under its own "
            "bfloat16 autocast on a GPU either way"
        )
        + f"; {meta['date']}.",
        "",
        "| method | setting | seeds | mean L0 | mean FVU [min, max] | FVU per layer | CE loss recovered | KL "
        "| dead | own FVU | train s | tokens/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m, pts in by_method.items():
        for p in pts:
            own = f"{p['own_fvu_mean']:.4f}" if "own_fvu_mean" in p else ""
            lo, hi = p["fvu_range"]
            lines.append(
                f"| {METHODS[m].label} | {METHODS[m].param} {p['value']:g} | {len(p['runs'])} | "
                f"{p['l0_mean']:.1f} | {p['fvu_mean']:.4f} [{lo:.4f}, {hi:.4f}] | "
                f"{' / '.join(f'{v:.3f}' for v in p['fvu'])} | {p['ce_loss_recovered']:.4f} | "
                f"{p['kl_to_orig']:.3f} | {p['dead_fraction_total']:.3f} | {own} | {p['train_s']:.0f} | "
                f"{meta['n_tokens'] / p['train_s']:,.0f} |"
            )
    lines += [
        "",
        '"own FVU": the foreign library\'s own forward on the same held-out tokens (the converted set must',
        "match it). Dead: fraction of all features never active on the held-out tokens.",
        "",
    ]
    ref_sl = by_method["sae_lens_jumprelu"]
    ours = [m for m in METHODS if METHODS[m].trainer == "ours" and by_method[m]]
    if ref_sl and ours:
        lines += [
            "## Against sae_lens",
            "",
            "Each of our methods at the mean L0 of each of sae_lens's JumpReLU points (interpolated log-log",
            "between its own points; blank outside its measured range): its FVU and the ratio to sae_lens's",
            "(< 1: ours reconstructs better at that L0).",
            "",
            "| ours | "
            + " | ".join(f"L0 {p['l0_mean']:.1f}: sae_lens FVU {p['fvu_mean']:.4f}" for p in ref_sl)
            + " |",
            "|---|" + "---|" * len(ref_sl),
        ]
        for m in ours:
            cells = []
            for p in ref_sl:
                f = at_l0(curve(by_method[m], "fvu_mean"), p["l0_mean"])
                cells.append("" if f is None else f"{f:.4f} ({f / p['fvu_mean']:.2f}x)")
            lines.append(f"| {METHODS[m].label} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += [
        "## At equal L0",
        "",
        "For each point of every other method, our JumpReLU (tanh penalty) at the same mean L0, interpolated",
        "log-log between its two seed-mean points around that L0 (blank outside its measured range): FVU and",
        "KL, theirs vs ours, and the ratio theirs / ours (> 1: ours is better), with that ratio's range over",
        "the seeds (each seed's run against the same seed's curve). Columns: the method's sweep from its",
        "lowest to its highest L0.",
        "",
    ]
    ref = by_method["jumprelu_tanh"]
    if ref:
        lines += [
            "| method | lowest L0 | middle L0 | highest L0 |",
            "|---|---|---|---|",
        ]
        for m, pts in by_method.items():
            if m == "jumprelu_tanh" or not pts:
                continue
            lines.append(f"| {METHODS[m].label} | " + " | ".join(ratio_cell(p, ref) for p in pts) + " |")
    if meta.get("failed"):
        lines += ["", "## Failed runs", ""] + [f"- {name}: {why}" for name, why in meta["failed"].items()]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    if with_plot:
        plot(out.with_suffix(".png"), meta, by_method)


def plot(path: Path, meta: dict, by_method: dict) -> None:
    """Seed-mean points joined per method, with bars from the lowest to the highest seed (L0 across,
    FVU or KL up)."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5.2))
    styles = {
        "jumprelu_tanh": ("C3", "o", "-"),
        "jumprelu_l0": ("C1", "s", "-"),
        "jumprelu_tanh_sl": ("C9", "h", "-."),
        "relu_l1": ("C7", "v", "--"),
        "topk": ("C0", "^", "--"),
        "batchtopk": ("C2", "D", "--"),
        "matryoshka_batchtopk": ("C8", "d", "--"),
        "gated": ("C6", "*", "-"),
        "sae_lens_jumprelu": ("C4", "P", ":"),
        "sparsify_topk": ("C5", "X", ":"),
    }
    for m, pts in by_method.items():
        if not pts:
            continue
        c, mk, ls = styles[m]
        l0 = [p["l0_mean"] for p in pts]
        xerr = [
            [p["l0_mean"] - p["l0_range"][0] for p in pts],
            [p["l0_range"][1] - p["l0_mean"] for p in pts],
        ]
        for ax, key in zip(axes, ("fvu_mean", "kl_to_orig"), strict=True):
            ys = [[r[key] for r in p["runs"]] for p in pts]
            mid = [p[key] for p in pts]
            yerr = [[v - min(y) for v, y in zip(mid, ys)], [max(y) - v for v, y in zip(mid, ys)]]
            ax.errorbar(
                l0, mid, xerr=xerr, yerr=yerr, color=c, marker=mk, ls=ls, capsize=2, label=METHODS[m].label
            )
    for ax, ylabel in zip(
        axes, ("held-out FVU (mean over layers)", "KL(original || spliced), nats/token"), strict=True
    ):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks([10, 15, 20, 30, 40, 60, 80])
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("mean L0 (active features per token and layer)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_title("Reconstruction vs sparsity")
    axes[1].set_title("All 4 MLP outputs replaced: KL vs sparsity")
    axes[0].legend(fontsize=7)
    seeds = len(meta["seeds"])
    fig.suptitle(
        f"Per-layer transcoders on the bundled model: d_sae {meta['d_sae']}, {meta['n_tokens']:,} tokens each, "
        f"mean of {seeds} seed{'s' * (seeds > 1)}, bars: lowest to highest seed (lower is better)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- driver
def prepare_seed(work: Path, args) -> dict:
    """The dump of seed `args.seed` under `work` (its own shuffled batches), made once."""
    work.mkdir(parents=True, exist_ok=True)
    dumped = json.loads((work / "dump.json").read_text()) if (work / "dump.json").exists() else {}
    stale = dumped.get("seed") != args.seed or dumped.get("dumped_tokens", 0) < args.n_tokens
    if stale or "shards" not in dumped:  # (a dump from before the shards' names were recorded)
        shutil.rmtree(work / "cache", ignore_errors=True)
        t0 = time.perf_counter()
        dumped = tvs.dump(
            work, args.n_tokens, args.batch_size, tvs.BLOCK_TOKENS, args.seed, torch.get_num_threads()
        )
        dumped.update(seed=args.seed, dumped_tokens=dumped["blocks"] * dumped["block_tokens"])
        print(
            f"seed {args.seed}: dumped {dumped['blocks']} blocks in {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
    # the sparsify worker trains dump.json's `steps` batches of `--batch-size` tokens
    info = {**dumped, "steps": args.n_tokens // args.batch_size}
    (work / "dump.json").write_text(json.dumps(info))
    return info


def saved_runs(root: Path, key: str) -> dict:
    """Every seed's finished runs under `root` (each seed's process writes its own file)."""
    runs = {}
    for f in sorted(root.glob(f"seed*/runs_{key}.json")):
        runs.update(json.loads(f.read_text()))
    return runs


def write_json(path: Path, obj) -> None:
    """Written whole or not at all: another seed's process may be reading it."""
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sparsify-python", help="Python of a venv with eai-sparsify (VENV/bin/python)")
    ap.add_argument("--n-tokens", type=int, default=460_800)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--d-sae", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument(
        "--seeds",
        default="0,1,2",
        help="comma-separated seeds; each has its own dump (batches in its own order) and initialization. "
        "Seeds may run in separate processes on the same --work (one per core)",
    )
    ap.add_argument(
        "--methods", default=",".join(METHODS), help="comma-separated subset of " + ", ".join(METHODS)
    )
    ap.add_argument("--values", help="override the sweep of every method chosen (comma-separated)")
    ap.add_argument(
        "--device",
        default="cpu",
        help="train and score there (ours, sae_lens's and sparsify's; the dumps stay on the CPU): cuda for "
        "tokens/s on a GPU",
    )
    ap.add_argument(
        "--autocast", action="store_true", help="train ours and sae_lens's under bfloat16 autocast"
    )
    ap.add_argument("--work", default="/tmp/frontier_work", help="shards and resume state, a folder per seed")
    ap.add_argument("--out", default=str(RESULTS / "frontier"))
    ap.add_argument("--rewrite", action="store_true", help="only rewrite --out's .md and .png from its .json")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    out = Path(args.out)
    if args.rewrite:
        saved = json.loads(out.with_suffix(".json").read_text())
        write_outputs(out, saved["meta"], saved["runs"])
        return 0
    methods = args.methods.split(",")
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        ap.error(f"unknown methods {unknown}; choose from {', '.join(METHODS)}")
    if "sparsify_topk" in methods and not (args.sparsify_python and Path(args.sparsify_python).is_file()):
        ap.error(
            "--sparsify-python must name the Python of a venv with eai-sparsify (or leave out sparsify_topk)"
        )
    seeds = [int(v) for v in args.seeds.split(",")]
    # one thread on the CPU (the trainers' times compare there); with --device cuda the CPU only dumps and
    # converts, and a GPU machine's cores shorten a device call's untimed part
    threads = 1 if args.device == "cpu" else min(16, os.cpu_count() or 1)
    torch.set_num_threads(threads)
    import attrgraph.bundled  # noqa: F401  (registers the bundled model and corpus: a checkout not pip-installed)
    from transcoders.train import load_any_model

    root = Path(args.work)
    model = load_any_model("default")  # dumps on the CPU, and converts the foreign sets
    train_model = model if args.device == "cpu" else load_any_model("default", args.device)  # trains, scores
    key = dict(n_tokens=args.n_tokens, batch_size=args.batch_size, d_sae=args.d_sae, lr=args.lr)
    key_name = "_".join(f"{k}{v:g}" for k, v in key.items())
    if args.device != "cpu" or args.autocast:  # kept apart from the CPU runs of the same --work
        key_name += f"_{args.device.replace(':', '')}" + ("_bf16" if args.autocast else "")
    info = x = y = tokens = None
    meta = dict(
        model="default (bundled, 4 layers, d_model 128)",
        **key,
        sae_lens_setup=SAE_LENS_SETUP,
        threads=threads,
        device=torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        scored_on="the CPU" if args.device == "cpu" else args.device,
        autocast=args.autocast,
    )
    import importlib.metadata as md

    versions = {}
    if any(METHODS[m].trainer == "sae_lens" for m in methods):  # the GPU machine may have no sae_lens
        versions["sae_lens"] = md.version("sae-lens")
    if args.sparsify_python:
        versions["eai_sparsify"] = subprocess.run(
            [args.sparsify_python, "-c", "import importlib.metadata as m; print(m.version('eai-sparsify'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    meta["versions"] = versions
    failed = {}  # run name: why, for this invocation (a rerun on the same --work retries them)

    def rewrite(final: bool = False) -> None:  # after every run, so that a run cut short keeps the others
        meta.update(date=time.strftime("%Y-%m-%d %H:%M"), load_average=os.getloadavg())
        if failed:
            meta["failed"] = failed
        write_outputs(out, meta, saved_runs(root, key_name), with_plot=final)  # the plot at the end: seconds

    for seed in seeds:  # seed-major: a run cut short still has whole seeds of every method
        args.seed = seed
        work = root / f"seed{seed}"
        info = prepare_seed(work, args)
        if x is None:  # the held-out set does not depend on the seed
            x, y, tokens = held_out(work, model)
            print(
                f"frontier setup: {time.perf_counter() - t_start:.0f} s (models, dump, held-out set)",
                flush=True,
            )
            meta.update(
                n_layers=info["n_layers"],
                held_out_tokens=int(x.shape[0]),
                held_out_sequences=int(tokens.shape[0]),
            )
        state = work / f"runs_{key_name}.json"
        mine = json.loads(state.read_text()) if state.exists() else {}
        for m in methods:
            method = METHODS[m]
            values = method.values
            if args.values:
                values = tuple((int if method.param == "k" else float)(v) for v in args.values.split(","))
            for value in values:
                name = run_name(m, value, seed)
                if name in mine:
                    continue
                t_run = time.perf_counter()
                try:
                    if method.trainer == "ours":
                        tc, r = train_ours(work, train_model, name, method, value, args)
                    elif method.trainer == "sae_lens":
                        tc, r = train_sae_lens(work, model, value, args, x, y)
                    else:
                        tc, r = train_sparsify(work, model, value, args)
                    t_score = time.perf_counter()
                    r.update(method=m, value=value, seed=seed, **score(train_model, tc, x, y, tokens))
                    # the run as a device call spends it: child processes, conversion and scoring included
                    r.update(score_s=time.perf_counter() - t_score, run_s=time.perf_counter() - t_run)
                except Exception as e:  # one library's failure (on a device, say) leaves the others' runs
                    why = str(e).strip().splitlines() or [type(e).__name__]
                    failed[name] = f"{type(e).__name__}: {why[-1]}"[:300]
                    print(f"{name}: failed\n{e}", flush=True)
                    rewrite()
                    continue
                mine[name] = r
                if state.exists():  # another process may be running other methods of this seed
                    mine = {**json.loads(state.read_text()), **mine}
                write_json(state, mine)
                print(
                    f"{name}: L0 {r['l0_mean']:.1f} FVU {r['fvu_mean']:.4f} KL {r['kl_to_orig']:.3f} "
                    f"CE rec {r['ce_loss_recovered']:.4f} dead {r['dead_fraction_total']:.3f} "
                    f"(train {r['train_s']:.0f} s, score {r['score_s']:.0f} s, run {r['run_s']:.0f} s)"
                    + (f" own FVU {r['own_fvu_mean']:.4f}" if "own_fvu_mean" in r else ""),
                    flush=True,
                )
                rewrite()
    rewrite(final=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
