"""Our side of `peer_compare.py` at two revisions on the same circuit-tracer cases: has the CPU engine's
speed moved since REV?

1. `git worktree add --detach` of `--base REV` in a temporary folder (removed at the end).
2. Each case (`--case LABEL=DIR`) reuses DIR, a harness folder of `peer_compare.py`'s case LABEL
   (weights, prompt and circuit-tracer's graph: `ct_graph.py --out DIR` in `../shared/peer/` with
   that case's arguments, or a folder a peer_compare run left in its `peer_compare_*` temp folder).
3. Each run is one fresh process of peer_compare's own worker per side (`worker_command`: the same
   call, the same timing, the same check against circuit-tracer's adjacency), the library taken from
   the tree by `PYTHONPATH`. Where this process may use 2 x `--threads` cores, the two sides run at
   once, each pinned to its own cores, and swap cores every run: on a shared or throttled machine
   both then meet the same slow spells (on this 2-core machine, one after the other, two revisions
   measured 5% and 12% apart in the base's favour; side by side, this tree over the base, 0.963
   and 1.002: benchmarks/results/cpu_2026-11-28/README.md). With fewer cores they alternate, base
   first (`"side_by_side": false` in the JSON).
4. Per case, over `--runs` runs: the median and the fastest of each side, this tree's
   median over the base's and the median of the runs' own ratios,
   and whether both still equal circuit-tracer's graph; `OUT.{md,json}` (default
   `benchmarks/results/peer_ab`).

Usage: python benchmarks/peer_ab.py --base REV --case 6/256/4096=DIR [--case LABEL=DIR ...]
[--threads 1] [--runs 10]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_compare import ROOT, worker_command, worker_result  # noqa: E402


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def start(tree: Path, folder: str, threads: int, batch_size: int, cores: list[int] | None):
    """One worker of ours with the library of `tree`, pinned to `cores` (None: not pinned)."""
    cmd = worker_command("peer", folder, threads, batch_size)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(tree))
    pin = None if cores is None else (lambda: os.sched_setaffinity(0, cores))
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=pin
    )
    return cmd, proc


def finish(started, tree: Path) -> dict:
    """The worker's record, once it says it ran the library of `tree` (not one installed elsewhere)."""
    cmd, proc = started
    out, err = proc.communicate()
    record = worker_result(cmd, proc.returncode, out, err)
    if Path(record["library"]) != tree.resolve():
        raise RuntimeError(f"the worker for {tree} imported attrgraph from {record['library']}")
    return record


def one_run(trees: dict[str, Path], folder: str, threads: int, batch_size: int, i: int, cores) -> dict:
    """Run `i` of both sides: at once on two halves of `cores` (swapped on odd runs), else in turn."""
    if cores is None:
        return {name: finish(start(t, folder, threads, batch_size, None), t) for name, t in trees.items()}
    halves = [cores[:threads], cores[threads : 2 * threads]]
    if i % 2:
        halves.reverse()
    started = {name: start(t, folder, threads, batch_size, h) for (name, t), h in zip(trees.items(), halves)}
    return {name: finish(s, trees[name]) for name, s in started.items()}


def side(runs: list[dict]) -> dict:
    t = [r["seconds"] for r in runs]
    return dict(
        median=float(np.median(t)),
        fastest=min(t),
        seconds=t,
        match=all(r["match"] for r in runs),
        max_rel_diff=max(r["max_rel_diff"] for r in runs),
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="the revision to compare with (a commit, tag or branch)")
    ap.add_argument(
        "--case",
        action="append",
        required=True,
        metavar="LABEL=DIR",
        help="a peer_compare case and its harness folder (repeat for more cases)",
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads of our worker")
    ap.add_argument("--batch-size", type=int, default=512, help="targets per backward")
    ap.add_argument("--runs", type=int, default=10, help="fresh processes per side")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "peer_ab"))
    args = ap.parse_args(argv)
    cases = []
    for c in args.case:
        label, sep, folder = c.partition("=")
        if not sep or not (Path(folder) / "meta.json").is_file():
            ap.error(f"--case {c!r}: pass LABEL=DIR, DIR a harness folder with its meta.json.")
        cases.append((label, folder))
    try:
        base = git("rev-parse", "--verify", f"{args.base}^{{commit}}")
    except subprocess.CalledProcessError:
        ap.error(f"--base {args.base!r} is no commit of this repository.")
    head = git("rev-parse", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", "attrgraph", "transcoders"))
    rows = []
    with tempfile.TemporaryDirectory(prefix="peer_ab_") as tmp:
        tree = Path(tmp) / "base"
        git("worktree", "add", "--detach", str(tree), base)
        trees = {"base": tree, "this": ROOT}
        usable = sorted(os.sched_getaffinity(0))
        cores = usable if len(usable) >= 2 * args.threads else None
        try:
            for label, folder in cases:
                runs: dict[str, list] = {"base": [], "this": []}
                for i in range(args.runs):
                    pair = one_run(trees, folder, args.threads, args.batch_size, i, cores)
                    for name in runs:
                        runs[name].append(pair[name])
                    print(
                        f"{label} run {i + 1}: base {pair['base']['seconds']:.3f} s, this {pair['this']['seconds']:.3f} s",
                        flush=True,
                    )
                b, t = side(runs["base"]), side(runs["this"])
                per_run = [x / y for x, y in zip(t["seconds"], b["seconds"])]
                rows.append(
                    dict(
                        case=label,
                        folder=folder,
                        base=b,
                        this=t,
                        ratio=t["median"] / b["median"],
                        ratio_of_runs=float(np.median(per_run)),
                        ratios=per_run,
                    )
                )
        finally:
            git("worktree", "remove", "--force", str(tree))
    meta = dict(
        base=base,
        this=head + (" + uncommitted changes" if dirty else ""),
        threads=args.threads,
        batch_size=args.batch_size,
        runs=args.runs,
        side_by_side=cores is not None,
        command="python benchmarks/peer_ab.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")
    lines = [
        f"# Our side at {base[:7]} and at {meta['this'][:7]}{' (+ uncommitted)' if dirty else ''}",
        "",
        f"`{meta['command']}`: {args.threads} thread(s) a side, {args.runs} fresh processes a side, "
        + (
            "the two sides at once, each on its own cores (swapped every run)"
            if meta["side_by_side"]
            else "the two sides in turn, base first"
        )
        + "; seconds of `attribute` as peer_compare.py times it. this / base: of the medians, and the "
        "median of each run's own ratio.",
        "",
        "| case | base median | this median | this / base | per run | base fastest | this fastest "
        "| equal to circuit-tracer |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        b, t = r["base"], r["this"]
        lines.append(
            f"| {r['case']} | {b['median']:.2f} s | {t['median']:.2f} s | {r['ratio']:.3f} | {r['ratio_of_runs']:.3f} | "
            f"{b['fastest']:.2f} s | {t['fastest']:.2f} s | {b['match'] and t['match']} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r["base"]["match"] and r["this"]["match"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
