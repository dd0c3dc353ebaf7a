"""A budget predicted before it is trained (scaling.study.analysis.prediction.predict, `scaling predict`), on the committed
quick study: fitted on its two budgets, predicted at a third the design places, scored against a
stand-in measurement."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from scaling.errors import ConfigError
from scaling.study.report import law_prose, writer as report
from scaling.study.analysis.prediction import predict
from scaling.study.sweeps import results, sweep
from scaling.train import compute as compute_lib

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "experiments" / "quick.toml"
HELD = 6e11  # 3x the quick study's largest budget
LAWS = ["kumar", "chinchilla"]


def _held_out(tmp_path: Path, budget: float = HELD) -> Path:
    """quick.toml at one larger budget: the held-out design."""
    text = QUICK.read_text().replace("budgets = [1e11, 2e11]", f"budgets = [{budget:g}]")
    path = tmp_path / "quick_heldout.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def rows():
    return results.load(ROOT / "results" / "quick.csv")


@pytest.fixture(scope="module")
def line(tmp_path_factory):
    specs = sweep.expand(_held_out(tmp_path_factory.mktemp("design")))
    return predict.design_line([s.config for s in specs], HELD)


@pytest.fixture(scope="module")
def predictions(rows, line, once_per_run):
    """The prediction from both laws and from kumar alone (JSON, as `scaling predict` writes them), made once
    per pytest run in one process: their fits are most of this module's time (kumar's alone are the first's
    again), and xdist may send the module's tests to both workers."""
    def make(_):
        return {"laws": predict.predict(rows, line, HELD, bootstrap=4, candidates=LAWS),
                "kumar": predict.predict(rows, line, HELD, bootstrap=4, candidates=["kumar"])}

    return once_per_run("predict-quick-heldout", make)[1]


@pytest.fixture(scope="module")
def found(predictions):
    return predictions["laws"]


def test_the_design_line_lands_on_the_budget_even_for_the_reference_that_trains_on(line, tmp_path):
    specs = sweep.expand(_held_out(tmp_path))
    assert set(line["recipe"]) == {"fp32", "fp8", "mxfp4"} and (line.groupby("recipe").size() >= 4).all()
    cost = compute_lib.get("bits")
    by = {(s.config.recipe.name, compute_lib.run_row(s.config)["N"]): s.config for s in specs}
    longer = 0
    for r in line.itertuples():
        cfg = by[(r.recipe, r.N)]
        row = pd.DataFrame([{**compute_lib.run_row(cfg), "D": r.D}])
        assert float(cost.compute(row)[0]) == pytest.approx(HELD, rel=0.03)  # the budget's step, not the run's end
        longer += cfg.train.tokens > r.D * 1.05
    assert longer >= 1  # fp32 is the reference: some of its runs train on past this budget


@pytest.mark.slow
def test_a_prediction_names_every_recipe_with_an_interval_and_says_cannot_tell_when_it_cannot(found, rows):
    assert [e["recipe"] for e in found["recipes"]] == ["fp32", "fp8", "mxfp4"]
    assert found["fitted_on"]["budgets"] == [1e11, 2e11] and found["fitted_on"]["runs"] == rows["run_id"].nunique()
    assert found["fitted_on"]["run_ids"] == sorted(set(rows["run_id"]))  # which runs the fit saw
    assert found["fitted_on"]["corpora"] == ["stdlib b27681494f2f"]  # the data the fit saw (quick.csv: one corpus)
    assert math.isclose(sum(e["p_best"] for e in found["recipes"]), 1.0)
    measured_2e11 = rows[np.isclose(rows["budget"].astype(float), 2e11)].groupby("recipe")["val_loss"].min()
    for e in found["recipes"]:
        assert e["loss_pi"][0] < e["loss"] < e["loss_pi"][1]
        assert min(e["shapes"]) <= e["N_opt"] <= max(e["shapes"])
        assert e["loss"] < measured_2e11[e["recipe"]]  # more compute, lower loss: the laws extrapolate downwards
    assert found["sigma_measurement"] > 0 and found["draws"] >= 4
    best = min(found["recipes"], key=lambda e: e["loss"])["recipe"]
    assert found["best"] == best
    assert (found["winner"] is None) == (found["diff_pi"][0] <= 0) and ("cannot tell" in found["reason"]) == (found["winner"] is None)


@pytest.mark.slow
def test_the_interval_widens_with_the_law_form_and_the_noise(predictions):
    one = predictions["kumar"]  # predict(rows, line, HELD, bootstrap=4, candidates=["kumar"])
    width = lambda f: np.mean([e["loss_pi"][1] - e["loss_pi"][0] for e in f["recipes"]])
    noise = 2 * predict._z(0.95) * math.hypot(one["sigma_measurement"], one["sigma_lack_of_fit"])
    assert width(one) == pytest.approx(noise, rel=0.6)  # one law, few resamples: mostly the noise terms


def test_a_budget_the_fit_has_seen_is_refused(rows, line):
    with pytest.raises(ConfigError, match="budget.*above every fitted one"):
        predict.predict(rows, line, 2e11, bootstrap=0, candidates=LAWS)


@pytest.mark.slow
def test_score_counts_the_measured_minima_inside_their_intervals(found):
    measured = {"winner": None, "reason": "cannot tell: stand-in", "recipes": [
        {"recipe": e["recipe"], "loss": e["loss"] + (0.0 if i else 10.0), "ci": [0, 1], "N_opt": e["N_opt"], "inside": True}
        for i, e in enumerate(found["recipes"])]}
    scored = predict.score(found, measured)
    assert scored["n"] == 3 and scored["inside"] == 2 and scored["N_inside"] == 3
    assert scored["mean_error"] == pytest.approx(10 / 3)
    assert [r["inside"] for r in scored["recipes"]] == [False, True, True]


@pytest.mark.slow
def test_score_sets_each_gap_to_the_reference_against_its_measured_ci(found):
    """Every minimum measured 0.05 low (a level the law misses alike) but fp8's gap to fp32 off by 0.05
    more: the gaps are right for mxfp4 and wrong for fp8, whatever the levels say."""
    predicted = {e["recipe"]: e["loss"] for e in found["recipes"]}
    shift = {"fp32": -0.05, "fp8": -0.10, "mxfp4": -0.05}
    measured = {"recipes": []}
    for e in found["recipes"]:
        r = e["recipe"]
        gap = None if r == "fp32" else (predicted[r] + shift[r]) - (predicted["fp32"] + shift["fp32"])
        measured["recipes"].append({"recipe": r, "loss": predicted[r] + shift[r], "ci": [0, 9], "N_opt": e["N_opt"],
                                    "inside": True, "gap": gap, "gap_ci": None if gap is None else [gap - 0.02, gap + 0.02]})
    scored = predict.score(found, measured)
    assert scored["reference"] == "fp32" and scored["mean_error"] == pytest.approx(-0.2 / 3)
    gaps = {g["recipe"]: g for g in scored["gaps"]}
    assert set(gaps) == {"fp8", "mxfp4"} and scored["gaps_inside"] == 1
    assert gaps["fp8"]["predicted"] == pytest.approx(predicted["fp8"] - predicted["fp32"])
    assert gaps["fp8"]["error"] == pytest.approx(-0.05) and not gaps["fp8"]["inside"]
    assert gaps["mxfp4"]["error"] == pytest.approx(0.0, abs=1e-12) and gaps["mxfp4"]["inside"]
    assert scored["gap_mean_abs_error"] == pytest.approx(0.025)
    # without a measured reference there is nothing to take gaps against
    no_ref = {"recipes": [m for m in measured["recipes"] if m["recipe"] != "fp32"]}
    assert predict.score(found, no_ref)["gaps"] == []


@pytest.mark.slow
def test_the_cli_refuses_a_design_whose_runs_have_landed_and_never_overwrites(tmp_path, capsys):
    """In process (`scaling.cli.main`, as `python -m scaling.cli` runs it): both refusals come before any fit."""
    from scaling import cli

    held = _held_out(tmp_path, 2e11)  # one budget of the quick study's, as a design of its own: other run ids
    out = tmp_path / "p.json"
    out.write_text("{}")
    code = cli.main(["predict", str(held), "--results", str(ROOT / "results" / "quick.csv"), "-o", str(out)])
    assert code == 2 and "never replaced" in capsys.readouterr().err and out.read_text() == "{}"
    # a design whose runs are in the results: refused, nothing written
    summary = tmp_path / "quick.csv"
    rows = pd.read_csv(ROOT / "results" / "quick.csv")
    specs = sweep.expand(held)
    rows = pd.concat([rows, rows.iloc[:1].assign(run_id=specs[0].run_id)])
    rows.to_csv(summary, index=False)
    out = tmp_path / "q.json"
    code = cli.main(["predict", str(held), "--results", str(summary), "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "1 of" in err and "before its data" in err and not out.exists()
    assert len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_load_refuses_what_is_not_a_prediction(tmp_path, found):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"budget": 1}))
    with pytest.raises(ConfigError, match="prediction"):
        predict.load(bad)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(found))
    assert predict.load(good)["budget"] == HELD


@pytest.mark.slow
def test_report_shows_the_prediction_then_predicted_against_measured(found):
    unit = "nats per byte"
    before = law_prose.prediction_section(report.prediction_facts({**found, "laws": found["laws"]}, {"budgets": []}), unit)
    assert "; not measured yet." in before and before.count("\n| ") == 2 + 3  # header, rule, three recipes
    measured = {"budget": HELD, "winner": None, "reason": "cannot tell: stand-in", "recipes": [
        {"recipe": e["recipe"], "loss": e["loss_pi"][1] + 1 if e["recipe"] == "fp8" else e["loss"], "ci": [0, 1],
         "N_opt": e["N_opt"], "inside": True} for e in found["recipes"]]}
    for m in measured["recipes"]:  # the analysis' gaps to the reference, fp32
        ref = measured["recipes"][0]["loss"]
        m["gap"] = None if m["recipe"] == "fp32" else m["loss"] - ref
        m["gap_ci"] = None if m["gap"] is None else [m["gap"] - 0.01, m["gap"] + 0.01]
    facts = report.prediction_facts(found, {"budgets": [measured]})
    after = law_prose.prediction_section(facts, unit)
    assert "2 of 3 measured minima fell inside their 95% prediction intervals" in after
    assert "| fp8 |" in after and "| no |" in after and "Measured: cannot tell: stand-in" in after
    assert "1 of 2 predicted gaps to fp32 fell inside the measured gap's 95% CI" in after


@pytest.mark.slow
def test_a_posthoc_prediction_is_scored_in_its_own_section_and_says_it_is_not_a_prediction(found):
    measured = {"budget": HELD, "winner": None, "reason": "cannot tell: stand-in", "corpora": {"pysrc abc": 3},
                "recipes": [{"recipe": e["recipe"], "loss": e["loss"], "ci": [0, 9], "N_opt": e["N_opt"], "inside": True,
                             "gap": None, "gap_ci": None} for e in found["recipes"]]}
    posthoc = {**found, "fitted_on": {**found["fitted_on"], "corpora": ["pysrc abc"]}}
    facts = {"budgets": [measured], "loss_unit": "nats per byte"}
    facts["prediction"] = report.prediction_facts(found, facts)
    facts["prediction_posthoc"] = report.prediction_facts(posthoc, facts)
    text = "\n".join(law_prose.prediction_sections(facts))
    registered, after = text.split("### The same budget predicted again, post hoc")
    assert "before any run at C = 6e11 was trained" in registered and "Post hoc" not in registered
    assert after.lstrip().startswith("Post hoc, not a prediction") and "on pysrc abc" in after
    assert "3 of 3 measured minima fell inside their 95% prediction intervals" in after  # measured = predicted
    without = "\n".join(law_prose.prediction_sections({**facts, "prediction_posthoc": None}))
    assert "post hoc" not in without.lower()


@pytest.mark.slow
def test_readme_states_the_registered_score_and_the_posthoc_beneath_it(found):
    """README's findings line for the held-out budget: predicted only, then scored (how many minima fell
    inside their intervals, the mean error); REPORT says the verdicts and the data, and the post-hoc
    re-prediction as one."""
    import readme

    from scaling.study.report import law_prose

    unit = "nats per byte"
    (before,) = readme._prediction({"prediction": report.prediction_facts(found, {"budgets": []})}, unit)
    assert before.startswith("- **A budget predicted before it was trained** (C = 6e11, from C = ")
    assert before.endswith(f"Predicted: {found['reason']}; not measured yet.")
    measured = {"budget": HELD, "winner": None, "reason": "cannot tell: stand-in", "corpora": {"pysrc abc": 3},
                "recipes": [{"recipe": e["recipe"], "loss": e["loss_pi"][1] + 1 if e["recipe"] == "fp8" else e["loss"],
                             "ci": [0, 9], "N_opt": e["N_opt"], "inside": True, "gap": None, "gap_ci": None}
                            for e in found["recipes"]]}
    facts = {"budgets": [measured]}
    facts["prediction"] = report.prediction_facts({**found, "fitted_on": {**found["fitted_on"], "corpora": ["pysrc old"]}},
                                                  facts)
    facts["prediction_posthoc"] = report.prediction_facts(
        {**found, "fitted_on": {**found["fitted_on"], "corpora": ["pysrc abc"]}}, facts)
    (registered,) = readme._prediction(facts, unit)  # README: the registered score's first sentence; REPORT has the rest
    assert "2 of 3 measured minima inside their 95% prediction intervals, mean error +" in registered
    assert registered.endswith(".") and "Post hoc" not in registered
    text = law_prose.prediction_section(facts["prediction"], unit)  # REPORT: the verdicts and the corpora
    assert text.count("Measured: cannot tell: stand-in") == 1 and "this budget's runs trained on pysrc abc" in text
    post = law_prose.prediction_section(facts["prediction_posthoc"], unit, posthoc=True)
    assert post.startswith("Post hoc, not a prediction") and "2 of 3 measured minima fell inside" in post
    assert "Not the same data" not in post and "does not record" not in post  # its fit and the budget share pysrc abc
    assert readme._prediction({}, unit) == []


@pytest.mark.slow
def test_a_prediction_fitted_on_its_budgets_data_but_other_hosts_says_so(found):
    """Same corpus, other kinds of host: REPORT names the hosts of both sides and README says the
    errors hold that difference; one host kind on both sides, or a fit whose data are not recorded
    (so the lower budgets in the results may not be the rows it fitted), says nothing of hosts."""
    import readme

    fast, slow = "cpu: fast (avx512_bf16)", "cpu: slow (avx2)"
    lower_budgets = found["fitted_on"]["budgets"]
    recipes = [e["recipe"] for e in found["recipes"]]

    def facts_on(measured_host: str) -> dict:
        measured = {"budget": HELD, "winner": None, "reason": "cannot tell: stand-in", "corpora": {"pysrc abc": 3},
                    "hosts": {measured_host: {r: 2 for r in recipes}},
                    "recipes": [{"recipe": e["recipe"], "loss": e["loss"], "ci": [0, 9], "N_opt": e["N_opt"],
                                 "inside": True, "gap": None, "gap_ci": None} for e in found["recipes"]]}
        lower = [{"budget": b, "hosts": {fast: {r: 3 for r in recipes}, slow: {"not-fitted": 1}}} for b in lower_budgets]
        return {"budgets": lower + [measured]}

    same_data = {**found, "fitted_on": {**found["fitted_on"], "corpora": ["pysrc abc"], "recipes": recipes}}
    p = report.prediction_facts(same_data, facts_on(slow))
    assert p["hosts"]["measured"] == {slow: 2 * len(recipes)}
    assert all(by == {fast: 3 * len(recipes)} for by in p["hosts"]["lower"].values())  # the unfitted recipe left out
    text = law_prose.prediction_section(p, "nats/byte", posthoc=True)
    assert f"Not the same hosts: this budget's runs trained on {slow} ({2 * len(recipes)} runs)" in text
    assert f"{fast} {3 * len(recipes)}" in text
    assert "kinds of host" in readme._scored(p, "nats/byte")
    for quiet in (report.prediction_facts(same_data, facts_on(fast)),  # one kind of host on both sides
                  report.prediction_facts(found, facts_on(slow))):     # the fit's corpora not recorded
        assert "Not the same hosts" not in law_prose.prediction_section(quiet, "nats/byte")
        assert "kinds of host" not in readme._scored(quiet, "nats/byte")


def test_host_shift_pairs_each_run_across_hosts_and_averages_its_points_before_the_interval():
    """findings.host_shift: the same run ids trained again on another kind of host, paired at their
    IsoFLOP points, oriented one way, each run's points averaged (one trajectory), a t interval over runs."""
    import readme
    import reference_study
    from scaling.study.analysis import findings as findings_lib

    fast, slow = "cpu: fast", "cpu: slow"
    rows = pd.DataFrame({"run_id": ["r1", "r1", "r2", "r3", "r9"], "D": [1e6, 3e6, 1e6, 1e6, 1e6],
                         "recipe": ["bf16", "bf16", "fp8", "fp8", "fp8"], "hardware": slow,
                         "budget": [1e12, 3e12, 1e12, 1e12, 1e12], "val_loss": [2.0, 1.8, 2.1, 2.2, 2.3]})
    # r1 on the fast host: +0.02 at one point, +0.04 at the other (mean +0.03); r2 -0.01, r3 +0.01;
    # r9 is not trained again, and a point off the budgets (budget empty) is not an IsoFLOP point
    again = pd.DataFrame({"run_id": ["r1", "r1", "r2", "r3", "r1"], "D": [1e6, 3e6, 1e6, 1e6, 2e6],
                          "recipe": ["bf16", "bf16", "fp8", "fp8", "bf16"], "hardware": fast,
                          "budget": [1e12, 3e12, 1e12, 1e12, None], "val_loss": [2.02, 1.84, 2.09, 2.21, 0.0]})
    (s,) = reference_study.host_shift(rows, again)
    assert s["hosts"] == [fast, slow] and (s["runs"], s["points"]) == (3, 4) and s["recipes"] == ["bf16", "fp8"]
    per_run = np.array([0.03, -0.01, 0.01])
    assert s["mean"] == pytest.approx(per_run.mean())
    half = stats.t.ppf(0.975, 2) * per_run.std(ddof=1) / np.sqrt(3)
    assert s["ci"] == pytest.approx([per_run.mean() - half, per_run.mean() + half])
    assert s["rms"] == pytest.approx(np.sqrt(np.mean(np.array([0.02, 0.04, -0.01, 0.01]) ** 2)))
    # the other way round gives the same orientation (first host by name)
    (back,) = reference_study.host_shift(again.assign(hardware=slow), rows.assign(hardware=fast))
    assert back["hosts"] == [fast, slow] and back["mean"] == pytest.approx(-s["mean"])
    assert reference_study.host_shift(rows, rows) == [] and reference_study.host_shift(rows, None) == []

    # a scored prediction spanning those hosts states the measured shift instead of "not measured"
    p = {"corpora": {"fitted": ["pysrc abc"], "measured": ["pysrc abc"]},
         "hosts": {"measured": {slow: 3}, "lower": {"1e12": {fast: 9}}}, "host_shift": [s]}
    assert findings_lib.host_shift_between(p) == s
    assert findings_lib.host_shift_between({**p, "host_shift": []}) is None
    assert findings_lib.host_shift_between({**p, "hosts": {"measured": {slow: 3}, "lower": {"1e12": {"cpu: other": 9}}}}) is None
    assert f"put it at {s['mean']:+.3f} nats/byte (95% CI {s['ci'][0]:+.3f} to {s['ci'][1]:+.3f})" in readme._scored(
        {**p, "score": {"n": 3, "inside": 3, "mean_error": -0.04, "mean_abs_error": 0.04, "measured_reason": "x"},
         "level": 0.95, "reason": "y"}, "nats/byte")


def test_the_report_says_why_the_calibrated_predictor_is_kept_with_a_higher_mean_crps():
    from scaling.study.report import prediction_prose
    kept = {"winner": "calibrated", "runner_up": "shifted", "n": 5, "relative": -0.36,
            "sign_test": {"shifted": {"wins": 3, "n": 5, "p": 0.5, "passed": False}}}
    text = prediction_prose._margin_words(kept)
    assert "-36%" not in text and "lower CRPS on 3 of 5 backtests is within chance, sign test p = 0.5" in text
    assert prediction_prose._margin_words({**kept, "relative": 0.19}) == "19% lower"
