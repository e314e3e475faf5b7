"""Byte-flip fuzzing of a stored graph file: flip one byte at many offsets and load each copy.

The file is read as its name says: `.pt` by `load_pt` (circuit-tracer's `to_pt` files), `.json` /
`.json.gz` by `load_json` (graph JSON), anything else by `load_graph` (our HDF5 files).

1. Offsets: every `--every`th byte of the file (default 40), or `--sample N` offsets drawn with
   `--seed`. The byte at each offset is XORed with 0xFF in a fresh copy of the file.
2. Each copy is read by that reader in a worker process, so that a crash in the HDF5 library
   cannot take the harness down; a load that gives no answer within `--timeout` seconds is a hang
   (the worker is killed and a new one goes on with the next offset).
3. Each load ends as one of:
   same     the graph of the unflipped file, every array, string and meta entry equal;
   ours     `GraphFileError` (or a subclass): the package's own error;
   changed  a graph that differs from the unflipped one, without an error;
   foreign  any other exception;
   crash    the worker died (a signal, or an exit without answering);
   hang     no answer within the timeout.
   Only `same` and `ours` are acceptable.

Run: `python -m benchmarks.byte_flips FILE [--every 40] [--sample N --seed 0] [--timeout 20]`;
prints the counts and the offsets of every unacceptable outcome; `--json OUT` writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

OUTCOMES = ("same", "ours", "changed", "foreign", "crash", "hang")


def graphs_equal(a, b) -> bool:
    """Every array bit for bit (NaN included), every string and the meta."""
    from dataclasses import fields

    from attrgraph.graph.graph import Nodes

    def same(x, y):
        x, y = x.__array__(), y.__array__()
        return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()

    adj_a, adj_b = a.adjacency, b.adjacency
    return (
        all(same(getattr(a.nodes, f.name), getattr(b.nodes, f.name)) for f in fields(Nodes))
        and adj_a.shape == adj_b.shape
        and all(same(getattr(adj_a, k), getattr(adj_b, k)) for k in ("data", "indices", "indptr"))
        and all(same(getattr(a, k), getattr(b, k)) for k in ("prompt_ids", "logit_tokens", "logit_probs"))
        and a.prompt_tokens == b.prompt_tokens
        and a.logit_strings == b.logit_strings
        and a.meta == b.meta
    )


def reader(path: str | os.PathLike):
    """The function that reads a graph file of this name (module docstring)."""
    name = Path(path).name
    if name.endswith(".pt"):
        from attrgraph.graph.circuit_tracer_pt import load_pt

        return load_pt
    if name.endswith((".json", ".json.gz")):
        from attrgraph.graph.neuronpedia import load_json

        return load_json
    from attrgraph.graph.store import load_graph

    return load_graph


def _worker(reference: str, workdir: str) -> None:
    """Read offsets (one per line) from stdin; for each, load a flipped copy and print one JSON line."""
    import warnings

    from attrgraph.errors import GraphFileError

    warnings.simplefilter("ignore")  # a .pt without a tokenizer warns once per load
    load_graph = reader(reference)
    suffix = "".join(Path(reference).suffixes[-2:]) if reference.endswith(".gz") else Path(reference).suffix
    ref_bytes = Path(reference).read_bytes()
    ref = load_graph(reference)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        offset = int(line)
        data = bytearray(ref_bytes)
        data[offset] ^= 0xFF
        path = Path(workdir) / f"flip_{offset}{suffix}"
        path.write_bytes(bytes(data))
        try:
            outcome = "same" if graphs_equal(load_graph(path), ref) else "changed"
            detail = ""
        except GraphFileError as e:
            outcome, detail = "ours", f"{type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001 - the point is to see which
            outcome, detail = "foreign", f"{type(e).__name__}: {str(e)[:300]}"
        path.unlink()
        print(json.dumps({"offset": offset, "outcome": outcome, "detail": detail}), flush=True)


def fuzz(path: str | os.PathLike, offsets: list[int], timeout: float = 20.0) -> list[dict]:
    """One result `{"offset", "outcome", "detail", "seconds"}` per offset (module docstring)."""
    path = Path(path).resolve()
    todo = list(offsets)
    results: list[dict] = []
    env = dict(os.environ)
    root = Path(__file__).resolve().parent.parent
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory() as workdir:
        while todo:
            proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.byte_flips", "--worker", str(path), workdir],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env=env,
                cwd=root,
            )
            assert json.loads(proc.stdout.readline()).get("ready"), "the worker could not load the reference"
            while todo:
                offset = todo[0]
                t0 = time.perf_counter()
                proc.stdin.write(f"{offset}\n")
                proc.stdin.flush()
                ready, _, _ = select.select([proc.stdout], [], [], timeout)
                line = proc.stdout.readline() if ready else ""
                seconds = round(time.perf_counter() - t0, 3)
                todo.pop(0)
                if line:
                    results.append(dict(json.loads(line), seconds=seconds))
                    continue
                if ready:  # end of file: the worker died
                    rc = proc.wait()
                    results.append(
                        dict(offset=offset, outcome="crash", detail=f"exit status {rc}", seconds=seconds)
                    )
                else:
                    proc.kill()
                    proc.wait()
                    results.append(
                        dict(offset=offset, outcome="hang", detail=f"> {timeout} s", seconds=seconds)
                    )
                break
            else:
                proc.stdin.close()
                proc.wait()
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("file", nargs="?")
    p.add_argument("--every", type=int, default=40, help="flip every N-th byte (default 40)")
    p.add_argument("--sample", type=int, default=None, help="instead, this many seeded random offsets")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=20.0, help="seconds before a load counts as a hang")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        _worker(*args.worker)
        return 0
    size = Path(args.file).stat().st_size
    if args.sample:
        import numpy as np

        offsets = sorted(np.random.default_rng(args.seed).choice(size, args.sample, replace=False).tolist())
    else:
        offsets = list(range(0, size, args.every))
    t0 = time.perf_counter()
    results = fuzz(args.file, offsets, args.timeout)
    counts = Counter(r["outcome"] for r in results)
    print(f"{args.file}: {size} bytes, {len(results)} flips in {time.perf_counter() - t0:.1f} s")
    print(", ".join(f"{k} {counts.get(k, 0)}" for k in OUTCOMES))
    print(f"slowest load: {max(r['seconds'] for r in results):.2f} s")
    for r in results:
        if r["outcome"] not in ("same", "ours"):
            print(f"  offset {r['offset']}: {r['outcome']} {r['detail']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"file": str(args.file), "size": size, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
