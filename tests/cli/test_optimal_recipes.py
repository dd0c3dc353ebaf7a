"""`scaling optimal` on a law without a bits axis (a fitted efficiency per recipe; quantisation errors):
no P*, the measured recipes ranked at their own efficiency from --results, and a one-line error without it."""

import json
from pathlib import Path

import pytest

from scaling import cli
from scaling.study.analysis import fit

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "results" / "quick.csv"


def _kumar_eff(tmp_path: Path, eN: dict[str, float]) -> Path:
    """A kumar_eff fit on the committed quick runs' recipes with chosen efficiencies (fp32 the reference)."""
    stored = json.loads((ROOT / "fits" / "quick.json").read_text())
    params = {"A": 400.0, "B": 2000.0, "E": 0.8, "alpha": 0.34, "beta": 0.36,
              **{f"eN[{r}]": e for r, e in eN.items()}, **{f"eD[{r}]": 1.0 for r in eN}}
    stored.update(law="kumar_eff", params=params, fixed={"eN[fp32]": 1.0, "eD[fp32]": 1.0}, bootstrap=None,
                  selection=None, heldout=None, degenerate=None, ci={})
    stored["data"]["n_units"] = 100  # enough runs for its free parameters: the verdict lets it through
    path = tmp_path / "eff.json"
    fit.FitResult.from_dict(stored).to_json(path)
    return path


def test_a_per_recipe_law_ranks_the_measured_recipes_by_their_efficiency(tmp_path, capsys):
    eff = _kumar_eff(tmp_path, {"fp32": 1.0, "fp8": 0.98, "mxfp4": 0.3})
    assert cli.main(["optimal", str(eff), "--compute", "1e12", "--results", str(QUICK), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["P"] is None and out["no_bits_axis"] == "recipe"
    ranked = [r["recipe"] for r in out["recipes"]]
    # fp8 is nearly as efficient as fp32 at half the bits: it wins under `bits`; mxfp4's efficiency loss (0.3
    # of its parameters effective) outweighs its cheaper FLOPs
    assert ranked[0] == "fp8" and set(ranked) == {"fp32", "fp8", "mxfp4"}
    by = {r["recipe"]: r for r in out["recipes"]}
    assert by["fp8"]["bits"] < by["fp32"]["bits"] and by["fp8"]["D"] > by["fp32"]["D"]  # cheaper FLOPs, more tokens
    # a nearly lossless mxfp4 wins instead (0.7 already does: under `bits` it trains about 3.7x fp32's tokens)
    better = _kumar_eff(tmp_path, {"fp32": 1.0, "fp8": 0.98, "mxfp4": 0.97})
    assert cli.main(["optimal", str(better), "--compute", "1e12", "--results", str(QUICK), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["recipes"][0]["recipe"] == "mxfp4"
    assert cli.main(["optimal", str(eff), "--compute", "1e12", "--results", str(QUICK)]) == 0
    text = capsys.readouterr().out
    assert "no P*: law kumar_eff reads precision as recipe, not bits" in text and "within the law's error of the lowest" in text and "P(best)" not in text


def test_without_results_a_law_without_a_bits_axis_is_one_line_error(tmp_path, capsys):
    eff = _kumar_eff(tmp_path, {"fp32": 1.0, "fp8": 0.98, "mxfp4": 0.7})
    assert cli.main(["optimal", str(eff), "--compute", "1e12"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --results: got None")
    assert "ranks the measured recipes at their own efficiency" in err[0]


def test_a_recipe_the_law_was_not_fitted_on_is_named(tmp_path, capsys):
    from scaling.study.analysis.pstar import optimal

    with pytest.raises(fit.ConfigError, match="recipe: got 'nvfp4'.*fp32, fp8, mxfp4"):
        optimal.optimal_precision(fit.FitResult.from_json(_kumar_eff(tmp_path, {"fp32": 1.0, "fp8": 0.9, "mxfp4": 0.7})),
                                  1e12, [4.0], context={"recipe": "nvfp4"})


def test_plan_refuses_a_law_without_a_bits_axis_and_says_which_verb_ranks_its_recipes(tmp_path, capsys):
    eff = _kumar_eff(tmp_path, {"fp32": 1.0, "fp8": 0.98, "mxfp4": 0.3})
    assert cli.main(["plan", "--fit", str(eff), "--compute", "1e21", "--gpus", "64"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a law with a bits axis (kumar_eff reads precision as recipe" in err[0]
    assert "`scaling optimal FIT --results RESULTS` ranks its measured recipes" in err[0]


def test_the_report_reads_a_per_recipe_law_as_a_choice_among_its_recipes(tmp_path, monkeypatch):
    import pandas as pd

    from scaling.study.analysis import findings
    from scaling.study.report import law_prose

    monkeypatch.setattr(findings, "too_few_runs", lambda df, f: None)  # 12 quick runs: too few for 7 params
    eff = fit.FitResult.from_json(_kumar_eff(tmp_path, {"fp32": 1.0, "fp8": 0.98, "mxfp4": 0.3}))
    out = findings.findings(pd.read_csv(QUICK), eff, n_boot=50)
    assert out["P_star"] and all(e["no_bits_axis"] == "kumar_eff" for e in out["P_star"])
    assert all(e["recipes"][0]["recipe"] == "fp8" for e in out["P_star"])
    text = law_prose.pstar_section(out)
    assert "prices precision by a fitted efficiency per recipe, not bits, so it has no continuous P*" in text
    assert "Read at each measured recipe's own fitted efficiency, its lowest loss is fp8's" in text
