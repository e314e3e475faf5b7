"""What a `build-many` graph was built from, recorded in its meta and compared when a run resumes.

1. The record (`meta["build"]` of every graph build-many writes, NAME and NAME_full): the prompt's
   token ids (after `--strict` / `--truncate`), the target's token ids (none: the default logit
   targets), every option in `KEY_OPTIONS` (a default left out recorded as its value, `key_options`),
   and the fingerprints (transcoders/fingerprint.py) of the model and of each transcoder set, which stand
   for `--model`, `--transcoders` and `--attn-transcoders` (a moved folder is the same set, a
   retrained one in the same folder is not).
   `SPEED_OPTIONS` change how fast a graph is built, not what is built, and are not recorded.
2. Resume: a worker computes the record of every prompt whose name is already in the output, and
   the driver compares it with the stored one (`differences`): equal records are skipped; a graph
   whose record differs, or that has none (written by `attrgraph build` or an older build-many), is
   refused in one line (`--resume`, the default) or rebuilt and replaced (`--overwrite`).
"""

from __future__ import annotations

import json
import warnings

KEY_OPTIONS = (
    "node_threshold",
    "edge_threshold",
    "max_logits",
    "logit_prob",
    "method",
    "tau",
    "max_feature_nodes",
    "full",
    "prune_rule",
    "strict",
    "truncate",
    "precision",
)
"""Build options that decide what graph is built: recorded and compared."""
SOURCE_OPTIONS = ("model", "transcoders", "attn_transcoders")
"""Build options recorded by what they load: the fingerprints."""
SPEED_OPTIONS = ("device", "threads", "batch_size")
"""Build options that decide only how fast (and on what) a graph is built."""
FINGERPRINTS = ("model_fingerprint", "transcoder_fingerprint", "attn_transcoder_fingerprint")


def fingerprints(model, sets) -> dict:
    """Step 1: the fingerprints of the model and of its sets (`None` for a missing attention set),
    as `graph_provenance` records them."""
    from attrgraph.engine.sets import transcoder_sets
    from transcoders.fingerprint import fingerprint

    s = transcoder_sets(model, sets)
    return dict(
        model_fingerprint=fingerprint(model),
        transcoder_fingerprint=fingerprint(s.mlp),
        attn_transcoder_fingerprint=None if s.attn is None else fingerprint(s.attn),
    )


def target_ids(model, target) -> list[int] | None:
    """The token ids of an item's target (one: a logit, two: a logit difference), None for the default."""
    from attrgraph.engine.targets import logit_target

    if target is None:
        return None
    return [logit_target(model, t).token for t in (target if isinstance(target, list) else [target])]


def key_options(options: dict) -> dict:
    """Step 1: the `KEY_OPTIONS` of `options` as the build uses them: an option left out is its
    default (`--max-logits` 10, `--logit-prob` 0.95: engine/targets.py; `--tau` 0; `--precision` fp32) and
    `--max-feature-nodes` with the standard method is the adaptive method (build.attribute_options),
    so a run that passes a default explicitly keys the same graph as one that leaves it out."""
    from attrgraph.engine.targets import DESIRED_LOGIT_PROB, MAX_N_LOGITS

    out = {k: options.get(k) for k in KEY_OPTIONS}
    defaults = (
        ("max_logits", MAX_N_LOGITS),
        ("logit_prob", DESIRED_LOGIT_PROB),
        ("tau", 0.0),
        ("precision", "fp32"),
    )
    for key, default in defaults:
        if out[key] is None:
            out[key] = default
    if out["max_feature_nodes"] is not None and out["method"] == "standard":
        out["method"] = "adaptive"
    return out


def build_record(model, tokens, item: dict, options: dict, prints: dict) -> dict:
    """Step 1's record of one item, as plain JSON values."""
    return dict(
        prompt_ids=[int(t) for t in tokens.tolist()],
        target=target_ids(model, item.get("target")),
        options=key_options(options),
        **prints,
    )


def item_record(model, item: dict, options: dict, prints: dict) -> dict:
    """The record of an item as its build would make it (tokens included); raises what that build would."""
    from attrgraph.engine.sources import to_tokens

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the build itself warns about unknown words
        tokens = to_tokens(model, item["prompt"], strict=options["strict"], truncate=options["truncate"])
    return build_record(model, tokens, item, options, prints)


def differences(stored: dict | None, expected: dict) -> list[str]:
    """Step 2: what differs between a stored record and this run's, as short phrases ([] when equal)."""
    if stored is None:
        return ["no build record (written by attrgraph build or an older build-many)"]
    stored = json.loads(json.dumps(stored))  # the same plain types on both sides (tuples -> lists)
    expected = json.loads(json.dumps(expected))
    out = []
    for key in ("prompt_ids", "target", *FINGERPRINTS):
        if stored.get(key) != expected.get(key):
            out.append("prompt" if key == "prompt_ids" else key)
    # records written before key_options hold None for a default: read both sides as the build does
    old, new = key_options(stored.get("options") or {}), key_options(expected["options"])
    out += [f"{k} {old.get(k)!r} -> {new[k]!r}" for k in KEY_OPTIONS if old.get(k) != new[k]]
    return out
