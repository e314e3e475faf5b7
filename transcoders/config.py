"""`TranscoderConfig`: what a transcoder set is, in fields the attribution engine reads.

One frozen dataclass describes every set (SAE, per-layer transcoder, cross-layer
transcoder); see docs/transcoder_interface.md for the contract. Hook names are
TransformerLens templates with `{layer}`; `transcoders.sites` gives them meaning.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, fields

from transcoders.block_layout import ATTN_OUTPUT as ATTN_OUTPUT  # defined there; re-exported for sites.py
from transcoders.block_layout import MLP_INPUT, MLP_OUTPUT
from transcoders.errors import ConfigError

KINDS = ("sae", "plt", "clt")


def is_whole(value) -> bool:
    """Whether `value` is an integer, Python's or numpy's, and not a bool (True is an int to Python,
    and 2.0 or 4e6 is a float to it): the one test of counts and indices in both packages."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value) -> bool:
    """Whether `value` is a real number, Python's or numpy's, and not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_device(device):
    """`device` as a `torch.device` this machine can use; `ConfigError` (one sentence) when it cannot:
    not a device name, or CUDA / MPS (or that CUDA index) absent here."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(
            f"device {device!r} is not a torch device; pass cpu, cuda, cuda:N or mps."
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            build = " (this torch is a CPU-only build)" if torch.version.cuda is None else ""
            raise ConfigError(
                f"device {str(device)!r} was asked for, but CUDA is not available on this machine{build}; "
                "pass --device cpu."
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(
                f"device {str(device)!r} was asked for, but this machine has {torch.cuda.device_count()} "
                "CUDA device(s); pass a lower index."
            )
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(
            f"device {str(device)!r} was asked for, but MPS is not available here; pass --device cpu."
        )
    return dev


DTYPE_NAMES = {
    "float32": "float32",
    "fp32": "float32",
    "float16": "float16",
    "fp16": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float64": "float64",
}
"""The dtype names the loaders take besides torch dtypes: TransformerLens's (`DTYPE_FROM_STRING`) and float64."""


def check_dtype(dtype):
    """`dtype` (a floating torch dtype, or a name of `DTYPE_NAMES`, with or without `torch.`) as a
    torch dtype; `ConfigError` (one sentence) for anything else."""
    import torch

    if isinstance(dtype, str) and dtype.removeprefix("torch.") in DTYPE_NAMES:
        return getattr(torch, DTYPE_NAMES[dtype.removeprefix("torch.")])
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    raise ConfigError(
        f"dtype {dtype!r} is not a floating-point torch dtype; pass torch.float32 (or 'float32', 'bfloat16', "
        "'float16', 'float64')."
    )


@dataclass(frozen=True)
class TranscoderConfig:
    kind: str
    """"sae" (reads and writes one hook), "plt" (one transcoder per layer) or "clt" (cross-layer)."""
    n_layers: int
    """Layers covered; always all of the model's layers."""
    d_model: int
    """Width of the residual stream the set reads and writes."""
    d_sae: int
    """Features per layer."""
    activation: str = "jumprelu"
    """"relu", "jumprelu" (per-feature threshold), "topk" (k largest per layer and token),
    "batchtopk" (k per token on average over a training batch; a per-layer threshold at inference),
    "matryoshka_batchtopk" (BatchTopK trained on nested prefixes too, `matryoshka_widths`) or "gated"
    (a gate `x @ W_enc + b_enc > 0` times a ReLU'd magnitude path, Rajamanoharan et al. 2024)."""
    input_hook: str = MLP_INPUT
    """Read site, a TransformerLens hook name template; the default means the MLP's input."""
    output_hook: str = MLP_OUTPUT
    """Write site, a TransformerLens hook name template; the default is the MLP's output."""
    skip: bool = False
    """Whether a linear skip `W_skip` [n_layers, d_model, d_model] adds `x @ W_skip[l]` to the output."""
    k: int = 32
    """Features kept per layer and token by "topk" (on average, "batchtopk"); ignored otherwise."""
    bandwidth: float = 1.0
    """Width of the rectangle kernel of JumpReLU's straight-through estimator (the appendix uses 1.0)."""
    ste_to_input: bool = False
    """JumpReLU in training: also pass the estimator's gradient `theta K / eps` to the pre-activation (the
    appendix's "gradient to all model parameters"; sae_lens `jumprelu_ste_to_input`); False is the paper's
    `H(h - theta)`. Inference is the same either way."""
    matryoshka_widths: tuple[int, ...] = ()
    """"matryoshka_batchtopk": the nested widths below the whole set's `d_sae` (strictly increasing; global
    feature counts, also on a feature-sharded rank's slice) whose prefixes of the features must each
    reconstruct the target too (Bussmann et al. 2025); the full width is implicit."""
    output_before_post_norm: bool = False
    """The output is the MLP's output before a post-MLP norm (Gemma-2 `ln2_post`); see sites.py."""
    model_name: str = ""
    """Name of the model the set was trained for (informational)."""
    folded_norms: bool | None = None
    """Whether that model had its norms' weights folded into the next layer's (TransformerLens's
    `fold_ln`, with `center_writing_weights`: `from_pretrained`'s default processing; its norms are
    then "LNPre" / "RMSPre"). Folding changes the MLP input the set reads and centering its write
    targets, so a set is used only on a model processed as it was trained (sites.py `check_fits`);
    None: not recorded, not checked."""

    def __post_init__(self):
        for name in ("kind", "activation", "input_hook", "output_hook", "model_name"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"{name} is {getattr(self, name)!r}; it must be a string.")
        for name in ("skip", "ste_to_input", "output_before_post_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} is {getattr(self, name)!r}; it must be true or false.")
        if self.folded_norms is not None and not isinstance(self.folded_norms, bool):
            raise ConfigError(f"folded_norms is {self.folded_norms!r}; it must be true, false or null.")
        if self.kind not in KINDS:
            raise ConfigError(f"kind {self.kind!r} is not one of {KINDS}; pick one of them.")
        from transcoders.nonlinearity import NONLINEARITIES  # the one list of activations (and torch)

        if self.activation not in NONLINEARITIES:
            raise ConfigError(
                f"activation {self.activation!r} is not one of {tuple(NONLINEARITIES)}; pick one of them."
            )
        for name in ("n_layers", "d_model", "d_sae"):
            value = getattr(self, name)
            if not is_whole(value) or value < 1:
                raise ConfigError(f"{name} is {value!r}; it must be a positive integer.")
        uses_k = NONLINEARITIES[self.activation].uses_k
        if uses_k and not is_whole(self.k):
            raise ConfigError(f"k is {self.k!r}; pass an integer number of features.")
        if uses_k and not 0 < self.k <= self.d_sae:
            raise ConfigError(f"k is {self.k} with d_sae {self.d_sae}; pass 0 < k <= d_sae.")
        if not isinstance(self.matryoshka_widths, list | tuple) or not all(
            is_whole(w) for w in self.matryoshka_widths
        ):
            raise ConfigError(
                f"matryoshka_widths is {self.matryoshka_widths!r}; it must be a list of integer feature counts."
            )
        widths = tuple(int(w) for w in self.matryoshka_widths)
        object.__setattr__(self, "matryoshka_widths", widths)  # a JSON list read back is a tuple again
        if NONLINEARITIES[self.activation].nested != bool(widths):
            raise ConfigError(
                f"matryoshka_widths {list(widths)} with activation {self.activation!r}: nested widths go with "
                "matryoshka_batchtopk, and it needs at least one; pass both or neither."
            )
        # positive and increasing; below the whole set's d_sae (TrainConfig checks that: a feature-sharded
        # rank's slice holds fewer features than the global widths count)
        if widths and not all(a < b for a, b in zip((0, *widths), widths, strict=False)):
            raise ConfigError(f"matryoshka_widths {list(widths)} must be positive and increase strictly.")
        if not (is_real(self.bandwidth) and math.isfinite(self.bandwidth) and self.bandwidth > 0):  # NaN too
            raise ConfigError(
                f"bandwidth is {self.bandwidth}; it must be a finite number above 0 (the appendix uses 1.0)."
            )
        for name in ("input_hook", "output_hook"):
            if "{layer}" not in getattr(self, name):
                raise ConfigError(
                    f"{name} {getattr(self, name)!r} has no '{{layer}}'; write e.g. {MLP_OUTPUT!r}."
                )
        if self.kind == "sae" and self.input_hook != self.output_hook:
            raise ConfigError(
                "an SAE reads and writes one hook; make input_hook equal output_hook or use kind='plt'."
            )
        if self.kind == "sae" and self.skip:
            raise ConfigError("an SAE has no skip connection; pass skip=False or use kind='plt'.")

    @property
    def is_sae(self) -> bool:
        """An SAE: it reconstructs the one site it reads (a transcoder, PLT or CLT, writes another)."""
        return self.kind == "sae"

    @property
    def is_attention_sae(self) -> bool:
        """An SAE set reading and writing the attention output (`ATTN_OUTPUT`)."""
        return self.is_sae and self.input_hook == ATTN_OUTPUT == self.output_hook

    def hook_in(self, layer: int) -> str:
        """The read hook of `layer`."""
        return self.input_hook.format(layer=layer)

    def hook_out(self, layer: int) -> str:
        """The write hook of `layer`."""
        return self.output_hook.format(layer=layer)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TranscoderConfig:
        """Build from a dict, ignoring keys this version does not know (forward compatibility)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})
