"""REPORT.md on tiny fake results: the numbers it states are the ones the code computed."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import reference_study
from test_plots import fake_fit, fake_results

from scaling.study.analysis import fit
from scaling.study.report import law_prose, prose, writer as report
from scaling.study.analysis import findings as findings_lib

ROOT = Path(__file__).resolve().parents[2]


def test_position_follows_the_numbers():
    assert [prose.position(p, 7, 8) for p in (5, 7, 7.5, 8, 12)] == ["below", "inside", "inside", "inside", "above"]


def test_markdown_numbers():
    assert prose.fmt(3.4e24) == "3.4e24" and prose.fmt(2.5) == "2.5" and prose.fmt(None) == "–"
    assert prose._span(fake_results()["N"]) == "2e05–2e06"


@pytest.mark.slow
def test_report_states_the_computed_optimum_and_notes_skipped_figures(tmp_path):
    from test_plots import HELDOUT, fake_fit

    from scaling.study.analysis.pstar import optimal

    results, law, compute = fake_results(p_star=5.0), fake_fit(5.0, heldout=HELDOUT), 1.5e13
    path = report.write_report(results, law, tmp_path, compute=compute)
    text = path.read_text()
    best = optimal.optimal_precision(law, compute=compute, p_range=(2.0, 32.0))
    lo, hi = optimal.optimal_precision_ci(law, compute, p_range=(2.0, 32.0), max_samples=100)["P"]
    assert f"the `kumar` law gives P* = {best['P']:.3g} bits (bootstrap 95% CI {lo:.3g}–{hi:.3g})" in text
    assert lo < best["P"] < hi
    import json

    facts = json.loads((tmp_path / "findings.json").read_text())
    (entry,) = facts["P_star"]
    a, b = entry["interval"]
    assert a <= lo and hi <= b and entry["P_range"][0] <= best["P"] <= entry["P_range"][1]
    for name, (x, y) in findings_lib.PUBLISHED.items():  # the verdict follows CI and specification range together
        assert entry["published"][name] == findings_lib.against_range([a, b], x, y)
    # the fake results record no FLOPs by part: no run is placed at a budget, and the report says why
    assert facts["budgets"] == [] and "cannot tell which precision is best" in text
    assert ("Held-out extrapolation: fitted on the 45 points with N below 2e06, the law predicts the other 15 "
            "with a mean absolute relative error of 1.20%.") in text
    assert ("The law's extrapolation errors are 1.20% of the loss on the largest sizes held out; a difference between "
            "precisions that the law puts below 1.20% is within its error.") in text
    # what was run: 21 runs (one diverged, kept out of the fit), 4 sizes, 3 budgets
    assert "- Runs: 21 (20 ok, 1 diverged)" in text and "60 (run, token budget) points" in text
    assert "- Model sizes: 4 distinct, N = 2e05–2e06" in text
    # figures embedded by relative path and present; absent inputs noted, not fatal
    for stem in ("fig2_iso_loss", "fig3_fit_vs_observed", "fig9_residuals"):
        assert f"]({stem}.png)" in text and (tmp_path / f"{stem}.png").stat().st_size > 0
    assert "Figure 1 (IsoFLOP profiles: loss vs model size per recipe at fixed compute): skipped, no budget" in text
    assert "Figure 4 (Training curves per precision and size): skipped, no per-step curves (--curves)." in text
    assert "fig4_training_curves" not in text
    # limitations from the data: 6 free law parameters (kappa is fixed) on 60 points, 5 precisions
    assert "reach at most 2e06 non-embedding parameters and 1.25e07 tokens" in text
    assert "5 distinct precisions were measured (4, 6, 8, 16, 32 bits)." in text
    assert "The law has 6 free parameters fitted to 60 points (10 points per parameter)." in text
    assert "| kappa (fixed) | 3 | – | – |" in text
    # the cluster table says how the fitted exponents split compute: N* ∝ C^(beta/(alpha+beta))
    share = law.params["beta"] / (law.params["alpha"] + law.params["beta"])
    if fit.literature_exponents(law):
        assert f"the optimal N grows as C^{share:.2f} and D as C^{1 - share:.2f}" in text
    else:  # exponents outside the published split: no cluster-scale extrapolation
        assert f"N* ∝ C^{share:.2f}, outside the published" in text


def test_make_figures_takes_the_committed_study_as_defaults_and_a_users_files_over_them():
    """What make_figures.py adds to `scaling figures` (whose own tests make every figure from a user's
    results): the reference study's files as defaults, each replaced by the one given."""
    import make_figures

    committed = make_figures.arguments([])
    assert Path(committed.results) == ROOT / "results" / "isoflop.csv" and Path(committed.fit) == ROOT / "fits" / "isoflop.json"
    assert Path(committed.curves) == ROOT / "results" / "isoflop_curves.parquet" and Path(committed.out) == ROOT / "paper_figures"
    assert committed.sections == [str(ROOT / "paper_figures" / "reference_study.py")] and committed.compute is None
    mine = make_figures.arguments(["--results", "r.csv", "--fit", "f.json", "--curves", "c.parquet", "--compute", "1.5e13", "--out", "o"])
    assert (mine.results, mine.fit, mine.curves, mine.compute, mine.out) == ("r.csv", "f.json", "c.parquet", ["1.5e13"], "o")


def test_limitations_name_a_size_axis_without_gain_and_an_unidentified_floor():
    from test_plots import fake_fit

    from scaling.study.report import plots

    ok = plots.validate_results(fake_results(p_star=5.0))
    law = fake_fit(5.0, n_samples=0)
    text = prose.limitations(ok, law, [], None)
    assert "is worse than a smaller one" not in text and "went to ≈0" not in text
    # the largest model at the largest budget loses to a smaller one at one precision; E at its floor
    last = (ok["D"] == ok["D"].max()) & (ok["N"] == ok["N"].max()) & (ok["recipe"] == ok["recipe"].iloc[0])
    ok.loc[last, "val_loss"] += 10.0
    law.params["E"] = 1e-8
    n_recipes = ok.loc[ok["D"] == ok["D"].max()].query("N == N.max()")["recipe"].nunique()
    text = prose.limitations(ok, law, [], None)
    assert f"is worse than a smaller one at 1 of {n_recipes} precisions" in text
    assert "The irreducible loss E went to ≈0 (1e-08)" in text


def test_the_laws_error_named_in_the_limitations_is_the_larger_of_its_held_out_sizes_and_its_budget_extrapolation():
    from scaling.study.report import plots

    ok = plots.validate_results(fake_results(p_star=5.0))
    law = fake_fit(5.0, n_samples=0)
    # the budget predicted before it was trained missed by 0.06 on 2.0 and 0.02 on 1.0: 2.5% on average
    prediction = {"budget": 1e13, "score": {"recipes": [{"measured": 2.0, "error": -0.06}, {"measured": 1.0, "error": 0.02},
                                                        {"recipe": "x", "measured": None}]}}
    assert prose.budget_miss(prediction) == pytest.approx(0.025) and prose.budget_miss(None) is None
    text = prose.limitations(ok, law, [], 0.012, prediction=prediction)
    assert ("The law's extrapolation errors are 1.20% of the loss on the largest sizes held out and 2.50% of the loss on "
            "the budget predicted before it was trained (C = 1e13); a difference between precisions that the law puts "
            "below 2.50% is within its error.") in text


def test_the_matched_section_says_which_gaps_grow_with_tokens_from_the_familywise_intervals():
    from scaling.study.analysis import matched

    rng = np.random.default_rng(0)
    rows = []
    for N in (1e5, 2e5, 4e5):
        for seed in (0, 1, 2):
            for i, D in enumerate((1e6, 2e6, 4e6)):
                base = 3.0 - 0.1 * i - 0.2 * math.log2(N / 1e5) + 0.01 * seed
                for P, recipe, gap in ((16, "bf16", 0.0), (8, "fp8", 0.004), (4, "mxfp4", 0.03 + 0.05 * i)):
                    rows.append(dict(run_id=f"{recipe}-{N:g}-{seed}", N=N, D=D, P=P, recipe=recipe, seed=seed,
                                     val_loss=base + gap + 0.002 * rng.standard_normal() * (recipe != "bf16")))
    ok = pd.DataFrame(rows)
    facts = {"matched": matched.matched_gaps(ok, reference="bf16"), "loss_unit": "nats"}
    text = prose.matched_section(facts)
    # +0.05 per doubling of D is +0.072 per e-fold of D/N at a fixed N: grows; fp8's constant gap does not move
    line = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[1:-1]] for r in text.splitlines() if r.startswith("| ")}
    assert float(line["mxfp4"][5].split()[0]) == pytest.approx(0.05 / math.log(2), abs=0.005)
    assert "grows with D/N for mxfp4 (family-wise CI of c excludes zero)" in text and "fp8" not in text.split("At a fixed N")[1]
    flat = ok.assign(val_loss=ok["val_loss"] - (ok["recipe"] == "mxfp4") * 0.05 * ok["D"].map({1e6: 0, 2e6: 1, 4e6: 2}))
    text = prose.matched_section({"matched": matched.matched_gaps(flat, reference="bf16"), "loss_unit": "nats"})
    assert "no recipe's gap moves with D/N" in text


def test_the_report_says_how_the_law_was_chosen_and_when_no_precision_term_does_as_well():
    def selection(chinchilla_close: bool) -> dict:
        return {"chosen": "kumar", "reference": {"recipes": ["fp32"]}, "candidates": [
            {"name": "kumar", "law": "kumar", "n_params": 6, "heldout_gap_mae": {"N": 0.01, "D": 0.02}, "within_noise": True},
            {"name": "chinchilla", "law": "chinchilla", "n_params": 5, "heldout_gap_mae": {"N": 0.012, "D": 0.03},
             "within_noise": chinchilla_close},
            {"name": "sun", "law": "sun", "fittable": False, "within_noise": False}]}

    close = law_prose.selection_text(selection(True))
    assert "1 other candidate is within noise" in close and "cannot show that a precision-aware law" in close
    assert "| kumar (chosen) | 6 | 0.01 | 0.02 | yes |" in close and "| sun | – | – | – | not fitted |" in close
    far = law_prose.selection_text(selection(False))
    assert "No other candidate is within noise" in far and "the data prefer it" in far and "cannot show" not in far
    assert "fitted without the largest size, then without the longest run, and predicts" in far
    # a split nobody could use is named as unused, not as fitted without
    unusable = selection(False)
    for c in unusable["candidates"][:2]:
        c["heldout_gap_mae"] = {"N": None, "D": 0.02, "budget": 0.03}
    text = law_prose.selection_text(unusable)
    assert "without the longest run, then without the largest compute budget, and predicts" in text
    assert "(without the largest size, the held-out gaps come from fewer than two runs" in text


@pytest.mark.slow
def test_make_figures_regenerates_every_committed_figure_and_the_findings_from_committed_files(tmp_path):
    """The reference study's paper_figures/ is what make_figures.py makes from results/, fits/ alone:
    the same figure files (none stale, none missing) and the same findings."""
    import json

    proc = subprocess.run([sys.executable, str(ROOT / "paper_figures" / "make_figures.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    figures = lambda d: {p.name for p in d.iterdir() if p.suffix in (".png", ".pdf")}  # noqa: E731
    assert figures(tmp_path) == figures(ROOT / "paper_figures")
    made = json.loads((tmp_path / "findings.json").read_text())
    committed = json.loads((ROOT / "paper_figures" / "findings.json").read_text())
    assert [b["winner"] for b in made["budgets"]] == [b["winner"] for b in committed["budgets"]]
    for new, old in zip(made["budgets"] + made["integer_arm"], committed["budgets"] + committed["integer_arm"]):
        assert {e["recipe"]: e["loss"] for e in new["recipes"]} == pytest.approx({e["recipe"]: e["loss"] for e in old["recipes"]}, abs=1e-6)
        assert new["diff_ci"] == pytest.approx(old["diff_ci"], abs=1e-6)
    for new, old in zip(made["P_star"], committed["P_star"], strict=True):
        assert new["interval"] == pytest.approx(old["interval"])
    assert made["granularity"]["rows"] == committed["granularity"]["rows"]
    assert made["outliers"] == committed["outliers"]


def test_the_fp4_arm_states_each_gap_with_its_ci_and_the_published_recipes_against_their_formats():
    """fp4_arm keeps the FP4 recipes (plain and published) of each budget that fitted a published one;
    REPORT and README state every gap with its CI, mark an edge minimum and give each pair's verdict."""
    def recipe(name, loss, gap=None, ci=None, inside=True):
        return {"recipe": name, "loss": loss, "gap": gap, "gap_ci": ci, "inside": inside}
    pair = {"a": "quartet", "b": "mxfp4", "diff": 0.12, "ci": [0.1, 0.15], "inside": True,
            "verdict": "mxfp4 lower than quartet by 0.120 nats (95% CI of quartet − mxfp4 [+0.100, +0.150])"}
    budgets = [{"budget": 1e12, "recipes": [recipe("bf16", 1.5), recipe("fp8", 1.45, -0.05, [-0.07, -0.03]),
                                            recipe("mxfp4", 1.55, 0.05, [0.02, 0.08]),
                                            recipe("quartet", 1.67, 0.17, [0.14, 0.2], inside=False),
                                            recipe("nvfp4", None)], "pairs": [pair]},
               {"budget": 3e12, "recipes": [recipe("bf16", 1.4), recipe("mxfp4", 1.42, 0.02, [0.0, 0.04])], "pairs": []}]
    arm = reference_study.fp4_arm(budgets)
    assert [b["budget"] for b in arm] == [1e12] and arm[0]["reference"] == "bf16"
    assert [(g["recipe"], g["published"], g["inside"]) for g in arm[0]["gaps"]] == [("mxfp4", False, True),
                                                                                   ("quartet", True, False)]
    section = reference_study.fp4_arm_section({"fp4_arm": arm, "loss_unit": "nats/byte"})
    # three claims (two gaps, one pair): each 95% interval widened by z(1 - 0.05/6) / z(0.975) about its estimate
    from scipy.stats import norm
    w = norm.ppf(1 - 0.05 / 6) / norm.ppf(0.975)
    assert arm[0]["familywise"] == {"rule": "Bonferroni", "m": 3, "level": 0.95, "widening": pytest.approx(w)}
    assert arm[0]["gaps"][0]["familywise_ci"] == pytest.approx([0.05 - 0.03 * w, 0.05 + 0.03 * w])
    assert f"| mxfp4 | no | +0.050 | +0.020 to +0.080 | {0.05 - 0.03 * w:+.3f} to {0.05 + 0.03 * w:+.3f} | yes |" in section
    assert f"| quartet | yes | +0.170 | +0.140 to +0.200 | {0.17 - 0.03 * w:+.3f} to {0.17 + 0.03 * w:+.3f} | no (edge) |" in section
    assert ("- quartet against mxfp4: mxfp4 lower than quartet by 0.120 nats (95% family-wise CI of quartet − mxfp4 "
            f"[{0.12 - 0.02 * w:+.3f}, {0.12 + 0.03 * w:+.3f}])") in section and "The arm makes 3 claims" in section
    # a pair the 95% interval calls is "cannot tell" once its interval is one of many
    close = {**pair, "diff": 0.03, "ci": [0.002, 0.058]}
    (wide,) = reference_study.fp4_arm([{**budgets[0], "pairs": [close]}])[0]["pairs"]
    assert wide["verdict"].startswith("cannot tell: quartet − mxfp4 = +0.030 nats, 95% family-wise CI")
    # only the published recipes in the results are named, and what `quartet` leaves out is said
    assert "(`quartet` on `mxfp4`:" in section and "`quartet-full` on" not in section
    assert "`quartet-full`, which adds both parts, is not in these results" in section
    full = [{**budgets[0], "recipes": budgets[0]["recipes"] + [recipe("quartet-full", 1.6, 0.1, [0.08, 0.12])]}]
    full_section = reference_study.fp4_arm_section({"fp4_arm": reference_study.fp4_arm(full), "loss_unit": "nats/byte"})
    assert "`quartet` on `mxfp4`, `quartet-full` on `mxfp4`" in full_section
    assert "and `quartet-full` adds both parts." in full_section
    assert ("quartet-full", "quartet") in reference_study.FP4_PAIRS
    import readme
    # the published recipes against FP8 and MXFP6 are their own list, in REPORT and README
    assert {("quartet", "fp8"), ("nvfp4-nvidia", "mxfp6")} <= set(reference_study.FP4_PAIRS)
    above = {"a": "quartet", "b": "fp8", "diff": 0.22, "ci": [0.19, 0.25], "inside": True,
             "verdict": "fp8 lower than quartet by 0.220 nats (95% CI of quartet − fp8 [+0.190, +0.250])"}
    both = reference_study.fp4_arm([{**budgets[0], "pairs": [pair, above]}])[0]
    assert [(p["a"], p["b"]) for p in both["pairs"]] == [("quartet", "mxfp4")]
    assert [(p["a"], p["b"]) for p in both["above"]] == [("quartet", "fp8")] and both["familywise"]["m"] == 4
    both_section = reference_study.fp4_arm_section({"fp4_arm": [both], "loss_unit": "nats/byte"})
    assert "close the gap to the 8- and 6-bit formats" in both_section
    assert "- quartet against fp8: fp8 lower than quartet by 0.220 nats" in both_section
    assert "close the gap" not in section
    assert reference_study.fp4_arm_section({"fp4_arm": [], "loss_unit": "nats/byte"}) == ""
    assert "FP4 arm" not in readme.findings_markdown(  # README leaves the arm to REPORT
        json.loads((ROOT / "paper_figures" / "findings.json").read_text()))
    runs = pd.DataFrame({"recipe": ["nvfp4-nvidia", "nvfp4-nvidia", "nvfp4"], "budget": 1e12,
                         "flops_kept_fprop": [1.0, 3.0, 0.0], "flops_kept_dgrad": [1.0, 3.0, 0.0],
                         "flops_kept_wgrad": [1.0, 3.0, 0.0], "flops_fprop": [3.0, 0.0, 4.0],
                         "flops_dgrad": [3.0, 0.0, 4.0], "flops_wgrad": [3.0, 0.0, 4.0]})
    assert reference_study.kept_share(runs) == {"nvfp4-nvidia": [0.25, 1.0]}
    kept = reference_study.fp4_arm(budgets, runs)[0]["kept"]
    assert kept == {"nvfp4-nvidia": [0.25, 1.0]}
    assert "nvfp4-nvidia keeps 25%–100% of its linear-layer GEMM FLOPs in high precision" in reference_study.fp4_arm_section(
        {"fp4_arm": [{**arm[0], "kept": kept}], "loss_unit": "nats/byte"})


def test_too_few_runs_for_a_p_star_is_said_instead_of_one():
    """P* needs a bootstrap resample to hold twice as many distinct runs as the law has free parameters
    ((1 - 1/e)·n >= 2k): 19 runs carry kumar's 6 (kappa fixed), 18 do not. The committed quick study (12
    runs; a seed-1 rerun put kumar's P* at 32 bits against 5.5 with interval 2-10) gets no P*, only why,
    and REPORT and README print that."""
    import readme
    from scaling.study.analysis import fit as fit_lib
    from scaling.study.sweeps import results

    law = fit_lib.FitResult.from_json(ROOT / "fits" / "quick.json")
    assert findings_lib.too_few_runs(pd.DataFrame({"run_id": range(19)}), law) is None
    why = findings_lib.too_few_runs(pd.DataFrame({"run_id": range(18)}), law)
    assert why.startswith("too few runs for a P*: 18 runs for the 6 free parameters of `kumar`") and "at least 19 runs" in why
    quick = results.load(ROOT / "results" / "quick.csv")
    facts = findings_lib.findings(quick[quick["sweep"] == "quick"], law, n_boot=200)
    assert [e["error"].split(":")[0] for e in facts["P_star"]] == ["too few runs for a P*"] * 2
    assert all(e["measured"] for e in facts["P_star"])  # what the measurement cannot rule out stays
    assert "C = 1e11: no P* (too few runs for a P*: 12 runs" in law_prose.pstar_section(facts)
    assert "**P\\*.** C = 2e11: no P* (too few runs for a P*: 12 runs" in readme.findings_markdown(facts)


def test_the_gpu_pilot_is_reported_on_its_own_runs_by_the_main_studys_rules():
    """REPORT's GPU pilot section: its corpus named, its own IsoFLOP findings by the same code as the
    main study's, and why there is no verdict where its runs cannot give one."""
    from scaling.study.report import plots

    rows = fake_results().assign(corpus="pysrc gpu")
    section = reference_study.gpu_pilot_section(reference_study.gpu_pilot_facts(rows))
    assert "on that machine's corpus (pysrc gpu)" in section
    assert section.endswith(prose.findings_section(findings_lib.findings(plots.validate_results(rows), None)))
    alone = rows[rows["recipe"] == "bf16"]
    assert "so the data cannot tell which precision is best" in reference_study.gpu_pilot_section(reference_study.gpu_pilot_facts(alone))
    # a budget reached by one recipe's 4 sizes and another's 1 (the pilot's first runs): nothing is
    # fitted, and the table says which recipe had too few sizes and which was left unfitted
    entry = lambda r, bits, runs, sizes: {"recipe": r, "bits_eff": bits, "P": bits, "runs": runs, "sizes": sizes,  # noqa: E731
                                          "loss": None, "interpolated": 0}
    first = {"loss_unit": "nats/byte", "cost_model": "bits", "runs": 5, "seeds_per_cell": [1, 1], "corpus": "pysrc gpu",
             "budgets": [{"budget": 3e14, "recipes": [entry("bf16", 16.0, 4, 4), entry("fp8", 8.0, 1, 1)], "winner": None,
                          "sigma": None, "reason": "fewer than two recipes with 3+ sizes reaching this budget"}]}
    budget = reference_study.gpu_pilot_section(first)
    assert "**C = 3e14.** No winner: fewer than two recipes with 3+ sizes reaching this budget." in budget
    # bits P, then what the cost model charges per FLOP (16-bit FLOPs)
    assert "| bf16 | 16 | 1 | 4 (4) | not fitted (above) |" in budget and "| fp8 | 8 | 0.5 | 1 (1) | too few sizes |" in budget


def test_readme_puts_the_gpu_pilot_beside_the_study_with_its_verdict_and_each_gap_to_its_reference():
    import json

    import readme
    from scaling.study.sweeps import results

    facts = reference_study.gpu_pilot_facts(results.load(ROOT / "results" / "gpu_pilot.csv"))  # the committed pilot
    (head, *budgets) = [readme._line(b) for b in readme._gpu_pilot(facts, "nats/byte")]
    assert f"({facts['runs']} runs on a GPU, its own corpus, compared only with each other" in head
    assert len(budgets) == len(facts["budgets"]) and budgets
    section = reference_study.gpu_pilot_section(facts)  # REPORT's: each budget's line opens with README's sentence
    for line, b in zip(budgets, facts["budgets"]):
        assert line == f"  - C = {b['budget']:.3g}: ".replace("e+", "e") + prose.budget_headline(b, "nats/byte")
        assert f"**C = {prose.fmt(b['budget'])}.** {prose.budget_headline(b, 'nats/byte')}" in section
        gapped = [e for e in b["recipes"] if e.get("gap") is not None and e.get("gap_ci")]
        for e in gapped:
            assert f"{e['recipe']} {e['gap']:+.3f} [{e['gap_ci'][0]:+.3f}, {e['gap_ci'][1]:+.3f}]" in line
        assert ("Minimum minus bf16's (95% CI)" in line) == bool(gapped)
    empty = {**facts, "budgets": []}
    assert readme._line(readme._gpu_pilot(empty, "nats/byte")[0]).endswith(prose.NO_BUDGETS)
    assert readme._gpu_pilot(None, "nats/byte") == [] and "GPU pilot" not in readme.findings_markdown(
        {k: v for k, v in json.loads((ROOT / "paper_figures" / "findings.json").read_text()).items() if k != "gpu_pilot"})


def test_runs_on_more_than_one_corpus_are_named_per_recipe_and_budget():
    """A budget whose runs trained on two corpora (or two kinds of machine) says which recipe trained on
    which, and a scored prediction whose budget trained on other data than its fit says its errors hold
    that too."""
    rows = pd.DataFrame({"run_id": ["a", "a", "b", "c", "d"], "recipe": ["bf16", "bf16", "bf16", "fp8", "fp8"],
                         "budget": [1e12, 3e12, 1e12, 1e12, 3e12],
                         "corpus": ["pysrc 000000000001"] * 3 + ["pysrc 000000000002", None]})
    low = findings_lib.corpora(rows, 1e12)
    assert low == {"pysrc 000000000001": {"bf16": 2}, "pysrc 000000000002": {"fp8": 1}}
    assert findings_lib.corpora(rows, 3e12) == {"pysrc 000000000001": {"bf16": 1}, "not recorded": {"fp8": 1}}
    lines = prose._corpora_lines(low)
    assert "Not one corpus: these runs trained on 2 (pysrc 000000000001: 2 runs, pysrc 000000000002: 1 runs)" in lines[1]
    assert lines[-2:] == ["| bf16 | 2 | 0 |", "| fp8 | 0 | 1 |"]
    assert prose._corpora_lines({"pysrc 000000000001": {"bf16": 2, "fp8": 2}}) == []  # one corpus: nothing to say
    hw = rows.assign(hardware=["cpu: AMD EPYC (avx2; no avx512f)"] * 2 + ["cpu: AMD EPYC (avx2, avx512f)"] * 2 + [None])
    hosts = findings_lib.hosts(hw, 1e12)
    assert hosts == {"cpu: AMD EPYC (avx2, avx512f)": {"bf16": 1, "fp8": 1}, "cpu: AMD EPYC (avx2; no avx512f)": {"bf16": 1}}
    host_lines = prose._hosts_lines(hosts)
    assert host_lines[1].startswith("Not one host: these runs trained on 2 kinds of machine (cpu: AMD EPYC (avx2, avx512f): 2 runs")
    assert host_lines[-2:] == ["| bf16 | 1 | 1 |", "| fp8 | 1 | 0 |"]
    assert prose._hosts_lines(findings_lib.hosts(hw, 3e12)) != [] and prose._hosts_lines({"gpu: H200": {"bf16": 3}}) == []
    import readme

    # README's bullet per budget on more than one corpus is the sentence REPORT's IsoFLOP section opens that note with
    one = {"pysrc 000000000001": {"bf16": 1, "fp8": 1}}
    corpora = lambda budgets: [b for b in readme.bullets({"loss_unit": "nats", "budgets": budgets})  # noqa: E731
                               if b[1].startswith("**Corpora")]
    (bullet,) = corpora([{"budget": 1e12, "corpora": low}, {"budget": 3e12, "corpora": one}])
    assert bullet[1] == "**Corpora at C = 1e12.** " and bullet[2] == prose.corpora_sentence(low) in lines[1]
    assert bullet[2] == ("Not one corpus: these runs trained on 2 (pysrc 000000000001: 2 runs, pysrc 000000000002: 1 runs); "
                         "no run on pysrc 000000000001: fp8.")
    assert corpora([{"budget": 1e12, "corpora": one}]) == []
    facts = {"budgets": [{"budget": 1e12, "corpora": low}, {"budget": 1e13, "corpora": {"pysrc 000000000003": {"bf16": 1}}}]}
    import json

    committed = json.loads((ROOT / "results" / "isoflop_prediction.json").read_text())
    fitted_on = {"budgets": [1e12], "runs": 3, "run_ids": ["a"], "corpora": list(low)}
    p = report.prediction_facts({**committed, "fitted_on": fitted_on}, facts)
    assert p["corpora"] == {"fitted": ["pysrc 000000000001", "pysrc 000000000002"], "measured": ["pysrc 000000000003"]}
    assert "run_ids" not in p["fitted_on"]
    measured = [{"recipe": e["recipe"], "loss": e["loss"] + 0.01, "N_opt": e["N_opt"]} for e in committed["recipes"]]
    facts["budgets"][1].update(recipes=measured, reason="cannot tell")
    section = lambda fitted: law_prose.prediction_section(report.prediction_facts(committed | {"fitted_on": fitted}, facts), "nats")
    assert ("Not the same data: the prediction's fit saw runs on pysrc 000000000001, pysrc 000000000002, this "
            "budget's runs trained on pysrc 000000000003") in section(fitted_on)
    # a prediction that does not record its fit's corpora (made before it did) is not said to match
    assert "The prediction file does not record which corpora" in section({"budgets": [1e12], "runs": 3})
    facts["budgets"][1]["corpora"] = {"pysrc 000000000001": {"bf16": 1}}
    same = section({**fitted_on, "corpora": ["pysrc 000000000001"]})
    assert "Not the same data" not in same and "does not record" not in same
    assert f"{len(measured)} of {len(measured)} measured minima fell inside" in same


@pytest.mark.slow
def test_a_report_never_depends_on_where_the_law_puts_its_cluster_scale_optimum(tmp_path, monkeypatch):
    """Which CPU fitted the quick law decided whether REPORT could be written: on a Zen 4 host the
    optimum at cluster compute was a 2-layer model and Figure 8's table aborted the whole report. A fit
    whose exponents no published law has (alpha 2.29) is not extrapolated: the table keeps the reference
    runs, the report says why, `scaling fit` prints the note; and a figure these data cannot support
    is skipped with its reason, never the report."""
    from test_plots import fake_fit

    from scaling import plan
    from scaling.errors import ConfigError
    from scaling.study.report import plots

    results, law = fake_results(p_star=5.0), fake_fit(5.0)
    law.params["alpha"] = 2.29
    assert fit.exponent_note(law).startswith("implausible exponent alpha = 2.29 > 1") and not fit.literature_exponents(law)
    table = plots.cluster_time_table(law)
    assert not table["run"].str.startswith("law optimum").any() and len(table) == 2 * len(plan.cluster.TALK_TABLE)
    text = report.write_report(results, law, tmp_path / "a").read_text()
    assert "Not extrapolated: the fitted exponents (alpha 2.29, beta 0.3) are unlike the published laws' (implausible" in text

    def refuse(*args, **kwargs):
        raise ConfigError("gpus", 1024, "at least 32 GPUs")

    monkeypatch.setattr(plots, "residuals", refuse)
    lines = []
    text = report.write_report(results, fake_fit(5.0), tmp_path / "b", echo=lines.append).read_text()
    assert "Figure 9 (Where the law is biased: residuals by recipe) skipped: it could not be drawn from these data " \
           "(gpus: got 1024; allowed: at least 32 GPUs)" in lines
    assert ("- Figure 9 (Where the law is biased: residuals by recipe): skipped, it could not be drawn from these data "
            "(gpus: got 1024; allowed: at least 32 GPUs).") in text
    assert (tmp_path / "b" / "fig3_fit_vs_observed.png").is_file() and not (tmp_path / "b" / "fig9_residuals.png").exists()


def test_reports_name_a_corpus_file_by_its_name_and_a_one_point_span_once():
    """REPORT printed a user's corpus by its absolute path and '26.1-26.1 tokens per parameter'."""
    assert prose.corpus_name("/home/me/my corpus.txt 0123456789ab bpe:512") == "my corpus.txt 0123456789ab bpe:512"
    assert prose.corpus_name("stdlib b27681494f2f") == "stdlib b27681494f2f"
    runs = pd.DataFrame({"run_id": ["a", "b"], "corpus": ["/home/me/corpus.txt 0123456789ab"] * 2})
    assert prose.corpus_of(runs) == "corpus.txt 0123456789ab"
    budgets = [{"budget": 1e12, "recipes": [{"D_opt": 2.61e6, "N_opt": 1e5, "inside": True},
                                             {"D_opt": 2.61e6, "N_opt": 1e5, "inside": True}]}]
    assert "sit at 26.1 tokens per parameter at C = 1e12" in prose._optima_ratio_text(budgets)


def test_without_a_precision_test_the_report_says_why_when_chinchilla_is_in_the_table():
    """'no chinchilla candidate' was printed while chinchilla was in the table, unscored or degenerate."""
    from scaling.study.analysis import selection

    rng = np.random.default_rng(0)
    pos, clusters = np.arange(12), np.repeat(np.arange(4), 3)
    entries = [{"name": n, "law": n, "fittable": True, "n_params": 5, "aic": 0.0, "fixed": {}} for n in ("kumar", "chinchilla")]
    entries[1]["degenerate"] = "E = 1e-9 is at its bound 0"
    tests = {}
    selection._choose(entries, {n: {"N": (pos, 0.01 * rng.standard_normal(12))} for n in ("kumar", "chinchilla")}, clusters,
                      tests=tests)
    assert tests["precision_test"]["reason"] == "`chinchilla` is degenerate (E = 1e-9 is at its bound 0)"
    tests = {}
    selection._choose(entries[:1], {"kumar": {"N": (pos, 0.01 * rng.standard_normal(12))}}, clusters, tests=tests)
    assert tests["precision_test"]["reason"] == "no chinchilla candidate to test a precision term against"


def test_the_report_opens_with_which_precision_to_train_in_in_plain_words():
    """The quick job's REPORT said 'No winner' at both budgets and never that fp8 and mxfp4 sit below fp32
    only through the tokens `bits` buys them (equal at matched tokens). The answer now comes first."""
    def entry(recipe, loss, bits, p_best):
        return {"recipe": recipe, "loss": loss, "bits_eff": bits, "p_best": p_best}

    def matched(recipe, mean, ci, verdict):
        return {"recipe": recipe, "mean": mean, "mean_familywise_ci": ci, "verdict": verdict}

    f = {"cost_model": "bits: each FLOP at its operands' bits", "loss_unit": "nats/byte", "runs": 12, "seeds_per_cell": [1, 1],
         "budgets": [{"budget": 1e11, "winner": None, "reason": "cannot tell: fp8 vs mxfp4 differ by 0.048 nats",
                      "recipes": [entry("fp32", 2.02, 32.0, 0.02), entry("fp8", 1.72, 8.0, 0.66), entry("mxfp4", 1.76, 4.25, 0.32)]}],
         "matched": {"reference": "fp32", "familywise": {"level": 0.95},
                     "recipes": [matched("mxfp4", 0.051, [-0.039, 0.14], "cannot tell"),
                                 matched("fp8", 0.006, [-0.075, 0.086], "cannot tell")]}}
    text = prose.answer_section(f)
    assert ("- C = 1e11: **cannot tell** which is best (fp8 vs mxfp4 differ by 0.048 nats). How often each is best over "
            "the bootstrap: fp8 0.66, mxfp4 0.32, fp32 0.02.") in text
    assert "fp8 +0.006 (-0.075 to +0.086): cannot tell; mxfp4 +0.051 (-0.039 to +0.140): cannot tell." in text
    assert ("So where fp8 and mxfp4 sit below fp32 at a fixed budget, that comes from the tokens cheaper FLOPs buy under "
            "`bits` (fp8 4x, mxfp4 7.5x fp32's tokens at the same size), not from a lower loss at the same tokens.") in text
    assert "These 12 runs cannot pick a precision (1 seed per cell)" in text
    f["budgets"][0].update(winner="fp8", runner_up="mxfp4", diff=0.04, diff_ci=[0.01, 0.07])
    f["matched"]["recipes"][0]["verdict"] = "higher than the reference"
    text = prose.answer_section(f)
    assert "**train in fp8**: its IsoFLOP minimum is 0.040 nats/byte below mxfp4's (95% CI 0.010 to 0.070)" in text
    assert "not from a lower loss at the same tokens (mxfp4: higher there)." in text and "cannot pick" not in text
    assert prose.answer_section({**f, "budgets": []}).startswith("These runs cannot say which precision to train in")


def test_verdict_means_one_thing_the_answer_at_a_budget_under_a_cost_model():
    """Issue 69: "verdict" meant four things. It is kept for the answer at a fixed compute budget under a
    named cost model (the chips' and the IsoFLOP budgets'); the matched gaps, the P* profile, granularity and
    outliers give a direction, the optimum has a check, a published range holds P* or not."""
    from scaling.study.analysis.pstar import optimum_check
    from scaling.study.report import schema

    facts = schema.load(ROOT / "paper_figures" / "findings.json").to_json()
    sections = report.findings_sections(facts)
    for name in ("matched", "pstar", "granularity", "outliers"):
        text = "\n".join(sections[name])
        assert text and "verdict" not in text.lower(), name
    assert "| direction |" in "\n".join(sections["matched"])
    assert "every verdict below holds for this cost model only" in "\n".join(sections["findings"])
    # a profile over the formats chips run (the committed study's runs under kumar: the chosen law may have
    # no bits axis, and then no profile): each neighbour pair has a direction, the table no verdict column
    from scaling.study.analysis.fit import FitResult
    from scaling.study.analysis.pstar import profile as profile_lib
    prof = profile_lib.judge_within_error(profile_lib.precision_profile(
        FitResult.from_json(ROOT / "fits" / "isoflop_kumar.json"), 1e13, max_samples=20), 0.031)
    table = law_prose.profile_text(prof)
    assert "| next format's loss |" in table and "verdict" not in table.lower()
    assert prof["pairs"] and all("direction" in q and "verdict" not in q for q in prof["pairs"])
    assert not hasattr(optimum_check, "verdict") and callable(optimum_check.check)
    assert not hasattr(findings_lib, "verdict") and findings_lib.against_range([7.2, 7.9], 7, 8) == "inside"
