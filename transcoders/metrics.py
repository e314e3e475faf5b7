"""How good a transcoder set is: reconstruction, sparsity, and the model with sets spliced in.

Seed: circuit-tracing appendix ("Validating the Replacement Model"; the (MSE, L0) and
(replacement KL, L0) frontiers of "Efficiency relative to alternatives"); linear-computation-graphs
appendix A.3 (the same CE score for attention-output SAEs, MLP transcoders and residual SAEs).

1. On activations `(x, y)`: per-layer fraction of variance unexplained
   `FVU[l] = sum ||y - y_hat||^2 / sum ||y - mean(y)||^2`, L0 per layer (mean active features
   per token), dead fraction (features never active on the tokens seen).
2. On held-out token sequences: next-token cross-entropy of the model (a) as is, (b) with the
   write hook of every layer (the MLP output for a PLT / CLT, `blocks.{l}.hook_attn_out` for an
   attention SAE) replaced by the set's output (all layers at once, no error terms; each layer's
   features read the *replaced* model's activations), (c) with those write hooks zeroed.
   `CE loss recovered = (CE_zero - CE_replaced) / (CE_zero - CE_orig)`; KL(orig || replaced)
   is averaged over positions.
3. Position 0 (BOS at position 0 has a constant residual stream) keeps the model's own value
   at the write hook in (b) and (c) alike: the sets never train on it, and it is a constant.
4. Several sets at once (`spliced_metrics(model, [sae, plt], tokens)`, e.g. attention SAEs with
   MLP transcoders): (b) splices every set in, (c) zeroes every write hook of every set, and the
   same formula gives one CE loss recovered; `replacement_metrics` is the case of one set. Each
   set reads the model as the sets before it in the forward pass left it. Two sets may not write
   the same hook.
5. A feature-sharded set (`distributed.FeatureShard`, every rank calling with the same tokens)
   evaluates as the whole set would: its reconstructions and decoded layers are summed over the
   ranks, and L0 and the counts of fired features by `sum_over_shards`; no rank holds the set.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from jaxtyping import Int
from torch import Tensor

from transcoders.errors import ConfigError
from transcoders.model_state import check_no_hooks
from transcoders.sites import MLP_INPUT, post_norm, raw_output_needed, read_value

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from transcoders.base import SparseCoder


@torch.no_grad()
def reconstruction_metrics(tc: SparseCoder, x: Tensor, y: Tensor, batch_size: int = 4096) -> dict:
    """Step 1 on `x, y` of shape [tokens, n_layers, d_model]."""
    L, dev = tc.n_layers, tc.device
    # sums stay on the set's device; one copy of each to the host at the end
    err = torch.zeros(L, dtype=torch.float64, device=dev)
    l0 = torch.zeros(L, dtype=torch.float64, device=dev)
    fired = torch.zeros(L, tc.d_sae, dtype=torch.bool, device=dev)
    for xb, yb in zip(x.split(batch_size), y.split(batch_size), strict=True):
        res = tc(xb.to(dev, tc.dtype))
        err += (res.out.double() - yb.to(dev).double()).pow(2).sum(dim=(0, 2))
        active = res.acts > 0
        l0 += active.sum(dim=(0, 2)).double()
        fired |= active.any(0)
    # a feature-sharded set (distributed.FeatureShard) counts its features over every rank (step 5)
    total = getattr(tc, "sum_over_shards", lambda t: t)
    l0, n_fired = total(l0), total(fired.sum(-1))
    n_features = total(torch.full_like(n_fired, fired.shape[1]))  # per layer
    err, l0, n_fired, n_features = err.cpu(), l0.cpu(), n_fired.double().cpu(), n_features.double().cpu()
    var = (y.double() - y.double().mean(0)).pow(2).sum(dim=(0, 2))
    fvu = (err / var).tolist()
    return {
        "fvu": fvu,
        "fvu_mean": sum(fvu) / L,
        "l0": (l0 / x.shape[0]).tolist(),
        "l0_mean": float(l0.sum() / x.shape[0] / L),
        "dead_fraction": (1 - n_fired / n_features).tolist(),
        "dead_fraction_total": float(1 - n_fired.sum() / n_features.sum()),
        "n_tokens": int(x.shape[0]),
    }


def _splice_hooks(model, tc, mode: str):
    """Forward hooks that replace (mode "tc") or zero (mode "zero") the write hook of every layer of
    `tc`, except position 0 (step 4)."""
    cfg = tc.cfg
    state: dict = {"acts": [None] * cfg.n_layers}
    hooks = []

    def read(value, hook, l):
        x = read_value(model, {hook.name: value}, l, cfg.input_hook) if cfg.input_hook == MLP_INPUT else value
        x = x.to(tc.dtype)
        state["acts"][l] = tc.activate_layer(tc.encode_layer(x, l), l)
        if tc.W_skip is not None:
            state.setdefault("skip", {})[l] = x @ tc.W_skip[l]
        return value

    def write(value, hook, l):
        if mode == "zero":
            new = torch.zeros_like(value)
        else:
            new = tc.decode_layer(state["acts"], l).expand_as(value).clone()
            if tc.W_skip is not None:
                new = new + state["skip"][l]
            if raw_output_needed(model, cfg, l):
                new = post_norm(model, l)(new)
        new = new.to(value.dtype)
        new[:, 0] = value[:, 0]
        return new

    for l in range(cfg.n_layers):
        if mode == "tc":  # before the write hook: an SAE reads the value it then replaces
            hooks.append((cfg.hook_in(l), lambda v, hook, l=l: read(v, hook, l)))
        hooks.append((cfg.hook_out(l), lambda v, hook, l=l: write(v, hook, l)))
    return hooks


def splice_hooks(model: HookedTransformer, sets: Sequence[SparseCoder], mode: str = "tc") -> list:
    """TransformerLens forward hooks splicing every set of `sets` in at once (mode "tc") or zeroing
    every write hook they cover (mode "zero"), position 0 left as is (steps 2-4).

    Raises `ConfigError` when two sets write the same hook: which of them would win is not defined."""
    if mode not in ("tc", "zero"):
        raise ValueError(f"mode {mode!r} is not 'tc' or 'zero'")
    written: dict[str, int] = {}
    hooks = []
    for i, tc in enumerate(sets):
        for l in range(tc.n_layers):
            name = tc.cfg.hook_out(l)
            if name in written:
                raise ConfigError(
                    f"sets {written[name]} and {i} both write {name!r}; splice sets that write different hooks."
                )
            written[name] = i
        hooks += _splice_hooks(model, tc, mode)
    return hooks


@torch.no_grad()
def spliced_metrics(
    model: HookedTransformer,
    sets: Sequence[SparseCoder],
    tokens: Int[Tensor, "batch n_pos"],
    batch_size: int = 16,
) -> dict:
    """Steps 2 and 4: CE of the original model, with every set of `sets` spliced in at once, and with
    all their write hooks zeroed; CE loss recovered and KL(orig || spliced)."""
    if not sets:
        raise ValueError("spliced_metrics needs at least one transcoder set")
    check_no_hooks(model, "enter the original run and the spliced ones alike: metrics of the hooked model")
    tot = {"orig": 0.0, "tc": 0.0, "zero": 0.0, "kl": 0.0}
    n = 0
    for chunk in tokens.split(batch_size):
        chunk = chunk.to(model.cfg.device)
        logp = {"orig": model(chunk).log_softmax(-1)}
        for mode in ("tc", "zero"):
            logp[mode] = model.run_with_hooks(chunk, fwd_hooks=splice_hooks(model, sets, mode)).log_softmax(
                -1
            )
        target = chunk[:, 1:]
        for k in ("orig", "tc", "zero"):
            tot[k] += -logp[k][:, :-1].gather(-1, target[..., None]).sum().item()
        p = logp["orig"][:, :-1].exp()
        tot["kl"] += (p * (logp["orig"][:, :-1] - logp["tc"][:, :-1])).sum().item()
        n += target.numel()
    ce = {k: tot[k] / n for k in ("orig", "tc", "zero")}
    return {
        "ce_orig": ce["orig"],
        "ce_replaced": ce["tc"],
        "ce_zero_ablated": ce["zero"],
        "ce_loss_recovered": (ce["zero"] - ce["tc"]) / (ce["zero"] - ce["orig"]),
        "kl_to_orig": tot["kl"] / n,
        "n_tokens": n,
    }


def replacement_metrics(
    model: HookedTransformer, tc: SparseCoder, tokens: Int[Tensor, "batch n_pos"], batch_size: int = 16
) -> dict:
    """Step 2 for one set: `spliced_metrics(model, [tc], tokens)`."""
    return spliced_metrics(model, [tc], tokens, batch_size)
