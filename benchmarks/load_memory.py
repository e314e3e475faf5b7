"""Peak memory of `load_transcoders` against the size of the set, per format and dtype.

One set of random weights (`--layers` x `--latents` x `--d-model`, a PLT with a skip connection:
ReLU for the formats that hold it, TopK for sparsify and JumpReLU without the skip for GemmaScope,
the ones they hold) is written in each format (`--formats`); then, per (format, dtype), a fresh process loads it and reports its peak resident set
(VmHWM) minus that of a process that loaded a tiny set of the same format (imports, torch),
next to the size of the loaded set. Peaks include the pages of memory-mapped files read
(safetensors), which the kernel can drop; a loader that holds one copy of the set is near 1x
plus the files, one that stacks every layer's tensors before building the set near 3x.

    python benchmarks/load_memory.py [--layers 4 --latents 32768 --d-model 512]

Writes benchmarks/results/load_memory.{json,md}.
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
FORMATS = {
    "native": "relu",
    "circuit-tracer": "relu",
    "sae-lens": "relu",
    "sparsify": "topk",
    "gemmascope": "jumprelu",
}
NO_SKIP = {"gemmascope"}
"""Formats whose files hold no skip connection."""
DTYPES = ("float32", "bfloat16")


def worker(folder: str, dtype: str) -> None:
    import torch

    from transcoders import load_transcoders

    tc = load_transcoders(folder, dtype=getattr(torch, dtype))
    size = sum(p.numel() * p.element_size() for p in tc.parameters())
    print(json.dumps({"peak_mb": peak_rss_mb(), "set_mb": size / 2**20}))


def peak_rss_mb() -> float:
    """This process's own high-water resident set (VmHWM: its memory since exec; ru_maxrss would also
    count the parent's, which Linux carries over the fork and exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_set(folder: Path, fmt: str, layers: int, latents: int, d_model: int) -> None:
    import torch

    from transcoders import TranscoderConfig, build_transcoders, save_transcoders

    cfg = TranscoderConfig(
        kind="plt", n_layers=layers, d_model=d_model, d_sae=latents, activation=FORMATS[fmt], k=32, skip=fmt not in NO_SKIP,
        folded_norms=False,
    )  # fmt: skip
    tc = build_transcoders(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in tc.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    save_transcoders(tc, folder, format=fmt)


def measure(folder: Path, dtype: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--_worker", str(folder), dtype],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--latents", type=int, default=32768)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    ap.add_argument("--_worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._worker:
        return worker(*args._worker)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in args.formats:
            big, tiny = Path(tmp) / f"{fmt}-big", Path(tmp) / f"{fmt}-tiny"
            write_set(big, fmt, args.layers, args.latents, args.d_model)
            write_set(tiny, fmt, args.layers, 64, args.d_model)
            for dtype in DTYPES:
                base, run = measure(tiny, dtype), measure(big, dtype)
                extra = run["peak_mb"] - base["peak_mb"]
                rows.append({"format": fmt, "dtype": dtype, "set_mb": run["set_mb"], "extra_peak_mb": extra})
                print(f"{fmt:15s} {dtype:9s} set {run['set_mb']:7.0f} MB  peak over baseline {extra:7.0f} MB  "
                      f"({extra / run['set_mb']:.2f}x)")  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    shape = {"layers": args.layers, "latents": args.latents, "d_model": args.d_model}
    if args.formats != list(FORMATS):
        return  # a partial run does not replace the results
    (RESULTS / "load_memory.json").write_text(json.dumps({"shape": shape, "rows": rows}, indent=1))
    lines = [
        f"# load_transcoders peak memory ({args.layers} layers x {args.latents} latents x d_model {args.d_model}, skip)",
        "",
        "| format | dtype | set (MB) | peak over baseline (MB) | ratio |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['format']} | {r['dtype']} | {r['set_mb']:.0f} | {r['extra_peak_mb']:.0f} | {r['extra_peak_mb'] / r['set_mb']:.2f}x |"
        for r in rows
    ]
    (RESULTS / "load_memory.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
