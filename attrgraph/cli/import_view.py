"""`attrgraph import-view LINK FILE[:NAME]`: the supernodes of a shared Neuronpedia graph link
(graph/shared_view.py), stored beside a graph (supernode_store.py), where `attrgraph serve` draws
them and `attrgraph export` writes them again.

1. LINK is a Neuronpedia graph URL (quote it: it holds `&`), its query string, or a graph JSON
   file (`.json`, `.json.gz`) whose `qParams` hold the view.
2. The graph is NAME, else the file's only graph, else the one named 'graph'; the link is read
   against it (ids it lacks are kept as keys and listed; another prompt or model is refused).
3. What is stored keeps the viewer's rules (viewer/supernode_request.py `storable`), so that the
   page can edit and save it again: members that are not nodes of this graph (pruned away here) are left
   out and listed, a supernode left without members is not stored, a node in two supernodes and a
   name the file cannot hold are refused.
4. Supernodes the graph already has are replaced only with `--replace`. Pinned nodes and labels
   (clerps) are counted, not stored: the file keeps supernodes only (`attrgraph.read_view` returns
   all three).
"""

from __future__ import annotations

from pathlib import Path

from attrgraph.errors import OptionError, ViewError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "import-view",
        help="store the supernodes of a shared Neuronpedia graph link beside a stored graph (FILE[:NAME])",
    )
    p.add_argument("link", metavar="LINK", help="graph URL (quoted), its query string, or a graph JSON file")
    p.add_argument("file", metavar="FILE[:NAME]", help="graph file, optionally :NAME of one graph in it")
    p.add_argument("--replace", action="store_true", help="replace the supernodes the graph already has")


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _source(link: str):
    from attrgraph.graph.neuronpedia import read_json_file

    path = Path(link)
    if not (path.name.endswith((".json", ".json.gz")) and path.is_file()):
        return link
    data = read_json_file(path)
    if not isinstance(data, dict) or not isinstance(data.get("qParams"), dict):
        raise ViewError(f"{path} holds no qParams; pass a graph JSON that holds a view, or the page's link.")
    return data["qParams"]


def run(args) -> int:
    from attrgraph.cli.export import pick_graph, split_spec
    from attrgraph.graph.shared_view import read_view
    from attrgraph.graph.store import list_graphs, load_graph
    from attrgraph.graph.supernode_store import load_supernodes, save_supernodes
    from attrgraph.viewer.supernode_request import storable

    path, name = split_spec(args.file)
    name = pick_graph(path, name, list_graphs(path))
    source = _source(args.link)
    graph = load_graph(path, name)
    view = read_view(source, graph)
    kept, left_out, emptied = storable(graph, view.supernodes)
    if not view.supernodes:
        raise ViewError(
            f"the link holds no supernodes ({_count(len(view.pinned), 'pinned node')}, "
            f"{_count(len(view.labels), 'label')}), "
            "so there is nothing to store; group nodes on the page first, or read the pins with attrgraph.read_view."
        )
    if not kept:
        raise ViewError(
            f"none of the link's {_count(len(view.supernodes), 'supernode')} has a member in {path}:{name} "
            "(pruned away here?); import it into the graph it was made from, or the unpruned one."
        )
    old = load_supernodes(path, name)
    if old and not args.replace:
        listed = ", ".join(repr(sn.name) for sn in old[:5]) + (", ..." if len(old) > 5 else "")
        raise OptionError(
            f"{path}:{name} already has {_count(len(old), 'supernode')} ({listed}); pass --replace to replace them "
            "with the link's."
        )
    save_supernodes(path, kept, name)
    n_members = sum(len(sn.members) for sn in kept)
    replaced = f", replacing {len(old)}" if old else ""
    print(f"{path}:{name}: stored {_count(len(kept), 'supernode')} ({_count(n_members, 'member')}){replaced}")
    for sn in kept:
        print(f"  {sn.name}: {_count(len(sn.members), 'member')}")
    if left_out:
        shown = ", ".join(str(list(m)) for m in left_out[:6]) + (", ..." if len(left_out) > 6 else "")
        print(f"left out, not nodes of this graph: {_count(len(left_out), 'member')} ({shown})")
    if emptied:
        print(f"not stored, no member in this graph: {', '.join(repr(n) for n in emptied)}")
    if view.pinned or view.labels:
        print(
            f"not stored: {_count(len(view.pinned), 'pinned node')} and {_count(len(view.labels), 'label')} "
            "(attrgraph.read_view returns them)"
        )
    return 0
