"""`attrgraph build PROMPT`: attribute, prune, summarize and store a graph in one command.

1. Load the model (`--model`: "default", a folder, or a TransformerLens name) and the transcoders
   (`--transcoders`: "default-plt", "default-clt", a directory in a format `transcoders` reads, or
   a Hugging Face hub name, e.g. `mntss/clt-gemma-2-2b-426k`, from the cache: transcoders/formats/hub.py);
   `--attn-transcoders NAME_OR_PATH` adds an attention-output SAE set, whose features and errors
   become graph nodes too (engine/sets.py).
   Tokenize and check the prompt (attribute.to_tokens): text that is not UTF-8 and a prompt
   longer than the context are errors (`--truncate` keeps the first n_ctx tokens instead and says
   what it dropped); words the vocabulary lacks are a warning, an error under `--strict`.
2. `attribute` (logit targets by `--max-logits` / `--logit-prob`; `--batch-size` caps the targets
   per backward, by default sized by the engine: for the cache on the CPU, from free memory on a GPU).
3. `prune_graph` with `--node-threshold` / `--edge-threshold` and `--prune-rule` (default
   circuit-tracer's: error nodes pruned by influence like features, features left without inputs
   dropped, what the Neuronpedia export draws; `appendix`: the circuit-tracing appendix's, error
   nodes never pruned; graph/prune.py step 5), taking the influence `attribute` computed. The
   stored graph keeps its thresholds, rule and every node's influence in the unpruned graph, so
   `attrgraph export` of it needs no options. Steps 2-3 of the standard method without `--full`
   (and with a node threshold below 1) are one step, `attribute_pruned` (engine/pruned_build.py):
   the same pruned graph without ever holding the full one, whose edges are most of a long
   prompt's memory (on a GPU that holds every row, pruned there: engine/device_prune.py);
   `--json` then gives the full graph's sizes and scores only, under "full".
4. Print nodes and edges before and after pruning, the top logits, the top features by influence
   and the wall time; write the pruned graph (and with `--full` the unpruned one as NAME_full, in
   the same atomic write: both or neither) to `-o` (missing folders are created; an output that
   cannot be written, and options that make no sense, are refused in one line before step 1; a
   graph of the same name already in it is replaced, which a warning says before step 1).
   Ctrl-C exits 130 with one line; a write it
   interrupts leaves the old file as it was (store.py). Steps that can take long (attribution, the influence passes,
   writing a large graph) show tqdm bars on stderr unless `--no-progress` or `--json`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

from attrgraph.cli import add_prompt_options
from transcoders.block_layout import ATTN_OUTPUT


def add_parser(sub) -> None:
    p = sub.add_parser("build", help="build, prune and store the attribution graph of a prompt")
    p.add_argument("prompt")
    p.add_argument(
        "-o",
        "--output",
        default="graph.h5",
        help="HDF5 file to write or add to (default graph.h5); missing parent folders are created",
    )
    p.add_argument("--name", default=None, help="graph name inside the file (default 'graph')")
    add_build_options(p)
    p.add_argument("--json", action="store_true", help="print the summaries as one JSON object")
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bars (attribution, influence, writing)"
    )


def add_build_options(
    p: argparse.ArgumentParser, threads_default: int | None = None, threads_help: str | None = None
) -> None:
    """The options of one graph's build (model, transcoders, attribution method, pruning, prompt
    checks), shared by `build` and `build-many`."""
    p.add_argument("--model", default="default", help="'default', a model folder, or a TransformerLens name")
    p.add_argument(
        "--transcoders",
        default="default-plt",
        help="'default-plt', 'default-clt', a directory, or a Hugging Face hub name (owner/repo[/folder][@rev])",
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="where the model and transcoders run: cpu (default), cuda, cuda:N, mps",
    )
    p.add_argument(
        "--attn-transcoders",
        default=None,
        metavar="NAME_OR_PATH",
        help=f"also replace the attention outputs with this SAE set (on {ATTN_OUTPUT})",
    )
    p.add_argument("--node-threshold", type=float, default=0.8)
    p.add_argument("--edge-threshold", type=float, default=0.98)
    p.add_argument(
        "--prune-rule",
        choices=("circuit-tracer", "appendix"),
        default="circuit-tracer",
        help="circuit-tracer (default): error nodes pruned by influence like features, features "
        "without inputs dropped, as circuit-tracer's prune_graph; appendix: the circuit-tracing "
        "appendix's rule, error nodes never pruned",
    )
    p.add_argument("--max-logits", type=int, default=None, help="most logit targets (default 10)")
    p.add_argument(
        "--logit-prob", type=float, default=None, help="logit targets cover this probability (default 0.95)"
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="most targets per backward (default: the engine's plan, cache-sized on the CPU and "
        "from free memory on a GPU)",
    )
    p.add_argument(
        "--precision",
        choices=("fp32", "tf32", "bf16"),
        default=None,
        help="the linear engine's products: fp32 (default, exact), tf32 or bf16 (faster on a GPU, at the "
        "price docs/gpu.md states)",
    )
    p.add_argument("--method", choices=("standard", "hierarchical", "adaptive"), default="standard")
    p.add_argument(
        "--tau", type=float, default=None, help="hierarchical: detach nodes whose attribution is below tau"
    )
    p.add_argument(
        "--max-feature-nodes", type=int, default=None, help="adaptive: explore at most this many features"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=threads_default,
        help=threads_help or "torch CPU threads (default: torch's choice)",
    )
    p.add_argument("--full", action="store_true", help="also store each unpruned graph as NAME_full")
    add_prompt_options(p)


def _outside(value, low: float, high: float = math.inf) -> bool:
    """True when `value` (given) is not a number in [low, high]; NaN is never inside."""
    return value is not None and not low <= value <= high


def check_build_options(options: dict) -> None:
    """Refuse, before anything loads, the build options (as parsed by `add_build_options`) that
    make no sense, or that the method does not take: each is one `OptionError` line naming the
    option and what to pass."""
    from attrgraph.engine.methods import check_method
    from attrgraph.errors import OptionError

    for key in ("node_threshold", "edge_threshold"):
        if _outside(options[key], 0.0, 1.0):
            raise OptionError(
                f"--{key.replace('_', '-')} is {options[key]}; pass a fraction in [0, 1] such as 0.8."
            )
    if options["logit_prob"] is not None and not 0.0 < options["logit_prob"] <= 1.0:
        raise OptionError(
            f"--logit-prob is {options['logit_prob']}; pass a probability in (0, 1] such as 0.95."
        )
    if _outside(options["tau"], 0.0):
        raise OptionError(
            f"--tau is {options['tau']}; pass an attribution of 0 or more (0 detaches nothing below 0)."
        )
    for key in ("max_logits", "batch_size", "max_feature_nodes", "threads"):
        if options[key] is not None and options[key] < 1:
            raise OptionError(f"--{key.replace('_', '-')} is {options[key]}; pass at least 1.")
    if options["threads"] is not None and options["threads"] > MAX_THREADS:  # torch's own: an OverflowError
        raise OptionError(
            f"--threads is {options['threads']}; pass at most {MAX_THREADS} (this machine has {os.cpu_count()} cores)."
        )
    method, kwargs = attribute_options(options, progress=False)
    check_method(method, kwargs, cli=True)  # e.g. --tau without --method hierarchical


MAX_THREADS = 1024
"""The most torch CPU threads `--threads` asks for."""


def load_sets(options: dict):
    """The transcoder set of `--transcoders`, or `[it, the set of --attn-transcoders]`."""
    from transcoders.formats import load_transcoders

    device = options.get("device", "cpu")
    tc = load_transcoders(options["transcoders"], device=device)
    if options.get("attn_transcoders") is None:
        return tc
    return [tc, load_transcoders(options["attn_transcoders"], device=device)]


def model_for(name: str, sets, device="cpu"):
    """The model `name`, loaded as the sets `sets` (one, or a list) were trained on it: with
    TransformerLens's default processing (folded norms) when a set records that, else as it is
    (transcoders/sites.py step 4). Python callers choose with `load_model(..., processing=)`; the
    command line has no such option: the sets decide, so a graph is never refused for it."""
    from attrgraph.bundled.loading import load_model

    folded = any(s.cfg.folded_norms for s in (sets if isinstance(sets, list) else [sets]))
    return load_model(name, device=device, processing=bool(folded))


def graph_sources(options: dict) -> dict:
    """What a graph's meta records of where its model and sets came from."""
    out = dict(model=str(options["model"]), transcoders=str(options["transcoders"]))
    if options.get("attn_transcoders") is not None:
        out["attn_transcoders"] = str(options["attn_transcoders"])
    return out


def attribute_options(options: dict, progress: bool) -> tuple[str, dict]:
    """The method and the `attribute` keywords for the build options in `options` (as parsed by
    `add_build_options`): only those given, since attribute() refuses what the method does not
    take; `--max-feature-nodes` alone asks for an adaptive graph."""
    method = options["method"]
    if options["max_feature_nodes"] is not None and method == "standard":
        method = "adaptive"
    given = dict(
        max_n_logits=options["max_logits"],
        desired_logit_prob=options["logit_prob"],
        tau=options["tau"],
        max_feature_nodes=options["max_feature_nodes"],
        precision=options.get("precision"),
    )
    kwargs = {k: v for k, v in given.items() if v is not None}
    if method == "standard":
        kwargs["progress"] = progress
    return method, kwargs


def _scores_from_attribute(graph):
    """The scores that `attribute` computed on the graph it returned (meta `unpruned_*_score`), so
    that the summary needs no second pass over the full graph; None when it has none."""
    from attrgraph.graph.scores import GraphScores

    keys = ("unpruned_replacement_score", "unpruned_completeness_score")
    return GraphScores(*(graph.meta[k] for k in keys)) if all(k in graph.meta for k in keys) else None


def warn_if_replacing(output, name: str | None, full: bool) -> None:
    """Say, before the work, which graphs of `output` this build will replace (same name; with
    `--full` also NAME_full): `save_graph` replaces a graph of the same name, which would otherwise
    be lost without a word."""
    import warnings
    from pathlib import Path

    from attrgraph.errors import GraphFileError, GraphReplacedWarning
    from attrgraph.graph.store import DEFAULT_NAME, list_graphs

    if not Path(output).exists():
        return
    name = DEFAULT_NAME if name is None else name
    try:
        held = set(list_graphs(output))
    except GraphFileError:
        return  # a damaged file: the save itself says what it can
    replaced = [n for n in (name, f"{name}_full") if n in held and (full or n == name)]
    if replaced:
        names, them = " and ".join(repr(n) for n in replaced), "them" if len(replaced) > 1 else "it"
        warnings.warn(
            GraphReplacedWarning(
                f"{output} already holds {names}; this build replaces {them} (pass --name to keep {them})."
            ),
            stacklevel=2,
        )


def run(args) -> int:
    from attrgraph.engine.attribute import attribute
    from attrgraph.engine.pruned_build import attribute_pruned
    from attrgraph.engine.sources import check_prompt_text, to_tokens
    from attrgraph.graph.prune import prune_graph
    from attrgraph.graph.store import DEFAULT_NAME, check_name, check_output, save_graph, save_graphs
    from attrgraph.graph.summary import format_summary, summarize
    from transcoders.config import check_device

    check_prompt_text(args.prompt)  # before loading anything
    check_build_options(vars(args))
    check_output(args.output)  # a folder, a foreign file or no write permission: before the work
    if args.name is not None:
        check_name(args.name)
    warn_if_replacing(args.output, args.name, args.full)
    check_device(args.device)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    progress = not args.no_progress and not args.json  # tqdm bars on stderr
    t0 = time.perf_counter()
    tc = load_sets(vars(args))
    model = model_for(args.model, tc, device=args.device)
    tokens = to_tokens(model, args.prompt, strict=args.strict, truncate=args.truncate)
    t1 = time.perf_counter()
    method, options = attribute_options(vars(args), progress)
    if method == "standard" and not args.full and args.node_threshold < 1:
        # the full graph is never held: its rows are streamed into pruning (engine/pruned_build.py)
        pruned = attribute_pruned(
            model,
            tc,
            tokens,
            args.node_threshold,
            args.edge_threshold,
            batch_size=args.batch_size,
            rule=args.prune_rule,
            **options,
        )
        pruned.meta.update(graph_sources(vars(args)))
        t2 = time.perf_counter()
        name = save_graph(pruned, args.output, args.name)
        prune_s = pruned.meta["pruning_seconds"]  # steps 3-4 of attribute_pruned
        times = {
            "load_s": t1 - t0,
            "attribute_s": t2 - t1 - prune_s,
            "prune_s": prune_s,
            "save_s": time.perf_counter() - t2,
        }
        m = pruned.meta
        full = {
            "n_nodes": m["unpruned_n_nodes"],
            "n_edges": m["unpruned_n_edges"],
            "n_features": m["unpruned_n_features"],
            "replacement_score": round(m["unpruned_replacement_score"], 6),
            "completeness_score": round(m["unpruned_completeness_score"], 6),
        }
    else:
        graph = attribute(model, tc, tokens, method=method, batch_size=args.batch_size, **options)
        graph.meta.update(graph_sources(vars(args)))
        t2 = time.perf_counter()
        # attribute's influence pass is pruning's first step: pass it on rather than compute it again
        pruned = prune_graph(
            graph,
            args.node_threshold,
            args.edge_threshold,
            progress=progress,
            influence=graph.nodes.influence,
            rule=args.prune_rule,
        )
        t3 = time.perf_counter()
        name = DEFAULT_NAME if args.name is None else args.name
        # one atomic write: a failure (a full disk, Ctrl-C) leaves neither graph, never the pruned one alone
        save_graphs(
            {name: pruned} | ({f"{name}_full": graph} if args.full else {}),
            args.output,
            progress=progress,
            scores={f"{name}_full": _scores_from_attribute(graph)},
        )
        times = {
            "load_s": t1 - t0,
            "attribute_s": t2 - t1,
            "prune_s": t3 - t2,
            "save_s": time.perf_counter() - t3,
        }
        full = summarize(graph, scores=_scores_from_attribute(graph))
    times = {k: round(v, 3) for k, v in times.items()} | {"total_s": round(time.perf_counter() - t0, 3)}
    small = summarize(pruned)
    if args.json:
        print(
            json.dumps(
                {"full": full, "pruned": small, "file": str(args.output), "name": name, "times": times}
            )
        )
        return 0
    print(f"prompt: {' '.join(repr(t) for t in pruned.prompt_tokens)}")
    print(f"full:   {full['n_nodes']} nodes, {full['n_edges']} edges, {full['n_features']} features")
    print(
        f"pruned: {small['n_nodes']} nodes, {small['n_edges']} edges, {small['n_features']} features "
        f"(node threshold {args.node_threshold}, edge threshold {args.edge_threshold}, "
        f"{args.prune_rule} rule)"
    )
    print(format_summary(small, title="pruned graph"))
    print(f"wrote {args.output}:/graphs/{name}" + (f" and {name}_full" if args.full else ""))
    print("wall time: " + ", ".join(f"{k[:-2]} {v:.2f} s" for k, v in times.items()))
    return 0
