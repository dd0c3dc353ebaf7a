"""The calibrated predictor (scaling.study.analysis.prediction.calibrate) on synthetic IsoFLOP-like tables drawn from a known
law (chinchilla with its exponents held at the truth, so one budget identifies it), plus planted
per-recipe offsets, a shared extrapolation shift that grows with log compute (a random walk in
log10 C: each step between budgets N(0, (tau·decades)^2), one draw per dataset) and row noise.

Coverage is judged over many datasets because the shared shift is one draw per dataset: the rows of a
dataset are covered or missed together. The fits here skip the bootstrap (its compilation alone costs
~10 s; tests/cli/test_predict_rows.py runs it). With one backtest below the top budget the shared
term's tail is t with 1 dof: on these datasets a normal of the same scale covers about 60% of the
rows (the Cauchy ratio of two draws), t_1 all of them; the old intervals about a quarter."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from scaling.errors import ConfigError
from scaling.study.analysis.prediction import calibrate
from scaling.study.analysis import laws

TRUTH = dict(E=1.8, A=400.0, B=2000.0, alpha=0.34, beta=0.36)
LAW = "chinchilla[alpha=0.34, beta=0.36]"
FIT_KWARGS = {"init": {"E": [1.5, 2.0], "A": [100.0, 1000.0], "B": [500.0, 5000.0]}, "polish": 1, "iters": (20, 60)}
BUDGETS = (1e16, 10 ** 16.5, 1e17)
SIZES = (0.4, 0.63, 1.0, 1.6, 2.5)  # N / N_opt at each budget
RECIPES = {"bf16": (16, 0.0), "fp8": (8, 0.004), "fp6": (6, 0.008), "fp4": (4, 0.015)}  # P, planted offset
DATASETS = 12


def synthetic(seed: int, *, tau: float = 0.12, noise: float = 0.003, recipes=RECIPES, shifts=None) -> tuple[pd.DataFrame, np.ndarray]:
    """(results table, the planted shared shift at each budget): every recipe at every budget on the same
    five sizes (so gaps are matched), one run per (recipe, budget, size)."""
    rng = np.random.default_rng(seed)
    if shifts is None:
        steps = tau * np.diff(np.log10(BUDGETS)) * rng.standard_normal(len(BUDGETS) - 1)
        shifts = np.concatenate([[0.0], np.cumsum(steps)])
    rows = []
    for k, c in enumerate(BUDGETS):
        n_opt = np.sqrt(c / 120)
        for f in SIZES:
            n, d = n_opt * f, c / (6 * n_opt * f)
            base = float(laws.get("chinchilla").predict(TRUTH, {"N": np.array([n]), "D": np.array([d])})[0])
            for recipe, (p, offset) in recipes.items():
                rows.append({"run_id": f"{recipe}-{k}-{f}", "recipe": recipe, "P": p, "N": n, "D": d, "seed": 0,
                             "budget": c, "status": "ok",
                             "val_loss": base + offset + shifts[k] + noise * rng.standard_normal()})
    return pd.DataFrame(rows), np.asarray(shifts)


@pytest.fixture(scope="module")
def replicates():
    """The top budget backtested on DATASETS synthetic tables: [(planted shifts, pair)]."""
    out = []
    for seed in range(DATASETS):
        df, shifts = synthetic(seed)
        out.append((shifts, calibrate.backtest_pair(df, BUDGETS[1], BUDGETS[2], LAW, bootstrap=0, fit_kwargs=FIT_KWARGS,
                                                    draws=1500, seed=seed)))
    return out


def _top(result):
    if "pairs" not in result:
        return result
    return next(p for p in result["pairs"] if p["fit_budget"] == BUDGETS[1] and p["target_budget"] == BUDGETS[2])


@pytest.mark.slow
def test_calibrated_intervals_cover_a_shared_shift_at_their_nominal_rate_and_the_old_ones_do_not(replicates):
    """The top budget predicted from the two below, calibrated on the backtest inside them: over the
    datasets the calibrated 95% intervals hold about 95% of the rows; the old ones (law + in-sample
    lack of fit, independent per row) miss most rows of every dataset whose shift is large."""
    tops = [_top(r) for _, r in replicates]
    assert all(t["calibrated"]["available"] for t in tops)
    calibrated = sum(t["calibrated"]["inside"] for t in tops) / sum(t["calibrated"]["n"] for t in tops)
    old = sum(t["old"]["inside"] for t in tops) / sum(t["old"]["n"] for t in tops)
    assert calibrated >= 0.88, calibrated
    assert old <= 0.6, old
    # and not by being uselessly wide in every dataset: the planted shift's own spread is tau·0.5 = 0.06
    assert np.median([t["calibrated"]["mean_width"] for t in tops]) < 1.5


@pytest.mark.slow
def test_gap_intervals_are_narrower_than_level_intervals_when_the_shared_part_dominates(replicates):
    """The shared shift cancels in a gap: the calibrated gap intervals are several times narrower than
    the level intervals and still cover the measured gaps."""
    tops = [_top(r)["calibrated"] for _, r in replicates]
    assert all(t["gap_n"] == (len(RECIPES) - 1) * len(SIZES) for t in tops)
    level = np.median([t["mean_width"] for t in tops])
    gap = np.median([t["gap_mean_width"] for t in tops])
    assert gap < level / 3, (gap, level)
    assert sum(t["gap_inside"] for t in tops) / sum(t["gap_n"] for t in tops) >= 0.88


@pytest.mark.slow
def test_ranks_follow_the_recipe_correction_and_the_old_draws_only_guess(replicates):
    """Four recipes at each matched (N, D): the law has no precision term, so the old draws give each
    about a quarter of P(best); the calibrated ones, corrected by each recipe's in-sample misfit, put
    the measured best first at most points."""
    tops = [_top(r) for _, r in replicates]
    new = np.mean([t["calibrated"]["rank_hit"] for t in tops])
    old = np.mean([t["old"]["rank_hit"] for t in tops])
    assert new >= 0.6 and new > old + 0.25, (new, old)
    assert np.mean([t["calibrated"]["rank_p_measured"] for t in tops]) > 0.45
    assert np.mean([t["old"]["rank_p_measured"] for t in tops]) < 0.35


def test_every_pair_is_scored_and_one_with_no_backtest_below_it_says_so_in_words():
    """backtest_all: all three pairs; fitted on one budget there is no backtest to calibrate on, so no
    calibrated interval, a reason instead; the top pair is calibrated on the pair inside its budgets."""
    df, _ = synthetic(0)
    result = calibrate.backtest_all(df, LAW, bootstrap=0, fit_kwargs=FIT_KWARGS, draws=500)
    assert [(p["fit_budget"], p["target_budget"]) for p in result["pairs"]] == [
        (BUDGETS[0], BUDGETS[1]), (BUDGETS[0], BUDGETS[2]), (BUDGETS[1], BUDGETS[2])]
    for p in result["pairs"][:2]:
        assert p["calibrated"]["available"] is False
        assert "no backtest" in p["calibrated"]["reason"]
        assert "coverage" not in p["calibrated"]
        assert p["old"]["coverage"] is not None and p["n"] == len(RECIPES) * len(SIZES)
    top = _top(result)
    assert top["calibrated"]["calibrated_on"] == [[BUDGETS[0], BUDGETS[1]]]
    assert top["calibrated"]["calibration"]["k"] == 1
    assert top["calibrated"]["calibration"]["shared"] == [pytest.approx(result["pairs"][0]["shared"])]


def test_the_decomposition_recovers_a_planted_shared_shift_and_per_recipe_offsets():
    """A shift of +0.08 at the top budget only, and offsets the law (no precision term) cannot fit: the
    top backtest's shared part is the shift, its per-recipe parts the offsets about their mean, and the
    law's in-sample misfit per recipe (the correction a calibrated prediction weighs in) the same."""
    recipes = {"bf16": (16, 0.0), "fp8": (8, 0.03), "fp4": (4, 0.06)}  # symmetric: the law's robust fit centres on the mean
    df, _ = synthetic(1, noise=0.0005, recipes=recipes, shifts=(0.0, 0.0, 0.08))
    top = calibrate.backtest_pair(df, BUDGETS[1], BUDGETS[2], LAW, bootstrap=0, fit_kwargs=FIT_KWARGS, draws=500)
    assert top["shared"] == pytest.approx(0.08, abs=0.01)
    mean = np.mean([o for _, o in recipes.values()])
    for recipe, (_, offset) in recipes.items():
        assert top["per_recipe"][recipe] == pytest.approx(offset - mean, abs=0.004)
        assert top["recipe_bias"][recipe] == pytest.approx(offset - mean, abs=0.004)
    assert top["calibrated"]["calibration"]["recipe_weight"] == pytest.approx(1.0, abs=0.1)
    assert top["mean_error"] == pytest.approx(0.08, abs=0.01)


def test_decompose_splits_errors_into_shared_per_recipe_and_rows():
    errors = np.array([0.1, 0.12, 0.2, 0.2, 0.2])
    recipes = np.array(["a", "a", "b", "b", "b"])
    found = calibrate.decompose(errors, recipes)
    assert found["shared"] == pytest.approx((0.11 + 0.2) / 2)
    assert found["per_recipe"]["a"] == pytest.approx(0.11 - 0.155)
    assert found["row_dof"] == 3 and found["row_sd"] == pytest.approx(np.sqrt(2e-4 / 3))


def test_a_run_at_the_target_budget_is_left_out_of_the_fit_whole():
    """split: a run serving both budgets has its lower row left out; an unlabelled row counts at the
    smallest budget its run reaches at or after its tokens."""
    df = pd.DataFrame({"run_id": ["r1", "r1", "r2", "r3", "r3"], "D": [1.0, 2.0, 1.0, 0.5, 1.0],
                       "budget": [1.0, 3.0, 1.0, np.nan, 1.0]})
    assert list(calibrate.effective_budget(df)) == [1.0, 3.0, 1.0, 1.0, 1.0]
    fit, target = calibrate.split(df, 1.0, 3.0)
    assert list(fit) == [False, False, True, True, True]
    assert list(target) == [False, True, False, False, False]


def test_predict_table_gives_each_row_an_interval_a_gap_and_p_best():
    """Any rows: levels with calibrated intervals that widen beyond the fitted budgets, gaps to the
    reference at the same (N, D) narrower than the levels, P(best) summing to one per (N, D); a
    recipe with no runs is one ConfigError naming it."""
    df, _ = synthetic(3)
    n = 2e7
    table = pd.DataFrame({"N": [n] * 4 + [n], "D": [1e9] * 4 + [1e8], "recipe": ["bf16", "fp8", "fp6", "fp4", "bf16"]})
    out, facts = calibrate.predict_table(df, table, LAW, bootstrap=0, fit_kwargs=FIT_KWARGS, draws=1500)
    assert facts["calibration"]["k"] == 3 and facts["calibration"]["tau"] > 0
    assert (out["interval"] == "calibrated").all()
    assert ((out["loss_lo"] < out["loss"]) & (out["loss"] < out["loss_hi"])).all()
    assert out.loc[0, "distance"] > 0 and out.loc[4, "distance"] == 0
    assert out.loc[0, "loss_hi"] - out.loc[0, "loss_lo"] > out.loc[4, "loss_hi"] - out.loc[4, "loss_lo"]
    fp8 = out.loc[1]
    assert fp8["gap_reference"] == "bf16" and fp8["gap_hi"] - fp8["gap_lo"] < fp8["loss_hi"] - fp8["loss_lo"]
    assert out.loc[:3, "p_best"].sum() == pytest.approx(1.0)
    assert np.isnan(out.loc[4, "p_best"])
    with pytest.raises(ConfigError, match="recipe: got 'mxfp4'"):
        calibrate.predict_table(df, table.assign(recipe="mxfp4"), LAW, bootstrap=0, fit_kwargs=FIT_KWARGS)
    with pytest.raises(ConfigError, match="missing D"):
        calibrate.predict_table(df, table.drop(columns="D"), LAW)


def test_one_budget_gives_predictions_without_an_interval_and_says_why():
    df, _ = synthetic(4)
    one = df[df["budget"] == BUDGETS[0]]
    out, facts = calibrate.predict_table(one, pd.DataFrame({"N": [2e7], "D": [1e9], "recipe": ["fp8"]}), LAW,
                                         bootstrap=0, fit_kwargs=FIT_KWARGS, draws=500)
    assert facts["calibration"]["tau"] is None
    assert out.loc[0, "interval"].startswith("none: no backtest")
    assert np.isnan(out.loc[0, "loss_lo"]) and np.isfinite(out.loc[0, "loss"])
