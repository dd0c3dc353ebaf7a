"""The calibrated predictor (scaling.study.analysis.prediction.calibrate) on synthetic IsoFLOP-like tables drawn from a known
law (chinchilla with its exponents held at the truth, so one budget identifies it), plus planted
per-recipe offsets, a shared extrapolation shift that grows with log compute (a random walk in
log10 C: each step between budgets N(0, (tau·decades)^2), one draw per dataset) and row noise.

The fits here skip the bootstrap (its compilation alone costs ~10 s; tests/cli/test_predict_rows.py runs
it). Coverage and proper scores of the predictors on known truths: tests/study/test_predict_scores.py."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from scaling.errors import ConfigError
from scaling.study.analysis.prediction import calibrate, table as table_lib
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
                                                    draws=1500, seed=seed, nested=False)))
    return out


def _top(result):
    if "pairs" not in result:
        return result
    return next(p for p in result["pairs"] if p["fit_budget"] == BUDGETS[1] and p["target_budget"] == BUDGETS[2])


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


def test_every_backtest_is_scored_and_one_with_nothing_inside_says_so_in_words():
    """backtest_all: all three budget pairs and the size thresholds; a pair fitted on one budget is
    calibrated on the size backtests inside that budget alone; every predictor scored where it can be
    built, the winner named with its margin; the top pair's shifted baseline moves by the latest budget
    backtest's mean miss."""
    df, _ = synthetic(0)
    result = calibrate.backtest_all(df, LAW, bootstrap=0, fit_kwargs=FIT_KWARGS, draws=300, nested=False)
    assert [(p["fit_budget"], p["target_budget"]) for p in result["pairs"]] == [
        (BUDGETS[0], BUDGETS[1]), (BUDGETS[0], BUDGETS[2]), (BUDGETS[1], BUDGETS[2])]
    assert [p["kind"] for p in result["sizes"]] == ["size"] * len(result["sizes"]) and result["sizes"]
    for p in result["pairs"][:2]:
        assert all(k.startswith("N >= ") for k in p["calibrated"]["calibrated_on"])
    top = _top(result)
    assert top["calibrated"]["calibration"]["latest"] == f"C {BUDGETS[0]:.3g} -> {BUDGETS[1]:.3g}"
    assert top["shifted"]["shift"] == pytest.approx(result["pairs"][0]["mean_error"])
    for p in result["pairs"] + result["sizes"]:
        assert p["old"]["available"] and set(p["scores"]) <= set(calibrate.PREDICTORS)
        assert p["winner"] == min(p["scores"], key=lambda n: p["scores"][n]["crps"])
    choice = result["choice"]
    assert choice["winner"] in calibrate.PREDICTORS and choice["n"] >= 1
    assert choice["margin"] == pytest.approx(choice["crps"][choice["runner_up"]] - choice["crps"][choice["winner"]])
    # a lower mean CRPS than the winner's only where the calibrated predictor is kept, no baseline beating it beyond chance
    assert choice["margin"] >= 0 or (choice["winner"] == calibrate.DEFAULT
                                     and not choice["sign_test"][choice["runner_up"]]["passed"])
    # one budget of three sizes: no backtest either way, one line that says so
    small = df[(df["budget"] == BUDGETS[0]) & df["N"].isin(sorted(df["N"].unique())[:3])]
    with pytest.raises(ConfigError, match="a backtest can split"):
        calibrate.backtest_all(small, LAW, bootstrap=0, fit_kwargs=FIT_KWARGS)


def test_size_backtests_hold_out_every_row_at_or_beyond_their_threshold():
    """A size backtest fits only rows below its threshold and scores every row at or above it."""
    from scaling.study.analysis.prediction import backtest

    df, _ = synthetic(0)
    for t in backtest.size_thresholds(df):
        fit, target = backtest.size_split(df, t)
        assert (df.loc[fit, "N"] < t).all() and (df.loc[target, "N"] >= t).all() and (fit | target).all()
        assert df.loc[fit, "N"].nunique() >= max(backtest.MIN_SIZES, df["N"].nunique() / 2)


def test_the_decomposition_recovers_a_planted_shared_shift_and_per_recipe_offsets():
    """A shift of +0.08 at the top budget only, and offsets the law (no precision term) cannot fit: the
    top backtest's shared part is the shift, its per-recipe parts the offsets about their mean, and the
    law's in-sample misfit per recipe (the correction a calibrated prediction weighs in) the same."""
    recipes = {"bf16": (16, 0.0), "fp8": (8, 0.03), "fp4": (4, 0.06)}  # symmetric: the law's robust fit centres on the mean
    df, _ = synthetic(1, noise=0.0005, recipes=recipes, shifts=(0.0, 0.0, 0.08))
    top = calibrate.backtest_pair(df, BUDGETS[1], BUDGETS[2], LAW, bootstrap=0, fit_kwargs=FIT_KWARGS, draws=500,
                                  nested=False)
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
    out, facts = table_lib.predict_table(df, table, LAW, bootstrap=0, fit_kwargs=FIT_KWARGS, draws=1500,
                                         predictor="calibrated")
    assert facts["calibration"]["k"] == 2 and facts["calibration"]["shift"] != 0  # the planted random walk in C
    assert facts["predictor"] == "calibrated" and facts["choice"]["winner"] in calibrate.PREDICTORS
    assert (out["interval"] == "calibrated").all() and (out["predictor"] == "calibrated").all()
    assert ((out["loss_lo"] < out["loss"]) & (out["loss"] < out["loss_hi"])).all()
    assert out.loc[0, "distance"] > 0 and out.loc[4, "distance"] == 0
    assert out.loc[0, "loss_hi"] - out.loc[0, "loss_lo"] > out.loc[4, "loss_hi"] - out.loc[4, "loss_lo"]
    shift = facts["calibration"]["shift"] * out.loc[0, "distance"]  # beyond the data the shift, inside (row 4) none
    assert (out.loc[0, "loss"] - out.loc[0, "law_loss"]) - (out.loc[4, "loss"] - out.loc[4, "law_loss"]) == pytest.approx(shift)
    fp8 = out.loc[1]
    assert fp8["gap_reference"] == "bf16" and fp8["gap_hi"] - fp8["gap_lo"] < fp8["loss_hi"] - fp8["loss_lo"]
    assert out.loc[:3, "p_best"].sum() == pytest.approx(1.0)
    assert np.isnan(out.loc[4, "p_best"])
    with pytest.raises(ConfigError, match="recipe: got 'mxfp4'"):
        table_lib.predict_table(df, table.assign(recipe="mxfp4"), LAW, bootstrap=0, fit_kwargs=FIT_KWARGS)
    with pytest.raises(ConfigError, match="missing D"):
        table_lib.predict_table(df, table.drop(columns="D"), LAW)
    with pytest.raises(ConfigError, match="predictor: got 'best'"):
        table_lib.predict_table(df, table, LAW, predictor="best")
    # by default the winner of the results' own backtests predicts, and says so
    chosen, facts = table_lib.predict_table(df, table, LAW, bootstrap=0, fit_kwargs=FIT_KWARGS, draws=300)
    assert (chosen["predictor"] == facts["choice"]["winner"]).all()


def test_results_with_no_backtest_give_the_laws_own_interval_and_say_why():
    """One budget of three sizes: no backtest along compute or N, so the law's bootstrap interval, and a
    note that says why; asking for the calibrated predictor there is one line."""
    df, _ = synthetic(4)
    one = df[(df["budget"] == BUDGETS[0]) & df["N"].isin(sorted(df["N"].unique())[:3])]
    out, facts = table_lib.predict_table(one, pd.DataFrame({"N": [2e7], "D": [1e9], "recipe": ["fp8"]}), LAW,
                                         bootstrap=0, fit_kwargs=FIT_KWARGS, draws=500)
    assert facts["calibration"]["shift"] is None and facts["predictor"] == "bootstrap"
    assert out.loc[0, "interval"] == "bootstrap" and any("no backtest" in n for n in facts["notes"])
    assert out.loc[0, "loss_lo"] < out.loc[0, "loss"] < out.loc[0, "loss_hi"]
    with pytest.raises(ConfigError, match="predictor: got 'calibrated'"):
        table_lib.predict_table(one, pd.DataFrame({"N": [2e7], "D": [1e9], "recipe": ["fp8"]}), LAW, bootstrap=0,
                                fit_kwargs=FIT_KWARGS, draws=500, predictor="calibrated")


def _scored(kind: str, at: float, crps: dict[str, float]) -> dict:
    """A scored backtest as choose reads it: its kind, where it lies, each predictor's scores."""
    where = {"fit_budget": at, "target_budget": 10 * at} if kind == "budget" else {"threshold": at}
    return {"kind": kind, "label": f"{kind} {at:g}", **where,
            "scores": {p: {"crps": c, "interval_score": 4 * c, "coverage": {"0.95": 0.9}} for p, c in crps.items()}}


def test_a_baseline_replaces_the_calibrated_predictor_only_where_it_wins_beyond_chance():
    """choose: the bootstrap with the lower CRPS on both of a table's two backtests (one per kind) does not
    replace the calibrated predictor (2 of 2 is a coin toss, p = 0.25; was: the lowest mean CRPS over them
    won); the shifted law better on all of seven does (p = 1/128 < 0.05 / 2), on six of seven it does not
    (p = 1/16), and with no backtest scored the calibrated predictor stands, saying why."""
    two = [_scored("budget", 1e17, {"bootstrap": 0.010, "shifted": 0.013, "calibrated": 0.012}),
           _scored("size", 1e8, {"bootstrap": 0.008, "shifted": 0.011, "calibrated": 0.009})]
    found = calibrate.choose(two)
    assert found["winner"] == "calibrated" and found["n"] == 2 and found["runner_up"] == "bootstrap"
    assert found["sign_test"]["bootstrap"] == {"wins": 2, "n": 2, "p": 0.25, "passed": False}
    assert found["relative"] < 0 and found["crps"]["bootstrap"] < found["crps"]["calibrated"]
    from scaling.cli.predict import _choice_line  # `scaling predict` says why the higher mean CRPS is kept

    assert "(higher, kept: bootstrap's lower CRPS on 2 of 2 is within chance, sign test p = 0.25)" in _choice_line(found)
    seven = [_scored("size", 1e6 * 2 ** k, {"bootstrap": 0.02, "shifted": 0.009 + 0.001 * k, "calibrated": 0.010 + 0.001 * k})
             for k in range(7)]
    found = calibrate.choose(seven)
    assert found["winner"] == "shifted" and found["sign_test"]["shifted"]["p"] == pytest.approx(1 / 128)
    assert found["runner_up"] == "calibrated" and found["margin"] == pytest.approx(0.001) and found["relative"] > 0
    seven[3]["scores"]["shifted"]["crps"] = 0.5  # one backtest the shifted law loses
    seven[3]["scores"]["calibrated"]["crps"] = 0.0
    found = calibrate.choose(seven)
    assert found["winner"] == "calibrated" and found["sign_test"]["shifted"]["wins"] == 6
    assert found["sign_test"]["shifted"]["p"] == pytest.approx(8 / 128) and not found["sign_test"]["shifted"]["passed"]
    assert calibrate.choose([])["winner"] == "calibrated" and "not scored" in calibrate.choose([])["rule"]
    assert calibrate.sign_test(0, 0) == 1.0 and calibrate.sign_test(3, 3) == pytest.approx(1 / 8)


def _miss(threshold: float, shared: float, delta: float, n: int = 6) -> dict:
    """A size backtest's misses as calibration reads them: one recipe, row scatter 0.01 over n rows."""
    return {"kind": "size", "label": f"N >= {threshold:g}", "threshold": threshold, "fit_budget": None,
            "shared": shared, "delta": delta, "n": n, "mean_error": shared, "per_recipe": {"bf16": 0.0},
            "recipe_bias": {"bf16": 0.0}, "row_ss": 1e-4 * (n - 1), "row_dof": n - 1}


def test_with_backtests_of_one_kind_the_spread_is_the_misses_of_all_of_them_not_the_latest_alone():
    """One kind of backtest (a grid without budgets): the shift per decade is the latest backtest's miss, and
    its spread the root mean square of every backtest's miss per decade less the rows' noise, plus what that
    noise puts into the latest miss. Two tables whose latest misses differ thirteenfold but whose misses per
    decade have the same mean square get the same spread (was: |latest miss| counted twice, so the width
    followed one noisy number)."""
    sigma_e2 = lambda b: 1e-4 / b["n"] / b["delta"] ** 2
    per_decade, deltas, thresholds = (0.04, 0.025, 0.003), (0.4, 0.3, 0.2), (2e6, 3e6, 4e6)
    tables = [[_miss(t, m * d, d) for t, m, d in zip(thresholds, order, deltas)]
              for order in (per_decade, per_decade[::-1])]  # the same misses per decade, latest 0.003 or 0.04
    found = []
    for every in tables:
        c = calibrate.calibration(every, prefer="size")
        latest = every[-1]
        tau2 = np.mean([(b["shared"] ** 2 - 1e-4 / b["n"]) / b["delta"] ** 2 for b in every])
        assert c["k"] == 1 and c["backtests"] == [latest["label"]]
        assert c["shift"] == pytest.approx(latest["shared"] / latest["delta"])
        assert c["tau"] == pytest.approx(np.sqrt(tau2))
        assert c["shared_scale"] == pytest.approx(np.sqrt(tau2 + sigma_e2(latest)))
        assert any("all 3 of them" in n for n in c["notes"])
        found.append(c)
    assert (found[0]["shift"], found[1]["shift"]) == pytest.approx((0.003, 0.04))
    assert found[0]["shared_scale"] == pytest.approx(found[1]["shared_scale"])
    # one backtest alone: the spread is its miss per decade or, where that is below, its noise; never both
    only = tables[1][-1]
    c = calibrate.calibration([only], prefer="size")
    assert c["shared_scale"] == pytest.approx(max(abs(c["shift"]), np.sqrt(sigma_e2(only))))
