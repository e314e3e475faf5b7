"""`attrgraph convert IN -o OUT.h5`: a graph another tool saved, stored as an attrgraph graph file,
where `show`, `serve`, `export` and `import-view` read it; `attrgraph convert FILE[:NAME] -o OUT.pt`:
one of ours written as circuit-tracer's `to_pt` writes a graph (step 4).

1. IN is a graph circuit-tracer saved with `Graph.to_pt` (`.pt`, graph/circuit_tracer_pt.py, read
   without running anything in the file) or a circuit-tracer / Neuronpedia graph JSON (`.json`,
   `.json.gz`, graph/neuronpedia.py `load_json`).
2. `--name` names the stored graph (default: IN's file name without its suffixes); a graph of that
   name in OUT is replaced (with the warning `save_graph` gives). OUT is checked before IN is read.
3. `--tokenizer` (a Hugging Face tokenizer folder or cached name) gives a `.pt` graph's token
   strings, which the file does not hold; without it the one its config names is used when cached.
4. OUT ending in `.pt`: IN is an attrgraph graph file (FILE[:NAME]: NAME, else its only graph,
   else 'graph'), written by `circuit_tracer_pt.save_pt` with the config of `--model` (default:
   the model the graph records; `load_model_config`: its config alone, no weights read);
   circuit-tracer's own `Graph.from_pt` reads it.
A graph read is stored as circuit-tracer computed it (unpruned): `attrgraph export OUT
--node-threshold 0.8 --edge-threshold 0.98` prunes it by circuit-tracer's rule, as its
`create_graph_files` does.
"""

from __future__ import annotations

from pathlib import Path

from attrgraph.errors import GraphFileError, OptionError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "convert",
        help="store a graph circuit-tracer saved (.pt, or graph JSON) as an attrgraph graph file, or write one as .pt",
    )
    p.add_argument(
        "input", metavar="IN", help="circuit-tracer graph (.pt from to_pt) or graph JSON (.json[.gz])"
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="OUT",
        help="HDF5 graph file to write or extend, or a .pt to write",
    )
    p.add_argument(
        "--name", default=None, help="name of the stored graph (default: IN's name without suffixes)"
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        metavar="PATH",
        help="tokenizer for a .pt graph's token strings (default: its config's)",
    )
    p.add_argument(
        "--model",
        default=None,
        help="writing a .pt: the graph's model, for its config (default: the one it records)",
    )


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".json", ".pt"):
        name = name.removesuffix(suffix)
    return name or "graph"


def run(args) -> int:
    from attrgraph.graph.store import check_name, check_output, save_graph

    src, out = Path(args.input), Path(args.output)
    if out.suffix == ".pt":
        return _to_pt(args, out)
    if args.model is not None:
        raise OptionError("--model is for writing a .pt (-o OUT.pt); reading one needs no model.")
    name = _stem(src) if args.name is None else args.name
    check_name(name)
    check_output(out)
    if src.name.endswith((".json", ".json.gz")):
        from attrgraph.graph.neuronpedia import load_json

        if args.tokenizer is not None:
            raise OptionError("--tokenizer is for .pt graphs; a graph JSON holds its token strings.")
        graph = load_json(src)
    elif src.suffix == ".pt":
        from attrgraph.graph.circuit_tracer_pt import load_pt

        graph = load_pt(src, tokenizer=_tokenizer(args.tokenizer))
    else:
        raise GraphFileError(
            f"{src} is neither a .pt graph (circuit-tracer's to_pt) nor a graph JSON (.json, .json.gz); "
            "pass one of them."
        )
    save_graph(graph, out, name, progress=True)
    explored = graph.meta.get("circuit_tracer_explored_features")
    note = (
        f" ({explored} of {graph.meta['circuit_tracer_active_features']} active features explored)"
        if explored
        else ""
    )
    print(
        f"wrote {out}:/graphs/{name}: {graph.n_nodes} nodes, {graph.n_edges} edges, "
        f"{graph.n_features} features{note}"
    )
    return 0


def _tokenizer(spec: str | None):
    if spec is None:
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(spec, local_files_only=True)
    except (OSError, ValueError) as e:
        reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise OptionError(
            f"--tokenizer {spec} is no tokenizer folder or cached name ({reason}); pass the folder of one."
        ) from None


def _to_pt(args, out: Path) -> int:
    """Step 4."""
    from attrgraph.bundled.loading import load_model_config
    from attrgraph.cli.export import pick_graph, split_spec
    from attrgraph.graph.circuit_tracer_pt import save_pt
    from attrgraph.graph.store import list_graphs, load_graph

    if args.tokenizer is not None or args.name is not None:
        raise OptionError(
            "--tokenizer and --name are for reading a graph; writing a .pt takes FILE[:NAME] and --model."
        )
    path, name = split_spec(args.input)
    name = pick_graph(path, name, list_graphs(path))
    graph = load_graph(path, name)
    cfg = load_model_config(args.model or graph.meta.get("model", "default"))  # its weights are not read
    save_pt(graph, out, cfg)
    size = len(graph.prompt_ids) * (int(cfg.n_layers) + 1) + graph.n_features + len(graph.logit_tokens)
    print(
        f"wrote {out}: {path}:{name} in circuit-tracer's layout ({size} nodes, {graph.n_edges} edges, "
        f"{graph.n_features} features); circuit-tracer reads it with Graph.from_pt"
    )
    return 0
