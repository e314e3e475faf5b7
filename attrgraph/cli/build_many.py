"""`attrgraph build-many PROMPTS.jsonl -o GRAPHS.h5`: one graph per prompt, built on Ray.

1. Input: one JSON object per line, `{"prompt": ..., "name": ..., "target": ...}`. `name` (default
   `prompt_<line number>`) is the graph's name in the file; `target` (optional) is one token
   (`" Mary"`: its logit) or two (`[" Mary", " John"]`: the logit difference), else the default logit
   targets. Every other option is `attrgraph build`'s, the same for all prompts.
2. Cluster: a local one (`ray.init(num_cpus=--workers)`, no dashboard, node address 127.0.0.1) unless
   `--address` names a running one (`ray start --head`; every node needs attrgraph installed), or
   Ray is already initialized in this process. `--workers` actors, one CPU each, load the model
   and transcoders once and keep them; each builds, prunes and returns graphs one prompt at a time.
3. One writer: the driver stores every result with `save_graphs` (atomic: a crash never leaves a
   half-written file), the pruned graph as NAME (and with `--full` the unpruned one as NAME_full,
   in the same write, so NAME present means the prompt is done). One run per output at a time: a run
   holds an flock on `.GRAPHS.h5.build-many.lock` (released by the kernel if the driver dies) and
   a second run on the same output stops at once with `OutputBusyError`.
4. Resumable, keyed on what was built (build_key.py): every graph records its prompt's token ids,
   target ids, options and the model and transcoder fingerprints; a prompt whose NAME is already
   in the output is skipped when that record equals this run's, else (another prompt under that
   name, another option or set) the run is refused in one line with `ResumeError` (`--resume`, the
   default) or the graph is rebuilt and replaced (`--overwrite`). A worker that dies is restarted
   by Ray and its prompt retried (by Ray, then by the driver, `ATTEMPTS` times in all); results
   are written by name, once.
5. Failures: a prompt that cannot be built (a line that is not a JSON object or lacks "prompt",
   an empty prompt, an unknown target token, a duplicate name, with `--full` a name that is another
   prompt's NAME_full, a worker that died on it every attempt) is recorded with its line number and
   error in the sidecar `GRAPHS.h5.failures.jsonl` and the rest go on; the exit code is then 1. The
   sidecar is removed when a run starts and written at the first failure, so it lists the prompts
   of the last run that are not in the file and exists only when one failed (also after a killed
   driver: no empty file).
6. An output that cannot be written (a folder, a file that is not HDF5, a folder this process cannot
   write in) is refused in one line before the run's lock is taken and before Ray starts
   (`store.check_output`, as `attrgraph build` does).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections import deque
from pathlib import Path

from attrgraph.cli.build import (
    add_build_options,
    attribute_options,
    check_build_options,
    graph_sources,
    load_sets,
    model_for,
)
from attrgraph.errors import ClusterError, OptionError, OutputBusyError, ResumeError

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Read by Ray at import: "0" keeps every Ray process of a local cluster on 127.0.0.1."""

KEYS = ("prompt", "name", "target")
"""The keys a JSONL line may hold."""
ATTEMPTS = 3
"""Tries of one prompt by the driver (each of which Ray may retry once more) before it is recorded."""
BUILD_OPTIONS = (
    "model",
    "transcoders",
    "device",
    "attn_transcoders",
    "node_threshold",
    "edge_threshold",
    "prune_rule",
    "max_logits",
    "logit_prob",
    "batch_size",
    "method",
    "tau",
    "max_feature_nodes",
    "threads",
    "full",
    "strict",
    "truncate",
    "precision",
)
"""The options of `attrgraph build` that apply to every prompt here (the test checks they match)."""


def add_parser(sub) -> None:
    p = sub.add_parser("build-many", help="build one graph per prompt of a JSONL file, on Ray")
    p.add_argument("prompts", help='JSONL file: {"prompt": ..., "name": ..., "target": ...} per line')
    p.add_argument("-o", "--output", default="graphs.h5", help="HDF5 file to write (default graphs.h5)")
    p.add_argument("--workers", type=int, default=2, help="Ray actors building graphs (default 2)")
    p.add_argument(
        "--address", default=None, help="a running Ray cluster (host:port or 'auto'); default: a local one"
    )
    add_build_options(p, threads_default=1, threads_help="torch CPU threads per worker (default 1)")
    again = p.add_mutually_exclusive_group()
    again.add_argument(
        "--resume",
        action="store_true",
        help="default: skip graphs already built the same way, refuse the run if one was built differently",
    )
    again.add_argument(
        "--overwrite",
        action="store_true",
        help="rebuild and replace graphs in the output that were built differently (or by another prompt)",
    )
    p.add_argument("--json", action="store_true", help="print the run's counts as one JSON object")
    p.add_argument("--no-progress", action="store_true")


def failures_path(output: str | os.PathLike) -> Path:
    """The sidecar where a run records the prompts it could not build."""
    return Path(f"{output}.failures.jsonl")


def _is_token(value) -> bool:
    """A target token of a JSONL line: a string or an int (JSON true/false are no ids)."""
    return isinstance(value, str | int) and not isinstance(value, bool)


def _name_error(name) -> str | None:
    """What is wrong with a line's graph name (store.check_name's sentence), or None."""
    from attrgraph.errors import GraphFileError
    from attrgraph.graph.store import check_name

    try:
        check_name(name)
    except GraphFileError as e:
        return str(e)
    return None


def read_prompts(path: str | os.PathLike, full: bool = False) -> tuple[list[dict], list[dict]]:
    """Parse a prompts file into work items `{line, name, prompt, target}` and failures
    `{line, name, error}` (lines that are not usable: not a JSON object, no string "prompt",
    unknown keys, a bad name or target, a name used before, with `full` a name that is or has
    another prompt's NAME_full). Blank lines are skipped."""
    path = Path(path)
    if path.is_dir():
        raise OptionError(f"prompts file {str(path)!r} is a folder; pass a JSONL file of {{'prompt': ...}}.")
    if not path.is_file():
        raise OptionError(
            f"prompts file {str(path)!r} does not exist; pass a JSONL file of {{'prompt': ...}}."
        )
    items, failures, seen = [], [], {}
    n_json = 0  # lines that parse as JSON
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            name, error = f"prompt_{n}", None
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                line, error = (
                    "?",
                    f"line is not UTF-8 text ({e.reason} at byte {e.start}); save the file as UTF-8.",
                )
            if not line.strip():
                continue
            try:
                row = None if error else json.loads(line)
                n_json += error is None
            except json.JSONDecodeError as e:
                row, error = None, f"line is not JSON ({e.msg}); write one JSON object per line."
            if error is None and not isinstance(row, dict):
                error = 'line is not a JSON object; write {"prompt": ...}.'
            if error is None:
                name = row.get("name", name)
                target = row.get("target")
                if not isinstance(row.get("prompt"), str):
                    error = 'line lacks a string "prompt"; write {"prompt": "some text"}.'
                elif extra := sorted(set(row) - set(KEYS)):
                    error = f"unknown keys {extra}; a line may hold only {list(KEYS)}."
                elif (bad := _name_error(name)) is not None:
                    error = bad
                elif name in seen:
                    error = f"name {name!r} is used by an earlier line; give every prompt its own name."
                elif full and (clash := _full_clash(name, seen)):
                    error = clash
                elif not (
                    target is None
                    or _is_token(target)
                    or (isinstance(target, list) and len(target) == 2 and all(map(_is_token, target)))
                ):
                    error = f'target {target!r} is neither one token nor two; write " Mary" or [" Mary", " John"].'
            if error is not None:
                failures.append({"line": n, "name": name if isinstance(name, str) else None, "error": error})
                continue
            seen[name] = n
            items.append({"line": n, "name": name, "prompt": row["prompt"], "target": target})
    if not items and not failures:
        raise OptionError(
            f"prompts file {str(path)!r} holds no prompts; write one {{'prompt': ...}} per line."
        )
    if not items and n_json == 0:  # plain text, say: one line for the file, not one failure per line
        raise OptionError(
            f"prompts file {str(path)!r} is not JSONL: line {failures[0]['line']} "
            f"{failures[0]['error'].split(';')[0].removeprefix('line ')}; write one JSON object per line, "
            'such as {"prompt": "When Mary and John went to the store"}.'
        )
    return items, failures


def _full_clash(name: str, seen: dict) -> str | None:
    """With --full, NAME_full holds NAME's unpruned graph: a name that is, or whose NAME_full is,
    an earlier line's graph would overwrite it."""
    if name.endswith("_full") and name.removesuffix("_full") in seen:
        other = name.removesuffix("_full")
        return f"name {name!r} is where --full stores the unpruned graph of {other!r} (line {seen[other]}); rename one."
    if f"{name}_full" in seen:
        return f"with --full the unpruned graph of {name!r} would overwrite {name}_full (line {seen[name + '_full']}); rename one."
    return None


def build_graphs(model, tc, item: dict, options: dict) -> dict:
    """Attribute and prune one work item with `attrgraph build`'s options: {name: graph} to store,
    the unpruned graph (with `full`) before the pruned one."""
    from attrgraph.cli.build_key import FINGERPRINTS, build_record
    from attrgraph.engine.attribute import attribute
    from attrgraph.engine.pruned_build import attribute_pruned
    from attrgraph.engine.sources import check_prompt_text, to_tokens
    from attrgraph.engine.targets import logit_difference, logit_target
    from attrgraph.graph.prune import DEFAULT_RULE, prune_graph

    check_prompt_text(item["prompt"])
    tokens = to_tokens(model, item["prompt"], strict=options["strict"], truncate=options["truncate"])
    method, kwargs = attribute_options(options, progress=False)
    target = item.get("target")
    if isinstance(target, list):
        kwargs["targets"] = [logit_difference(model, *target)]
    elif target is not None:
        kwargs["targets"] = [logit_target(model, target)]
    meta = dict(**graph_sources(options), line=item["line"])

    def record(graph) -> dict:  # build_key.py: what was built, with the fingerprints the graph records
        prints = {k: graph.meta.get(k) for k in FINGERPRINTS}
        return {**meta, "build": build_record(model, tokens, item, options, prints)}

    if method == "standard" and not options["full"] and options["node_threshold"] < 1:
        # as `attrgraph build`: the full graph's rows are streamed into pruning, never held
        pruned = attribute_pruned(
            model,
            tc,
            tokens,
            options["node_threshold"],
            options["edge_threshold"],
            batch_size=options["batch_size"],
            rule=options.get("prune_rule", DEFAULT_RULE),
            **kwargs,
        )
        pruned.meta.update(record(pruned))
        return {item["name"]: pruned}
    graph = attribute(model, tc, tokens, method=method, batch_size=options["batch_size"], **kwargs)
    graph.meta.update(record(graph))
    pruned = prune_graph(
        graph,
        options["node_threshold"],
        options["edge_threshold"],
        influence=graph.nodes.influence,
        rule=options.get("prune_rule", DEFAULT_RULE),
    )
    out = {f"{item['name']}_full": graph} if options["full"] else {}
    out[item["name"]] = pruned
    return out


class GraphWorker:
    """One Ray actor: loads the model and transcoders once, then builds graphs one prompt at a time.
    Errors of a prompt come back as a result (`error`), never as an exception, so the run goes on."""

    def __init__(self, options: dict):
        import torch

        from attrgraph.errors import AttrgraphError

        torch.set_num_threads(options["threads"])
        self.options = options
        self.error = None
        try:
            self.tc = load_sets(options)
            self.model = model_for(options["model"], self.tc, device=options.get("device", "cpu"))
        except AttrgraphError as e:  # a wrong --model or --transcoders: the driver raises it
            self.error = e

    def ready(self):
        """None once loaded, else the user's mistake that stopped the loading."""
        return self.error

    def records(self, items: list[dict]) -> list[dict]:
        """build_key.py: the record each item's build would store, or `{"error": ...}` when it cannot
        be built (its build then fails again and is recorded)."""
        from attrgraph.cli.build_key import fingerprints, item_record

        if self.error is not None:
            raise self.error
        prints = fingerprints(self.model, self.tc)
        out = []
        for item in items:
            try:
                out.append(item_record(self.model, item, self.options, prints))
            except Exception as e:
                out.append({"error": f"{type(e).__name__}: {e}"})
        return out

    def build(self, item: dict) -> dict:
        t0 = time.perf_counter()
        out = {"name": item["name"], "line": item["line"], "pid": os.getpid()}
        try:
            if self.error is not None:
                raise self.error
            out["graphs"] = build_graphs(self.model, self.tc, item, self.options)
        except Exception as e:  # any prompt's failure is recorded, the others go on
            out["error"] = f"{type(e).__name__}: {e}"
        out["seconds"] = time.perf_counter() - t0
        return out


def _gpu_share(device: str, workers: int, ray) -> float:
    """GPUs each actor asks Ray for: 0 off CUDA; else the cluster's GPUs shared over the workers (at most
    one each). Ray hides the GPUs from an actor that asks for none."""
    import torch

    try:
        if torch.device(device).type != "cuda":
            return 0
    except (RuntimeError, TypeError):
        return 0  # the workers' load_model says what is wrong with the name
    n = ray.cluster_resources().get("GPU", 0)
    if n == 0:
        raise OptionError(
            f"--device {device}: the Ray cluster has no GPU; pass --device cpu or add GPU nodes."
        )
    return min(1.0, n / workers)


def _check_reachable(address: str) -> None:
    """Ray waits minutes on an address nobody answers; a plain TCP connect says so in seconds."""
    if address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
    except (OSError, ValueError) as e:
        raise ClusterError(
            f"no Ray cluster answers at {address!r} ({e}); start one with `ray start --head` and pass its address."
        ) from None


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ClusterError(
            "build-many needs Ray, which is not installed; run pip install 'attrgraph[distributed]'."
        ) from None
    return ray


def _start_ray(workers: int, address: str | None) -> bool:
    """Initialize Ray unless it already is; True when this call started it (and must shut it down)."""
    if address is None:
        # Ray swaps 127.0.0.1 for the host's network address (services.resolve_ip_for_localhost)
        # unless its single-machine mode is on; a local cluster then binds and talks on loopback only
        os.environ.setdefault(LOOPBACK_ENV, "0")
    ray = _import_ray()
    if ray.is_initialized():
        return False
    if address is not None:
        _check_reachable(address)
        try:
            ray.init(address=address, logging_level="WARNING")
        except ConnectionError as e:
            raise ClusterError(
                f"cannot connect to the Ray cluster at {address!r} ({e}); check `ray status` there."
            ) from None
    else:
        ray.init(
            num_cpus=workers,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            logging_level="WARNING",
        )
    return True


@contextlib.contextmanager
def one_run(output: str | os.PathLike):
    """Step 3: hold `.NAME.build-many.lock` beside the output for the run (h5file.held_lock: the
    kernel drops it when the driver dies, the file goes when the run ends); a second run on the same
    output raises `OutputBusyError` at once; through a symbolic link the lock is its target's, as the
    writes are. Without fcntl (Windows), no lock."""
    from transcoders.h5file import followed, pid_lock

    output = followed(output)
    output.parent.mkdir(parents=True, exist_ok=True)

    def busy(pid: str) -> OutputBusyError:
        return OutputBusyError(
            f"another build-many run (pid {pid or 'unknown'}) is writing {output}; wait for it to end or pass another -o."
        )

    with pid_lock(output.parent / f".{output.name}.build-many.lock", busy):
        yield


def _stale(output, present: list[dict], records: list[dict], overwrite: bool) -> list[dict]:
    """Step 4: the items in `present` (already in `output`) whose stored build record differs from
    this run's `records`; refused with `ResumeError` unless `overwrite`. An item whose record could
    not be computed is returned too (its build fails again and is recorded)."""
    from attrgraph.cli.build_key import differences
    from attrgraph.graph.store import load_metas

    stored = load_metas(output)
    stale, why = [], []
    for item, record in zip(present, records):
        if "error" in record:
            stale.append(item)
            continue
        diff = differences(stored[item["name"]].get("build"), record)
        if diff:
            stale.append(item)
            why.append(f"{item['name']}: {', '.join(diff)}")
    if why and not overwrite:
        more = f"; and {len(why) - 2} more" if len(why) > 2 else ""
        raise ResumeError(
            f"{len(why)} graph(s) in {output} were built differently from this run ({'; '.join(why[:2])}{more}); "
            "pass --overwrite to rebuild them, or another -o."
        )
    return stale


def build_many(
    prompts: str | os.PathLike,
    output: str | os.PathLike,
    options: dict,
    workers: int = 2,
    address: str | None = None,
    progress: bool = True,
    on_result=None,
    overwrite: bool = False,
) -> dict:
    """Build every prompt of `prompts` not yet in `output` (as step 4 decides, `overwrite` choosing
    what a graph built differently gets) on `workers` Ray actors; returns counts
    `{built, skipped, failed, workers, write_s, seconds}` (write_s: the driver's time in save_graphs).
    `options` holds `BUILD_OPTIONS`; `on_result(result)` is called on the driver after each prompt's
    result is handled. The failures sidecar is left only when some prompt failed."""
    from attrgraph.graph.store import check_output

    if workers < 1:
        raise OptionError(f"--workers is {workers}; pass at least 1.")
    check_output(output)  # a folder, a foreign file, no write permission: one line, before the lock and Ray
    with one_run(output):
        return _build_many(prompts, output, options, workers, address, progress, on_result, overwrite)


def _build_many(prompts, output, options, workers, address, progress, on_result, overwrite) -> dict:
    from tqdm import tqdm

    from attrgraph.graph.store import list_graphs, remove_graphs, save_graphs
    from transcoders.config import check_device

    if address is None:  # a local cluster has this machine's devices (a remote one: its workers check)
        check_device(options.get("device", "cpu"))
    t0 = time.perf_counter()
    items, failures = read_prompts(prompts, full=bool(options.get("full")))
    stored = set(list_graphs(output)) if Path(output).exists() else set()
    present = [it for it in items if it["name"] in stored]
    todo = [it for it in items if it["name"] not in stored]
    if todo or present:
        _import_ray()  # without Ray: its one line, and nothing written
    side = failures_path(output)
    side.unlink(missing_ok=True)  # step 5: written at the first failure of this run
    counts = {"built": 0, "skipped": 0, "failed": 0, "workers": workers, "write_s": 0.0}

    def fail(record: dict) -> None:
        counts["failed"] += 1
        size = side.stat().st_size if side.exists() else 0
        try:
            with open(side, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as e:  # a full disk: one line (the graphs already saved stay in the output)
            from attrgraph.errors import GraphFileError
            from transcoders.h5file import write_error

            with contextlib.suppress(OSError):  # the records before stay whole; none: no sidecar
                if size:
                    os.truncate(side, size)
                else:
                    side.unlink()
            raise write_error(side, e, GraphFileError) from None

    for record in failures:
        fail(record)
    if todo or present:
        owns = _start_ray(workers, address)
        import ray

        try:
            gpus = _gpu_share(options.get("device", "cpu"), workers, ray)
            actor_cls = ray.remote(num_cpus=1, num_gpus=gpus, max_restarts=-1, max_task_retries=1)(
                GraphWorker
            )
            actors = [actor_cls.remote(options)]
            error = ray.get(actors[0].ready.remote())  # a model that cannot load stops the run here
            if error is not None:
                raise error
            if present:
                records = ray.get(actors[0].records.remote(present))
                stale = _stale(output, present, records, overwrite)
                todo += stale
                counts["skipped"] = len(present) - len(stale)
                if stale and not options.get("full"):  # an old NAME_full would outlive its NAME
                    remove_graphs(output, [f"{it['name']}_full" for it in stale])
            actors += [actor_cls.remote(options) for _ in range(min(workers, len(todo)) - 1)]
            queue = deque((it, 1) for it in todo)
            pending = {}  # in-flight task -> (item, attempt, actor index)
            done = set()

            def submit(i: int) -> None:
                if queue:
                    item, attempt = queue.popleft()
                    pending[actors[i].build.remote(item)] = (item, attempt, i)

            for i in range(len(actors)):  # two each: one running, one waiting, so no actor idles
                submit(i)
                submit(i)
            bar = tqdm(total=len(todo), unit="graph", desc="build-many", disable=not progress or not todo)
            while pending:
                [ref], _ = ray.wait(list(pending), num_returns=1)
                item, attempt, i = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayError as e:  # the worker died (Ray retried it once already)
                    if attempt < ATTEMPTS:
                        queue.appendleft((item, attempt + 1))
                        submit(i)
                        continue
                    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                    result = {
                        "name": item["name"],
                        "line": item["line"],
                        "pid": None,
                        "error": f"{type(e).__name__}: {first}",
                    }
                if "error" in result:
                    fail({"line": item["line"], "name": item["name"], "error": result["error"]})
                elif item["name"] not in done:
                    t_write = time.perf_counter()
                    save_graphs(result.pop("graphs"), output)  # NAME and NAME_full in one write
                    counts["write_s"] += time.perf_counter() - t_write
                    done.add(item["name"])
                    counts["built"] += 1
                bar.update(1)
                bar.set_postfix(failed=counts["failed"])
                if on_result is not None:
                    on_result(result)
                submit(i)
            bar.close()
        finally:
            if owns:
                ray.shutdown()
    counts["seconds"] = round(time.perf_counter() - t0, 3)
    counts["write_s"] = round(counts["write_s"], 3)
    return counts


def run(args) -> int:
    options = {k: getattr(args, k) for k in BUILD_OPTIONS}
    check_build_options(options)
    counts = build_many(
        args.prompts,
        args.output,
        options,
        workers=args.workers,
        address=args.address,
        progress=not args.no_progress and not args.json,
        overwrite=args.overwrite,
    )
    side = failures_path(args.output)
    if args.json:
        print(json.dumps({**counts, "file": str(args.output), "failures": str(side)}))
    else:
        print(
            f"built {counts['built']}, skipped {counts['skipped']} (already in {args.output}), "
            f"failed {counts['failed']}"
            + (f" (see {side})" if counts["failed"] else "")
            + f" with {counts['workers']} workers in {counts['seconds']:.1f} s"
        )
    return 1 if counts["failed"] else 0
