"""The viewer's server under load: 200 concurrent requests for the IOI graph and for /api/graphs.

1. Build the pruned IOI graph of the bundled model with `default-plt` (as benchmarks/viewer_panels.py
   does) into a temporary file.
2. Serve it with `attrgraph serve FILE --port 0` in its own process, from this tree and, with
   `--before COMMIT`, from that commit's `attrgraph/` and `transcoders/` (git archive into a temporary
   folder: a before/after on the same machine, the same minute); one warm-up request builds the
   payload (once per graph, server.py step 4), so the rounds time serving, not building.
3. Each round opens `--n` connections at once (asyncio, one process), each sends one GET with
   `Connection: close` and reads the whole reply; a request's latency runs from the round's start
   to its last byte. With `Accept-Encoding: gzip` (what a browser sends) and without.
4. p50 / p99 / max over all rounds' requests, per URL and encoding; the reply size.

Writes benchmarks/results/viewer_load.{json,md}. Usage:
    OMP_NUM_THREADS=1 python benchmarks/viewer_load.py --before b868f07   (about 1 min)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.viewer_panels import build  # noqa: E402

URLS = ("/api/graph?name=ioi", "/api/graphs")
PAGE = {"X-Attrgraph-Page": "1"}
"""The header the page's reads carry (access.py step 4); a server before it ignores it."""


async def fetch(port: int, url: str, gzip: bool, t0: float) -> tuple[float, int, int]:
    """(seconds from `t0` to the reply's last byte, status, body bytes) of one GET."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
    heads = {"Host": f"127.0.0.1:{port}", "Connection": "close", **PAGE}
    if gzip:
        heads["Accept-Encoding"] = "gzip"
    writer.write(
        (f"GET {url} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in heads.items()) + "\r\n").encode()
    )
    await writer.drain()
    data = await reader.read()
    elapsed = time.perf_counter() - t0
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return elapsed, int(head.split(b" ", 2)[1]), len(body)


async def one_round(port: int, url: str, n: int, gzip: bool) -> list[tuple[float, int, int]]:
    t0 = time.perf_counter()
    return await asyncio.gather(*(fetch(port, url, gzip, t0) for _ in range(n)))


def serve(path: Path, tree: Path) -> tuple[subprocess.Popen, int]:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "attrgraph.cli", "serve", str(path), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tree,
        env=env,
    )
    line = proc.stdout.readline()
    if "http://127.0.0.1:" not in line:
        proc.kill()
        raise RuntimeError(f"serve did not start: {line!r} {proc.stderr.read()[:500]}")
    return proc, int(line.split("http://127.0.0.1:")[1].split("/")[0])


def measure(port: int, n: int, rounds: int) -> list[dict]:
    rows = []
    for url in URLS:
        for gzip in (True, False):
            asyncio.run(one_round(port, url, 1, gzip))  # warm-up: the one build
            got = [r for _ in range(rounds) for r in asyncio.run(one_round(port, url, n, gzip))]
            lat = np.array([t for t, _, _ in got])
            statuses = sorted({s for _, s, _ in got})
            rows.append(
                dict(
                    url=url,
                    gzip=gzip,
                    n=n,
                    rounds=rounds,
                    statuses=statuses,
                    reply_bytes=int(np.median([b for _, _, b in got])),
                    p50_s=float(np.percentile(lat, 50)),
                    p99_s=float(np.percentile(lat, 99)),
                    max_s=float(lat.max()),
                )
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def size(n: int) -> str:
    return f"{n / 1e3:.0f} KB" if n >= 1000 else f"{n} B"


def table(rows: list[dict], tree: str) -> list[str]:
    lines = []
    for r in rows:
        lines.append(
            f"| {tree} | {r['url']} | {'gzip' if r['gzip'] else 'identity'} | {size(r['reply_bytes'])} "
            f"| {r['p50_s']:.2f} s | {r['p99_s']:.2f} s | {r['max_s']:.2f} s |"
        )
    return lines


def checkout(commit: str, into: Path) -> Path:
    """`commit`'s packages in `into` (the bundled data linked from this tree), for step 2."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "attrgraph", "transcoders"],
        capture_output=True,
        check=True,
    ).stdout
    into.mkdir()
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    (into / "data").symlink_to(ROOT / "data")
    return into


def run_tree(path: Path, tree: Path, n: int, rounds: int) -> list[dict]:
    proc, port = serve(path, tree)
    try:
        return measure(port, n, rounds)
    finally:
        proc.terminate()
        proc.wait(30)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=200, help="concurrent requests a round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--before", help="a commit whose server is measured too, first")
    p.add_argument("--graph", help="a file holding graph 'ioi' (default: built now)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "viewer_load"))
    args = p.parse_args(argv)
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    trees = {"this tree (" + (head.stdout.strip() or "?") + ")": ROOT}
    result: dict = dict(
        load_average_before=os.getloadavg()[0],
        cpus=os.cpu_count(),
        python=platform.python_version(),
        command=f"OMP_NUM_THREADS=1 python benchmarks/viewer_load.py --n {args.n} --rounds {args.rounds}"
        + (f" --before {args.before}" if args.before else ""),
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.graph) if args.graph else Path(tmp) / "ioi.h5"
        if not args.graph:
            build(path)
        if args.before:
            old = checkout(args.before, Path(tmp) / "before")
            result["before"] = dict(tree=args.before, rows=run_tree(path, old, args.n, args.rounds))
        name, tree = next(iter(trees.items()))
        result["after"] = dict(tree=name, rows=run_tree(path, tree, args.n, args.rounds))
    result["load_average_after"] = os.getloadavg()[0]
    Path(args.out).with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        f"# Viewer load: {args.n} concurrent requests x {args.rounds} rounds",
        "",
        f"`{result['command']}` ({result['cpus']} CPUs, shared with other work: load average "
        f"{result['load_average_before']:.1f} before, {result['load_average_after']:.1f} after).",
        "Latency from the round's start to each reply's last byte, all rounds' requests pooled.",
        "",
        "| server | request | encoding | reply | p50 | p99 | max |",
        "|---|---|---|---|---|---|---|",
        *(table(result["before"]["rows"], result["before"]["tree"]) if args.before else []),
        *table(result["after"]["rows"], result["after"]["tree"]),
    ]
    Path(args.out).with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
