"""The training loop as a class: `Trainer(cfg).run()`, whose `step` reads as the appendix's recipe.

Seed: circuit-tracing appendix, "ML details"; the shape of EleutherAI sparsify's `Trainer` (the coder
returns its own losses, the trainer only weighs, steps and records). train.py's `train` is
`Trainer(cfg, ...).run(...)`. One step, the same function on one process, on data-parallel ranks
and on feature-sharded ranks (distributed.py; what differs lives in the `Dist` the coder is given):

1. The learning rate of this step (`lr_at`: constant, then linear decay over the last 20%).
2. Normalize: `x / s_in`, `y / s_out` (train.py step 2's per-layer scales).
3. The coder's forward returns its own loss (base.py `train_forward`; under bfloat16 autocast with
   `--autocast`, the weights and Adam float32 still): MSE + lambda(t) * its
   nonlinearity's sparsity penalty [+ pre-activation loss] [+ its auxiliary loss, AuxK for TopK /
   BatchTopK, on the features dead for `DEAD_TOKENS` tokens]; a TopK PLT / SAE takes the sparse step
   (sparse_topk.py) with the same loss. Data parallel, the forward is wrapped in DDP.
4. A NaN or inf loss stops the run (`NonFiniteError`) before the step changes any weight; so does a
   NaN or inf weight left by the step before (step 6's check, in the same host sync), and a SIGTERM
   on any rank (the same sync again; the run checkpoints this step and stops, stop_signal.py).
5. Backward; feature-sharded, the replicated parameters' gradients are averaged over ranks; the global
   gradient norm, summed in float64, is clipped (distributed.py `clip_grad_norm`).
6. Adam; a NaN or inf weight stops the run at the next step's check (or the next checkpoint's), the
   last good checkpoint kept.
7. Record which features fired (over all ranks' rows, data parallel).

Around the steps: setup (the set, Adam, a resumed checkpoint or fresh scales), checkpoints every
`checkpoint_every` steps, and at the end the scales folded into the weights (train.py steps 2-6).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from tqdm import tqdm

from transcoders import distributed as tdist
from transcoders import sparse_topk
from transcoders.activation_store import ActivationStore
from transcoders.base import LossWeights, StepOutput
from transcoders.checkpoint import (
    apply_state,
    check_order,
    read_checkpoint,
    resume_folder,
    save_checkpoint,
    state_tensors,
    write_checkpoint,
)
from transcoders.errors import ConfigError, NonFiniteError, Terminated, resumes_at
from transcoders.losses import sparsity_schedule
from transcoders.nonlinearity import Penalty
from transcoders.stop_signal import StopRequest, deferred_sigterm

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from transcoders.base import SparseCoder
    from transcoders.train_config import TrainConfig

DEAD_TOKENS = 100_000
"""A feature silent for this many training tokens counts as dead (for AuxK, and sae_lens's
pre-activation loss)."""


def lr_at(step: int, total: int, lr: float) -> float:
    """Constant `lr`, then a linear decay over the last 20% of steps: `lr * (total - step) / (total -
    decay_start)`, reaching `lr / (total - decay_start)` at the last step (`step = total - 1`)."""
    decay_start = int(0.8 * total)
    if step < decay_start:
        return lr
    return lr * (total - step) / max(1, total - decay_start)


def dead_features(step: int, last_fired: Tensor, dead_after: int | None) -> Tensor | None:
    """Features that last fired more than `dead_after` steps before `step` (None: not tracked)."""
    if dead_after is None:
        return None
    return (step - last_fired) > dead_after


class CoderStep(nn.Module):
    """Step 3 as one module, so that DistributedDataParallel can wrap it: the coder's own training
    forward (`train_forward`), or the sparse TopK step (`sparse=True`) with the same loss."""

    def __init__(self, tc: SparseCoder, weights: LossWeights, d: tdist.Dist, sparse: bool):
        super().__init__()
        self.tc, self.weights, self.d = tc, weights, d
        self.sparse = sparse_topk.TopKStep(tc, tc.nonlinearity.k_aux) if sparse else None

    def forward(self, x: Tensor, y: Tensor, lam: float, dead: Tensor | None) -> StepOutput:
        if self.sparse is None:
            return self.tc.train_forward(x, y, self.weights, lam, dead, self.d)
        return self.sparse(x, y, dead).step_output(y, self.weights.auxk_coef, self.tc.d_sae)


class Trainer:
    """One training run of `cfg` (train.py `TrainConfig`); `run()` trains (or resumes) and returns the
    folded set and its info. `model` / `sequences` override `cfg.model` / `cfg.corpus`."""

    def __init__(self, cfg: TrainConfig, model: HookedTransformer = None, sequences=None):
        from transcoders import train_config as T

        self.t0 = time.time()
        torch.manual_seed(cfg.seed)
        model = model if model is not None else T.load_any_model(cfg.model, T.model_device(cfg))
        self.cfg, self.tcfg = cfg, T.transcoder_config(cfg, model)
        if sequences is None:
            sequences = T.sequence_source(model, cfg.corpus, cfg.seed)
        self.d = d = tdist.current(cfg.parallel)
        tdist.check(d, cfg.batch_size, cfg.d_sae)
        split = d.shards_batch and bool(cfg.cache_dir)  # each rank produces and reads its own part
        self.store = ActivationStore(
            model,
            self.tcfg,
            sequences,
            cfg.batch_size,
            cfg.block_tokens,
            cfg.seed,
            cache_dir=cfg.cache_dir or None,
            rank=d.rank if split else 0,
            world=d.world if split else 1,
        )
        self.ckpt = Path(cfg.out) / "checkpoint"
        self.total = cfg.n_tokens // cfg.batch_size
        # train where the model runs (its activations come from there); under NCCL, the rank's GPU
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if d.active and T.dist_backend() == "nccl"
            else next(model.parameters()).device
        )
        # feature-sharded: this rank's slice of the one-process initialization, drawn without the rest
        self.part = (d.rank, d.world) if d.shards_features else (0, 1)
        self.tc = self._build_set()
        self.opt = torch.optim.Adam(self.tc.parameters(), lr=cfg.lr)
        self.t, self.scales, self.last_fired = self._resume_or_start()
        if d.active:
            T.dist_barrier()  # every rank has read the checkpoint before rank 0 may replace it
        self.scales = {k: v.to(self.device) for k, v in self.scales.items()}  # the store's are on the host
        self.last_fired = self.last_fired.to(self.device)
        self.forward = self._coder_step()
        self.replicated = [p for n, p in self.tc.named_parameters() if self.tc.feature_dim(n) is None]
        self.sharded = [p for n, p in self.tc.named_parameters() if self.tc.feature_dim(n) is not None]
        tracks_dead = self.weights.auxk_coef > 0 and self.tc.nonlinearity.needs_dead
        tracks_dead |= bool(cfg.preact_coef) and cfg.preact_form == "sae_lens"
        self.dead_after = max(1, DEAD_TOKENS // cfg.batch_size) if tracks_dead else None
        self.clip = cfg.max_grad_norm / self.tcfg.d_model  # on sae_lens's scale (loss summed over dims)
        self._weights_finite: Tensor | None = None  # after the last step's Adam, not yet checked
        self.stop = StopRequest()  # a SIGTERM (stop_signal.py): the next step's check stops the run
        self._go = {v: torch.tensor(v, device=self.device) for v in (True, False)}  # no copy per step
        self.log: dict = {}

    # ------------------------------------------------------------------ setup
    def _build_set(self) -> SparseCoder:
        """The set (this rank's slice of it), initialized as the appendix gives, on the device, ready for
        the optimizer (JumpReLU: log(theta))."""
        from transcoders import build_transcoders

        tc = build_transcoders(tdist.local_config(self.tcfg, self.d))
        tc.init_weights(torch.Generator().manual_seed(self.cfg.seed), shard=self.part)
        if tc.nonlinearity.trained_threshold:
            with torch.no_grad():
                tc.threshold.fill_(self.cfg.threshold_init)
        tc.to(self.device)
        tc.nonlinearity.begin_training(tc)
        return tc

    def _resume_or_start(self) -> tuple[int, dict, Tensor]:
        """(step, scales, last_fired) from this run's checkpoint (checkpoint.py step 3: or its `.old`),
        this rank's features only; or step 0 and the scales of the first block (train.py step 2)."""
        from transcoders.train_config import DEFAULTS, RESUME_FREE

        cfg = self.cfg
        if (resume := resume_folder(self.ckpt)) is not None:
            meta, state = read_checkpoint(resume, self.part)
            saved = meta["train_config"]
            now = json.loads(json.dumps(dataclasses.asdict(cfg)))  # as meta.json holds it: tuples are lists
            default = json.loads(json.dumps(DEFAULTS))
            differs = [
                k for k, v in now.items() if k not in RESUME_FREE and saved.get(k, default.get(k)) != v
            ]
            if differs:
                raise ConfigError(
                    f"{self.ckpt} was written by a run with different {differs}; rerun with the same options "
                    "to resume, or pass another --out to start afresh."
                )
            check_order(resume, meta, self.tc, self.opt)
            return apply_state(self.tc, self.opt, meta, state, resume)
        x0, y0 = self.store.block(0)
        scales = {
            "in": x0.pow(2).sum(-1).mean(0).div(self.tcfg.d_model).sqrt(),
            "out": y0.pow(2).sum(-1).mean(0).div(self.tcfg.d_model).sqrt(),
        }
        del x0, y0  # with cache_dir the batches stream from the shards: the block need not stay
        return 0, scales, torch.zeros(self.tcfg.n_layers, self.tc.cfg.d_sae, device=self.device)

    @property
    def weights(self) -> LossWeights:
        c = self.cfg
        return LossWeights(Penalty(c.penalty, c.sparsity_c), c.preact_coef, c.preact_form, c.auxk_coef)

    def _coder_step(self) -> nn.Module:
        """Step 3's module: the sparse TopK step where it applies (not feature-sharded, no pre-activation
        loss), wrapped in DDP when data parallel."""
        sparse = sparse_topk.supports(self.tc) and not self.d.shards_features and not self.cfg.preact_coef
        step = CoderStep(self.tc, self.weights, self.d, sparse)
        if not self.d.shards_batch:
            return step
        from torch.nn.parallel import DistributedDataParallel

        dev = self.device
        return DistributedDataParallel(step, device_ids=[dev.index] if dev.type == "cuda" else None)

    # ------------------------------------------------------------------ the step
    def step(self, x: Tensor, y: Tensor) -> StepOutput | None:
        """Steps 1-7 on one global batch `x` -> `y` (raw activations; data parallel, this rank's rows
        unless the store already gave them); None, and no step taken, when a rank was asked to stop
        (a SIGTERM, stop_signal.py)."""
        cfg, d, t = self.cfg, self.d, self.t
        for g in self.opt.param_groups:
            g["lr"] = lr_at(t, self.total, cfg.lr)
        if d.shards_batch and not self.store.sliced:  # this rank's rows of the global batch
            n = x.shape[0] // d.world
            x, y = x[d.rank * n : (d.rank + 1) * n], y[d.rank * n : (d.rank + 1) * n]
        # the batch's one copy from a host block (none from a block kept on the GPU)
        x, y = x.to(self.device), y.to(self.device)
        xn, yn = x / self.scales["in"][:, None], y / self.scales["out"][:, None]
        dead = dead_features(t, self.last_fired, self.dead_after)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=cfg.autocast):
            res = self.forward(xn, yn, sparsity_schedule(t, self.total, cfg.sparsity_coef), dead)
        # one host sync per step, here: the loss, and the weights the previous step's Adam wrote
        if not self._check_finite(res.loss.detach()):
            return None  # a SIGTERM on some rank: every rank stops before this step's backward
        self.opt.zero_grad(set_to_none=True)
        res.loss.backward()
        if d.shards_features:
            tdist.average_grads(self.replicated, d)
        if self.clip:  # the global norm, in float64 (torch's CPU norm drifts at 16384 features)
            tdist.clip_grad_norm(self.sharded, self.replicated, self.clip, d)
        self.opt.step()
        with torch.no_grad():
            self._weights_finite = self._all_weights_finite()  # checked with the next loss (no sync here)
            fired = tdist.any_over_ranks(res.fired, d) if d.shards_batch else res.fired
            self.last_fired.masked_fill_(fired, t)  # not last_fired[fired] = t: a boolean index syncs
        self.t += 1
        return res

    def _all_weights_finite(self) -> Tensor:
        return torch.stack([torch.isfinite(p).all() for p in self.tc.parameters()]).all()

    def _check_finite(self, loss: Tensor | None = None) -> bool:
        """Steps 4 and 6 in one host sync (over all ranks): this step's `loss` (None: none yet) and the
        weights of the step before, before anything changes them again. Returns False when a rank was
        asked to stop (a SIGTERM, stop_signal.py step 1), in the same sync."""
        after_adam = self._weights_finite is not None
        weights = self._weights_finite if after_adam else self._all_weights_finite()  # else: as set up
        loss_ok = torch.isfinite(loss).all() if loss is not None else weights
        flags = torch.stack([weights, loss_ok, self._go[not self.stop.asked]])
        ok_weights, ok_loss, go = tdist.all_true(flags, self.d)
        kept = f"training stopped and the last good checkpoint is kept in {self.ckpt}"
        if not ok_weights:
            when = f"at step {self.t - 1}" if after_adam else f"before step {self.t}"
            raise NonFiniteError(f"a weight became NaN or inf {when}; {kept} (lower --lr).")
        if not ok_loss:
            raise NonFiniteError(
                f"the loss became {loss.item()} at step {self.t}; {kept} (lower --lr, or check the model's "
                "activations)."
            )
        return go

    # ------------------------------------------------------------------ the run
    def checkpoint(self) -> None:
        """Checkpoint at the current step (feature-sharded: every rank its slice, checkpoint.py step 1)."""
        from transcoders.train_config import dist_barrier

        tc, d = self.tc, self.d
        self._check_finite()  # the last step's weights: a checkpoint holds finite ones only
        if d.shards_features:
            tensors, order, groups = state_tensors(tc, self.opt, self.scales, self.last_fired)
            write_checkpoint(
                self.ckpt, tensors, self.t, self.cfg, self.tcfg, order, groups, self.part, dist_barrier
            )
        elif d.main:
            save_checkpoint(self.ckpt, tc, self.opt, self.t, self.scales, self.last_fired, self.cfg)
        if d.active:
            dist_barrier()

    def fit(self, progress: bool = True, stop_after: int | None = None) -> None:
        """Steps until `total` (or `stop_after`), with a progress bar and periodic checkpoints."""

        cfg = self.cfg
        self.tc.train()  # BatchTopK: the batch rule, and its inference threshold is estimated
        bar = tqdm(
            total=self.total,
            initial=self.t,
            disable=not (progress and self.d.main),
            desc="train",
            mininterval=5.0,
        )
        with deferred_sigterm(self.d) as self.stop:  # SIGTERM: stop at a step (stop_signal.py)
            for x, y in self.store.batches(self.t):
                if self.t >= self.total or (stop_after is not None and self.t >= stop_after):
                    break
                tdist.mark(self.d, f"step {self.t}")  # read when a collective times out (distributed.py)
                res = self.step(x, y)
                if res is None:  # a SIGTERM on some rank: every rank stops at this step
                    self.stop.honoured = True
                    bar.close()
                    self.checkpoint()
                    raise Terminated(resumes_at(self.ckpt, self.t))
                if self.t % 20 == 0 or self.t == self.total:
                    self._record(res, bar)
                bar.update(1)
                if self.t % cfg.checkpoint_every == 0 and self.t < self.total:
                    self.checkpoint()
            bar.close()
            self.checkpoint()  # the last step's, whole before a SIGTERM acts (stop_signal.py step 4)

    def _record(self, res: StepOutput, bar) -> None:
        t = self.t
        lam = sparsity_schedule(t - 1, self.total, self.cfg.sparsity_coef)
        self.log = {"loss": res.loss.item(), "mse": res.mse.item(), "l0": res.l0.item(), "lambda": lam}
        window = max(1, DEAD_TOKENS // self.cfg.batch_size)  # AuxK's notion of dead, in steps
        if t > window:  # before, no feature can have been silent that long: no figure (it showed nan)
            with torch.no_grad():
                self.log["dead"] = ((t - self.last_fired) > window).float().mean().item()
        bar.set_postfix({k: f"{v:.3g}" for k, v in self.log.items()}, refresh=False)

    def finish(self, gather: bool = True) -> tuple[SparseCoder, dict]:
        """The trained set in eval mode, its scales folded in (unless stopped early), and the run's info.
        Feature-sharded with `gather`, rank 0 gets the whole set and the others their slice."""
        from transcoders import build_transcoders

        tc, d = self.tc, self.d
        tc.nonlinearity.end_training(tc)  # the plain threshold again, for gathering, folding and saving
        self.opt.state.clear()  # Adam's state is in the checkpoint; free it before rank 0 gathers the set
        del self.forward
        tc.zero_grad(set_to_none=True)
        if d.shards_features and gather:
            tc = tdist.gather_set(tc, build_transcoders(self.tcfg).to(self.device) if d.main else None, d)
        tc.eval()
        self.tc = tc
        if self.t < self.total:
            return tc, {"stopped_at": self.t}
        tc.fold_scales(self.scales["in"], self.scales["out"])
        return tc, {"steps": self.t, "train_log": self.log, "train_wall_s": time.time() - self.t0}

    def run(self, progress: bool = True, stop_after: int | None = None, gather: bool = True):
        """`fit`, then `finish`: what train.py's `train` returns."""
        self.fit(progress, stop_after)
        return self.finish(gather)
