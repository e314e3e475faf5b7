"""Issue 31's attack 2 against the viewer's server, measured: what unbounded and slow heads cost.

1. Serve a graph file with `attrgraph serve FILE --port 0` in its own process, from this tree and,
   with `--before COMMIT`, from that commit (benchmarks/viewer_load.py's `checkout`).
2. Big heads: `--big` connections at once, each sending a request line and 98 headers of 65,000
   bytes with no blank line (the attacker's head), then holding the connection. The server's peak
   RSS (`VmHWM` of /proc/PID/status) against its RSS before.
3. Slow heads: `--slow` connections, each sending a request line and then one header byte every
   `--every` seconds (each byte resets a socket timeout); how many the server has closed after
   10, 20 and 30 seconds.

Writes benchmarks/results/viewer_attack_memory.{json,md}. Usage:
    OMP_NUM_THREADS=1 python benchmarks/viewer_attack_memory.py --before b868f07   (about 2 min)
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.viewer_load import checkout, serve  # noqa: E402
from benchmarks.viewer_panels import build  # noqa: E402


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for {pid}")


def big_head(port: int) -> None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            s.sendall(f"GET /api/graphs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode())
            for k in range(98):
                s.sendall(f"X-Pad-{k}: ".encode() + b"a" * 65000 + b"\r\n")
            time.sleep(5)  # hold it, the head unfinished
    except OSError:
        pass  # refused and closed by the server


def big_heads(pid: int, port: int, n: int) -> dict:
    before = rss_mb(pid)
    threads = [threading.Thread(target=big_head, args=(port,)) for _ in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return dict(
        connections=n,
        rss_before_mb=before,
        peak_rss_mb=rss_mb(pid, "VmHWM"),
        seconds=time.perf_counter() - t0,
    )


def slow_heads(port: int, n: int, every: float, marks=(10, 20, 30)) -> dict:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(f"GET /api/graphs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow: ".encode())
        socks.append(s)
    open_ = set(range(n))
    t0, last_drip, closed_at = time.monotonic(), 0.0, {}
    while (now := time.monotonic() - t0) < marks[-1]:
        readable = select.select([socks[i] for i in open_], [], [], 0.2)[0]
        for s in readable:
            i = socks.index(s)
            try:
                while s.recv(65536):
                    pass
            except OSError:
                pass
            open_.discard(i)
        if now - last_drip >= every:
            last_drip = now
            for i in list(open_):
                try:
                    socks[i].sendall(b"a")
                except OSError:
                    open_.discard(i)
        for m in marks:
            if now >= m and m not in closed_at:
                closed_at[m] = n - len(open_)
    closed_at[marks[-1]] = n - len(open_)
    for s in socks:
        s.close()
    return dict(connections=n, every_s=every, closed_by_server={f"{m} s": closed_at[m] for m in marks})


def run_tree(path: Path, tree: Path, args) -> dict:
    proc, port = serve(path, tree)
    try:
        out = dict(big=big_heads(proc.pid, port, args.big))
        time.sleep(1)
        out["slow"] = slow_heads(port, args.slow, args.every)
        print(json.dumps(out), flush=True)
        return out
    finally:
        proc.terminate()
        proc.wait(30)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--big", type=int, default=100)
    p.add_argument("--slow", type=int, default=300)
    p.add_argument("--every", type=float, default=5.0)
    p.add_argument("--before", help="a commit whose server is measured too, first")
    p.add_argument("--graph", help="a file holding graph 'ioi' (default: built now)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "viewer_attack_memory"))
    args = p.parse_args(argv)
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    result: dict = dict(
        command="OMP_NUM_THREADS=1 python benchmarks/viewer_attack_memory.py"
        + (f" --before {args.before}" if args.before else "")
    )
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.graph) if args.graph else Path(tmp) / "ioi.h5"
        if not args.graph:
            build(path)
        if args.before:
            runs.append((args.before, checkout(args.before, Path(tmp) / "before")))
        runs.append((f"this tree ({head.stdout.strip() or '?'})", ROOT))
        result["runs"] = [dict(tree=name, **run_tree(path, tree, args)) for name, tree in runs]
    Path(args.out).with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        "# Viewer attack 2: unbounded and slow request heads",
        "",
        f"`{result['command']}`. Big: {args.big} connections each sending 98 headers of 65,000 bytes; "
        f"slow: {args.slow} connections each sending a header byte every {args.every:g} s.",
        "",
        "| server | RSS before | peak RSS (big heads) | slow heads closed by the server after 10 / 20 / 30 s |",
        "|---|---|---|---|",
    ]
    for r in result["runs"]:
        closed = " / ".join(str(v) for v in r["slow"]["closed_by_server"].values())
        lines.append(
            f"| {r['tree']} | {r['big']['rss_before_mb']:.0f} MB | {r['big']['peak_rss_mb']:.0f} MB | "
            f"{closed} of {r['slow']['connections']} |"
        )
    Path(args.out).with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
