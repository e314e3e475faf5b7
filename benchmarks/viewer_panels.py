"""The viewer's model panels over HTTP: first and repeated /api/global and /api/heads.

1. Build the pruned IOI graph of the bundled model with `default-plt` (as `attrgraph build` does,
   recording model and set) into a temporary file.
2. Serve it (`make_server`, 127.0.0.1, a thread) in a fresh process for each order: global
   connections first, then head loadings first. Ask for `--n` features (spread over the layers) and the `--n` strongest
   edges, each twice: the first call of a server loads the model and sets (and, for /api/global,
   reads the corpus: model_hub.py step 4); a further one computes; a repeated one is answered
   from the cache. Wall-clock time per request, from the client.

Writes benchmarks/results/viewer_panels.{json,md}. Usage:
    OMP_NUM_THREADS=1 python benchmarks/viewer_panels.py   (about 30 s)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

PROMPT = "When Mary and John went to the store, John gave a drink to"


def build(path: Path) -> None:
    from attrgraph.bundled.loading import load_model
    from attrgraph.engine.attribute import attribute
    from attrgraph.graph.prune import prune_graph
    from attrgraph.graph.store import save_graph
    from transcoders.formats import load_transcoders

    graph = attribute(load_model("default"), load_transcoders("default-plt"), PROMPT, progress=False)
    graph.meta.update(model="default", transcoders="default-plt")
    save_graph(prune_graph(graph, 0.8, 0.98), path, "ioi")


def get(port: int, url: str) -> float:
    import http.client

    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("GET", url, headers={"X-Attrgraph-Page": "1"})  # access.py step 4
    r = conn.getresponse()
    body = r.read()
    conn.close()
    if r.status != 200:
        raise RuntimeError(f"{url}: {r.status} {body[:200]!r}")
    return time.perf_counter() - t0


def serve_and_time(path: Path, first: list[str], then: list[str]) -> list[dict]:
    from attrgraph.viewer.server import make_server

    server = make_server(path, port=0)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        rows = []
        for urls in (first, then):
            for i, url in enumerate(urls):
                a = get(port, url)
                rows.append(dict(url=url, first=a, repeated=get(port, url), first_of_kind=i == 0))
        return rows
    finally:
        server.shutdown()
        server.server_close()


def main(argv=None) -> int:
    import scipy.sparse as sp

    from attrgraph.graph.store import load_graph

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=5, help="features and edges asked for")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "viewer_panels"))
    p.add_argument("--one", nargs=2, metavar=("GRAPH", "ORDER"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.one:  # one order in this fresh process; rows as JSON on stdout
        import transformer_lens  # noqa: F401  (imports out of the timings)

        path = Path(args.one[0])
        g = load_graph(path, "ioi")
        feats = np.flatnonzero(g.nodes.kind == "feature")
        picks = feats[np.linspace(0, len(feats) - 1, args.n).astype(int)]
        A = sp.coo_array(g.adjacency)
        order = np.argsort(-np.abs(A.data), kind="stable")[: args.n]
        glob = [f"/api/global?graph=ioi&node={int(f)}" for f in picks]
        heads = [f"/api/heads?graph=ioi&source={int(A.col[j])}&target={int(A.row[j])}" for j in order]
        rows = serve_and_time(path, *((glob, heads) if args.one[1] == "global" else (heads, glob)))
        print(json.dumps(rows))
        return 0

    import subprocess

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ioi.h5"
        build(path)
        g = load_graph(path, "ioi")
        runs = {}
        for first in ("global", "heads"):
            cmd = [sys.executable, __file__, "--n", str(args.n), "--one", str(path), first]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs[f"{first} first"] = json.loads(done.stdout.strip().splitlines()[-1])

    def summary(rows, kind):
        mine = [r for r in rows if f"/api/{kind}?" in r["url"]]
        cold = [r["first"] for r in mine if r["first_of_kind"]]
        warm = [r["first"] for r in mine if not r["first_of_kind"]]
        return dict(
            cold_s=cold[0],
            first_ms=[1000 * min(warm), 1000 * max(warm)],
            repeated_ms=[1000 * min(r["repeated"] for r in mine), 1000 * max(r["repeated"] for r in mine)],
        )

    out = {order: {k: summary(rows, k) for k in ("global", "heads")} for order, rows in runs.items()}
    load = os.getloadavg()
    meta = dict(
        command="OMP_NUM_THREADS=1 python benchmarks/viewer_panels.py",
        n=args.n,
        graph=f"pruned IOI graph, bundled model, default-plt: {g.n_nodes} nodes, {g.n_edges} edges",
        load_average=[round(x, 2) for x in load],
        cpus=os.cpu_count(),
    )
    Path(args.out).with_suffix(".json").write_text(
        json.dumps(dict(meta=meta, results=out, runs=runs), indent=1)
    )
    gf, hf = out["global first"], out["heads first"]
    lines = [
        "# The viewer's model panels over HTTP",
        "",
        f"`{meta['command']}`; {meta['graph']}; {args.n} features and edges, each asked twice; "
        f"load average {load[0]:.1f} on {meta['cpus']} cores.",
        "",
        "| request | first of a server (loads the model) | a further one | repeated (cached) |",
        "|---|---|---|---|",
        f"| /api/global | {gf['global']['cold_s']:.1f} s | {gf['global']['first_ms'][0]:.0f}-"
        f"{gf['global']['first_ms'][1]:.0f} ms | {gf['global']['repeated_ms'][0]:.1f}-"
        f"{gf['global']['repeated_ms'][1]:.1f} ms |",
        f"| /api/heads | {hf['heads']['cold_s']:.2f} s | {hf['heads']['first_ms'][0]:.0f}-"
        f"{hf['heads']['first_ms'][1]:.0f} ms | {hf['heads']['repeated_ms'][0]:.1f}-"
        f"{hf['heads']['repeated_ms'][1]:.1f} ms |",
        "",
        f"After the model was loaded by the other panel: the first /api/global "
        f"{hf['global']['cold_s']:.1f} s (the corpus pass), the first /api/heads {gf['heads']['cold_s']:.2f} s.",
    ]
    Path(args.out).with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
