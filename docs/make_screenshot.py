"""Make docs/ioi_graph_labelled.png: the viewer (`attrgraph serve`) on the pruned IOI graph of the bundled model.

    python docs/make_screenshot.py [--out docs/ioi_graph_labelled.png]

Builds the graph with `attrgraph build PROMPT -o FILE` itself (its defaults: default-plt,
circuit-tracer's pruning rule at 0.8 / 0.98) into a temporary file, serves it on a free port of
127.0.0.1, opens the page in headless chromium (Debian's `chromium` and `chromium-driver`) as a
first look gives it (the strongest edges drawn thin, labels cut to their row), hides the error
nodes, selects the most influential feature so that its edges are drawn in full and its dashboard
fills the side panel, and saves a screenshot.
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import attrgraph
from attrgraph.viewer.server import make_server

HERE = Path(__file__).resolve().parent
PROMPT = "When Mary and John went to the store, John gave a drink to"


def build(path: Path):
    """The default build, by the CLI itself, and the graph it stored."""
    cmd = [sys.executable, "-m", "attrgraph.cli", "build", PROMPT, "-o", str(path)]
    subprocess.run(cmd, check=True, capture_output=True, cwd=HERE.parent)
    name = attrgraph.list_graphs(path)[0]
    return name, attrgraph.load_graph(path, name)


def chromium():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (browser and driver):
        raise SystemExit("needs chromium and chromedriver: apt-get install chromium chromium-driver")
    options = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"):
        options.add_argument(arg)
    options.binary_location = browser
    return webdriver.Chrome(service=Service(driver), options=options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "ioi_graph_labelled.png"))
    parser.add_argument("--width", type=int, default=1600)
    parser.add_argument("--height", type=int, default=860)
    args = parser.parse_args()

    import numpy as np
    import torch
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "graphs.h5"
        name, graph = build(path)
        feats = np.flatnonzero(graph.nodes.kind == "feature")
        top = int(feats[np.argmax(graph.nodes.influence[feats])])
        server = make_server(path, port=0)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        browser = chromium()
        try:
            browser.set_window_size(args.width, args.height)
            browser.get(server.url + f"#graph:{name}&err=0&sel={top}")
            n_shown = int((graph.nodes.kind != "error").sum())
            WebDriverWait(browser, 30).until(
                lambda b: len(b.find_elements(By.CSS_SELECTOR, "g.node")) == n_shown
            )
            WebDriverWait(browser, 120).until(
                lambda b: b.find_elements(By.CSS_SELECTOR, "#global-panel.loaded")
            )
            time.sleep(0.5)
            png = browser.get_screenshot_as_png()
        finally:
            browser.quit()
            server.shutdown()
            server.server_close()
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")  # 256 colours: a third of the bytes, same look
    image.quantize(256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE).save(
        args.out, optimize=True
    )
    print(
        f"wrote {args.out} ({Path(args.out).stat().st_size / 1e3:.0f} kB): {graph.n_nodes} nodes, "
        f"{graph.n_edges} edges, rule {graph.meta.get('prune_rule')}"
    )


if __name__ == "__main__":
    main()
