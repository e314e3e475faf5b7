"""GET /api/global?graph=NAME&node=ID[&k=K]: a feature's strongest global connections.

Seed: circuit-tracing appendix, "Interference Weights over More Features" and "Number Output
Weights for Select Features" (analysis/global_weights.py computes them). Checked first; a request
that breaks a rule raises `ViewRequestError` (a 400), nothing computed:

1. Exactly one `graph`, one `node` and at most one `k` (1 to `MAX_K`, default `DEFAULT_K`);
   `node` is the page's node id (an index into the graph's view, payload.py) of a feature node.
2. The model and sets: the graph's (model_hub.py), with their `GlobalWeights` at corpus-mean norm
   denominators.
3. The answer (`global_json`): the `k` strongest input and output virtual weights by |weight|
   (`feature_connections_json`), each with `coactive` (the pair ever fires together on one token
   of the corpus, model_hub.py step 4; null without corpus statistics, and `coactivation.note`
   says why) and `n_both`; and the `N_LOGITS` largest and smallest demeaned output weights over
   the vocabulary, with their token strings.
"""

from __future__ import annotations

from attrgraph.errors import ViewRequestError

MAX_K = 50
DEFAULT_K = 10
N_LOGITS = 10
MAX_INT = 1 << 31


def query_value(query: dict[str, list[str]], key: str, default: str | None = None) -> str:
    """The one value of `key` in a parsed query string (`default` when absent and given)."""
    values = query.get(key, [])
    if not values and default is not None:
        return default
    if len(values) != 1:
        raise ViewRequestError(f"pass exactly one {key}= (got {len(values)}).")
    return values[0]


def query_int(query: dict[str, list[str]], key: str, low: int, high: int, default: int | None = None) -> int:
    """The one integer value of `key`, in [low, high]."""
    text = query_value(query, key, None if default is None else str(default))
    if not (text.isascii() and text.isdigit()) or len(text) > 10 or not low <= int(text) <= high:
        raise ViewRequestError(f"{key}={text[:40]!r} is not an integer in [{low}, {high}].")
    return int(text)


def article(word: str) -> str:
    """`word` with "a" or "an" before it."""
    return ("an " if word[:1] in "aeiou" else "a ") + word


def parse_global(query: dict[str, list[str]]) -> tuple[str, int, int]:
    """Step 1 but the node's kind: (graph name, node id, k)."""
    return (
        query_value(query, "graph"),
        query_int(query, "node", 0, MAX_INT),
        query_int(query, "k", 1, MAX_K, DEFAULT_K),
    )


def feature_of(view, node: int) -> tuple[str, int, int]:
    """Step 1: (site, layer, feature) of node `node` of the page's view, a feature node."""
    n = view.nodes
    if not 0 <= node < view.n_nodes:
        raise ViewRequestError(f"node {node} is not a node of this graph; it has {view.n_nodes}.")
    if str(n.kind[node]) != "feature":
        raise ViewRequestError(
            f"node {node} is {article(str(n.kind[node]))} node; global connections are a feature's, pick a feature."
        )
    return ("attn" if str(n.site[node]) == "attn" else "mlp"), int(n.layer[node]), int(n.feature[node])


def _name(site: str, layer: int, feature: int) -> str:
    return f"{'A' if site == 'attn' else 'L'}{layer}/F{feature}"


def global_json(loaded, feature: tuple[str, int, int], k: int = DEFAULT_K) -> dict:
    """Steps 2-3 for `feature` with the loaded model and sets `loaded` (model_hub.Loaded)."""
    import numpy as np

    from attrgraph.analysis.global_weights import feature_connections_json
    from attrgraph.analysis.head_loadings import model_lock

    gw = loaded.global_weights()
    corpus = loaded.corpus_stats()
    with model_lock(loaded.model):
        out = feature_connections_json(gw, feature, k, None, N_LOGITS)
    me = loaded.flat(*feature)
    rows = [(d, r) for d in ("input", "output") for r in out[d]]
    pairs = np.array(
        [
            (loaded.flat(r["site"], r["layer"], r["feature"]), me)
            if d == "input"
            else (me, loaded.flat(r["site"], r["layer"], r["feature"]))
            for d, r in rows
        ],
        np.int64,
    ).reshape(-1, 2)
    co = loaded.coactivation(pairs) if len(pairs) else None
    for j, (_, r) in enumerate(rows):
        r["name"] = _name(r["site"], r["layer"], r["feature"])
        r["coactive"] = None if co is None else bool(co.n_both[j] > 0)
        r["n_both"] = None if co is None else int(co.n_both[j])
        r.pop("used", None)
    vocab = loaded.model.tokenizer
    for key in ("logits_top", "logits_bottom"):
        out[key] = [
            dict(id=int(i), token=vocab.decode([int(i)]) if vocab is not None else str(i), weight=float(v))
            for i, v in out[key]
        ]
    out["feature"]["name"] = _name(*feature)
    out["k"] = k
    out["coactivation"] = dict(
        available=corpus.acts is not None, note=corpus.note, n_positions=int(corpus.n_positions)
    )
    out["scales"] = "corpus means" if corpus.scales is not None else "raw (every norm denominator 1)"
    out["model"] = loaded.spec.to_json()
    return out
