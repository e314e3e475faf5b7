"""Whether a graph was built with the model and sets a later call passes (by their fingerprints).

A graph records its model's and sets' fingerprints (transcoders/fingerprint.py) when it is built
(engine/sources.py `graph_provenance`). Calls that recompute something of a graph from a model
(validation, head loadings, node biases, decoder supernodes) check them first: a model retrained
or edited in place since (a head zeroed in a notebook cell), or another set of the same shape,
otherwise answers for another graph without a word.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from transcoders.fingerprint import fingerprint

if TYPE_CHECKING:
    from attrgraph.graph.graph import Graph


def provenance_mismatch(graph: Graph, model, mlp, attn, attn_presence: bool = True) -> str | None:
    """Why `graph` was not built with `model`, the MLP set `mlp` and the attention set `attn` (a
    sentence for the caller's error), or None: what its provenance records (`graph_provenance`)
    against them, by fingerprint (a model None is not checked). A graph without fingerprints
    (written by hand) is taken as it is. With `attn_presence`, an attention set must be passed
    exactly when the graph was built with one (a replacement model with one replaces every
    attention output); without, a set passed is checked only against a recorded one."""
    meta = graph.meta

    def other(what: str, key: str, module) -> str | None:
        want = meta.get(key)
        got = fingerprint(module) if want and module is not None else want
        if got == want:
            return None
        return (
            f"the graph was built with {what} (fingerprint {want}; the one passed is {got}: "
            "another one, its weights edited since, or loaded in another dtype)"
        )

    has_attn = "attn_transcoder_kind" in meta or bool((graph.nodes.site == "attn").any())
    return (
        other("another model", "model_fingerprint", model)
        or other("other MLP transcoders", "transcoder_fingerprint", mlp)
        or (
            None
            if not attn_presence
            else "the graph was built with an attention SAE set, and none was passed"
            if has_attn and attn is None
            else "the graph was built without an attention SAE set, and one was passed"
            if attn is not None and not has_attn
            else None
        )
        or other("other attention SAEs", "attn_transcoder_fingerprint", attn)
    )
