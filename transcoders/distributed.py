"""Training on several processes with torch.distributed: data parallel or feature-sharded.

`torchrun --nproc-per-node N -m transcoders.train ...` sets RANK / WORLD_SIZE / LOCAL_RANK;
`init_from_env` then joins the process group (gloo on CPU, nccl when CUDA is present).

1. Data parallel (`--parallel data`): every rank holds the whole set wrapped in
   `DistributedDataParallel`; rank r trains on rows `[r*B/N, (r+1)*B/N)` of each global batch
   of B tokens, and DDP averages the gradients, so a step equals one process's step on the
   whole batch (the losses are token means). BatchTopK's budget (k per token on average) is
   shared by the whole global batch: its nonlinearity selects over all ranks' rows with
   `global_top` (step 2's selection, along the batch instead of the features; `rank_activation`).
2. Feature-sharded (`--parallel features`, EleutherAI sparsify's `distribute_modules`):
   every rank sees the whole batch and holds features `[r*S/N, (r+1)*S/N)` of every layer
   (columns of `W_enc`, `b_enc`, `threshold`, rows of `W_dec`); `b_dec` and `W_skip` are
   replicated. Each rank encodes and decodes its slice; the partial reconstructions are summed
   with an all-reduce (`reduce_sum`, whose backward is the identity because every rank then
   computes the same loss); sparsity terms are sums over features, so each rank's term on its
   slice has exactly the global term's gradient for its parameters. Gradient clipping uses the
   global norm, summed in float64 as one process sums it (`clip_grad_norm`).
   TopK / BatchTopK (and their auxiliary loss) select over the full feature axis: the nonlinearity
   asks `global_top` (nonlinearity.py step 8, `rank_activation`): each rank takes its local top-k candidates, the candidates' values and
   global indices are all-gathered (k per rank per token, or per layer for BatchTopK), every
   rank picks the same global top-k from them (ties broken by the lower global index), and
   keeps its own entries among them. The kept entries and their gradients are those of the
   one-process activation.
Timeouts and the end of a run: every collective waits at most `timeout_s` (`--dist-timeout`,
default `DEFAULT_TIMEOUT_S` = 600 s, instead of gloo's 30 minutes). Each rank records in the
process group's store where it is (`mark`: joined, step t) and, on joining, its host and process
id; a rank whose collective times out, or loses its connection to a rank (gloo: "Connection reset
by peer" when a rank is killed), records that too, waits up to `GRACE_S` (at most the timeout) for
the others to record theirs, and raises `StalledRankError` naming the ranks that did not (a rank
stopped, hung or dead never does), with where they were last seen. A silent rank on this host
whose process is gone is dead, not slow: no wait for it, so the line comes before torchrun, seeing
the dead child, stops the others; and that SIGTERM, when it comes first, raises the same error
naming the dead rank (`naming_dead_ranks`). A run ends together (`finish_together`): the other
ranks wait in the store, without a collective timeout, until rank 0 has saved and evaluated, then
all ranks pass one barrier and only then destroy the process group, so no rank tears down its gloo
connections while another still holds them. Destroying it must end it: `torch.distributed.nn`
binds the default group as its functions' default `group` when first imported, so imported after
`init_process_group` (transformer_lens imports it, and the CLI loads the model after joining) it
keeps the group alive past `destroy_process_group`; gloo's threads then run until interpreter
exit, where a rank can abort ("terminate called without an active exception", SIGABRT) after a
run that succeeded. This module imports it first, while no group exists.
3. Each rank creates, holds, checkpoints, saves and evaluates only its slice:
   `SparseCoder.init_weights(shard=...)` draws its slice of the one-process initialization without
   the rest, a checkpoint is one file per rank (checkpoint.py step 1; no rank gathers another's
   state) and reads back as any rank's slice of any number of ranks. At the end the CLI gathers the
   trained set to rank 0 one tensor at a time (`gathered_tensors`), which writes each as it comes
   (formats/native.py `save_native_streamed`), and every rank evaluates its slice as
   `FeatureShard` (metrics.py step 5: partial reconstructions and counts summed over ranks; the
   spliced model runs on every rank). `gather_set` gathers the whole set into one module on rank 0
   (what `train` returns by default); `shard_state` slices a full state for a rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  before any process group exists (docstring, step 2)
from torch import Tensor

from transcoders.errors import ConfigError, StalledRankError, UndeclaredFeatureAxisError
from transcoders.losses import aux_mse


@dataclass(frozen=True)
class Dist:
    """Where this process stands: `world == 1` and `mode == "none"` for a plain run."""

    rank: int = 0
    world: int = 1
    mode: str = "none"  # "none" | "data" | "features"

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def shards_features(self) -> bool:
        """Each rank holds a slice of every layer's features (step 2)."""
        return self.active and self.mode == "features"

    @property
    def shards_batch(self) -> bool:
        """Each rank holds a slice of every batch's tokens (step 1)."""
        return self.active and self.mode == "data"


DEFAULT_TIMEOUT_S = 600.0
"""How long a collective waits for the other ranks (`--dist-timeout`); gloo's own default is 30 min."""
GRACE_S = 10.0
"""After a timeout, how long a rank waits for the others to report theirs before naming the silent ones."""
_PROGRESS = "transcoders/progress/"
_PROCESS = "transcoders/process/"
_FINISHED = "transcoders/finished"
_SAID = "transcoders/said/"


def init_from_env(timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Join the process group torchrun describes (env RANK / WORLD_SIZE), every collective waiting at
    most `timeout_s`; False when not under torchrun."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return dist.is_initialized()
    if not timeout_s > 0:
        raise ConfigError(f"dist_timeout {timeout_s} is not a positive number of seconds; pass e.g. 600.")
    timeout = datetime.timedelta(seconds=timeout_s)
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl", timeout=timeout)
    else:
        dist.init_process_group("gloo", timeout=timeout)
    d = Dist(dist.get_rank(), dist.get_world_size(), "data")
    _store().set(f"{_PROCESS}{d.rank}", f"{socket.gethostname()} {os.getpid()}")
    mark(d, "joined")
    return True


def mark(d: Dist, where: str) -> None:
    """Record in the process group's store where this rank is (read when a collective times out)."""
    if d.active:
        _store().set(f"{_PROGRESS}{d.rank}", where)


def _store():
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


PEER_LOST = ("timed out", "timeout", "connection reset", "connection closed", "broken pipe")
"""How a collective says it lost a rank (lower case): gloo's and nccl's timeouts, and gloo's
messages for a peer whose process ended (killed: "Read error ...: Connection reset by peer")."""


def is_lost_rank(e: BaseException) -> bool:
    """A collective that gave up waiting for a rank, or lost its connection to one (`PEER_LOST`)."""
    text = str(e).lower()
    return isinstance(e, RuntimeError) and any(words in text for words in PEER_LOST)


def stalled_error(d: Dist, e: BaseException, timeout_s: float) -> StalledRankError:
    """The `StalledRankError` for collective error `e` (`is_lost_rank`): the ranks that did not report
    an error of their own within `GRACE_S` (those waiting on the same stalled rank do), with where
    they were last; a rank on this host whose process is gone is not waited for."""
    # gloo's first sentence, less the source location it starts with ("[.../pair.cc:537] Read error ...")
    lines = str(e).strip().splitlines() or [type(e).__name__]
    first = re.sub(r"^\[[^\]]*\]\s*", "", lines[0]).split(". ")[0][:160]
    try:
        here, who = _silent_ranks(d, timeout_s)
    except (RuntimeError, OSError) as lost:  # the store went with the rank that hosted it
        here, who = "?", f"unknown (the process group's store is gone too: {str(lost)[:80]})"
    if "time" in first.lower():  # "timed out", "timeout"
        how, hint = f"waited more than {timeout_s:g} s", " (raise --dist-timeout if a step is just slow)"
    else:
        how, hint = "lost its connection to a rank", ""
    return StalledRankError(
        f"rank {d.rank} {how} in a collective at {here} ({first}); "
        f"not answering: {who}; a rank stopped, hung or died{hint}."
    )


def _silent_ranks(d: Dist, timeout_s: float) -> tuple[str, str]:
    """Record that this rank's collective failed; return where it was and the ranks that do not
    record the same within `GRACE_S` (none wait for a rank whose process on this host is gone)."""
    store = _store()
    key = f"{_PROGRESS}{d.rank}"
    here = store.get(key).decode() if store.check([key]) else "?"
    store.set(key, f"timed out at {here}")
    deadline = time.monotonic() + min(GRACE_S, timeout_s)
    while True:
        seen = {r: _last_seen(store, r) for r in range(d.world)}
        silent = {r: w for r, w in seen.items() if not w.startswith("timed out")}
        gone = {r for r in silent if _process_gone(store, r)}
        if len(gone) == len(silent) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    who = ", ".join(
        f"rank {r} (last seen: {w}{'; its process is gone' if r in gone else ''})"
        for r, w in sorted(silent.items())
    )
    return here, who or "none"


def _process_gone(store, rank: int) -> bool:
    """Whether `rank` ran on this host as a process that has ended (as `init_from_env` recorded it;
    a killed child its parent has not reaped yet is a zombie, still there for `kill(pid, 0)`)."""
    key = f"{_PROCESS}{rank}"
    if not store.check([key]):
        return False
    host, pid = store.get(key).decode().rsplit(" ", 1)
    if host != socket.gethostname():
        return False
    if os.path.isdir("/proc/self"):  # Linux: absent, or a zombie ("Z") or dead ("X")
        try:
            return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] in ("Z", "X")
        except FileNotFoundError:
            return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return False


@contextlib.contextmanager
def naming_dead_ranks(d: Dist):
    """Within: a SIGTERM after a rank on this host died raises the `StalledRankError` naming it.

    torchrun, seeing a child killed, stops the others with SIGTERM, often before their next
    collective fails (a rank computing its batch, or loading the model); without this they end
    silently and only torchrun's report says what happened. Any other SIGTERM acts as before."""
    if not d.active or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stopped(signum, frame):
        error = dead_rank_error(d)
        if error is None:  # not torchrun stopping us for a dead rank: what SIGTERM did before
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
            signal.raise_signal(signal.SIGTERM)
            return
        raise error

    previous = signal.signal(signal.SIGTERM, stopped)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def dead_rank_error(d: Dist) -> StalledRankError | None:
    """For a SIGTERM on this rank: the `StalledRankError` naming the ranks on this host whose process
    is gone (torchrun stopping the others after one died), or None when none is."""
    try:
        store = _store()
        gone = [r for r in range(d.world) if r != d.rank and _process_gone(store, r)]
        seen = {r: _last_seen(store, r) for r in [d.rank, *gone]}
    except (RuntimeError, OSError):  # no store to ask: as if no rank had died
        return None
    if not gone:
        return None
    who = ", ".join(f"rank {r} (last seen: {seen[r]}; its process is gone)" for r in gone)
    return StalledRankError(
        f"rank {d.rank} was stopped (SIGTERM) at {seen[d.rank]} after a rank died: {who}."
    )


def _last_seen(store, rank: int) -> str:
    """Where `rank` last said it was (`mark`)."""
    key = f"{_PROGRESS}{rank}"
    return store.get(key).decode() if store.check([key]) else "not joined"


def main_says(d: Dist, key: str, said: str | None) -> str:
    """Rank 0's `said` (a string) on every rank: the others pass None and wait for it under `key` in
    the process group's store, not in a collective, so a rank waits no longer than rank 0 takes to
    answer. For what only rank 0 can find out, such as whether it holds the run folder's lock."""
    if not d.active:
        return said
    store = _store()
    if d.main:
        store.set(f"{_SAID}{key}", said)
        return said
    store.wait([f"{_SAID}{key}"])
    return store.get(f"{_SAID}{key}").decode()


def finish_together(d: Dist) -> None:
    """The end of a run: rank 0 says it is done (after saving, evaluating and writing the manifest);
    the others wait for it in the store, then all pass one barrier, so every rank destroys the
    process group together."""
    if not d.active:
        return
    store = _store()
    if d.main:
        store.set(_FINISHED, "1")
    else:
        store.wait([_FINISHED], datetime.timedelta(days=7))  # rank 0 evaluates: no collective timeout
    dist.barrier()


def current(parallel: str) -> Dist:
    """The `Dist` of this process for `--parallel data|features`."""
    if parallel not in ("data", "features"):
        raise ConfigError(f"parallel {parallel!r} is not 'data' or 'features'; pick one.")
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return Dist()
    return Dist(dist.get_rank(), dist.get_world_size(), parallel)


def check(d: Dist, batch_size: int, d_sae: int) -> None:
    """Refuse what the mode cannot do exactly, with a sentence saying what to change."""
    if d.mode == "data" and batch_size % d.world:
        raise ConfigError(
            f"batch_size {batch_size} does not split evenly over {d.world} ranks; pass a multiple of {d.world}."
        )
    if d.mode == "features" and d_sae % d.world:
        raise ConfigError(
            f"d_sae {d_sae} does not split evenly over {d.world} ranks; pass a multiple of {d.world}."
        )


# ------------------------------------------------------------------ feature axes of named tensors
CHECKPOINT_ONLY = {"last_fired": 1, "scale.in": None, "scale.out": None}
"""Checkpoint tensors that belong to no parameter (checkpoint.py step 1): `last_fired` [L, S], scales [L]."""


def feature_dim(name: str, dims: Mapping[str, int | None]) -> int | None:
    """The feature axis of a set's tensor, or of a checkpoint tensor named after one (`tc.<name>`, Adam's
    `opt.<name>.<moment>`), as the set declared it (`dims`: `SparseCoder.feature_dims()`); None:
    replicated. Adam's step counts and the scales have none, `last_fired` [L, S] has 1. A tensor whose
    axis nobody declared raises `UndeclaredFeatureAxisError`: copying it to every rank unsplit would
    silently train a different set."""
    if name in CHECKPOINT_ONLY:
        return CHECKPOINT_ONLY[name]
    base = name.removeprefix("tc.")
    if base.startswith("opt."):
        base, _, leaf = base[4:].rpartition(".")
        if leaf == "step":
            return None
    if base not in dims:
        raise UndeclaredFeatureAxisError(
            f"tensor {name!r} has no declared feature axis; declare it with declare_features(name=axis or "
            "None) where the set creates it, so sharding knows to split or copy it."
        )
    return dims[base]


def shard_state(tensors: dict[str, Tensor], dims: Mapping[str, int | None], d: Dist) -> dict[str, Tensor]:
    """Rank `d.rank`'s slice of a full state (every feature axis cut into `d.world` equal parts), the
    axes as the set declared them (`dims`: `SparseCoder.feature_dims()`)."""
    out = {}
    for name, t in tensors.items():
        dim = feature_dim(name, dims)
        out[name] = t if dim is None else t.chunk(d.world, dim)[d.rank].contiguous()
    return out


def gather_set(tc, full, d: Dist):
    """Rank 0: `full` (a set of the full width, on `tc`'s device) loaded with every rank's slice
    `tc`, gathered tensor by tensor (`gathered_tensors`); the other ranks: their own slice `tc`
    (they pass `full=None` and never hold the full set). A collective: every rank calls it."""
    target = full.state_dict() if d.main else {}
    for name, whole in gathered_tensors(tc, d):
        if d.main:
            target[name].copy_(whole)
    return full if d.main else tc


def full_shapes(tc, d: Dist) -> dict[str, tuple[int, ...]]:
    """Rank 0's shapes of the set whose slice `tc` is: every feature axis `d.world` times as long."""
    shapes, dims = {}, tc.feature_dims()
    for name, t in tc.state_dict().items():
        dim = feature_dim(name, dims)
        shape = list(t.shape)
        if dim is not None:
            shape[dim] *= d.world
        shapes[name] = tuple(shape)
    return shapes


def gathered_tensors(tc, d: Dist) -> Iterator[tuple[str, Tensor | None]]:
    """Every tensor of the set whose slices the ranks hold as `tc`, in name order, one at a time:
    rank 0 gets each whole (on the host), the other ranks `None`. A collective: every rank iterates
    it to the end. Rank 0 holds one whole tensor (and its parts) at a time, never the set."""
    dims = tc.feature_dims()
    for name, t in sorted(tc.state_dict().items()):  # the same order on every rank
        dim = feature_dim(name, dims)
        if dim is None:
            yield name, t.detach().cpu() if d.main else None
            continue
        t = t.detach().contiguous()
        parts = [torch.empty_like(t) for _ in range(d.world)] if d.main else None
        dist.gather(t, parts, dst=0)
        if d.main:
            whole = torch.cat([p.cpu() for p in parts], dim)
            del parts
            yield name, whole
        else:
            yield name, None


class FeatureShard:
    """Rank `d.rank`'s slice `tc` of a feature-sharded set, standing in for the whole set where
    metrics.py uses one. Every rank calls the same methods on the same inputs: activations are the
    rank's own features (TopK's k largest chosen over all ranks', `global_top`), and what the whole
    set gives (`forward`'s reconstruction, `decode_layer`) is the sum over ranks of the slices'
    decodes plus the replicated `b_dec` and skip; `sum_over_shards` sums counts (L0, features
    fired) over ranks. Everything else is the slice's (`d_sae` is this rank's feature count)."""

    def __init__(self, tc, d: Dist):
        if isinstance(tc, FeatureShard):  # its sums would be summed over the ranks again
            raise TypeError("FeatureShard takes a rank's slice, not another FeatureShard")
        self.tc, self.d = tc, d

    def __getattr__(self, name):
        return getattr(self.tc, name)

    def sum_over_shards(self, t: Tensor) -> Tensor:
        t = t.clone()
        dist.all_reduce(t)
        return t

    def activation(self, pre_acts: Tensor) -> Tensor:
        return rank_activation(self.tc, pre_acts, self.d)

    def activate_layer(self, pre_acts: Tensor, layer: int) -> Tensor:
        params = self.tc.nonlinearity.layer_params(self.tc, layer)  # threshold row; gated: its GateParams
        return self.tc.nonlinearity.spread(pre_acts, params, self.d)

    def decode_layer(self, acts: list[Tensor | None], layer: int) -> Tensor:
        b = self.tc.b_dec[layer]
        return self.sum_over_shards(self.tc.decode_layer(acts, layer) - b) + b

    def forward(self, x: Tensor):
        return sharded_forward(self.tc, x, self.d)

    __call__ = forward


def sharded_forward(tc, x: Tensor, d: Dist):
    """The whole set's `forward` from rank `d.rank`'s slice `tc` (base.py `rank_forward`)."""
    return tc.rank_forward(x, d)


def local_config(tcfg, d: Dist):
    """The TranscoderConfig of one rank's slice (d_sae / world features per layer)."""
    return dataclasses.replace(tcfg, d_sae=tcfg.d_sae // d.world) if d.mode == "features" else tcfg


# ------------------------------------------------------------------ collectives with gradients
class _ReduceSum(torch.autograd.Function):
    """Forward: sum over ranks. Backward: identity (the loss downstream is the same on every rank)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        y = x.clone()
        dist.all_reduce(y)
        return y

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad


def reduce_sum(x: Tensor) -> Tensor:
    """Sum of `x` over ranks, differentiable for a loss every rank computes alike (step 2)."""
    return _ReduceSum.apply(x)


def all_true(flags: Tensor, d: Dist) -> list[bool]:
    """For each entry of the 1-D boolean `flags`, True when it is True on every rank (so all ranks
    stop together): one host sync."""
    ok = flags.to(torch.int32)
    if d.active:
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return [bool(v) for v in ok.tolist()]


def any_over_ranks(mask: Tensor, d: Dist) -> Tensor:
    """Elementwise OR of a boolean mask over ranks."""
    if not d.active:
        return mask
    m = mask.to(torch.int32)
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    return m.bool()


def average_grads(params, d: Dist) -> None:
    """Average replicated parameters' gradients over ranks (they agree up to rounding; this makes them equal)."""
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad.div_(d.world)


NORM_CHUNK = 1 << 20
"""Gradient values `clip_grad_norm` squares in float64 at a time."""


def clip_grad_norm(sharded, replicated, max_norm: float, d: Dist) -> Tensor:
    """`torch.nn.utils.clip_grad_norm_` over the whole (unsharded) parameter set, its norm summed
    in float64; one process, data parallel and feature-sharded alike.

    Feature-sharded, the squared norms of the sharded gradients are summed over ranks and the
    replicated ones (equal on every rank) counted once; otherwise `sharded` and `replicated` are
    just this process's parameters. Not torch's own norm: on the CPU it sums float32 squares one
    after another, 7.8e-4 too small for one CLT `W_enc` of 8M values (d_sae 16384 on the bundled
    model), so one process clipped less than the ranks and the runs drifted apart (issue 30).
    """
    params = list(sharded) + list(replicated)
    device = next(p.device for p in params)  # NCCL reduces device tensors only
    acc = torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64

    def sq(ps):  # NORM_CHUNK values at a time: no float64 copy of a whole gradient
        total = torch.zeros((), dtype=acc, device=device)
        for p in ps:
            if p.grad is not None:
                for chunk in p.grad.reshape(-1).split(NORM_CHUNK):
                    total += chunk.to(acc).pow(2).sum()
        return total

    local = sq(sharded)
    if d.mode == "features" and d.active:
        dist.all_reduce(local)
    total = (local + sq(replicated)).sqrt()
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for p in params:
        if p.grad is not None:
            p.grad.mul_(coef.to(p.grad))
    return total


# ------------------------------------------------------------------ global top-k over sharded features
def global_top(values: Tensor, gidx: Tensor, k: int, d: Dist) -> tuple[Tensor, Tensor]:
    """Which of this rank's entries are among the `k` largest of the whole (sharded) last axis.

    `values` [..., m] are this rank's entries and `gidx` [..., m] (int64) their indices on the
    unsharded axis. Returns `(mask, top)`: `mask` [..., m] marks this rank's entries in the global
    top-k, `top` [..., k'] the global top-k values (k' = min(k, total), the same on every rank).
    Equal values are ordered by their global index, lower first, on every rank and globally, so
    ties give the same entries whatever the number of ranks; nothing here is differentiated.
    """
    values, gidx = values.detach(), gidx.detach()
    lv, li = _top_then_index(values, gidx, min(k, values.shape[-1]))
    lg = gidx.gather(-1, li)
    gv, gg = [torch.empty_like(lv) for _ in range(d.world)], [torch.empty_like(lg) for _ in range(d.world)]
    dist.all_gather(gv, lv.contiguous())
    dist.all_gather(gg, lg.contiguous())
    cv, cg = torch.cat(gv, -1), torch.cat(gg, -1)
    order = cg.argsort(-1)  # by global index, then (stable) by value, largest first
    cv, cg = cv.gather(-1, order), cg.gather(-1, order)
    order = cv.argsort(dim=-1, descending=True, stable=True)[..., : min(k, cv.shape[-1])]
    top, chosen = cv.gather(-1, order), cg.gather(-1, order).sort(-1).values
    pos = torch.searchsorted(chosen, lg.contiguous()).clamp(max=chosen.shape[-1] - 1)
    kept = chosen.gather(-1, pos) == lg
    mask = torch.zeros(values.shape, dtype=torch.bool, device=values.device).scatter(-1, li, kept)
    return mask, top


def _top_then_index(values: Tensor, gidx: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """`values.topk(k)`, with entries equal to the k-th value taken by lower `gidx` first."""
    lv, li = values.topk(k, dim=-1)
    if bool(
        ((values >= lv[..., -1:]).sum(-1) == k).all()
    ):  # no tie at the k-th value: topk's choice is the only one
        return lv, li
    order = gidx.argsort(dim=-1, stable=True)
    li = order.gather(-1, values.gather(-1, order).argsort(dim=-1, descending=True, stable=True)[..., :k])
    return values.gather(-1, li), li


def feature_index(shape, d: Dist, device) -> Tensor:
    """Global feature index of every entry of a [..., S_local] slice (rank r holds [r*S_l, (r+1)*S_l))."""
    s_local = shape[-1]
    return (torch.arange(s_local, device=device) + d.rank * s_local).expand(shape)


def rank_activation(tc, pre_acts: Tensor, d: Dist) -> Tensor:
    """`tc.activation` on a rank holding a slice of the features or of the batch: this rank's part of
    the whole run's activations, as its nonlinearity computes them over the ranks (TopK over sharded
    features, BatchTopK's budget over the global batch; nonlinearity.py step 8)."""
    return tc.nonlinearity.spread_train_call(tc, pre_acts, d)


def sharded_topk_aux_loss(
    tc, pre_acts: Tensor, residual: Tensor, dead: Tensor, k_aux: int, d: Dist
) -> Tensor:
    """`losses.topk_aux_loss` with features sharded: the dead features' global top-`k_aux`."""
    n_dead = dead.sum(-1).to(torch.int64)
    dist.all_reduce(n_dead)
    if not bool((n_dead > 0).any()):
        return pre_acts.new_zeros(())
    k = min(k_aux, int(n_dead.max()))
    masked = torch.where(dead.bool(), pre_acts, torch.full_like(pre_acts, -torch.inf))
    mask, _ = global_top(masked, feature_index(masked.shape, d, masked.device), k, d)
    aux_acts = torch.where(mask, masked.relu(), torch.zeros_like(masked))
    return aux_mse(reduce_sum(tc.decode(aux_acts) - tc.b_dec), residual)
