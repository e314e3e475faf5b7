"""`attrgraph circuit --task ioi|greater-than --method eap|peap|ep|hap`: find, evaluate and store a circuit."""

from __future__ import annotations

import json


def add_parser(sub) -> None:
    p = sub.add_parser("circuit", help="find a component-level circuit (EAP, PEAP, Edge Pruning, HAP)")
    p.add_argument("--task", choices=("ioi", "greater-than"), required=True)
    p.add_argument("--method", choices=("eap", "eap-ig", "peap", "ep", "hap"), default="eap")
    p.add_argument("--model", default="default", help="'default', a model folder, or a TransformerLens name")
    p.add_argument("--n", type=int, default=100, help="examples for discovery (as many again for evaluation)")
    p.add_argument("--edges", type=int, default=50, help="circuit size for eap/peap (greedy construction)")
    p.add_argument("--sparsity", type=float, default=0.95, help="target sparsity for ep/hap")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps for ep/hap")
    p.add_argument("--keep-frac", type=float, default=0.3, help="fraction of edges EAP keeps for hap")
    p.add_argument("--aggregation", choices=("avg", "sum", "maxabs"), default="avg")
    p.add_argument(
        "--schema",
        help="schema JSON/CSV naming spans of the discovery examples for peap on ioi (default: the built-in IOI schema; the held-out evaluation examples always use the built-in one)",
    )
    p.add_argument("--out", help="HDF5 file to store the circuit and its scores in")
    p.add_argument("--name", help="group name in --out (default: task-method)")
    p.add_argument("--seed", type=int, default=0)


def run(args) -> int:
    from attrgraph.bundled.loading import load_model
    from attrgraph.circuits import discover
    from attrgraph.circuits.discovery import check_discovery
    from attrgraph.circuits.store import save_circuit
    from attrgraph.graph.store import check_name, check_output

    # what cannot run or cannot be written, in one line before the model loads
    check_discovery(
        args.task, args.method, args.n, args.edges, args.sparsity, args.steps, args.keep_frac, args.schema
    )
    name = args.name or f"{args.task}-{args.method}"
    if args.out:
        check_output(args.out, kind="circuit")
        check_name(name, kind="circuit")
    model = load_model(args.model)
    result = discover(
        model,
        args.task,
        args.method,
        n=args.n,
        edges=args.edges,
        sparsity=args.sparsity,
        steps=args.steps,
        keep_frac=args.keep_frac,
        aggregation=args.aggregation,
        schema_path=args.schema,
        seed=args.seed,
    )
    print(
        json.dumps(
            {
                "edges": result.circuit.n_edges,
                "seconds": round(result.seconds, 2),
                **result.faithfulness._asdict(),
            },
            indent=1,
        )
    )
    if args.out:
        save_circuit(result.circuit, args.out, name, result.scores)
        print(f"wrote circuit {name!r} to {args.out}")
    return 0
