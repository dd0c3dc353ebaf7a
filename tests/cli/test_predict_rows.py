"""`scaling predict --rows TABLE.csv --results RESULTS.csv --law NAME -o OUT.csv` end to end on a small
synthetic results file (three budgets, four recipes, a known law plus a shared shift growing with log
compute, as in tests/study/test_calibrate.py), and its bad input: one line, exit code 2, nothing written."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from scaling import cli
from scaling.study import laws

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


def test_rows_are_written_with_their_interval_gap_and_p_best(files, capsys):
    assert _run(files, "--law", LAW, "--bootstrap", "3") == 0
    out = pd.read_csv(files / "out.csv")
    assert list(out[["recipe"]].itertuples(index=False, name=None)) == [("bf16",), ("fp8",), ("fp4",), ("fp6",)]
    assert (out["interval"] == "calibrated").all() and (out["level"] == 0.95).all()
    assert ((out["loss_lo"] < out["loss"]) & (out["loss"] < out["loss_hi"])).all()
    assert (out["loss"] - out["law_loss"]).abs().max() < 0.02  # the recipes' in-sample corrections
    assert out.loc[0, "distance"] > 0 and out.loc[3, "distance"] == 0  # 1e17 and beyond; 3e16 inside
    assert out.loc[1, "gap_reference"] == "bf16" and out.loc[1, "gap_lo"] < out.loc[1, "gap"] < out.loc[1, "gap_hi"]
    assert out.loc[:2, "p_best"].sum() == pytest.approx(1.0) and np.isnan(out.loc[3, "p_best"])
    side = json.loads((files / "out.json").read_text())
    assert side["law"] == "chinchilla" and side["fixed"] == {"alpha": 0.34, "beta": 0.36}
    assert side["calibration"]["k"] == 3 and side["calibration"]["tau"] > 0
    assert len(side["backtests"]) == 3
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


def test_backtest_scores_every_pair_of_budgets_and_writes_one_json(files, capsys):
    """`scaling predict --backtest`: every pair of the results' budgets, the top one calibrated on the one
    backtest inside its fitted budgets, the lowest pairs saying why they cannot be; the study's report reads it."""
    import reference_study

    from scaling.study import law_prose

    out = files / "results_backtests.json"
    assert cli.main(["predict", "--backtest", "--results", str(files / "results.csv"), "--law", LAW,
                     "--bootstrap", "3", "-o", str(out)]) == 0
    found = json.loads(out.read_text())
    assert [(p["fit_budget"], p["target_budget"]) for p in found["pairs"]] == [(1e16, 10 ** 16.5), (1e16, 1e17),
                                                                              (10 ** 16.5, 1e17)]
    assert [p["calibrated"]["available"] for p in found["pairs"]] == [False, False, True]
    top = found["pairs"][-1]
    assert top["calibrated"]["calibrated_on"] == [[1e16, 10 ** 16.5]] and top["shared"] > 0  # the planted shift: measured above the law
    assert "1e+16 -> 1e+17" in capsys.readouterr().out
    # the reference study reads results/<sweep>_backtests.json beside its results as a section before P*
    (section,) = [s for s in reference_study.sections(files / "results.csv") if s.key == "backtests"]
    assert section.before == "pstar" and section.facts(None) == found
    text = law_prose.backtests_section({"backtests": found, "prediction": {"budget": 1e17}})
    assert "| 1e16 | 1e17 | " in text and "cannot be estimated" in text
    assert f"{top['calibrated']['inside']}/{top['n']} ({top['calibrated']['mean_width']:.3f})" in text
    assert "scores the calibrated method on it post hoc" in text
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
