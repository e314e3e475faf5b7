"""Load a HookedTransformer with its tokenizer: the bundled model, a local folder, or a TL name.

A model folder holds:
  config.json        HookedTransformerConfig keyword arguments
  model.safetensors  the state dict, TransformerLens parameter names
  tokenizer/         a Hugging Face tokenizer folder (optional)
  manifest.json      optional; when it lists sha256 sums under "files", they are checked

This is the layout the training script writes into `data/default` and the peer
harness (`shared/peer/ct_graph.py --out DIR`) writes for its random models.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import warnings
from pathlib import Path

import torch

from attrgraph.bundled.paths import BUNDLED
from attrgraph.errors import (
    ChecksumError,
    CorruptWeightsError,
    ModelNotFoundError,
    NonFiniteValueError,
    OptionError,
    UnsupportedModelError,
)
from transcoders.manifest import verify_manifest  # one check for models and transcoders
from transcoders.model_state import check_dtype
from transcoders.sites import is_hooked_model

# Buffers TransformerLens rebuilds from the config; a state dict need not carry them.
REBUILT_BUFFERS = (".mask", ".IGNORE", "rotary_sin", "rotary_cos")


def check_model(model) -> None:
    """`UnsupportedModelError` unless `model` is a model as `load_model` returns it (a TransformerLens
    `HookedTransformer`, read by its `cfg` and hooks): a name or path passed where the loaded model
    goes is the likely mistake."""
    if not is_hooked_model(model):
        raise UnsupportedModelError(
            f"the model is a {type(model).__name__}, not a TransformerLens HookedTransformer; load one "
            "with attrgraph.load_model('default') (or a folder, or a TransformerLens name)."
        )
    check_dtype(model)  # .half() and the like leave cfg.dtype behind (transcoders/model_state.py)


def load_model(
    name_or_path: str | os.PathLike = "default",
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str = torch.float32,
    processing: bool = False,
):
    """Return a `HookedTransformer` with its tokenizer. `dtype`: a floating torch dtype or its
    name, as TransformerLens takes it ("float32", "bfloat16", "bf16", ...).

    name_or_path: "default" (the bundled model, offline), a local model folder
        (see the module docstring), or a TransformerLens model name such as "gpt2"
        (downloads unless it is in the Hugging Face cache).
    processing: False (default) loads the weights as they are: a TransformerLens name through
        `from_pretrained_no_processing`, as circuit-tracer and sae_lens load the models their
        transcoders are trained on; True applies TransformerLens's default processing (folded
        norms, centered writing weights and unembedding: `from_pretrained`, or `process_weights_`
        on a folder). Both compute the same function, but a set reads other MLP inputs on each,
        so a set that records which it was trained on is refused on the other
        (transcoders/sites.py step 4).
    """
    from transformer_lens import HookedTransformer

    from transcoders.config import check_device, check_dtype

    check_device(device)  # a device this machine lacks: one sentence, before anything loads
    dtype = check_dtype(dtype)

    if not isinstance(processing, bool):
        raise OptionError(f"processing is {processing!r}; pass True (TransformerLens's processing) or False.")
    key = _resolve(name_or_path)
    if isinstance(key, Path):
        model = load_model_folder(key, device=device, dtype=dtype)
        if processing:
            model.process_weights_()  # TransformerLens's from_pretrained defaults
        return model
    load = (
        HookedTransformer.from_pretrained if processing else HookedTransformer.from_pretrained_no_processing
    )
    try:
        return load(key, device=device, dtype=dtype)
    except Exception as e:  # offline failures and the like land here
        raise _not_loaded(f"could not load TransformerLens model {key!r}", e) from e


TL_NAMES = "transformer_lens.loading_from_pretrained.OFFICIAL_MODEL_NAMES"


def _resolve(name_or_path) -> Path | str:
    """The model folder `name_or_path` names (a Path), or the TransformerLens name it is (a str);
    `ModelNotFoundError` for a folder that is not there and a name TransformerLens does not know."""
    if not isinstance(name_or_path, str | os.PathLike):
        raise ModelNotFoundError(
            f"the model is named by a {type(name_or_path).__name__}; pass 'default', a folder or a TransformerLens name."
        )
    key = str(name_or_path)
    folder = BUNDLED.get(key, Path(key))
    if folder.is_dir():
        return folder
    if key in BUNDLED or os.sep in key or key.startswith("."):
        raise ModelNotFoundError(
            f"no model folder at {folder}; pass 'default', a folder holding config.json and "
            "model.safetensors, or a TransformerLens model name."
        )
    close = _unknown_tl_name(key)
    if close is not None:
        hint = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else "see " + TL_NAMES + "."
        raise ModelNotFoundError(
            f"{key!r} is not 'default', a model folder, or a TransformerLens model name; {hint}"
        )
    return key


def _unknown_tl_name(name: str) -> list[str] | None:
    """None when TransformerLens knows `name` (an official name or alias, any case), else at most
    three close names of distinct models (difflib); None as well when the list cannot be read."""
    try:
        from transformer_lens.loading_from_pretrained import make_model_alias_map

        known = make_model_alias_map()  # lowercased official names and aliases -> official name
    except (ImportError, AttributeError):
        return None
    if name.lower() in known:
        return None
    close = difflib.get_close_matches(name.lower(), list(known), n=8, cutoff=0.6)
    # an official name in its own case, an alias as TransformerLens lists it; one per model
    shown: dict[str, str] = {}
    for c in close:
        shown.setdefault(known[c], known[c] if c == known[c].lower() else c)
    return list(shown.values())[:3]


def load_model_folder(folder: Path, device="cpu", dtype=torch.float32):
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from transformer_lens import HookedTransformer

    for required in ("config.json", "model.safetensors"):
        if not (folder / required).exists():
            raise ModelNotFoundError(
                f"{folder} has no {required}; a model folder needs config.json and model.safetensors."
            )
    verify_manifest(folder, ModelNotFoundError, ChecksumError)
    tokenizer = _tokenizer(folder / "tokenizer") if (folder / "tokenizer").is_dir() else None
    cfg = _folder_config(folder, device, dtype)
    try:
        with warnings.catch_warnings():
            # TransformerLens 3 steers new users to TransformerBridge; HookedTransformer is our backend.
            warnings.filterwarnings("ignore", "HookedTransformer is deprecated", DeprecationWarning)
            model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=True)
    except (TypeError, ValueError, AssertionError) as e:  # an unknown key, a mistyped or unknown value
        raise _config_error(folder, e) from e
    try:
        state = load_file(folder / "model.safetensors")
    except (SafetensorError, OSError, ValueError) as e:
        raise CorruptWeightsError(
            f"{folder / 'model.safetensors'} could not be read ({e}); the file is truncated or not safetensors."
        ) from e
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:
        raise CorruptWeightsError(
            f"{folder / 'model.safetensors'} does not fit {folder / 'config.json'}: {str(e).splitlines()[-1].strip()}"
        ) from e
    missing = [k for k in missing if not k.endswith(REBUILT_BUFFERS)]
    if missing or unexpected:
        raise CorruptWeightsError(
            f"{folder / 'model.safetensors'} does not fit its config: missing {missing[:3]}, unexpected {unexpected[:3]}."
        )
    _check_weights(state, model, folder / "model.safetensors")
    model.eval()
    return model


def _folder_config(folder: Path, device="cpu", dtype=torch.float32):
    """The `HookedTransformerConfig` of a model folder's config.json, or `CorruptWeightsError`."""
    from transformer_lens import HookedTransformerConfig

    kwargs = _read_config(folder / "config.json")
    kwargs.update(device=str(device), dtype=dtype, init_weights=False)
    try:
        cfg = HookedTransformerConfig(**kwargs)
        if cfg.positional_embedding_type not in POSITIONAL:  # HookedTransformer meets it only in a forward
            raise ValueError(
                f"positional_embedding_type {cfg.positional_embedding_type!r} is not one of {POSITIONAL}"
            )
    except (TypeError, ValueError, AssertionError) as e:  # an unknown key, a mistyped or unknown value
        raise _config_error(folder, e) from e
    return cfg


def _config_error(folder: Path, e: Exception) -> CorruptWeightsError:
    reason = re.sub(r"<(?:built-in )?function (\w+)[^>]*>", r"\1", " ".join(str(e).split()))[:200]
    return CorruptWeightsError(
        f"{folder / 'config.json'} does not make a HookedTransformer ({reason}); fix the key or value it names."
    )


def load_model_config(name_or_path: str | os.PathLike = "default"):
    """The `HookedTransformerConfig` of the model `load_model(name_or_path)` loads, without reading
    its weights: a folder's config.json, or the config TransformerLens makes for a model name (from
    the Hugging Face config, cached or online). For what needs the shape of a model only, such as
    `save_pt`'s `cfg`."""
    key = _resolve(name_or_path)
    if isinstance(key, Path):
        if not (key / "config.json").exists():
            raise ModelNotFoundError(
                f"{key} has no config.json; a model folder needs config.json and model.safetensors."
            )
        return _folder_config(key)
    from transformer_lens.loading_from_pretrained import get_pretrained_model_config

    try:
        return get_pretrained_model_config(key)
    except Exception as e:  # offline failures and the like land here
        raise _not_loaded(f"could not read the config of TransformerLens model {key!r}", e) from e


def _not_loaded(what: str, e: Exception) -> ModelNotFoundError:
    reason = (str(e).strip().splitlines() or [""])[0][:200]
    return ModelNotFoundError(
        f"{what} ({type(e).__name__}: {reason}); check that it is in the Hugging Face cache or that you are online."
    )


POSITIONAL = ("standard", "rotary", "shortformer", "alibi")
"""The positional embeddings HookedTransformer builds (its `input_to_embed`)."""


def _read_config(path: Path) -> dict:
    """A model folder's config.json as a dict; `CorruptWeightsError` when it is not a JSON object."""
    from transcoders.formats.native import broken_json

    if not path.is_file():
        raise CorruptWeightsError(f"{path} is not a file; a model folder's config.json holds its config.")
    why = broken_json(path)
    if why is not None:
        raise CorruptWeightsError(why)
    kwargs = json.loads(path.read_bytes())
    if not isinstance(kwargs, dict):
        raise CorruptWeightsError(
            f"{path} holds a JSON {type(kwargs).__name__}, not an object of HookedTransformerConfig fields."
        )
    return kwargs


def _tokenizer(folder: Path):
    """The folder's tokenizer; `CorruptWeightsError` when transformers cannot build one from it."""
    from attrgraph.bundled.tokenizer import load_tokenizer

    try:
        return load_tokenizer(folder)
    except (OSError, ValueError, TypeError, KeyError) as e:  # no tokenizer file, or a damaged one
        reason = " ".join(str(e).split())[:160]
        raise CorruptWeightsError(
            f"{folder} holds no tokenizer transformers can read ({type(e).__name__}: {reason}); save one "
            "there with tokenizer.save_pretrained, or remove the folder to load the model without one."
        ) from e


def _check_weights(state: dict, model, source: Path) -> None:
    """Refuse weights that loading casts or carries silently: integers or booleans where the model
    has floats, and NaN or inf (a diverged run), which would turn every logit and edge into NaN."""
    from transcoders.formats import first_non_finite

    want = model.state_dict()
    weights = {k: v for k, v in state.items() if not k.endswith(REBUILT_BUFFERS)}  # IGNORE is -inf
    for name, value in weights.items():
        if want[name].is_floating_point() and not value.is_floating_point():
            raise CorruptWeightsError(
                f"{source}: {name} holds {str(value.dtype).removeprefix('torch.')} values where the model "
                "has floats; the file is damaged or not this model's weights."
            )
    found = first_non_finite(weights.items())
    if found is not None:
        name, bad, n = found
        raise NonFiniteValueError(
            f"{source}: {name} holds {bad} of {n} values that are NaN or inf (a diverged training run?); "
            "retrain or load an earlier checkpoint."
        )
