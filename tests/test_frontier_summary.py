"""benchmarks/frontier.py's summary of seeded runs (issue 33, part 4), on hand-built runs whose means,
ranges and interpolations are worked out here: each setting's point is the mean over its seeds with
the range of its FVU, comparisons interpolate log-log between a method's points, and the ratio's range
pairs each seed's run with the same seed's reference curve."""

import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import frontier  # noqa: E402  (benchmarks/ is no package)


def run(method, value, seed, l0, fvu, kl=0.1):
    return dict(
        method=method,
        value=value,
        seed=seed,
        l0_mean=l0,
        fvu_mean=fvu,
        kl_to_orig=kl,
        ce_loss_recovered=0.99,
        train_s=10.0,
        dead_fraction_total=0.1,
        fvu=[fvu] * 4,
    )


def runs_of(*rs):
    return {f"{r['method']}_{r['value']}_seed{r['seed']}": r for r in rs}


def test_a_point_is_the_mean_over_its_seeds_with_the_fvu_range():
    runs = runs_of(
        run("jumprelu_tanh", 1e-3, 0, 20.0, 0.010),
        run("jumprelu_tanh", 1e-3, 1, 22.0, 0.014),
        run("jumprelu_tanh", 1e-3, 2, 24.0, 0.012),
        run("jumprelu_tanh", 4e-3, 0, 10.0, 0.030),
    )
    (low, high) = frontier.points(runs)["jumprelu_tanh"]  # sorted by mean L0
    assert low["value"] == 4e-3 and len(low["runs"]) == 1
    assert high["l0_mean"] == pytest.approx(22.0) and high["fvu_mean"] == pytest.approx(0.012)
    assert high["fvu_range"] == (0.010, 0.014) and high["l0_range"] == (20.0, 24.0)
    assert [r["seed"] for r in high["runs"]] == [0, 1, 2]


def test_interpolation_is_linear_in_log_log_and_refuses_outside_the_range():
    pts = [(10.0, 0.04), (40.0, 0.01)]
    # at the geometric middle of the L0s, the geometric mean of the values
    assert frontier.at_l0(pts, 20.0) == pytest.approx(math.sqrt(0.04 * 0.01))
    assert frontier.at_l0(pts, 10.0) == pytest.approx(0.04)
    assert frontier.at_l0(pts, 9.9) is None and frontier.at_l0(pts, 41.0) is None


def test_the_ratio_range_pairs_each_seed_with_its_own_reference_curve():
    ref_runs = runs_of(
        run("jumprelu_tanh", 1, 0, 10.0, 0.04),
        run("jumprelu_tanh", 2, 0, 40.0, 0.01),
        run("jumprelu_tanh", 1, 1, 10.0, 0.08),
        run("jumprelu_tanh", 2, 1, 40.0, 0.02),
    )
    other = runs_of(run("topk", 30, 0, 20.0, 0.02), run("topk", 30, 1, 20.0, 0.02))
    pts = frontier.points({**ref_runs, **other})
    (pt,) = pts["topk"]
    cell = frontier.ratio_cell(pt, pts["jumprelu_tanh"])
    # seed 0's curve at L0 20: 0.02 (ratio 1.00); seed 1's: 0.04 (0.50); the mean curve: sqrt(0.06*0.015)
    mean_ref = math.sqrt(0.06 * 0.015)
    assert f"vs {mean_ref:.4f} ({0.02 / mean_ref:.2f}x; seeds 0.50-1.00x)" in cell


def test_outputs_hold_both_comparison_tables(tmp_path):
    runs = runs_of(
        run("jumprelu_tanh", 1, 0, 10.0, 0.04),
        run("jumprelu_tanh", 2, 0, 40.0, 0.01),
        run("sae_lens_jumprelu", 0.03, 0, 20.0, 0.021),
        run("gated", 0.02, 0, 20.0, 0.03),
    )
    meta = dict(n_layers=4, d_sae=1024, n_tokens=1000, batch_size=512, lr=2e-3, held_out_tokens=10)
    meta.update(held_out_sequences=2, date="today")
    frontier.write_outputs(tmp_path / "f", meta, runs)
    md = (tmp_path / "f.md").read_text()
    against = md.split("## Against sae_lens")[1].split("## At equal L0")[0]
    assert f"| ours: JumpReLU, tanh penalty | 0.0200 ({0.02 / 0.021:.2f}x) |" in against
    rows = [ln for ln in md.split("## At equal L0")[1].splitlines() if ln.startswith("| ours: Gated")]
    assert len(rows) == 1 and "vs 0.0200 (1.50x)" in rows[0]
    assert (tmp_path / "f.png").stat().st_size > 0
