"""Edge-level patching of a TransformerLens model with hooks (Bhaskar et al., 2024; PEAP seed eqs. 3-6).

One forward computes the model with every edge interpolated between the current
run and a cached corrupted run:

1. Record the corrupted run: the output z*_u of every upstream node (graph.py),
   and per head the q, k, v vectors (rotated for rotary models).
2. In the patched run, each downstream input hook (`hook_q_input`, `hook_k_input`,
   `hook_v_input`, `hook_mlp_in`, the last `hook_resid_post`) receives
       x_d  <-  x_d + sum_u (1 - keep[u, d]) (z*_u - z_u)
   where z_u is u's output in this run. keep = 1 everywhere is the unpatched
   model; keep = 0 on an edge gives d the corrupted value of that edge.
   `keep` may carry a position axis (positional circuits) and a batch axis
   (schema circuits, whose spans sit at different positions per example).
3. Cross-position attention edges (positional circuits only): for a head at query
   position t and key position t', with keep coefficients m_q, m_k, m_v,
       score[t, t'] = (m_q q_t + (1-m_q) q*_t) . (m_k k_t' + (1-m_k) k*_t') / attn_scale
       z_t          = sum_t' A[t, t'] (m_v v_t' + (1-m_v) v*_t')
   (patch q at t only in its product with k_t', k and v at t' only for query t:
   eqs. 4-6 of the PEAP seed), written into `hook_attn_scores` and `hook_z`.
4. `input_alpha` moves the input node along z*_in + alpha (z_in - z*_in), the path
   of EAP-IG (Hanna et al., 2024).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, NamedTuple

import torch
from jaxtyping import Float, Int
from torch import Tensor

from attrgraph.circuits.graph import ComponentGraph
from attrgraph.errors import OptionError, UnsupportedModelError
from transcoders.block_layout import BlockLayout
from transcoders.model_state import check_no_hooks

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

FLAGS = ("use_split_qkv_input", "use_attn_result", "use_hook_mlp_in", "ungroup_grouped_query_attention")


class Activations(NamedTuple):
    """What a run records, for use as the corrupted (or clean) reference of a patched run."""

    z: Float[Tensor, "batch pos n_up d_model"]
    """Output of each upstream node."""
    q: Float[Tensor, "batch pos n_layers n_heads d_head"]
    """Queries (after rotary, where the model has it)."""
    k: Float[Tensor, "batch pos n_layers n_heads d_head"]
    """Keys (after rotary, where the model has it)."""
    v: Float[Tensor, "batch pos n_layers n_heads d_head"]
    """Values."""
    pattern: Float[Tensor, "batch n_layers n_heads pos pos"]
    """Attention patterns [query t, key t']."""
    logits: Float[Tensor, "batch pos d_vocab"]
    """Output logits."""


class EdgeRun(NamedTuple):
    """One patched forward: logits plus the tensors a gradient may be taken against."""

    logits: Float[Tensor, "batch pos d_vocab"]
    """Output logits of the patched model."""
    inputs: list[Tensor]
    """Downstream inputs in graph order, grouped per hook: per layer q, k, v inputs
    `[batch pos n_heads d_model]` and the MLP input `[batch pos d_model]`, then the logits input."""
    results: list[Tensor]
    """Per layer, the head outputs `hook_result` `[batch pos n_heads d_model]`."""
    acts: Activations | None
    """Everything recorded, when `record=True` (detached)."""


@contextmanager
def component_hooks(model: HookedTransformer) -> Iterator[ComponentGraph]:
    """Turn on the TransformerLens hooks the component graph needs, and restore the flags after.

    Grouped-query attention runs ungrouped (each key/value head's weights repeated for the query
    heads of its group): the same function, with k and v inputs per query head (graph.py step 2)."""
    graph = ComponentGraph.from_model(model)
    old = {f: getattr(model.cfg, f) for f in FLAGS}
    model.cfg.use_split_qkv_input = True
    model.cfg.use_attn_result = True
    model.cfg.use_hook_mlp_in = graph.has_mlp
    model.cfg.ungroup_grouped_query_attention = True  # no-op without grouped-query attention
    try:
        yield graph
    finally:
        for f, v in old.items():
            setattr(model.cfg, f, v)


def _as4(keep: Tensor | None) -> Tensor | None:
    if keep is None:
        return None
    while keep.dim() < 4:
        keep = keep.unsqueeze(0)
    return keep


def run_edges(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    corrupt: Activations | None = None,
    keep: Tensor | None = None,
    attn_keep: Tensor | None = None,
    input_alpha: float | None = None,
    record: bool = False,
) -> EdgeRun:
    """Run `model` on `tokens` with edges interpolated toward `corrupt` (see the module docstring).

    keep: `[n_up n_down]`, `[pos n_up n_down]` or `[batch pos n_up n_down]` keep coefficients
        (1 = this run's value, 0 = corrupted); None keeps every residual edge.
    attn_keep: `[batch|1 n_layers n_heads 3 pos pos]` keep coefficients of the cross-position
        q/k/v edges (query t, key t'); None keeps them all.
    """
    check_no_hooks(  # a session's hooks (transcoders/model_state.py), before ours go on
        model,
        "change the runs patched but not the residual sums the component graph is built on, a circuit of neither model",
    )
    if (keep is not None or attn_keep is not None or input_alpha is not None) and corrupt is None:
        raise OptionError("patching needs the corrupted run's activations; pass corrupt=record_run(...).")
    with component_hooks(model) as g:
        layout = BlockLayout.of(model.cfg)
        why = layout.unsupported("cross_position") if attn_keep is not None else None
        if why is not None:
            raise UnsupportedModelError(f"cross-position patching cannot run on this model: {why}.")
        # keep masks (host bookkeeping, circuit.py) go to the model's device once per run
        keep = None if keep is None else _as4(keep).to(tokens.device)
        attn_keep = None if attn_keep is None else attn_keep.to(tokens.device)
        H = g.n_heads
        outs: list[Tensor] = []
        inputs: list[Tensor] = []
        results: list[Tensor] = []
        rec: dict[str, list[Tensor]] = {"q": [], "k": [], "v": [], "pattern": []}
        cur: dict[str, Tensor] = {}
        delta_cache: dict[int, Tensor] = {}
        zc = corrupt.z if corrupt is not None else None

        def deltas(n: int) -> Tensor:
            if n not in delta_cache:
                delta_cache[n] = zc[:, :, :n] - torch.stack(outs[:n], dim=2)
            return delta_cache[n]

        def patch_in(x: Tensor, n: int, d0: int, d1: int) -> Tensor:
            if keep is not None:
                coef = 1.0 - keep[..., :n, d0:d1].to(x.dtype)
                add = torch.einsum("btud,btuh->bthd", deltas(n), coef.expand(x.shape[0], x.shape[1], -1, -1))
                x = x + (add if x.dim() == 4 else add[:, :, 0])
            inputs.append(x)
            return x

        def hook_input(x, hook):
            if input_alpha is not None:
                x = zc[:, :, 0] + input_alpha * (x - zc[:, :, 0])
            if torch.is_grad_enabled() and not x.requires_grad:  # frozen weights: still trace activations
                x = x.detach().requires_grad_(True)
            outs.append(x)
            return x

        def make_layer_hooks(layer: int):
            n_attn, n_mlp = g.n_up_before(layer), g.n_up_before(layer, mlp=True)
            attn = model.blocks[layer].attn

            def qkv_in(slot):
                d0 = g.down_head(layer, slot, 0)
                return lambda x, hook: patch_in(x, n_attn, d0, d0 + H)

            def grab(name):
                def fn(x, hook):
                    cur[name] = x
                    if record:
                        rec[name].append(x.detach())
                    return x

                return fn

            def scores(x, hook):
                if attn_keep is None:
                    return x
                m = attn_keep[:, layer].to(x.dtype)  # [b h 3 t t']
                mq, mk = m[:, :, 0], m[:, :, 1]
                q, k = cur["q"], cur["k"]
                qc, kc = corrupt.q[:, :, layer], corrupt.k[:, :, layer]
                dot = lambda a, b: torch.einsum("bthd,bshd->bhts", a, b)  # noqa: E731
                s = (
                    mq * mk * dot(q, k)
                    + mq * (1 - mk) * dot(q, kc)
                    + (1 - mq) * mk * dot(qc, k)
                    + (1 - mq) * (1 - mk) * dot(qc, kc)
                ) / attn.attn_scale
                causal = torch.ones(x.shape[-2], x.shape[-1], dtype=torch.bool, device=x.device).tril()
                return torch.where(causal, s, x)

            def z_hook(x, hook):
                if attn_keep is None:
                    return x
                mv = attn_keep[:, layer, :, 2].to(x.dtype)
                dv = corrupt.v[:, :, layer] - cur["v"]
                return x + torch.einsum("bhts,bshd->bthd", cur["pattern"] * (1 - mv), dv)

            def result(x, hook):
                results.append(x)
                outs.extend(x[:, :, h] for h in range(H))
                delta_cache.clear()
                return x

            def mlp_in(x, hook):
                return patch_in(x, n_mlp, g.down_mlp(layer), g.down_mlp(layer) + 1)

            def mlp_out(x, hook):
                outs.append(x)
                delta_cache.clear()
                return x

            hooks = [(layout.hook(f"{s}_input", layer), qkv_in(i)) for i, s in enumerate("qkv")]
            hooks += [
                (layout.q(layer), grab("q")),
                (layout.k(layer), grab("k")),
                (layout.hook("v", layer), grab("v")),
                (layout.hook("attn_scores", layer), scores),
                (layout.hook("pattern", layer), grab("pattern")),
                (layout.hook("z", layer), z_hook),
                (layout.hook("result", layer), result),
            ]
            if g.has_mlp:
                hooks += [(layout.hook("mlp_in", layer), mlp_in), (layout.hook("mlp_out", layer), mlp_out)]
            return hooks

        def logits_in(x, hook):
            return patch_in(x, g.n_up, g.down_logits, g.down_logits + 1)

        hooks = [(layout.hook("resid_pre", 0), hook_input)]
        for layer in range(g.n_layers):
            hooks += make_layer_hooks(layer)
        hooks.append((layout.hook("resid_post", g.n_layers - 1), logits_in))
        logits = model.run_with_hooks(tokens, fwd_hooks=hooks)

    acts = None
    if record:
        acts = Activations(
            z=torch.stack(outs, dim=2).detach(),
            q=torch.stack(rec["q"], dim=2),
            k=torch.stack(rec["k"], dim=2),
            v=torch.stack(rec["v"], dim=2),
            pattern=torch.stack(rec["pattern"], dim=1),
            logits=logits.detach(),
        )
    return EdgeRun(logits, inputs, results, acts)


@torch.no_grad()
def record_run(model: HookedTransformer, tokens: Int[Tensor, "batch pos"]) -> Activations:
    """Activations of an unpatched run (use on the corrupted prompts, then patch toward them)."""
    return run_edges(model, tokens, record=True).acts


def input_grads(run: EdgeRun, m: Tensor, with_results: bool = False):
    """Gradients of `m.sum()` at the downstream inputs, stacked `[batch pos n_down d_model]`
    in downstream order, and (optionally) at the head outputs, `[batch pos n_layers n_heads d_model]`."""
    tensors = run.inputs + (run.results if with_results else [])
    grads = torch.autograd.grad(m.sum(), tensors, allow_unused=True)
    grads = [torch.zeros_like(t) if gr is None else gr for t, gr in zip(tensors, grads, strict=True)]
    n_in = len(run.inputs)
    g_in = torch.cat([gr if gr.dim() == 4 else gr.unsqueeze(2) for gr in grads[:n_in]], dim=2)
    g_res = torch.stack(grads[n_in:], dim=2) if with_results else None
    return g_in, g_res
