"""REPORT.md on tiny fake results: the numbers it states are the ones the code computed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from scaling import report
from test_plots import fake_results

ROOT = Path(__file__).resolve().parent.parent


def test_position_and_comparison_sentences_follow_the_numbers():
    assert [report.position(p, 7, 8) for p in (5, 7, 7.5, 8, 12)] == ["below", "inside", "inside", "inside", "above"]
    below = report.compare_with_range(5.0, (4.5, 5.6), "K", 7, 8)
    assert "5 bits is below the 7–8 bit range of K" in below and "whole 95% CI 4.5–5.6 bits" in below
    assert "disagree" in below
    overlap = report.compare_with_range(6.0, (5.0, 7.5), "K", 7, 8)
    assert "below" in overlap and "overlaps" in overlap and "not significant" in overlap
    inside = report.compare_with_range(7.5, (7.1, 7.9), "K", 7, 8)
    assert "inside" in inside and "agree" in inside
    wide = report.compare_with_range(7.5, (5.0, 11.0), "K", 7, 8)
    assert "inside" in wide and "do not pin down" in wide
    above = report.compare_with_range(12.0, None, "S", 4, 8)
    assert "12 bits is above the 4–8 bit range of S" in above and "no bootstrap CI" in above


def test_markdown_numbers():
    assert report._fmt(3.4e24) == "3.4e24" and report._fmt(2.5) == "2.5" and report._fmt(None) == "–"
    assert report._span(fake_results()["N"]) == "2e05–2e06"


@pytest.mark.slow
def test_report_states_the_computed_optimum_and_notes_skipped_figures(tmp_path):
    from scaling import optimal, plots

    from test_plots import fake_fit

    from test_plots import HELDOUT

    results, law, compute = fake_results(p_star=5.0), fake_fit(5.0, heldout=HELDOUT), 1.5e13
    path = report.write_report(results, law, tmp_path, compute=compute)
    text = path.read_text()
    best = optimal.optimal_precision(law, compute=compute)
    lo, hi = plots.optimal_p_interval(law, compute)
    assert f"**P* = {best['P']:.3g} bits** (95% bootstrap CI {lo:.3g}–{hi:.3g} bits)" in text
    assert lo < best["P"] < hi
    assert f"P* = {best['P']:.3g} bits is below the 7–8 bit range of Kumar et al. 2024" in text
    assert f"P* = {best['P']:.3g} bits is inside the 4–8 bit range of Sun et al. 2025" in text
    assert ("Held-out extrapolation: fitted on the 45 points with N below 2e06, the law predicts the other 15 "
            "with a mean absolute relative error of 1.20%.") in text
    assert "The held-out (extrapolation) error is 1.20% of the loss" in text
    # what was run: 21 runs (one diverged, kept out of the fit), 4 sizes, 3 budgets
    assert "- Runs: 21 (20 ok, 1 diverged)" in text and "60 (run, token budget) points" in text
    assert "- Model sizes: 4 distinct, N = 2e05–2e06" in text
    # figures embedded by relative path and present; absent inputs noted, not fatal
    for stem in ("fig1_sweet_spot", "fig2_iso_loss", "fig3_fit_vs_observed", "fig8_cluster_time"):
        assert f"]({stem}.png)" in text and (tmp_path / f"{stem}.png").stat().st_size > 0
    assert "Figure 4 (Training curves per precision and size): skipped, no per-step curves (--curves)." in text
    assert "fig4_training_curves" not in text
    # limitations from the data: 6 free law parameters (kappa is fixed) on 60 points, 5 precisions
    assert "reach at most 2e06 non-embedding parameters and 1.25e07 tokens" in text
    assert "5 distinct precisions were measured (4, 6, 8, 16, 32 bits)." in text
    assert "The law has 6 free parameters fitted to 60 points (10 points per parameter)." in text
    assert "| kappa (fixed) | 3 | – | – |" in text
    # the cluster table says how the fitted exponents split compute: N* ∝ C^(beta/(alpha+beta))
    share = law.params["beta"] / (law.params["alpha"] + law.params["beta"])
    assert f"the optimal N grows as C^{share:.2f} and D as C^{1 - share:.2f}" in text


@pytest.mark.parametrize("p_star, kumar, sun", [(5.0, "below", "inside"), (12.0, "above", "above"),
                                                 (7.5, "inside", "inside")])
def test_comparison_follows_the_law(p_star, kumar, sun):
    from scaling import plots

    from test_plots import fake_fit

    ok = plots.validate_results(fake_results(p_star=p_star))
    _, found = report.sweet_spot(fake_fit(p_star, n_samples=0), ok, [1.5e13])
    assert found[0]["P"] == pytest.approx(p_star, abs=0.05)  # kumar law: P* = 1.904·gamma at any compute
    text = report.comparison(found)
    assert "no bootstrap CI" in text
    assert f"is {kumar} the 7–8 bit range of Kumar" in text and f"is {sun} the 4–8 bit range of Sun" in text


@pytest.mark.slow
def test_make_figures_script_regenerates_from_committed_files(tmp_path):
    from test_plots import fake_fit

    results = tmp_path / "ladder.csv"
    fake_results().to_csv(results, index=False)
    fit_path = fake_fit(5.0, n_samples=0).to_json(tmp_path / "ladder.json")
    out = tmp_path / "figs"
    proc = subprocess.run([sys.executable, str(ROOT / "paper_figures" / "make_figures.py"), "--results", str(results),
                           "--fit", str(fit_path), "--out", str(out), "--compute", "1.5e13"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = (out / "REPORT.md").read_text()
    from scaling import optimal

    best = optimal.optimal_precision(fake_fit(5.0, n_samples=0), compute=1.5e13)
    assert f"**P* = {best['P']:.3g} bits**" in text
    assert (out / "fig1_sweet_spot.pdf").read_bytes().startswith(b"%PDF")


def test_direct_test_judges_the_gap_by_the_seeds():
    runs = pd.DataFrame({"precision": ["FP8", "FP4"], "P": [8, 4], "N": [1e6, 2e6], "D": [1e7, 1e7],
                         "loss": [3.00, 3.05], "sd": [0.01, 0.01], "n": [3, 3]})
    assert "agrees with the law's best named precision (FP8)" in report.direct_test(runs, "FP8", 6)
    # gap 0.05 vs 2·SE = 2·sqrt(2·0.01²/3) = 0.0163: significant
    differs = report.direct_test(runs, "FP4", 6)
    assert "differs from the law's best named precision (FP4) by 0.05 nats/token, more than twice" in differs
    noisy = runs.assign(sd=[0.1, 0.1])  # 2·SE = 0.163 > 0.05
    assert "less than twice its standard error (0.082)" in report.direct_test(noisy, "FP4", 6)
    single = runs.assign(n=[1, 3])
    assert "single run" in report.direct_test(single, "FP4", 4)
    assert "was not measured" in report.direct_test(runs, "FP6", 6)


def test_sweet_spot_flags_an_optimum_outside_the_fitted_sizes():
    from scaling import fit, optimal, plots

    from test_plots import fake_fit

    ok = plots.validate_results(fake_results(p_star=5.0))
    law, compute = fake_fit(5.0, n_samples=0).to_dict(), 1.5e13
    best = optimal.optimal_precision(law, compute=compute)
    inside_text, _ = report.sweet_spot(fit.FitResult.from_dict(
        {**law, "data": {"columns": {"N": {"min": best["N"] / 2, "max": best["N"] * 2}}}}), ok, [compute])
    assert "outside the model sizes" not in inside_text
    sizes = (best["N"] * 10, best["N"] * 100)  # the law's optimum lies 10x below the smallest fitted size
    text, found = report.sweet_spot(fit.FitResult.from_dict(
        {**law, "data": {"columns": {"N": {"min": sizes[0], "max": sizes[1]}}}}), ok, [compute])
    bounded = optimal.optimal_precision(law, compute=compute, n_range=sizes)
    assert bounded["N"] == pytest.approx(sizes[0], rel=1e-6)
    assert "This N lies ×10 outside the model sizes the law was fitted on" in text
    assert f"Restricted to those sizes, the law's optimum is P = {bounded['P']:.3g} bits" in text
    assert found[0]["P_within_sizes"] == pytest.approx(bounded["P"])
    hinges = abs(bounded["P"] - best["P"]) >= 0.5
    assert ("P* hinges on extrapolating the size term" in text) == hinges
    assert ("neither confirms nor contradicts" in report.comparison(found)) == hinges
    # the measured winner at the budget is placed against each published range
    found[0]["measured_best"] = {"precision": "FP8", "P": 8.0, "n": 2}
    assert (f"- At C = {report._fmt(compute)}: measured directly, the lowest loss is FP8 (8 bits, 2 runs): inside the "
            "7–8 bits of Kumar et al. 2024; inside the 4–8 bits of Sun et al. 2025." in report.comparison(found))


def test_limitations_name_a_size_axis_without_gain_and_an_unidentified_floor():
    from scaling import plots

    from test_plots import fake_fit

    ok = plots.validate_results(fake_results(p_star=5.0))
    law = fake_fit(5.0, n_samples=0)
    text = report.limitations(ok, law, [], None)
    assert "is worse than a smaller one" not in text and "went to ≈0" not in text
    # the largest model at the largest budget loses to a smaller one at one precision; E at its floor
    last = (ok["D"] == ok["D"].max()) & (ok["N"] == ok["N"].max()) & (ok["recipe"] == ok["recipe"].iloc[0])
    ok.loc[last, "val_loss"] += 10.0
    law.params["E"] = 1e-8
    n_recipes = ok.loc[ok["D"] == ok["D"].max()].query("N == N.max()")["recipe"].nunique()
    text = report.limitations(ok, law, [], None)
    assert f"is worse than a smaller one at 1 of {n_recipes} precisions" in text
    assert "The irreducible loss E went to ≈0 (1e-08)" in text


def test_summary_states_the_law_the_direct_test_and_the_published_ranges():
    measured = pd.DataFrame({"precision": ["FP32", "FP8", "FP4"], "P": [32.0, 8.0, 4.0], "N": [1e5, 4e5, 8e5],
                             "D": [1e6] * 3, "loss": [1.60, 1.50, 1.52], "sd": [0.01, 0.01, 0.02], "n": [2, 2, 1]})
    found = [{"compute": 1e12, "P": 5.0, "ci": (4.5, 5.6)},
             {"compute": 2e12, "P": 5.0, "ci": (4.5, 5.6), "measured": measured,
              "measured_best": measured.iloc[1].to_dict()}]
    text = report.summary(found, "kumar")
    assert "**The fitted `kumar` law puts the compute-optimal precision at P* = 5 bits** (95% bootstrap CI 4.5–5.6 bits), " \
           "the same at both budgets." in text
    # the direct test at the second budget only: FP8 wins, FP4 (one seed) is next, so the gap has no error bar
    assert "Measured directly at C = 2e12" in text and "Measured directly at C = 1e12" not in text
    assert "FP8 has the lowest loss, 1.5 ± 0.01 (2 runs), ahead of FP4, 1.52 (1 run): a gap of 0.02 nats/token " \
           "with a single run on one side" in text
    assert "All: FP8 1.5 < FP4 1.52 < FP32 1.6." in text
    assert "5 bits is below the 7–8 bit range of Kumar et al. 2024, and so is its whole 95% CI 4.5–5.6 bits" in text
    assert "5 bits is inside the 4–8 bit range of Sun et al. 2025" in text
    # with seeds on both sides the gap is judged against twice its standard error
    two = measured.assign(n=2)
    judged = report.summary([{**found[1], "measured": two}], "kumar")
    se = (0.01 ** 2 / 2 + 0.02 ** 2 / 2) ** 0.5
    assert f"a gap of 0.02 nats/token, less than twice its standard error ({se:.2g})." in judged
    # a sentence that holds at several budgets is written once, naming them
    comparison = report.comparison(found)
    assert comparison.count("Kumar et al. 2024") == 2 and "- At C = 1e12, 2e12: the law's P* = 5 bits" in comparison


def test_cost_of_precision_pairs_runs_with_fp32_and_measures_the_trend_in_tokens():
    from scaling import fit

    rows = []
    for N in (1e5, 4e5):
        for i, D in enumerate((1e6, 2e6, 4e6)):
            base = 3.0 - 0.1 * i - (0.2 if N > 1e5 else 0.0)
            for P, recipe, gap in ((32, "fp32", 0.0), (8, "fp8", 0.004), (4, "mxfp4", 0.03 + 0.05 * i)):
                rows.append(dict(run_id=f"{recipe}-{N:g}", N=N, D=D, P=P, recipe=recipe, format=recipe, seed=0,
                                 val_loss=base + gap))
    ok = pd.DataFrame(rows)
    gaps = report.precision_gaps(ok)
    assert len(gaps) == 12 and set(gaps["precision"]) == {"FP8", "FP4"}
    assert gaps[gaps["precision"] == "FP8"]["gap"].to_numpy() == pytest.approx([0.004] * 6)
    law = fit.FitResult.from_dict({"law": "kumar", "params": {}, "fixed": {}, "objective": 0.0})
    text = report.cost_of_precision(ok, law)
    assert "| FP8 | +0.004 | +0.004 | +0.004 |" in text and "| FP4 | +0.030 | +0.080 | +0.130 |" in text
    # +0.05 per doubling of D at either size
    assert "FP4's gap goes from +0.030 at the fewest tokens to +0.130 at the most; at a fixed model size it grows " \
           "by 0.050 nats/token per doubling of the tokens." in text
    assert "its gap does not change with D" in text
    # no FP32 to pair with: no section
    assert report.cost_of_precision(ok[ok["P"] != 32], law) == ""
