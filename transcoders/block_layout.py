"""What a transformer block looks like: every TransformerLens hook name and the block's flags, in one place.

circuit-tracer keeps TransformerLens's hook names in one module (`replacement_model.py`); nanoGPT
writes its block once (`Block.forward`). Here `BlockLayout` is that place, for both packages
(`transcoders` sits below `attrgraph`, so it lives here and attrgraph asks it):

1. `BlockLayout.of(cfg)` reads a `HookedTransformerConfig` (or `model.cfg`) into a few flags:
   sequential or parallel attention + MLP (GPT-J / GPT-NeoX read `resid_pre` in both sublayers and
   have no `hook_resid_mid`), QK-norm (Qwen3, Gemma-3), norms before and after each sublayer
   (Gemma-2/3 `ln1_post`, `ln2_post`), gated MLP, local (sliding-window) layers, rotary, grouped-query.
2. `hook(site, layer)` names the hook of one site (a key of `SITES`) in one layer; the named helpers
   (`q`, `k`, `mlp_reads`, ...) pick the site whose meaning a caller wants on this block: `q` / `k`
   are the query and key *as the scores use them*, after QK-norm and any rotary embedding
   (`attn.hook_q` fires before QK-norm).
3. `unsupported(use)` is the one answer to "is this model supported, and by which engine": a
   sentence saying why not, or None. Uses: "replacement" (any attribution), "linear" (the explicit
   frozen backward; attribution falls back to autograd), "circuits" (the component graph of EAP /
   edge pruning), "cross_position" (q/k/v edge patching), "qk" (QK attribution).
4. Templates with `{layer}` (`MLP_INPUT`, `MLP_OUTPUT`, `ATTN_OUTPUT`, `RESID_MID`) are what a
   transcoder config stores; `split_block_hook` parses a concrete or template name back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

BLOCK = "blocks.{layer}."
"""Prefix of every per-block hook template."""
EMBED = "hook_embed"
POS_EMBED = "hook_pos_embed"
LN_FINAL_SCALE = "ln_final.hook_scale"
SITES = {
    "resid_pre": "hook_resid_pre",
    "resid_mid": "hook_resid_mid",
    "resid_post": "hook_resid_post",
    "attn_out": "hook_attn_out",
    "mlp_out": "hook_mlp_out",
    "mlp_in": "hook_mlp_in",
    "mlp_input": "ln2.hook_normalized",
    "mlp_post": "mlp.hook_post",
    "q_input": "hook_q_input",
    "k_input": "hook_k_input",
    "v_input": "hook_v_input",
    "ln1_scale": "ln1.hook_scale",
    "ln2_scale": "ln2.hook_scale",
    "ln1_post_scale": "ln1_post.hook_scale",
    "ln2_post_scale": "ln2_post.hook_scale",
    "q_raw": "attn.hook_q",
    "k_raw": "attn.hook_k",
    "rot_q": "attn.hook_rot_q",
    "rot_k": "attn.hook_rot_k",
    "q_norm_scale": "attn.q_norm.hook_scale",
    "k_norm_scale": "attn.k_norm.hook_scale",
    "v": "attn.hook_v",
    "attn_scores": "attn.hook_attn_scores",
    "pattern": "attn.hook_pattern",
    "z": "attn.hook_z",
    "result": "attn.hook_result",
}
"""Site name -> the hook's name inside `blocks.{layer}` (TransformerLens)."""

MLP_INPUT = BLOCK + SITES["mlp_input"]
"""Read site of an MLP transcoder: the MLP's input (sites.py gives it ln2's weight and bias)."""
MLP_OUTPUT = BLOCK + SITES["mlp_out"]
"""Write site of an MLP transcoder: what the MLP adds to the residual stream."""
ATTN_OUTPUT = BLOCK + SITES["attn_out"]
"""Read and write site of an attention-output SAE (after any post-attention norm, Gemma-2 `ln1_post`)."""
RESID_MID = BLOCK + SITES["resid_mid"]
"""The residual stream between attention and MLP (sequential blocks only)."""
NORMS = ("LN", "LNPre", "RMS", "RMSPre", None)
"""`normalization_type`s whose frozen Jacobian the linear backward knows."""
POST_NORM_ARCHITECTURES = ("Olmo2ForCausalLM", "Olmo3ForCausalLM")
"""Architectures whose ln1 / ln2 run after the sublayer, not before (TransformerLens `transformer_block`)."""
USES = ("replacement", "linear", "circuits", "cross_position", "qk")


def block_hook(site: str) -> str:
    """The `{layer}` template of a site (a key of `SITES`, or a literal suffix such as `mlp.hook_in`)."""
    return BLOCK + SITES.get(site, site)


def split_block_hook(name: str | None) -> tuple[int | None, str] | None:
    """`blocks.3.attn.hook_z` -> (3, "attn.hook_z"); `blocks.{layer}.x` -> (None, "x"); else None."""
    m = re.fullmatch(r"blocks\.(\d+|\{layer\})\.(.+)", name or "")
    if m is None:
        return None
    return (None if m.group(1) == "{layer}" else int(m.group(1))), m.group(2)


def hook_layer(name: str, n_layers: int) -> int:
    """The layer a hook reads: its block number, -1 before the blocks (`hook_embed`), else `n_layers`."""
    split = split_block_hook(name)
    if split is not None and split[0] is not None:
        return split[0]
    return -1 if name.startswith("hook_") else n_layers


def is_frozen(name: str) -> bool:
    """Whether the replacement model freezes this hook: attention patterns and norm denominators
    (ln1, ln2, their post-norms, ln_final and the QK-norms)."""
    return name.endswith(("hook_pattern", "hook_scale"))


def is_residual_norm_scale(name: str) -> bool:
    """Whether a hook is the denominator of a norm on the residual stream (ln1, ln2, their post-norms,
    ln_final; `[batch, pos, 1]`), not of a QK-norm (`[batch pos heads, 1]`, per head)."""
    return name.endswith("hook_scale") and not name.endswith((SITES["q_norm_scale"], SITES["k_norm_scale"]))


@dataclass(frozen=True)
class BlockLayout:
    """The block of one model: flags read from its config, hook names by site and layer."""

    n_layers: int
    """Transformer blocks."""
    parallel: bool
    """Attention and MLP both read `resid_pre` (GPT-J, GPT-NeoX / Pythia); no `hook_resid_mid`."""
    attn_only: bool
    """Blocks without an MLP."""
    qk_norm: bool
    """RMSNorm on each head's query and key (Qwen3, Gemma-3), scale `attn.q_norm.hook_scale`."""
    norms_after: bool
    """A norm after each sublayer too (Gemma-2/3 `ln1_post`, `ln2_post`)."""
    post_norm: bool
    """ln1 / ln2 run after their sublayer instead of before (OLMo-2/3)."""
    gated_mlp: bool
    """The MLP is gated (`W_gate`): LLaMA, Qwen, Gemma."""
    local_layers: tuple[int, ...]
    """Layers whose attention is a sliding window (Gemma-2/3 `attn_types == "local"`)."""
    rotary: bool
    """Rotary positional embedding (queries and keys after it are `attn.hook_rot_q` / `hook_rot_k`)."""
    grouped_query: bool
    """Fewer key/value heads than query heads."""
    normalization: str | None
    """`normalization_type`: "LN", "LNPre", "RMS", "RMSPre" or None."""
    positional: str
    """`positional_embedding_type`."""
    split_inputs: bool
    """Per-head attention inputs (`use_split_qkv_input` or `use_attn_in`)."""
    post_embedding_ln: bool
    """A norm right after the embedding."""
    logit_soft_cap: float
    """Soft cap on the logits (0: none)."""
    attn_soft_cap: float
    """Soft cap on the attention scores (0: none)."""

    @classmethod
    def of(cls, cfg) -> BlockLayout:
        """The layout of a model with config `cfg` (a `HookedTransformerConfig`; `model.cfg`)."""
        kv = getattr(cfg, "n_key_value_heads", None)
        types = getattr(cfg, "attn_types", None) or []
        return cls(
            n_layers=int(cfg.n_layers),
            parallel=bool(getattr(cfg, "parallel_attn_mlp", False)),
            attn_only=bool(getattr(cfg, "attn_only", False)),
            qk_norm=bool(getattr(cfg, "use_qk_norm", False)),
            norms_after=bool(getattr(cfg, "use_normalization_before_and_after", False)),
            post_norm=getattr(cfg, "original_architecture", None) in POST_NORM_ARCHITECTURES,
            gated_mlp=bool(getattr(cfg, "gated_mlp", False)),
            local_layers=tuple(l for l, t in enumerate(types) if t == "local"),
            rotary=cfg.positional_embedding_type == "rotary",
            grouped_query=kv is not None and kv != cfg.n_heads,
            normalization=getattr(cfg, "normalization_type", "LN"),
            positional=cfg.positional_embedding_type,
            split_inputs=bool(
                getattr(cfg, "use_split_qkv_input", False) or getattr(cfg, "use_attn_in", False)
            ),
            post_embedding_ln=bool(getattr(cfg, "post_embedding_ln", False)),
            logit_soft_cap=float(getattr(cfg, "output_logits_soft_cap", 0.0) or 0.0),
            attn_soft_cap=float(getattr(cfg, "attn_scores_soft_cap", 0.0) or 0.0),
        )

    # ---- hook names (step 2) ----------------------------------------------------------
    def hook(self, site: str, layer: int) -> str:
        """The hook of `site` (a key of `SITES`) in block `layer`."""
        if site == "resid_mid" and (self.parallel or self.attn_only):
            raise ValueError("this block has no hook_resid_mid (parallel or attention-only); use mlp_reads.")
        return f"blocks.{layer}.{SITES[site]}"

    def hooks(self, site: str) -> list[str]:
        """`hook(site, l)` for every layer."""
        return [self.hook(site, l) for l in range(self.n_layers)]

    def q(self, layer: int) -> str:
        """The queries the attention scores use: after QK-norm and rotary (`hook_rot_q` when rotary)."""
        return self.hook("rot_q" if self.rotary else "q_raw", layer)

    def k(self, layer: int) -> str:
        """The keys the attention scores use (as `q`)."""
        return self.hook("rot_k" if self.rotary else "k_raw", layer)

    def mlp_reads(self, layer: int) -> str:
        """The residual hook the MLP of `layer` reads through ln2: `resid_mid`, or `resid_pre` on a
        parallel block."""
        return self.hook("resid_pre" if self.parallel else "resid_mid", layer)

    def norm_scale(self, norm: str, layer: int | None = None) -> str:
        """The denominator hook of a norm: "ln1", "ln2", "ln1_post", "ln2_post" of `layer`, or "ln_final"."""
        return LN_FINAL_SCALE if norm == "ln_final" else self.hook(f"{norm}_scale", layer)

    # ---- what is supported (step 3) ------------------------------------------------------
    def unsupported(self, use: str) -> str | None:
        """Why `use` (one of `USES`) cannot run on this model, as the start of a sentence; None when it can."""
        if use not in USES:
            raise ValueError(f"use {use!r} is not one of {USES}.")
        if self.positional not in ("standard", "rotary"):
            return f"its positional embedding is {self.positional!r} (supported: 'standard', 'rotary')"
        if use == "replacement" and self.logit_soft_cap > 0:
            return (
                f"it soft-caps its logits at {self.logit_soft_cap}, which is not linear; set "
                "model.cfg.output_logits_soft_cap = 0 before attributing (as circuit-tracer does)"
            )
        if use == "linear":
            return self._linear_reason()
        if use == "circuits":
            return self._circuits_reason()
        if use == "cross_position" and self.attn_soft_cap > 0:
            return "it soft-caps its attention scores, which cross-position patching does not model"
        if use == "qk" and self.qk_norm and not self.rotary:
            return "it has QK-norm without rotary, and TransformerLens has no hook after the QK-norm"
        return None

    def _linear_reason(self) -> str | None:
        if self.post_norm:  # ln1 / ln2 after their sublayer: not the walk of linear_backward.py step 3
            return "its norms run after each sublayer (OLMo-2/3 post-norm blocks)"
        for flag, why in (
            ("attn_only", "it has no MLPs"),
            ("split_inputs", "it sets use_split_qkv_input or use_attn_in"),
            ("post_embedding_ln", "it sets post_embedding_ln"),
        ):
            if getattr(self, flag):
                return why
        if self.normalization not in NORMS:
            return f"its norm is {self.normalization!r}"
        return None

    def _circuits_reason(self) -> str | None:
        if self.post_norm:
            return "its norms run after each sublayer (OLMo-2/3 post-norm blocks)"
        if self.norms_after:  # a head's result reaches the residual through ln1_post: not a sum over heads
            return "it normalises after each sublayer (the component graph needs a pre-norm model)"
        return None
