"""The local replacement model (seed: circuit-tracing appendix, "Attribution Graph Computation").

1. `run`: one forward of the underlying TransformerLens model on the prompt records every
   attention pattern (`attn.hook_pattern`), every normalization scale (`ln*.hook_scale`,
   LayerNorm or RMSNorm), the transcoders' read values `x[l]` and write targets `y[l]` (the MLP
   inputs and outputs, `transcoders.sites`), the logits and the embeddings.
2. Transcoder features `a = act(x @ W_enc + b_enc)`; the error `e[l] = y[l] - tc(x)[l]` (tc output
   including `b_dec` and the skip) is held constant. With `exclude_bos` (circuit-tracer's
   convention) position 0 has no features and no error: its MLP output is a constant.
3. The frozen replacement forward (`forward`, in frozen.py's context) runs the model with patterns
   and scales replaced by the recorded values and every MLP output replaced by
       `w[l, p] = decode(a)[l, p] + e[l, p] + x[l, p] @ W_skip[l]`          (p included)
       `w[l, 0] = y[l, 0] - x_rec[l, 0] @ W_skip[l] + x[l, 0] @ W_skip[l]`    (p = 0 excluded)
   where `x` is the live read value: the MLP's own nonlinearity gets no gradient (stop-gradient
   on MLP outputs) and only the transcoder's linear skip carries one. With everything at its
   recorded value this reproduces the model's logits; as a function of the sources
   {embeddings, activations `a`, errors `e`} it is linear (affine), which is what makes the
   attribution graph exact.
4. Attention soft-capping sits inside the frozen pattern, so it is covered; Gemma-2's `ln1_post`
   and `ln2_post` are norms with frozen scales. A final logit soft-cap is not linear:
   `cfg.output_logits_soft_cap` must be 0 (set it to 0 on the model, as circuit-tracer requires).
5. Embedding nodes: by default the token and positional embeddings of a position are folded into
   one node (`embedding="token+position"`); `embedding="token"` makes the node `W_E[token]` only
   and leaves the positional embedding in the bias, which is circuit-tracer's convention.
6. Attention features (seed: linear-computation-graphs, section 2; sets.py): with an attention-
   output SAE set, every attention output `blocks.{l}.hook_attn_out` is replaced exactly as the
   MLP outputs are: the run records `z[l]` (the attention output), the SAE's features
   `a_attn = act(z @ W_enc + b_enc)` and the error `e_attn = z - sae(z)`; the frozen forward reads
   the live attention output (computed from the live residual stream through the frozen pattern,
   V and O: the read value of the attention features) and writes `decode(a_attn) + e_attn` in its
   place (stop-gradient on the attention output; excluded positions write the recorded `z`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
from jaxtyping import Float, Int
from torch import Tensor

from attrgraph.bundled.loading import check_model
from attrgraph.engine.finite import check_state
from attrgraph.engine.frozen import frozen_forward
from attrgraph.engine.sets import transcoder_sets
from attrgraph.errors import OptionError, UnsupportedModelError
from transcoders import block_layout, sites
from transcoders.block_layout import BlockLayout
from transcoders.errors import TranscoderMismatchError
from transcoders.model_state import check_differentiable, check_no_hooks

EMBEDDING_MODES = ("token+position", "token")

GRAPH_EFFECT = (
    "change the forwards a graph is computed from but not what attrgraph differentiates by hand, a "
    "result of neither model"
)
"""What hooks left on a model would do to a graph (`ReplacementModel.run`, unless `hooks_allowed`)."""


class ReplacementState(NamedTuple):
    """What one forward of the underlying model records (`ReplacementModel.run`)."""

    tokens: Int[Tensor, " n_pos"]
    """The prompt ids as the model saw them."""
    logits: Float[Tensor, "n_pos d_vocab"]
    """The model's logits."""
    frozen: dict[str, Tensor]
    """Recorded attention patterns and normalization scales, by hook name (batch 1)."""
    x_in: Float[Tensor, "n_layers n_pos d_model"]
    """Transcoder read values (MLP inputs)."""
    y_out: Float[Tensor, "n_layers n_pos d_model"]
    """Write targets (MLP outputs at the write site)."""
    pre_acts: Float[Tensor, "n_layers n_pos d_sae"]
    """Encoder pre-activations `x @ W_enc + b_enc`."""
    acts: Float[Tensor, "n_layers n_pos d_sae"]
    """Feature activations, zero at excluded positions."""
    errors: Float[Tensor, "n_layers n_pos d_model"]
    """`y - tc(x)`, zero at excluded positions."""
    skip: Float[Tensor, "n_layers n_pos d_model"]
    """The skip term `x @ W_skip` at the recorded read values (zeros without a skip)."""
    embed: Float[Tensor, "n_pos d_model"]
    """Output vector of each embedding node (see `embedding` mode)."""
    n_excluded: int
    """Leading positions without feature or error nodes (1 with exclude_bos, else 0)."""
    embedding: str
    """"token+position" or "token"."""
    attn_out: Float[Tensor, "n_layers n_pos d_model"] | None = None
    """Attention outputs `hook_attn_out` (step 6; None without an attention set)."""
    attn_pre_acts: Float[Tensor, "n_layers n_pos d_attn"] | None = None
    """Attention SAE pre-activations."""
    attn_acts: Float[Tensor, "n_layers n_pos d_attn"] | None = None
    """Attention feature activations, zero at excluded positions."""
    attn_errors: Float[Tensor, "n_layers n_pos d_model"] | None = None
    """`z - sae(z)`, zero at excluded positions."""


class _FrozenRun:
    """Bookkeeping of one frozen forward: constants, live reads, gradient probes."""

    def __init__(self, rm: ReplacementModel, constant: Tensor, batch: int, probes: bool):
        L = rm.cfg.n_layers
        self.rm = rm
        self.constant = constant  # [L, P, d] (or [B, L, P, d])
        self.batch = batch
        self.reads: list[Tensor | None] = [None] * L
        self.captured: dict[str, Tensor] = {}
        P, D = constant.shape[-2], constant.shape[-1]
        dtype = constant.dtype
        make = (
            (lambda: torch.zeros(batch, P, D, dtype=dtype, device=constant.device, requires_grad=True))
            if probes
            else (lambda: None)
        )
        self.embed_probe = make()
        self.write_probes = [make() for _ in range(L)]
        # step 6: attention outputs (only with an attention set)
        self.attn_constant: Tensor | None = None
        self.attn_reads: list[Tensor | None] = [None] * L
        self.attn_probes = [make() for _ in range(L)] if rm.attn is not None else [None] * L

    def attn_write(self, layer: int, x: Tensor) -> Tensor:
        """Step 6: keep the live attention output `x` (the attention features' read value) and
        return `decode(a_attn) + e_attn` (plus the probe) in its place."""
        self.attn_reads[layer] = x
        c = self.attn_constant[..., layer, :, :]
        out = c.to(x.dtype).expand(x.shape)
        if self.attn_probes[layer] is not None:
            out = out + self.attn_probes[layer]
        return out

    def read(self, layer: int, x: Tensor) -> None:
        self.reads[layer] = x

    def write_value(self, layer: int) -> Tensor:
        c = self.constant[..., layer, :, :]
        out = c.expand(self.batch, *c.shape[-2:])
        if self.rm.tc.W_skip is not None:
            x = self.reads[layer]
            out = out + x @ self.rm.tc.W_skip[layer].detach().to(x.dtype)
        if self.write_probes[layer] is not None:
            out = out + self.write_probes[layer]
        return out


class ReplacementModel:
    """A HookedTransformer with a transcoder set (PLT with or without skip, or CLT) replacing its MLPs,
    and optionally an SAE set replacing its attention outputs (`[mlp_set, attn_set]`, sets.py)."""

    def __init__(self, model, transcoders):
        check_model(model)
        sets = transcoder_sets(model, transcoders)
        transcoders = sets.mlp
        sites.check_fits(model, transcoders)
        if transcoders.cfg.is_sae:
            raise TranscoderMismatchError(
                "attribution needs transcoders that replace the MLP (kind 'plt' or 'clt'), got an SAE; "
                "load a transcoder set instead."
            )
        if not transcoders.per_token:
            raise TranscoderMismatchError(
                f"the {transcoders.cfg.activation} set is in training mode, where a feature depends on the other tokens of "
                "the batch; call .eval() on it (load_transcoders returns it so) to use its per-token threshold."
            )
        if transcoders.cfg.output_hook != sites.MLP_OUTPUT:
            raise TranscoderMismatchError(
                f"the transcoders write {transcoders.cfg.output_hook!r}; the replacement model needs them "
                f"to write the MLP output {sites.MLP_OUTPUT!r}."
            )
        where = next(model.parameters()).device
        if transcoders.device != where:
            raise TranscoderMismatchError(
                f"the transcoders are on {transcoders.device} but the model is on {where}; move them "
                "with transcoders.to(model.cfg.device) (attribution keeps both on one device)."
            )
        why = BlockLayout.of(model.cfg).unsupported("replacement")
        if why is not None:
            raise UnsupportedModelError(f"this model cannot be attributed: {why}.")
        self.model = model
        self.tc = transcoders
        self.attn = sets.attn
        """The attention-output SAE set, or None (step 6)."""
        self.sets = sets
        self.cfg = model.cfg
        self.frozen_hooks = [n for n in model.hook_dict if block_layout.is_frozen(n)]

    @classmethod
    def of(cls, model, transcoders) -> ReplacementModel:
        """The replacement model a public call works on: `transcoders` itself when it is one (built on
        `model`: a replacement model of another model would answer for that one, silently), else a
        new one of `model` with the set(s) `transcoders`."""
        if not isinstance(transcoders, ReplacementModel):
            return cls(model, transcoders)
        if transcoders.model is not model:
            raise TranscoderMismatchError(
                "the ReplacementModel passed was built on another model than the one passed beside it; "
                "pass its own model (rm.model), or build one for this model with ReplacementModel(model, sets)."
            )
        return transcoders

    def check_differentiable(self, doing: str) -> None:
        """`ModelStateError` when the model or a set was made under `torch.inference_mode()`, which
        `doing` (a call that differentiates the frozen model) cannot differentiate."""
        check_differentiable(
            {"the model": self.model, "the transcoders": self.tc, "the attention SAEs": self.attn}, doing
        )

    @property
    def layout(self) -> BlockLayout:
        """The model's block: hook names and flags (transcoders/block_layout.py), read from its config now."""
        return BlockLayout.of(self.cfg)

    @property
    def dtype(self) -> torch.dtype:
        return self.cfg.dtype

    # ------------------------------------------------------------------ step 1-2
    @torch.no_grad()
    def run(
        self,
        tokens: Int[Tensor, " n_pos"],
        exclude_bos: bool = True,
        embedding: str = "token+position",
        hooks_allowed: bool = False,
    ) -> ReplacementState:
        """One forward of the underlying model; records everything the frozen model needs.

        Hooks on the model are refused (`ModelStateError`, transcoders/model_state.py): a graph, its
        validation or its head loadings would come from forwards that run them and products that do
        not (the linear engine differentiates by hand). `hooks_allowed=True` is for interventions,
        which take the model as it is."""
        if embedding not in EMBEDDING_MODES:
            raise OptionError(f"embedding is {embedding!r}; pass one of {EMBEDDING_MODES}.")
        if not hooks_allowed:
            check_no_hooks(self.model, GRAPH_EFFECT)
        cfg = self.tc.cfg
        names = (
            set(self.frozen_hooks)
            | set(sites.cache_hooks(self.model, cfg))
            | {block_layout.EMBED, block_layout.POS_EMBED}
            | set(self.attn_hooks())
        )
        tokens = tokens.to(self.cfg.device)
        logits, cache = self.model.run_with_cache(tokens[None], names_filter=lambda n: n in names)
        L = cfg.n_layers
        x_in = torch.stack([sites.read_value(self.model, cache, l, cfg.input_hook)[0] for l in range(L)])
        y_out = torch.stack([sites.write_target(self.model, cache, l, cfg)[0] for l in range(L)])
        tc_dtype = self.tc.dtype
        xt = x_in.transpose(0, 1).to(tc_dtype)  # [P, L, d]
        out = self.tc(xt)
        n_excluded = 1 if exclude_bos else 0
        acts = out.acts.clone()
        acts[:n_excluded] = 0
        errors = (y_out.transpose(0, 1) - out.out.to(y_out.dtype)).clone()
        errors[:n_excluded] = 0
        skip = (
            self.tc.skip(xt).to(y_out.dtype)
            if self.tc.W_skip is not None
            else torch.zeros_like(xt, dtype=y_out.dtype)
        )
        embed = cache[block_layout.EMBED][0]
        if embedding == "token+position" and block_layout.POS_EMBED in cache:
            embed = embed + cache[block_layout.POS_EMBED][0]
        attn = self._run_attention(cache, n_excluded, y_out.dtype) if self.attn is not None else {}
        check_state(  # finite.py: NaN here would become a graph of 0 features and NaN edges
            {
                "logits": logits,
                "feature activations": acts,
                "error values": errors,
                "attention feature activations": attn.get("attn_acts"),
                "attention error values": attn.get("attn_errors"),
            }
        )
        return ReplacementState(
            tokens=tokens,
            logits=logits[0],
            frozen={n: cache[n] for n in self.frozen_hooks if n in cache},
            x_in=x_in,
            y_out=y_out,
            pre_acts=out.pre_acts.transpose(0, 1).to(y_out.dtype),
            acts=acts.transpose(0, 1).to(y_out.dtype),
            errors=errors.transpose(0, 1),
            skip=skip.transpose(0, 1),
            embed=embed,
            n_excluded=n_excluded,
            embedding=embedding,
            **attn,
        )

    def attn_hooks(self) -> list[str]:
        """The hooks the attention set replaces (none without one)."""
        if self.attn is None:
            return []
        return [self.attn.cfg.hook_out(l) for l in range(self.cfg.n_layers)]

    def _run_attention(self, cache, n_excluded: int, dtype) -> dict:
        """Step 6 on the recorded forward: attention outputs, SAE features and errors."""
        z = torch.stack([cache[h][0] for h in self.attn_hooks()])  # [L, P, d]
        out = self.attn(z.transpose(0, 1).to(self.attn.dtype))
        acts = out.acts.clone()
        acts[:n_excluded] = 0
        errors = (z.transpose(0, 1) - out.out.to(dtype)).clone()
        errors[:n_excluded] = 0
        return dict(
            attn_out=z,
            attn_pre_acts=out.pre_acts.transpose(0, 1).to(dtype),
            attn_acts=acts.transpose(0, 1).to(dtype),
            attn_errors=errors.transpose(0, 1),
        )

    # ------------------------------------------------------------------ step 3
    def constant(
        self,
        state: ReplacementState,
        acts: Float[Tensor, "n_layers n_pos d_sae"] | None = None,
        errors: Float[Tensor, "n_layers n_pos d_model"] | None = None,
    ) -> Float[Tensor, "n_layers n_pos d_model"]:
        """The source-dependent part of every MLP output, `decode(a) + e` (the skip is added live)."""
        acts = state.acts if acts is None else acts
        errors = state.errors if errors is None else errors
        with torch.no_grad():
            dec = self.tc.decode(acts.transpose(0, 1).to(self.tc.dtype)).transpose(0, 1).to(errors.dtype)
            c = dec + errors
            n = state.n_excluded
            if n:
                c = torch.cat([(state.y_out - state.skip)[:, :n], c[:, n:]], dim=1)
        return c

    def attn_constant(
        self,
        state: ReplacementState,
        acts: Float[Tensor, "n_layers n_pos d_attn"] | None = None,
        errors: Float[Tensor, "n_layers n_pos d_model"] | None = None,
    ) -> Float[Tensor, "n_layers n_pos d_model"] | None:
        """Step 6: what replaces every attention output, `decode(a_attn) + e_attn` (the recorded
        output at excluded positions); None without an attention set."""
        if self.attn is None:
            return None
        acts = state.attn_acts if acts is None else acts
        errors = state.attn_errors if errors is None else errors
        with torch.no_grad():
            dec = self.attn.decode(acts.transpose(0, 1).to(self.attn.dtype)).transpose(0, 1).to(errors.dtype)
            c = dec + errors
            n = state.n_excluded
            if n:
                c = torch.cat([state.attn_out[:, :n].to(c.dtype), c[:, n:]], dim=1)
        return c

    @contextmanager
    def frozen(
        self,
        state: ReplacementState,
        constant: Tensor,
        batch: int = 1,
        probes: bool = False,
        embed: Tensor | None = None,
        capture: tuple[str, ...] = (),
        attn_constant: Tensor | None = None,
    ) -> Iterator[_FrozenRun]:
        """Install the frozen replacement for one forward (`model(tokens)` inside the block).

        `embed` replaces the embedding nodes' output vectors; `capture` lists extra hook names
        whose values are kept in `run.captured`; `probes` adds zero leaves whose gradients are the
        gradients at the embedding and at every write site (attention write sites included).
        `attn_constant` replaces the attention outputs (default `self.attn_constant(state)`;
        only with an attention set)."""
        run = _FrozenRun(self, constant, batch, probes)

        def embed_hook(x, hook):
            if embed is not None:
                x = embed.to(x.dtype).expand(x.shape)
            return x if run.embed_probe is None else x + run.embed_probe

        hooks = [(block_layout.EMBED, embed_hook)]
        if (
            embed is not None
            and state.embedding == "token+position"
            and block_layout.POS_EMBED in self.model.hook_dict
        ):
            hooks.append((block_layout.POS_EMBED, lambda x, hook: torch.zeros_like(x)))
        if self.attn is not None:
            run.attn_constant = self.attn_constant(state) if attn_constant is None else attn_constant
            hooks += [(h, lambda x, hook, l=l: run.attn_write(l, x)) for l, h in enumerate(self.attn_hooks())]
        with frozen_forward(
            self.model,
            self.tc.cfg,
            state.frozen,
            read=run.read,
            write=run.write_value,
            layers=range(self.cfg.n_layers),
            capture=capture,
            hooks=hooks,
        ) as captured:
            run.captured = captured
            yield run

    def forward(
        self,
        state: ReplacementState,
        acts: Float[Tensor, "n_layers n_pos d_sae"] | None = None,
        errors: Float[Tensor, "n_layers n_pos d_model"] | None = None,
        embed: Float[Tensor, "n_pos d_model"] | None = None,
        attn_acts: Float[Tensor, "n_layers n_pos d_attn"] | None = None,
        attn_errors: Float[Tensor, "n_layers n_pos d_model"] | None = None,
    ) -> FrozenOutput:
        """The frozen replacement model on given sources (default: the recorded ones)."""
        with (
            torch.no_grad(),
            self.frozen(
                state,
                self.constant(state, acts, errors),
                embed=embed,
                attn_constant=self.attn_constant(state, attn_acts, attn_errors),
            ) as run,
        ):
            logits = self.model(state.tokens[None])[0]
            x = torch.stack([r[0] for r in run.reads])
            pre_acts = self.tc.encode(x.transpose(0, 1).to(self.tc.dtype)).transpose(0, 1).to(logits.dtype)
            attn_pre = None
            if self.attn is not None:
                z = torch.stack([r[0] for r in run.attn_reads])
                attn_pre = (
                    self.attn.encode(z.transpose(0, 1).to(self.attn.dtype)).transpose(0, 1).to(logits.dtype)
                )
        return FrozenOutput(logits=logits, pre_acts=pre_acts, x_in=x, attn_pre_acts=attn_pre)


class FrozenOutput(NamedTuple):
    """What the frozen replacement forward returns."""

    logits: Float[Tensor, "n_pos d_vocab"]
    """Logits of the frozen replacement model."""
    pre_acts: Float[Tensor, "n_layers n_pos d_sae"]
    """Encoder pre-activations at the live read values."""
    x_in: Float[Tensor, "n_layers n_pos d_model"]
    """The live read values."""
    attn_pre_acts: Float[Tensor, "n_layers n_pos d_attn"] | None = None
    """Attention SAE pre-activations at the live attention outputs (None without an attention set)."""
