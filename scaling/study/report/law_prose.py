"""REPORT.md's text about the fitted law: how it was chosen (each candidate's held-out error, the laws
within noise), its parameters and held-out error, and its P* (the profile, the comparison with the published
sweet spots — Kumar et al. 2024: compute-optimal precision 7-8 bits; Sun et al. 2025: 4-8 bits — from
P*'s interval, inside or outside each).

The measurements' text and the formatting every section shares (`fmt`, `_markdown`) are
scaling.study.report.prose's; this module imports from it, never the other way round. The law's
predictions for a held-out budget and the predictors' backtests are scaling.study.report.prediction_prose's
(they read the prediction files, not the fit); their public names stay importable from here.
"""

from __future__ import annotations

import math
import re
from typing import Sequence

import numpy as np
import pandas as pd

from scaling.study.analysis import fit as fit_lib, laws
from scaling.study.analysis.pstar import profile as profile_lib
from scaling.study.report import plots
from scaling.study.analysis import findings as findings_lib
from scaling.study.analysis.fit import FitResult
from scaling.study.report.prose import _markdown, fmt
from scaling.study.report.prediction_prose import (  # noqa: F401  (the names callers read here)
    backtests_section, prediction_headline, prediction_section, prediction_sections, prediction_summary)


def fitted_law(fit: FitResult) -> str:
    rows = []
    fixed = getattr(fit, "fixed", None) or {}
    for name, value in fit.params.items():
        lo, hi = (getattr(fit, "ci", None) or {}).get(name, (math.nan, math.nan))
        rows.append({"parameter": name + (" (fixed)" if name in fixed else ""), "value": value,
                     "95% CI low": lo, "95% CI high": hi})
    n_samples = len(plots.param_samples(fit))
    text = [f"Law: `{fit.law}`, fitted by Huber loss on log-loss residuals (objective {fmt(getattr(fit, 'objective', None))}); "
            f"CIs from {n_samples} bootstrap resamples (unit: {(getattr(fit, 'bootstrap', None) or {}).get('unit', 'run')})." if n_samples else
            f"Law: `{fit.law}` (objective {fmt(getattr(fit, 'objective', None))}); no bootstrap samples stored with the fit.",
            "", _markdown(pd.DataFrame(rows))]
    selection = getattr(fit, "selection", None)
    if selection and selection.get("chosen"):
        text += ["", selection_text(selection)]
    return "\n".join(text)


def selection_text(selection: dict) -> str:
    """How the law was chosen (selection.select_law): each candidate's held-out error on the precision gaps,
    the laws within noise of the best, and the chosen law's held-out errors per recipe."""
    if selection.get("split_details") is not None:
        return _splits_selection_text(selection)
    if selection.get("split"):
        return _heldout_budget_selection_text(selection)
    rows = []
    for c in selection["candidates"]:
        gap = c.get("heldout_gap_mae") or {}
        rows.append({"candidate": c["name"] + (" (chosen)" if c["name"] == selection["chosen"] else ""),
                     "params": c.get("n_params"), "gap MAE, largest N out": gap.get("N"),
                     "gap MAE, longest D out": gap.get("D"),
                     **({"gap MAE, largest budget out": gap.get("budget")} if "budget" in gap else {}),
                     "within noise": "yes" if c.get("within_noise") else ("not fitted" if not c.get("fittable", True) else "no")})
    close = sum(bool(c.get("within_noise")) for c in selection["candidates"]) - 1
    labels = {"N": "the largest size", "D": "the longest run", "budget": "the largest compute budget"}
    measured = {k for c in selection["candidates"] for k, v in (c.get("heldout_gap_mae") or {}).items() if v is not None}
    tried = {k for c in selection["candidates"] for k in (c.get("heldout_gap_mae") or {})}
    used = [labels[k] for k in labels if k in measured]
    unused = [labels[k] for k in ("N", "D") if k in tried and k not in measured]
    return (f"Chosen by held-out error on the precision gaps (loss minus the same-size, same-tokens "
            f"{', '.join(selection.get('reference', {}).get('recipes', []) or ['reference'])} run's, nats): the law is fitted "
            f"without {', then without '.join(used) or 'nothing (no split was usable)'}, and predicts the gaps it did not "
            "see" + (f" (without {' or '.join(unused)}, the held-out gaps come from fewer than two runs or have no "
                     "matching reference run: not used)" if unused else "") + ". "
            + (f"{close} other candidate{'s' if close != 1 else ''} {'are' if close != 1 else 'is'} within noise "
               "(2 run-clustered standard errors) of the chosen one, so the choice among them is not decided by these "
               "data; P* is reported across those whose precision axis is bits (the specification range above)."
               if close > 0 else "No other candidate is within noise (2 run-clustered standard errors) of the chosen "
               "one: on these held-out gaps the data prefer it.")
            + (" Among them is `chinchilla`, which has no precision term: these data cannot show that a "
               "precision-aware law predicts the held-out gaps better than none."
               if any(c["law"] == "chinchilla" and c.get("within_noise") and c["name"] != selection["chosen"]
                      for c in selection["candidates"]) else "")
            + _degenerate_text(selection) + "\n\n" + _markdown(pd.DataFrame(rows)))


def _conclusion(test: dict) -> str | None:
    """A test's conclusion in words (selection's precision and nested tests store it as `verdict`)."""
    return test.get("conclusion", test.get("verdict"))


def law_headline(law: dict | None) -> str | None:
    """The Fitted law section's first sentence (README's line), from findings' `law`: which law, how it was
    chosen and how stable that choice is, its exponents and its held-out error; None without a law."""
    if not (law or {}).get("name"):
        return None
    selection, params = law.get("selection"), law.get("params") or {}
    text = f"`{law['name']}`"
    if selection:
        scores = {c["name"]: c for c in selection["candidates"] if c.get("score") is not None and not c.get("degenerate")}
        best = min(scores.values(), key=lambda c: c["score"]) if scores else None
        pt = selection.get("precision_test") or {}
        text += (", chosen on held-out splits of the precision gaps"
                 + (f" as the law with the fewest params within noise of the best (`{best['name']}`)"
                    if best and best["name"] != law["name"] and (scores.get(law["name"]) or {}).get("within_noise") else "")
                 + (f"; it beats `chinchilla`, which has no precision term (p = {pt['p_value']:.2g})"
                    if pt.get("beats") and pt.get("p_value") is not None else ""))
        share = (selection.get("stability") or {}).get(law["name"])
        if share is not None:
            text += f"; chosen in {share:.0%} of {selection.get('stability_resamples')} cell resamples"
    if {"alpha", "beta"} <= set(params):
        a, b = params["alpha"], params["beta"]
        split = b / (a + b)
        lo, hi = fit_lib.LITERATURE_SPLIT
        text += f"; exponents alpha {a:.2f}, beta {b:.2f}: N* ∝ C^{split:.2f}"
        if not lo <= split <= hi:
            text += f" (outside the published {lo:g}–{hi:g}, so not extrapolated to cluster scale)"
    heldout = law.get("heldout")
    if heldout and heldout.get("mare") is not None:
        text += f"; error on the largest {heldout['by']} held out {heldout['mare']:.1%}"
    return text + "."


_SPLIT_WORDS = {"compute": "the largest compute N·D", "budget": "the largest compute budget", "N": "the largest size",
                "D/N": "the most tokens per parameter"}


def _noise_words(selection: dict) -> str:
    """How a selection's band of laws within noise was drawn: the one-standard-error rule (the best law's
    own SE), or, in a selection written before it, a paired difference within k SEs."""
    by = selection.get("clustered_by", "run")
    if "one-standard-error" in selection.get("rule", ""):
        se = selection.get("noise_se", 1)
        return (f"a score within {se:g} standard error{'s' if se != 1 else ''} of the best, the best law's own SE "
                f"clustered by {by}")
    return f"{selection.get('noise_se', 2):g} standard errors clustered by {by}"


def _splits_selection_text(selection: dict) -> str:
    """selection_text for a selection scored on several held-out splits (selection.SPLITS) with a
    precision test and nested-law tests (selection._choose)."""
    chosen, used = selection["chosen"], selection.get("splits") or []
    ref = ", ".join(selection.get("reference", {}).get("recipes", []) or ["reference"])
    details = {d["by"]: d for d in selection.get("split_details") or [] if d.get("by")}
    if not used:
        how = ("No held-out split could be made (" + "; ".join(f"{k}: {v}" for k, v in (selection.get("split_notes") or {}).items())
               + "), so the law with the lowest AIC was taken.")
    else:
        parts = []
        for by in used:
            d = details.get(by, {})
            parts.append(f"{_SPLIT_WORDS.get(by, by)} ({d['label']}; {d.get('train_rows', '?')} rows fitted)" if d.get("label") else
                         f"{_SPLIT_WORDS.get(by, by)} ({by} ≥ {fmt(d.get('value'))}: {d.get('held_runs', '?')} runs left out "
                         f"whole, {d.get('train_runs', '?')} fitted)")  # a fit selected before splits were strict
        skipped = {k: v for k, v in (selection.get("split_notes") or {}).items() if k not in used}
        for by in details:  # a split made but scored by no law: why, in the candidates' own words
            if by not in used and by not in skipped:
                notes = [c["heldout_notes"][by] for c in selection["candidates"] if (c.get("heldout_notes") or {}).get(by)]
                skipped[by] = notes[0] if notes else "not every law could be scored on it"
        how = (f"Laws are compared on the precision gaps (loss minus the same-size, same-tokens {ref} run's, nats), each "
               f"fitted without the rows it is scored on, on {len(used)} held-out split{'s' if len(used) != 1 else ''}: "
               + "; ".join(parts) + (" (every row at or beyond a split's threshold is held out, so a run's earlier rows "
                                     "are fitted and its later ones predicted)" if any(d.get("label") for d in details.values())
                                     else " (no held-out gap is a later checkpoint of a fitted run)")
               + ". A law's score is its mean held-out gap MAE over the splits."
               + (" Not used: " + "; ".join(f"{k} ({v})" for k, v in skipped.items()) + "." if skipped else ""))
    pt = selection.get("precision_test") or {}
    tests = []
    if pt.get("big"):
        tests.append(f"Precision test (a held-out likelihood ratio clustered by (N, seed), one-sided at {pt['alpha']:g}): "
                     f"{_conclusion(pt)} (" + (f"{pt['reason']}; " if pt.get("reason") else
                                             f"t = {fmt(pt.get('statistic'))}, p = {fmt(pt.get('p_value'))}, ")
                     + f"{pt.get('n_clusters')} clusters, {pt.get('n')} gaps).")
    elif pt.get("reason"):
        tests.append(f"No precision test: {pt['reason']}.")
    for t in selection.get("nested_tests") or []:
        tests.append(f"Nested test: `{t['big']}` {'beats' if t['beats'] else 'does not beat'} `{t['small']}` "
                     + (f"({t['reason']})." if t.get("reason") else
                        f"(t = {fmt(t.get('statistic'))}, p = {fmt(t.get('p_value'))})."))
    close = [c["name"] for c in selection["candidates"] if c.get("within_noise") and c["name"] != chosen]
    clustered = _noise_words(selection)
    choice = (f"Chosen: `{chosen}`. Also within noise ({clustered}): " + ", ".join(f"`{n}`" for n in close)
               + (" on held-out MAE alone; the tests above, which pair each gap across laws, decide between nested laws."
                  if selection.get("nested_tests") else
                  "; on held-out MAE alone these data do not rank them (the only paired test is the precision test above)."
                  if pt.get("big") else "; these data do not rank them.") if close else
               f"Chosen: `{chosen}`; no other law is within noise of it ({clustered}).")
    if selection.get("stability"):
        shares = sorted(selection["stability"].items(), key=lambda kv: -kv[1])
        choice += (f" Rule within noise: {selection['rule']}. How often each law is chosen when the "
                    f"{selection.get('stability_unit', '(N, seed) cell')}s are resampled "
                    f"({selection.get('stability_resamples')} resamples, the held-out errors not refitted): "
                    + ", ".join(f"`{name}` {share:.0%}" for name, share in shares if share > 0) + ".")
    rows = []
    for c in selection["candidates"]:
        diff = c.get("gap_mae_diff") or {}
        mae = c.get("heldout_gap_mae") or {}
        row = {"candidate": c["name"] + (" (chosen)" if c["name"] == chosen else ""), "params": c.get("n_params"),
               "bits axis": "yes" if laws.has_bits_axis(c["law"]) else "no"}
        row.update({f"gap MAE, {by} out": mae.get(by) for by in used})
        row.update({"mean": c.get("score"),
                    "excess over chosen": (None if not diff or c["name"] == chosen else
                                           f"{diff['value']:+.4f} ± {diff['se']:.4f}" if diff.get("se") is not None
                                           else f"{diff['value']:+.4f}"),
                    "within noise": "yes" if c.get("within_noise") else ("not fitted" if not c.get("fittable", True) else "no")})
        rows.append(row)
    by_bits = _by_bits_text(selection, used)
    return (" ".join([how, *tests, choice]) + _degenerate_text(selection) + "\n\n" + _markdown(pd.DataFrame(rows))
            + by_bits + _residuals_text(selection))


def _by_bits_text(selection: dict, used: Sequence[str]) -> str:
    """The candidates' held-out gap MAE apart for 6-8 and ≤4 bits (selection.BITS_GROUPS), mean over the splits."""
    groups = selection.get("bits_groups") or {}
    rows = []
    for c in selection["candidates"]:
        got = c.get("heldout_gap_mae_by_bits") or {}
        row = {"candidate": c["name"]}
        for g in groups:
            vals = [got.get(g, {}).get(by) for by in used]
            vals = [v for v in vals if v is not None]
            row[f"{g} bits"] = float(np.mean(vals)) if vals else None
        if any(v is not None for k, v in row.items() if k != "candidate"):
            rows.append(row)
    if not rows:
        return ""
    return ("\n\nThe same held-out gap MAE apart by the recipe's bits (mean over the splits; a law can be right on "
            "the 6-8-bit formats and wrong on FP4, or the reverse):\n\n" + _markdown(pd.DataFrame(rows)))


def _heldout_budget_selection_text(selection: dict) -> str:
    """selection_text for a selection scored on one held-out split with whole runs left out (selection.Split)."""
    split, chosen = selection["split"], selection["chosen"]
    ref = ", ".join(selection.get("reference", {}).get("recipes", []) or ["reference"])
    clustered = f"standard errors clustered by {selection.get('clustered_by', 'run')}"
    rows = []
    for c in selection["candidates"]:
        diff = c.get("gap_mae_diff") or {}
        rows.append({"candidate": c["name"] + (" (chosen)" if c["name"] == chosen else ""),
                     "params": c.get("n_params"), "bits axis": "yes" if laws.has_bits_axis(c["law"]) else "no",
                     "held-out gap MAE": c.get("score"),
                     "excess over best": (None if not diff or c["name"] == chosen else
                                          f"{diff['value']:+.4f} ± {diff['se']:.4f}" if diff.get("se") is not None
                                          else f"{diff['value']:+.4f}"),
                     "within noise": "yes" if c.get("within_noise") else ("not fitted" if not c.get("fittable", True) else "no")})
    if split.get("by") is None:
        how = f"No held-out split could be made ({split.get('note')}), so the law with the lowest AIC was taken."
    else:
        where = (f"the largest compute budget (C = {fmt(split['value'])})" if split["by"] == "budget"
                 else f"the largest size (N = {fmt(split['value'])}; no budget split: {split.get('note')})")
        n = max((next(iter((c.get("n_heldout") or {0: 0}).values())) for c in selection["candidates"]), default=0)
        how = (f"Laws are compared on the precision gaps (loss minus the same-size, same-tokens {ref} run's, nats) at "
               f"{where}: each is fitted without every run that has a point there ({split['held_runs']} runs left out "
               f"whole, {split['train_runs']} fitted), so no held-out gap is a later checkpoint of a fitted run, and "
               f"predicts the {n} gaps it did not see.")
    close = [c["name"] for c in selection["candidates"] if c.get("within_noise")]
    if len(close) > 1:
        bits = [n for n in close if laws.has_bits_axis(next(c["law"] for c in selection["candidates"] if c["name"] == n))]
        choice = (f" Within noise of the best ({selection.get('noise_se', 2):g} {clustered}): "
                   + ", ".join(f"`{n}`" for n in close) + ". These data do not pick one law among them; the fit reported "
                   f"here is `{chosen}`, the lowest held-out error of a fit that is not degenerate" + (
                       f", and a continuous P* comes only from those with a bits axis ({', '.join(f'`{n}`' for n in bits)})."
                       if bits else ", and none of them has a bits axis, so there is no continuous P*."))
    elif selection.get("criterion", "").startswith("heldout"):
        choice = (f" Only `{chosen}` is within noise ({selection.get('noise_se', 2):g} {clustered}) of the lowest "
                   "held-out error: on these gaps the data prefer it.")
    else:
        choice = ""
    if any(c["law"] == "chinchilla" and c.get("within_noise") and c["name"] != chosen for c in selection["candidates"]):
        choice += (" Among them is `chinchilla`, which has no precision term: these data cannot show that a "
                    "precision-aware law predicts the held-out gaps better than none.")
    return how + choice + _degenerate_text(selection) + "\n\n" + _markdown(pd.DataFrame(rows)) + _residuals_text(selection)


def _degenerate_text(selection: dict) -> str:
    """The candidates whose full-data fit is degenerate: scored, never chosen while a sound one exists."""
    bad = [c for c in selection["candidates"] if c.get("degenerate")]
    if not bad:
        return ""
    return (" Degenerate fits, scored but not chosen (no optimum is derived from them): "
            + "; ".join(f"`{c['name']}` ({c['degenerate']})" for c in bad) + ".")


def _residuals_text(selection: dict) -> str:
    """The chosen law's held-out gap errors per recipe (selection.heldout_errors_by_recipe) as a small table."""
    rows = selection.get("chosen_residuals") or []
    if not rows:
        return ""
    table = pd.DataFrame([{"recipe": r["recipe"], "n": r["n"], "mean residual": f"{r['mean']:+.3f}",
                           "95% CI": f"{r['ci'][0]:+.3f} to {r['ci'][1]:+.3f}" if r.get("ci") else "– (one run)"}
                          for r in rows])
    off = [r["recipe"] for r in rows if r.get("ci") and (r["ci"][0] > 0 or r["ci"][1] < 0)]
    return (f"\n\nHeld-out gap errors of `{selection['chosen']}` by recipe (predicted minus measured gap, nats; "
            "95% t interval clustered by run)" + (f"; its errors are systematic for {', '.join(off)}, whose interval "
                                                  "excludes zero" if off else "") + ":\n\n" + _markdown(table))


def heldout_error(fit: FitResult, ok: pd.DataFrame) -> tuple[str, float | None]:
    """In-sample error of the law and, when the fit ran one (`scaling fit --holdout`), its held-out
    extrapolation error: fit on the smaller runs, mean absolute relative error on the largest."""
    rel = np.abs(np.asarray(fit.predict(ok), float) / ok["val_loss"].to_numpy(float) - 1)
    text = f"Mean absolute relative error of the fitted law on its {len(ok)} points: {rel.mean():.2%}."
    heldout = getattr(fit, "heldout", None) or {}
    if heldout.get("mare") is None:
        if (getattr(fit, "selection", None) or {}).get("chosen"):
            return text + (" This is in-sample; the law's held-out error on the precision gaps is in the selection "
                           "table above (the loss itself is not held out: `scaling fit --holdout N`)."), None
        return text + " The fit records no held-out test (`scaling fit --holdout N`), so this is in-sample only.", None
    by = "N" if heldout.get("by", "N") == "N" else "compute 6·N·D"
    text += (f" Held-out extrapolation: fitted on the {heldout.get('n_train', '?')} points with {by} below "
             f"{fmt(heldout.get('threshold'))}, the law predicts the other {heldout.get('n_test', '?')} "
             f"with a mean absolute relative error of {float(heldout['mare']):.2%}.")
    return text, float(heldout["mare"])


def pstar_section(f: dict) -> str:
    """P* per budget: its headline (pstar_headline), the profile over the formats chips run, the chosen
    law's value, its bootstrap CI, the specification range, and whether each published range holds it."""
    if not f["P_star"]:
        return "No precision-aware law was fitted, so there is no P*."
    law = f["law"]["name"]
    lines = []
    for e in f["P_star"]:
        lines += [pstar_headline(e), ""]
        if "error" in e:
            continue
        if e.get("no_bits_axis"):
            form = laws.get(law)
            by = f"fitted {form.per_recipe_term}" if form.per_recipe else "quantisation errors"
            text = (f"- C = {fmt(e['compute'])}: the chosen `{law}` law prices precision by "
                    + (f"a fitted {form.per_recipe_term} per recipe" if form.per_recipe else "measured quantisation error")
                    + ", not bits, so it has no continuous P*")
            ranked = e.get("recipes") or []
            if ranked:
                top = ranked[0]
                close = [r["recipe"] for r in ranked[1:] if r.get("within_law_error_of_best")]
                within = (f"; within the law's error of it: {', '.join(close)}" if close else
                          "; no other recipe within the law's error of it" if "within_law_error_of_best" in top else "")
                text += (f". Read at each measured recipe's own {by}, its lowest loss is {top['recipe']}'s "
                         f"({top['bits']:.3g} effective bits; N = {fmt(top['N'])}, D = {fmt(top['D'])}), then "
                         + ", ".join(f"{r['recipe']} (+{r['loss'] - top['loss']:.3g} nats)" for r in ranked[1:4]) + within)
            text += _measured_text(e, ranked[0]["recipe"] if ranked else None)
            drawn = bool((e.get("profile") or {}).get("rows"))  # from a within-noise law with a bits axis
            lines += [profile_text(e["profile"]), ""] if drawn else []
            lines += [text + ". " + _menu_text(e, law) + ".", *([""] if drawn else [])]
            continue
        if e.get("profile") and "rows" in e["profile"]:
            lines += [profile_text(e["profile"]), ""]
        rng = e.get("P_range")
        rng_text = f"{rng[0]:.3g}–{rng[1]:.3g} bits across {len(e['specifications'])} specifications" if rng else "–"
        if e.get("P_grid"):
            # an integer exponent/mantissa law's optimum is a grid point: no continuous P*, no CI to quote
            lines.append(f"- C = {fmt(e['compute'])}: the `{law}` law's own optimum is {e['P']:.3g} bits, not a continuous "
                         f"P*: {e['P_grid'].replace('; see `profile`', '')}; the table above is its answer. Across the "
                         f"specifications the law's optimum spans {rng_text}{_measured_text(e, None)}. "
                         + _published_text(e))
            lines.append("")
            continue
        ci = f"bootstrap 95% CI {e['P_ci'][0]:.3g}–{e['P_ci'][1]:.3g}" if e.get("P_ci") else "no bootstrap CI"
        lines.append(f"- C = {fmt(e['compute'])}: the `{law}` law gives P* = {e['P']:.3g} bits ({ci}); "
                     f"the specification range is {rng_text}{_measured_text(e, None)}. " + _published_text(e))
        lines.append("")
    spec = f["P_star"][0].get("specifications") or []
    if spec:
        lines += ["", "Specifications at the first budget (law and exponents × cost model; for a law on measured "
                  "quantisation errors, the bits of its best recipe):", "",
                  "| specification | cost model | P* | N | D |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {r['spec']} | {r['cost_model']} | " + (f"{r['P']:.3g} | {fmt(r['N'])} | {fmt(r['D'])} |"
                  if "P" in r else f"{_not_evaluated(r.get('error'))} | – | – |") for r in spec]
    return "\n".join(lines)


def _published_text(e: dict) -> str:
    """The published ranges read against the law's interval (its P*, CI and specification range) and,
    apart, against the bits of the recipes the measurement cannot rule out: a hardware choice and an
    extrapolation are not one interval."""
    law_iv = e.get("law_interval") or e.get("interval")
    said = []
    for name, (a, b) in _published().items():
        v = (e.get("published_law") or e["published"])[name]
        said.append(f"whether it lies in {name}'s {a:g}–{b:g} bits, cannot tell" if v == "cannot tell"
                    else f"{'inside' if v == 'inside' else 'outside'} {name}'s {a:g}–{b:g} bits")
    text = f"The law's interval (P* with its CI and specification range) is {law_iv[0]:.3g}–{law_iv[1]:.3g} bits: {'; '.join(said)}."
    bits = e.get("measured_bits") or []
    if bits:
        inside = {name: [x for x in bits if a <= x <= b] for name, (a, b) in _published().items()}
        text += (" Measured, the recipes that may be best carry " + ", ".join(f"{x:.3g}" for x in sorted(set(bits)))
                 + " bits; " + "; ".join(f"{name}'s range contains {len(v)} of them" for name, v in inside.items()) + ".")
    return text


def pstar_headline(e: dict) -> str:
    """P* at one budget in one sentence (each budget's first line in REPORT's P* section; README's line is the
    largest budget's): the recipes the IsoFLOP measurement cannot rule out, then the law's continuous P*
    (or its interval) and the formats chips run that its error cannot tell from its lowest-loss one; for a
    law without a bits axis, the measured recipes it chooses among."""
    head = f"C = {fmt(e['compute'])}: "
    if "error" in e:
        return head + f"no P* ({e['error']})."
    measured = e.get("measured") or []
    ruled = ("the IsoFLOP measurement cannot rule out as best "
             + ", ".join(f"{m['recipe']} ({m['bits']:.3g} bits)" for m in measured) if measured else "")
    if e.get("no_bits_axis"):
        # a law on quantisation errors ranks the measured recipes: a choice among them, not an interval
        ranked = e.get("recipes") or []
        choice = ranked[:1] + [m for m in measured if m["recipe"] not in {r["recipe"] for r in ranked[:1]}]
        names = ", ".join(f"{c['recipe']} ({c['bits']:.3g} bits)" for c in choice) or "none"
        return head + (f"**{names}**: a choice among measured recipes, not an interval of P* "
                       f"(`{e['no_bits_axis']}` has no bits axis).")
    profile = e.get("profile") or {}
    star = profile.get("pstar") or {}
    if star.get("P") is not None:
        law = (f"the law's continuous P* **{star['P']:.3g} bits**"
               + (f" (95% CI {star['ci'][0]:.3g}–{star['ci'][1]:.3g})" if star.get("ci") else ""))
    else:
        ci = f", bootstrap 95% CI {e['P_ci'][0]:.3g}–{e['P_ci'][1]:.3g}" if e.get("P_ci") else ""
        law = f"**{_bits(e.get('law_interval') or e['interval'])}** (the law's P* {e['P']:.3g} bits{ci})"
    if profile.get("rows"):
        lowest = min(profile["rows"], key=lambda r: r["loss"])
        law += (f"; of the formats chips run its lowest loss is {lowest['name']}'s ({lowest['bits_per_element']:.3g} bits "
                "per element)")
        close = [r for r in profile_lib.within_error_of_best(profile) if r is not lowest]
        if profile.get("law_error") is not None:  # the table below names them
            law += (f", and {len(close)} other{'s' if len(close) != 1 else ''} {'are' if len(close) != 1 else 'is'} within "
                    f"its error ({profile['law_error']:.1%} of the loss)")
    return head + "; ".join(x for x in (ruled, law) if x) + "."


def _bits(interval: Sequence[float]) -> str:
    lo, hi = interval
    return f"{lo:.3g} bits" if f"{lo:.3g}" == f"{hi:.3g}" else f"{lo:.3g}–{hi:.3g} bits"


def profile_text(p: dict) -> str:
    """The P* profile (scaling.study.analysis.pstar.profile.precision_profile) as a table: each format's loss at its
    compute-optimal N with its CI, whether the law's error can tell it from the lowest, and each difference
    to the next format with its family-wise CI; a difference below the law's error
    (profile.judge_within_error: the largest it measured) is said to be within it, whatever its bootstrap
    CI. No P(best): the bootstrap holds the law's parameter noise only, not its error off the data."""
    error = p.get("law_error")
    pairs = {q["from"]: q for q in p.get("pairs", [])}
    lines = [f"The `{p['law']}` law under the {p['cost_model']} cost model: its loss at each "
             f"format chips run, at that format's compute-optimal N ({p['level']:.0%} bootstrap CIs over "
             f"{p['resamples']} resamples; each difference is the next format's loss minus this one's, paired over "
             f"the same resamples, family-wise over the {len(pairs)} neighbour pairs)"
             + (f"; a difference below the law's error ({error:.2%} of the loss, the largest "
                + ("the chosen law was measured at" if p.get("drawn_from") else "it measured")
                + ": see Limitations) is within its error, whatever the bootstrap says" if error else "")
             + ". Untrained: no fitted run had that format."
             + (f" Not the chosen law's profile: {p['drawn_from']}." if p.get("drawn_from") else ""), "",
             "| format | chips | bits per element | N | loss | 95% CI | within the law's error of the lowest | trained | "
             "next minus this | family-wise CI | next format's loss |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in p["rows"]:
        q = pairs.get(r["name"])
        diff = ci = direction = "–"
        if q:
            diff = f"{q['diff']:+.4f}"
            ci = f"{q['ci'][0]:+.4f} to {q['ci'][1]:+.4f}" if q.get("ci") else "– (no resamples)"
            direction = "within the law's error" if q.get("within_law_error") else profile_lib.direction(q)
        lo, hi = r["loss_ci"] if r.get("loss_ci") else (None, None)
        close = r.get("within_law_error_of_best")
        lines.append(f"| {r['name']} | {r.get('chips') or '–'} | {r['bits_per_element']:.3g} | {fmt(r['N'])} | "
                     f"{r['loss']:.4f} | {'–' if lo is None else f'{lo:.4f} to {hi:.4f}'} | "
                     f"{'–' if close is None else 'yes' if close else 'no'} | "
                     f"{'no' if r.get('untrained') else 'yes'} | {diff} | {ci} | {direction} |")
    star = p.get("pstar") or {}
    if star.get("P") is not None:
        lines += ["", f"Continuous P* = {star['P']:.3g} bits" + (f" ({p['level']:.0%} CI {star['ci'][0]:.3g}–{star['ci'][1]:.3g})"
                                                                 if star.get("ci") else "") + "."]
    elif star.get("reason"):
        lines += ["", f"No continuous P*: {star['reason']}."]
    return "\n".join(lines)


def _not_evaluated(error: str | None) -> str:
    """A sentence for a specification that cannot be optimised, not its raw error: a ConfigError's
    'key: got value; allowed: what' becomes 'not evaluated: it needs what' (e.g. the sun law read at a
    hypothetical P has no scale block size)."""
    if not error:
        return "–"
    allowed = error.split("allowed: ", 1)[1] if "allowed: " in error else ""
    allowed = re.sub(r"\s*\(e\.g\..*\)$", "", allowed).strip()
    return f"not evaluated: it needs {allowed}" if allowed else "not evaluated"


def _menu_text(e: dict, law: str) -> str:
    """For a law without a bits axis: the best measured recipe(s), named with their bits, as a choice among
    recipes (not an interval of P*), and which of them each published range contains; a continuous P* only
    from the within-noise laws with a bits axis, if any."""
    named: dict[str, float] = {}
    for r in e.get("recipes") or []:
        if r.get("best") or r.get("within_law_error_of_best"):
            named[r["recipe"]] = float(r["bits"])
    for m in e.get("measured") or []:
        named.setdefault(m["recipe"], float(m["bits"]))
    if not named:
        return "No measured recipe can be named best"
    menu = sorted(named.items(), key=lambda kv: kv[1])
    listed = ", ".join(f"{r} ({b:.3g} bits)" for r, b in menu)
    text = (f"The best measured recipe{'s' if len(menu) > 1 else ''} (the law's lowest, those within the law's error "
            f"of it and those the measurement cannot rule out): {listed}; a choice among measured recipes, not an interval of P*")
    bits_specs = [r["P"] for r in e.get("specifications") or [] if "P" in r and not r["spec"].startswith(law)]
    if bits_specs:
        lo, hi = min(bits_specs), max(bits_specs)
        text += (". The within-noise laws with a bits axis put a continuous P* at "
                 + (f"{lo:.3g} bits" if f"{lo:.3g}" == f"{hi:.3g}" else f"{lo:.3g}–{hi:.3g} bits"))
    ranges = []
    for name, (a, b) in _published().items():
        inside = [r for r, bits in menu if a <= bits <= b]
        ranges.append(f"{name}'s {a:g}–{b:g} bits contains " + (", ".join(inside) if inside else "none of them"))
    return text + ". " + "; ".join(ranges)


def _measured_text(e: dict, law_choice: str | None) -> str:
    """The recipes the IsoFLOP measurement at this budget cannot rule out (findings.measured_choice), and
    whether the law's choice is among them."""
    measured = e.get("measured") or []
    if not measured:
        return ""
    text = ("; the IsoFLOP measurement at this budget cannot rule out as best " +
            ", ".join(f"{m['recipe']} ({m['bits']:.3g} bits, P(best) {m['p_best']:.2f})" for m in measured))
    if law_choice and law_choice not in {m["recipe"] for m in measured}:
        text += (f", so it disagrees with the law's {law_choice} (see the law's residuals by recipe, figure 9), and "
                 "both are named below")
    return text


def _published() -> dict:
    return findings_lib.PUBLISHED

