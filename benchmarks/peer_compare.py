"""Compare attrgraph's attribution with circuit-tracer's on identical weights: adjacency, time, peak RSS.

1. For each case, run the peer harness (`ct_graph.py --out DIR` in `../shared/peer/`, beside the
   project folder; `--peer-harness` names another folder) with the Python of its own venv, which has
   circuit-tracer (`--peer-python`; `../shared/peer/install_env.sh VENV` creates it), on a seeded
   random model and transcoders; it saves the weights, the prompt and circuit-tracer's adjacency,
   wall time and peak RSS.
2. In a fresh process of ours: `attrgraph.load_model(DIR)`, `transcoders.load_transcoders(DIR/transcoders)`,
   `attribute(...)` on `DIR/input_tokens.npy` with circuit-tracer's conventions (BOS excluded, token-only
   embedding nodes, same logit selection and batch size); time it and read the peak RSS.
3. Map circuit-tracer's node order (features, errors `layer * n_pos + pos`, tokens, logits) onto ours
   (graph.NODE_ORDER) and check `max |A_ours - A_ct| <= 1e-4 * max |A_ct|` node for node; also
   check that the columns we have no node for (errors at the excluded BOS) are zero in theirs.
4. Also time our graph on the bundled model (no circuit-tracer equivalent there).
5. Speed against the hardware: each of our worker processes, after its attribution, measures the
   float32 matmul rate (2048^3 products, best of 3, same threads); `attribute` reports the FLOPs its linear
   backward needs (linear_backward.py step 5), so the table gives achieved GFLOP/s and its share of that
   rate, per wall-clock second and per CPU second of the process.
6. Print a table and write `benchmarks/results/peer_compare.{md,json}`.
7. `--profile LABEL` (with `--peer-dir 6/256/4096=DIR`) instead times where our side's time goes on
   the case (`profile_worker`: phases in CPU seconds, torch.profiler's ops) and adds a column to
   `benchmarks/results/peer_compare_profile.{md,json}`.
`--peer-dir LABEL=DIR` reuses a harness output folder (its meta.json holds circuit-tracer's time,
peak RSS and thread count) instead of running circuit-tracer again for that timing case.

Timing cases run `--repeats` times on each side (fresh processes); the table gives the median time
and the median peak RSS (circuit-tracer's peak varied by up to 7% between runs), the JSON every sample.

Usage: python benchmarks/peer_compare.py --peer-python VENV/bin/python [--peer-harness DIR]
[--quick] [--no-large] [--threads N] [--repeats N]
(correctness: gpt2-, gemma2- and llama-like models with PLT, PLT+skip and CLT; timing: gpt2-like
PLT at 2/64/512, 4/128/2048, 6/256/4096 layers/d_model/features on prompts of 16, 24 and 32
tokens, BOS not counted; `--only gpt2-small` runs GPT-2 small's shape instead: 12 layers, d_model 768,
12 heads, a 50,257-token vocabulary, 8,192 features per layer with ~64 active per token, 24 tokens;
`--only 6/256/4096-128t-adaptive` runs the 6/256/4096 shape on 128 tokens with 2,048 of its ~49,000
active features explored on both sides: circuit-tracer's `max_feature_nodes`, ours `method="adaptive"`,
compared on the features both explored, every column but the errors').
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PEER_HARNESS = ROOT.parent / "shared" / "peer"  # the project's ../shared/peer/
TOL = 1e-4

CORRECTNESS = [  # (label, harness arguments)
    (
        f"{arch}-{tc}",
        ["--arch", arch, "--transcoder", tc.split("+")[0]] + (["--skip"] if "skip" in tc else []),
    )
    for arch in ("gpt2", "gemma2", "llama")
    for tc in ("plt", "plt+skip", "clt")
] + [("gemma2-plt+skip-resid", ["--arch", "gemma2", "--transcoder", "plt", "--skip", "--hooks", "resid"])]
SMALL = [
    "--n-layers",
    "3",
    "--d-model",
    "64",
    "--d-transcoder",
    "256",
    "--prompt-len",
    "12",
    "--d-vocab",
    "128",
]
TIMING = [  # (label, harness arguments) as in the harness README
    ("2/64/512", ["--n-layers", "2", "--d-model", "64", "--d-transcoder", "512", "--prompt-len", "16"]),
    ("4/128/2048", ["--n-layers", "4", "--d-model", "128", "--d-transcoder", "2048", "--prompt-len", "24"]),
    ("6/256/4096", ["--n-layers", "6", "--d-model", "256", "--d-transcoder", "4096", "--prompt-len", "32"]),
]
# GPT-2 small's shape (issue 15): 12 layers, d_model 768, 12 heads, its 50,257-token vocabulary, 8,192
# transcoder features per layer with ~64 active per token, a 24-token prompt. circuit-tracer needs
# minutes to an hour per run here, so the case runs only when named (`--only gpt2-small`).
GPT2_SMALL = (
    "gpt2-small",
    ["--n-layers", "12", "--d-model", "768", "--n-heads", "12", "--d-vocab", "50257"]
    + ["--d-transcoder", "8192", "--l0", "64", "--prompt-len", "24"],
)
# A long prompt (issue 29): the 6/256/4096 shape at 128 tokens, where both sides explore 2,048 of
# the ~49,000 active features (circuit-tracer's `max_feature_nodes`, ours `method="adaptive"` on its
# schedule, explored_features); circuit-tracer needs minutes a run here, so it runs only when named.
LONG_ADAPTIVE = (
    "6/256/4096-128t-adaptive",
    ["--n-layers", "6", "--d-model", "256", "--d-transcoder", "4096", "--prompt-len", "128"]
    + ["--max-feature-nodes", "2048"],
)
BUNDLED_PROMPT = "When Mary and John went to the store , John gave a drink to"


# ----------------------------------------------------------------------------- our side (subprocess)
def matmul_gflops(n: int = 2048, repeats: int = 3, clock=time.perf_counter) -> float:
    """The machine's float32 matmul rate in this process (best of `repeats`); `clock=time.process_time`
    gives it per CPU second of this process (what a descheduled process does not lose)."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    for _ in range(repeats):
        t0 = clock()
        a @ b
        best = min(best, clock() - t0)
    return 2 * n**3 / best / 1e9


def ours(dir_: str, batch_size: int, threads: int, backend: str = "auto") -> dict:
    """Run in a fresh process: build our graph on the harness' files and compare adjacencies."""
    import torch

    torch.set_num_threads(threads)
    from attrgraph.bundled.loading import load_model
    from attrgraph.engine.adaptive import attribute_adaptive
    from attrgraph.engine.attribute import attribute
    from transcoders.formats import load_transcoders

    d = Path(dir_)
    model = load_model(d)
    tc = load_transcoders(d / "transcoders")
    tokens = np.load(d / "input_tokens.npy")
    budget = explored_features(d)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0, c0 = time.perf_counter(), time.process_time()
    if budget is None:
        g = attribute(
            model, tc, tokens, exclude_bos=True, embedding="token", batch_size=batch_size, backend=backend
        )
    else:  # circuit-tracer's schedule: it ranks again after update_interval (4) x batch_size features
        g = attribute_adaptive(
            model,
            tc,
            tokens,
            max_feature_nodes=budget,
            k=4 * batch_size,
            exclude_bos=True,
            embedding="token",
            backend=backend,
        )
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    peak_gflops = matmul_gflops()  # after the peak is read: its 48 MB of matrices are not ours to count
    gflop = g.meta.get("backward_gflop", 0.0)
    out = dict(
        library=str(Path(sys.modules["attrgraph"].__file__).resolve().parent.parent),  # the tree it ran
        backend=g.meta["backend"],
        backward_gflop=gflop,
        gflops=round(gflop / seconds, 2),
        matmul_gflops=round(peak_gflops, 2),
        # the same per CPU second of this process (robust to a shared machine's descheduling;
        # with T threads both count every thread's time, spin-waits included)
        gflops_cpu=round(gflop / cpu, 2),
        matmul_gflops_cpu=round(matmul_gflops(clock=time.process_time), 2),
        cpu_seconds=round(cpu, 3),
        seconds=round(seconds, 3),
        peak_rss_mb=round(peak, 1),
        rss_before_mb=round(rss_before, 1),
        nodes=g.n_nodes,
        edges=g.n_edges,
        features=g.n_features,
    )
    out.update(compare(g, d))
    return out


# The phases of `attribute` timed by `profile_worker` (label: functions wrapped, as module path,
# attribute); a function of the rows engine is timed only while the engine runs, and what the
# engine's CPU time has beyond its timed parts is its Python (per batch and group) and glue.
PHASES = {
    "forward (replacement model run)": [("attrgraph.engine.replacement", "ReplacementModel.run")],
    "sources and injections": [
        ("attrgraph.engine.attribute", "build_sources"),
        ("attrgraph.engine.attribute", "feature_injections"),
    ],
    "influence and scores": [("attrgraph.engine.attribute", "streamed_influence")],
}
ENGINE = "attrgraph.engine.linear_backward"
ENGINE_PHASES = {
    "start (injection, first norm)": [(ENGINE, "LinearBackward.start")],
    "attention (W_O, pattern, W_V)": [(ENGINE, "LinearBackward.attention_back")],
    "first attention of a feature target": [(ENGINE, "LinearBackward.attention_back_at")],
    "feature contraction": [(ENGINE, "_LayerDecoders.contract")],
    # (before the one-pass columns of linear_backward.dot_positions, einsum's matrix-vector products)
    "error and embedding columns": [(ENGINE, "dot_positions"), ("torch", "einsum")],
    "CSR assembly (nonzeros, buffers)": [
        ("attrgraph.engine.csr_rows", "CsrRowWriter.append"),
        ("attrgraph.engine.csr_rows", "CsrRowWriter.to_csr"),
    ],
}


def _wrap_phases(phases: dict, seconds: dict, inside: list | None = None, clock=time.process_time) -> list:
    """Wrap each function of `phases` so that its `clock` time adds up in `seconds[label]` (only while
    `inside[0]` is true when `inside` is given); returns what to restore."""
    import importlib

    restore = []
    for label, targets in phases.items():
        seconds.setdefault(label, 0.0)
        for module, name in targets:
            owner = importlib.import_module(module)
            *path, attr = name.split(".")
            for part in path:
                owner = getattr(owner, part, None)
            if owner is None or not hasattr(owner, attr):  # another version of the engine
                continue
            fn = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)

            def timed(*a, _fn=fn, _label=label, **k):
                if inside is not None and not inside[0]:
                    return _fn(*a, **k)
                t0 = clock()
                try:
                    return _fn(*a, **k)
                finally:
                    seconds[_label] += clock() - t0

            setattr(owner, attr, timed)
            restore.append((owner, attr, fn))
    return restore


def profile_worker(dir_: str, batch_size: int, threads: int) -> dict:
    """`--profile`: where our time goes on one case, in three runs of `attribute` in one process:
    plain (time, GFLOP, then the matmul rate), phases timed by wrapping functions (PHASES,
    ENGINE_PHASES; CPU seconds of this process, which a shared machine's descheduling does not
    inflate), and the rows engine under torch.profiler on one thread (ops issued per batch, self time by op;
    the engine's wall time beyond the ops' self time is Python, dispatch and the profiler's own cost)."""
    import torch

    torch.set_num_threads(threads)
    from torch.profiler import ProfilerActivity, profile

    import attrgraph.engine.attribute as attribute_module
    import attrgraph.engine.linear_backward as engine_module
    from attrgraph.bundled.loading import load_model
    from transcoders.formats import load_transcoders

    d = Path(dir_)
    model = load_model(d)
    tc = load_transcoders(d / "transcoders")
    tokens = np.load(d / "input_tokens.npy")

    def run():
        return attribute_module.attribute(
            model, tc, tokens, exclude_bos=True, embedding="token", batch_size=batch_size
        )

    t0, c0, r0 = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
    g = run()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    gflop = g.meta.get("backward_gflop", 0.0)
    out = dict(
        threads=threads,
        seconds=round(seconds, 3),
        cpu_seconds=round(cpu, 3),
        # kernel time: mostly first touches of fresh pages (the adjacency's buffers, large temporaries)
        system_cpu_seconds=round(r1.ru_stime - r0.ru_stime, 3),
        page_faults=r1.ru_minflt - r0.ru_minflt,
        backward_gflop=gflop,
        gflops=round(gflop / seconds, 2),
        matmul_gflops=round(matmul_gflops(), 2),
        gflops_cpu=round(gflop / cpu, 2),
        matmul_gflops_cpu=round(matmul_gflops(clock=time.process_time), 2),
        edges=g.n_edges,
    )
    del g
    # phases: every wrapped function's CPU time, the engine's own parts only while it runs
    phase_s: dict = {}
    engine_stats: dict = {}
    inside = [False]
    rows_fn = engine_module.linear_rows

    def rows_timed(*a, **k):
        inside[0] = True
        t = time.process_time()
        try:
            return rows_fn(*a, **k)
        finally:
            phase_s["rows engine (linear_rows)"] = time.process_time() - t
            inside[0] = False
            engine_stats.update(k.get("stats") or {})

    # the engine's parts may run in its worker threads: each timed on the thread that runs it
    restore = _wrap_phases(PHASES, phase_s) + _wrap_phases(ENGINE_PHASES, phase_s, inside, time.thread_time)
    engine_module.linear_rows = attribute_module.linear_rows = rows_timed
    t0 = time.process_time()
    run()
    total = time.process_time() - t0
    engine_module.linear_rows = attribute_module.linear_rows = rows_fn
    for owner, attr, fn in restore:
        setattr(owner, attr, fn)
    rows_s = phase_s["rows engine (linear_rows)"]
    parts = {k: phase_s[k] for k in ENGINE_PHASES}
    parts["rest of the engine (Python per batch and group, cat, sort)"] = rows_s - sum(parts.values())
    top = {k: phase_s[k] for k in PHASES}
    top["rows engine (linear_rows)"] = rows_s
    top["rest of attribute (targets, graph and node table)"] = total - sum(top.values())
    out["phases"] = dict(
        engine_threads=engine_stats.get("threads"),
        engine_workers=engine_stats.get("workers", 1),
        batches=engine_stats.get("batches"),
        seconds=round(total, 3),
        attribute={k: round(v, 4) for k, v in top.items()},
        engine={k: round(v, 4) for k, v in parts.items()},
    )
    # the rows engine under torch.profiler: ops it issued (top level, views included) and self time
    stats: dict = {}
    keep = []

    def rows_stats(*a, **k):
        k["stats"] = stats
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t = time.perf_counter()
            result = rows_fn(*a, **k)
            keep.append((prof, time.perf_counter() - t))
        return result

    engine_module.linear_rows = attribute_module.linear_rows = rows_stats
    torch.set_num_threads(1)  # one worker thread: the profiler sees the ops of the calling thread
    run()
    torch.set_num_threads(threads)
    engine_module.linear_rows = attribute_module.linear_rows = rows_fn
    prof, wall = keep[0]
    issued: dict = {}
    for e in prof.events():
        if e.cpu_parent is None and e.name.startswith("aten::"):
            issued[e.name] = issued.get(e.name, 0) + 1
    avg = [a for a in prof.key_averages() if a.key.startswith("aten::")]
    self_s = sum(a.self_cpu_time_total for a in avg) / 1e6
    n = max(stats.get("batches", 1), 1)
    out["profiler"] = dict(
        batches=stats.get("batches"),
        engine_threads=stats.get("threads"),
        wall_seconds=round(wall, 3),
        ops_self_seconds=round(self_s, 3),
        python_and_dispatch_seconds=round(wall - self_s, 3),
        ops_per_batch=round(sum(issued.values()) / n, 1),
        top_ops=[
            dict(
                op=a.key,
                calls=a.count,
                per_batch=round(a.count / n, 1),
                self_ms=round(a.self_cpu_time_total / 1e3, 1),
                share=round(a.self_cpu_time_total / 1e6 / self_s, 3),
            )
            for a in sorted(avg, key=lambda a: -a.self_cpu_time_total)[:12]
        ],
    )
    return out


def explored_features(d: Path) -> int | None:
    """The features circuit-tracer explored in the harness folder `d` where it was given
    `max_feature_nodes` (fewer than the active ones), else None (the full graph)."""
    if not (d / "selected_features.npy").exists():  # an older harness folder: full graphs only
        return None
    selected = len(np.load(d / "selected_features.npy", mmap_mode="r"))
    return selected if selected < len(np.load(d / "active_features.npy", mmap_mode="r")) else None


def ct_index(g, d: Path) -> tuple[np.ndarray | None, str | None]:
    """Our node i is circuit-tracer's node `idx[i]` (its graph in `d`), or None and why not. A graph of
    circuit-tracer's with `max_feature_nodes` holds only its explored (selected) features; against
    ours (`method="adaptive"`) a feature only one side explored is -1 (the ranking can differ where
    two features' influence ties to float32 rounding)."""
    af = np.load(d / "active_features.npy")
    selected_path = d / "selected_features.npy"  # absent in an older harness folder: every feature
    selected = np.load(selected_path) if selected_path.exists() else np.arange(len(af))
    partial = g.meta.get("method") == "adaptive"
    ct_logits = np.load(d / "logit_token_ids.npy").tolist()
    n_pos, n_feat = len(g.prompt_ids), len(selected)
    L = int(g.meta["n_layers"])
    feat_index = {tuple(af[s].tolist()): i for i, s in enumerate(selected.tolist())}
    n = g.nodes
    idx = np.empty(g.n_nodes, np.int64)
    for i, (kind, layer, pos, feat) in enumerate(zip(n.kind, n.layer, n.position, n.feature)):
        if kind == "feature":
            key = (int(layer), int(pos), int(feat))
            if key not in feat_index and not partial:
                return None, f"feature {key} is not among circuit-tracer's {n_feat} features"
            idx[i] = feat_index.get(key, -1)
        elif kind == "error":
            idx[i] = n_feat + layer * n_pos + pos
        elif kind == "embedding":
            idx[i] = n_feat + L * n_pos + pos
        else:
            tok = int(g.logit_tokens[i - (g.n_nodes - len(g.logit_tokens))])
            if tok not in ct_logits:
                return None, f"logit token {tok} is not among circuit-tracer's {ct_logits}"
            idx[i] = n_feat + L * n_pos + n_pos + ct_logits.index(tok)
    if (g.n_features != n_feat and not partial) or len(g.logit_tokens) != len(ct_logits):
        return None, f"{g.n_features} features / {len(g.logit_tokens)} logits vs {n_feat} / {len(ct_logits)}"
    return idx, None


def compare(g, d: Path) -> dict:
    """Step 3: map circuit-tracer's node order onto ours and compare node for node. Partial graphs
    (`max_feature_nodes`; ours `method="adaptive"`, which explores the same features) are compared on
    the features both explored (`explored_by_one_side` counts the others; the graphs match only where
    it is 0) and on all columns but the errors': circuit-tracer drops an unexplored feature's edges,
    ours adds them to its error node (adaptive.py step 4)."""
    ref = np.load(d / "adjacency.npy", mmap_mode="r")
    idx, reason = ct_index(g, d)
    if idx is None:
        return dict(match=False, reason=reason)
    n = g.nodes
    partial = g.meta.get("method") == "adaptive"
    both = idx >= 0
    cols = np.flatnonzero(both & (n.kind != "error")) if partial else np.arange(g.n_nodes)
    unmapped = np.setdiff1d(np.arange(ref.shape[0]), idx[both])
    one_side = int((~both).sum())
    if partial:  # circuit-tracer's features that ours did not explore: compared by count only
        ct_features = len(np.load(d / "selected_features.npy", mmap_mode="r"))
        one_side += int((unmapped < ct_features).sum())
        unmapped = unmapped[unmapped >= ct_features]
    scale = float(np.abs(ref).max())
    unmapped_max = (
        float(np.abs(ref[:, unmapped]).max() + np.abs(ref[unmapped]).max()) if len(unmapped) else 0.0
    )
    row_diff = np.zeros(g.n_nodes)  # per row of ours, max |A_ours - A_ct|
    row_scale = np.zeros(g.n_nodes)  # per row, max |A_ct|
    for lo in range(0, g.n_nodes, 2048):  # row blocks: two dense [N, N] copies would not fit at gpt2-small
        rows = np.arange(lo, min(lo + 2048, g.n_nodes))
        rows = rows[both[rows]]
        theirs = ref[np.ix_(idx[rows], idx[cols])]
        ours = g.adjacency[rows][:, cols] if partial else g.adjacency[rows]
        row_diff[rows] = np.abs(ours.toarray() - theirs).max(1, initial=0.0)
        row_scale[rows] = np.abs(theirs).max(1, initial=0.0)
    rel = float(row_diff.max()) / scale
    by_kind = {}
    for kind in ("feature", "logit"):  # each kind's rows against the largest edge of those rows
        mask = n.kind == kind
        by_kind[f"{kind}_rows_rel_diff"] = (
            float(row_diff[mask].max() / row_scale[mask].max())
            if mask.any() and row_scale[mask].max()
            else 0.0
        )
    partial_keys = dict(
        partial=True,
        explored_by_one_side=one_side,
        error_columns="not compared (ours hold the unexplored features)",
    )
    return dict(
        match=bool(rel <= TOL and unmapped_max == 0.0 and one_side == 0),
        max_rel_diff=rel,
        unmapped_abs=unmapped_max,
        ct_nodes=int(ref.shape[0]),
        **by_kind,
        **(partial_keys if partial else {}),
    )


def ours_bundled(batch_size: int, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    from attrgraph.bundled.loading import load_model
    from attrgraph.engine.attribute import attribute
    from attrgraph.graph.prune import prune_graph
    from transcoders.formats import load_transcoders

    model = load_model("default")
    tc = load_transcoders("default-plt")
    t0 = time.perf_counter()
    g = attribute(model, tc, BUNDLED_PROMPT, batch_size=batch_size)
    seconds = time.perf_counter() - t0
    p = prune_graph(g)
    return dict(
        seconds=round(seconds, 3),
        peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        nodes=g.n_nodes,
        edges=g.n_edges,
        features=g.n_features,
        pruned_nodes=p.n_nodes,
        pruned_edges=p.n_edges,
        n_pos=len(g.prompt_ids),
    )


# ----------------------------------------------------------------------------- driver
# Runs the harness' main() with circuit_tracer.attribute wrapped to also print its CPU seconds (on a
# shared machine wall time depends on the other processes; CPU time much less).
CT_DRIVER = """
import sys, time
sys.path.insert(0, sys.argv[1])
import circuit_tracer, ct_graph
attribute = circuit_tracer.attribute
def timed(*args, **kwargs):
    t0 = time.process_time()
    graph = attribute(*args, **kwargs)
    print(f"attribute_cpu_s: {time.process_time() - t0:.3f}", flush=True)
    return graph
circuit_tracer.attribute = timed
sys.argv = [ct_graph.__file__, *sys.argv[2:]]
sys.exit(0 if ct_graph.main() else 1)
"""


def run_peer(
    args: list[str], out: str, threads: int, batch_size: int, peer_python: str, harness: Path
) -> dict:
    cmd = [
        peer_python,
        "-c",
        CT_DRIVER,
        str(harness),
        *args,
        "--out",
        out,
        "--threads",
        str(threads),
        "--batch-size",
        str(batch_size),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    if res.returncode != 0:
        raise RuntimeError(f"peer harness failed: {' '.join(cmd)}\n{res.stderr[-2000:]}")
    stats = {}
    for line in res.stdout.splitlines():
        if ": " in line:
            k, v = line.split(": ", 1)
            stats[k.strip()] = v.strip()
    return dict(
        seconds=float(stats["attribute_s"]),
        cpu_seconds=float(stats["attribute_cpu_s"]),
        peak_rss_mb=float(stats["peak_rss_mb"]),
        rss_before_mb=float(stats["rss_before_attr_mb"]),
        nodes=int(stats["nodes"]),
        active_features=int(stats["active_features"]),
        load_average=os.getloadavg(),
    )


def peer_from_dir(d: str) -> dict:
    """circuit-tracer's figures from an earlier harness run (its meta.json)."""
    st = json.loads((Path(d) / "meta.json").read_text())["stats"]
    return dict(
        seconds=float(st["attribute_s"]),
        peak_rss_mb=float(st["peak_rss_mb"]),
        rss_before_mb=float(st["rss_before_attr_mb"]),
        nodes=int(st["nodes"]),
        active_features=int(st["active_features"]),
        threads=int(st["torch_threads"]),
        reused=Path(d).name,  # the folder's name only: results hold no machine paths
    )


def worker_command(mode: str, target: str, threads: int, batch_size: int, backend: str = "auto") -> list[str]:
    """The command of one fresh worker process of ours (`--_worker MODE --_target TARGET`)."""
    return [
        sys.executable,
        __file__,
        "--_worker",
        mode,
        "--_target",
        target,
        "--threads",
        str(threads),
        "--batch-size",
        str(batch_size),
        "--backend",
        backend,
    ]


def worker_result(cmd: list[str], returncode: int, stdout: str, stderr: str) -> dict:
    """A worker's record (its last stdout line), or RuntimeError with its stderr's tail."""
    if returncode != 0:
        raise RuntimeError(f"our worker failed: {' '.join(cmd)}\n{stderr[-3000:]}")
    return dict(json.loads(stdout.strip().splitlines()[-1]), load_average=os.getloadavg())


def run_ours(mode: str, target: str, threads: int, batch_size: int, backend: str = "auto") -> dict:
    cmd = worker_command(mode, target, threads, batch_size, backend)
    res = subprocess.run(
        cmd, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"), cwd=ROOT
    )
    return worker_result(cmd, res.returncode, res.stdout, res.stderr)


def median_run(runs: list[dict]) -> dict:
    """The first run's record with time and peak RSS replaced by their medians over `runs` (each
    run is a fresh process; both figures vary by a few percent from run to run); all samples kept."""
    out = dict(runs[0])
    if len(runs) > 1:
        for key in ("seconds", "peak_rss_mb", "load_average"):
            if all(key in r for r in runs):
                if key != "load_average":
                    out[key] = float(np.median([r[key] for r in runs]))
                out[f"{key}_runs"] = [r[key] for r in runs]
        # rates: the median of each run's own figure (engine and matmul of one process side by side)
        for key in ("gflops", "matmul_gflops", "gflops_cpu", "matmul_gflops_cpu", "cpu_seconds"):
            if all(key in r for r in runs):
                out[key] = float(np.median([r[key] for r in runs]))
                out[f"{key}_runs"] = [r[key] for r in runs]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="correctness cases only")
    ap.add_argument("--no-large", action="store_true", help="skip the 6/256/4096 timing case")
    ap.add_argument("--no-correctness", action="store_true", help="timing cases only")
    ap.add_argument("--threads", type=int, default=2, help="torch threads for both sides")
    ap.add_argument("--batch-size", type=int, default=512, help="targets per backward, both sides")
    ap.add_argument(
        "--repeats", type=int, default=3, help="runs per timing case and side (median time and peak RSS)"
    )
    ap.add_argument(
        "--peer-repeats",
        type=int,
        help="runs of circuit-tracer per timing case (default: --repeats; gpt2-small takes 12+ min a run)",
    )
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "peer_compare"))
    ap.add_argument(
        "--merge", help="JSON results of an earlier run whose rows (other cases) are kept in the table"
    )
    ap.add_argument(
        "--backend", default="auto", choices=("auto", "linear", "autograd"), help="our rows engine"
    )
    ap.add_argument(
        "--peer-dir",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="reuse a harness output folder for a timing case instead of running circuit-tracer again "
        "(repeat it with other folders of the same case: circuit-tracer's median over them)",
    )
    ap.add_argument("--only", help="comma-separated case labels to run (default: all)")
    ap.add_argument(
        "--profile",
        metavar="LABEL",
        help="instead of comparing: profile our side on the timing case(s) (--only, default 6/256/4096) "
        "and add the breakdown under LABEL to OUT_profile.{json,md}",
    )
    ap.add_argument(
        "--peer-python",
        help="Python of the peer venv with circuit-tracer (../shared/peer/install_env.sh VENV "
        "creates it; then VENV/bin/python)",
    )
    ap.add_argument(
        "--peer-harness",
        type=Path,
        default=PEER_HARNESS,
        help="folder of the peer harness ct_graph.py (default: ../shared/peer/ beside the project)",
    )
    ap.add_argument("--_worker", help=argparse.SUPPRESS)
    ap.add_argument("--_target", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._worker == "peer":
        print(json.dumps(ours(args._target, args.batch_size, args.threads, args.backend)))
        return 0
    if args._worker == "profile":
        print(json.dumps(profile_worker(args._target, args.batch_size, args.threads)))
        return 0
    if args._worker == "bundled":
        print(json.dumps(ours_bundled(args.batch_size, args.threads)))
        return 0

    if args.profile:
        return profile_main(args, ap)
    rows = []
    cases = [] if args.no_correctness else [(label, SMALL + a, "correctness") for label, a in CORRECTNESS]
    if not args.quick:
        cases += [
            (label, a, "timing") for label, a in TIMING if not (args.no_large and label == "6/256/4096")
        ]
        for named in (GPT2_SMALL, LONG_ADAPTIVE):
            if args.only and named[0] in args.only.split(","):
                cases.append((*named, "timing"))
    reuse = {}  # label -> harness folders (several: circuit-tracer's median over them)
    for x in args.peer_dir:
        label, d = x.split("=", 1)
        reuse.setdefault(label, []).append(d)
    if args.only:
        cases = [c for c in cases if c[0] in args.only.split(",")]
    if any(label not in reuse for label, _, _ in cases):
        if not args.peer_python:
            ap.error("--peer-python is required: pass the Python of the peer venv (VENV/bin/python).")
        if not Path(args.peer_python).is_file():
            ap.error(f"--peer-python {args.peer_python} is not a file; pass the peer venv's bin/python.")
        if not (args.peer_harness / "ct_graph.py").is_file():
            ap.error(
                f"{args.peer_harness} holds no ct_graph.py; pass --peer-harness, the peer harness folder."
            )
    work = tempfile.mkdtemp(prefix="peer_compare_")
    for label, harness_args, kind in cases:
        out = os.path.join(work, label.replace("/", "_"))
        n = args.repeats if kind == "timing" else 1
        if label in reuse:
            out, ct = reuse[label][0], median_run([peer_from_dir(d) for d in reuse[label]])
        else:
            ct = median_run(
                [
                    run_peer(
                        harness_args, out, args.threads, args.batch_size, args.peer_python, args.peer_harness
                    )
                    for _ in range(args.peer_repeats or n if kind == "timing" else 1)
                ]
            )
            ct["threads"] = args.threads
        us = median_run(
            [run_ours("peer", out, ct["threads"], args.batch_size, args.backend) for _ in range(n)]
        )
        row = dict(case=label, kind=kind, ct=ct, ours=us)
        rows.append(row)
        print(
            f"{label:14s} match={us.get('match')} max_rel_diff={us.get('max_rel_diff', float('nan')):.2e} "
            f"ct {ct['seconds']:.2f} s {ct['peak_rss_mb']:.0f} MB | ours {us['seconds']:.2f} s {us['peak_rss_mb']:.0f} MB",
            flush=True,
        )
    bundled = None
    if not args.quick and (ROOT / "data" / "default" / "config.json").exists():
        bundled = run_ours("bundled", "", args.threads, args.batch_size)
        print(f"bundled model: {bundled}", flush=True)
    if args.merge:
        done = {r["case"] for r in rows}
        rows = [r for r in json.loads(Path(args.merge).read_text())["rows"] if r["case"] not in done] + rows
    write_results(rows, bundled, args)
    return 0 if all(r["ours"].get("match") for r in rows) else 1


def profile_main(args, ap) -> int:
    """`--profile LABEL`: the breakdown of `profile_worker`, in a fresh process per case, added to
    (or replacing) LABEL's entry in OUT_profile.json; the md shows every label side by side."""
    labels = args.only.split(",") if args.only else ["6/256/4096"]
    reuse = dict(x.split("=", 1) for x in args.peer_dir)
    out = Path(args.out + "_profile")
    old = json.loads(out.with_suffix(".json").read_text()) if out.with_suffix(".json").exists() else {}
    runs = old.get("runs", {})
    work = tempfile.mkdtemp(prefix="peer_profile_")
    for label in labels:
        dir_ = reuse.get(label)
        if dir_ is None:
            if not args.peer_python:
                ap.error("--profile needs --peer-dir LABEL=DIR or --peer-python to make the case.")
            dir_ = os.path.join(work, label.replace("/", "_"))
            run_peer(dict(TIMING)[label], dir_, 1, args.batch_size, args.peer_python, args.peer_harness)
        cmd = [sys.executable, __file__, "--_worker", "profile", "--_target", dir_]
        cmd += ["--threads", str(args.threads), "--batch-size", str(args.batch_size)]
        loads = [os.getloadavg()]
        res = subprocess.run(
            cmd, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"), cwd=ROOT
        )
        if res.returncode != 0:
            raise RuntimeError(f"profile worker failed: {' '.join(cmd)}\n{res.stderr[-3000:]}")
        r = json.loads(res.stdout.strip().splitlines()[-1])
        loads.append(os.getloadavg())
        r.update(
            case=label,
            load_average_1min=[round(x[0], 2) for x in loads],
            date=time.strftime("%Y-%m-%d %H:%M"),
            commit=subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
            ).stdout.strip(),
        )
        runs[f"{args.profile} {label} {args.threads}t"] = r
        print(json.dumps(r), flush=True)
    out.with_suffix(".json").write_text(json.dumps(dict(runs=runs), indent=1))
    write_profile_md(runs, out.with_suffix(".md"))
    return 0


def write_profile_md(runs: dict, path: Path) -> None:
    names = list(runs)
    lines = [
        "# Where attrgraph's time goes (peer_compare.py --profile)",
        "",
        "`python benchmarks/peer_compare.py --profile LABEL --peer-dir 6/256/4096=DIR --threads T` "
        "(DIR: the peer harness' case folder). One fresh process per column: `attribute(...)` three times "
        "(plain; phases timed in CPU seconds by wrapping the functions named in PHASES / ENGINE_PHASES, the engine's "
        "parts on the thread that runs them; the rows engine under torch.profiler on one thread). Rate = the engine's GFLOP over all of `attribute`'s wall time, against a "
        "float32 2048^3 matmul in the same process and threads. The machine is shared: the 1-min load "
        "average is given (2 cores). A column labelled `main` is another tree (`git archive`) run by this "
        "script (`PYTHONPATH=TREE`); an engine before the useful-flop count (main before branch perf2) "
        "counted the products it ran, padding and merged positions included (177.2 GFLOP at 6/256/4096, "
        "against the 167.8 GFLOP each row needs).",
        "",
        "| | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]

    def row(title, f):
        lines.append(f"| {title} | " + " | ".join(f(runs[n]) for n in names) + " |")

    row("commit, date", lambda r: f"{r['commit']}, {r['date']}")
    row("1-min load average (start, end)", lambda r: ", ".join(f"{x:.1f}" for x in r["load_average_1min"]))
    row("attribute wall (CPU) s", lambda r: f"{r['seconds']:.2f} ({r['cpu_seconds']:.2f})")
    row(
        "of the CPU s: kernel s (page faults)",
        lambda r: f"{r['system_cpu_seconds']:.2f} ({r['page_faults']})" if "page_faults" in r else "-",
    )
    row(
        "GFLOP, GFLOP/s (matmul, share)",
        lambda r: (
            f"{r['backward_gflop']:.1f}, {r['gflops']:.1f} ({r['matmul_gflops']:.1f}, "
            f"{r['gflops'] / r['matmul_gflops']:.0%})"
        ),
    )
    row(
        "per CPU second: GFLOP/s (matmul, share)",
        lambda r: (
            f"{r['gflops_cpu']:.1f} ({r['matmul_gflops_cpu']:.1f}, "
            f"{r['gflops_cpu'] / r['matmul_gflops_cpu']:.0%})"
            if "gflops_cpu" in r
            else "-"
        ),
    )
    row("timed run: attribute CPU s", lambda r: f"{r['phases']['seconds']:.2f}")
    row(
        "timed run: engine threads per batch x batches at once",
        lambda r: f"{r['phases'].get('engine_threads', '-')} x {r['phases'].get('engine_workers', '-')}",
    )
    for key in dict.fromkeys(k for n in names for k in runs[n]["phases"]["attribute"]):
        row(f"- {key}", lambda r, k=key: _share(r["phases"]["attribute"].get(k), r["phases"]["seconds"]))
    for key in dict.fromkeys(k for n in names for k in runs[n]["phases"]["engine"]):
        row(
            f"-- engine: {key}",
            lambda r, k=key: _share(
                r["phases"]["engine"].get(k), r["phases"]["attribute"]["rows engine (linear_rows)"]
            ),
        )
    row(
        "profiler: batches, threads, ops issued per batch",
        lambda r: (
            f"{r['profiler']['batches']}, {r['profiler']['engine_threads']}, {r['profiler']['ops_per_batch']}"
        ),
    )
    row(
        "profiler: engine wall s = ops' self s + Python/dispatch s",
        lambda r: (
            f"{r['profiler']['wall_seconds']:.2f} = {r['profiler']['ops_self_seconds']:.2f} + "
            f"{r['profiler']['python_and_dispatch_seconds']:.2f}"
        ),
    )
    row(
        "profiler: top ops by self time (share of ops' self time, calls per batch)",
        lambda r: "<br>".join(
            f"{o['op'][6:]} {o['share']:.0%} ({o['per_batch']})" for o in r["profiler"]["top_ops"][:8]
        ),
    )
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _share(x: float | None, whole: float) -> str:
    return "-" if x is None else f"{x:.2f} s ({x / whole:.0%})"


def _loads(side: dict) -> str:
    """The 1-minute load averages recorded after each run of one side."""
    return ", ".join(f"{a[0]:.1f}" for a in side.get("load_average_runs", [side["load_average"]]))


def write_results(rows, bundled, args) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(
        threads=args.threads,
        batch_size=args.batch_size,
        tolerance=TOL,
        date=time.strftime("%Y-%m-%d %H:%M"),
        load_average=os.getloadavg(),
    )
    out.with_suffix(".json").write_text(json.dumps(dict(meta=meta, rows=rows, bundled=bundled), indent=1))
    lines = [
        "# attrgraph vs circuit-tracer (same weights, same prompt, same process conditions)",
        "",
        f"torch threads {args.threads}, batch size {args.batch_size}, timing cases: median of "
        f"{args.repeats} fresh processes for attrgraph and {args.peer_repeats or args.repeats} for "
        f"circuit-tracer, load average at the end "
        f"{', '.join(f'{x:.1f}' for x in meta['load_average'])}; adjacency match = max |diff| <= {TOL} x max |A_ct|. "
        "GFLOP/s: the products each row of ours needs (linear_backward.py step 5) over the whole "
        "`attribute` call, against a float32 2048^3 matmul timed in the same process right after "
        "(medians over the runs); per CPU second: the same over the process's CPU time, which "
        "a shared machine's descheduling does not inflate.",
        "",
        "| case | kind | threads | nodes (ct / ours) | features | match | max rel diff | ct time | ours time | speed-up "
        "| ct peak RSS | ours peak RSS | RSS ours/ct | ours GFLOP/s (matmul GFLOP/s, share) "
        "| per CPU second (matmul, share) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ct, us = r["ct"], r["ours"]
        rate = (
            f"{us['gflops']:.1f} ({us['matmul_gflops']:.1f}, {us['gflops'] / us['matmul_gflops']:.0%})"
            if us.get("gflops")
            else "-"
        )
        rate += (
            f" | {us['gflops_cpu']:.1f} ({us['matmul_gflops_cpu']:.1f}, "
            f"{us['gflops_cpu'] / us['matmul_gflops_cpu']:.0%})"
            if us.get("gflops_cpu")
            else " | -"
        )
        lines.append(
            f"| {r['case']} | {r['kind']} | {ct.get('threads', args.threads)} | {ct['nodes']} / {us['nodes']} | {us['features']} | "
            f"{us.get('match')} | {us.get('max_rel_diff', float('nan')):.1e} | {ct['seconds']:.2f} s | {us['seconds']:.2f} s | "
            f"{ct['seconds'] / us['seconds']:.1f}x | {ct['peak_rss_mb'] / 1024:.2f} GB | {us['peak_rss_mb'] / 1024:.2f} GB | "
            f"{us['peak_rss_mb'] / ct['peak_rss_mb']:.2f} | {rate} |"
        )
    lines.append("")
    lines.append(
        "Node counts differ by n_layers: circuit-tracer keeps error nodes at the BOS position (all zero); we drop them."
    )
    for r in rows:  # CPU time depends much less than wall time on the machine's other processes
        ct, us = r["ct"], r["ours"]
        if "cpu_seconds" in ct and "cpu_seconds" in us:
            lines += [
                "",
                f"{r['case']}: CPU time of attribute() (median) circuit-tracer {ct['cpu_seconds']:.1f} s, "
                f"attrgraph {us['cpu_seconds']:.1f} s ({ct['cpu_seconds'] / us['cpu_seconds']:.1f}x); 1-minute "
                f"load average after each run: circuit-tracer {_loads(ct)}, attrgraph {_loads(us)}.",
            ]
    if bundled:
        lines += [
            "",
            f"Bundled model (default + default-plt, {bundled['n_pos']} tokens): {bundled['nodes']} nodes, "
            f"{bundled['edges']} edges, {bundled['features']} features, attribute {bundled['seconds']:.2f} s, "
            f"peak RSS {bundled['peak_rss_mb'] / 1024:.2f} GB; pruned {bundled['pruned_nodes']} nodes, "
            f"{bundled['pruned_edges']} edges.",
        ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
