"""sae_lens SAEs and transcoders: objects or `save_model` directories read into a set, and a set
written as one `save_model` directory per layer.

sae_lens holds one layer per object: `W_enc` [d_in, d_sae] and `W_dec` [d_sae, d_out] are
already TransformerLens-oriented; the hook is `cfg.metadata.hook_name` (a transcoder's output
hook is `cfg.metadata.hook_name_out`). A set is one object per layer, any order, every layer
once. Reading:

1. Architectures: each nonlinearity names the ones it reads (nonlinearity.py step 13, its
   `sae_lens`; `ARCHITECTURES` collects them): "standard" / "transcoder" / "skip_transcoder" ->
   ReLU; "jumprelu" / "jumprelu_transcoder" / "jumprelu_skip_transcoder" -> JumpReLU (sae_lens
   computes `ReLU(h) * (h > threshold)`; step 5); "topk" -> TopK with
   `cfg.k`; "gated" -> Gated. A skip transcoder's `W_skip = W_skip_sl.T` (sae_lens adds
   `x @ W_skip_sl.T`); the nonlinearity's `extra_state` (threshold; gated: `r_mag`, `b_mag`) is
   read as it is, and `b_enc` from sae_lens's name for it (gated: `b_gate`). Others are refused
   with `UnknownFormatError`.
2. `apply_b_dec_to_input` (SAEs): `h = (x - b_dec) @ W_enc + b_enc`, folded by the nonlinearity's
   `fold_input_offset` into `b_enc - b_dec @ W_enc` (gated: the gate's bias so, and the magnitude
   path's `b_mag - (b_dec @ W_enc) * exp(r_mag)`).
3. Hooks `blocks.{i}.X` become the template `blocks.{layer}.X`. Note: a literal
   `ln2.hook_normalized` read site means *the MLP input* in our convention (sites.py); the two
   agree on fold_ln models, which is what sae_lens assumes. A metadata key
   `output_before_post_norm` (written by us; sae_lens has no such field) sets that flag.
4. Input normalization other than "none" and `hook_z` reshaping are refused, each with what
   to do (`_NORMALIZATION_ADVICE`: a scaling factor or whitening folded by sae_lens's own
   methods is then read as any SAE; a per-token normalization is not linear).
5. What sae_lens computes, not what it stores: a threshold below 0 is read as 0 (sae_lens's
   `ReLU(h) * (h > threshold)` is `h * (h > 0)` there, and `h * (h > threshold)` from 0 up);
   `rescale_acts_by_decoder_norm` (TopK's, sae_lens's default in training: pre-activations
   times the decoder row norms `n`, activations divided by `n` before the decoder) is folded
   as sae_lens's `fold_W_dec_norm` does (`W_enc * n`, `b_enc * n`, `W_dec / n`, with its clamp
   of `n` at 1e-8), so the features' activations are sae_lens's `encode`; the tensors are read
   in their own precision (float64 stays float64 up to the `dtype` asked for; bfloat16 and
   float16 become float32).

Writing (`save_sae_lens`), the inverse, through sae_lens's own classes and `save_model`, into
`layer_{l}/cfg.json` + `layer_{l}/sae_weights.safetensors`:

6. The architecture is the role's (SAE, transcoder, skip transcoder) in the `sae_lens` of the
   nonlinearity the set is stored as (`stored_as()`: BatchTopK's inference rule
   `h * (h > threshold)` is written as JumpReLU with its per-layer threshold). A CLT, a role
   sae_lens lacks (a TopK or gated transcoder) and negative thresholds (where step 1's ReLU would
   change the output) are refused before anything is written.
7. Weights as they are, except `W_skip_sl = W_skip[l].T`, in the set's precision (its `dtype` in
   cfg.json: sae_lens reads them so; a bfloat16 set is not doubled); `apply_b_dec_to_input=False`
   (our `b_enc` is the whole encoder bias, under sae_lens's name for it); `hook_name` /
   `hook_name_out` are our hook templates with the layer filled in; `k` when the stored
   nonlinearity `uses_k` (TopK); its `extra_state` as it is.
8. Whether the model's norms were folded (`TranscoderConfig.folded_norms`, sites.py step 4) is
   read from `metadata.model_from_pretrained_kwargs["fold_ln"]` when it is there (else not
   recorded), and written there when the set records it.
9. Memory: the set is allocated once the first object is read (a set has one object per layer,
   so its layer count is the number of objects), and each object's tensors are copied into their
   layer's slices; a directory is read by sae_lens only when its turn comes and dropped after, so
   loading holds the set and one layer's object, not every layer's beside stacked copies.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError

from transcoders.block_layout import BLOCK, MLP_OUTPUT, block_hook, split_block_hook
from transcoders.config import TranscoderConfig
from transcoders.errors import CorruptTranscoderError, TranscoderNotFoundError, UnknownFormatError, WriteError
from transcoders.h5file import write_error
from transcoders.nonlinearity import Nonlinearity, sae_lens_architectures

if TYPE_CHECKING:
    from transcoders.base import SparseCoder

ARCHITECTURES = sae_lens_architectures()
"""sae_lens architecture -> (the nonlinearity that reads it, its role: "sae", "transcoder" or
"skip_transcoder"), from each nonlinearity's `sae_lens` (step 1)."""


def _load_dir(path: Path):
    from sae_lens.saes.sae import SAE as SaeLensSAE

    if not (path / "cfg.json").is_file():
        raise TranscoderNotFoundError(
            f"{path} has no cfg.json; a sae_lens directory holds cfg.json and sae_weights.safetensors."
        )
    try:
        with _no_model_advice():
            return SaeLensSAE.load_from_disk(str(path))
    except (OSError, ValueError, RuntimeError, KeyError, TypeError, AttributeError, SafetensorError) as e:
        # what sae_lens raises on a cfg.json or weights file it cannot use: an unknown architecture
        # (KeyError), a missing or mistyped field (TypeError, AttributeError), a damaged file
        reason = " ".join(str(e).split())[:300]
        raise CorruptTranscoderError(
            f"{path} could not be read by sae_lens ({type(e).__name__}: {reason}); check its cfg.json "
            "and sae_weights.safetensors."
        ) from e


def _objects(items) -> list[Callable[[], object]]:
    """One maker per layer's object (step 9): a directory is read when its maker is called."""
    if isinstance(items, str | os.PathLike):
        folder = Path(items)
        if (folder / "cfg.json").is_file():
            return [lambda: _load_dir(folder)]
        subdirs = sorted(p for p in folder.iterdir() if (p / "cfg.json").is_file())
        if not subdirs:
            raise TranscoderNotFoundError(
                f"{folder} holds no sae_lens directories (cfg.json + sae_weights.safetensors)."
            )
        return [lambda p=p: _load_dir(p) for p in subdirs]
    return [
        (lambda x=x: _load_dir(Path(x))) if isinstance(x, str | os.PathLike) else (lambda x=x: x)
        for x in items
    ]


_NORMALIZATION_ADVICE = {
    "expected_average_only_in": (
        "this sae_lens SAE normalizes its input ({!r}): it was trained on activations scaled by a factor "
        "its files do not hold, so its weights do not fit the model's own activations; load it with "
        "sae_lens.SAE.from_pretrained(release, sae_id), which folds the factor in, or call "
        "sae.fold_activation_norm_scaling_factor(factor) and pass the object."
    ),
    "covariance_whitening": (
        "this sae_lens SAE normalizes its input ({!r}): its weights read whitened activations, and the "
        "whitening's mean and matrix are not in its files; fold them with "
        "sae.fold_activation_whitening(mean, matrix, inverse) (sae_lens's trainer does at the end) and pass the object."
    ),
    "layer_norm": (
        "this sae_lens SAE normalizes its input at run time ({!r}), token by token: a nonlinear step that the "
        "replacement model's linear attribution cannot hold; use an SAE trained without it."
    ),
}
"""Step 4: why a run-time input normalization is refused, and what to do (`constant_norm_rescale`
and any later one as `layer_norm`)."""


def _split_hook(name: str | None, what: str) -> tuple[int, str]:
    split = split_block_hook(name) if isinstance(name, str) else None
    if split is None or split[0] is None:
        raise UnknownFormatError(
            f"sae_lens {what} {name!r} is not a per-layer hook {BLOCK.format(layer='<i>') + '<name>'!r}; "
            "we cannot place it."
        )
    return split[0], block_hook(split[1])


def load_sae_lens(
    items,
    output_hook: str | None = None,
    model_name: str = "",
    device="cpu",
    dtype: torch.dtype = torch.float32,
):
    """A set from sae_lens objects or directories (one per layer); see the module docstring."""
    from transcoders.build import allocated
    from transcoders.formats.native import load_state

    makers = _objects(items)
    tc, shared, first, layers = None, None, 0, set()
    for make in makers:
        sae = make()
        layer, state, key = _layer_state(sae, output_hook)
        if shared is not None and key != shared:
            differ = "; ".join(f"{k} {key[k]!r} vs {shared[k]!r}" for k in key if key[k] != shared[k])
            raise CorruptTranscoderError(
                f"sae_lens layer {layer} differs from layer {first} ({differ}); a set needs one kind."
            )
        if layer in layers:
            raise CorruptTranscoderError(f"two sae_lens objects are for layer {layer}; pass one per layer.")
        layers.add(layer)
        if shared is None:
            shared, first = key, layer
            tc = allocated(
                _config(key, len(makers), model_name or str(sae.cfg.metadata.model_name or ""), sae), dtype
            )
        if layer < len(makers):  # else a layer is missing: said below, once every layer is known
            load_state(tc, state, f"sae_lens layer {layer}", layer=layer)
        del sae, state
    missing = sorted(set(range(max(layers) + 1)) - layers)
    if missing:
        raise CorruptTranscoderError(
            f"no sae_lens object for layers {missing}; a set needs every layer from 0."
        )
    return tc.to(device=device)


def _layer_state(sae, output_hook: str | None) -> tuple[int, dict, dict]:
    """One object's layer, its tensors as the set holds them (steps 1-5), and what every layer of
    a set must share (`key`)."""
    cfg = sae.cfg
    arch = cfg.architecture()
    if arch not in ARCHITECTURES:
        raise UnknownFormatError(
            f"sae_lens architecture {arch!r} is not one we read; supported: {sorted(ARCHITECTURES)}."
        )
    norm = getattr(cfg, "normalize_activations", "none")
    if norm != "none":
        raise UnknownFormatError(
            _NORMALIZATION_ADVICE.get(norm, _NORMALIZATION_ADVICE["layer_norm"]).format(norm)
        )
    if getattr(cfg, "reshape_activations", "none") != "none":
        raise UnknownFormatError(
            "sae_lens hook_z SAEs (per-head inputs) are not supported; use an attn_out SAE."
        )
    layer, in_hook = _split_hook(cfg.metadata.hook_name, "hook_name")
    nl, role = ARCHITECTURES[arch]
    is_transcoder, skip = role != "sae", role == "skip_transcoder"
    if is_transcoder:
        out_name = cfg.metadata.hook_name_out
        out_hook = _split_hook(out_name, "hook_name_out")[1] if out_name else (output_hook or MLP_OUTPUT)
    else:
        out_hook = in_hook
    state = _encoder_state(
        sae,
        nl,
        fold_b_dec=not is_transcoder and cfg.apply_b_dec_to_input,
        fold_decoder_norm=bool(getattr(cfg, "rescale_acts_by_decoder_norm", False)),
    )
    if skip:
        state["W_skip"] = _read(sae.W_skip).T
    key = {
        "transcoder": is_transcoder,
        "hook_name": in_hook,
        "hook_name_out": out_hook,
        "activation": nl.name,
        "skip": skip,
        "output_before_post_norm": bool(cfg.metadata.get("output_before_post_norm", False)),
        "k": int(getattr(cfg, "k", 0) or 0),
        "(d_in, d_sae)": tuple(state["W_enc"].shape),
    }
    return layer, state, key


def _config(key: dict, n_layers: int, model_name: str, sae) -> TranscoderConfig:
    """The set's config from what its layers share (`_layer_state`'s key) and its first object."""
    is_transcoder, in_hook, out_hook, activation, skip, before_norm, k, (d_model, d_sae) = key.values()
    return TranscoderConfig(
        kind="plt" if is_transcoder else "sae",
        n_layers=n_layers,
        d_model=d_model,
        d_sae=d_sae,
        activation=activation,
        input_hook=in_hook,
        output_hook=out_hook,
        skip=skip,
        k=k or 32,
        output_before_post_norm=before_norm,
        model_name=model_name,
        folded_norms=_fold_ln(sae),
    )


@contextmanager
def _no_model_advice():
    """sae_lens warns on every SAE with `model_from_pretrained_kwargs` ("load the model like so"); step 8
    reads and writes them itself (and sites.py refuses a model processed otherwise), so not here."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", r"\s*This SAE has non-empty model_from_pretrained_kwargs", UserWarning
        )
        yield


def _fold_ln(sae) -> bool | None:
    """Step 8: `fold_ln` where the SAE's `model_from_pretrained_kwargs` say it (the model it was
    trained on; sae_lens's own loader takes its other defaults from its version), else None."""
    kwargs = getattr(sae.cfg.metadata, "model_from_pretrained_kwargs", None) or {}
    value = kwargs.get("fold_ln")
    return value if isinstance(value, bool) else None


def _read(x: torch.Tensor) -> torch.Tensor:
    """One of an SAE's tensors on the CPU, in float64 when it is float64, else float32 (step 5)."""
    return x.detach().cpu().to(torch.promote_types(x.dtype, torch.float32))


def _encoder_state(
    sae, nl: type[Nonlinearity], fold_b_dec: bool, fold_decoder_norm: bool
) -> dict[str, torch.Tensor]:
    """`W_enc`, `b_enc` (from sae_lens's name for it), `W_dec`, `b_dec` and the nonlinearity's
    `extra_state` of one sae_lens object on the CPU, `b_dec` folded into the encoder (step 2),
    thresholds from 0 and the decoder norms folded (step 5)."""
    state = {"W_enc": _read(sae.W_enc), "b_enc": _read(getattr(sae, nl.sae_lens.b_enc))}
    state |= {"W_dec": _read(sae.W_dec), "b_dec": _read(sae.b_dec)}
    state |= {name: _read(getattr(sae, name)) for name in nl.extra_state}
    if "threshold" in state:
        state["threshold"] = state["threshold"].clamp(min=0)
    if fold_b_dec:
        state = nl.fold_input_offset(state, state["b_dec"])
    if fold_decoder_norm:
        norms = state["W_dec"].norm(dim=-1).clamp(min=1e-8)  # sae_lens's get_W_dec_norm
        state |= {
            "W_enc": state["W_enc"] * norms,
            "b_enc": state["b_enc"] * norms,
            "W_dec": state["W_dec"] / norms.unsqueeze(-1),
        }
    return state


def sae_lens_architecture(tc: SparseCoder) -> str:
    """The sae_lens architecture that holds the set `tc` (step 6), or `UnknownFormatError`."""
    cfg: TranscoderConfig = tc.cfg
    if cfg.kind == "clt":
        raise UnknownFormatError(
            "sae_lens holds one layer per object and has no cross-layer transcoder; save a CLT in the native format."
        )
    role = "sae" if cfg.kind == "sae" else "skip_transcoder" if cfg.skip else "transcoder"
    arch = tc.nonlinearity.stored_as().sae_lens.architectures().get(role)
    if arch is None:
        name = tc.nonlinearity.label
        raise UnknownFormatError(
            f"sae_lens has no {name} transcoder (only {name} SAEs); save a {name} transcoder set in the native format."
        )
    return arch


def _hook_name(template: str, layer: int, what: str) -> str:
    split = split_block_hook(template)
    if split is None or split[0] is not None or "{" in split[1]:
        raise UnknownFormatError(
            f"{what} {template!r} is not a per-block hook {BLOCK + '<name>'!r}; "
            "sae_lens cannot place it, so save this set in the native format."
        )
    return template.format(layer=layer)


def save_sae_lens(tc: SparseCoder, path: str | os.PathLike) -> Path:
    """Write the SAE or PLT set `tc` as sae_lens `save_model` directories `layer_{l}/` (steps 6-7).

    1. Pick the architecture and check hooks and thresholds, before writing anything.
    2. Per layer, build the sae_lens object of that architecture on the meta device, assign our
       layer's weights (in their precision, CPU), and let its own `save_model` write `layer_{l}/`.
    Returns the directory; `load_transcoders(path)` and `sae_lens.SAE.load_from_disk(path /
    "layer_{l}")` read it back.
    """
    from sae_lens.registry import get_sae_class
    from sae_lens.saes.sae import SAEMetadata

    cfg: TranscoderConfig = tc.cfg
    arch = sae_lens_architecture(tc)
    form = tc.nonlinearity.stored_as()
    is_transcoder = cfg.kind == "plt"
    hooks = [
        (_hook_name(cfg.input_hook, l, "input_hook"), _hook_name(cfg.output_hook, l, "output_hook"))
        for l in range(cfg.n_layers)
    ]
    if tc.threshold is not None and bool((tc.threshold < 0).any()):
        raise UnknownFormatError(
            "some thresholds are negative, where sae_lens's ReLU(h) * (h > threshold) differs from "
            "our h * (h > threshold); save this set in the native format."
        )
    try:
        sae_cls, cfg_cls = get_sae_class(arch)
    except KeyError:
        raise UnknownFormatError(
            f"the installed sae_lens has no {arch!r} architecture; upgrade sae_lens or save in the native format."
        ) from None

    def t(x: torch.Tensor) -> torch.Tensor:  # in the set's own precision
        return x.detach().cpu().contiguous().clone()

    folder = Path(path)
    for l, (hook_in, hook_out) in enumerate(hooks):
        meta = {"model_name": cfg.model_name or None, "hook_name": hook_in}
        if is_transcoder:
            meta["hook_name_out"] = hook_out
        if cfg.output_before_post_norm:
            meta["output_before_post_norm"] = True
        if cfg.folded_norms is not None:  # step 8
            meta["model_from_pretrained_kwargs"] = {"fold_ln": cfg.folded_norms}
        kw = {
            "d_in": cfg.d_model,
            "d_sae": cfg.d_sae,
            "dtype": str(tc.W_enc.dtype).removeprefix("torch."),  # float32, float64, bfloat16, float16
            "device": "meta",
            "apply_b_dec_to_input": False,
            "metadata": SAEMetadata(**meta),
        }
        if is_transcoder:
            kw["d_out"] = cfg.d_model
        if form.uses_k:
            kw["k"] = cfg.k
        state = {
            "W_enc": t(tc.W_enc[l]),
            form.sae_lens.b_enc: t(tc.b_enc[l]),
            "W_dec": t(tc.W_dec[l]),
            "b_dec": t(tc.b_dec[l]),
        }
        state |= {name: t(getattr(tc, name)[l]) for name in form.extra_state}
        if tc.W_skip is not None:
            state["W_skip"] = t(tc.W_skip[l].T)
        with _no_model_advice():
            sae = sae_cls(cfg_cls(**kw))  # on the meta device: no memory until the weights are assigned
        sae.load_state_dict(state, assign=True)
        try:
            sae.to("cpu").save_model(folder / f"layer_{l}")
        except (OSError, SafetensorError) as e:  # sae_lens writes the files itself, in place
            raise write_error(folder / f"layer_{l}", e, WriteError) from None
    return folder
