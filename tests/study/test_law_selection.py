"""Law selection: held-out error on the precision gaps, within-noise marking, laws that cannot be fitted,
the reference recipe and gaps, candidate variants, `scaling fit --law auto`."""

import itertools
import json

import numpy as np
import pandas as pd
import pytest

from scaling import cli
from scaling.study.analysis import fit, laws, selection

# Kumar et al.'s form plus a clear data-dependent penalty: at N = 1e8, P = 4 it is 0.07 nats at D = 1e9
# and 0.5 nats at D = 5e10 (kumar's own precision effect does not grow with D).
KUMAR_DATA = dict(E=1.8, A=400.0, B=2000.0, alpha=0.34, beta=0.36, gamma=2.5, kappa=3.0,
                  C_T=0.15, gamma_D=0.5, gamma_N=0.5, gamma_P=1.5)
# Small start grids (<= 64 starts per law: one compiled shape per law, the fits take a second each).
INIT = {"E": [2.0], "A": [100.0, 1e4], "B": [100.0, 1e4], "alpha": [0.3], "beta": [0.3], "gamma": [1.0, 4.0],
        "kappa": [1.0, 3.0], "C_T": [0.01, 1.0], "gamma_D": [0.3], "gamma_N": [0.3], "gamma_P": [1.0, 3.0]}
QUICK = dict(init=INIT, polish=1)


def kumar_data_runs(seed: int = 0) -> pd.DataFrame:
    """4 sizes x 6 budgets x P in {4, 6, 8, 32}: 96 rows (one run = one size and recipe, seen at 6
    budgets), loss = kumar_data · exp(0.005 · N(0, 1))."""
    df = pd.DataFrame(list(itertools.product([1e7, 3e7, 1e8, 3e8], [1e9, 2e9, 5e9, 1e10, 2e10, 5e10], [4, 6, 8, 32])),
                      columns=["N", "D", "P"])
    x = {c: df[c].to_numpy(float) for c in df.columns}
    noise = np.exp(0.005 * np.random.default_rng(seed).standard_normal(len(df)))
    df["val_loss"] = laws.get("kumar_data").predict(KUMAR_DATA, x) * noise
    df["recipe"] = ["fp32" if p == 32 else f"fp{p}" for p in df["P"]]
    df["run_id"] = [f"n{n:g}-{r}" for n, r in zip(df["N"], df["recipe"])]
    df["seed"] = 0
    return df


def by_name(selection):
    return {c["name"]: c for c in selection["candidates"]}


@pytest.mark.slow
def test_select_law_prefers_the_data_dependent_penalty():
    sel = selection.select_law(kumar_data_runs(), ["kumar", "kumar[kappa free]", "kumar_data"], **QUICK)
    c = by_name(sel)
    assert sel["chosen"] == "kumar_data"
    kd, ku, free = c["kumar_data"], c["kumar"], c["kumar[kappa free]"]
    # No budget column: three splits, each holding out every row at or beyond its threshold (the largest
    # N·D, the largest size, the largest D/N); kumar's gap does not grow with D.
    assert sel["splits"] == ["compute", "N", "D/N"]
    assert kd["heldout_gap_mae"]["N"] < min(ku["heldout_gap_mae"]["N"], free["heldout_gap_mae"]["N"])
    assert kd["score"] < min(ku["score"], free["score"])
    assert kd["params"]["gamma_D"] > 0  # the fitted penalty grows with D
    # Held out along N: the largest size at 6 budgets x 3 low precisions.
    assert kd["n_heldout"]["N"] == 18 == ku["n_heldout"]["N"]
    n_split = next(s for s in sel["split_details"] if s["by"] == "N")
    assert n_split["held_runs"] == 4 and n_split["train_runs"] == 12
    assert (kd["n_params"], ku["n_params"], free["n_params"]) == (10, 6, 7)
    assert free["fixed"] == {} and ku["fixed"] == {"kappa": 3.0} and kd["within_noise"]
    assert kd["aic"] < ku["aic"] and kd["mare"] < ku["mare"]
    assert sel["reference"]["recipes"] == ["fp32"] and sel["clustered_by"] == "recipe"
    by_n = sel["chosen_residuals_by_split"]["N"]
    assert [r["recipe"] for r in by_n] == ["fp4", "fp6", "fp8"]
    assert all(r["n"] == 6 and r["runs"] == 1 and r["ci"] is None for r in by_n)
    json.dumps(sel)  # JSON-ready as returned


@pytest.mark.slow
def test_law_auto_puts_p_star_within_a_bit_of_the_truth():
    from scaling.study.analysis.pstar import optimal

    sel, fits = selection.select(kumar_data_runs(), ["kumar", "kumar_data"], fit_kwargs=QUICK)
    chosen = fits[sel["chosen"]]
    truth = fit.FitResult(law="kumar_data", params=KUMAR_DATA, objective=0.0, residuals=np.array([]),
                          fixed={}, data={})
    for compute in (1e18, 1e20):  # inside and beyond the runs' compute (6·N·D up to 9e19)
        want = optimal.optimal_precision(truth, compute, p_range=(2.0, 32.0))["P"]
        got = optimal.optimal_precision(chosen, compute, p_range=(2.0, 32.0))["P"]
        assert sel["chosen"] == "kumar_data" and abs(got - want) < 1.0, (compute, got, want)


def isoflop_runs(seed: int = 0, offset: float = 0.05) -> pd.DataFrame:
    """An IsoFLOP design at 1e15, 1e16 and 3e16 FLOPs over sizes 1e6 · 2^i: i in 0..4, 3..8 and 5..9.
    A run is (size, recipe); one at a size two budgets share serves both (its evaluations at each
    budget's tokens), and every run is also evaluated at a quarter and half of its tokens (no budget).
    bf16 (P = 16) is the reference, int8 (P = 8) the quantised recipe; loss = kumar + a persistent
    offset per int8 run (N(0, offset): the run's own luck, the same at every checkpoint) + 0.002 noise."""
    rng = np.random.default_rng(seed)
    sizes = 1e6 * 2.0 ** np.arange(10)
    luck = offset * rng.standard_normal(len(sizes))
    rows = []
    for budget, idx in {1e15: range(0, 5), 1e16: range(3, 9), 3e16: range(5, 10)}.items():
        for i, (P, recipe), frac in itertools.product(idx, ((16, "bf16"), (8, "int8")), (0.25, 0.5, 1.0)):
            rows.append(dict(N=sizes[i], D=frac * budget / (6 * sizes[i]), P=P, recipe=recipe, seed=0,
                             budget=budget if frac == 1 else np.nan, run_id=f"{recipe}-{i}",
                             cell=0 if P == 16 else i + 1, luck=0.0 if P == 16 else luck[i]))
    df = pd.DataFrame(rows)
    x = {c: df[c].to_numpy(float) for c in ("N", "D", "P")}
    kumar = {k: KUMAR_DATA[k] for k in ("E", "A", "B", "alpha", "beta", "gamma", "kappa")}
    df["val_loss"] = laws.get("kumar").predict(kumar, x) + df.pop("luck") + 0.002 * rng.standard_normal(len(df))
    return df


def test_the_budget_split_holds_out_the_largest_budget_and_fits_the_same_runs_earlier_rows():
    """Strict rows: every row at or beyond the largest budget's compute is held out (here the 10 rows
    labelled 3e16: 5 sizes x 2 recipes), and nothing else: the same runs' earlier evaluations (a quarter and
    half of their tokens, no budget label) and sizes 5..8's rows at 1e16 stay in the fit, since predicting a
    run's later tokens from its earlier ones is the honest test in D."""
    df = isoflop_runs()
    top = (df["budget"] == 3e16).to_numpy()
    split = next(s for s in selection.heldout_splits(df)[0] if s.by == "budget")
    assert (split.train == ~top).all() and top.sum() == 10
    # every fitted row is below the threshold in compute (6·N·D, the design's)
    assert (6 * df.loc[split.train, "N"] * df.loc[split.train, "D"] < 3e16).all()
    # the held-out runs' other rows: 2 earlier evaluations each, and sizes 5..8's 3 rows at 1e16 (both recipes)
    earlier = df["run_id"].isin(df.loc[top, "run_id"]) & ~top
    assert earlier.sum() == 10 * 2 + 2 * 4 * 3 and split.train[earlier.to_numpy()].all()
    assert split.scored.sum() == 5 and set(df.loc[split.scored, "recipe"]) == {"int8"}
    assert selection._describe_split(df, split) == {
        "by": "budget", "key": "budget", "value": 3e16, "label": "every row with budget >= 3e16 held out (10 rows of 10 runs)",
        "held_rows": 10, "held_runs": 10, "scored_rows": 5, "train_rows": len(df) - 10, "train_runs": 20, "note": None}


@pytest.mark.slow
def test_the_budget_split_fits_no_row_at_or_beyond_the_largest_budget(monkeypatch):
    """The reference evaluated at the largest budget's compute under another run id and without a budget
    label (its compute: 6·N·D times its recipe's budget per 6·N·D) is held out too; the split's fit sees
    exactly the rows below the threshold."""
    df = isoflop_runs()
    ref_elsewhere = pd.DataFrame([{**df.iloc[0].to_dict(), "run_id": "bf16-extra", "N": 3.2e7, "D": 3e16 / (6 * 3.2e7),
                                   "budget": np.nan}])
    df = pd.concat([df, ref_elsewhere], ignore_index=True)
    split = selection.heldout_split(df)
    assert split.by == "budget" and not split.train[-1] and split.held_rows == 11
    assert split.label == "every row with budget >= 3e16 held out (11 rows of 11 runs)"
    seen = []
    real_fit = fit.fit_law

    def spy(data, *args, **kwargs):
        seen.append(data)
        return real_fit(data, *args, **kwargs)

    monkeypatch.setattr(fit, "fit_law", spy)
    selection.select_law(df, ["kumar"], resamples=0, **QUICK)
    fitted = [d for d in seen if len(d) == int(split.train.sum())]
    assert fitted and all((6 * d["N"] * d["D"] < 3e16).all() and "bf16-extra" not in set(d["run_id"]) for d in fitted)


def test_a_runs_rows_below_the_largest_budget_stay_and_without_a_usable_budget_the_n_split_is_first():
    df = kumar_data_runs()
    df["budget"] = np.where(df["D"] >= 2e10, 3e12, 1e12)  # every run's two last evaluations at the largest budget
    split = selection.heldout_split(df)
    assert split.by == "budget" and set(df.loc[~split.train, "D"]) == {2e10, 5e10}
    assert df.loc[split.train, "run_id"].nunique() == 16  # every run keeps its earlier rows in the fit
    one = selection.heldout_split(df.assign(budget=1e12))
    assert one.by == "N" and set(df.loc[~one.train, "N"]) == {3e8} and set(df.loc[one.train, "N"]) == {1e7, 3e7, 1e8}
    assert one.note == "fewer than two values of budget with a gap to the reference"
    assert selection.heldout_split(kumar_data_runs()).note == "no budget column"
    assert "fewer than two values of N" in selection.heldout_split(df[df["N"] == 3e8].assign(budget=1e12))


@pytest.mark.slow
def test_a_split_whose_held_out_gaps_come_from_one_run_is_not_used():
    """One run's held-out error has no standard error: the split is noted and not ranked on, so no
    law is called worse than another on one run; the other splits rank (with none, the choice falls
    back to AIC)."""
    df = kumar_data_runs()
    df = df[(df["N"] < 3e8) | df["recipe"].isin(["fp32", "fp4"])]  # the largest size: fp32 and one fp4 run
    sel = selection.select_law(df, ["kumar", "kumar[kappa free]"], **QUICK)
    for c in sel["candidates"]:
        assert c["n_heldout"]["N"] == 0 and "from one run" in c["heldout_notes"]["N"], c
        assert c["score"] is not None
    assert "N" not in sel["splits"] and sel["splits"] and sel["criterion"].startswith("heldout")
    entries = [{"name": "a", "fittable": True, "n_params": 5, "aic": 1.0}, {"name": "b", "fittable": True, "n_params": 5, "aic": 0.0}]
    assert selection._choose(entries, {}, np.zeros(0))[1].startswith("aic") and entries[1]["within_noise"]


def test_unfittable_laws_are_listed_with_the_reason():
    df = kumar_data_runs()
    sel = selection.select_law(df, ["sun", "quartet", "capacity"], **QUICK)
    assert sel["chosen"] is None
    for c in sel["candidates"]:
        assert not c["fittable"] and not c["within_noise"] and "missing" in c["reason"], c
    assert "missing ebits, mbits, block" in by_name(sel)["sun"]["reason"]
    # A constant column (one precision only) and too few rows are reasons too, not exceptions.
    assert "constant on the data (P = 32)" in fit.unfittable_reason(df[df["P"] == 32], "kumar", loss_column="val_loss")
    assert "rows: got 5" in fit.unfittable_reason(df.head(5), "chinchilla", loss_column="val_loss")
    capacity_df = pd.DataFrame(dict(N=[1e7, 1e8] * 4, D=[1e9] * 4 + [1e10] * 4, qerr_w=[0.0, 0.01] * 4,
                                    qerr_a=[0.0] * 8, qerr_g=[0.0] * 8, loss=[3.0] * 8))
    # capacity needs only one of its qerr columns to vary (the roles share F and C).
    assert fit.unfittable_reason(capacity_df, "capacity") is None
    assert "qerr_w = 0, qerr_a = 0, qerr_g = 0" in fit.unfittable_reason(capacity_df.assign(qerr_w=0.0), "capacity")


def test_candidates_and_variants():
    assert "kumar[kappa free]" in selection.default_candidates() and "kumar" in selection.default_candidates()
    # the per-recipe laws compete by default: the selection, not the user, says whether recipes of equal
    # bits need gaps of their own
    assert {"recipe_gap", "kumar_eff"} <= set(selection.default_candidates())
    assert selection.parse_candidate("kumar[kappa free]") == selection.Candidate("kumar[kappa free]", "kumar", {})
    assert selection.parse_candidate("kumar").fixed == {"kappa": 3.0}
    assert selection.parse_candidate("kumar_data[kappa=2, gamma_D=0.5]").fixed == {"kappa": 2.0, "gamma_D": 0.5}
    for bad in ("kumar[kapa free]", "kumar[kappa=x]", "kumar[kappa free", "nope"):
        with pytest.raises(selection.ConfigError):
            selection.parse_candidate(bad)
    with pytest.raises(selection.ConfigError, match="not with select_law"):
        selection.select_law(kumar_data_runs(), ["kumar"], fixed={})


def test_reference_recipe_and_precision_gaps():
    # fp32 is the reference; "bwd8" (only gradients quantised) also has P = 32 but must not be.
    df = pd.DataFrame({
        "N": [1e7] * 6 + [1e8],
        "D": [1e9] * 7,
        "seed": [0, 1, 0, 0, 1, 2, 0],
        "recipe": ["fp32", "fp32", "bwd8", "fp8", "fp8", "fp8", "fp8"],
        "P": [32, 32, 32, 8, 8, 8, 8], "P_g": [32, 32, 8, 8, 8, 8, 8],
        "val_loss": [3.0, 3.2, 3.05, 3.1, 3.4, 3.5, 2.9],
    }, index=list("abcdefg"))
    assert list(selection.reference_mask(df)) == [True, True, False, False, False, False, False]
    gaps = selection.gaps_to_reference_rows(df)
    assert list(gaps.index) == list("abcdefg")
    # Matched on (N, D, seed): seed 2 and N = 1e8 have no fp32 run; reference rows have no gap.
    np.testing.assert_allclose(gaps.to_numpy(), [np.nan, np.nan, 0.05, 0.1, 0.2, np.nan, np.nan], atol=1e-12)
    assert selection.reference_mask(df, "bwd8").tolist() == [False, False, True, False, False, False, False]
    with pytest.raises(selection.ConfigError, match="reference: got 'bf16'"):
        selection.reference_mask(df, "bf16")


def _entry(name, k=5):
    return {"name": name, "fittable": True, "n_params": k, "aic": 0.0, "heldout_gap_mae": {"budget": None}}


def test_within_noise_is_one_standard_error_of_the_best_score():
    # 30 recipes x 2 held-out rows. "twin" differs from the best by noise around zero, "worse" by a
    # consistent 0.02 nats per row: only the twin is within noise, and all within noise are listed.
    rng = np.random.default_rng(0)
    clusters = np.repeat(np.arange(30), 2)
    pos = np.arange(60)
    best = 0.01 * rng.standard_normal(60)
    errs = {"best": best, "twin": best + 0.005 * rng.standard_normal(60), "worse": np.abs(best) + 0.02}
    entries = [_entry(n) for n in errs]
    chosen, _ = selection._choose(entries, {n: (pos, e) for n, e in errs.items()}, clusters)
    c = {e["name"]: e for e in entries}
    assert chosen in ("best", "twin") and c["best"]["within_noise"] and c["twin"]["within_noise"]
    assert not c["worse"]["within_noise"]
    assert c["worse"]["gap_mae_diff"]["value"] > 2 * c["worse"]["gap_mae_diff"]["se"] > 0
    # The band is the best score plus one of the best law's own clustered SEs.
    top = min(c["best"]["score"], c["twin"]["score"]) + selection._score_se(
        min((c["best"], c["twin"]), key=lambda e: e["score"]), {n: {"heldout": (pos, e)} for n, e in errs.items()},
        ["heldout"], clusters)
    assert c["twin"]["score"] <= top < c["worse"]["score"]


def test_a_law_wild_on_one_recipe_is_not_within_noise_on_its_own_huge_standard_error():
    """A law 20x worse on average only because it is wild on one of 8 recipes has a paired SE as large as
    its excess; the band is the best law's SE, so that law is out of noise (a band set by the paired SE
    called such a law "within noise")."""
    rng = np.random.default_rng(4)
    clusters = np.repeat(np.arange(8), 5)
    pos = np.arange(40)
    good = 0.02 * rng.standard_normal(40)
    wild = good.copy()
    wild[clusters == 3] += 5.0  # one recipe mispriced by 5 nats
    entries = [_entry("good", 6), _entry("wild", 5)]
    chosen, _ = selection._choose(entries, {"good": (pos, good), "wild": (pos, wild)}, clusters)
    c = {e["name"]: e for e in entries}
    diff = c["wild"]["gap_mae_diff"]
    assert chosen == "good" and not c["wild"]["within_noise"]
    assert diff["value"] < 2 * diff["se"]  # a paired 2-SE band would have let it in


def test_clustered_standard_error_by_hand():
    # d = 1, 2, 3, 6 in clusters a, a, b, c: mean 3, deviations -2, -1, 0, 3, cluster sums -3, 0, 3;
    # variance of the mean = G/(G-1) · sum of squared sums / n^2 = 3/2 · 18/16 = 1.6875.
    mean, var = selection.clustered_mean_and_var(np.array([1.0, 2.0, 3.0, 6.0]), np.array(list("aabc")))
    assert mean == 3.0 and var == pytest.approx(1.6875, rel=1e-15)
    assert np.isnan(selection.clustered_mean_and_var(np.array([1.0, 2.0]), np.array([0, 0]))[1])
    # In selection the clusters are the recipes: two laws' |errors| differ by d on rows of recipes a, a, b, c.
    df = pd.DataFrame({"recipe": list("aabc"), "run_id": list("wxyz")})
    clusters, by = selection.recipe_clusters(df)
    assert by == "recipe" and list(clusters) == [0, 0, 1, 2]
    entries = [_entry("best"), _entry("other")]
    zero = np.zeros(4)
    selection._choose(entries, {"best": (np.arange(4), zero), "other": (np.arange(4), np.array([1.0, -2.0, 3.0, 6.0]))}, clusters)
    assert entries[1]["gap_mae_diff"] == {"value": 3.0, "se": pytest.approx(1.6875 ** 0.5, rel=1e-15)}
    assert not entries[1]["within_noise"]  # 3.0 > the best's score 0 + its SE 0
    # Each row its own cluster instead: 4/3 · (4 + 1 + 0 + 9) / 16 = 1.1667, a narrower interval.
    assert selection.clustered_mean_and_var(np.array([1.0, 2.0, 3.0, 6.0]), np.arange(4))[1] == pytest.approx(14 / 12, rel=1e-15)


def test_residuals_by_recipe_by_hand():
    df = pd.DataFrame({"recipe": ["fp8", "fp8", "fp8", "fp4"], "run_id": ["r1", "r2", "r3", "r4"]})
    out = selection.heldout_errors_by_recipe(df, np.arange(4), np.array([0.01, 0.03, 0.05, -0.02]))
    fp4, fp8 = out
    assert fp4 == {"recipe": "fp4", "n": 1, "runs": 1, "mean": -0.02, "ci": None}
    # fp8: mean 0.03, clustered variance 3/2 · (0.02^2 + 0 + 0.02^2) / 9, t(0.975, 2 dof) = 4.303
    half = 4.302652729911275 * (1.5 * 8e-4 / 9) ** 0.5
    assert fp8["n"] == 3 and fp8["mean"] == pytest.approx(0.03) and fp8["ci"] == pytest.approx([0.03 - half, 0.03 + half])


@pytest.mark.slow
def test_cli_law_auto_writes_the_chosen_fit_with_selection(tmp_path, capsys, monkeypatch):
    csv = tmp_path / "results.csv"
    kumar_data_runs().to_csv(csv, index=False)
    out = tmp_path / "fits" / "auto.json"
    select = selection.select  # the CLI fits with each law's default grid; small grids keep the test quick
    monkeypatch.setattr(selection, "select", lambda df, c, loss, ref=None, kw=None: select(df, c, loss, ref, {**(kw or {}), **QUICK}))
    argv = ["fit", str(csv), "--law", "auto", "--candidate", "kumar", "--candidate", "kumar_data",
            "--candidate", "sun", "-o", str(out)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    stored = json.loads(out.read_text())
    result = fit.FitResult.from_json(out)
    assert result.law == "kumar_data" and result.selection["chosen"] == "kumar_data" == stored["selection"]["chosen"]
    cands = by_name(result.selection)
    assert result.params == pytest.approx(cands["kumar_data"]["params"])
    assert not cands["sun"]["fittable"] and cands["kumar"]["heldout_gap_mae"]["N"] > 0
    lines = [line for line in printed.splitlines() if line[2:].split(" ")[0] in cands]
    assert len(lines) == 3 and lines[1].startswith("* kumar_data") and "not fitted" in lines[2]
    # each split's rule, and one line with the stability of the choice and the rule for laws within noise
    assert "  gap|N: every row with N >= 3e8 held out (24 rows of 4 runs), 18 gaps scored" in printed.splitlines()
    stab = next(line for line in printed.splitlines() if line.startswith("stability: "))
    assert stab.endswith(f"of 50 resamples of (N, seed) cells; within noise: {selection.TIE_RULE}")
    assert set(result.selection["stability"]) == {"kumar", "kumar_data"}
    # --fix belongs to a named law; with auto the variants are candidates.
    assert cli.main(argv + ["--fix", "kappa=2"]) == 2
    assert "error: --fix" in capsys.readouterr().err


def test_a_degenerate_fit_is_scored_but_not_chosen_while_a_sound_one_exists():
    """A law whose full-data fit is degenerate (a param at its bound) has the lowest held-out error here,
    but no optimum may be derived from it: the best sound law is chosen, the degenerate one stays
    scored and within noise; only when every law is degenerate is the best of them taken."""
    rng = np.random.default_rng(1)
    clusters, pos = np.repeat(np.arange(20), 3), np.arange(60)
    errs = {"flat": 0.005 * rng.standard_normal(60), "sound": 0.006 * rng.standard_normal(60)}
    entries = [_entry(n) for n in errs]
    entries[0]["degenerate"] = "E = 1.8e-117 is at its bound 0"
    chosen, _ = selection._choose(entries, {n: (pos, e) for n, e in errs.items()}, clusters)
    c = {e["name"]: e for e in entries}
    assert c["flat"]["score"] < c["sound"]["score"] and chosen == "sound"
    assert c["flat"]["within_noise"] and c["flat"]["score"] is not None
    entries[1]["degenerate"] = "exponent alpha = -0.01 <= 0"
    assert selection._choose(entries, {n: (pos, e) for n, e in errs.items()}, clusters)[0] == "flat"
    from scaling.study.report import law_prose
    text = law_prose._degenerate_text({"candidates": entries})
    assert "`flat` (E = 1.8e-117 is at its bound 0)" in text and "`sound` (exponent alpha" in text


def test_without_held_out_gaps_the_aic_choice_is_the_sound_fit_with_the_lowest_aic():
    """A small study may score no held-out gap: the AIC fallback then takes the lowest-AIC law whose
    full-data fit is sound, and a degenerate one only where every fit is."""
    entries = [{"name": "sun", "fittable": True, "n_params": 7, "aic": -50.0, "degenerate": "the CI of A has collapsed"},
               {"name": "kumar", "fittable": True, "n_params": 6, "aic": -40.0, "degenerate": None}]
    chosen, criterion = selection._choose(entries, {}, np.zeros(0))
    assert chosen == "kumar" and criterion.startswith("aic") and "sound" in criterion
    entries[1]["degenerate"] = "exponent alpha = -0.1 <= 0"
    assert selection._choose(entries, {}, np.zeros(0))[0] == "sun"


@pytest.mark.slow
def test_a_law_its_own_bootstrap_finds_degenerate_gives_way_to_the_next_sound_one(monkeypatch):
    """The chosen law's resamples can make it degenerate (a CI at a bound) where its full-data fit was
    sound: `chosen_fit` then keeps the next candidate in the selection's order whose bootstrap is sound,
    records the law set aside and says so in the criterion; every candidate degenerate keeps the first."""
    df = kumar_data_runs()
    choice, fits = selection.select(df, ["kumar", "kumar_data", "kumar[kappa free]"], "val_loss", None, QUICK)
    first = choice["chosen"]
    bad = {first}

    def bootstrap(df, result, n, seed, loss_column):  # resamples that collapse the laws in `bad`
        result.degenerate = "the CI of A (1 to 1) has collapsed to its value" if result.law_name in bad else None

    monkeypatch.setattr(fit, "bootstrap_fit", bootstrap)
    for r in fits.values():
        r.law_name = next(n for n, f in fits.items() if f is r)
    result = selection.chosen_fit(df, choice, fits, bootstrap=10)
    order = sorted((c for c in choice["candidates"] if c["name"] != first),
                   key=lambda c: (c["score"] if c["score"] is not None else np.inf, c["aic"]))
    assert choice["chosen"] == order[0]["name"] != first and result is fits[order[0]["name"]]
    assert result.degenerate is None and result.selection["chosen"] == order[0]["name"]
    assert choice["set_aside"] == [{"name": first, "reason": "the CI of A (1 to 1) has collapsed to its value"}]
    assert f"`{first}` set aside: its bootstrap made it degenerate" in choice["criterion"]
    choice, fits = selection.select(df, ["kumar", "kumar_data", "kumar[kappa free]"], "val_loss", None, QUICK)
    for r in fits.values():
        r.law_name = next(n for n, f in fits.items() if f is r)
    bad = set(fits)
    first = choice["chosen"]
    assert selection.chosen_fit(df, choice, fits, bootstrap=10) is fits[first] and len(choice["set_aside"]) == 3


def test_the_table_does_not_call_the_chosen_law_not_chosen_when_every_law_is_degenerate(capsys):
    """A new user's 8-run study: every law degenerate, the lowest-AIC one starred and flagged 'not chosen'."""
    from scaling.cli import fit as fit_cli

    def entry(name, aic):
        return {"name": name, "law": name, "fittable": True, "n_params": 5, "aic": aic, "mare": 0.012, "score": None,
                "heldout_gap_mae": {}, "gap_mae_diff": None, "within_noise": name == "chinchilla",
                "degenerate": "E = 2.2e-10 is at its bound 0"}

    choice = {"reference": {"recipes": ["bf16"]}, "splits": [], "noise_se": 2, "clustered_by": "recipe",
              "chosen": "chinchilla", "candidates": [entry("kumar", -55.0), entry("chinchilla", -57.0)]}
    fit_cli._print_selection(choice)
    lines = {line.split()[1] if line.startswith("*") else line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:4]}
    assert lines["chinchilla"].startswith("* chinchilla") and lines["chinchilla"].endswith("degenerate, as every fitted law is")
    assert lines["kumar"].endswith("degenerate: not chosen")
