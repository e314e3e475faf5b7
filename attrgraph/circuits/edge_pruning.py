"""Edge Pruning (Bhaskar et al., 2024): learn hard-concrete masks over edges (HAP seed sec. 3.3, eq. 2).

1. Each edge e has a gate z_e in [0, 1] (hard concrete, Louizos et al., 2018):
       u ~ U(0, 1),  s = sigmoid((log u - log(1 - u) + log_alpha_e) / beta),
       z_e = clamp(s (zeta - gamma) + gamma, 0, 1),   gamma = -0.1, zeta = 1.1,
   and P(z_e != 0) = sigmoid(log_alpha_e - beta log(-gamma / zeta)).
2. The masked model interpolates every edge toward the corrupted run:
   input_d = sum_u z_ud z_u + (1 - z_ud) z*_u (patching.py, keep = z).
3. Loss = KL(model || masked model) at the scored position
          + lambda_1 (s_hat - t) + lambda_2 (s_hat - t)^2,
   s_hat = 1 - mean_e P(z_e != 0) the expected sparsity over all edges of the graph,
   t the target sparsity, ramped linearly from the starting s_hat over the warm-up
   (a subgraph start, as in HAP, is already sparse); the log_alphas
   descend and the lambdas ascend (a Lagrangian, as Bhaskar et al.).
4. The circuit is the round((1 - t) n_edges) edges of largest log_alpha, so it has
   exactly the target sparsity. With `patience`, training stops once that edge set has
   not changed for `patience` steps after the warm-up (the same rule for EP and HAP,
   so their runtimes compare how fast each settles).
5. `allowed` restricts training to a subgraph (edges outside it are fixed at
   z = 0); `init` sets the starting log_alphas (HAP, hap.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from attrgraph.circuits.circuit import Circuit, EdgeLayout
from attrgraph.circuits.graph import ComponentGraph
from attrgraph.circuits.pairs import Pairs, check_pairs, last_logits
from attrgraph.circuits.patching import Activations, record_run, run_edges
from attrgraph.errors import OptionError, SparsityError
from transcoders.arguments import shown
from transcoders.model_state import check_differentiable, grad_mode

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

GAMMA, ZETA = -0.1, 1.1


@dataclass(frozen=True)
class PruneConfig:
    """Settings of one Edge Pruning run."""

    sparsity: float = 0.95
    """Target fraction of the graph's edges to remove, in (0, 1)."""
    steps: int = 200
    """Optimizer steps."""
    warmup: float = 0.5
    """Fraction of the steps over which the target sparsity ramps up from 0."""
    lr: float = 0.1
    """Adam learning rate of the log_alphas."""
    lr_lambda: float = 0.5
    """Learning rate (plain gradient ascent) of the Lagrange multipliers."""
    beta: float = 2.0 / 3.0
    """Hard-concrete temperature."""
    init_log_alpha: float = 3.0
    """Starting log_alpha of every edge (gates nearly open: the full model)."""
    batch_size: int = 32
    """Pairs per step."""
    seed: int = 0
    """Seed of the gate noise and the batch order."""
    patience: int = 0
    """Stop early once, after the warm-up, the top edges by log_alpha (the circuit) have not
    changed for this many steps; 0 runs every step."""

    def __post_init__(self):
        if not 0.0 < self.sparsity < 1.0:
            raise SparsityError(f"target sparsity must lie strictly between 0 and 1, got {self.sparsity}.")
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise OptionError(f"{name} is {getattr(self, name)}; pass at least 1.")
        for name in ("lr", "beta"):
            if not 0 < getattr(self, name) < float("inf"):
                raise OptionError(f"{name} is {getattr(self, name)}; pass a positive number.")
        if not 0 <= self.lr_lambda < float("inf") or not abs(self.init_log_alpha) < float("inf"):
            raise OptionError(
                f"lr_lambda is {self.lr_lambda} and init_log_alpha {self.init_log_alpha}; pass lr_lambda >= 0 "
                "and a finite init_log_alpha."
            )
        if not 0.0 <= self.warmup <= 1.0:
            raise OptionError(f"warmup is {self.warmup}; pass a fraction of the steps in [0, 1].")
        if self.patience < 0:
            raise OptionError(f"patience is {self.patience}; pass 0 (run every step) or more.")


class PruneResult(NamedTuple):
    """What an Edge Pruning run returns."""

    circuit: Circuit
    """The edges of largest log_alpha at the target sparsity."""
    log_alpha: Tensor
    """Learned log_alpha of every edge (flat order; -inf outside `allowed`)."""
    expected_sparsity: float
    """1 - mean P(gate != 0) at the end of training."""
    kl: list[float]
    """Training KL per step."""
    seconds: float
    """Wall-clock time of the run."""


def gate_open_prob(log_alpha: Tensor, beta: float) -> Tensor:
    return torch.sigmoid(log_alpha - beta * math.log(-GAMMA / ZETA))


def sample_gates(log_alpha: Tensor, beta: float, gen: torch.Generator) -> Tensor:
    u = torch.rand(log_alpha.shape, generator=gen, dtype=log_alpha.dtype, device=log_alpha.device)
    u = u.clamp(1e-6, 1 - 1e-6)
    s = torch.sigmoid((u.log() - (-u).log1p() + log_alpha) / beta)
    return (s * (ZETA - GAMMA) + GAMMA).clamp(0.0, 1.0)


def _slice(acts: Activations, idx) -> Activations:
    return Activations(*(x[idx] for x in acts))


def check_config(config) -> None:
    """`OptionError` in one line unless `config` is a `PruneConfig`."""
    if not isinstance(config, PruneConfig):
        raise OptionError(
            f"config is a {type(config).__name__} ({shown(config)}), not a PruneConfig; pass "
            "PruneConfig(sparsity=0.95, steps=200) or another."
        )


@grad_mode()  # inside a caller's torch.no_grad() or torch.inference_mode() too
def prune_edges(
    model: HookedTransformer,
    pairs: Pairs,
    config: PruneConfig,
    allowed: Tensor | None = None,
    init: Tensor | None = None,
) -> PruneResult:
    """Train edge masks at `config.sparsity` (module docstring). allowed/init: flat over the graph's edges."""
    start = time.perf_counter()
    check_config(config)
    graph = ComponentGraph.from_model(model)
    layout = EdgeLayout(graph)
    n = graph.n_edges
    check_pairs(pairs)
    check_differentiable({"the model": model}, "edge pruning")
    for what, mask in (("allowed", allowed), ("init", init)):
        if mask is not None and (not isinstance(mask, Tensor) or tuple(mask.shape) != (n,)):
            raise OptionError(
                f"{what} is {shown(mask)}; pass None or a tensor of one value per edge of the model's graph ({n},)."
            )
    device = next(model.parameters()).device  # the gates train on the model's device
    pairs = pairs.to(device)
    allowed = torch.ones(n, dtype=torch.bool, device=device) if allowed is None else allowed.bool().to(device)
    n_keep = round((1 - config.sparsity) * n)
    if int(allowed.sum()) < n_keep:
        raise SparsityError(
            f"the subgraph has {int(allowed.sum())} edges but sparsity {config.sparsity} keeps {n_keep}; "
            "keep a larger fraction of edges or ask for a higher sparsity."
        )
    params = list(model.parameters())
    was = [p.requires_grad for p in params]
    for p in params:  # gradients flow to the gates only
        p.requires_grad_(False)
    dtype = next(model.parameters()).dtype
    log_alpha = torch.full((int(allowed.sum()),), config.init_log_alpha, dtype=dtype, device=device)
    if init is not None:
        log_alpha = init.to(device)[allowed].to(dtype).clone()
    log_alpha.requires_grad_(True)
    lambdas = torch.zeros(2, dtype=dtype, device=device, requires_grad=True)
    opt = torch.optim.Adam([log_alpha], lr=config.lr)
    opt_l = torch.optim.SGD([lambdas], lr=config.lr_lambda, maximize=True)
    gen = torch.Generator(device=device).manual_seed(config.seed)
    with torch.no_grad():
        corr = record_run(model, pairs.corrupt)
        target_logp = last_logits(model(pairs.clean), pairs.last).log_softmax(-1)
    valid = graph.valid.to(device)
    with torch.no_grad():
        s0 = 1 - gate_open_prob(log_alpha, config.beta).sum().item() / n
    kls = []
    warm = max(1, int(config.warmup * config.steps))
    stable, last_top = 0, None
    try:
        for step in range(config.steps):
            idx = torch.randperm(len(pairs), generator=gen, device=device)[: config.batch_size]
            p = pairs[idx]
            flat = torch.zeros(n, dtype=dtype, device=device)
            flat = flat.masked_scatter(allowed, sample_gates(log_alpha, config.beta, gen))
            keep = torch.zeros(valid.shape, dtype=dtype, device=device).masked_scatter(valid, flat)
            run = run_edges(model, p.clean, corrupt=_slice(corr, idx), keep=keep)
            logq = last_logits(run.logits, p.last).log_softmax(-1)
            logp = target_logp[idx]
            kl = (logp.exp() * (logp - logq)).sum(-1).mean()
            s_hat = 1 - gate_open_prob(log_alpha, config.beta).sum() / n
            t = s0 + (config.sparsity - s0) * min(1.0, (step + 1) / warm)
            loss = kl + lambdas[0] * (s_hat - t) + lambdas[1] * (s_hat - t) ** 2
            opt.zero_grad()
            opt_l.zero_grad()
            loss.backward()
            with torch.device("cpu"):  # torch 2.11 (not 2.13) makes Adam's step count on the default device:
                opt.step()  # keep it on the host, where later releases put it (no device sync a step)
            opt_l.step()
            kls.append(kl.detach())  # read once after the loop, not a device sync per step
            if config.patience:
                top = frozenset(log_alpha.detach().topk(n_keep).indices.tolist())
                stable = stable + 1 if step >= warm and top == last_top else 0
                last_top = top
                if stable >= config.patience:
                    break
    finally:
        for p_, w in zip(params, was, strict=True):
            p_.requires_grad_(w)
    kls = torch.stack(kls).tolist() if kls else []
    final = torch.full((n,), float("-inf"), dtype=dtype, device=device)
    final[allowed] = log_alpha.detach()
    final = final.cpu()  # the result (masks, circuit) is host bookkeeping, as EAP's scores
    chosen = torch.zeros(n, dtype=torch.bool, device="cpu")
    chosen[final.topk(n_keep).indices] = True
    s_hat = 1 - gate_open_prob(log_alpha.detach(), config.beta).sum().item() / n
    circuit = Circuit.from_flat(layout, chosen, "ep", {"sparsity": config.sparsity, "steps": config.steps})
    return PruneResult(circuit, final, s_hat, kls, time.perf_counter() - start)
