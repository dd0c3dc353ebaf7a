"""The compute-optimal precision: kumar's sweet-spot maths, brute force, cost model, CIs, contours, CLI."""

import numpy as np
import pytest

from scaling import cli
from scaling.study.analysis import laws
from scaling.study.analysis.pstar import optimal
from scaling.train import compute
from scaling.errors import ConfigError
from scaling.study.analysis.fit import FitResult

KUMAR = dict(E=1.8, A=400.0, B=2000.0, alpha=0.34, beta=0.36, gamma=2.5, kappa=3.0)
CHINCHILLA = dict(E=1.817, A=482.0, B=2085.0, alpha=0.348, beta=0.366)
SUN = dict(n=80.0, d=500.0, eps=1.8, alpha=0.3, beta=0.3, gamma=20.0, delta=1.0, nu=2.0)


def result(law, params, **kwargs) -> FitResult:
    return FitResult(law=law, params=dict(params), objective=0.0, residuals=np.zeros(0), **kwargs)


SHARE = compute.UnquantisedShare(knots_N=(1e6, 1e9), knots_ratio=(1.0, 0.25))  # unquantised FLOPs per dense FLOP


def test_cost_model_hand_computed():
    assert optimal.Cost().compute(1e9, 1e10, 8) == pytest.approx(6e19 * 8 / 16)  # (6/16)·N·D·P
    shared = optimal.Cost(share=SHARE)  # at N = 1e9 a quarter more FLOPs, left in BF16
    assert shared.compute(1e9, 1e10, 8) == pytest.approx(6e19 * (8 / 16 + 0.25 * 1.0))
    assert shared.compute(1e9, 1e10, 32) == pytest.approx(6e19 * 2 * 1.25)  # the FP32 run: all at 32 bits
    assert shared.tokens(1e9, shared.compute(1e9, 1e10, 8), 8) == pytest.approx(1e10)
    mx = optimal.Cost(overhead=0.25)
    assert mx.compute(1e9, 1e10, 4) == pytest.approx(6e19 * 4.25 / 16)
    h100 = optimal.Cost(model="h100")  # FP6 and FP8 GEMMs cost the same on H100; FP16 twice that
    assert h100.compute(1e9, 1e10, 6) == h100.compute(1e9, 1e10, 8) == pytest.approx(6e19 * 989 / 1979)
    assert h100.compute(1e9, 1e10, 16) == pytest.approx(6e19)
    with pytest.raises(ConfigError, match="cost_model"):
        optimal.Cost(model="abacus")


def test_a_fit_reads_its_unquantised_share_under_the_new_key_or_the_old():
    """`scaling fit` writes data["unquantised_share"]; fits written before the rename have data["shape"]."""
    assert optimal.share_of(result("kumar", KUMAR, data={"unquantised_share": SHARE.to_dict()})) == SHARE
    assert optimal.share_of(result("kumar", KUMAR, data={"shape": SHARE.to_dict()})) == SHARE
    assert optimal.share_of(result("kumar", KUMAR)) == compute.UnquantisedShare()


@pytest.mark.parametrize("kappa", [3.0, 2.0])
def test_kumar_sweet_spot_is_gamma_x_independent_of_compute(kappa):
    fit = result("kumar", {**KUMAR, "kappa": kappa})
    expected = KUMAR["gamma"] * laws.kumar_sweet_spot_x(kappa)  # kappa = 3: 2.5 · 1.9038 = 4.7595
    for c in (1e18, 1e21, 1e24):
        assert optimal.optimal_precision(fit, c)["P"] == pytest.approx(expected, rel=1e-5)


def test_kumar_kappa_one_collapses_to_the_lowest_allowed_precision():
    fit = result("kumar", {**KUMAR, "kappa": 1.0})
    assert optimal.optimal_precision(fit, 1e20, p_range=(2.0, 32.0))["P"] == pytest.approx(2.0, abs=1e-6)
    assert optimal.optimal_precision(fit, 1e20, [3, 4, 8, 16])["P"] == 3.0


def _brute_force(law, params, compute, precisions, cost=optimal.Cost()):
    """Exhaustive: every P of the set x a 20,001-point log-N grid."""
    best = (np.inf, None, None)
    logn = np.linspace(np.log(1e4), np.log(1e13), 20001)
    for P in precisions:
        N = np.exp(logn)
        D = cost.tokens(N, compute, P)
        loss = laws.get(law).predict(params, {"N": N, "D": D, "P": np.full_like(N, P)})
        i = np.argmin(loss)
        if loss[i] < best[0]:
            best = (loss[i], P, N[i])
    return best


@pytest.mark.parametrize("cost", [optimal.Cost(), optimal.Cost(share=SHARE)])
def test_optimum_equals_brute_force_grid_search(cost):
    precisions = [2, 3, 4, 5, 6, 8, 16, 32]
    fit = result("kumar", KUMAR)
    for c in (1e18, 1e22):
        ours = optimal.optimal_precision(fit, c, precisions, cost=cost)
        loss, P, N = _brute_force("kumar", KUMAR, c, precisions, cost)
        assert ours["P"] == P
        # ours is continuous in N, so never worse than the grid and only a hair better (grid step 0.1% in N)
        assert ours["loss"] <= loss + 1e-12 and ours["loss"] == pytest.approx(loss, rel=1e-7)
        assert ours["N"] == pytest.approx(N, rel=2e-3)  # brute-force grid step in N is 0.1%
        assert cost.compute(ours["N"], ours["D"], ours["P"]) == pytest.approx(c)
        table = ours["per_precision"]
        assert list(table["P"]) == precisions and table["loss"].min() == ours["loss"]


@pytest.mark.parametrize("cost", [optimal.Cost(), optimal.Cost(share=SHARE, overhead=0.25), optimal.Cost(model="h100")])
@pytest.mark.parametrize("law, params", [("kumar", KUMAR), ("chinchilla", CHINCHILLA)])
def test_the_p_profile_in_one_array_equals_one_grid_search_per_p(cost, law, params):
    """The continuous P* search brackets on `_grid_profile`; it must be the per-P N-grid minima exactly."""
    L, p_grid = laws.get(law), np.linspace(1.0, 32.0, 125)
    cols = lambda P: optimal.precision_columns(L, P, {}, {})[0]
    per_p = [optimal._best_n(L, params, 1e20, float(P), cols(float(P)), cost, (1.0, np.inf), refine=False)["loss"]
             for P in p_grid]
    np.testing.assert_array_equal(optimal._grid_profile(L, params, 1e20, p_grid, cost, {}, {}, (1.0, np.inf)), per_p)
    with pytest.raises(ConfigError, match="compute"):  # a budget below one parameter-token at 32 bits
        optimal._grid_profile(L, params, 1.0, p_grid, cost, {}, {}, (1.0, np.inf))


def test_half_the_bits_trains_a_larger_model_by_the_chinchilla_exponent():
    # Chinchilla's loss ignores P, so halving P doubles the effective compute; compute-optimal
    # N grows as C^(beta/(alpha+beta)): N(16)/N(32) = 2^(0.366/0.714) = 1.4265.
    table = optimal.optimal_precision(result("chinchilla", CHINCHILLA), 1e21, [16, 32])["per_precision"].set_index("P")
    ratio = table.loc[16.0, "N"] / table.loc[32.0, "N"]
    assert ratio == pytest.approx(2 ** (0.366 / (0.348 + 0.366)), rel=1e-5)


def test_frontier_and_iso_loss():
    fit = result("kumar", KUMAR)
    front = optimal.frontier(fit, [1e18, 1e20, 1e22])
    assert np.all(np.diff(front["loss"]) < 0) and np.all(np.diff(front["N"]) > 0)
    assert np.allclose(front["P"], KUMAR["gamma"] * laws.kumar_sweet_spot_x(3.0), rtol=1e-5)
    best = front.iloc[1]
    grid = optimal.iso_loss(fit, 1e20, N=np.geomspace(best["N"] / 10, best["N"] * 10, 201), P=[best["P"], 8.0, 16.0])
    assert set(grid["P"]) == {best["P"], 8.0, 16.0} and len(grid) == 603
    assert grid["loss"].min() == pytest.approx(best["loss"], rel=1e-6) and grid["loss"].min() >= best["loss"] - 1e-12
    row = grid.iloc[7]
    direct = laws.get("kumar").predict(KUMAR, {"N": np.array([row["N"]]), "D": np.array([row["D"]]), "P": np.array([row["P"]])})
    assert row["loss"] == pytest.approx(direct[0], rel=1e-12)
    nd = optimal.loss_grid(fit, N=[1e8, 1e9], D=[1e10, 1e11, 1e12], P=8.0)
    expected = laws.get("kumar").predict(KUMAR, {"N": np.array([1e9]), "D": np.array([1e12]), "P": np.array([8.0])})[0]
    assert len(nd) == 6 and nd.set_index(["N", "D"]).loc[(1e9, 1e12), "loss"] == pytest.approx(expected, rel=1e-12)


def test_optimal_precision_ci_from_bootstrap_samples():
    gammas = np.array([2.0, 2.2, 2.5, 2.8, 3.0])
    samples = {k: [v] * 5 for k, v in KUMAR.items() if k not in ("gamma", "kappa")}
    samples["gamma"] = list(gammas)
    fit = result("kumar", KUMAR, fixed={"kappa": 3.0}, bootstrap={"n": 5, "level": 0.9, "samples": samples})
    ci = optimal.optimal_precision_ci(fit, 1e20)
    sweet = gammas * laws.kumar_sweet_spot_x(3.0)  # each resample's optimum is its own gamma·x
    assert ci["P"] == pytest.approx((np.percentile(sweet, 5), np.percentile(sweet, 95)), rel=1e-5)
    assert len(ci["samples"]) == 5 and ci["level"] == 0.9
    with pytest.raises(ConfigError, match="bootstrap"):
        optimal.optimal_precision_ci(result("kumar", KUMAR), 1e20)


def test_sun_picks_the_best_exponent_mantissa_split_and_has_a_critical_data_size():
    fit = result("sun", SUN, data={"columns": {"block": {"median": 128.0}}})
    best = optimal.optimal_precision(fit, 1e20, [4, 6, 8])
    law = laws.get("sun")
    for _, row in best["per_precision"].iterrows():
        x = {"N": np.array([row["N"]]), "D": np.array([row["D"]]), "block": np.array([128.0])}
        splits = [law.predict(SUN, {**x, "ebits": np.array([e]), "mbits": np.array([row["P"] - 1 - e])})[0]
                  for e in range(1, int(row["P"]) - 1)]
        assert row["loss"] == pytest.approx(min(splits), rel=1e-12)
        assert row["ebits"] == 1 + int(np.argmin(splits))
    d_crit = optimal.critical_data_size(fit, 1e8, ebits=4, mbits=3, block=128)
    assert d_crit == pytest.approx(laws.sun_critical_data_size(SUN, 1e8, 4, 3, 128))
    with pytest.raises(ConfigError, match="law: got 'kumar'"):
        optimal.critical_data_size(result("kumar", KUMAR), 1e8, ebits=4, mbits=3, block=128)


def test_bad_arguments():
    fit = result("kumar", KUMAR)
    with pytest.raises(ConfigError, match="compute"):
        optimal.optimal_precision(fit, -1.0)
    with pytest.raises(ConfigError, match="precisions"):
        optimal.optimal_precision(fit, 1e20, [])
    with pytest.raises(ConfigError, match="context"):
        optimal.optimal_precision(result("sun", SUN), 1e20, [8])


def test_cli_optimal_prints_the_table(tmp_path, capsys):
    path = result("kumar", KUMAR, fixed={"kappa": 3.0}).to_json(tmp_path / "k.json")
    assert cli.main(["optimal", str(path), "--compute", "1e20", "--precisions", "4", "8", "16"]) == 0
    out = capsys.readouterr().out
    best = optimal.optimal_precision(FitResult.from_json(path), 1e20, [4, 8, 16])
    assert f"P = {best['P']:.3g} bits" in out and f"{best['loss']:.5f}" in out
    assert out.count("\n") >= 5
    assert cli.main(["optimal", str(tmp_path / "missing.json"), "--compute", "1e20"]) == 2


def test_cli_optimal_json_reports_the_range_across_cost_models(tmp_path, capsys):
    import json

    fit = result("kumar", KUMAR, fixed={"kappa": 3.0}, data={"unquantised_share": SHARE.to_dict()})
    path = fit.to_json(tmp_path / "k.json")
    assert cli.main(["optimal", str(path), "--compute", "1e20", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"P", "P_ci", "P_range", "N", "D", "law", "cost_model"} <= set(out)
    lo, hi = out["P_range"]
    assert lo <= out["P"] <= hi and out["law"] == "kumar" and out["P_ci"] is None
    # the unquantised share makes low bits cheaper only in the quantised part: P* rises above gamma·x
    every_flop = optimal.optimal_precision(fit, 1e20, cost=optimal.Cost())["P"]
    shared = optimal.optimal_precision(fit, 1e20, cost=optimal.Cost(share=SHARE))["P"]
    assert shared > every_flop + 0.5 and hi >= shared
    # on H100 a GEMM costs the same from 5 to 8 bits, so the law takes all 8
    assert optimal.optimal_precision(fit, 1e20, cost=optimal.Cost(model="h100", share=SHARE))["P"] == pytest.approx(8, abs=0.05)


def test_quartet_optimum_runs_both_passes_at_p():
    params = dict(E=1.8, A=400.0, B=2000.0, alpha=0.34, beta=0.36, gamma_N=2.0, gamma_D=1.5)
    fit = FitResult(law="quartet", params=params, objective=0.0, residuals=np.zeros(0))
    best = optimal.optimal_precision(fit, 1e20, p_range=(2.0, 32.0))
    law, cost = laws.get("quartet"), optimal.Cost()

    def loss(P):  # P_fwd = P_bwd = P, at the best N for that P (brute force over N)
        N = np.geomspace(1e6, 1e12, 4001)
        x = {"N": N, "D": cost.tokens(N, 1e20, P), "P_fwd": np.full_like(N, P), "P_bwd": np.full_like(N, P)}
        return float(np.min(law.predict(params, x)))

    assert best["loss"] == pytest.approx(min(loss(P) for P in np.linspace(2.0, 32.0, 301)), rel=1e-4)


def test_no_optimum_is_derived_from_a_degenerate_fit():
    degenerate = result("kumar", dict(KUMAR, alpha=-0.0097), degenerate="exponent alpha = -0.0097 <= 0")
    for derive in (lambda f: optimal.optimal_precision(f, 1e20),
                   lambda f: optimal.frontier(f, [1e20]),
                   lambda f: optimal.iso_loss(f, 1e20, [1e6, 1e7], [4.0, 8.0]),
                   lambda f: optimal.optimal_precision(f.to_dict(), 1e20)):
        with pytest.raises(ConfigError, match=r"^fit: got 'kumar fit, degenerate: exponent alpha = -0.0097 <= 0'") as e:
            derive(degenerate)
        assert "\n" not in str(e.value)
    sound = result("kumar", KUMAR)
    assert optimal.optimal_precision(sound, 1e20)["P"] > 0
