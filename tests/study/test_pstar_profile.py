"""P* as a profile (scaling.study.analysis.pstar.profile): the law's loss at each format real chips run, with bootstrap
CIs, family-wise CIs of neighbour differences, untrained formats flagged, a continuous P* only where the
law and data support one; findings' P* entries carry it; figure 2 and `scaling optimal` honour the
optimum verdict (optimum_check)."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from scaling import cli
from scaling.study.report import figure_base, plots
from scaling.study.analysis import findings, laws, selection
from scaling.study.analysis.pstar import optimal, profile
from scaling.study.analysis.fit import FitResult

ROOT = Path(__file__).resolve().parents[2]
X3 = laws.kumar_sweet_spot_x(3.0)
KUMAR = dict(E=1.8, A=400.0, B=2000.0, alpha=0.34, beta=0.36, kappa=3.0)
SUN = dict(n=80.0, d=500.0, eps=0.002412, alpha=0.3, beta=0.3, gamma=20.0, delta=1.0, nu=2.0)


def _span(lo, hi):
    return {"min": float(lo), "max": float(hi), "median": float(np.sqrt(lo * hi))}


def kumar_fit(p_star=7.0, n_samples=16, seed=0, n_span=(1e6, 1e8), runs=60, p_span=(4, 16)) -> FitResult:
    """A kumar fit whose sweet spot is `p_star` (P* = gamma·x(kappa), at any compute), gamma resampled
    5% around it (the other params with it), runs spanning N in n_span, D in [1e8, 1e10], P in p_span."""
    rng = np.random.default_rng(seed)
    params = {**KUMAR, "gamma": p_star / X3}
    free = [k for k in params if k != "kappa"]
    samples = {k: (params[k] * np.exp(0.05 * rng.normal(size=n_samples))).tolist() for k in free}
    data = {"n_points": runs, "n_units": runs,
            "columns": {"N": _span(*n_span), "D": _span(1e8, 1e10), "P": _span(*p_span)}}
    return FitResult(law="kumar", params=params, fixed={"kappa": 3.0}, objective=0.0, residuals=np.zeros(0),
                     data=data, bootstrap={"n": n_samples, "level": 0.9, "seed": seed, "unit": "run_id",
                                           "samples": samples} if n_samples else None,
                     heldout={"mare": 0.01})


def sun_fit(n_samples=8) -> FitResult:
    rng = np.random.default_rng(1)
    samples = {k: (v * np.exp(0.05 * rng.normal(size=n_samples))).tolist() for k, v in SUN.items()}
    data = {"n_points": 400, "n_units": 400, "columns": {
        "N": _span(1e4, 1e6), "D": _span(1e5, 1e8), "ebits": _span(0, 8), "mbits": _span(1, 7),
        "block": _span(16, 4e4)}}
    return FitResult(law="sun", params=dict(SUN), objective=0.0, residuals=np.zeros(0), data=data,
                     bootstrap={"n": n_samples, "level": 0.95, "unit": "run_id", "samples": samples})


def test_the_default_formats_are_the_packages_own():
    rows = {r["name"]: r for r in (profile.format_row(f, sun_fit()) for f in profile.CHIP_FORMATS)}
    assert (rows["nvfp4"]["bits"], rows["nvfp4"]["ebits"], rows["nvfp4"]["mbits"], rows["nvfp4"]["block"]) == (4, 2, 1, 16)
    assert rows["nvfp4"]["overhead"] == 0.5 and rows["mxfp4"]["overhead"] == 0.25 and rows["mxfp4"]["block"] == 32
    assert (rows["mxfp6 e3m2"]["ebits"], rows["mxfp6 e3m2"]["mbits"]) == (3, 2)
    assert (rows["fp8 e5m2"]["bits"], rows["fp8 e5m2"]["overhead"], rows["fp8 e5m2"]["block"]) == (8, 0.0, 4e4)
    assert (rows["bf16"]["ebits"], rows["bf16"]["mbits"]) == (8, 7) and rows["fp32"]["bits"] == 32
    assert [f.name for f in profile.parse_formats(["bf16", "e3m4:mx"])] == ["bf16", "e3m4:mx"]
    assert profile.format_row(profile.parse_formats(["e3m4:mx"])[0], sun_fit())["bits"] == 8


def test_a_known_interior_optimum_is_found_with_a_ci_that_is_not_a_point():
    fit = kumar_fit(7.0)
    prof = profile.precision_profile(fit, 1e20, cost=optimal.Cost())
    ps = prof["pstar"]
    assert ps["P"] == pytest.approx(7.0, rel=1e-4) and ps["reason"] is None
    expect = np.asarray(fit.samples["gamma"]) * X3  # each resample's own continuous optimum
    assert ps["ci"] == pytest.approx([np.percentile(expect, 5), np.percentile(expect, 95)], rel=1e-3)
    assert ps["ci"][1] - ps["ci"][0] > 0.5 and ps["interior_share"] == 1.0
    # the profile's lowest format is the one nearest the sweet spot on the law's curve: FP6 or FP8, not FP4/BF16
    assert prof["best"] in ("mxfp6 e2m3", "mxfp6 e3m2", "fp8 e4m3", "fp8 e5m2")
    assert all(r["loss_ci"][0] <= r["loss"] <= r["loss_ci"][1] for r in prof["rows"])


def test_an_optimum_at_the_edge_of_the_trained_bits_is_no_continuous_pstar():
    prof = profile.precision_profile(kumar_fit(7.0, p_span=(8, 16)), 1e20, cost=optimal.Cost(), max_samples=4)
    assert prof["pstar"]["P"] is None and "not inside the trained bits 8-16" in prof["pstar"]["reason"]
    assert prof["pstar"]["optimum"] == pytest.approx(7.0, rel=1e-4)


def test_neighbour_cis_are_paired_and_family_wise():
    fit = kumar_fit(7.0)
    prof = profile.precision_profile(fit, 1e20, cost=optimal.Cost())
    rows, pairs = prof["rows"], prof["pairs"]
    m = len(pairs)
    assert m == len(rows) - 1 == len(profile.CHIP_FORMATS) - 1
    assert prof["family_level"] == pytest.approx(1 - 0.1 / m)
    assert [r["bits_per_element"] for r in rows] == sorted(r["bits_per_element"] for r in rows)
    # by hand: each resample's loss at each format (the same per-format N search), differenced within it
    boot = np.array([[optimal.optimal_precision(
        fit, 1e20, [r["bits"]], params={**fit.params, **s}, cost=optimal.Cost(overhead=r["overhead"]))["loss"]
        for r in rows] for s in fit.samples.to_dict("records")])
    tail = 100 * 0.1 / m / 2
    for k, p in enumerate(pairs):
        d = boot[:, k + 1] - boot[:, k]
        assert (p["from"], p["to"]) == (rows[k]["name"], rows[k + 1]["name"])
        assert p["ci"] == pytest.approx([np.percentile(d, tail), np.percentile(d, 100 - tail)], rel=1e-6, abs=1e-9)
        marginal = np.percentile(d, [5, 95])
        assert p["ci"][0] <= marginal[0] and marginal[1] <= p["ci"][1]
        assert p["direction"] == ("lower" if p["ci"][1] < 0 else "higher" if p["ci"][0] > 0 else "cannot tell")
        assert p["within_law_error"] == (abs(p["diff"]) < 0.01 * rows[k]["loss"])
    # FP4 far below the 7-bit sweet spot costs loss that every resample agrees on
    by = {(p["from"], p["to"]): p for p in pairs}
    assert by[("nvfp4", "mxfp6 e2m3")]["direction"] == "lower"
    assert by[("bf16", "fp32")]["direction"] == "higher"


def test_the_profile_says_what_the_laws_error_can_tell_not_a_p_best_from_parameter_noise():
    """Issue 71: every neighbour difference within the law's error, yet the table gave one format P(best)
    0.94 from the bootstrap (the law's parameter noise only). The profile keeps no P(best); each format says
    whether its loss is within the law's error of the lowest, and REPORT's table and `scaling optimal` say that."""
    from scaling.cli.optimal import profile_lines
    from scaling.study.report import law_prose

    fit = kumar_fit(7.0)
    prof = profile.precision_profile(fit, 1e20, cost=optimal.Cost(), max_samples=20)
    assert all("p_best" not in r for r in prof["rows"])
    assert prof["law_error"] == 0.01  # the fit's held-out error
    assert all(r["within_law_error_of_best"] is None for r in profile.judge_within_error(prof, None)["rows"])
    profile.judge_within_error(prof, 0.01)
    lowest = min(r["loss"] for r in prof["rows"])
    close = {r["name"] for r in prof["rows"] if r["loss"] - lowest < 0.01 * lowest}
    assert {r["name"] for r in prof["rows"] if r["within_law_error_of_best"]} == close
    assert {r["name"] for r in profile.within_error_of_best(prof)} == close and prof["best"] in close
    # the 7-bit truth: the 6-8-bit formats within the law's 1% of the lowest, FP4 and the 16/32-bit ones not
    assert close == {"mxfp6 e2m3", "mxfp6 e3m2", "fp8 e4m3", "fp8 e5m2", "mxfp8 e4m3"}
    text = law_prose.profile_text({**prof, "cost_model": "bits"})
    assert "P(best)" not in text and "| within the law's error of the lowest |" in text and "| verdict |" not in text
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in text.splitlines() if line.startswith("| ")}
    for r in prof["rows"]:
        assert rows[r["name"]][6] == ("yes" if r["name"] in close else "no")
    lines = profile_lines(prof)
    assert not any("P(best)" in line for line in lines) and "within 1.0% of lowest" in lines[1]
    assert any(line.startswith(prof["best"]) and " yes " in line for line in lines)
    # a profile written before (findings.json with `verdict` and P(best)) still reads
    old = {**prof, "pairs": [{**{k: v for k, v in q.items() if k != "direction"}, "verdict": q["direction"]} for q in prof["pairs"]],
           "rows": [{**r, "p_best": 1.0} for r in prof["rows"]]}
    assert [profile.direction(q) for q in old["pairs"]] == [q["direction"] for q in prof["pairs"]]
    assert "P(best)" not in law_prose.profile_text(profile.judge_within_error(old, 0.01))


def test_untrained_formats_are_flagged_by_range_and_by_the_fitted_runs():
    prof = profile.precision_profile(kumar_fit(7.0, n_samples=0), 1e20, cost=optimal.Cost())
    flags = {r["name"]: r["untrained_reasons"] for r in prof["rows"]}
    assert flags["fp32"] == ["bits 32 outside the trained 4-16"] and flags["bf16"] == [] and flags["nvfp4"] == []
    assert prof["trained_formats_known"] is False and prof["resamples"] == 0
    assert all(p["ci"] is None and p["direction"] == "cannot tell" for p in prof["pairs"])
    trained = pd.DataFrame({"ebits": [2, 8, 4], "mbits": [1, 7, 3], "granularity": ["nvfp4", "none", "tensor"]})
    prof = profile.precision_profile(sun_fit(), 1e13, trained=trained)
    flags = {r["name"]: r["untrained_reasons"] for r in prof["rows"]}
    assert flags["nvfp4"] == [] and flags["bf16"] == [] and flags["fp8 e4m3"] == []
    assert flags["mxfp6 e3m2"] == ["E3M2 with mx scaling not among the fitted runs' formats"]
    assert flags["mxfp4"] == ["E2M1 with mx scaling not among the fitted runs' formats"]
    assert flags["fp32"] == ["M 23 outside the trained 1-7", "E8M23 unscaled not among the fitted runs' formats"]
    assert {r["name"]: r["untrained"] for r in prof["rows"]}["fp8 e5m2"] is True


def test_a_law_on_integer_exponent_mantissa_bits_gives_no_continuous_pstar():
    prof = profile.precision_profile(sun_fit(), 1e13)
    assert prof["pstar"]["P"] is None and "integer exponent and mantissa bits" in prof["pstar"]["reason"]
    assert len(prof["rows"]) == len(profile.CHIP_FORMATS) and prof["resamples"] == 8
    assert all(p["ci"][0] < p["ci"][1] for p in prof["pairs"])  # a profile of CIs, none a point


def test_a_law_without_a_bits_axis_says_so():
    fit = FitResult(law="chinchilla", params=dict(E=1.8, A=400.0, B=2000.0, alpha=0.34, beta=0.36), objective=0.0,
                    residuals=np.zeros(0))
    prof = profile.precision_profile(fit, 1e20)
    assert prof["rows"] == [] and prof["pstar"]["P"] is None
    assert prof["no_bits_axis"] == "the chinchilla law has no precision term"


def _capacity_choice(entries: list[tuple[str, str, float, bool, str | None]]):
    """A selection summary whose chosen law is `capacity` (no bits axis) and the fits select returned:
    entries are (name, law, score, within noise, degenerate)."""
    fits = {"capacity": FitResult(law="capacity", params={}, objective=0.0, residuals=np.zeros(0),
                                  data={"unquantised_share": {"N": [1e4, 1e8], "ratio": [0.5, 0.1]}})}
    candidates = [{"name": "capacity", "law": "capacity", "score": 0.028, "within_noise": True, "degenerate": None}]
    for name, law, score, close, degenerate in entries:
        candidates.append({"name": name, "law": law, "score": score, "within_noise": close, "degenerate": degenerate})
        fits[name] = kumar_fit(7.0, n_samples=4) if law == "kumar" else sun_fit(4)
        fits[name].degenerate = degenerate
    return {"chosen": "capacity", "candidates": candidates}, fits


def test_a_law_without_a_bits_axis_draws_its_profile_from_the_closest_law_with_one():
    choice, fits = _capacity_choice([("chinchilla", "chinchilla", 0.027, True, None),   # no bits axis either
                                     ("kumar_data", "kumar", 0.010, False, None),      # better, but not within noise
                                     ("sun", "sun", 0.029, True, "eps at its bound"),  # within noise, degenerate
                                     ("kumar", "kumar", 0.031, True, None),
                                     ("kumar[kappa free]", "kumar", 0.030, True, None)])
    chosen = selection.chosen_fit(pd.DataFrame(), choice, fits)  # no resamples: the rows are not read
    assert chosen is fits["capacity"] and chosen.selection is choice
    assert choice["profile"]["name"] == "kumar[kappa free]" and "residuals" not in choice["profile"]["fit"]
    source, why = profile.profile_source(chosen)
    assert source.law == "kumar" and source.params == fits["kumar[kappa free]"].params
    assert source.data["unquantised_share"] == chosen.data["unquantised_share"]  # the chosen fit's runs cost a hypothetical model
    assert why.startswith("the capacity law prices precision by measured quantisation error") and "`kumar[kappa free]`" in why
    prof = profile.precision_profile(chosen, 1e20)
    assert prof["law"] == "kumar" and prof["drawn_from"] == why and len(prof["rows"]) == len(profile.CHIP_FORMATS)
    assert prof["resamples"] == 4 and prof["no_bits_axis"] is None
    # a chosen law with a bits axis is its own profile; no sound law with one within noise: none, said
    kumar = kumar_fit(7.0, n_samples=4)
    kumar.selection = {"chosen": "kumar", "candidates": []}
    assert selection.chosen_fit(pd.DataFrame(), kumar.selection, {"kumar": kumar}) is kumar
    assert kumar.selection["profile"] is None and profile.profile_source(kumar) == (kumar, None)
    choice, fits = _capacity_choice([("sun", "sun", 0.029, True, "eps at its bound"), ("kumar", "kumar", 0.02, False, None)])
    chosen = selection.chosen_fit(pd.DataFrame(), choice, fits)
    assert choice["profile"] is None and profile.precision_profile(chosen, 1e20)["no_bits_axis"].startswith("the capacity law")


def test_findings_keep_the_law_interval_apart_from_the_measured_bits():
    fit = kumar_fit(7.0, n_samples=4)
    measured = [{"recipe": "mxfp6", "bits": 6.25, "P": 6.0, "p_best": 0.9},
                {"recipe": "bf16", "bits": 16.0, "P": 16.0, "p_best": 0.1}]
    entry = findings._pstar_over_bits(fit, 1e20, [("kumar", fit)], optimal.Cost(), 4, measured)
    lo, hi = entry["law_interval"]
    assert lo <= entry["P"] <= hi and hi < 16.0 and entry["P_grid"] is None
    assert entry["interval"] == [min(lo, 6.25), 16.0]  # the old key still spans both kinds of number
    stuck = sun_fit()
    stuck.degenerate = "a test's: no optimum is searched"  # P_grid is said before any search (here: none)
    sun = findings._pstar_over_bits(stuck, 1e13, [("sun", stuck)], optimal.Cost(), 2, [])
    assert "error" in sun and "searched over whole bits" in sun["P_grid"]


def _drawn(monkeypatch):
    drawn = {}

    def keep(fig, stem):
        drawn["stars"] = [c for ax in fig.axes for c in ax.collections
                          if type(c).__name__ == "PathCollection" and "optimum" in str(c.get_label())]
        return stem.with_suffix(".png"), stem.with_suffix(".pdf")

    monkeypatch.setattr(figure_base, "_save", keep)
    return drawn


def test_figure_2_does_not_star_a_refused_optimum(tmp_path, monkeypatch):
    drawn = _drawn(monkeypatch)
    few = kumar_fit(7.0, n_samples=0, runs=12)
    made = plots.iso_loss(few, 1e20, tmp_path / "fig2", optimal.Cost())
    assert "no optimum is starred: too few runs for a P*: 12 runs" in made.caption and drawn["stars"] == []
    outside = kumar_fit(7.0, n_samples=0, n_span=(1e4, 1e6))  # the optimum at 1e20 lies far above 1e6
    made = plots.iso_loss(outside, 1e20, tmp_path / "fig2", optimal.Cost())
    assert "the hollow star the law's optimum, an extrapolation" in made.caption and "above the largest" in made.caption
    (star,) = drawn["stars"]
    assert "extrapolated" in star.get_label()
    inside = kumar_fit(7.0, n_samples=0, n_span=(1e4, 1e14))
    inside.data["columns"]["D"] = _span(1e4, 1e14)
    made = plots.iso_loss(inside, 1e20, tmp_path / "fig2", optimal.Cost())
    assert "the star the overall optimum (P* = 7" in made.caption
    (star,) = drawn["stars"]
    assert star.get_label().startswith("optimum: P* = 7")


def test_scaling_optimal_on_the_committed_quick_fit_refuses_the_profile_too(capsys):
    assert cli.main(["optimal", str(ROOT / "fits" / "quick.json"), "--compute", "1e12", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["exists"] is False and out["profile"] is None and out["P"] is None
    assert out["reasons"][0].startswith("too few runs for a P*")
    assert cli.main(["optimal", str(ROOT / "fits" / "quick.json"), "--compute", "1e12"]) == 0
    text = capsys.readouterr().out
    assert "no optimum: too few runs for a P*" in text and "profile" not in text


def test_scaling_optimal_outside_the_trained_sizes_flags_and_prints_the_profile(tmp_path, capsys):
    path = kumar_fit(7.0, n_samples=4, n_span=(1e4, 1e6)).to_json(tmp_path / "k.json")
    args = ["optimal", str(path), "--compute", "1e20", "--ci-samples", "4", "--formats", "nvfp4", "mxfp6 e2m3", "bf16"]
    assert cli.main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["exists"] is True and out["extrapolated"] is True
    prof = out["profile"]
    assert [r["name"] for r in prof["rows"]] == ["nvfp4", "mxfp6 e2m3", "bf16"] and len(prof["pairs"]) == 2
    assert prof["resamples"] == 4 and prof["pstar"]["P"] == pytest.approx(7.0, rel=1e-4)
    assert cli.main(args) == 0
    text = capsys.readouterr().out
    assert "extrapolated: N*" in text and "profile: the law's loss at each format" in text
    assert "mxfp6 e2m3 - nvfp4:" in text and "continuous P* = 7 bits" in text


def test_which_chips_run_a_format_comes_from_the_planners_table():
    from scaling.plan import hardware
    from scaling.study.analysis.pstar import profile as profile_lib

    by = {f.name: profile_lib.chips_running(f).split(", ") for f in profile_lib.CHIP_FORMATS}
    assert {"B200", "B300", "MI355X"} <= set(by["mxfp6 e2m3"]) and "H100" not in by["mxfp6 e2m3"]
    assert by["nvfp4"] == [k.upper() for k, g in hardware.GPUS.items() if "nvfp4" in g.block_scaled]
    assert "MI300X" in by["fp8 e4m3"] and "A100" not in by["fp8 e4m3"]
    mine = profile_lib.ChipFormat("mxfp6 e2m3", "fp6_e2m3", "mx", "my ASIC")
    assert profile_lib.chips_running(mine) == "my ASIC"
