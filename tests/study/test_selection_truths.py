"""Law selection on synthetic truths: a precision penalty that grows with D (a data-dependent law is
chosen), no precision effect at all (chinchilla is chosen and the precision test says no), and recipes of
equal bits whose true efficiencies differ (the per-recipe law ranks them; a bits-only law cannot).

Each study is a ladder of runs (N, final D/N, recipe, seed), every run evaluated at several points of its
WSD schedule (three checkpoints), with a persistent luck per run and noise per evaluation. Small start
grids keep each fit to a second or two."""

import itertools

import numpy as np
import pandas as pd
import pytest

from scaling.study.analysis import fit, laws, selection

SIZES = (1e7, 3e7, 1e8, 3e8)
TOKENS_PER_PARAM = (10.0, 40.0, 160.0)
FRACTIONS = (0.25, 0.5, 1.0)  # a run's WSD evaluations, as fractions of its final tokens
SEEDS = (0, 1)
BITS = {"bf16": 16, "fp8": 8, "fp6": 6, "fp4": 4}
CHINCHILLA = dict(E=1.8, A=400.0, B=2000.0, alpha=0.34, beta=0.36)
# Kumar et al.'s form plus a penalty growing with D/N: at P = 4 it is 0.03 nats at D/N = 10 and 0.13 at
# D/N = 160 (kumar's own precision effect, through N_eff, does not depend on D).
KUMAR_DATA = dict(CHINCHILLA, gamma=1.2, kappa=3.0, C_T=0.15, gamma_D=0.5, gamma_N=0.5, gamma_P=1.5)
INIT = {"E": [2.0], "A": [100.0, 1e4], "B": [100.0, 1e4], "alpha": [0.3], "beta": [0.3], "gamma": [1.0, 3.0],
        "C_T": [0.01, 1.0], "gamma_D": [0.3], "gamma_N": [0.3], "gamma_P": [1.0, 3.0]}
QUICK = dict(init=INIT, polish=1)


def ladder(truth: str, params: dict, bits: dict = BITS, seed: int = 0, luck: float = 0.004,
           noise: float = 0.002) -> pd.DataFrame:
    """Every (size, D/N, recipe, seed) run at FRACTIONS of its tokens; loss = truth · exp(run luck + noise)."""
    rng = np.random.default_rng(seed)
    rows = []
    for n, dn, recipe, s in itertools.product(SIZES, TOKENS_PER_PARAM, bits, SEEDS):
        run_luck = luck * rng.standard_normal()
        for frac in FRACTIONS:
            rows.append(dict(N=n, D=frac * dn * n, P=bits[recipe], recipe=recipe, seed=s,
                             run_id=f"{recipe}-{n:g}-{dn:g}-{s}", luck=run_luck))
    df = pd.DataFrame(rows)
    law = laws.get(truth)
    if law.per_recipe:
        law = law.for_recipes(list(bits))
    x = fit._columns(law, df)
    df["val_loss"] = law.predict(params, x) * np.exp(df.pop("luck") + noise * rng.standard_normal(len(df)))
    return df


def by_name(sel):
    return {c["name"]: c for c in sel["candidates"]}


@pytest.mark.slow
def test_a_penalty_growing_with_d_picks_the_data_dependent_law():
    sel = selection.select_law(ladder("kumar_data", KUMAR_DATA), ["chinchilla", "kumar", "kumar_data"], **QUICK)
    c = by_name(sel)
    assert sel["chosen"] == "kumar_data", sel["criterion"]
    # three strict held-out splits (every row at or beyond each threshold): the largest N·D, N and D/N
    assert sel["splits"] == ["compute", "N", "D/N"]
    assert [s["by"] for s in sel["split_details"]] == ["compute", "N", "D/N"]
    # scored on every split, ranked on their mean; along D/N kumar, whose gap ignores D, misses most
    assert c["kumar_data"]["score"] < c["kumar"]["score"] < c["chinchilla"]["score"]
    assert c["kumar_data"]["heldout_gap_mae"]["D/N"] < 0.7 * c["kumar"]["heldout_gap_mae"]["D/N"]
    # the precision test, clustered by (N, seed), on the law the tie rule keeps: kumar scores beyond one
    # of kumar_data's standard errors (the one-SE rule), so kumar_data itself is tested; it beats
    # chinchilla at 0.05 / 2 (Bonferroni over the two precision laws it was picked among)
    assert "kumar" not in sel["within_noise"]
    pt = sel["precision_test"]
    assert pt["small"] == "chinchilla" and pt["big"] == "kumar_data" and pt["beats"] and pt["bonferroni"] == 2
    assert pt["p_value"] < pt["alpha"] == 0.025 and pt["n_clusters"] == len(SIZES) * len(SEEDS)
    # kumar_data against the law it nests, kumar: the extra term is supported
    nested = {(t["big"], t["small"]): t for t in sel["nested_tests"]}
    assert nested[("kumar_data", "kumar")]["beats"]
    # scores by bits: the D-dependent penalty is largest at 4 bits, where kumar misses most
    by_bits = c["kumar"]["heldout_gap_mae_by_bits"]
    assert by_bits["<=4"]["D/N"] > by_bits["6-8"]["D/N"] > 0
    assert sel["bits_groups"] == {"6-8": [6.0, 8.0], "<=4": [0.0, 4.0]}


@pytest.mark.slow
def test_b_no_precision_effect_picks_chinchilla_and_the_precision_test_says_no():
    sel = selection.select_law(ladder("chinchilla", CHINCHILLA), ["chinchilla", "kumar"], **QUICK)
    pt = sel["precision_test"]
    assert sel["chosen"] == "chinchilla", sel["criterion"]
    assert pt["small"] == "chinchilla" and not pt["beats"] and pt["p_value"] >= 0.05
    assert "no law with a precision term beats" in pt["verdict"] and "precision test" in sel["criterion"]
    assert "chinchilla" in sel["within_noise"]


# Three recipes of 4 bits that truly differ in parameter (eN) and data (eD) efficiency; bf16 the reference.
EFFICIENCY = {"bf16": (1.0, 1.0), "fp4-a": (0.45, 0.9), "fp4-b": (0.6, 0.95), "fp4-c": (0.8, 1.0)}
EQUAL_BITS = {"bf16": 16, "fp4-a": 4, "fp4-b": 4, "fp4-c": 4}


@pytest.mark.slow
def test_c_a_per_recipe_law_ranks_recipes_of_equal_bits_and_a_bits_law_cannot():
    truth = dict(CHINCHILLA, **{f"eN[{r}]": e[0] for r, e in EFFICIENCY.items()},
                 **{f"eD[{r}]": e[1] for r, e in EFFICIENCY.items()})
    df = ladder("kumar_eff", truth, bits=EQUAL_BITS)
    small = dict(init={k: INIT[k] for k in CHINCHILLA}, polish=1)
    eff = fit.fit_law(df, "kumar_eff", loss_column="val_loss", **small)
    bits = fit.fit_law(df, "kumar", loss_column="val_loss", init={**small["init"], "gamma": [1.0, 3.0]}, polish=1)
    assert eff.fixed == {"eN[bf16]": 1.0, "eD[bf16]": 1.0} and eff.degenerate is None
    at = pd.DataFrame({"N": 1e8, "D": 4e9, "P": 4, "recipe": ["fp4-a", "fp4-b", "fp4-c"]})
    truly = [-EFFICIENCY[r][0] for r in at["recipe"]]  # the more efficient, the lower the loss
    assert list(np.argsort(eff.predict(at))) == list(np.argsort(truly)) == [2, 1, 0]
    np.testing.assert_allclose([eff.params[f"eN[{r}]"] for r in ("fp4-a", "fp4-b", "fp4-c")], [0.45, 0.6, 0.8], atol=0.05)
    assert np.ptp(bits.predict(at)) == 0.0  # one prediction for every recipe of 4 bits
    # stored and read back; a recipe it was not fitted on is refused with the ones it knows
    back = fit.FitResult.from_dict(eff.to_dict())
    np.testing.assert_allclose(back.predict(at), eff.predict(at))
    with pytest.raises(fit.ConfigError, match="recipe: got 'mxfp6'.*bf16, fp4-a, fp4-b, fp4-c"):
        back.predict(at.assign(recipe="mxfp6"))


def test_pooled_variance_and_the_likelihood_test_by_hand():
    # split 1: d = 1, 3 in clusters 0, 1 (mean 2); split 2: d = 2, 2, 5 in clusters 0, 1, 1 (mean 3).
    # weights 1/(2·n_s): u = -1/4, 1/4 | -1/6, -1/6, 1/3; cluster sums -5/12, 5/12; var = 2/1 · 50/144.
    mean, var, g = selection.pooled_mean_and_var([(np.array([1.0, 3.0]), np.array([0, 1])),
                                                  (np.array([2.0, 2.0, 5.0]), np.array([0, 1, 1]))])
    assert (mean, g) == (2.5, 2) and var == pytest.approx(100 / 144, rel=1e-12)
    d, cl = np.array([1.0, 2.0, 3.0, 6.0]), np.array(list("aabc"))
    assert selection.pooled_mean_and_var([(d, cl)])[:2] == pytest.approx(selection.clustered_mean_and_var(d, cl))
    # the big law's held-out errors ±0.1 (s^2 = 0.01), the small one's 0.3, 0.2: d_i = 4, 1.5, 4, 1.5
    pos = np.arange(4)
    big = {"N": (pos, np.array([0.1, -0.1, 0.1, -0.1]))}
    small = {"N": (pos, np.array([0.3, 0.2, 0.3, 0.2]))}
    t = selection.likelihood_test(big, small, np.arange(4), ["N"])
    se = (4 / 3 * 4 * 1.25 ** 2 / 16) ** 0.5
    assert t["loglik_ratio"] == pytest.approx(11.0) and t["mean_loglik_diff"] == pytest.approx(2.75)
    assert t["statistic"] == pytest.approx(2.75 / se) and t["n_clusters"] == 4 and t["n"] == 4
    assert t["p_value"] == pytest.approx(float(selection.stats.t.sf(2.75 / se, 3)))
    assert selection.likelihood_test(small, big, np.arange(4), ["N"])["p_value"] > 0.95  # the other way round
    # the same rows in 3 clusters: too few for a clustered test, which then does not decide
    few = selection.likelihood_test(big, small, np.array([0, 1, 2, 2]), ["N"])
    assert few["p_value"] is None and few["statistic"] is None and few["n_clusters"] == 3
    assert few["reason"] == f"3 clusters: a clustered test needs at least {selection.MIN_TEST_CLUSTERS}, so it cannot decide"
    # and a nested law that cannot be tested does not replace the smaller one, however much better it scores
    entries = [{"name": n, "law": n, "fixed": {}, "fittable": True, "n_params": k, "aic": 0.0}
               for n, k in (("kumar", 6), ("kumar_data", 10))]
    errors = {"kumar": {"N": small["N"]}, "kumar_data": {"N": big["N"]}}
    tests = {}
    chosen, _ = selection._choose(entries, errors, np.zeros(4, int), np.array([0, 1, 2, 2]), tests)
    assert chosen == "kumar" and [(t["big"], t["small"], t["beats"]) for t in tests["nested_tests"]] == [("kumar_data", "kumar", False)]


def test_a_size_trained_only_in_low_precision_moves_the_n_split_to_the_largest_size_with_a_gap():
    df = ladder("chinchilla", CHINCHILLA)
    extra = df[(df["N"] == max(SIZES)) & (df["recipe"] == "fp4")].assign(N=1e9, run_id=lambda d: d["run_id"] + "-1e9")
    splits, notes = selection.heldout_splits(pd.concat([df, extra], ignore_index=True))
    by = {s.by: s for s in splits}
    assert set(by) == {"compute", "N", "D/N"} and notes == {}
    scored = pd.concat([df, extra], ignore_index=True).loc[by["N"].scored]
    assert set(scored["N"]) == {max(SIZES)} and "bf16" not in set(scored["recipe"])  # gaps are scored, not references
    # the 1e9 runs have no gap anywhere: never scored, and, being beyond the N threshold, held out of its fit
    assert not by["N"].scored[len(df):].any() and not by["N"].train[len(df):].any()
    assert by["N"].threshold == max(SIZES) and by["N"].label.startswith(f"every row with N >= {max(SIZES):.0e}".replace("e+0", "e"))
