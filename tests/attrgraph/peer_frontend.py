"""circuit-tracer as the judge of exported files, run in its own venv (the peer venv of
`../shared/peer/`, made by `bash install_env.sh /tmp/peer/venv`); our venv never imports it.

`PEER_PYTHON` (default /tmp/peer/venv/bin/python) names its interpreter; `require_peer()` skips a
test with the reason when it is absent. `peer_case` runs the harness (`ct_graph.py --out`): a seeded
case and circuit-tracer's graph of it, as the oracle of our own.
"""

import functools
import json
import os
import subprocess
from pathlib import Path

import pytest

PEER_PYTHON = os.environ.get("PEER_PYTHON", "/tmp/peer/venv/bin/python")
PEER_HARNESS = Path(__file__).resolve().parents[2].parent / "shared" / "peer" / "ct_graph.py"

# Validate every graph of DIR/graph-metadata.json and every feature file its nodes point to with
# circuit-tracer's own pydantic models, fetching each through its own local server by the URLs its
# frontend requests (/data/graph-metadata.json, /graph_data/<slug>.json, <scan>/<feature>.json).
CHECK = r"""
import json, sys, urllib.request
from circuit_tracer.frontend.feature_models import Model as FeatureModel
from circuit_tracer.frontend.graph_models import Model as GraphModel
from circuit_tracer.frontend.local_server import serve

out = sys.argv[1]
server = serve(data_dir=out, port=0)
port = server.httpd.server_address[1]

def get(url):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{url}") as r:
        return json.loads(r.read())

report = {"graphs": [], "feature_files": 0}
try:
    index = get("/data/graph-metadata.json")
    for entry in index["graphs"]:
        data = get(f"/graph_data/{entry['slug']}.json")
        graph = GraphModel.model_validate(data)
        scan = graph.metadata.scan
        for node in graph.nodes:
            if node.feature_type == "cross layer transcoder":
                assert scan.startswith("./"), scan
                FeatureModel.model_validate(get(f"{scan[1:]}/{node.feature}.json"))
                report["feature_files"] += 1
        report["graphs"].append(
            {"slug": entry["slug"], "nodes": len(graph.nodes), "links": len(graph.links)}
        )
finally:
    server.stop()
print(json.dumps(report))
"""

# circuit-tracer's own exporter (utils/create_graph_files.py) on a graph given as arrays in its
# node order (features, errors layer-major, embeddings, logits); token i is the word "w{i}".
CT_EXPORT = r"""
import json, os, sys
import numpy as np, torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformer_lens import HookedTransformerConfig
from circuit_tracer.attribution.targets import LogitTarget
from circuit_tracer.graph import Graph
from circuit_tracer.utils.create_graph_files import create_graph_files

arrays, out, slug, node_threshold, edge_threshold = sys.argv[1:]
a = np.load(arrays)
words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(int(a["d_vocab"]))}, unk_token="w0"))
words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tokenizer = os.path.join(os.path.dirname(arrays), "tokenizer")
PreTrainedTokenizerFast(tokenizer_object=words).save_pretrained(tokenizer)
cfg = HookedTransformerConfig(
    n_layers=int(a["n_layers"]), d_model=8, n_ctx=64, d_head=2, d_vocab=int(a["d_vocab"]),
    act_fn="relu", tokenizer_name=tokenizer,
)
feats = torch.as_tensor(a["active_features"])
graph = Graph(
    input_string="", input_tokens=torch.as_tensor(a["input_tokens"]), active_features=feats,
    adjacency_matrix=torch.as_tensor(a["adjacency"]), cfg=cfg,
    selected_features=torch.arange(len(feats)), activation_values=torch.as_tensor(a["activation_values"]),
    logit_targets=[LogitTarget(str(s), int(t)) for s, t in zip(a["logit_strings"], a["logit_tokens"])],
    logit_probabilities=torch.as_tensor(a["logit_probs"]), scan="peer",
)
create_graph_files(graph, slug, out, node_threshold=float(node_threshold), edge_threshold=float(edge_threshold))
print(json.dumps({"ok": True}))
"""


@functools.cache
def peer_python() -> str | None:
    """The peer venv's interpreter when it can import circuit-tracer's frontend models, else None."""
    if not os.access(PEER_PYTHON, os.X_OK):
        return None
    probe = [PEER_PYTHON, "-c", "import circuit_tracer.frontend.graph_models"]
    ok = subprocess.run(probe, capture_output=True, env=dict(os.environ, HF_HUB_OFFLINE="1")).returncode == 0
    return PEER_PYTHON if ok else None


def require_peer() -> str:
    python = peer_python()
    if python is None:
        pytest.skip(
            f"circuit-tracer's peer venv is absent ({PEER_PYTHON} cannot import circuit_tracer); "
            "create it with `bash ../shared/peer/install_env.sh /tmp/peer/venv` or set PEER_PYTHON"
        )
    return python


def peer_case(out: Path, args: str) -> Path:
    """`ct_graph.py ARGS --out OUT` with the peer interpreter: the weights, the prompt and
    circuit-tracer's graph in `out` (skips where the venv or the harness is absent)."""
    python = require_peer()
    if not PEER_HARNESS.is_file():
        pytest.skip(f"{PEER_HARNESS} is not beside the project")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    cmd = [python, str(PEER_HARNESS), *args.split(), "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def run_peer(script: str, *args) -> dict:
    """Run `script` with the peer interpreter; its last stdout line is JSON."""
    python = require_peer()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    res = subprocess.run([python, "-c", script, *map(str, args)], capture_output=True, text=True, env=env)
    assert res.returncode == 0, f"circuit-tracer rejected the files:\n{res.stderr[-4000:]}"
    return json.loads(res.stdout.strip().splitlines()[-1])
