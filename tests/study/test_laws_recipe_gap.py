"""The recipe_gap law (Chinchilla + an additive gap k_r·D^gamma_D/N^gamma_N per recipe, Chen et al. 2025) on
synthetic truths: its form by hand; recipes of equal bits with different gaps get different gaps back; a gap
growing with D/N at fixed N is recovered (gamma_D's sign and size) and extrapolated past the fitted D/N
better than kumar_eff can; a recipe it was not fitted on is refused in one line; it predicts through
`scaling predict --rows`. All new with the law (on the old code `laws.get("recipe_gap")` is a ConfigError).

Each study is a ladder of runs (N, final D/N, recipe, seed), each evaluated at three points of its WSD
schedule. A run's luck is mostly shared by the recipes at one (N, D/N, seed), as a seed fixes the init and
the data order (matched.py measured a median correlation of 0.45 across recipes), plus a small part of its
own and noise per evaluation. Small start grids keep each fit to a few seconds."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from scaling import cli
from scaling.errors import ConfigError
from scaling.study.analysis import fit, laws

SIZES = (1e7, 3e7, 1e8, 3e8)
TOKENS_PER_PARAM = (10.0, 20.0, 40.0)
FRACTIONS = (0.25, 0.5, 1.0)
SEEDS = (0, 1)
CHINCHILLA = dict(E=1.8, A=400.0, B=2000.0, alpha=0.34, beta=0.36)
# Small start grids (16 starts): the law's own grid is for studies of unknown scale.
INIT = {"E": [2.0], "A": [100.0, 1e4], "B": [100.0, 1e4], "alpha": [0.3], "beta": [0.3]}
GAP_INIT = {**INIT, "gamma_D": [0.0, 0.5], "gamma_N": [0.0, 0.5]}
AT = dict(N=1e8, D=2e9)  # where gaps are compared: inside the fitted sizes, D/N = 20


def k_for(gap: float, gamma_d: float, gamma_n: float, N: float = AT["N"], D: float = AT["D"]) -> float:
    """The k_r that gives `gap` nats at (N, D)."""
    return gap * N ** gamma_n / D ** gamma_d


def ladder(params: dict, recipes: list[str], seed: int = 0, dn=TOKENS_PER_PARAM, shared: float = 0.004,
           own: float = 0.0015, noise: float = 0.001) -> pd.DataFrame:
    """Every (size, D/N, recipe, seed) run at FRACTIONS of its tokens; loss = recipe_gap truth · exp(luck + noise),
    luck shared by the recipes of one (size, D/N, seed) (sd `shared`) plus each run's own (sd `own`)."""
    rng = np.random.default_rng(seed)
    rows = []
    for n, d, s in itertools.product(SIZES, dn, SEEDS):
        cell = shared * rng.standard_normal()
        for recipe in recipes:
            luck = cell + own * rng.standard_normal()
            rows += [dict(N=n, D=f * d * n, P=16 if recipe == recipes[0] else 4, recipe=recipe, seed=s,
                          run_id=f"{recipe}-{n:g}-{d:g}-{s}", luck=luck) for f in FRACTIONS]
    df = pd.DataFrame(rows)
    law = laws.get("recipe_gap").for_recipes(recipes)
    x = fit._columns(law, df)
    df["val_loss"] = law.predict(params, x) * np.exp(df.pop("luck") + noise * rng.standard_normal(len(df)))
    return df


def gaps(result: fit.FitResult, recipes: list[str], reference: str, N: float, D: float) -> dict[str, float]:
    """A fitted law's predicted loss of each recipe minus the reference's at (N, D)."""
    at = pd.DataFrame({"N": N, "D": D, "P": 4, "recipe": [reference, *recipes]})
    loss = result.predict(at)
    return {r: float(loss[i + 1] - loss[0]) for i, r in enumerate(recipes)}


def test_recipe_gap_hand_computed_and_registered():
    law = laws.get("recipe_gap").for_recipes(["bf16", "a", "b"])
    assert law.recipes == ("a", "b", "bf16") and law.fixed == {"k[bf16]": 0.0}
    assert "k[a]" in law.params and not {"k[a]", "k[b]", "gamma_D", "gamma_N"} & law.positive  # signed
    assert law.nests == "chinchilla" and law.precision_axis == "recipe" and "a fitted gap per recipe" in law.no_bits_reason
    p = dict(CHINCHILLA, gamma_D=0.5, gamma_N=0.4, **{"k[a]": 0.02, "k[b]": -0.01, "k[bf16]": 0.0})
    N, D = 1e8, 2e9
    base = 1.8 + 400 * N ** -0.34 + 2000 * D ** -0.36
    got = law.predict(p, {"N": np.full(3, N), "D": np.full(3, D), "recipe": np.array([0.0, 1.0, 2.0])})
    np.testing.assert_allclose(got, [base + 0.02 * D ** 0.5 / N ** 0.4, base - 0.01 * D ** 0.5 / N ** 0.4, base], rtol=1e-13)
    assert laws.recipe_gap_at(p, "a", N, D) == pytest.approx(0.02 * D ** 0.5 / N ** 0.4, rel=1e-13)
    # kumar_eff's multipliers stay positive and 1 at the reference (the generalised per-recipe mechanism)
    eff = laws.get("kumar_eff").for_recipes(["bf16", "a"])
    assert eff.fixed == {"eN[bf16]": 1.0, "eD[bf16]": 1.0} and {"eN[a]", "eD[a]"} <= eff.positive


def test_recipe_gap_in_jax_agrees_and_its_gradient_is_finite():
    """numpy and JAX agree; the gradient is finite at the reference's rows (k = 0) and at a wild start."""
    import jax
    import jax.numpy as jnp

    law = laws.get("recipe_gap").for_recipes(["bf16", "a", "b"])
    p = dict(CHINCHILLA, gamma_D=0.5, gamma_N=0.4, **{"k[a]": 0.02, "k[b]": -0.01, "k[bf16]": 0.0})
    x = {"N": np.array([1e7, 1e8, 3e8]), "D": np.array([1e9, 2e9, 1e11]), "recipe": np.array([0.0, 1.0, 2.0])}
    np.testing.assert_allclose(np.asarray(law.log_predict(p, {k: jnp.asarray(v) for k, v in x.items()}, jnp)),
                               law.log_predict(p, x), rtol=1e-6)
    for q in (p, dict(p, gamma_D=40.0, gamma_N=-40.0, **{"k[b]": -5.0})):
        grad = jax.jit(jax.grad(lambda q: jnp.sum(law.log_predict(q, x, jnp))))({k: jnp.float32(v) for k, v in q.items()})
        assert all(np.isfinite(float(g)) for g in grad.values()), grad


def test_a_per_recipe_reference_value_is_checked_in_one_line():
    def form(p, x, xp):
        return [xp.log(p["E"]) + 0.0 * x["N"]]

    common = dict(params=("E", "k"), columns=("N", "recipe"), init_grid={"E": [1.0], "k": [1.0]}, per_recipe=("k",))
    with pytest.raises(ConfigError, match=r"^laws\.bad_ref\.per_recipe_reference: got \['E'\]; allowed: per-recipe params: \['k'\]$"):
        laws.register(**common, positive=("E",), per_recipe_reference={"E": 0.0}, name="bad_ref")(form)
    with pytest.raises(ConfigError, match=r"^laws\.bad_pos\.per_recipe_reference\.k: got 0\.0; allowed: > 0 \(param is positive\)$"):
        laws.register(**common, positive=("E", "k"), per_recipe_reference={"k": 0.0}, name="bad_pos")(form)
    assert "bad_ref" not in laws.names() and "bad_pos" not in laws.names()


@pytest.mark.slow
def test_a_recipes_of_equal_bits_get_their_own_gaps():
    """mxfp4 on weights only and on activations only: 4 bits each, true gaps 0.012 and 0.061 at AT (the
    committed study's matched gaps), growing with D/N as (D/N)^0.3."""
    truth = dict(CHINCHILLA, gamma_D=0.3, gamma_N=0.3, **{"k[bf16]": 0.0, "k[mxfp4-weights]": k_for(0.012, 0.3, 0.3),
                                                          "k[mxfp4-activations]": k_for(0.061, 0.3, 0.3)})
    recipes = ["bf16", "mxfp4-weights", "mxfp4-activations"]
    df = ladder(truth, recipes)
    result = fit.fit_law(df, "recipe_gap", loss_column="val_loss", init=GAP_INIT, polish=1)
    assert result.fixed == {"k[bf16]": 0.0} and result.degenerate is None
    got = gaps(result, recipes[1:], "bf16", **AT)
    # recovered within 0.01 nats (seeds 0-3 miss by up to 0.006, sd 0.004 for activations), and told apart
    assert got["mxfp4-weights"] == pytest.approx(0.012, abs=0.01)
    assert got["mxfp4-activations"] == pytest.approx(0.061, abs=0.01)
    assert got["mxfp4-activations"] - got["mxfp4-weights"] > 0.035
    with pytest.raises(ConfigError, match=r"^recipe: got 'mxfp6'; allowed: a recipe law recipe_gap was fitted on "
                                          r"\(bf16, mxfp4-activations, mxfp4-weights\)$"):
        result.predict(pd.DataFrame({"N": [1e8], "D": [2e9], "recipe": ["mxfp6"]}))
    # a law in bits gives both one loss: the two recipes share P = 4
    bits = fit.fit_law(df, "kumar", loss_column="val_loss", init={**INIT, "gamma": [1.0, 3.0]}, polish=1)
    assert np.ptp(list(gaps(bits, recipes[1:], "bf16", **AT).values())) == 0.0


def test_c_a_recipe_it_was_not_fitted_on_is_refused_in_one_line():
    """A stored recipe_gap fit (as `scaling fit` writes it), read back: it predicts its recipes and refuses
    another in one line naming the recipe and the ones it was fitted on (no fit needed: instant)."""
    params = dict(CHINCHILLA, gamma_D=0.3, gamma_N=0.3, **{"k[bf16]": 0.0, "k[mxfp4-weights]": 0.005,
                                                           "k[mxfp4-activations]": 0.025})
    stored = fit.FitResult(law="recipe_gap", params=params, objective=0.0, residuals=np.zeros(3), fixed={"k[bf16]": 0.0})
    back = fit.FitResult.from_dict(stored.to_dict())
    at = pd.DataFrame({"N": [1e8, 1e8], "D": [2e9, 2e9], "recipe": ["bf16", "mxfp4-weights"]})
    np.testing.assert_allclose(np.diff(back.predict(at)), [laws.recipe_gap_at(params, "mxfp4-weights", 1e8, 2e9)], rtol=1e-12)
    with pytest.raises(ConfigError) as err:
        back.predict(at.assign(recipe=["bf16", "mxfp6"]))
    assert str(err.value) == ("recipe: got 'mxfp6'; allowed: a recipe law recipe_gap was fitted on "
                              "(bf16, mxfp4-activations, mxfp4-weights)")


# A gap growing with D/N at fixed N, as int4-fwd's does on the committed study (+0.068 per e-fold of D/N on
# a mean of 0.119, i.e. d ln gap / d ln(D/N) ~ 0.57): 0.1 nats at AT, gamma_D = 0.5, gamma_N = 0.4.
GROWING = dict(CHINCHILLA, gamma_D=0.5, gamma_N=0.4, **{"k[bf16]": 0.0, "k[int4-fwd]": k_for(0.1, 0.5, 0.4)})


@pytest.mark.slow
def test_b_a_gap_growing_with_d_over_n_is_recovered_and_extrapolated():
    recipes = ["bf16", "int4-fwd"]
    df = ladder(GROWING, recipes, seed=1)
    gap_law = fit.fit_law(df, "recipe_gap", loss_column="val_loss", init=GAP_INIT, polish=1)
    eff = fit.fit_law(df, "kumar_eff", loss_column="val_loss", init=INIT, polish=1)
    # the shape: gamma_D's sign and size within 0.1, gamma_N within 0.1 (0.42-0.49 and 0.33-0.39 on seeds 1-3)
    assert gap_law.params["gamma_D"] == pytest.approx(0.5, abs=0.1)
    assert gap_law.params["gamma_N"] == pytest.approx(0.4, abs=0.1)
    assert gaps(gap_law, ["int4-fwd"], "bf16", **AT)["int4-fwd"] == pytest.approx(0.1, abs=0.01)
    # at D/N = 160, four times the largest fitted (40), at a fitted N: truth 0.1·8^0.5 = 0.283
    far = dict(N=1e8, D=160 * 1e8)
    truth = laws.recipe_gap_at(GROWING, "int4-fwd", **far)
    ours, theirs = gaps(gap_law, ["int4-fwd"], "bf16", **far)["int4-fwd"], gaps(eff, ["int4-fwd"], "bf16", **far)["int4-fwd"]
    assert truth == pytest.approx(0.1 * 8 ** 0.5, rel=1e-12)
    # within 0.06 (a gamma_D off by 0.08 misses by about that after 4x in D/N); kumar_eff, whose gap cannot
    # grow with D at fixed N, misses by more than twice as much (about 0.15 on seeds 1-3)
    assert abs(ours - truth) < 0.06 and abs(ours - truth) < 0.5 * abs(theirs - truth), (ours, theirs, truth)


def _budgets(seed: int) -> pd.DataFrame:
    """An IsoFLOP-like results table: five sizes at three budgets (6ND), bf16 and two 4-bit recipes of the
    same bits whose gaps differ (0.02 and 0.06 at AT, gamma_D = gamma_N = 0.3), noise 0.003."""
    rng = np.random.default_rng(seed)
    truth = dict(CHINCHILLA, gamma_D=0.3, gamma_N=0.3,
                 **{"k[bf16]": 0.0, "k[fp4-w]": k_for(0.02, 0.3, 0.3), "k[fp4-a]": k_for(0.06, 0.3, 0.3)})
    law = laws.get("recipe_gap").for_recipes(["bf16", "fp4-a", "fp4-w"])
    rows = [{"run_id": f"{r}-{c:g}-{f}", "recipe": r, "P": 16 if r == "bf16" else 4, "N": np.sqrt(c / 120) * f,
             "D": c / (6 * np.sqrt(c / 120) * f), "seed": 0, "budget": c, "status": "ok"}
            for c in (1e16, 10 ** 16.5, 1e17) for f in (0.4, 0.63, 1.0, 1.6, 2.5) for r in ("bf16", "fp4-w", "fp4-a")]
    df = pd.DataFrame(rows)
    df["val_loss"] = law.predict(truth, fit._columns(law, df)) + 0.003 * rng.standard_normal(len(df))
    return df


@pytest.mark.slow
def test_recipe_gap_predicts_through_scaling_predict_rows(tmp_path, capsys, monkeypatch):
    """`scaling predict --rows ... --law recipe_gap[...]`: every recipe predicted (the fitted form carries its
    recipes), the two 4-bit recipes apart in the right order, an unfitted recipe refused in one line. The
    exponents are held at the truth's (a variant, as `scaling fit --fix`) and the backtests' many fits start
    from INIT with one polish (predict_table's fit_kwargs, set under the CLI), as the module's other fits
    do; the path through predict and calibrate is the free law's."""
    from functools import partial

    from scaling.study.analysis.prediction import table as table_lib

    monkeypatch.setattr(table_lib, "predict_table", partial(table_lib.predict_table,
                                                            fit_kwargs={"init": INIT, "polish": 1}))
    _budgets(3).to_csv(tmp_path / "results.csv", index=False)
    pd.DataFrame({"N": [2e7] * 3, "D": [1e9] * 3, "recipe": ["bf16", "fp4-w", "fp4-a"]}).to_csv(tmp_path / "rows.csv", index=False)
    out = tmp_path / "out.csv"
    args = ["predict", "--rows", str(tmp_path / "rows.csv"), "--results", str(tmp_path / "results.csv"),
            "--law", "recipe_gap[gamma_D=0.3, gamma_N=0.3]", "--bootstrap", "4", "-o", str(out)]
    assert cli.main(args) == 0, capsys.readouterr().err
    table = pd.read_csv(out).set_index("recipe")
    assert np.isfinite(table["loss"]).all()
    assert table.loc["fp4-a", "loss"] > table.loc["fp4-w", "loss"] > table.loc["bf16", "loss"]
    pd.DataFrame({"N": [2e7], "D": [1e9], "recipe": ["mxfp6"]}).to_csv(tmp_path / "new.csv", index=False)
    capsys.readouterr()
    assert cli.main([*args[:2], str(tmp_path / "new.csv"), *args[3:-1], str(tmp_path / "new_out.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mxfp6" in err[0] and "bf16, fp4-a, fp4-w" in err[0], err
