"""Training checkpoints: named tensors in safetensors plus plain JSON (no pickles).

1. `state.safetensors` holds the set's unfolded (normalized-space) weights `tc.*`, the
   per-layer scales `scale.in` / `scale.out`, the step each feature last fired, and Adam's
   moments flattened to `opt.<param name>.<exp_avg|exp_avg_sq|step>`.
   A feature-sharded run over n ranks (distributed.py step 3) writes step 1's tensors as n files
   instead, `state.<r>-of-<n>.safetensors`, each rank its own: its slice of every tensor with a
   feature axis (as the set declares it, `distributed.feature_dim`), and rank 0 the replicated ones too; no rank gathers
   another's. `read_checkpoint(folder, part=(r, m))` reads rank r of m's slice (m = 1: the whole
   state) from whichever files hold it, through safetensors' slices, so a checkpoint written
   with n ranks resumes with any number, each rank reading only its own features.
2. `meta.json` holds the step, both configs (the full set's), the number of state files
   (`shards`), the parameter order and Adam's hyperparameters.
3. A checkpoint is written to `<dir>.tmp`, the last one renamed to `<dir>.old`, `<dir>.tmp`
   renamed to `<dir>` and `<dir>.old` removed, so an interrupted write (or a NaN that stops
   training) never replaces the last good one. A kill between the two renames leaves only
   `<dir>.old`: `resume_folder` then resumes from it; a kill before its removal leaves both, and
   the next write removes the stale `<dir>.old` first. Sharded, rank 0 makes `<dir>.tmp`, every
   rank writes its file into it, and rank 0 writes `meta.json` (last, after a barrier) and renames.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from transcoders.build import feature_dims_of
from transcoders.config import TranscoderConfig
from transcoders.distributed import feature_dim
from transcoders.errors import ConfigError, CorruptCheckpointError, WriteError
from transcoders.h5file import write_error

if TYPE_CHECKING:
    from collections.abc import Callable

    from transcoders.base import SparseCoder

STATE = "state.safetensors"


def state_files(shards: int) -> list[str]:
    """The state files of a checkpoint written by `shards` ranks (1: one process's single file)."""
    return [STATE] if shards == 1 else [f"state.{r}-of-{shards}.safetensors" for r in range(shards)]


def state_tensors(tc: SparseCoder, opt, scales: dict, fired: torch.Tensor) -> tuple[dict, list, list]:
    """Step 1's named tensors, the parameter order and Adam's hyperparameters (no files written)."""
    tensors = {f"tc.{k}": v.detach().contiguous() for k, v in tc.state_dict().items()}
    tensors.update({"scale.in": scales["in"], "scale.out": scales["out"], "last_fired": fired})
    names = {p: n for n, p in tc.named_parameters()}
    opt_state = opt.state_dict()
    order = [names[p] for p in opt.param_groups[0]["params"]]
    for idx, st in opt_state["state"].items():
        for k, v in st.items():
            tensors[f"opt.{order[idx]}.{k}"] = v.detach().reshape(v.shape).contiguous()
    groups = [{k: v for k, v in g.items() if k != "params"} for g in opt_state["param_groups"]]
    return tensors, order, groups


def save_checkpoint(
    folder: Path, tc: SparseCoder, opt, step: int, scales: dict, fired: torch.Tensor, cfg
) -> None:
    """Weights, Adam state, step and scales as safetensors + json; written to a temp dir, then renamed."""
    tensors, order, groups = state_tensors(tc, opt, scales, fired)
    write_checkpoint(folder, tensors, step, cfg, tc.cfg, order, groups)


def write_checkpoint(
    folder: Path,
    tensors: dict,
    step: int,
    cfg,
    tc_cfg,
    order: list,
    groups: list,
    part: tuple[int, int] = (0, 1),
    barrier: Callable[[], None] | None = None,
) -> None:
    """Steps 1-3 for named tensors (`state_tensors`): one process's (`part=(0, 1)`), or rank r of n's
    (`part=(r, n)`, every rank calling it with its slice, `barrier` a barrier of all ranks; `tc_cfg`
    the full set's config). Rank 0 alone keeps the replicated tensors in its file."""
    rank, shards = part
    tmp = folder.with_name(folder.name + ".tmp")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    if shards > 1:
        barrier()  # the folder exists before any rank writes into it
        if not tmp.is_dir():
            raise ConfigError(
                f"rank {rank} does not see {tmp}, which rank 0 made: a feature-sharded run writes one "
                "checkpoint file per rank, so --out must be on a filesystem every rank sees."
            )
        dims = feature_dims_of(tc_cfg)
        tensors = {k: v for k, v in tensors.items() if rank == 0 or feature_dim(k, dims) is not None}
    name = state_files(shards)[rank]
    cpu = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    _written(folder, tmp / name, rank, lambda: save_file(cpu, str(tmp / name)))
    if shards > 1:
        barrier()  # every rank's file is complete before rank 0 writes meta.json and renames
    if rank != 0:
        return
    meta = {
        "step": step,
        "train_config": dataclasses.asdict(cfg),
        "tc_config": tc_cfg.to_dict(),
        "shards": shards,
        "param_order": order,
        "param_groups": groups,
    }
    _written(
        folder, tmp / "meta.json", rank, lambda: (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    )
    old = folder.with_name(folder.name + ".old")
    if folder.exists():
        shutil.rmtree(old, ignore_errors=True)  # left by a kill after the last write's renames
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def _written(folder: Path, path: Path, rank: int, write: Callable[[], object]) -> None:
    """`write()` of a file into `<folder>.tmp`; a full disk or a size limit is `WriteError` (one
    line), the temporary removed (by rank 0) and the last checkpoint, `folder`, kept (step 3)."""
    try:
        write()
    except (OSError, SafetensorError) as e:
        if rank == 0:
            shutil.rmtree(path.parent, ignore_errors=True)
        kept = f"the last checkpoint, {folder}, is kept" if folder.exists() else "no checkpoint was kept yet"
        raise WriteError(f"{write_error(path, e, WriteError)} The run stopped; {kept}.") from None


def resume_folder(folder: Path) -> Path | None:
    """The checkpoint to resume from (step 3): `folder`, else `<folder>.old` when a kill between the
    renames left only that, else None (a fresh run)."""
    folder = Path(folder)
    old = folder.with_name(folder.name + ".old")
    for candidate in (folder, old):
        if (candidate / "meta.json").exists():
            shards = read_meta(candidate)["shards"]
            if all((candidate / f).exists() for f in state_files(shards)):
                return candidate
    return None


META_FIELDS = {
    "step": int,
    "train_config": dict,
    "tc_config": dict,
    "param_order": list,
    "param_groups": list,
}
"""What a resume reads of meta.json (step 2), by type; `shards` is optional (1)."""


def damaged(folder: Path, why: str) -> CorruptCheckpointError:
    """The one error of a checkpoint that cannot be resumed from, and what to do about it."""
    return CorruptCheckpointError(
        f"{folder} is damaged: {why}; remove it to train afresh (or pass another --out), or put back a "
        "good copy of it to resume."
    )


_KINDS = {int: "a count", dict: "an object", list: "a list"}
ADAM_GROUP = {"lr", "betas", "eps", "weight_decay"}
"""What every torch version's Adam keeps in a parameter group (it fills in the flags it added later)."""


def read_meta(folder: Path) -> dict:
    """`folder/meta.json` with the fields a resume reads (step 2), or `CorruptCheckpointError`."""
    from transcoders.formats.native import broken_json

    path = folder / "meta.json"
    why = broken_json(path) if path.is_file() else "meta.json is not a file"
    if why is not None:
        raise damaged(folder, why.split("; ")[0].replace(str(path), "meta.json"))
    meta = json.loads(path.read_bytes())
    if not isinstance(meta, dict):
        raise damaged(folder, f"meta.json holds a JSON {type(meta).__name__}, not an object")
    meta.setdefault("shards", 1)
    for key, kind in (META_FIELDS | {"shards": int}).items():
        if key not in meta:
            raise damaged(folder, f"meta.json lacks {key!r}")
        value = meta[key]
        if (
            not isinstance(value, kind)
            or isinstance(value, bool)
            or (kind is int and value < (key == "shards"))
        ):
            raise damaged(folder, f"meta.json's {key} is {value!r}, not {_KINDS[kind]}")
    return meta


def read_checkpoint(folder: Path, part: tuple[int, int] = (0, 1)) -> tuple[dict, dict]:
    """`(meta, named tensors)` of a checkpoint folder: the whole state (`part=(0, 1)`), or rank r of
    m's slice of every tensor with a feature axis (`part=(r, m)`; replicated ones whole), read from
    the files of the ranks that wrote those features (step 1). A file that cannot be read, or a
    tensor holding NaN or inf, is `CorruptCheckpointError`."""
    meta = read_meta(folder)
    try:
        tc_cfg = TranscoderConfig.from_dict(meta["tc_config"])
    except ConfigError as e:
        raise damaged(folder, f"meta.json's tc_config: {str(e).split('; ')[0]}") from e
    try:
        out = _read_tensors(folder, meta, tc_cfg, part)
    except (SafetensorError, OSError) as e:
        raise damaged(folder, f"a state file could not be read ({e})") from e
    from transcoders.formats import first_non_finite

    found = first_non_finite(out.items())
    if found is not None:
        raise damaged(folder, f"{found[0]} holds NaN or inf, which no good step writes")
    return meta, out


def _read_tensors(folder: Path, meta: dict, tc_cfg: TranscoderConfig, part: tuple[int, int]) -> dict:
    dims, n_features = feature_dims_of(tc_cfg), tc_cfg.d_sae
    files = state_files(meta["shards"])
    rank, world = part
    lo, hi = rank * n_features // world, (rank + 1) * n_features // world
    out = {}
    handles = [safe_open(str(folder / f), framework="pt") for f in files]
    for name in handles[0].keys():  # noqa: SIM118 (a safe_open handle is no dict)
        dim = feature_dim(name, dims)
        if dim is None:
            out[name] = handles[0].get_tensor(name)
            continue
        pieces = []
        for i, handle in enumerate(handles):  # file i holds features [a, b)
            a, b = i * n_features // len(files), (i + 1) * n_features // len(files)
            if max(a, lo) < min(b, hi):
                cut = (slice(None),) * dim + (slice(max(a, lo) - a, min(b, hi) - a),)
                pieces.append(handle.get_slice(name)[cut])
        out[name] = torch.cat(pieces, dim)
    return out


def apply_state(
    tc: SparseCoder, opt, meta: dict, t: dict, folder: Path | None = None
) -> tuple[int, dict, torch.Tensor]:
    """Load named tensors (full, or one rank's slice of them) into `tc` and `opt`; tensors that are
    missing or do not fit are `CorruptCheckpointError` naming `folder`."""
    folder = folder or Path("the checkpoint")
    missing = sorted({"scale.in", "scale.out", "last_fired"} - set(t))
    if missing:
        raise damaged(folder, f"its state lacks {missing}")
    try:
        tc.load_state_dict(
            tc.nonlinearity.adapt_state(tc, {k[3:]: v for k, v in t.items() if k.startswith("tc.")})
        )
    except RuntimeError as e:  # a missing, unexpected or resized tensor of the set
        reason = " ".join(str(e).split("\n", 1)[-1].split())[:200]
        raise damaged(folder, f"its set's tensors do not fit the run's ({reason})") from e
    params = dict(tc.named_parameters())
    order = meta["param_order"]
    if any(not isinstance(g, dict) or not ADAM_GROUP <= set(g) for g in meta["param_groups"]):
        raise damaged(folder, f"meta.json's param_groups lack Adam's {sorted(ADAM_GROUP)}")
    state = {}
    for idx, name in enumerate(order):
        prefix = f"opt.{name}."
        st = {k[len(prefix) :]: v for k, v in t.items() if k.startswith(prefix)}
        for key, value in st.items():
            if key != "step" and name in params and value.shape != params[name].shape:
                shapes = f"{tuple(value.shape)}, its parameter's {tuple(params[name].shape)}"
                raise damaged(folder, f"{prefix}{key} has shape {shapes}")
        if st:
            state[idx] = st
    groups = [dict(g, params=list(range(len(order)))) for g in meta["param_groups"]]
    try:
        opt.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, KeyError, TypeError) as e:  # another parameter count, or a damaged group
        raise damaged(folder, f"its optimizer state does not fit the run's ({e})") from e
    return meta["step"], {"in": t["scale.in"], "out": t["scale.out"]}, t["last_fired"]


def check_order(folder: Path, meta: dict, tc: SparseCoder, opt) -> None:
    """Refuse a checkpoint whose parameter order (step 2) is not that of the run resuming it (the
    same set, in training): Adam's moments would go to other parameters, or start afresh."""
    names = {p: n for n, p in tc.named_parameters()}
    order = [names[p] for p in opt.param_groups[0]["params"]]
    if meta["param_order"] != order:
        raise damaged(folder, f"meta.json's param_order {meta['param_order']} is not the run's {order}")


def load_checkpoint(folder: Path, tc: SparseCoder, opt) -> tuple[int, dict, torch.Tensor]:
    meta, t = read_checkpoint(folder)
    return apply_state(tc, opt, meta, t, folder)
