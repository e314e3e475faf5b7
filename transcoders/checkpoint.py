"""Training checkpoints: named tensors in safetensors plus plain JSON (no pickles).

1. `state.safetensors` holds the set's unfolded (normalized-space) weights `tc.*`, the
   per-layer scales `scale.in` / `scale.out`, the step each feature last fired, and Adam's
   moments flattened to `opt.<param name>.<exp_avg|exp_avg_sq|step>`.
2. `meta.json` holds the step, both configs, the parameter order and Adam's hyperparameters.
3. A checkpoint is written to `<dir>.tmp`, the last one renamed to `<dir>.old`, `<dir>.tmp`
   renamed to `<dir>` and `<dir>.old` removed, so an interrupted write (or a NaN that stops
   training) never replaces the last good one. A kill between the two renames leaves only
   `<dir>.old`: `resume_folder` then resumes from it; a kill before its removal leaves both, and
   the next write removes the stale `<dir>.old` first.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file

if TYPE_CHECKING:
    from transcoders.base import SparseCoder


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


def write_checkpoint(folder: Path, tensors: dict, step: int, cfg, tc_cfg, order: list, groups: list) -> None:
    """Steps 1-3 for named tensors (`state_tensors`, or their gather over ranks)."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp / "state.safetensors"))
    meta = {
        "step": step,
        "train_config": dataclasses.asdict(cfg),
        "tc_config": tc_cfg.to_dict(),
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
        if (candidate / "meta.json").exists() and (candidate / "state.safetensors").exists():
            return candidate
    return None


def read_checkpoint(folder: Path) -> tuple[dict, dict]:
    """`(meta, named tensors)` of a checkpoint folder."""
    return json.loads((folder / "meta.json").read_text()), load_file(str(folder / "state.safetensors"))


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
