"""circuit-tracer's transcoder format, read and written (without importing circuit_tracer).

A directory holding `config.yaml` (model_kind, feature_input_hook, feature_output_hook,
model_name, scan), as circuit-tracer keeps beside cached transcoders, and either

- PLT (`model_kind: transcoder_set`): `layer_{i}.safetensors` with `W_enc` [d_tc, d_model],
  `W_dec` [d_tc, d_model], `b_enc` [d_tc], `b_dec` [d_model], optional
  `activation_function.threshold` [d_tc] (JumpReLU) and `W_skip` [d_model, d_model] applied
  as `x @ W_skip.T`; or
- CLT (`model_kind: cross_layer_transcoder`): `W_enc_{i}.safetensors` with `W_enc_{i}`
  [d_tc, d_model], `b_enc_{i}`, `b_dec_{i}`, optional `threshold_{i}`, and
  `W_dec_{i}.safetensors` with `W_dec_{i}` [d_tc, n_layers - i, d_model] (no skip).

Conversion to ours (TransformerLens orientation, `x @ W`):
1. `W_enc[l] = W_enc_ct.T`; `W_skip[l] = W_skip_ct.T`; `W_dec`, biases and thresholds as they are.
2. Hooks are per-block suffixes; circuit-tracer's wrapper hooks map onto TransformerLens ones:
   `mlp.hook_in` -> `blocks.{layer}.ln2.hook_normalized` (the MLP input, sites.py),
   `mlp.hook_out` -> `blocks.{layer}.hook_mlp_out` with `output_before_post_norm=True`,
   anything else `X` -> `blocks.{layer}.X` (e.g. `hook_resid_mid`, `hook_mlp_out`).
3. The nonlinearity (nonlinearity.py step 13): of those whose `circuit_tracer` says these files
   hold them, the one whose `extra_state` the files have (a threshold: JumpReLU; none: ReLU). A
   set is written as the nonlinearity it is `stored_as()` (BatchTopK: JumpReLU); one these files
   cannot hold (TopK, gated) is refused, named by its `label`.
4. A `config.yaml` may list the set's files instead (`transcoders:`, layer i the i-th), as
   circuit-tracer's hub sets do (`mwhanna/gemma-scope-transcoders` lists GemmaScope's
   `hf://google/gemma-scope-2b-pt-transcoders/.../params.npz`): `hf://` files come through
   huggingface_hub's cache (hub.py), paths relative to the folder or as given; `.npz` files are
   read as GemmaScope's (gemmascope.py) with the config's hooks, `.safetensors` as `layer_{i}` files.
   A list for a CLT (GemmaScope 2, for Gemma 3) is refused.
5. Tensors are read in the file's precision and written in the set's (float64 and bfloat16 stay so).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import save_file

from transcoders.block_layout import MLP_INPUT, MLP_OUTPUT, block_hook, split_block_hook
from transcoders.config import TranscoderConfig
from transcoders.errors import CorruptTranscoderError, TranscoderNotFoundError, UnknownFormatError
from transcoders.formats.native import LazyState, SafetensorsFile, check_floating
from transcoders.nonlinearity import Nonlinearity, stored_with
from transcoders.output_folder import replaced

if TYPE_CHECKING:
    from transcoders.base import SparseCoder

PLT_KIND = "transcoder_set"
CLT_KIND = "cross_layer_transcoder"
PLT_THRESHOLD = "activation_function.threshold"
"""A PLT file's name of our `threshold` (a CLT's: `threshold_{i}`)."""


def is_circuit_tracer(folder: Path) -> bool:
    return (
        (folder / "config.yaml").is_file()
        or any(folder.glob("layer_*.safetensors"))
        or (folder / "W_enc_0.safetensors").is_file()
    )


def hooks_from_ct(feature_input_hook: str, feature_output_hook: str) -> tuple[str, str, bool]:
    """(input_hook, output_hook, output_before_post_norm) of ours for circuit-tracer's hook names."""

    def one(name: str) -> str:
        split = split_block_hook(name)
        name = split[1] if split is not None else name
        if name in ("mlp.hook_in", "ln2.hook_normalized"):
            return MLP_INPUT
        if name == "mlp.hook_out":
            return MLP_OUTPUT
        return block_hook(name)

    return one(feature_input_hook), one(feature_output_hook), feature_output_hook.endswith("mlp.hook_out")


def hooks_to_ct(cfg: TranscoderConfig) -> tuple[str, str]:
    """circuit-tracer's (feature_input_hook, feature_output_hook) for our config."""

    def suffix(template: str) -> str:
        split = split_block_hook(template)
        if split is None or split[0] is not None:
            raise UnknownFormatError(
                f"hook {template!r} is not a per-block hook; circuit-tracer cannot express it."
            )
        return split[1]

    inp = "mlp.hook_in" if cfg.input_hook == MLP_INPUT else suffix(cfg.input_hook)
    if cfg.output_hook == MLP_OUTPUT and cfg.output_before_post_norm:
        out = "mlp.hook_out"
    else:
        out = suffix(cfg.output_hook)
    return inp, out


def nonlinearity_with(threshold: bool) -> type[Nonlinearity]:
    """Of the nonlinearities these files hold, the one with a `threshold` (or without) (step 3)."""
    return stored_with(("threshold",) if threshold else (), lambda cls: cls.circuit_tracer)


def read_yaml(folder: Path) -> dict:
    """`config.yaml` as a mapping ({} when absent or empty); `CorruptTranscoderError` when it is not
    UTF-8 YAML holding a mapping, or names a hook or kind by anything but a string."""
    import yaml

    path = folder / "config.yaml"
    if not path.exists():
        return {}
    try:
        meta = yaml.safe_load(path.read_bytes().decode()) or {}
    except (UnicodeDecodeError, yaml.YAMLError, IsADirectoryError) as e:
        mark = getattr(e, "problem_mark", None)
        where = f" ({e.problem} at line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise CorruptTranscoderError(
            f"{path} is not UTF-8 YAML text{where}; fix it or write the set again with save_transcoders."
        ) from e
    if not isinstance(meta, dict):
        raise CorruptTranscoderError(
            f"{path} holds a {type(meta).__name__}, not a mapping of model_kind, feature_input_hook, ...; "
            "fix it or write the set again with save_transcoders."
        )
    for key in ("model_kind", "feature_input_hook", "feature_output_hook"):
        if key in meta and not isinstance(meta[key], str):
            raise CorruptTranscoderError(f"{path}: {key} is {meta[key]!r}; it must be a string.")
    return meta


def load_circuit_tracer(path: str | os.PathLike, device="cpu", dtype: torch.dtype = torch.float32):
    """Read a circuit-tracer transcoder directory into a `PerLayerTranscoder` or `CrossLayerTranscoder`."""
    from transcoders.build import allocated
    from transcoders.formats.native import load_state

    folder = Path(path)
    meta = read_yaml(folder)
    kind = meta.get("model_kind") or (CLT_KIND if (folder / "W_enc_0.safetensors").exists() else PLT_KIND)
    in_hook, out_hook, before_norm = hooks_from_ct(
        meta.get("feature_input_hook", "hook_resid_mid"), meta.get("feature_output_hook", "hook_mlp_out")
    )
    model_name = str(meta.get("model_name") or "")
    if kind not in (PLT_KIND, CLT_KIND):
        raise UnknownFormatError(
            f"{folder / 'config.yaml'} has model_kind {kind!r}; expected {PLT_KIND!r} or {CLT_KIND!r}."
        )
    if "transcoders" in meta and kind == CLT_KIND:
        raise UnknownFormatError(
            f"{folder / 'config.yaml'} lists one file per layer for a cross-layer transcoder, GemmaScope 2's "
            "layout for Gemma 3, which TransformerLens runs only through its TransformerBridge, not the "
            "HookedTransformer attrgraph builds graphs on."
        )
    if "transcoders" in meta:  # step 4
        files = _listed_files(folder, meta["transcoders"])
        if all(f.suffix == ".npz" for f in files):
            from transcoders.formats.gemmascope import load_gemmascope

            return load_gemmascope(
                files, in_hook, out_hook, model_name, device, dtype, output_before_post_norm=before_norm
            )
        state, d_model, d_sae, n_layers, act, skip = _read_plt(files)
        ours = "plt"
    elif kind == PLT_KIND:
        state, d_model, d_sae, n_layers, act, skip = _read_plt(
            _layer_files(folder, r"layer_(\d+)\.safetensors")
        )
        ours = "plt"
    else:
        state, d_model, d_sae, n_layers, act, skip = _read_clt(folder)
        ours = "clt"
    cfg = TranscoderConfig(
        kind=ours,
        n_layers=n_layers,
        d_model=d_model,
        d_sae=d_sae,
        activation=act.name,
        input_hook=in_hook,
        output_hook=out_hook,
        skip=skip,
        output_before_post_norm=before_norm,
        model_name=model_name,
        folded_norms=False,  # circuit-tracer runs its model unprocessed (fold_ln=False): sites.py step 4
    )
    tc = allocated(cfg, dtype)
    load_state(tc, state, folder)
    return tc.to(device=device)


def _layer_files(folder: Path, pattern: str) -> list[Path]:
    found = {}
    for p in folder.iterdir():
        m = re.fullmatch(pattern, p.name)
        if m:
            found[int(m.group(1))] = p
    if not found:
        raise TranscoderNotFoundError(
            f"{folder} holds no files named like {pattern!r}; it is not a circuit-tracer set."
        )
    n = max(found) + 1
    if sorted(found) != list(range(n)):
        missing = sorted(set(range(n)) - set(found))
        raise CorruptTranscoderError(
            f"{folder} lacks the files of layers {missing}; a set needs every layer."
        )
    return [found[i] for i in range(n)]


def _listed_files(folder: Path, listed) -> list[Path]:
    """The local files of a `transcoders:` list (step 4), layer i the i-th: `hf://` entries fetched
    through huggingface_hub's cache (hub.py), paths taken relative to the folder, else as given."""
    from transcoders.formats.hub import fetch_file, file_ref

    config = folder / "config.yaml"
    if not isinstance(listed, list) or not listed or not all(isinstance(p, str) for p in listed):
        raise CorruptTranscoderError(
            f"{config}: transcoders is {listed!r}; it must list one file (a path or hf:// URI) per layer."
        )
    names = [file_ref(e, config).path if e.startswith("hf://") else e for e in listed]
    kinds = {Path(name).suffix for name in names}
    if not kinds <= {".npz", ".safetensors"} or len(kinds) > 1:  # before anything is fetched
        raise CorruptTranscoderError(
            f"{config} lists files of kinds {sorted(kinds)}; a set is one kind: GemmaScope .npz or "
            "circuit-tracer .safetensors, one per layer."
        )
    files = []
    for entry in listed:
        if entry.startswith("hf://"):
            files.append(fetch_file(entry, config))
            continue
        path = next((p for p in (folder / entry, Path(entry)) if p.is_file()), None)
        if path is None:
            raise TranscoderNotFoundError(f"{config} lists {entry!r}, which is no file here or in {folder}.")
        files.append(path)
    return files


def _get(d: dict, key: str, source) -> torch.Tensor:
    if key not in d:
        raise CorruptTranscoderError(
            f"{source} has no tensor {key!r}; it is not a circuit-tracer transcoder file."
        )
    check_floating(key, d[key], source)
    return d[key]  # in the file's precision: the set's allocation converts it once (float64 stays)


def _stack(tensors: list[torch.Tensor], key: str, files: list[Path], transpose: bool = False) -> torch.Tensor:
    """The layers' tensors `key` (as the files hold them) stacked, each transposed when asked, once
    each has layer 0's shape (else the file that differs)."""
    for t, f in zip(tensors, files, strict=True):
        if t.shape != tensors[0].shape:
            raise CorruptTranscoderError(
                f"{f}: {key} has shape {tuple(t.shape)}, layer 0's has {tuple(tensors[0].shape)}; every "
                "layer needs the same d_model and d_sae."
            )
    return torch.stack([t.T for t in tensors] if transpose else tensors)


def _same_presence(layers: list[dict], keys: list[str], files: list[Path]) -> None:
    """Refuse an optional tensor (a threshold, a skip) that some layers' files hold and others lack:
    one nonlinearity and one skip serve the whole set."""
    for i, (d, key) in enumerate(zip(layers, keys, strict=True)):
        if (key in d) != (keys[0] in layers[0]):
            has, lacks = (files[i], files[0]) if key in d else (files[0], files[i])
            raise CorruptTranscoderError(
                f"{has} holds {key!r} but {lacks} does not; every layer of a set has the same tensors."
            )


def _read_plt(files: list[Path]):
    layers = [SafetensorsFile(f) for f in files]  # headers now, each tensor when its key is stacked
    first = layers[0]
    for optional in (PLT_THRESHOLD, "W_skip"):
        _same_presence(layers, [optional] * len(layers), files)
    act = nonlinearity_with(threshold=PLT_THRESHOLD in first)
    skip = "W_skip" in first
    d_sae, d_model = _get(first, "W_enc", files[0]).shape

    def stacked(key: str, transpose: bool = False) -> torch.Tensor:
        return _stack([_get(d, key, f) for d, f in zip(layers, files, strict=True)], key, files, transpose)

    state = {
        "W_enc": lambda: stacked("W_enc", True),
        "W_dec": lambda: stacked("W_dec"),
        "b_enc": lambda: stacked("b_enc"),
        "b_dec": lambda: stacked("b_dec"),
    }
    if "threshold" in act.extra_state:  # a scalar threshold serves every feature
        state["threshold"] = lambda: _stack(
            [_get(d, PLT_THRESHOLD, f).reshape(-1).expand(d_sae) for d, f in zip(layers, files, strict=True)],
            PLT_THRESHOLD,
            files,
        )
    if skip:
        state["W_skip"] = lambda: stacked("W_skip", True)
    return LazyState(state), d_model, d_sae, len(files), act, skip


def _read_clt(folder: Path):
    enc_files = _layer_files(folder, r"W_enc_(\d+)\.safetensors")
    n = len(enc_files)
    encs = [SafetensorsFile(f) for f in enc_files]
    decs = []
    for i in range(n):
        f = folder / f"W_dec_{i}.safetensors"
        if not f.exists():
            raise CorruptTranscoderError(
                f"{f} is missing; a circuit-tracer CLT needs W_dec_{{i}} for every layer."
            )
        decs.append((SafetensorsFile(f), f))
    _same_presence(encs, [f"threshold_{i}" for i in range(n)], enc_files)
    act = nonlinearity_with(threshold="threshold_0" in encs[0])
    d_sae, d_model = _get(encs[0], "W_enc_0", enc_files[0]).shape

    def stacked(name: str, transpose: bool = False) -> torch.Tensor:
        tensors = [_get(e, f"{name}_{i}", enc_files[i]) for i, e in enumerate(encs)]
        return _stack(tensors, name, enc_files, transpose)

    state = {
        "W_enc": lambda: stacked("W_enc", True),
        "b_enc": lambda: stacked("b_enc"),
        "b_dec": lambda: stacked("b_dec"),
    }
    if "threshold" in act.extra_state:  # a scalar threshold serves every feature
        state["threshold"] = lambda: _stack(
            [_get(e, f"threshold_{i}", enc_files[i]).reshape(-1).expand(d_sae) for i, e in enumerate(encs)],
            "threshold",
            enc_files,
        )
    for i, (d, f) in enumerate(decs):
        state[f"W_dec.{i}"] = lambda d=d, f=f, i=i: _get(d, f"W_dec_{i}", f)
    return LazyState(state), d_model, d_sae, n, act, False


def save_circuit_tracer(tc: SparseCoder, path: str | os.PathLike, scan: str | None = None) -> Path:
    """Write `tc` (a PLT or CLT) in circuit-tracer's format; returns the directory."""
    import yaml

    cfg: TranscoderConfig = tc.cfg
    if cfg.kind == "sae":
        raise UnknownFormatError(
            "circuit-tracer stores transcoders, not SAEs; save an SAE in the native format."
        )
    form = tc.nonlinearity.stored_as()
    if not form.circuit_tracer:  # e.g. TopK's per-token rule, or gated's r_mag and b_mag
        name = tc.nonlinearity.label
        raise UnknownFormatError(
            f"circuit-tracer has no {name} activation; save a {name} set in the native format."
        )
    if cfg.kind == "clt" and cfg.skip:
        raise UnknownFormatError(
            "circuit-tracer's CLT files carry no W_skip; save a CLT with skip in the native format."
        )
    if cfg.folded_norms:
        raise UnknownFormatError(
            "circuit-tracer runs its model with the norms unfolded, and this set was trained on one with "
            "them folded (TransformerLens's default processing); save it in the native or sae_lens format."
        )
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    inp, out = hooks_to_ct(cfg)

    def t(x):
        return (
            x.detach().cpu().contiguous()
        )  # in the set's precision, as circuit-tracer's own writer keeps its

    for l in range(cfg.n_layers):
        if cfg.kind == "plt":
            d = {
                "W_enc": t(tc.W_enc[l].T),
                "W_dec": t(tc.W_dec[l]),
                "b_enc": t(tc.b_enc[l]),
                "b_dec": t(tc.b_dec[l]),
            }
            if "threshold" in form.extra_state:
                d[PLT_THRESHOLD] = t(tc.threshold[l])
            if tc.W_skip is not None:
                d["W_skip"] = t(tc.W_skip[l].T)
            _save(d, folder / f"layer_{l}.safetensors")
        else:
            d = {f"W_enc_{l}": t(tc.W_enc[l].T), f"b_enc_{l}": t(tc.b_enc[l]), f"b_dec_{l}": t(tc.b_dec[l])}
            if "threshold" in form.extra_state:
                d[f"threshold_{l}"] = t(tc.threshold[l])
            _save(d, folder / f"W_enc_{l}.safetensors")
            _save({f"W_dec_{l}": t(tc.W_dec[l])}, folder / f"W_dec_{l}.safetensors")
    meta = {
        "model_kind": PLT_KIND if cfg.kind == "plt" else CLT_KIND,
        "model_name": cfg.model_name or None,
        "feature_input_hook": inp,
        "feature_output_hook": out,
        "scan": scan or f"attrgraph-{cfg.kind}-{cfg.model_name or 'model'}",
    }
    with replaced(folder / "config.yaml") as tmp:
        tmp.write_text(yaml.safe_dump(meta, sort_keys=True))
    return folder


def _save(tensors: dict[str, torch.Tensor], path: Path) -> None:
    with replaced(path) as tmp:
        save_file(tensors, str(tmp))
