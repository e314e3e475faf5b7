"""`attrgraph show FILE[:NAME]`: the summary of a stored graph (summary.py), as text or `--json`.
The graph is NAME (as `export` takes it) or `--name`, else 'graph', else the only/first one."""

from __future__ import annotations

import json

from attrgraph.errors import OptionError


def add_parser(sub) -> None:
    p = sub.add_parser("show", help="print the summary of a stored graph (FILE[:NAME])")
    p.add_argument("file", metavar="FILE[:NAME]", help="graph file, optionally :NAME of one graph in it")
    p.add_argument(
        "--name", default=None, help="graph name inside the file (default: 'graph', or the only/first one)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--top", type=int, default=10, help="number of top features to list")


def run(args) -> int:
    from attrgraph.cli.export import split_spec
    from attrgraph.graph.store import list_graphs, load_graph
    from attrgraph.graph.summary import format_summary, summarize

    if args.top < 0:
        raise OptionError(f"--top is {args.top}; pass 0 or more features to list.")
    path, name = split_spec(args.file)
    if name is not None and args.name is not None and name != args.name:
        raise OptionError(
            f"{args.file} names graph {name!r} but --name says {args.name!r}; pass one of them."
        )
    name = name if name is not None else args.name
    names = list_graphs(path)
    if name is None and len(names) > 1:  # several graphs: the one `build` writes by default, else the first
        name = "graph" if "graph" in names else names[0]
    graph = load_graph(path, name, progress=True)  # a bar only past a second
    summary = summarize(graph, n_top=args.top)
    if args.json:
        print(json.dumps(dict(summary, name=name or names[0])))
        return 0
    print(f"{path}: graphs {names}")
    print(format_summary(summary, title=name or names[0]))
    return 0
