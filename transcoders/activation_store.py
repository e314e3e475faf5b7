"""Activations for training: all layers from one forward pass, shuffled at the token level.

Seed: circuit-tracing appendix ("ML details": "We shuffle our training data at the token
level ... not shuffling leads to significantly worse performance"; "Engineering": collect
all layers in one pass, store activations to disk, stream them back).

1. `pack_sequences` turns any iterable of texts or token-id lists into training sequences of
   `n_ctx` tokens: BOS, then items joined by EOS (how the bundled model was trained).
2. Block b takes the next `ceil(block_tokens / (n_ctx - 1))` sequences (`n_ctx`: the source's
   sequence length, `sequence_width`, which may be below the model's context), runs the model once
   per model batch, and keeps every layer's read value `x` and write target `y` (sites.collect),
   dropping position 0 (BOS, a constant outlier) by default.
3. The block's tokens are fully shuffled with a generator seeded by (seed, b), then served in
   batches. Block b is a pure function of (source, seed, b): a resumed run rebuilds exactly the
   batches it would have seen (`batches(start=...)`).
   3b. Without `cache_dir`, a model on a GPU keeps the block there when it fits (`BLOCK_SHARE`), so a
   batch is a slice on the device and a step copies nothing from the host; else the host keeps it.
4. With `cache_dir`, block b is written to a shard the first time and read back after, so long or
   repeated runs stream activations from disk instead of re-running the model. A shard is named by
   what its activations come from: the folder `cache_dir/KEY` by the model's weights
   (fingerprint.py), its dtype, the hooks read and written, the seed (the shuffle), the block size
   and context, and the file `block_{b}_{TOKENS}.safetensors` by a hash of the block's token ids
   (`key.json` there says what KEY stands for). A run of another model, set kind, seed or corpus
   sharing the folder writes its own shards beside them; before, it read the first run's
   activations as its own.
   `batches` then reads each batch's rows from the memory-mapped shard (safetensors `get_slice`),
   so memory is one block while a shard is produced and one batch while it is read, whatever the
   number of tokens (benchmarks/activation_store_memory.py measures it).
5. Ranks (`rank`, `world`, with `cache_dir` on a filesystem every rank sees): rank r produces the
   blocks b with `b % world == r` (the model runs once per token over all ranks, in parallel),
   waits for the others' shards, and reads only its rows `[r*B/N, (r+1)*B/N)` of each global batch
   of B tokens: the data-parallel slice of the same global batches one process would see.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import torch
from jaxtyping import Float
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor

from transcoders.config import TranscoderConfig
from transcoders.errors import ConfigError, NonFiniteError
from transcoders.fingerprint import fingerprint
from transcoders.sites import collect, raw_output_needed


def cache_key(model, cfg: TranscoderConfig, seed: int, block_tokens: int, n_ctx: int, skip_bos: bool) -> dict:
    """What a block's activations come from besides its tokens (step 4): the model (its weights'
    fingerprint, dtype), the hooks each layer reads and writes, and the shuffle and block size."""
    return {
        "model": getattr(model.cfg, "model_name", type(model).__name__),
        "fingerprint": fingerprint(model),
        "dtype": str(model.cfg.dtype),
        "reads": [cfg.hook_in(l) for l in range(cfg.n_layers)],
        "writes": [cfg.hook_out(l) for l in range(cfg.n_layers)],
        "raw_output": [raw_output_needed(model, cfg, l) for l in range(cfg.n_layers)],
        "seed": seed,
        "block_tokens": block_tokens,
        "n_ctx": n_ctx,
        "skip_bos": skip_bos,
        "version": 1,
    }


def pack_sequences(
    items: Iterable[str | Sequence[int]],
    n_ctx: int,
    bos_id: int,
    eos_id: int,
    tokenize: Callable | None = None,
) -> Iterator[list[int]]:
    """Step 1: `[BOS, item, EOS, item, EOS, ...]` cut to `n_ctx` tokens; an item cut at the end is dropped."""
    seq = [bos_id]
    for item in items:
        if isinstance(item, str) and tokenize is None:
            raise TypeError("texts need a tokenize function; pass tokenize= or token ids")
        ids = list(tokenize(item)) if isinstance(item, str) else [int(i) for i in item]
        seq += ids + [eos_id]
        if len(seq) >= n_ctx:
            yield seq[:n_ctx]
            seq = [bos_id]


BLOCK_SHARE = 0.5
"""Step 3b: the share of a GPU's free memory that three blocks may take and stay on it."""


def sequence_width(
    sequences: Callable[[], Iterable[Sequence[int]]] | Tensor, n_ctx: int, skip_bos: bool = True
) -> int:
    """Tokens per sequence of a source (a tensor's width, or the first sequence's length), which may be
    shorter than the model's context `n_ctx` but not longer. Blocks are counted in these: a block sized
    by `n_ctx` from shorter sequences came out short, and its last batches empty."""
    if isinstance(sequences, Tensor):
        if sequences.ndim != 2:
            raise ConfigError(f"token sequences must be [n_seq, n_ctx], not {list(sequences.shape)}.")
        width = sequences.shape[1]
    else:
        first = next(iter(sequences()), None)
        if first is None:
            raise ConfigError(
                f"the corpus yields no sequence of {n_ctx} tokens (all of it together is shorter); pass a longer one."
            )
        width = len(first)
    if width > n_ctx:
        raise ConfigError(
            f"sequences of {width} tokens are longer than the model's context ({n_ctx} tokens); cut them."
        )
    if width <= int(skip_bos):
        raise ConfigError(
            f"sequences of {width} tokens leave no token after the BOS position; pass longer ones."
        )
    return width


class ActivationStore:
    """Token-level shuffled batches of `(x, y)`, each `[batch, n_layers, d_model]` (see module docstring)."""

    def __init__(
        self,
        model,
        cfg: TranscoderConfig,
        sequences: Callable[[], Iterable[Sequence[int]]] | Tensor,
        batch_size: int = 1024,
        block_tokens: int = 65536,
        seed: int = 0,
        skip_bos: bool = True,
        model_batch: int = 32,
        cache_dir: str | Path | None = None,
        rank: int = 0,
        world: int = 1,
        wait_s: float = 3600.0,
    ):
        self.model, self.cfg = model, cfg
        self.sequences = sequences
        self.batch_size = batch_size
        self.block_tokens = block_tokens - block_tokens % batch_size
        if self.block_tokens == 0:
            raise ValueError(f"block_tokens {block_tokens} is smaller than batch_size {batch_size}")
        self.seed, self.skip_bos, self.model_batch = seed, skip_bos, model_batch
        self.n_ctx = sequence_width(sequences, model.cfg.n_ctx, skip_bos)
        self.seqs_per_block = math.ceil(self.block_tokens / (self.n_ctx - int(skip_bos)))
        self.cache_dir = Path(cache_dir) if cache_dir else None
        if world > 1 and (self.cache_dir is None or batch_size % world):
            raise ValueError(f"ranks share a store through cache_dir, with batch_size a multiple of {world}")
        self.rank, self.world, self.wait_s = rank, world, wait_s
        self._source: Iterator | None = None
        self._next_seq = 0
        self._tokens: dict[int, Tensor] = {}  # the blocks' token ids last taken (step 4's names)
        self._names: dict[int, Path] = {}
        if self.cache_dir is not None:
            self._key = cache_key(model, cfg, seed, self.block_tokens, self.n_ctx, skip_bos)
            self._folder = self.cache_dir / hashlib.sha256(json.dumps(self._key).encode()).hexdigest()[:16]
        self._last: tuple[int, Tensor, Tensor] | None = None  # the most recent block, reused once

    @property
    def batches_per_block(self) -> int:
        return self.block_tokens // self.batch_size

    # ------------------------------------------------------------------ sequences
    def _take(self, start: int, n: int) -> Tensor:
        """Sequences start..start+n of the source, as a LongTensor [n, n_ctx]."""
        if isinstance(self.sequences, Tensor):
            out = self.sequences[start : start + n]
        else:
            if self._source is None or self._next_seq > start:
                self._source, self._next_seq = iter(self.sequences()), 0
            while self._next_seq < start:  # skip (resume): cheap, no model run
                next(self._source)
                self._next_seq += 1
            rows = []
            for _ in range(n):
                try:
                    rows.append(list(next(self._source)))
                except StopIteration:
                    break
                if len(rows[-1]) != self.n_ctx:
                    raise ValueError(
                        f"sequence {self._next_seq} of the token source has {len(rows[-1])} tokens and the first "
                        f"has {self.n_ctx}: a source yields sequences of one length"
                    )
                self._next_seq += 1
            out = (
                torch.tensor(rows, dtype=torch.long) if rows else torch.zeros(0, self.n_ctx, dtype=torch.long)
            )
        if out.shape[0] < n:
            raise ValueError(
                f"the token source ran out after {start + out.shape[0]} sequences; pass a longer corpus"
            )
        return out

    # ------------------------------------------------------------------ blocks
    @torch.no_grad()
    def block(
        self, b: int
    ) -> tuple[Float[Tensor, "tokens n_layers d_model"], Float[Tensor, "tokens n_layers d_model"]]:
        """Steps 2-4: block b's shuffled `(x, y)`."""
        if self._last is not None and self._last[0] == b:
            return self._last[1], self._last[2]
        if self.world > 1:
            self._ensure(b)  # another rank may be the one that produces it
        x, y = self._build_block(b)
        self._last = (b, x, y)
        return x, y

    @property
    def sliced(self) -> bool:
        """True when `batches` yields this rank's rows only (step 5)."""
        return self.world > 1

    def _block_device(self, x: Tensor) -> torch.device:
        """Step 3b: a GPU model's block stays on its GPU (its batches are then slices there, with no copy
        per step) while `BLOCK_SHARE` of the free memory holds three blocks (the one in use, the next,
        and the next's parts while they are joined); otherwise, and on other devices, the host."""
        if x.device.type != "cuda":
            return torch.device("cpu")
        free, _ = torch.cuda.mem_get_info(x.device)
        free += torch.cuda.memory_reserved(x.device) - torch.cuda.memory_allocated(x.device)
        block = 2 * self.block_tokens * x.shape[-2] * x.shape[-1] * 4  # x and y, float32
        return x.device if 3 * block <= BLOCK_SHARE * free else torch.device("cpu")

    def shard(self, b: int) -> Path:
        """Block b's shard (step 4): in the folder of the store's key, named by its tokens' hash."""
        if b not in self._names:
            digest = hashlib.sha256(self._block_tokens(b).numpy().tobytes()).hexdigest()[:16]
            self._names[b] = self._folder / f"block_{b:05d}_{digest}.safetensors"
        return self._names[b]

    def _block_tokens(self, b: int) -> Tensor:
        """Block b's token ids, kept for the blocks around it (a rank names the others' blocks too), so
        that an iterator source is read once, in order."""
        if b not in self._tokens:
            self._tokens[b] = self._take(b * self.seqs_per_block, self.seqs_per_block)
            while len(self._tokens) > self.world + 1:
                self._tokens.pop(next(iter(self._tokens)))
        return self._tokens[b]

    def _ensure(self, b: int) -> Path:
        """Steps 4-5: block b's shard exists (this rank produces its own blocks up to b + world - 1)."""
        for c in range(b, b + self.world):  # named in order: the source is read once
            self.shard(c)
        for c in range(b, b + self.world):
            if c % self.world == self.rank and not self.shard(c).exists():
                self._build_block(c)
        shard, waited = self.shard(b), 0.0
        while not shard.exists():
            if waited > self.wait_s:
                raise TimeoutError(
                    f"rank {self.rank} waited {waited:.0f} s for {shard}; is rank {b % self.world} alive?"
                )
            time.sleep(0.05)
            waited += 0.05
        return shard

    def _build_block(self, b: int) -> tuple[Tensor, Tensor]:
        shard = self.shard(b) if self.cache_dir else None
        if shard is not None and shard.exists():
            d = load_file(str(shard))
            return d["x"], d["y"]
        tokens = self._block_tokens(b)
        xs, ys = [], []
        start = int(self.skip_bos)
        keep = None  # where the block is kept: step 3b
        for chunk in tokens.split(self.model_batch):
            x, y = collect(self.model, chunk.to(self.model.cfg.device), self.cfg)
            if keep is None:
                keep = torch.device("cpu") if shard is not None else self._block_device(x)
            xs.append(x[:, start:].reshape(-1, *x.shape[-2:]).float().to(keep))
            ys.append(y[:, start:].reshape(-1, *y.shape[-2:]).float().to(keep))
        x, y = torch.cat(xs)[: self.block_tokens], torch.cat(ys)[: self.block_tokens]
        if not (torch.isfinite(x).all() and torch.isfinite(y).all()):
            raise NonFiniteError(
                f"the model produced NaN or inf activations in block {b}; check the model and corpus."
            )
        perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(self.seed * 1_000_003 + b))
        perm = perm.to(x.device)  # drawn on the host: the same order wherever the block is kept
        x, y = x[perm].contiguous(), y[perm].contiguous()
        if shard is not None:
            shard.parent.mkdir(parents=True, exist_ok=True)
            key = shard.parent / "key.json"
            if not key.exists():  # what the folder's name stands for, for whoever finds it
                key.write_text(json.dumps(self._key, indent=1) + "\n")
            tmp = shard.with_suffix(f".tmp{self.rank}")
            save_file({"x": x, "y": y}, str(tmp))
            tmp.rename(shard)
        return x, y

    def batches(self, start: int = 0) -> Iterator[tuple[Tensor, Tensor]]:
        """Batches start, start+1, ... (endless; the caller stops); with ranks, this rank's rows of each."""
        b, i = divmod(start, self.batches_per_block)
        if self.cache_dir is not None:  # steps 4-5: stream rows from the memory-mapped shards
            self._last = None  # a block read whole (e.g. for the scales) is not needed any more
            n = self.batch_size // self.world
            while True:
                with safe_open(str(self._ensure(b)), framework="pt") as f:
                    xs, ys = f.get_slice("x"), f.get_slice("y")
                    for j in range(i, self.batches_per_block):
                        lo = j * self.batch_size + self.rank * n
                        yield xs[lo : lo + n], ys[lo : lo + n]
                b, i = b + 1, 0
        while True:
            x, y = self.block(b)
            for j in range(i, self.batches_per_block):
                sl = slice(j * self.batch_size, (j + 1) * self.batch_size)
                yield x[sl], y[sl]
            b, i = b + 1, 0

    def __iter__(self):
        return self.batches(0)
