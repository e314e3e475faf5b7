"""Head loadings: the parts sum to the graph's edge, each head's part equals the change of the edge
when that head's OV is zeroed under the frozen patterns and norms (brute force, finite differences
in the frozen replacement model), and heads an edge cannot pass carry exactly 0."""

import copy

import numpy as np
import pytest
import torch

from attrgraph.analysis.head_loadings import head_loadings, model_lock
from attrgraph.engine.attribute import attribute
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.errors import GraphError, OptionError
from tests.attrgraph.ag_helpers import ARCHS, BLOCK_ARCHS, tiny_attn_saes, tiny_model, tiny_transcoders

TOKENS = torch.tensor([3, 7, 1, 12, 5, 9])
SETS = ("plt", "clt", "plt+attn")


def _setup(arch, sets):
    model = tiny_model(arch, n_layers=3)
    tc = tiny_transcoders(model, sets.split("+")[0])
    tcs = [tc, tiny_attn_saes(model)] if "attn" in sets else tc
    graph = attribute(model, tcs, TOKENS, exclude_bos=False, max_n_logits=3)
    return model, tcs, graph


def _edges_of_every_kind(graph, k):
    """The k strongest edges of every (source kind, source site, target kind, target site)."""
    A = graph.adjacency.tocoo()
    n = graph.nodes
    key = np.char.add(np.char.add(n.kind[A.col], n.site[A.col]), np.char.add(n.kind[A.row], n.site[A.row]))
    out = []
    for group in np.unique(key):
        at = np.nonzero((key == group) & (A.data != 0))[0]
        at = at[np.argsort(-np.abs(A.data[at]), kind="stable")[:k]]
        out += [(int(A.row[i]), int(A.col[i])) for i in at]
    return np.array(out)


def _frozen_edge(rm, state, graph, t, s):
    n = graph.nodes
    kind, l, p = n.kind[s], int(n.layer[s]), int(n.position[s])
    kw = {}
    if kind == "feature" and n.site[s] == "attn":
        a = state.attn_acts.clone()
        a[l, p, int(n.feature[s])] = 0
        kw["attn_acts"] = a
    elif kind == "feature":
        a = state.acts.clone()
        a[l, p, int(n.feature[s])] = 0
        kw["acts"] = a
    elif kind == "error" and n.site[s] == "attn":
        e = state.attn_errors.clone()
        e[l, p] = 0
        kw["attn_errors"] = e
    elif kind == "error":
        e = state.errors.clone()
        e[l, p] = 0
        kw["errors"] = e
    else:
        e = state.embed.clone()
        e[p] = 0
        kw["embed"] = e

    def value(out):
        tl, tp = int(n.layer[t]), int(n.position[t])
        if n.kind[t] == "logit":
            x = out.logits[tp]
            return float(x[int(n.token[t])] - x.mean())
        pre = out.attn_pre_acts if n.site[t] == "attn" else out.pre_acts
        return float(pre[tl, tp, int(n.feature[t])])

    return value(rm.forward(state)) - value(rm.forward(state, **kw))


def _without_heads(model, tcs, layer, heads):
    m = copy.deepcopy(model)
    with torch.no_grad():
        m.blocks[layer].attn.W_O[list(heads)] = 0.0
    return ReplacementModel(
        m, [copy.deepcopy(x) for x in tcs] if isinstance(tcs, list) else copy.deepcopy(tcs)
    )


@pytest.mark.parametrize("arch", ARCHS + BLOCK_ARCHS)
@pytest.mark.parametrize("sets", SETS)
def test_parts_sum_to_the_graph_edge(arch, sets, one_torch_thread):
    model, tcs, graph = _setup(arch, sets)
    hl = head_loadings(model, tcs, graph, _edges_of_every_kind(graph, 8), batch_size=16)
    A = graph.adjacency.toarray()
    edge = A[hl.edges[:, 0], hl.edges[:, 1]]
    kinds = set(zip(graph.nodes.kind[hl.edges[:, 1]], graph.nodes.site[hl.edges[:, 1]]))
    assert {("embedding", ""), ("error", "mlp"), ("feature", "mlp")} <= kinds
    assert ("feature", "attn") in kinds or "attn" not in sets
    assert np.abs(hl.heads).max() > 0
    scale = np.abs(edge)
    for l in range(model.cfg.n_layers):
        parts = hl.heads[:, l].sum(-1) + hl.bypass[:, l]
        assert np.all(np.abs(parts - edge) <= 1e-6 * scale)
    assert np.all(np.abs(hl.edge - edge) <= 1e-6 * scale)


@pytest.mark.parametrize("arch", ARCHS + BLOCK_ARCHS)
@pytest.mark.parametrize("sets", SETS)
def test_zeroing_a_heads_ov_changes_the_edge_by_its_loading(arch, sets, one_torch_thread):
    model, tcs, graph = _setup(arch, sets)
    hl = head_loadings(model, tcs, graph, _edges_of_every_kind(graph, 3))
    # per kind of source, one edge whose split is not trivial (two heads or more carry a part)
    rich, seen = [], set()
    for i in range(len(hl.edge)):
        key = (graph.nodes.kind[hl.edges[i, 1]], graph.nodes.site[hl.edges[i, 1]])
        if key not in seen and (np.abs(hl.heads[i]) > 1e-3 * abs(hl.edge[i])).sum() >= 2:
            rich.append(i)
            seen.add(key)
    assert len(rich) >= 2
    rm = ReplacementModel(model, tcs)
    state = rm.run(TOKENS, exclude_bos=False)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    for i in rich:
        t, s = (int(x) for x in hl.edges[i])
        full = _frozen_edge(rm, state, graph, t, s)
        assert full == pytest.approx(hl.edge[i], rel=1e-6)
        for l in range(L):
            for h in range(H):
                cut = _frozen_edge(_without_heads(model, tcs, l, [h]), state, graph, t, s)
                assert full - cut == pytest.approx(hl.heads[i, l, h], rel=1e-6, abs=1e-9 * abs(full))
            # all heads of the layer zeroed: what is left is the bypass
            cut = _frozen_edge(_without_heads(model, tcs, l, range(H)), state, graph, t, s)
            assert cut == pytest.approx(hl.bypass[i, l], rel=1e-6, abs=1e-9 * abs(full))


def _first_attention_layer_on_path(kind, site, layer):
    """Attention layers >= this are after the source's write (embeddings: 0)."""
    if kind == "embedding":
        return 0
    return layer + 1  # an MLP or attention feature / error of layer l writes after attention l


def _last_attention_layer_on_path(kind, site, layer, n_layers):
    if kind == "logit":
        return n_layers - 1
    return layer  # both an MLP and an attention feature of layer l read after attention l


@pytest.mark.parametrize("sets", SETS)
def test_heads_of_layers_off_the_path_get_exactly_zero(sets, one_torch_thread):
    model, tcs, graph = _setup("llama", sets)
    hl = head_loadings(model, tcs, graph, _edges_of_every_kind(graph, 10))
    n = graph.nodes
    L = model.cfg.n_layers
    off = 0
    for i, (t, s) in enumerate(hl.edges.tolist()):
        lo = _first_attention_layer_on_path(n.kind[s], n.site[s], int(n.layer[s]))
        hi = _last_attention_layer_on_path(n.kind[t], n.site[t], int(n.layer[t]), L)
        for l in range(L):
            if not lo <= l <= hi:
                assert np.all(hl.heads[i, l] == 0.0), (i, l)
                assert hl.bypass[i, l] == hl.edge[i]
                off += 1
        if "attn" in sets and n.kind[t] == "feature" and n.site[t] == "mlp":
            assert np.all(hl.heads[i] == 0.0)  # attention outputs are replaced: no path through a head
    assert off > 0


def test_wrong_sets_and_nodes_are_refused():
    model, tcs, graph = _setup("gpt2", "plt")
    other = tiny_transcoders(model, "plt", seed=5)
    with pytest.raises(GraphError, match="other MLP transcoders"):
        head_loadings(model, other, graph, top=1)
    emb = int(np.nonzero(graph.nodes.kind == "embedding")[0][0])
    with pytest.raises(OptionError, match="no inputs"):
        head_loadings(model, tcs, graph, edges=[(emb, emb)])
    with pytest.raises(OptionError, match="outside"):
        head_loadings(model, tcs, graph, edges=[(10_000, 0)])
    assert model_lock(model) is model_lock(model)
