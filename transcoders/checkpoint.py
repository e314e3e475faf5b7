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
from safetensors import safe_open
from safetensors.torch import save_file

from transcoders.build import feature_dims_of
from transcoders.config import TranscoderConfig
from transcoders.distributed import feature_dim
from transcoders.errors import ConfigError

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
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp / name))
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
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    old = folder.with_name(folder.name + ".old")
    if folder.exists():
        shutil.rmtree(old, ignore_errors=True)  # left by a kill after the last write's renames
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def resume_folder(folder: Path) -> Path | None:
    """The checkpoint to resume from (step 3): `folder`, else `<folder>.old` when a kill between the
    renames left only that, else None (a fresh run)."""
    folder = Path(folder)
    old = folder.with_name(folder.name + ".old")
    for candidate in (folder, old):
        if (candidate / "meta.json").exists():
            shards = json.loads((candidate / "meta.json").read_text()).get("shards", 1)
            if all((candidate / f).exists() for f in state_files(shards)):
                return candidate
    return None


def read_checkpoint(folder: Path, part: tuple[int, int] = (0, 1)) -> tuple[dict, dict]:
    """`(meta, named tensors)` of a checkpoint folder: the whole state (`part=(0, 1)`), or rank r of
    m's slice of every tensor with a feature axis (`part=(r, m)`; replicated ones whole), read from
    the files of the ranks that wrote those features (step 1)."""
    meta = json.loads((folder / "meta.json").read_text())
    tc_cfg = TranscoderConfig.from_dict(meta["tc_config"])
    dims, n_features = feature_dims_of(tc_cfg), tc_cfg.d_sae
    files = state_files(meta.get("shards", 1))
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
    return meta, out


def apply_state(tc: SparseCoder, opt, meta: dict, t: dict) -> tuple[int, dict, torch.Tensor]:
    """Load named tensors (full, or one rank's slice of them) into `tc` and `opt`."""
    tc.load_state_dict(
        tc.nonlinearity.adapt_state(tc, {k[3:]: v for k, v in t.items() if k.startswith("tc.")})
    )
    state = {}
    for idx, name in enumerate(meta["param_order"]):
        prefix = f"opt.{name}."
        st = {k[len(prefix) :]: v for k, v in t.items() if k.startswith(prefix)}
        if st:
            state[idx] = st
    groups = [dict(g, params=list(range(len(meta["param_order"])))) for g in meta["param_groups"]]
    opt.load_state_dict({"state": state, "param_groups": groups})
    return meta["step"], {"in": t["scale.in"], "out": t["scale.out"]}, t["last_fired"]


def load_checkpoint(folder: Path, tc: SparseCoder, opt) -> tuple[int, dict, torch.Tensor]:
    meta, t = read_checkpoint(folder)
    return apply_state(tc, opt, meta, t)
