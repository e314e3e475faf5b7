"""Peak memory of the activation store against the number of tokens (bundled model, PLT sites).

For each token count, a fresh process builds an `ActivationStore` with a `cache_dir`, produces
the safetensors shards and reads every batch back (summing it, so every byte is touched), and
reports its peak resident set (ru_maxrss) minus the resident set after loading the model.
Flat growth with tokens is the claim; the shards on disk grow linearly (bytes per token printed).

    python benchmarks/activation_store_memory.py [--tokens 32768 131072 524288]

Writes benchmarks/results/activation_store_memory.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one(n_tokens: int, block_tokens: int, batch_size: int) -> dict:
    import time

    import torch

    from transcoders.activation_store import ActivationStore
    from transcoders.train import TrainConfig, load_any_model, sequence_source, transcoder_config

    torch.set_num_threads(1)
    model = load_any_model("default")
    tcfg = transcoder_config(TrainConfig(), model)
    base = rss_mb()
    t0 = time.time()
    with tempfile.TemporaryDirectory() as cache:
        store = ActivationStore(
            model, tcfg, sequence_source(model, "bundled", 0), batch_size, block_tokens, 0, cache_dir=cache
        )
        total = 0.0
        for i, (x, y) in enumerate(store.batches(0)):
            if i == n_tokens // batch_size:
                break
            total += float(x.sum() + y.sum())
        disk = sum(p.stat().st_size for p in Path(cache).iterdir())
    return {
        "n_tokens": n_tokens,
        "block_tokens": block_tokens,
        "batch_size": batch_size,
        "rss_after_model_mb": round(base, 1),
        "peak_rss_mb": round(rss_mb(), 1),
        "peak_above_model_mb": round(rss_mb() - base, 1),
        "disk_mb": round(disk / 2**20, 1),
        "disk_bytes_per_token": round(disk / n_tokens),
        "wall_s": round(time.time() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[32768, 131072, 524288])
    ap.add_argument("--block-tokens", type=int, default=16384)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.block_tokens, a.batch_size)))
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
