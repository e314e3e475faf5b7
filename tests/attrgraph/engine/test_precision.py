"""Attribution of half-precision models: computed in float32, and how far each dtype lands from float64."""

import copy

import numpy as np
import pytest
import torch

from attrgraph.engine.attribute import attribute
from attrgraph.engine.linear_backward import linear_rows
from attrgraph.engine.precision import compute_dtype, numpy_dtype
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.engine.sources import Injection, build_sources, feature_injections
from attrgraph.engine.targets import logit_target, select_logit_targets
from tests.attrgraph.ag_helpers import tiny_attn_saes, tiny_model, tiny_transcoders

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOKENS = torch.tensor([0, 5, 9, 3, 17, 22, 5, 9, 11, 30])
# edge_max_rel (max |A - A64| / max |A64| on the common nodes) each model dtype may give, linear
# backend, on the tiny model below (measured: 3e-7, 4e-3, 3e-4); the bundled model's figures are
# in benchmarks/results/dtypes.md
TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 3e-3}


def test_compute_dtype_never_lowers_and_lifts_half_to_float32():
    assert compute_dtype(torch.float64) == torch.float64
    assert compute_dtype(torch.float32) == torch.float32
    assert compute_dtype(torch.bfloat16) == compute_dtype(torch.float16) == torch.float32
    assert numpy_dtype(torch.bfloat16) == np.float32 and numpy_dtype(torch.float64) == np.float64


def _pair():
    model = tiny_model("gpt2", torch.float32)
    return model, tiny_transcoders(model, "plt", skip=True)


def _keys(graph):
    n = graph.nodes
    return list(
        zip(n.kind.tolist(), n.layer.tolist(), n.position.tolist(), n.feature.tolist(), n.token.tolist())
    )


def edge_max_rel(graph, ref) -> float:
    where = {k: i for i, k in enumerate(_keys(graph))}
    both = [(where[k], j) for j, k in enumerate(_keys(ref)) if k in where]
    i, j = (np.array(x) for x in zip(*both))
    A = graph.dense().astype(np.float64)[np.ix_(i, i)]
    B = ref.dense().astype(np.float64)[np.ix_(j, j)]
    return float(np.abs(A - B).max() / np.abs(B).max())


@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16"])
def test_each_dtype_stays_within_its_stated_tolerance_of_float64(name):
    model, tc = _pair()
    m64, tc64 = copy.deepcopy(model).to(torch.float64), copy.deepcopy(tc).to(torch.float64)
    ref = attribute(m64, tc64, TOKENS, exclude_bos=True)
    dt = getattr(torch, name)
    m, t = model.to(dt), tc.to(dt)
    targets = [logit_target(m, int(tok)) for tok in ref.logit_tokens]
    g = attribute(m, t, TOKENS, exclude_bos=True, targets=targets, backend="linear")
    assert g.adjacency.dtype == np.float32  # half models' rows are float32 (precision.py step 2)
    assert edge_max_rel(g, ref) < TOLERANCE[name]


@pytest.mark.parametrize("attn", [False, True])
def test_a_half_model_is_attributed_in_float32(attn):
    """The linear backward of a bfloat16 model's recorded state equals the same backward in float64
    to float32 precision: the half precision is the model's, never the engine's (with an attention
    set too, whose scaled decoders are its sources' as well)."""
    model, tc = _pair()
    model, tc = model.to(torch.bfloat16), tc.to(torch.bfloat16)
    rm = ReplacementModel(model, [tc, tiny_attn_saes(model).to(torch.bfloat16)] if attn else tc)
    state = rm.run(TOKENS, exclude_bos=True)
    assert state.errors.dtype == torch.bfloat16
    rows = {}
    for dt in (None, torch.float64):
        s = state
        if dt is not None:
            floats = {
                k: v.to(dt)
                for k, v in state._asdict().items()
                if torch.is_tensor(v) and v.is_floating_point()
            }
            s = state._replace(**floats, frozen={k: v.to(dt) for k, v in state.frozen.items()})
        sources = build_sources(rm, s)
        inj = feature_injections(rm, sources.features, sources.attn) + [
            Injection(t.vector, len(TOKENS) - 1, logits=True) for t in select_logit_targets(s.logits[-1])
        ]
        rows[dt] = linear_rows(rm, s, sources, inj).toarray()
    assert rows[None].dtype == np.float32
    got, ref = rows[None].astype(np.float64), rows[torch.float64]
    assert np.abs(got - ref).max() < 1e-5 * np.abs(ref).max()
