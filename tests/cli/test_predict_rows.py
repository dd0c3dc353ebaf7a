"""`scaling predict --rows TABLE.csv --results RESULTS.csv --law NAME -o OUT.csv` end to end on a small
synthetic results file (three budgets, four recipes, a known law plus a shared shift growing with log
compute, as in tests/study/test_calibrate.py), and its bad input: one line, exit code 2, nothing written."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from scaling import cli
from scaling.study.analysis import laws

LAW = "chinchilla[alpha=0.34, beta=0.36]"
TRUTH = dict(E=1.8, A=400.0, B=2000.0, alpha=0.34, beta=0.36)


def synthetic(seed: int) -> pd.DataFrame:
    """Five sizes per budget at 1e16, 3e16, 1e17 (6ND), four recipes with planted offsets, a shared shift."""
    rng = np.random.default_rng(seed)
    shifts = (0.0, 0.03, 0.07)
    rows = []
    for k, c in enumerate((1e16, 10 ** 16.5, 1e17)):
        for f in (0.4, 0.63, 1.0, 1.6, 2.5):
            n = np.sqrt(c / 120) * f
            base = float(laws.get("chinchilla").predict(TRUTH, {"N": np.array([n]), "D": np.array([c / (6 * n)])})[0])
            for recipe, p, offset in (("bf16", 16, 0.0), ("fp8", 8, 0.004), ("fp6", 6, 0.008), ("fp4", 4, 0.015)):
                rows.append({"run_id": f"{recipe}-{k}-{f}", "recipe": recipe, "P": p, "N": n, "D": c / (6 * n),
                             "seed": 0, "budget": c, "status": "ok",
                             "val_loss": base + offset + shifts[k] + 0.003 * rng.standard_normal()})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("predict_rows")
    results = synthetic(2)
    results.to_csv(folder / "results.csv", index=False)
    pd.DataFrame({"N": [2e7, 2e7, 2e7, 1e7], "D": [1e9, 1e9, 1e9, 5e8],
                  "recipe": ["bf16", "fp8", "fp4", "fp6"]}).to_csv(folder / "rows.csv", index=False)
    return folder


def _run(folder, *extra, rows="rows.csv", out="out.csv"):
    return cli.main(["predict", "--rows", str(folder / rows), "--results", str(folder / "results.csv"), *extra,
                     "-o", str(folder / out)])


@pytest.mark.slow
def test_rows_are_written_with_their_interval_gap_and_p_best(files, capsys, monkeypatch):
    quick_fits(monkeypatch, **QUICK)
    assert _run(files, "--law", LAW, "--bootstrap", "3") == 0
    out = pd.read_csv(files / "out.csv")
    assert list(out[["recipe"]].itertuples(index=False, name=None)) == [("bf16",), ("fp8",), ("fp4",), ("fp6",)]
    side = json.loads((files / "out.json").read_text())
    assert (out["interval"] == side["predictor"]).all() and side["predictor"] == side["choice"]["winner"]
    assert (out["level"] == 0.95).all()
    assert ((out["loss_lo"] < out["loss"]) & (out["loss"] < out["loss_hi"])).all()
    assert out.loc[0, "distance"] > 0 and out.loc[3, "distance"] == 0  # 1e17 and beyond; 3e16 inside
    assert out.loc[1, "gap_reference"] == "bf16" and out.loc[1, "gap_lo"] < out.loc[1, "gap"] < out.loc[1, "gap_hi"]
    assert out.loc[:2, "p_best"].sum() == pytest.approx(1.0) and np.isnan(out.loc[3, "p_best"])
    assert side["law"] == "chinchilla" and side["fixed"] == {"alpha": 0.34, "beta": 0.36}
    assert side["calibration"]["k"] == 2 and side["calibration"]["shift"] > 0  # the planted shift grows with C
    assert len(side["backtests"]) >= 3
    assert "-> " in capsys.readouterr().out


@pytest.mark.parametrize("extra, rows, message", [
    (["--law", LAW], "no_d.csv", "rows: got 'missing D'"),
    (["--law", LAW], "unknown.csv", "recipe: got 'mxfp4'"),
    (["--law", LAW], "negative.csv", "N: got -1.0"),
    (["--law", "nolaw"], "rows.csv", "law"),
])
def test_bad_rows_are_one_line_and_write_nothing(files, capsys, extra, rows, message):
    pd.DataFrame({"N": [2e7], "recipe": ["bf16"]}).to_csv(files / "no_d.csv", index=False)
    pd.DataFrame({"N": [2e7], "D": [1e9], "recipe": ["mxfp4"]}).to_csv(files / "unknown.csv", index=False)
    pd.DataFrame({"N": [-1.0], "D": [1e9], "recipe": ["bf16"]}).to_csv(files / "negative.csv", index=False)
    assert _run(files, *extra, rows=rows, out="bad.csv") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
    assert not (files / "bad.csv").exists() and not (files / "bad.json").exists()


def test_the_modes_are_not_mixed(files, capsys):
    assert cli.main(["predict", "--rows", str(files / "rows.csv"), "-o", str(files / "bad.csv")]) == 2
    assert "--results" in capsys.readouterr().err
    assert _run(files, "--law", LAW, out="bad.txt") == 2
    assert "--out" in capsys.readouterr().err
    assert cli.main(["predict", "experiments/isoflop_heldout.toml", "--rows", str(files / "rows.csv"),
                     "--results", str(files / "results.csv"), "-o", str(files / "bad.csv")]) == 2
    assert "not both" in capsys.readouterr().err
    assert cli.main(["predict", "experiments/isoflop_heldout.toml", "--law", "sun"]) == 2
    assert "only with --rows" in capsys.readouterr().err
    assert not (files / "bad.csv").exists()


def test_backtest_scores_every_pair_of_budgets_and_writes_one_json(files, capsys, monkeypatch):
    """`scaling predict --backtest`: every pair of the results' budgets, the top one calibrated on the one
    backtest inside its fitted budgets, the lowest pairs saying why they cannot be; the study's report reads it."""
    import reference_study

    quick_fits(monkeypatch, **QUICK)
    from scaling.study.report import law_prose

    out = files / "results_backtests.json"
    assert cli.main(["predict", "--backtest", "--results", str(files / "results.csv"), "--law", LAW,
                     "--bootstrap", "3", "-o", str(out)]) == 0
    found = json.loads(out.read_text())
    assert [(p["fit_budget"], p["target_budget"]) for p in found["pairs"]] == [(1e16, 10 ** 16.5), (1e16, 1e17),
                                                                              (10 ** 16.5, 1e17)]
    assert found["pairs"][-1]["calibrated"]["available"] and found["sizes"]
    top = found["pairs"][-1]
    assert "C 1e+16 -> 3.16e+16" in top["calibrated"]["calibrated_on"] and top["shared"] > 0  # the planted shift: measured above the law
    printed = capsys.readouterr().out
    assert "C 1e+16 -> 1e+17" in printed and f"predictor: {found['choice']['winner']}" in printed
    # the reference study reads results/<sweep>_backtests.json beside its results as a section before P*
    (section,) = [s for s in reference_study.sections(files / "results.csv") if s.key == "backtests"]
    assert section.before == "pstar" and section.facts(None) == found
    text = law_prose.backtests_section({"backtests": found, "prediction": {"budget": 1e17}})
    assert f"| {top['label']} | {top['n']} | {top['mean_error']:+.3f} | bootstrap | " in text
    cal = top["scores"]["calibrated"]
    assert (f"| | | | calibrated | " + " | ".join(f"{v:.0%}" for v in cal["coverage"].values())) in text
    assert f"The predictor `scaling predict` uses: **{found['choice']['winner']}**" in text
    (files / "bad_backtests.json").write_text('{"pairs": []}')
    with pytest.raises(Exception, match="scaling predict --backtest"):
        reference_study.load_backtests(files / "bad_backtests.json")


@pytest.mark.parametrize("extra, key", [(["--rows", "rows.csv"], "--backtest"), ([], "--out")])
def test_backtest_bad_input_is_one_line(files, capsys, extra, key):
    extra = [str(files / e) if e.endswith(".csv") else e for e in extra]
    args = ["predict", "--backtest", "--results", str(files / "results.csv"), *extra]
    args += ["-o", str(files / "x.csv")] if key == "--out" else ["-o", str(files / "x.json")]
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and key in err and not (files / "x.json").exists()


def cooldown(seed: int) -> pd.DataFrame:
    """The synthetic study as one run per (recipe, size) whose cooldown branches serve every budget: each
    run has a row at each budget (N fixed, D growing), as results/quick.csv's runs do."""
    df = synthetic(seed)
    n = df.groupby(df["run_id"].str.rsplit("-", n=2).str[0] + df["run_id"].str.rsplit("-", n=1).str[1])["N"].transform("first")
    df = df.assign(N=n, D=df["budget"] / (6 * n), run_id=df["recipe"] + "-" + df["run_id"].str.rsplit("-", n=1).str[1])
    assert df.groupby("run_id")["budget"].nunique().eq(3).all()
    return df


def test_rows_on_a_cooldown_branch_design_are_predicted_and_calibrated_along_n(files, capsys):
    """Every run serves every budget: no backtest along compute can leave a scored run out of its fit, so
    the rows are calibrated on the backtests along N alone, and --backtest says why each pair is skipped
    (was: `law: got ...; rows: got 0`, exit 2; then uncalibrated)."""
    cooldown(3).to_csv(files / "cooldown.csv", index=False)
    assert cli.main(["predict", "--rows", str(files / "rows.csv"), "--results", str(files / "cooldown.csv"),
                     "--law", LAW, "--bootstrap", "0", "-o", str(files / "cool.csv")]) == 0
    out = pd.read_csv(files / "cool.csv")
    assert len(out) == 4 and np.isfinite(out["loss"]).all() and (out["old_lo"] < out["loss"]).all()
    side = json.loads((files / "cool.json").read_text())
    assert (out["interval"] == side["predictor"]).all()
    assert all(b["kind"] == "size" for b in side["backtests"]) and side["backtests"]  # along N only
    capsys.readouterr()
    # along compute such a design cannot be backtested: every pair is skipped, saying why
    assert cli.main(["predict", "--backtest", "--results", str(files / "cooldown.csv"), "--law", LAW,
                     "--bootstrap", "0", "-o", str(files / "cool_backtests.json")]) == 0
    found = json.loads((files / "cool_backtests.json").read_text())
    assert not found["pairs"] and found["sizes"] and all("cooldown branches" in s["reason"] for s in found["skipped"])


_CONFLICT = (lambda d: pd.concat([d, d.iloc[[7]].assign(val_loss=d["val_loss"].iloc[7] + 0.1)]), "run_id: got '{run}'")
_INF = (lambda d: d.assign(val_loss=d["val_loss"].where(d.index != 7, np.inf)), "val_loss: got 'inf in 1 row(s) of ok runs {run}'")


@pytest.mark.parametrize("mode, edit, message", [
    ("--rows", *_CONFLICT), ("--backtest", *_CONFLICT), ("--rows", *_INF), ("--backtest", *_INF),
    ("--backtest", lambda d: d[(d["budget"] == d["budget"].min()) & d["N"].isin(sorted(d["N"].unique())[:3])],
     "two or more IsoFLOP budgets"),
])
def test_conflicting_non_finite_or_one_budget_results_are_one_line_and_write_nothing(files, capsys, mode, edit, message):
    """A (run, D) with two different losses, an inf loss on an ok run, or (for a backtest) one budget:
    refused with one line naming the runs (were: one of two losses kept, the inf row dropped, an empty
    backtest written with exit 0)."""
    results = synthetic(2)
    edit(results).to_csv(files / "edited.csv", index=False)
    out = files / ("edited_out.csv" if mode == "--rows" else "edited_out.json")
    args = ["--rows", str(files / "rows.csv")] if mode == "--rows" else ["--backtest"]
    assert cli.main(["predict", *args, "--results", str(files / "edited.csv"), "--law", LAW, "--bootstrap", "0",
                     "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message.format(run=results["run_id"].iloc[7]) in err[0], err
    assert not out.exists() and not out.with_suffix(".json").exists()


def test_exact_repeats_of_a_row_are_kept_once():
    from scaling.study.sweeps import results as results_lib

    df = synthetic(2)
    assert len(results_lib.checked(pd.concat([df, df.iloc[[3, 4]]]))) == len(df)


def test_fit_refuses_an_inf_loss_and_conflicting_rows_as_predict_does(files, capsys):
    """`scaling fit` refused NaN losses only: an inf one on an ok run, or a run's two different losses at one
    D, went into the fit."""
    results = synthetic(2)
    for name, edited in (("inf", results.assign(val_loss=results["val_loss"].where(results.index != 7, np.inf))),
                         ("dup", pd.concat([results, results.iloc[[7]].assign(val_loss=9.0)]))):
        edited.to_csv(files / f"{name}.csv", index=False)
        assert cli.main(["fit", str(files / f"{name}.csv"), "--law", "chinchilla", "-o", str(files / f"{name}.json")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and results["run_id"].iloc[7] in err[0] and not (files / f"{name}.json").exists(), err


def test_fit_on_results_where_no_run_landed_says_so(files, capsys):
    """A sweep whose runs all failed: `scaling fit` said 'reference: got None ... no precision column P'."""
    results = synthetic(2).assign(status="failed")
    results.to_csv(files / "failed.csv", index=False)
    assert cli.main(["fit", str(files / "failed.csv"), "--law", "auto", "-o", str(files / "f.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    n = results["run_id"].nunique()
    assert err == [f"error: results: got '{n} runs, none ok (failed {n})'; allowed: runs that landed ok (each failed "
                   "run's failure.json says why)"]


def quick_fits(monkeypatch, **fit_kwargs) -> None:
    """`scaling predict --rows` and `--backtest` with a small fit schedule (fit_law's init, iters, polish) for
    every one of their backtests' fits: the CLI's path whole, at a few starts each (a per-recipe law's default
    grid and five float64 polishes cost ~15 s a fit, and the backtests make ~20)."""
    from functools import partial

    from scaling.study.analysis.prediction import calibrate, table as table_lib

    monkeypatch.setattr(table_lib, "predict_table", partial(table_lib.predict_table, fit_kwargs=fit_kwargs))
    monkeypatch.setattr(calibrate, "backtest_all", partial(calibrate.backtest_all, fit_kwargs=fit_kwargs))


# The fixed-exponent law's three free params from eight starts and one polish: what the CLI tests check is the
# path (rows, backtests, calibration, the JSON and the report), not the fit; the planted offsets and shift are
# tens of times the noise.
QUICK = dict(init={"E": [1.5, 2.0], "A": [100.0, 1000.0], "B": [500.0, 5000.0]}, polish=1, iters=(20, 60))


@pytest.mark.slow
def test_a_per_recipe_law_predicts_through_predict_rows(files, capsys, monkeypatch):
    """`scaling predict --law kumar_eff` refused every recipe ('a recipe law kumar_eff was fitted on ()'):
    the draws looked the law up by name, not the fitted form that carries its recipes. A small start grid
    (quick_fits): what is checked is the fitted form's path through the backtests and draws, not the fit."""
    quick_fits(monkeypatch, **QUICK)
    out = files / "eff.csv"
    assert cli.main(["predict", "--rows", str(files / "rows.csv"), "--results", str(files / "results.csv"),
                     "--law", "kumar_eff", "--bootstrap", "4", "-o", str(out)]) == 0, capsys.readouterr().err
    table = pd.read_csv(out)
    assert len(table) == 4 and np.isfinite(table["loss"]).all()
    at = table.set_index("recipe")  # the planted offsets at one N, D: fp4 above fp8 above bf16
    assert at.loc["fp4", "loss"] > at.loc["fp8", "loss"] > at.loc["bf16", "loss"]


def test_rows_are_predicted_from_a_grid_of_runs_without_budgets(files, capsys, monkeypatch):
    """`scaling predict --rows` refused results without a `budget` column (a grid of runs is not an IsoFLOP
    design): it predicts from the law fitted on them, calibrated along N alone, and says so."""
    quick_fits(monkeypatch, **QUICK)
    synthetic(2).drop(columns=["budget"]).to_csv(files / "grid.csv", index=False)
    out = files / "grid_out.csv"
    assert cli.main(["predict", "--rows", str(files / "rows.csv"), "--results", str(files / "grid.csv"), "--law", LAW,
                     "--bootstrap", "4", "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert "(no budget labels)" in said and "the results carry no IsoFLOP budget labels" in said
    table = pd.read_csv(out)
    assert len(table) == 4 and table["interval"].isin(["bootstrap", "shifted", "calibrated"]).all()
    assert np.isfinite(table["loss"]).all() and (table["old_lo"] < table["law_loss"]).all() and (table["law_loss"] < table["old_hi"]).all()
    # a grid is backtested along N alone
    assert cli.main(["predict", "--backtest", "--results", str(files / "grid.csv"), "--law", LAW, "--bootstrap", "0",
                     "-o", str(files / "grid_bt.json")]) == 0
    found = json.loads((files / "grid_bt.json").read_text())
    assert not found["pairs"] and found["sizes"]
    assert "predictor: " in capsys.readouterr().out
