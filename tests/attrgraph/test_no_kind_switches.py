"""Transcoder math has one home: nothing in attrgraph branches on a transcoder kind or nonlinearity name.

attrgraph asks the set instead (`cfg.is_sae`, `cfg.is_attention_sae`, `tc.per_token`,
`tc.encode_layer / activate_layer / decode_layer / onset_layer`). A static scan of every module
flags (1) a comparison, `match` case or dict key with a kind or nonlinearity name as a string
literal ("sae", "plt", "clt", "relu", "jumprelu", "topk", "batchtopk"), and (2) any comparison with,
or lookup by, a `cfg.kind` / `cfg.activation` attribute (whatever it is compared to).
"""

import ast
from pathlib import Path

import transcoders
from tests import name_switches
from transcoders.nonlinearity import NONLINEARITIES

ROOT = Path(__file__).resolve().parents[2]
NAMES = set(transcoders.CLASSES) | set(NONLINEARITIES)
FIELDS = ("kind", "activation")


def violations(source: str) -> list[tuple[int, str]]:
    return name_switches.violations(source, NAMES, FIELDS)


def test_attrgraph_never_switches_on_a_transcoder_kind_or_nonlinearity():
    bad = [
        f"{path.relative_to(ROOT)}:{line} {what}"
        for path in sorted((ROOT / "attrgraph").rglob("*.py"))
        for line, what in violations(path.read_text())
    ]
    assert not bad, "ask the set or its nonlinearity instead (transcoders/):\n" + "\n".join(bad)


def test_the_scan_finds_what_it_forbids():
    flagged = [
        'if cfg.activation == "jumprelu": pass',
        'if tc.cfg.kind != "sae": pass',
        'ok = kind in ("topk", "batchtopk")',
        "if cfg.kind == KIND: pass",
        'W = {"plt": a, "clt": b}[cfg.kind]',
        'match name:\n    case "clt":\n        pass',
    ]
    for code in flagged:
        assert violations(code), code
    allowed = [
        'keep = nodes.kind == "feature"',
        'if edit.kind in ("feature", "error"): pass',
        "if tc.cfg.is_sae or not tc.per_token: pass",
        'meta = {"transcoder_kind": cfg.kind}',
    ]
    for code in allowed:
        assert not violations(code), code


def encoder_reads(source: str) -> list[int]:
    """Lines of `source` that read a set's `W_enc` attribute."""
    return [
        n.lineno for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Attribute) and n.attr == "W_enc"
    ]


def test_attrgraph_asks_the_set_for_its_encoder_vectors():
    """The set knows what its features read (`encoder_vectors`); attrgraph never reads `W_enc` itself,
    so a set whose encoder is stored otherwise works everywhere (issue 33)."""
    bad = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / "attrgraph").rglob("*.py"))
        for line in encoder_reads(path.read_text())
    ]
    assert not bad, "use tc.encoder_vectors(layer, features) instead of W_enc:\n" + "\n".join(bad)
    assert encoder_reads("u = tc.W_enc[l][:, f]") == [1] and not encoder_reads('"W_enc[:, f]"')
