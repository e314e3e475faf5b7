"""`attrgraph circuit --task ioi|greater-than --method eap|peap|ep|hap`: find, evaluate and store a circuit."""

from __future__ import annotations

import argparse
import inspect
import json

METHOD_OPTIONS = ("edges", "sparsity", "steps", "keep_frac", "aggregation", "schema_path")
"""discover's options that only some methods read (discovery.OPTIONS); `--schema` is schema_path."""


def add_parser(sub) -> None:
    p = sub.add_parser("circuit", help="find a component-level circuit (EAP, PEAP, Edge Pruning, HAP)")
    p.add_argument("--task", choices=("ioi", "greater-than"), required=True)
    p.add_argument("--method", choices=("eap", "eap-ig", "peap", "ep", "hap"), default="eap")
    p.add_argument("--model", default="default", help="'default', a model folder, or a TransformerLens name")
    p.add_argument("--n", type=int, default=100, help="examples for discovery (as many again for evaluation)")
    # the method's options: absent unless given (SUPPRESS), so that one its method ignores is refused
    method_option = dict(default=argparse.SUPPRESS)
    p.add_argument(
        "--edges",
        type=int,
        help="circuit size for eap/peap (greedy construction; default 50)",
        **method_option,
    )
    p.add_argument(
        "--sparsity", type=float, help="target sparsity for ep/hap (default 0.95)", **method_option
    )
    p.add_argument("--steps", type=int, help="optimizer steps for ep/hap (default 200)", **method_option)
    p.add_argument(
        "--keep-frac", type=float, help="fraction of edges EAP keeps for hap (default 0.3)", **method_option
    )
    p.add_argument(
        "--aggregation", choices=("avg", "sum", "maxabs"), help="how the positions of a span combine, for peap (default avg)",
        **method_option,
    )  # fmt: skip
    p.add_argument(
        "--schema",
        help="schema JSON/CSV naming spans of the discovery examples for peap on ioi (default: the built-in IOI schema; the held-out evaluation examples always use the built-in one)",
    )
    p.add_argument("--out", help="HDF5 file to store the circuit and its scores in")
    p.add_argument("--name", help="group name in --out (default: task-method)")
    p.add_argument("--seed", type=int, default=0)


def check_options(method: str, given: dict) -> None:
    """`OptionError` naming each flag of `given` that `method` ignores (discovery.OPTIONS) and the
    methods that read it; a schema for another method is check_discovery's sentence."""
    from attrgraph.circuits.discovery import METHODS, OPTIONS
    from attrgraph.errors import OptionError

    # argparse's choices keep `method` inside OPTIONS
    wrong = [k for k in given if k != "schema_path" and k not in OPTIONS[method]]
    if wrong:
        flag = {k: "--" + k.replace("_", "-") for k in wrong}
        takers = {k: ", ".join(m for m in METHODS if k in OPTIONS[m]) for k in wrong}
        raise OptionError(
            f"--method {method} does not take {', '.join(flag.values())} "
            f"({'; '.join(f'{flag[k]} is for --method {takers[k]}' for k in wrong)}); leave it out or change --method."
        )


def run(args) -> int:
    from attrgraph.bundled.loading import load_model
    from attrgraph.circuits import discover
    from attrgraph.circuits.discovery import check_discovery
    from attrgraph.circuits.store import save_circuit
    from attrgraph.graph.store import check_name, check_output

    given = {k: getattr(args, k) for k in METHOD_OPTIONS if hasattr(args, k)}  # the flags given
    if args.schema is not None:
        given["schema_path"] = args.schema
    check_options(args.method, given)
    defaults = {k: v.default for k, v in inspect.signature(discover).parameters.items()}
    o = {**{k: defaults[k] for k in METHOD_OPTIONS}, **given}
    # what cannot run or cannot be written, in one line before the model loads
    check_discovery(
        args.task,
        args.method,
        args.n,
        o["edges"],
        o["sparsity"],
        o["steps"],
        o["keep_frac"],
        o["schema_path"],
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
        **given,
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
