"""One check of whether a fitted law's optimum exists (scaling.study.analysis.pstar.optimum_check): shared by
`scaling optimal`, `scaling plan --fit` and REPORT's P* rule; extrapolation flagged; a collapsed CI degenerate."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from scaling import cli
from scaling.errors import ConfigError
from scaling.study.analysis import findings, fit as fit_lib, laws
from scaling.study.analysis.pstar import optimal, optimum_check
from scaling.study.analysis.fit import FitResult

ROOT = Path(__file__).resolve().parents[2]
KUMAR = dict(E=1.8, A=400.0, B=2000.0, alpha=0.34, beta=0.36, gamma=2.5, kappa=3.0)
SUN = dict(n=80.0, d=500.0, eps=0.002412, alpha=0.3, beta=0.3, gamma=20.0, delta=1.0, nu=2.0)


def _span(lo, hi):
    return {"min": float(lo), "max": float(hi), "median": float(np.sqrt(lo * hi))}


def kumar_fit(n_lo=1e6, n_hi=1e8, runs=60) -> FitResult:
    """A kumar fit whose runs span N in [n_lo, n_hi], D in [1e8, 1e10], P in [4, 16]."""
    data = {"n_points": runs, "n_units": runs,
            "columns": {"N": _span(n_lo, n_hi), "D": _span(1e8, 1e10), "P": _span(4, 16)}}
    return FitResult(law="kumar", params=dict(KUMAR), fixed={"kappa": 3.0}, objective=0.0,
                     residuals=np.zeros(0), data=data)


def test_the_committed_quick_fit_has_no_optimum_for_the_reason_report_gives(capsys):
    assert cli.main(["optimal", str(ROOT / "fits" / "quick.json"), "--compute", "1e12", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["exists"] is False and out["P"] is None and out["N"] is None
    assert out["cost_model"] == "bits, unquantised share from the runs" and out["extrapolated"] is False
    (reason,) = out["reasons"]
    assert reason.startswith("too few runs for a P*: 12 runs for the 6 free parameters of `kumar`")
    # REPORT's P* says the very same thing from the committed results table (one rule, one text)
    quick = FitResult.from_json(ROOT / "fits" / "quick.json")
    assert findings.too_few_runs(pd.read_csv(ROOT / "results" / "quick.csv"), quick) == reason
    assert cli.main(["optimal", str(ROOT / "fits" / "quick.json"), "--compute", "1e12"]) == 0
    text = capsys.readouterr().out
    assert "no optimum: too few runs for a P*" in text and "optimum: P =" not in text
    assert "16-bit FLOP units under cost model: bits, unquantised share from the runs" in text


def test_the_run_count_rule_is_one_definition():
    assert optimum_check.too_few_runs_reason(19, "kumar", {"kappa": 3.0}) is None
    assert optimum_check.too_few_runs_reason(18, "kumar", {"kappa": 3.0}).startswith("too few runs for a P*: 18 runs")
    assert findings.too_few_runs(pd.DataFrame({"run_id": range(18)}), kumar_fit()) == \
        optimum_check.too_few_runs_reason(18, "kumar", {"kappa": 3.0})


@pytest.mark.parametrize("n_range, side", [((1e10, 1e11), "below"), ((1e4, 1e6), "above")])
def test_an_optimum_outside_the_trained_sizes_is_flagged_in_text_and_json(tmp_path, capsys, n_range, side):
    fit = kumar_fit(*n_range)
    path = fit.to_json(tmp_path / "k.json")
    best = optimal.optimal_precision(fit, 1e20, cost=optimal.Cost())
    assert not n_range[0] <= best["N"] <= n_range[1]
    assert cli.main(["optimal", str(path), "--compute", "1e20", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["exists"] is True and out["reasons"] == [] and out["extrapolated"] is True
    (n_flag,) = [e for e in out["extrapolation"] if e["quantity"] == "N"]
    bound = n_range[0] if side == "below" else n_range[1]
    assert n_flag["side"] == side and n_flag["trained"] == list(n_range)
    assert n_flag["factor"] == pytest.approx(max(bound / out["N"], out["N"] / bound))
    assert out["cost_model"] == "bits, every FLOP quantised"
    assert cli.main(["optimal", str(path), "--compute", "1e20"]) == 0
    text = capsys.readouterr().out
    word = "below the smallest" if side == "below" else "above the largest"
    assert f"extrapolated: N* {optimum_check._number(out['N'])} {word} trained N {optimum_check._number(bound)}" in text
    assert "optimum: P =" in text


def test_an_optimum_inside_the_trained_runs_is_not_flagged():
    fit = kumar_fit(1e6, 1e12)
    best = optimal.optimal_precision(fit, 1e20)
    fit.data["columns"]["D"] = _span(1e6, 1e12)
    v = optimum_check.check(fit, best, optimal.Cost())
    assert v == {"exists": True, "reasons": [], "extrapolated": False, "extrapolation": [], "unchecked": [],
                 "cost_model": "bits, every FLOP quantised"}


def test_an_older_fit_says_what_it_could_not_check():
    old = FitResult(law="kumar", params=dict(KUMAR), fixed={"kappa": 3.0}, objective=0.0, residuals=np.zeros(0))
    v = optimum_check.check(old, optimal.optimal_precision(old, 1e20), "bits")
    assert v["exists"] is True and not v["extrapolated"]
    assert any("no run count" in u for u in v["unchecked"]) and any("range of N" in u for u in v["unchecked"])
    assert optimum_check.describe(v)[0].startswith("not checked: the fit records no run count")


def _collapsed(law, params, name, ci, sigma=0.02) -> FitResult:
    """A bootstrapped fit on 40 points whose `name` resampled only within `ci`, the others widely."""
    columns = {"N": _span(3e4, 8e5), "D": _span(1e4, 1.4e6), "ebits": _span(1, 5), "mbits": _span(1, 7),
               "block": _span(16, 128), "P": _span(4, 32)}
    spec = laws.get(law)
    cis = {p: (v / 3, v * 3) if p in spec.positive else (v - 0.2, v + 0.2)
           for p, v in params.items() if p in spec.free_params({})}
    cis[name] = ci
    rng = np.random.default_rng(0)
    return FitResult(law=law, params=dict(params), objective=0.0, residuals=rng.normal(0, sigma, 40), ci=cis,
                     bootstrap={"n": 100, "level": 0.95, "unit": "run_id"},
                     data={"n_points": 40, "n_units": 40, "columns": {c: columns[c] for c in spec.columns}})


@pytest.mark.parametrize("law, params, name, ci", [
    ("sun", SUN, "eps", (0.0024112, 0.0024118)),  # the user's floor: 2.5e-4 of its value wide
    ("chinchilla", dict(E=1.8, A=400.0, B=2000.0, alpha=0.34, beta=0.36), "E", (1.8, 1.8004)),
    ("sun", SUN, "delta", (0.998, 1.003)),  # a free-signed param: its width, not its log's
    ("kumar", KUMAR, "gamma", (2.5, 2.501)),
])
def test_a_collapsed_ci_marks_the_fit_degenerate_and_no_optimum_exists(law, params, name, ci):
    fit = _collapsed(law, params, name, ci, sigma=0.05)
    lo, hi = ci
    assert hi - lo > fit_lib.COLLAPSED_CI * params[name]  # wider than the old fixed rule caught
    reason = fit_lib.degenerate_reason(fit)
    assert reason.startswith(f"the CI of {name} (") and "has collapsed" in reason
    v = optimum_check.check(fit, cost="bits")  # stored degenerate None: judged under today's rule
    assert v["exists"] is False and v["reasons"] == [f"degenerate: {reason}"]
    # resamples that spread as widely as the data allow: sound (a floor of 0.0024 in a loss near 2 is
    # barely constrained: even 0.0012 to 0.0048 is within a hundredth of the narrowest CI it could have)
    v = params[name]
    sound = _collapsed(law, params, name, (v / 2, v * 2) if name in ("eps", "E", "gamma") else (v - 0.2, v + 0.2), sigma=0.05)
    assert fit_lib.degenerate_reason(sound) is None


def test_the_plan_names_the_cost_model_and_refuses_what_optimal_refuses(tmp_path, capsys):
    path = kumar_fit(1e6, 1e8).to_json(tmp_path / "k.json")
    assert cli.main(["plan", "--fit", str(path), "--compute", "1e22", "--gpus", "64", "--mfu", "0.4"]) == 0
    out = capsys.readouterr().out
    assert "compute 1e+22 in 16-bit FLOP units under cost model bits, every FLOP quantised" in out
    assert "extrapolated: N* " in out and "above the largest trained N 1e+08" in out
    assert "6ND: the hardware FLOPs" in out
    quick = ROOT / "fits" / "quick.json"
    assert cli.main(["plan", "--fit", str(quick), "--compute", "1e22", "--gpus", "64"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --fit {quick}: got 'kumar fit, too few runs for a P*: 12 runs") and err.count("\n") == 1
    with pytest.raises(ConfigError, match="too few runs"):
        from scaling.cli.plan import plan_fit
        plan_fit(quick, [64], compute=1e22)


def test_the_plan_flags_memory_per_gpu_above_the_gpus(tmp_path, capsys):
    path = kumar_fit(1e6, 1e8).to_json(tmp_path / "k.json")
    assert cli.main(["plan", "--fit", str(path), "--compute", "1e24", "--gpus", "8", "--layout", "tp=8,pp=1"]) == 0
    out = capsys.readouterr().out
    assert "memory: " in out and "GiB per GPU on 8 GPUs, above the H100 SXM5 80GB's 74.5 GiB" in out
    assert "GiB/GPU: does not fit)" in out
