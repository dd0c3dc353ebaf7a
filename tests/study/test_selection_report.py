"""The report's law-selection paragraph (held-out budget, within-noise set, the chosen law's residuals per
recipe) and its P* sentence for a law without a bits axis (a menu of measured recipes, not an interval)."""

from scaling.study.analysis import findings as findings_lib
from scaling.study.report import law_prose


def _selection(close: bool) -> dict:
    return {
        "chosen": "capacity", "criterion": "heldout_gap_mae (fitted without the runs at the largest budget, scored on its gaps)",
        "reference": {"recipes": ["bf16"]}, "noise_se": 2.0, "clustered_by": "recipe", "splits": ["budget"],
        "split": {"by": "budget", "value": 3e12, "held_runs": 111, "train_rows": 126, "train_runs": 87, "note": None},
        "within_noise": ["capacity", "kumar_roles"] if close else ["capacity"],
        "chosen_residuals": [
            {"recipe": "int4-fwd", "n": 11, "runs": 11, "mean": 0.05, "ci": [0.03, 0.07]},
            {"recipe": "fp8", "n": 11, "runs": 11, "mean": 0.001, "ci": [-0.01, 0.012]},
            {"recipe": "nvfp4", "n": 1, "runs": 1, "mean": -0.02, "ci": None}],
        "candidates": [
            {"name": "capacity", "law": "capacity", "fittable": True, "n_params": 7, "score": 0.024,
             "n_heldout": {"budget": 93}, "gap_mae_diff": {"value": 0.0, "se": 0.0}, "within_noise": True},
            {"name": "kumar_roles", "law": "kumar_roles", "fittable": True, "n_params": 8, "score": 0.031,
             "n_heldout": {"budget": 93}, "gap_mae_diff": {"value": 0.007, "se": 0.004 if close else 0.002},
             "within_noise": close},
            {"name": "sun", "law": "sun", "fittable": False, "within_noise": False}]}


def test_the_selection_paragraph_names_the_held_out_budget_the_within_noise_set_and_the_residuals():
    text = law_prose.selection_text(_selection(close=True))
    assert "largest compute budget (C = 3e12)" in text and "111 runs left out whole, 87 fitted" in text
    assert "no held-out gap is a later checkpoint of a fitted run" in text and "predicts the 93 gaps" in text
    assert "Within noise of the best (2 standard errors clustered by recipe): `capacity`, `kumar_roles`" in text
    assert "These data do not pick one law among them; the fit reported here is `capacity`" in text and "bits axis (`kumar_roles`)" in text
    assert "| kumar_roles | 8 | yes | 0.031 | +0.0070 ± 0.0040 | yes |" in text
    assert "| sun | – | yes | – | – | not fitted |" in text
    # the chosen law's residuals per recipe: systematic where the interval excludes zero
    assert "| int4-fwd | 11 | +0.050 | +0.030 to +0.070 |" in text and "| nvfp4 | 1 | -0.020 | – (one run) |" in text
    assert "systematic for int4-fwd, whose interval excludes zero" in text
    alone = law_prose.selection_text(_selection(close=False))
    assert "Only `capacity` is within noise (2 standard errors clustered by recipe)" in alone and "do not pick" not in alone


def test_a_law_without_a_bits_axis_names_recipes_not_an_interval():
    entry = {"compute": 1e12, "P": None, "P_ci": None, "no_bits_axis": "capacity",
             "recipes": [{"recipe": "mxfp6", "bits": 6.25, "N": 1e5, "D": 1e6, "loss": 1.60, "best": True,
                          "within_law_error_of_best": True},
                         {"recipe": "fp8", "bits": 8.0, "N": 1e5, "D": 1e6, "loss": 1.61, "best": False,
                          "within_law_error_of_best": True},
                         {"recipe": "mxfp4", "bits": 4.25, "N": 1e5, "D": 1e6, "loss": 1.70, "best": False,
                          "within_law_error_of_best": False}],
             "measured": [{"recipe": "fp8", "bits": 8.0, "P": 8.0, "p_best": 0.6}], "interval": [6.25, 8.0],
             "published": {n: "cannot tell" for n in findings_lib.PUBLISHED}}
    text = law_prose.pstar_section({"P_star": [entry], "law": {"name": "capacity"}})
    assert "mxfp6 (6.25 bits), fp8 (8 bits); a choice among measured recipes, not an interval of P*" in text
    assert "mxfp4 (4.25 bits)" not in text  # neither the law's lowest nor within its error: not on the menu
    # no share of resamples (the law's parameter noise) claims a best: the law's error decides
    assert "within the law's error of it: fp8" in text and "bootstrap resamples" not in text
    for name, (a, b) in findings_lib.PUBLISHED.items():
        inside = [r for r, bits in (("mxfp6", 6.25), ("fp8", 8.0)) if a <= bits <= b]
        assert f"{name}'s {a:g}–{b:g} bits contains {', '.join(inside) or 'none of them'}" in text
    assert "Taking these together" not in text
    # a per-recipe law is read by what it fits per recipe: recipe_gap a gap, kumar_eff an efficiency
    gap = law_prose.pstar_section({"P_star": [{**entry, "no_bits_axis": "recipe_gap"}], "law": {"name": "recipe_gap"}})
    assert "prices precision by a fitted gap per recipe" in gap and "own fitted gap, its lowest loss" in gap
    eff = law_prose.pstar_section({"P_star": [{**entry, "no_bits_axis": "kumar_eff"}], "law": {"name": "kumar_eff"}})
    assert "prices precision by a fitted efficiency per recipe" in eff


def test_without_budgets_the_paragraph_says_the_largest_size_was_held_out_and_why():
    sel = _selection(close=False)
    sel["split"] = {"by": "N", "value": 3e8, "held_runs": 4, "train_rows": 72, "train_runs": 12, "note": "no budget column"}
    text = law_prose.selection_text(sel)
    assert "at the largest size (N = 3e08; no budget split: no budget column)" in text and "4 runs left out whole" in text


def _three_splits() -> dict:
    """A selection_law summary with three held-out splits, a precision test and a nested test."""
    test = {"alpha": 0.05, "n_clusters": 8, "n": 114, "splits": ["compute", "N", "D/N"]}
    return {
        "chosen": "kumar_data", "reference": {"recipes": ["bf16"]}, "noise_se": 2.0, "clustered_by": "recipe",
        "splits": ["compute", "N", "D/N"], "split_notes": {},
        "split_details": [{"by": "compute", "value": 1.6e18, "held_runs": 24, "train_runs": 72},
                          {"by": "N", "value": 3e8, "held_runs": 24, "train_runs": 72},
                          {"by": "D/N", "value": 160.0, "held_runs": 32, "train_runs": 64}],
        "bits_groups": {"6-8": [6.0, 8.0], "<=4": [0.0, 4.0]},
        "precision_test": {**test, "big": "kumar_data", "small": "chinchilla", "statistic": 11.13, "p_value": 5.2e-06,
                           "beats": True, "verdict": "`kumar_data` beats `chinchilla` (no precision term)"},
        "nested_tests": [{**test, "big": "kumar_data", "small": "kumar", "statistic": 0.8, "p_value": 0.22, "beats": False}],
        "candidates": [
            {"name": "chinchilla", "law": "chinchilla", "fittable": True, "n_params": 5, "score": 0.057,
             "heldout_gap_mae": {"compute": 0.05, "N": 0.0385, "D/N": 0.0825},
             "heldout_gap_mae_by_bits": {"6-8": {"compute": 0.02, "N": 0.02, "D/N": 0.025}, "<=4": {"compute": 0.13}},
             "gap_mae_diff": {"value": 0.034, "se": 0.01}, "within_noise": False},
            {"name": "kumar_data", "law": "kumar_data", "fittable": True, "n_params": 10, "score": 0.023,
             "heldout_gap_mae": {"compute": 0.03, "N": 0.014, "D/N": 0.025},
             "heldout_gap_mae_by_bits": {"6-8": {"compute": 0.016}, "<=4": {"compute": 0.038}},
             "gap_mae_diff": {"value": 0.0, "se": 0.0}, "within_noise": True}]}


def test_a_three_split_selection_names_its_splits_tests_and_scores_by_bits():
    text = law_prose.selection_text(_three_splits())
    assert "on 3 held-out splits" in text
    assert "the most tokens per parameter (D/N ≥ 160: 32 runs left out whole, 64 fitted)" in text
    assert "`kumar_data` beats `chinchilla` (no precision term) (t = 11.13, p = 5.2e-06, 8 clusters, 114 gaps)" in text
    assert "Nested test: `kumar_data` does not beat `kumar` (t = 0.8, p = 0.22)" in text
    assert "no other law is within noise of it" in text
    assert "| chinchilla | 5 | no | 0.05 | 0.0385 | 0.0825 | 0.057 | +0.0340 ± 0.0100 | no |" in text
    assert "| chinchilla | 0.02167 | 0.13 |" in text and "| kumar_data | 0.016 | 0.038 |" in text
    # a split made but scored by no law is named with the reason
    sel = _three_splits()
    sel["splits"] = ["compute", "D/N"]
    for c in sel["candidates"]:
        c["heldout_gap_mae"]["N"] = None
        c["heldout_notes"] = {"N": "no row at the largest N has a matching reference run"}
    text = law_prose.selection_text(sel)
    assert "on 2 held-out splits" in text and "Not used: N (no row at the largest N has a matching reference run)." in text


def test_strict_splits_are_described_by_their_rule_and_the_choice_by_its_stability():
    sel = _three_splits()
    for d in sel["split_details"]:
        d["label"] = f"every row with {d['by']} >= {d['value']:g} held out (9 rows of 7 runs)"
    sel.update(stability={"kumar_data": 0.62, "chinchilla": 0.38}, stability_resamples=50,
               stability_unit="(N, seed) cell", rule="the fewest params within noise")
    text = law_prose.selection_text(sel)
    assert "every row with D/N >= 160 held out (9 rows of 7 runs)" in text and "left out whole" not in text
    assert "so a run's earlier rows are fitted and its later ones predicted" in text
    assert "Rule within noise: the fewest params within noise." in text
    assert "(N, seed) cells are resampled (50 resamples, the held-out errors not refitted): `kumar_data` 62%, `chinchilla` 38%." in text
