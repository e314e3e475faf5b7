"""Peak memory of the activation store against the number of tokens (bundled model, PLT sites).

For each token count, a fresh process builds an `ActivationStore` with a `cache_dir`, produces
the safetensors shards and reads every batch back (summing it, so every byte is touched), and
reports its peak resident set (ru_maxrss) minus the resident set after loading the model.
Flat growth with tokens is the claim; the shards on disk grow linearly (bytes per token printed).

    python benchmarks/activation_store_memory.py [--tokens 16384 65536 262144]

`--stream N` runs one process end to end over N tokens (e.g. 10M) and records the peak RSS so far
and the wall time at every `--every` tokens, so one run gives the whole curve. Each shard is
deleted once its last batch is read (`--delete-read`, on by default with --stream), because the
full store of 10M tokens (float32 x and y, 4 layers x 128, 4 KB per token) is 41 GB: the shards
are still produced from the model block by block, written to disk and read back shuffled through
memory maps, but at most one or two are on disk at a time.

    nice python benchmarks/activation_store_memory.py --stream 10000000 --every 1048576

Writes benchmarks/results/activation_store_memory.{json,md} (--stream:
activation_store_memory_10m.{json,md}, rewritten at every point, so a cut run keeps its curve).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one(n_tokens: int, block_tokens: int, batch_size: int, every: int = 0, delete_read: bool = False) -> dict:
    import torch

    from transcoders.activation_store import ActivationStore
    from transcoders.train import TrainConfig, load_any_model, sequence_source, transcoder_config

    torch.set_num_threads(1)
    model = load_any_model("default")
    tcfg = transcoder_config(TrainConfig(), model)
    base = rss_mb()
    t0 = time.time()
    written = 0
    max_on_disk = 0
    with tempfile.TemporaryDirectory() as cache:
        store = ActivationStore(
            model, tcfg, sequence_source(model, "bundled", 0), batch_size, block_tokens, 0, cache_dir=cache
        )
        per_block = store.batches_per_block
        total = 0.0
        n_batches = n_tokens // batch_size
        for i, (x, y) in enumerate(itertools.islice(store.batches(0), n_batches)):
            total += float(x.sum() + y.sum())
            done = (i + 1) * batch_size
            if delete_read and (i + 1) % per_block == 0:  # block read to its end: drop its shard
                shards = list(Path(cache).rglob("*.safetensors"))  # in the store's key folder
                on_disk = sum(p.stat().st_size for p in shards)
                max_on_disk = max(max_on_disk, on_disk)
                shard = store.shard(i // per_block)
                written += shard.stat().st_size
                shard.unlink()
            if every and (done % every == 0 or i + 1 == n_batches):
                point = {
                    "tokens": done,
                    "peak_rss_mb": round(rss_mb(), 1),
                    "peak_above_model_mb": round(rss_mb() - base, 1),
                    "wall_s": round(time.time() - t0, 1),
                    "load": [round(v, 2) for v in os.getloadavg()],
                }
                print(json.dumps({"point": point}), flush=True)
        shards = list(Path(cache).rglob("*.safetensors"))
        disk = sum(p.stat().st_size for p in shards)
        written += disk
        max_on_disk = max(max_on_disk, disk)
    return {
        "n_tokens": n_tokens,
        "block_tokens": block_tokens,
        "batch_size": batch_size,
        "rss_after_model_mb": round(base, 1),
        "peak_rss_mb": round(rss_mb(), 1),
        "peak_above_model_mb": round(rss_mb() - base, 1),
        "disk_mb": round(written / 2**20, 1),
        "max_disk_at_once_mb": round(max_on_disk / 2**20, 1),
        "disk_bytes_per_token": round(written / n_tokens),
        "delete_read": delete_read,
        "wall_s": round(time.time() - t0, 1),
        "load_end": [round(v, 2) for v in os.getloadavg()],
    }


def stream(a) -> None:
    """One process over `a.stream` tokens; rewrite the _10m results at every point."""
    cmd = [sys.executable, __file__, "--one", str(a.stream), "--block-tokens", str(a.block_tokens)]
    cmd += ["--batch-size", str(a.batch_size), "--every", str(a.every), "--delete-read"]
    load0 = [round(v, 2) for v in os.getloadavg()]
    points, final = [], None
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as p:
        for line in p.stdout:
            row = json.loads(line)
            if "point" in row:
                points.append(row["point"])
            else:
                final = row
            print(line.strip(), flush=True)
            write_stream(a, points, final, load0)
    if p.returncode:
        sys.exit(p.returncode)


def write_stream(a, points: list[dict], final: dict | None, load0: list[float]) -> None:
    RESULTS.mkdir(exist_ok=True)
    doc = {
        "n_tokens": a.stream,
        "block_tokens": a.block_tokens,
        "batch_size": a.batch_size,
        "stored": "float32 x (MLP inputs) and y (MLP outputs) of all 4 layers (d_model 128): 4096 bytes per token",
        "delete_read": True,
        "load_start": load0,
        "points": points,
        "final": final,
    }
    (RESULTS / "activation_store_memory_10m.json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = [
        "| tokens | peak RSS (MB) | above model (MB) | wall (s) | load (1/5/15 min) |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['tokens']:,} | {r['peak_rss_mb']} | {r['peak_above_model_mb']} | {r['wall_s']} | "
        + " / ".join(str(v) for v in r["load"])
        + " |"
        for r in points
    ]
    status = (
        f"Finished: {final['n_tokens']:,} tokens, peak RSS {final['peak_rss_mb']} MB "
        f"({final['peak_above_model_mb']} MB above the model), {final['wall_s']} s; "
        f"{final['disk_mb']:,} MB of shards written in all, at most {final['max_disk_at_once_mb']} MB on disk at once."
        if final
        else f"Running or cut: {points[-1]['tokens'] if points else 0:,} of {a.stream:,} tokens so far."
    )
    (RESULTS / "activation_store_memory_10m.md").write_text(
        f"One process, bundled model, PLT sites, block_tokens {a.block_tokens}, batch_size {a.batch_size}, "
        "one thread, nice. Stored: float32 x (MLP inputs) and y (MLP outputs) of all 4 layers (d_model 128), "
        "4096 bytes per token, in safetensors shards of one block each, read back shuffled through memory maps; "
        "each shard deleted once read (the whole store would be 41 GB for 10M tokens).\n\n"
        + status
        + "\n\n"
        + "\n".join(lines)
        + "\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[16384, 65536, 262144])
    ap.add_argument("--block-tokens", type=int, default=16384)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--stream", type=int, help="one end-to-end run over this many tokens (see docstring)")
    ap.add_argument("--every", type=int, default=1 << 20, help="--stream: tokens between recorded points")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--delete-read", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        every = a.every if a.delete_read else 0
        print(json.dumps(one(a.one, a.block_tokens, a.batch_size, every, a.delete_read)))
        return
    if a.stream:
        stream(a)
        return
    rows = []
    for n in a.tokens:
        cmd = [sys.executable, __file__, "--one", str(n), "--block-tokens", str(a.block_tokens)]
        cmd += ["--batch-size", str(a.batch_size)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "activation_store_memory.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = [
        "| tokens | peak RSS (MB) | above model (MB) | shards on disk (MB) | wall (s) |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['n_tokens']:,} | {r['peak_rss_mb']} | {r['peak_above_model_mb']} | {r['disk_mb']} | {r['wall_s']} |"
        for r in rows
    ]
    (RESULTS / "activation_store_memory.md").write_text(
        f"block_tokens {a.block_tokens}, batch_size {a.batch_size}, bundled model, PLT sites\n\n"
        + "\n".join(lines)
        + "\n"
    )


if __name__ == "__main__":
    main()
