"""REPORT.md's text about the registered prediction and the predictors' backtests: the held-out budget
predicted before it was trained, scored against what it measured (its minima inside their prediction
intervals, its gaps to the reference inside their measured CIs, and where the fit and the budget trained
on other corpora or kinds of host), its post-hoc re-prediction, and the predictors (`bootstrap`, `shifted`,
`calibrated`) scored on a study's own backtests. `prediction_headline` is README's line and opens the
prediction section's summary.

Apart from scaling.study.report.law_prose (the fitted law: its selection, parameters and P*): these
sentences read the prediction files (scaling.study.analysis.prediction), not the fit, and change with
them. law_prose imports this module and re-exports its public names, so callers that read them there keep
working; this module imports only the shared formatting (`fmt`) from scaling.study.report.prose, never law_prose.
"""

from __future__ import annotations

from scaling.study.analysis import findings as findings_lib
from scaling.study.report.prose import fmt


def _host_shift_text(p: dict) -> str:
    s = findings_lib.host_shift_between(p)
    if s is None:
        return "these runs do not measure how large it is"
    return (f"{s['runs']} runs ({', '.join(s['recipes'])}) trained again on the other kind, same configs and seeds, "
            f"measure it: {s['hosts'][0]} minus {s['hosts'][1]}, {s['mean']:+.4f} nats/byte on average over runs "
            f"(95% CI {s['ci'][0]:+.4f} to {s['ci'][1]:+.4f}, t over runs), {s['rms']:.4f} RMS over its "
            f"{s['points']} points")


def backtests_section(f: dict) -> str:
    """The predictors scored on a study's own backtests (scaling.study.analysis.prediction.calibrate.backtest_all,
    as `scaling predict --backtest` writes it): per backtest and predictor the coverage at each level, CRPS
    and the 95% interval score, then which predictor wins and by how much (the one `scaling predict` uses)."""
    b = f["backtests"]
    if "sizes" not in b:  # written before predictors were scored (no `sizes`, no `scores`)
        return (f"The committed backtests (`{b['law']}`) were written before predictors were scored by proper scores; "
                "`scaling predict --backtest` writes them again.")
    done = b["pairs"] + b["sizes"]
    predictors = b.get("predictors") or ["bootstrap", "shifted", "calibrated"]
    levels = next((list(e["coverage"]) for d in done for e in d.get("scores", {}).values()), [])
    lines = [f"Each backtest fits the `{b['law']}` law on some runs and predicts runs it never saw (measured − predicted, "
             "nats): along compute (fitted on the budgets up to one, predicting every row at a higher one) and along N "
             "(fitted on the sizes below a threshold, predicting every row at or above it: every row at or beyond a "
             "threshold is held out). Three predictors, each calibrated only on the backtests inside its own fitted "
             "data: `bootstrap` (the law's resamples and its in-sample residual), `shifted` (that, moved by the latest "
             "earlier backtest's mean miss) and `calibrated` (a shift per decade of distance from the fitted data in "
             "compute, N and D/N, and a spread per decade, both from earlier backtests). Scores: coverage of the "
             f"central intervals at {', '.join(f'{float(lv):.0%}' for lv in levels)}, CRPS and the 95% interval score "
             "(lower is better for both).", "",
             "| backtest | rows | law: mean error | predictor | " + " | ".join(f"{float(lv):.0%}" for lv in levels)
             + " | CRPS | 95% interval score | 95% width |",
             "| --- | --- | --- | --- | " + " | ".join("---" for _ in levels) + " | --- | --- | --- |"]
    for d in done:
        for name in predictors:
            sc = d.get("scores", {}).get(name)
            head = f"| {d['label']} | {d['n']} | {d['mean_error']:+.3f} |" if name == predictors[0] else "| | | |"
            if sc is None:
                why = (d.get({"bootstrap": "old"}.get(name, name)) or {}).get("reason") or "not scored"
                lines.append(f"{head} {name} | " + " | ".join("–" for _ in levels) + f" | {why} | | |")
                continue
            best = " **" if d.get("winner") == name else " "
            lines.append(f"{head} {name} | " + " | ".join(f"{sc['coverage'][lv]:.0%}" for lv in levels)
                         + f" |{best}{sc['crps']:.4f}{best.strip()} | {sc['interval_score']:.3f} | {sc['width']:.3f} |")
    choice = b.get("choice") or {}
    notes = []
    if choice.get("n"):
        notes.append(f"The predictor `scaling predict` uses: **{choice['winner']}**, {choice['rule']} "
                     f"({choice['n']} backtest{'s' if choice['n'] != 1 else ''}: {', '.join(choice['backtests'])}): "
                     f"mean CRPS {choice['crps'][choice['winner']]:.4f} against {choice['runner_up']}'s "
                     f"{choice['crps'][choice['runner_up']]:.4f} ({_margin_words(choice)}), and "
                     + ", ".join(f"{n} {c:.4f}" for n, c in choice["crps"].items() if n not in (choice["winner"], choice["runner_up"]))
                     + ".")
    elif choice:
        notes.append(f"The predictor `scaling predict` uses: {choice['winner']} ({choice['rule']}).")
    nested = [d for d in done if d.get("chosen")]
    if nested:
        notes.append("The whole procedure, choice included, on data it never saw (each backtest's predictor chosen "
                     "on the backtests inside its fitted data alone): "
                     + "; ".join(f"{d['label']}: {d['chosen']['predictor']}, 95% coverage "
                                 f"{d['chosen']['scores']['coverage'].get('0.95', float('nan')):.0%}, CRPS "
                                 f"{d['chosen']['scores']['crps']:.4f}" for d in nested) + ".")
    if b.get("skipped"):
        notes.append("Not backtested: " + "; ".join(f"{s['label']} ({s['reason']})" for s in b["skipped"]) + ".")
    return "\n\n".join(["\n".join(lines)] + notes)


def _margin_words(choice: dict) -> str:
    """How the chosen predictor's mean CRPS compares with the runner-up's: "x% lower", or, where the default
    is kept with the higher mean because the runner-up's wins are within chance, that and the sign test."""
    if (choice.get("relative") or 0) >= 0:
        return f"{choice['relative']:.0%} lower"
    other = choice["runner_up"]
    test = (choice.get("sign_test") or {}).get(other) or {}
    return (f"higher; kept because {other}'s lower CRPS on {test.get('wins')} of {choice['n']} backtests is within "
            f"chance, sign test p = {test.get('p', float('nan')):.2g}")


def prediction_headline(p: dict, unit: str) -> str:
    """The held-out budget's score in one sentence (README's line; REPORT's prediction sections open their
    summary with it): how many measured minima fell inside their prediction intervals, the mean error, and
    how many predicted gaps to the reference fell inside the measured gap's CI; before the budget is
    measured, what was predicted."""
    s = p.get("score")
    if not s:
        return f"Predicted: {p['reason']}; not measured yet."
    if not s["n"]:
        return f"Predicted: {p['reason']}; none of its recipes was measured at this budget."
    text = (f"{s['inside']} of {s['n']} measured minima inside their {p['level']:.0%} prediction intervals, mean error "
            f"{s['mean_error']:+.3f} {unit} (mean absolute {s['mean_abs_error']:.3f})")
    if s.get("gaps"):
        text += (f"; {s['gaps_inside']} of {len(s['gaps'])} predicted gaps to {s['reference']} inside the measured "
                 f"gap's 95% CI")
    return text + "."


def prediction_summary(p: dict, unit: str) -> str:
    """The prediction section's summary: prediction_headline, then what the errors may hold besides the
    law's (the fit and the budget on other corpora, or on other kinds of host with the shift runs trained
    on both measure); the section's notes below give each in full."""
    text = prediction_headline(p, unit)
    s = p.get("score")
    if not s or not s["n"]:
        return text
    corpora = p.get("corpora") or {}
    if corpora.get("measured") and not corpora.get("fitted"):
        text += " Which corpora the fit's runs trained on is not recorded, so the errors may hold a difference of data."
    elif corpora.get("measured") and corpora["measured"] != corpora["fitted"]:
        text += (f" The fit saw {', '.join(corpora['fitted'])}, this budget trained on {', '.join(corpora['measured'])}: "
                 "the errors hold that difference of data too.")
    elif findings_lib.other_hosts(p):
        text += (" The fit's runs and this budget's trained on different kinds of host (named below): the errors hold "
                 "that difference too")
        shift = findings_lib.host_shift_between(p)
        text += (f"; {shift['runs']} runs trained on both put it at {shift['mean']:+.3f} {unit} (95% CI "
                 f"{shift['ci'][0]:+.3f} to {shift['ci'][1]:+.3f})." if shift else ".")
    return text


def prediction_section(p: dict, unit: str, posthoc: bool = False) -> str:
    """The held-out budget: predicted before it was trained, against what it measured (once landed).
    `posthoc`: a prediction made after that budget's runs existed, said so: a check of the method on
    other data, never evidence that it predicts."""
    fitted = p["fitted_on"]
    lower = f"C = {', '.join(fmt(b) for b in fitted['budgets'])} alone ({fitted['runs']} runs"
    if posthoc:
        on = f", on {', '.join(fitted['corpora'])}" if fitted.get("corpora") else ""
        opening = (f"Post hoc, not a prediction: the same method (`scaling predict`) was run again after the runs at "
                   f"C = {fmt(p['budget'])} existed, from the runs at {lower}{on}), so its errors say how well the "
                   f"law carries over to a larger budget on that data, not that it predicted one.")
    else:
        opening = (f"The minimum of every recipe's IsoFLOP profile at C = {fmt(p['budget'])} was predicted from the "
                   f"runs at {lower}), before any run at C = {fmt(p['budget'])} was trained; the prediction file's "
                   "git history shows when.")
    lines = [f"{opening} The {p['level']:.0%} "
             f"prediction intervals pool {len(p['laws'])} laws the held-out precision gaps cannot tell apart "
             f"({', '.join(p['laws'])}; {p['draws']} draws of refitted resamples), the measured minimum's own noise "
             f"(σ {p['sigma_measurement']:.3g}) and the laws' miss of the lower budgets' minima beyond it "
             f"(σ {p['sigma_lack_of_fit']:.3g}). Loss in {unit}.", ""]
    score = p.get("score")
    if score:
        lines += [prediction_summary(p, unit), ""]
    if not score:
        lines += ["| recipe | predicted minimum | 95% PI | at N (95% PI) | P(best) |", "| --- | --- | --- | --- | --- |"]
        for e in sorted(p["recipes"], key=lambda e: e["loss"]):
            lines.append(f"| {e['recipe']} | {e['loss']:.4g} | {e['loss_pi'][0]:.4g}–{e['loss_pi'][1]:.4g} | "
                         f"{fmt(e['N_opt'])} ({fmt(e['N_pi'][0])}–{fmt(e['N_pi'][1])}) | {e['p_best']:.2f} |")
        lines += ["", prediction_summary(p, unit) + " The results hold none of this budget's runs "
                      "(they join them once all have landed)."]
        return "\n".join(lines)
    lines += ["| recipe | predicted minimum | 95% PI | measured | measured 95% CI | error | inside | N predicted (95% PI) | N measured |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in score["recipes"]:
        if r.get("measured") is None:
            lines.append(f"| {r['recipe']} | – | – | not measured | – | – | – | – | – |")
            continue
        ci = f"{r['measured_ci'][0]:.4g}–{r['measured_ci'][1]:.4g}" if r.get("measured_ci") else "–"
        n_measured = fmt(r["N_measured"]) + (" (edge)" if r["measured_at_edge"] else "") if r["N_measured"] else "–"
        lines.append(f"| {r['recipe']} | {r['predicted']:.4g} | {r['pi'][0]:.4g}–{r['pi'][1]:.4g} | {r['measured']:.4g} | "
                     f"{ci} | {r['error']:+.4f} | {'yes' if r['inside'] else 'no'} | {fmt(r['N_predicted'])} "
                     f"({fmt(r['N_pi'][0])}–{fmt(r['N_pi'][1])}) | {n_measured} |")
    lines += ["", f"{score['inside']} of {score['n']} measured minima fell inside their 95% prediction intervals "
                  f"({score['N_inside']} of {score['n']} for N at the minimum, whose interval holds the laws' and "
                  f"their fits' uncertainty only, not the measured vertex's); mean error {score['mean_error']:+.4f}, "
                  f"mean absolute error {score['mean_abs_error']:.4f}. Predicted: {p['reason']}. "
                  f"Measured: {score['measured_reason'] or 'no verdict'}."]
    lines += _provenance_notes(p)
    lines += _gap_scores_text(score)
    return "\n".join(lines)


def _provenance_notes(p: dict) -> list[str]:
    """Where the prediction's fit and the measured budget trained on different corpora or kinds of host:
    the errors hold that difference as well as the law's."""
    lines: list[str] = []
    corpora = p.get("corpora") or {}
    if corpora.get("measured") and corpora.get("fitted") is None:
        lines += ["", f"This budget's runs trained on {', '.join(corpora['measured'])}. The prediction file does not "
                      "record which corpora its fit's runs trained on (the results it was fitted on are those committed "
                      "with it, in its commit), so whether each error above holds a difference of data as well as "
                      "the law's is not told here."]
    elif corpora.get("measured") and corpora["measured"] != corpora["fitted"]:
        lines += ["", f"Not the same data: the prediction's fit saw runs on {', '.join(corpora['fitted'])}, this "
                      f"budget's runs trained on {', '.join(corpora['measured'])}, so each error above holds the "
                      "difference of the corpora as well as the law's (a recipe's gap to the reference is free of it "
                      "only where both trained on one corpus)."]
    if findings_lib.other_hosts(p):
        hosts = p["hosts"]
        lower = "; ".join(f"C = {fmt(float(b))}: " + ", ".join(f"{h} {n}" for h, n in by.items())
                          for b, by in hosts["lower"].items())
        lines += ["", f"Not the same hosts: this budget's runs trained on "
                      f"{', '.join(f'{h} ({n} runs)' for h, n in hosts['measured'].items())}; the fitted recipes' runs "
                      f"at the lower budgets on other kinds too ({lower} runs). One config trained on two kinds of "
                      "host gives two runs whose losses differ (the GEMM paths round differently and training carries it on), so each error "
                      f"above holds that difference as well as the law's; {_host_shift_text(p)}."]
    return lines


def _gap_scores_text(score: dict) -> list[str]:
    """Each recipe's predicted gap to the reference against the measured one, with the share inside."""
    lines: list[str] = []
    gaps = score.get("gaps") or []
    if gaps:
        ref = score["reference"]
        lines += ["", f"A law can miss every minimum's level alike and still rank the precisions right, so each "
                      f"recipe's gap to {ref} is scored too: predicted (the difference of the two predicted minima) "
                      f"against measured (paired, shape-adjusted, with its 95% CI).", "",
                  "| recipe | predicted gap | measured gap | measured 95% CI | error | inside the CI |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for g in gaps:
            lines.append(f"| {g['recipe']} | {g['predicted']:+.4f} | {g['measured']:+.4f} | "
                         f"{g['measured_ci'][0]:+.4f} to {g['measured_ci'][1]:+.4f} | {g['error']:+.4f} | "
                         f"{'yes' if g['inside'] else 'no'} |")
        lines += ["", f"{score['gaps_inside']} of {len(gaps)} predicted gaps to {ref} fell inside the measured gap's 95% CI "
                      f"(the measurement's uncertainty only: the prediction file holds no interval for gaps); mean "
                      f"absolute gap error {score['gap_mean_abs_error']:.4f}, against {score['mean_abs_error']:.4f} "
                      f"for the minima themselves."]
    return lines


def prediction_sections(facts: dict) -> list[str]:
    """The held-out budget's registered prediction and, where one was made, its post-hoc re-prediction."""
    out = []
    if facts.get("prediction"):
        out += ["## A budget predicted before it was trained", "", prediction_section(facts["prediction"], facts["loss_unit"]), ""]
    if facts.get("prediction_posthoc"):
        out += ["### The same budget predicted again, post hoc", "",
                prediction_section(facts["prediction_posthoc"], facts["loss_unit"], posthoc=True), ""]
    return out
