"""`attrgraph validate FILE`: validate stored graphs by interventions (analysis/validate.py) and
write the report with plots (analysis/validation_report.py). A tqdm bar per graph on stderr counts
its ablations and perturbations (`--no-progress`: none); a file without graphs is one line."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from attrgraph.analysis.validate import ValidateConfig
from attrgraph.errors import GraphFileError, OptionError, ValidationError

_SIZES = ("max_features", "n_perturbations", "batch_size")
"""ValidateConfig's sizes, each a flag of the same name."""


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="validate stored graphs by interventions; write a report with plots")
    p.add_argument("file")
    p.add_argument("--name", default=None, help="graph to validate (default: every graph in the file)")
    p.add_argument(
        "--model", default=None, help="model (default: the one recorded in the graph, else 'default')"
    )
    p.add_argument(
        "--transcoders", default=None, help="transcoders (default: recorded in the graph, else 'default-plt')"
    )
    p.add_argument(
        "--attn-transcoders",
        default=None,
        metavar="NAME_OR_PATH",
        help="attention SAEs (default: recorded in the graph by build --attn-transcoders, else none)",
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="where the model and transcoders run: cpu (default), cuda, cuda:N, mps",
    )
    p.add_argument("-o", "--out", default=None, help="report folder (default: FILE's name + '_validation')")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (one per graph, on stderr)")
    for f in (*_SIZES, "seed"):
        p.add_argument("--" + f.replace("_", "-"), type=int, default=getattr(ValidateConfig, f))


def _config(args) -> ValidateConfig:
    """The config from the flags; a size it refuses is named by its flag, before anything loads."""
    given = {f: getattr(args, f) for f in (*_SIZES, "seed")}
    try:
        return ValidateConfig(**given)
    except ValidationError as e:
        msg = str(e)
        for f in _SIZES:
            msg = msg.replace(f, "--" + f.replace("_", "-"))
        raise OptionError(msg.replace("fix the config", "fix the flag")) from None


def run(args) -> int:
    from attrgraph.analysis.validate import validate_graph
    from attrgraph.analysis.validation_report import write_report
    from attrgraph.cli.build import model_for
    from attrgraph.engine.replacement import ReplacementModel
    from attrgraph.graph.store import list_graphs, load_graph
    from transcoders import load_transcoders
    from transcoders.config import check_device
    from transcoders.output_folder import check_output_folder

    check_device(args.device)  # before reading anything
    cfg = _config(args)
    names = [args.name] if args.name else list_graphs(args.file)
    if not names:
        raise GraphFileError(
            f"{args.file} holds no graphs (a circuit-only file?); write one with `attrgraph build` first."
        )
    out = Path(args.out) if args.out else Path(args.file).with_name(Path(args.file).stem + "_validation")
    check_output_folder(out, OptionError)  # a file there, or no write permission: before the work
    graphs = [load_graph(args.file, n) for n in names]
    model_name = args.model or graphs[0].meta.get("model", "default")
    tc_name = args.transcoders or graphs[0].meta.get("transcoders", "default-plt")
    attn_name = args.attn_transcoders or graphs[0].meta.get("attn_transcoders")
    tc = load_transcoders(tc_name, device=args.device)
    if attn_name:
        tc = [tc, load_transcoders(attn_name, device=args.device)]
    model = model_for(model_name, tc, device=args.device)
    rm = ReplacementModel(model, tc)
    results = [validate_graph(model, rm, g, cfg, progress=not args.no_progress) for g in graphs]
    summary = write_report(results, names, out, title=f"validation of {args.file}")
    print(json.dumps(summary, indent=1))
    print(f"wrote {out}/validate.md, validate.json and 3 plots (config {asdict(cfg)})")
    return 0
