"""`attrgraph export FILE[:NAME] --format neuronpedia -o DIR`: stored graphs as the graph JSON of
circuit-tracer's local frontend and Neuronpedia (graph/neuronpedia.py).

1. Pick the graphs: NAME, or every graph in FILE; check them all before writing anything.
2. For each, its supernodes (supernode_store.py) go to `qParams.supernodes`. A pruned graph (what
   `attrgraph build` stores) is written as it is, with the thresholds, rule and unpruned influence
   it stored: the same file as its unpruned graph with those thresholds; other thresholds or
   another rule for it are refused (it is never pruned twice). An unpruned graph with
   `--node-threshold` / `--edge-threshold` is pruned first by `--prune-rule`, circuit-tracer's
   by default (as its `create_graph_files` does; `appendix` keeps every error node that has a
   link); the rule goes to the file's `metadata.pruning_settings`.
3. Fill the feature files from `--dashboards PATH`, else from the dashboards of the graph's
   transcoder set when they are found (graph/dashboard_lookup.py; one warning line when not: the
   files then have no examples); attention features' from `--attn-dashboards PATH`, else its
   attention set's.
4. Write `DIR/graph-metadata.json`, `DIR/<slug>.json` and `DIR/features/...`; print one line per graph.
"""

from __future__ import annotations

import os
from pathlib import Path

from attrgraph.errors import ExportError, GraphFileError, OptionError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "export", help="write stored graphs as circuit-tracer / Neuronpedia graph JSON (FILE[:NAME])"
    )
    p.add_argument("file", metavar="FILE[:NAME]", help="graph file, optionally :NAME of one graph in it")
    p.add_argument("--format", choices=("neuronpedia",), default="neuronpedia", help="output format")
    p.add_argument("-o", "--output", required=True, help="folder to write (created if missing)")
    p.add_argument("--slug", default=None, help="file name of the graph JSON (default: the graph's name)")
    p.add_argument(
        "--scan", default=None, help="metadata.scan (default ./data/features/<transcoders>: local features)"
    )
    p.add_argument("--node-threshold", type=float, default=None, help="prune before export (e.g. 0.8)")
    p.add_argument("--edge-threshold", type=float, default=None, help="prune before export (e.g. 0.98)")
    p.add_argument(
        "--prune-rule",
        choices=("circuit-tracer", "appendix"),
        default=None,
        help="rule of that pruning: circuit-tracer (default; errors pruned by influence, features "
        "without inputs dropped) or appendix (error nodes never pruned)",
    )
    p.add_argument(
        "--dashboards",
        default=None,
        metavar="PATH",
        help="dashboards.h5 (or a set folder or bundled name) filling the feature files (default: the "
        "one of the graph's transcoder set)",
    )
    p.add_argument(
        "--attn-dashboards",
        default=None,
        metavar="PATH",
        help="the same for the attention features' files (default: the one of the graph's attention set)",
    )
    p.add_argument(
        "--feature-url",
        default=None,
        metavar="URL",
        help="URL DIR will be served from: metadata.feature_details for Neuronpedia",
    )


def split_spec(spec: str) -> tuple[str, str | None]:
    """`FILE[:NAME]` -> (FILE, NAME or None); a path that exists as given is a file without a name."""
    if os.path.exists(spec) or ":" not in spec:
        return spec, None
    path, name = spec.rsplit(":", 1)
    return path, name or None


def pick_graph(path: str, name: str | None, names: list[str]) -> str:
    """The one graph a command acts on: NAME, else the file's only graph, else the one named 'graph'."""
    if not names:
        raise GraphFileError(f"{path} holds no graphs; write one with `attrgraph build` first.")
    if name is not None:
        if name not in names:
            raise GraphFileError(f"{path} has no graph named {name!r}; it holds {names}.")
        return name
    if len(names) == 1:
        return names[0]
    if "graph" in names:
        return "graph"
    raise OptionError(f"{path} holds {len(names)} graphs ({names}); name one as {path}:NAME.")


def run(args) -> int:
    from attrgraph.graph.neuronpedia import check_export_options, export_json
    from attrgraph.graph.store import list_graphs, load_graph, load_meta
    from attrgraph.graph.supernode_store import load_supernodes
    from transcoders.output_folder import check_output_folder

    path, name = split_spec(args.file)
    out = Path(args.output)
    check_output_folder(out, ExportError)
    names = list_graphs(path)
    if not names:
        raise GraphFileError(f"{path} holds no graphs; write one with `attrgraph build` first.")
    if name is not None and name not in names:
        raise GraphFileError(f"{path} has no graph named {name!r}; it holds {names}.")
    chosen = [name] if name is not None else names
    if args.slug is not None and len(chosen) > 1:
        raise ExportError(
            f"--slug names one graph but {path} holds {len(chosen)}; pick one with {path}:NAME."
        )
    for graph_name in chosen:  # before anything is written
        try:
            check_export_options(
                load_meta(path, graph_name), args.node_threshold, args.edge_threshold, args.prune_rule
            )
        except ExportError as e:
            raise ExportError(f"{path}:{graph_name}: {e}") from None
    from attrgraph.graph.dashboard_lookup import find_dashboards

    given = {}  # read once, and before anything is written
    for site, spec in (("mlp", args.dashboards), ("attn", args.attn_dashboards)):
        given[site] = None if spec is None else find_dashboards({}, site, spec).dashboards
    for graph_name in chosen:
        graph = load_graph(path, graph_name)
        result = export_json(
            graph,
            out,
            slug=graph_name if args.slug is None else args.slug,  # "" is refused as any non-name
            scan=args.scan,
            supernodes=load_supernodes(path, graph_name),
            node_threshold=args.node_threshold,
            edge_threshold=args.edge_threshold,
            prune_rule=args.prune_rule,
            dashboards=given["mlp"],
            feature_url=args.feature_url,
            attn_dashboards=given["attn"],
        )
        dropped = (
            f", {result.n_dropped_members} supernode members not in the graph left out"
            if result.n_dropped_members
            else ""
        )
        found = [str(p) for p in (result.dashboards, result.attn_dashboards) if p is not None]
        source = f" (examples from {' and '.join(found)})" if found else " (no examples)"
        print(
            f"wrote {result.path}: {result.n_nodes} nodes, {result.n_links} links, "
            f"{result.n_feature_files} feature files{source}{dropped}"
        )
    print(f"index: {out / 'graph-metadata.json'}")
    return 0
