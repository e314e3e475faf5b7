"""`attrgraph show FILE`: the summary of a stored graph (summary.py), as text or `--json`."""

from __future__ import annotations

import json


def add_parser(sub) -> None:
    p = sub.add_parser("show", help="print the summary of a stored graph")
    p.add_argument("file")
    p.add_argument(
        "--name", default=None, help="graph name inside the file (default: 'graph', or the only/first one)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--top", type=int, default=10, help="number of top features to list")


def run(args) -> int:
    from attrgraph.graph.store import list_graphs, load_graph
    from attrgraph.graph.summary import format_summary, summarize

    names = list_graphs(args.file)
    name = args.name
    if name is None and len(names) > 1:  # several graphs: the one `build` writes by default, else the first
        name = "graph" if "graph" in names else names[0]
    graph = load_graph(args.file, name, progress=True)  # a bar only past a second
    summary = summarize(graph, n_top=args.top)
    if args.json:
        print(json.dumps(dict(summary, name=name or names[0])))
        return 0
    print(f"{args.file}: graphs {names}")
    print(format_summary(summary, title=name or names[0]))
    return 0
