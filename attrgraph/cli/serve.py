"""`attrgraph serve FILE [--port N]`: the viewer page for the graphs and circuits of FILE (viewer/).

1. Open FILE and check that it holds something to view (a clear error otherwise), and
   `--dashboards` / `--attn-dashboards` if given, before binding the port.
2. Bind `--host` (default 127.0.0.1; another address is served with a warning, an exact Host
   allowlist, `--allow-host` adds names, and a random token every API call must carry:
   viewer/access.py) and `--port` (default 8765; 0 takes a free one); a port in use is one clear
   line, exit code 2.
3. Print the URL (with the token, once), optionally open it in a browser (`--open`), serve until Ctrl-C.
4. On Ctrl-C, stop listening and give the requests being served `STOP_GRACE_S` to end. A model panel
   still computing after that is dropped with one line: the process ends at once (`os._exit`, once
   no file write is under way), since a request thread still inside torch when the interpreter
   finalizes would abort it (ViewerServer.wait_for_requests).
Model panels: a feature's global connections and an edge's head loadings are computed with the
model and sets each graph records (`attrgraph build`'s --model / --transcoders /
--attn-transcoders), loaded on the first such request; `--model`, `--transcoders` and
`--attn-transcoders` here override them for every graph (viewer/model_hub.py).
Pruning: a graph is shown as stored, pruned by `attrgraph build` with the rule it records
(circuit-tracer's by default; `build --prune-rule appendix` keeps every error node); an unpruned
graph too large to draw is shown pruned at 0.8 / 0.98 by `prune_graph`'s default rule,
circuit-tracer's (viewer/payload.py, graph/prune.py step 5).
"""

from __future__ import annotations

import os
import sys

STOP_GRACE_S = 2.0
"""Seconds the requests being served get to end after Ctrl-C (step 4)."""


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="view the graphs (and circuits) of a file in a browser, on 127.0.0.1")
    p.add_argument(
        "file",
        help="HDF5 file written by `attrgraph build` (or `attrgraph circuit --out`); graphs are shown as "
        "stored (pruned by build's --prune-rule, circuit-tracer's by default), a large unpruned one "
        "pruned by circuit-tracer's rule",
    )
    p.add_argument(
        "--port", type=int, default=8765, help="port to listen on (default 8765; 0: any free port)"
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1, this machine only; others get a warning)",
    )
    p.add_argument(
        "--dashboards",
        default=None,
        help="feature dashboards to label features with: a dashboards.h5, a transcoder folder or a "
        "bundled set name (default: the set each graph was built with, when found)",
    )
    p.add_argument(
        "--attn-dashboards",
        default=None,
        help="the same for attention features (default: those of the attention set each graph was built with)",
    )
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="another name the page may be reached by (the Host header), e.g. this machine's DNS name; repeatable",
    )
    p.add_argument(
        "--model",
        default=None,
        help="model of the feature panel's global connections and the edge panel's head loadings: "
        "'default', a model folder or a TransformerLens name (default: the one each graph was built with)",
    )
    p.add_argument(
        "--transcoders",
        default=None,
        help="the MLP transcoder set for those panels (default: the one each graph was built with)",
    )
    p.add_argument(
        "--attn-transcoders",
        default=None,
        metavar="NAME_OR_PATH",
        help="the attention SAE set for those panels (default: the one each graph was built with, if any)",
    )
    p.add_argument("--open", action="store_true", help="open the page in the default web browser")
    p.add_argument("--verbose", action="store_true", help="log every request")


def run(args) -> int:
    from attrgraph.errors import ServeError
    from attrgraph.viewer.server import make_server, warn_if_exposed

    if not 0 <= args.port <= 65535:
        raise ServeError(f"--port {args.port} is not a port; pass 0 to 65535 (0: any free port).")
    if not args.host.strip():  # "" would bind every interface while the URL printed says 127.0.0.1
        raise ServeError(
            "--host is empty; pass an address to listen on: 127.0.0.1 (this machine, the default) or 0.0.0.0 (every interface)."
        )
    server = make_server(
        args.file,
        args.host,
        args.port,
        args.dashboards,
        args.verbose,
        args.attn_dashboards,
        allow_hosts=tuple(args.allow_host),
        model=args.model,
        transcoders=args.transcoders,
        attn_transcoders=args.attn_transcoders,
    )
    warn_if_exposed(args.host)
    print(f"serving {args.file} at {server.url} (Ctrl-C to stop)", flush=True)
    if args.open:
        import webbrowser

        webbrowser.open(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    busy = server.wait_for_requests(STOP_GRACE_S)
    if busy:  # step 4
        print(
            f"attrgraph serve: stopped; {busy} request{'s' if busy > 1 else ''} still computing "
            f"(a model panel) {'were' if busy > 1 else 'was'} dropped.",
            file=sys.stderr,
        )
        with server.viewer.lock:  # a label or supernode write finishes first
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
    return 0
