"""A nonlinearity's math has one home (issue 33): outside it, no module of `transcoders/` switches on an
activation's name; callers ask the nonlinearity (`needs_dead`, `aux_loss`, `spread_train_call`,
`uses_k`, `sparse_step`, ...), as tests/attrgraph/test_no_kind_switches.py holds attrgraph to.

The home: nonlinearity.py (the classes and their registry, with how foreign formats name and hold
each one), activations.py (their functions) and base.py (which looks its class up by `cfg.activation`).
The readers and writers of formats/ ask the nonlinearity or look up the registry too.
A static scan flags (1) a comparison, `match` case or dict key with a nonlinearity's name as a string
literal, and (2) a comparison with, or lookup by, a config's `activation` attribute.
"""

from pathlib import Path

from tests import name_switches
from transcoders.nonlinearity import NONLINEARITIES

ROOT = Path(__file__).resolve().parents[2]
HOME = {"nonlinearity.py", "activations.py", "base.py"}
NAMES = set(NONLINEARITIES)


def violations(source: str) -> list[tuple[int, str]]:
    return name_switches.violations(source, NAMES, ("activation",))


def outside_home() -> list[Path]:
    pkg = ROOT / "transcoders"
    return [p for p in sorted(pkg.rglob("*.py")) if p.relative_to(pkg).parts[0] not in HOME]


def test_no_module_outside_the_home_switches_on_an_activation_name():
    paths = outside_home()
    assert any(p.name == "distributed.py" for p in paths) and any(p.name == "train.py" for p in paths)
    assert any(p.name == "sae_lens.py" for p in paths) and any(p.name == "circuit_tracer.py" for p in paths)
    bad = [f"{p.relative_to(ROOT)}:{line} {what}" for p in paths for line, what in violations(p.read_text())]
    assert not bad, "ask the nonlinearity instead (transcoders/nonlinearity.py):\n" + "\n".join(bad)


def test_the_scan_finds_what_it_forbids():
    flagged = [
        'if tc.cfg.activation == "topk": pass',
        'topk = tcfg.activation in ("topk", "batchtopk")',
        'if act == "batchtopk" and tc.training: pass',
        "if cfg.activation != ACT: pass",
        'rule = {"topk": a, "relu": b}[cfg.activation]',
        'match name:\n    case "jumprelu":\n        pass',
    ]
    for code in flagged:
        assert violations(code), code
    allowed = [
        'cfg = TranscoderConfig(activation="topk")',
        "if tc.nonlinearity.needs_dead: pass",
        'meta = {"activation": cfg.activation}',
    ]
    for code in allowed:
        assert not violations(code), code
