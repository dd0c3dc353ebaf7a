"""REPORT.md's sentences: each built-in section's text, computed from the numbers passed in.

Every sentence that states a finding is computed: the comparison with the published sweet spots
(Kumar et al. 2024: compute-optimal precision 7-8 bits; Sun et al. 2025: 4-8 bits) from P*'s
interval, the limitations paragraph from the data's own spans (sizes, tokens, points per parameter,
precisions measured). scaling.study.report orders these sections, adds a study's own and writes the
file; a study's own sections use `fmt`, `verdict_sentence` and `findings_section` as the built-in ones do.

About 800 lines, one function per section (and its small helpers): REPORT's wording stays in one place,
so a sentence and the ones it must agree with are read and changed together.
"""

from __future__ import annotations

import math
import re
from typing import Any, Sequence

import numpy as np
import pandas as pd

from scaling.study import analysis, laws, plots
from scaling.study import findings as findings_lib
from scaling.study.design_checks import HIGH_BITS, QUANTISED_PARTS, UNQUANTISED_DOMINATES

# Chinchilla's compute-optimal ratio (Hoffmann et al. 2022), for the limitations paragraph.
CHINCHILLA_TOKENS_PER_PARAM = 20.0


def position(value: float, lo: float, hi: float) -> str:
    """'below', 'inside' or 'above' the closed interval [lo, hi]."""
    return "below" if value < lo else "above" if value > hi else "inside"


def fmt(x: Any) -> str:
    """A number as REPORT prints it: 4 significant digits, 3 in exponent form for large and small ones."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    x = float(x)
    if x != 0 and (abs(x) >= 1e4 or abs(x) < 1e-3):
        return f"{x:.3g}".replace("e+", "e")
    return f"{x:.4g}"


def _span(values: pd.Series) -> str:
    values = pd.to_numeric(values, errors="coerce").dropna()
    if values.empty:
        return "–"
    lo, hi = values.min(), values.max()
    return fmt(lo) if lo == hi else f"{fmt(lo)}–{fmt(hi)}"


def _markdown(table: pd.DataFrame) -> str:
    header = "| " + " | ".join(map(str, table.columns)) + " |"
    rule = "| " + " | ".join("---" for _ in table.columns) + " |"
    rows = ["| " + " | ".join(v if isinstance(v, str) else fmt(v) for v in row) + " |"
            for row in table.itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def what_was_run(all_rows: pd.DataFrame, ok: pd.DataFrame, corpus: str | None) -> str:
    runs = all_rows.drop_duplicates("run_id")
    statuses = runs["status"].fillna("ok").value_counts() if "status" in runs.columns else pd.Series({"ok": len(runs)})
    labelled = plots.with_precision(ok.drop_duplicates("run_id")) if not ok.empty else ok.assign(precision=[])
    by_precision = labelled["precision"].value_counts()
    precisions = ", ".join(f"{p} ({by_precision[p]} runs)" for p in plots.precision_order(by_precision.index))
    recipes = ", ".join(sorted(map(str, labelled["recipe"].dropna().unique()))) if "recipe" in labelled.columns else "–"
    lines = [
        f"- Runs: {len(runs)} ({', '.join(f'{n} {s}' for s, n in statuses.items())}); "
        f"{len(ok)} (run, token budget) points with a finite validation loss.",
        f"- Sweeps: {_sweeps(all_rows, ok)}.",
        f"- Model sizes: {ok['N'].nunique()} distinct, N = {_span(ok['N'])} non-embedding parameters.",
        f"- Token budgets: {ok['D'].nunique()} distinct, D = {_span(ok['D'])} tokens; "
        f"tokens per parameter D/N = {_span(ok['D'] / ok['N'])}.",
        f"- Precisions: {precisions or '–'}; recipes: {recipes}.",
        f"- Seeds per (sweep, size, recipe, tokens) cell: {_range_text(findings_lib._seeds_per_cell(ok))}.",
        f"- Corpus: {corpus or 'not recorded in the results table'}.",
    ]
    kept = unquantised_share(ok)
    if kept:
        lines.append(f"- FLOPs a low-precision recipe leaves in high precision (the output head, attention, blocks it "
                     f"keeps): {kept}.")
    return "\n".join(lines)


def unquantised_share(ok: pd.DataFrame) -> str:
    """The share of a training step's FLOPs that low-precision recipes run in high precision (the parts
    besides the quantised projections whose operands are >= design_checks.HIGH_BITS wide, as the dry run's
    warning counts them), per model size from the results' per-part FLOPs and bits; '' without them."""
    parts = [c[len("flops_"):] for c in ok.columns if c.startswith("flops_") and c != "flops_per_token"
             and f"bits_{c[len('flops_'):]}_0" in ok.columns]
    if not parts or "N" not in ok.columns:
        return ""
    rows = ok.drop_duplicates("run_id") if "run_id" in ok.columns else ok
    flops = rows[[f"flops_{p}" for p in parts]].apply(pd.to_numeric, errors="coerce").fillna(0.0).to_numpy(float)
    bits = np.stack([rows[[f"bits_{p}_0", f"bits_{p}_1"]].apply(pd.to_numeric, errors="coerce").min(axis=1).to_numpy(float)
                     for p in parts], axis=1)
    low = bits[:, [parts.index(p) for p in QUANTISED_PARTS if p in parts]].min(axis=1) < HIGH_BITS
    kept = np.array([p not in QUANTISED_PARTS for p in parts]) & (np.nan_to_num(bits, nan=HIGH_BITS) >= HIGH_BITS)
    share = (flops * kept).sum(axis=1) / np.where(flops.sum(axis=1) > 0, flops.sum(axis=1), np.nan)
    by_n = pd.Series(share[low], index=rows["N"].to_numpy()[low]).dropna().groupby(level=0).max()
    if by_n.empty:
        return ""
    top = by_n.idxmax()
    text = (f"at most {by_n.max():.0%} (the recipe keeping the most) at N = {fmt(top)}, {by_n.iloc[-1]:.0%} at the largest "
            f"N = {fmt(by_n.index[-1])}")
    over = by_n[by_n > UNQUANTISED_DOMINATES]
    if len(over):
        text += (f"; above half at {len(over)} of {len(by_n)} sizes (N ≤ {fmt(over.index.max())}), where a precision "
                 "comparison measures mostly parts the recipe leaves in high precision")
    return text


def _sweeps(all_rows: pd.DataFrame, ok: pd.DataFrame) -> str:
    """Each sweep with its run count and what it feeds (analysis.study_part: the main study is fitted)."""
    if "sweep" not in all_rows.columns:
        return "–"
    sweeps = all_rows.drop_duplicates("run_id")["sweep"].astype(str)
    runs = sweeps.value_counts()
    family = dict(zip(sweeps, analysis.sweep_family(sweeps)))
    role = {name: f"figure {analysis.PURPOSE_SWEEPS[family[name]]}" for name in runs.index if family[name] in analysis.PURPOSE_SWEEPS}
    role["isocompute"] = "figure 1 and the direct test: each precision at its cost-model size, same tokens"
    role["isocompute_law"] = "figure 1 and the direct test: each precision at the law's optimal N, D"
    main = sorted(name for name in runs.index if family[name] not in analysis.PURPOSE_SWEEPS)
    return "; ".join(f"{name} ({runs[name]} runs, {role.get(name, 'fitted; figures 1-4, 6' if name in main else '')})"
                     for name in main + sorted(set(runs.index) - set(main)))


def fitted_law(fit: Any) -> str:
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


_SPLIT_WORDS = {"compute": "the largest compute N·D", "budget": "the largest compute budget", "N": "the largest size",
                "D/N": "the most tokens per parameter"}


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
            parts.append(f"{_SPLIT_WORDS.get(by, by)} ({by} ≥ {fmt(d.get('value'))}: {d.get('held_runs', '?')} runs left out "
                         f"whole, {d.get('train_runs', '?')} fitted)")
        skipped = {k: v for k, v in (selection.get("split_notes") or {}).items() if k not in used}
        how = (f"Laws are compared on the precision gaps (loss minus the same-size, same-tokens {ref} run's, nats), each "
               f"fitted without the runs it is scored on, on {len(used)} held-out split{'s' if len(used) != 1 else ''}: "
               + "; ".join(parts) + " (no held-out gap is a later checkpoint of a fitted run). A law's score is its mean "
               "held-out gap MAE over the splits."
               + (" Not used: " + "; ".join(f"{k} ({v})" for k, v in skipped.items()) + "." if skipped else ""))
    pt = selection.get("precision_test") or {}
    tests = []
    if pt.get("big"):
        tests.append(f"Precision test (a held-out likelihood ratio clustered by (N, seed), one-sided at {pt['alpha']:g}): "
                     f"{pt['verdict']} (t = {fmt(pt.get('statistic'))}, p = {fmt(pt.get('p_value'))}, "
                     f"{pt.get('n_clusters')} clusters, {pt.get('n')} gaps).")
    elif pt.get("reason"):
        tests.append(f"No precision test: {pt['reason']}.")
    for t in selection.get("nested_tests") or []:
        tests.append(f"Nested test: `{t['big']}` {'beats' if t['beats'] else 'does not beat'} `{t['small']}` "
                     f"(t = {fmt(t.get('statistic'))}, p = {fmt(t.get('p_value'))}).")
    close = [c["name"] for c in selection["candidates"] if c.get("within_noise") and c["name"] != chosen]
    clustered = f"{selection.get('noise_se', 2):g} standard errors clustered by {selection.get('clustered_by', 'run')}"
    verdict = (f"Chosen: `{chosen}`. Within noise of it ({clustered}): " + ", ".join(f"`{n}`" for n in close)
               + " on held-out MAE alone; the tests above, which pair each gap across laws, decide between nested laws." if close else
               f"Chosen: `{chosen}`; no other law is within noise of it ({clustered}).")
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
    return (" ".join([how, *tests, verdict]) + _degenerate_text(selection) + "\n\n" + _markdown(pd.DataFrame(rows))
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
        verdict = (f" Within noise of the best ({selection.get('noise_se', 2):g} {clustered}): "
                   + ", ".join(f"`{n}`" for n in close) + ". These data do not pick one law among them; the fit reported "
                   f"here is `{chosen}`, the lowest held-out error of a fit that is not degenerate" + (
                       f", and a continuous P* comes only from those with a bits axis ({', '.join(f'`{n}`' for n in bits)})."
                       if bits else ", and none of them has a bits axis, so there is no continuous P*."))
    elif selection.get("criterion", "").startswith("heldout"):
        verdict = (f" Only `{chosen}` is within noise ({selection.get('noise_se', 2):g} {clustered}) of the lowest "
                   "held-out error: on these gaps the data prefer it.")
    else:
        verdict = ""
    if any(c["law"] == "chinchilla" and c.get("within_noise") and c["name"] != chosen for c in selection["candidates"]):
        verdict += (" Among them is `chinchilla`, which has no precision term: these data cannot show that a "
                    "precision-aware law predicts the held-out gaps better than none.")
    return how + verdict + _degenerate_text(selection) + "\n\n" + _markdown(pd.DataFrame(rows)) + _residuals_text(selection)


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


def heldout_error(fit: Any, ok: pd.DataFrame) -> tuple[str, float | None]:
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


def matched_section(f: dict) -> str:
    """Each recipe's gap to the reference at matched tokens (findings' `matched`): the numerics alone,
    before any cost model; continuous differences with their intervals, then the verdicts."""
    m, unit = f["matched"], f["loss_unit"]
    fw = m["familywise"]
    lines = [f"Each recipe's loss minus {m['reference']}'s at the same model size, tokens and seed (same initialisation, "
             f"same data order, same tokens: only the numerics differ), paired on {', '.join(m['keys'])}. One regression "
             f"per recipe over every budget: gap = a + b·(ln N − mean) + c·(ln(D/N) − mean), so a is the recipe's mean "
             f"matched gap at the centre of its points; errors clustered by ({', '.join(m['clustered_by'])}) (a seed fixes "
             f"both the initialisation and the data order; CR1, t with G − 1 dof). The family-wise intervals are "
             f"{fw['rule']} over {fw['m']} coefficients ({fw['level']:.0%} for all together); each verdict is read "
             f"from them. Loss in {unit}. No cost model enters here: the IsoFLOP sections below add one.", "",
             "| recipe | points (clusters) | matched gap a | 95% CI | family-wise CI | per e-fold of D/N, c (family-wise CI) | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    def ci(x):
        return "–" if x is None else f"{x[0]:+.3f} to {x[1]:+.3f}"
    for r in sorted(m["recipes"], key=lambda r: (r["mean"] is None, r["mean"] or 0)):
        if r["mean"] is None:
            lines.append(f"| {r['recipe']} | {r['n']} ({r['clusters']}) | – | – | – | – | cannot tell: {r['reason']} |")
            continue
        c = r["coefficients"]["c"]
        slope = "–" if c["estimate"] is None else f"{c['estimate']:+.3f} ({ci(c.get('familywise_ci'))})"
        lines.append(f"| {r['recipe']} | {r['n']} ({r['clusters']}) | {r['mean']:+.4f} | {ci(r['mean_ci'])} | "
                     f"{ci(r['mean_familywise_ci'])} | {slope} | {r['verdict']} |")
    lines += ["", _with_tokens(m["recipes"])]
    return "\n".join(lines)


def _with_tokens(recipes: list[dict]) -> str:
    """Which gaps move with D/N at a fixed N, read from the family-wise CIs of c. Kumar et al.'s form,
    where precision lowers only the effective N, predicts a gap that does not."""
    moves = {"grows": [], "shrinks": []}
    for r in recipes:
        c = (r.get("coefficients") or {}).get("c") or {}
        lo_hi = c.get("familywise_ci")
        if lo_hi and lo_hi[0] > 0:
            moves["grows"].append(r["recipe"])
        elif lo_hi and lo_hi[1] < 0:
            moves["shrinks"].append(r["recipe"])
    said = [f"grows with D/N for {', '.join(v)}" if k == "grows" else f"shrinks with D/N for {', '.join(v)}"
            for k, v in moves.items() if v]
    if not said:
        return ("At a fixed N no recipe's gap moves with D/N beyond its family-wise CI (c): cannot tell whether the cost "
                "of low precision grows with tokens, as Kumar et al.'s data-dependent form says, or not.")
    return (f"At a fixed N the gap {' and '.join(said)} (family-wise CI of c excludes zero); the others cannot tell. "
            "Kumar et al.'s form, where precision lowers only the effective N, predicts a gap that does not move with D/N.")


def chips_section(f: dict) -> str:
    """The IsoFLOP verdicts at the same budgets on real chips (findings' `cost_models`): each recipe's charge
    per 6ND under every cost model, then the verdict per chip and budget, indicative where interpolated."""
    c = f["cost_models"]
    ch = c["charges"]
    chips = list(c["chips"])
    lines = ["The verdicts above charge each FLOP by its operands' bits (`bits`: half the bits, twice the throughput). "
             "A chip charges by the rate its tensor cores run each format at (dense peaks; FP8 and FP6 at the FP8 "
             "rate, FP4 at the FP8 rate on H100 and twice it on B200): a recipe's tokens at a budget follow from "
             f"its charge. Charge per 6ND at N = {fmt(ch['N'])}, and the tokens it buys relative to {ch['reference']}:", "",
             "| recipe | " + " | ".join(f"{m}: charge (tokens)" for m in ("bits", *chips)) + " |",
             "| --- | " + " | ".join("---" for _ in ("bits", *chips)) + " |"]
    for r in ch["rows"]:
        lines.append(f"| {r['recipe']} | " + " | ".join(
            f"{r[m]:.3f} ({r[m + '_tokens']:.2f}x)" for m in ("bits", *chips)) + " |")
    lines += ["", f"The same budgets ({ch['reference']} spends the same compute under every model), read on each chip. "
                  "A run evaluated only where the `bits` design put it may pass a chip's budget before its first "
                  "evaluation (absent: nothing is extrapolated) or be read between two evaluations (interpolated: "
                  "indicative, log loss linear in log D).", "",
              "| chip | C | verdict | best vs runner-up | runner-up − best (95% CI) | recipes fitted / short / absent | interpolated |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    thin = False
    for chip, entry in c["chips"].items():
        for b in entry["budgets"]:
            verdict = f"**{b['winner']}**" if b["winner"] else ("cannot tell" if b["best"] else "no IsoFLOP profile")
            diff = (f"{b['diff']:+.3f} ({b['diff_ci'][0]:+.3f} to {b['diff_ci'][1]:+.3f})"
                    if b["diff_ci"] else "–")
            share = b["interpolated_share"]
            thin = thin or bool(b["absent"]) or bool(share)
            lines.append(f"| {chip} | {fmt(b['budget_reference'])} | {verdict} | {b['best'] or '–'} vs {b['runner_up'] or '–'} | "
                         f"{diff} | {len(b['fitted'])} / {len(b['short'])} / {len(b['absent'])} | "
                         + ("–" if share is None else f"{share:.0%}" + (" (indicative)" if share else "")) + " |")
    if thin:
        lines += ["", "What would settle it: these runs were placed by the `bits` cost model, so on a chip some recipes "
                      "miss the budgets or are read between evaluations. An IsoFLOP design costed on the chip "
                      "(`cost = \"h100\"` in the experiment's `[isoflop]` table) lands every recipe on its budgets; it "
                      "needs new runs."]
    return "\n".join(lines)


def bits_cell(e: dict) -> str:
    """A recipe's bits P as a table cell ('–' where the results do not record it)."""
    return "–" if e.get("P") is None else f"{e['P']:g}"


def findings_section(f: dict) -> str:
    """Per budget: each recipe's IsoFLOP minimum with its CI, runs and P(best); the verdict sentence."""
    unit = f["loss_unit"]
    lines = [f"Compute in 16-bit FLOP units, cost model *{f['cost_model']}*. Loss in {unit}. "
             f"{f['runs']} runs; seeds per (size, recipe, tokens) cell: {_range_text(f['seeds_per_cell'])}. "
             "A recipe's bits P are its forward GEMM operands' element width, as the law sees them; what the cost "
             "model charges for one of its FLOPs, in 16-bit FLOPs, is a separate column: every verdict below holds "
             "for this cost model only."]
    if not f["budgets"]:
        return "\n".join(lines + ["", "No budget is reached by three or more sizes of two recipes: "
                                   "no IsoFLOP profile can be fitted, so the data cannot tell which precision is best."])
    for b in f["budgets"]:
        lines += ["", f"**C = {fmt(b['budget'])}.** " + verdict_sentence(b, unit), "",
                  "| recipe | bits P | charged per FLOP | runs (sizes) | IsoFLOP minimum | 95% CI | at N | P(best) |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for e in sorted(b["recipes"], key=lambda e: (e["loss"] is None, e["loss"] or 0)):
            if e["loss"] is None:
                why = "too few sizes" if e["sizes"] < analysis.MIN_SIZES else "not fitted (above)"
                lines.append(f"| {e['recipe']} | {bits_cell(e)} | {e['bits_eff'] / 16:.3g} | {e['runs']} ({e['sizes']}) | {why} | – | – | – |")
                continue
            ci = f"{e['ci'][0]:.4g}–{e['ci'][1]:.4g}" if e["ci"] else "–"
            at = fmt(e["N_opt"]) + ("" if e["inside"] else " (edge)")
            p_best = f"{e['p_best']:.2f}" if e["p_best"] is not None else "–"
            lines.append(f"| {e['recipe']} | {bits_cell(e)} | {e['bits_eff'] / 16:.3g} | {e['runs']} ({e['sizes']}) | {e['loss']:.4g} | {ci} | {at} | {p_best} |")
        lines += _corpora_lines(b.get("corpora") or {}) + _hosts_lines(b.get("hosts") or {})
        lines += _shape_effects_table(b, unit)
    interp = sum(e["interpolated"] for b in f["budgets"] for e in b["recipes"])
    if interp:
        lines += ["", f"{interp} of the points were interpolated between a run's WSD cooldown evaluations (log loss "
                  "linear in log D): these runs were not designed to land on the budgets."]
    return "\n".join(lines)


def _shape_effects_table(b: dict, unit: str) -> list[str]:
    """The shape effects shared by every recipe at one budget (analysis.isoflop's shape_effects), or none."""
    if not b.get("shape_effects"):
        return []
    share = f", {b['shape_share']:.0%} of the scatter about the parabolas" if b.get("shape_share") is not None else ""
    lines = ["", f"Shape effects shared by every recipe ({unit}: a shape's departure from a curve smooth in N common to "
             f"all recipes{share}); the minima above are compared with them removed:", "",
             "| shape | N | effect | recipes measured on it |", "| --- | --- | --- | --- |"]
    for e in sorted(b["shape_effects"], key=lambda e: e["N"]):
        lines.append(f"| {e['shape']} | {fmt(e['N'])} | {e['effect']:+.3f} | {len(e['recipes'])} |")
    return lines


def granularity_section(g: dict, unit: str) -> str:
    """The granularity sweep (findings.scheme_effects): each scheme against per-tensor current scaling."""
    lines = [f"Each scaling scheme against per-tensor, current scaling in the same format, final validation loss "
             f"paired by seed ({g['runs']} runs, {g['comparisons']} comparisons)."]
    if g["sigma"] is None:
        lines[0] += (" No scheme has two seeds, so there is no noise estimate and no difference can be told from "
                     "seed noise: every verdict is *cannot tell*.")
    else:
        own = [r["recipe"] for r in g["rows"] if r.get("own_noise")]
        apart = f" (apart from {', '.join(own)}, whose paired scatter is far above the rest's by an F test: each keeps its own)"
        lines[0] += (f" Scatter of the paired differences, pooled over the comparisons: {g['sigma']:.3f} {unit} on "
                     f"{g['dof']} dof{apart if own else ''}; intervals are simultaneous {g['level']:.0%} over all "
                     f"{g['comparisons']} comparisons (Bonferroni).")
        counts = {v: sum(r["verdict"] == v for r in g["rows"]) for v in ("lower", "higher", "cannot tell")}
        lines[0] += f" Lower than per tensor: {counts['lower']}; higher: {counts['higher']}; cannot tell: {counts['cannot tell']}."
    lines += ["", "| format | scheme | seeds | loss | per-tensor loss | difference | CI | verdict |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in sorted(g["rows"], key=lambda r: (r["format"], r["diff"])):
        ci = f"{r['ci'][0]:+.3f} to {r['ci'][1]:+.3f}" if r["ci"] else "–"
        if r.get("own_noise") and r["n"] <= 2:  # its own scatter from one degree of freedom: t's tail is the interval
            ci = f"cannot be estimated (its own scatter, {r['n'] - 1} dof)"
        lines.append(f"| {r['format']} | {r['recipe']} | {r['n']} | {r['loss']:.4g} | {r['loss_ref']:.4g} | "
                     f"{r['diff']:+.3f} | {ci} | {r['verdict']} |")
    lines += _not_ok_lines(g["not_ok"], "recipe")
    return "\n".join(lines)


def outliers_section(o: dict, unit: str) -> str:
    """The outlier sweep (findings.smooth_swiglu_effect): Smooth-SwiGLU on minus off."""
    if not o["n"]:
        text = f"{o['runs']} runs, but no pair with Smooth-SwiGLU on and off that both finished: nothing to compare."
    elif o["ci"] is None:
        text = (f"Smooth-SwiGLU on minus off, final validation loss: {o['diff']:+.3f} {unit} from one pair, "
                "with no noise estimate: cannot tell.")
    else:
        say = {"lower": "lower with Smooth-SwiGLU", "higher": "higher with Smooth-SwiGLU", "cannot tell": "cannot tell"}
        text = (f"Smooth-SwiGLU on minus off, final validation loss paired by recipe, learning rate and seed: "
                f"{o['diff']:+.3f} {unit} ({o['level']:.0%} CI {o['ci'][0]:+.3f} to {o['ci'][1]:+.3f}, n = {o['n']} "
                f"pairs): {say[o['verdict']]}.")
    lines = [text, "", "| recipe | learning rate | seed | loss, off | loss, on | on − off |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {p['recipe']} | {p['lr']:g} | {p['seed']} | {p['off']:.4g} | {p['on']:.4g} | {p['on'] - p['off']:+.3f} |"
              for p in o["pairs"]]
    return "\n".join(lines + _not_ok_lines(o["not_ok"], "Smooth-SwiGLU"))


def _not_ok_lines(not_ok: dict, what: str) -> list[str]:
    if not not_ok:
        return ["", "Every run finished ok."]
    return ["", "Runs that did not finish ok (not compared): " + "; ".join(
        f"{what} {k}: " + ", ".join(f"{n} {s}" for s, n in v.items()) for k, v in not_ok.items()) + "."]


def _range_text(r: Sequence[int]) -> str:
    return f"{r[0]}" if r[0] == r[1] else f"{r[0]}-{r[1]}"


def _corpora_lines(corpora: dict[str, dict[str, int]]) -> list[str]:
    """Where a budget's runs trained on more than one corpus: which recipe on which, since a comparison
    of runs on different data is not like with like (the data's effect is confounded with the recipe's)."""
    if len(corpora) < 2:
        return []
    names = list(corpora)
    return ["", f"Not one corpus: these runs trained on {len(names)} ({', '.join(f'{c}: {sum(corpora[c].values())} runs' for c in names)}). "
                "A corpus is what the training installation holds (`pysrc`: its venv's packages and checkout path), "
                "so a comparison of recipes whose runs trained on different corpora is not like with like: every "
                "verdict above between such recipes confounds the data with the precision.", ""] + _mix_table(corpora)


def _hosts_lines(hosts: dict[str, dict[str, int]]) -> list[str]:
    """Where a budget's runs trained on more than one kind of machine: which recipe on which."""
    if len(hosts) < 2:
        return []
    names = list(hosts)
    return ["", f"Not one host: these runs trained on {len(names)} kinds of machine "
                f"({', '.join(f'{h}: {sum(hosts[h].values())} runs' for h in names)}). One config trained on two kinds "
                "gives two runs whose losses differ (the GEMM paths round differently and training "
                "carries it on), so a recipe compared with another across hosts is compared through that difference "
                "too.", ""] + _mix_table(hosts)


def _mix_table(mix: dict[str, dict[str, int]]) -> list[str]:
    """Runs per recipe (rows) and corpus or host (columns)."""
    names, recipes = list(mix), sorted({r for per in mix.values() for r in per})
    lines = ["| recipe | " + " | ".join(f"runs on {c}" for c in names) + " |", "| --- |" + " --- |" * len(names)]
    return lines + [f"| {r} | " + " | ".join(str(mix[c].get(r, 0)) for c in names) + " |" for r in recipes]


def verdict_sentence(b: dict, unit: str) -> str:
    if b["winner"]:
        w = next(e for e in b["recipes"] if e["recipe"] == b["winner"])
        return (f"{b['winner']} has the lowest IsoFLOP minimum, {b['diff']:.3f} {unit} below {b['runner_up']} "
                f"(95% CI of the difference {b['diff_ci'][0]:.3f}–{b['diff_ci'][1]:.3f}; {w['runs']} runs; "
                f"P(best) = {w['p_best']:.2f}).{_noise_text(b, unit)}")
    reason = b["reason"][0].upper() + b["reason"][1:]
    return f"No winner. {reason}.{_noise_text(b, unit)}"


def _noise_text(b: dict, unit: str) -> str:
    """The noise the bootstrap drew from, and how much of it seeds alone explain."""
    if not b["sigma"]:
        return ""
    seeds = "; no seed replicates"
    if b.get("seed_sigma"):
        seeds = f"; seed replicates alone: {b['seed_sigma']:.3f} on {b['seed_dof']} dof"
        if b["sigma"] > 1.2 * b["seed_sigma"]:
            seeds += ", the excess is the parabolas' lack of fit"
    source = ("the scatter about the joint fit of every recipe's parabola and the shape effects, seed replicates "
              "included" if b.get("noise_source", "joint fit") == "joint fit" else "seed replicates alone: the profiles leave no dof")
    return f" Noise about the profiles {b['sigma']:.3f} {unit} on {b['dof']} dof ({source}{seeds})."


def pstar_section(f: dict) -> str:
    """P* per budget: the chosen law's value, its bootstrap CI, the specification range, the verdicts."""
    if not f["P_star"]:
        return "No precision-aware law was fitted, so there is no P*."
    law = f["law"]["name"]
    lines = []
    for e in f["P_star"]:
        if "error" in e and e.get("no_bits_axis"):
            lines.append(f"- C = {fmt(e['compute'])}: no P*: {e['error']}.")
            continue
        if "error" in e:
            lines.append(f"- C = {fmt(e['compute'])}: no optimum ({e['error']}).")
            continue
        if e.get("no_bits_axis"):
            form = laws.get(law)
            by = "fitted efficiency" if form.per_recipe else "quantisation errors"
            text = (f"- C = {fmt(e['compute'])}: the chosen `{law}` law prices precision by "
                    + ("a fitted efficiency per recipe" if form.per_recipe else "measured quantisation error")
                    + ", not bits, so it has no continuous P*")
            ranked = e.get("recipes") or []
            if ranked:
                top = ranked[0]
                share = f", best in {top['p_best']:.0%} of bootstrap resamples" if top.get("p_best") is not None else ""
                ci = (f"; the best recipe's effective bits over the resamples span {top['bits_ci'][0]:.3g}–"
                      f"{top['bits_ci'][1]:.3g}" if top.get("bits_ci") and top["bits_ci"][0] != top["bits_ci"][1] else "")
                text += (f". Read at each measured recipe's own {by}, it prefers {top['recipe']} "
                         f"({top['bits']:.3g} effective bits{share}; N = {fmt(top['N'])}, D = {fmt(top['D'])}), then "
                         + ", ".join(f"{r['recipe']} (+{r['loss'] - top['loss']:.3g} nats)" for r in ranked[1:4]) + ci)
            text += _measured_text(e, ranked[0]["recipe"] if ranked else None)
            lines.append(text + ". " + _menu_text(e, law) + ".")
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


def profile_text(p: dict) -> str:
    """The P* profile (scaling.study.profile.precision_profile) as a table: each format's loss at its
    compute-optimal N with its CI, and each difference to the next format with its family-wise CI; a
    difference below the law's error (profile.judge_within_error: the largest it measured) is said to be
    within it, whatever its bootstrap CI."""
    error = p.get("law_error")
    pairs = {q["from"]: q for q in p.get("pairs", [])}
    lines = [f"**C = {fmt(p['compute'])}**, the `{p['law']}` law under the {p['cost_model']} cost model: its loss at each "
             f"format chips run, at that format's compute-optimal N ({p['level']:.0%} bootstrap CIs over "
             f"{p['resamples']} resamples; each difference is the next format's loss minus this one's, paired over "
             f"the same resamples, family-wise over the {len(pairs)} neighbour pairs)"
             + (f"; a difference below the law's error ({error:.2%} of the loss, the largest it measured: see "
                "Limitations) is within its error, whatever the bootstrap says" if error else "") + ". Untrained: no fitted run had that format.", "",
             "| format | chips | bits per element | N | loss | 95% CI | P(best) | trained | next minus this | family-wise CI | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in p["rows"]:
        q = pairs.get(r["name"])
        diff = ci = verdict = "–"
        if q:
            diff = f"{q['diff']:+.4f}"
            ci = f"{q['ci'][0]:+.4f} to {q['ci'][1]:+.4f}" if q.get("ci") else "– (no resamples)"
            verdict = "within the law's error" if q.get("within_law_error") else q["verdict"]
        lo, hi = r["loss_ci"] if r.get("loss_ci") else (None, None)
        lines.append(f"| {r['name']} | {r.get('chips') or '–'} | {r['bits_per_element']:.3g} | {fmt(r['N'])} | "
                     f"{r['loss']:.4f} | {'–' if lo is None else f'{lo:.4f} to {hi:.4f}'} | "
                     f"{'–' if r.get('p_best') is None else format(r['p_best'], '.2f')} | "
                     f"{'no' if r.get('untrained') else 'yes'} | {diff} | {ci} | {verdict} |")
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
        if r.get("best") or (r.get("p_best") or 0) > 0:
            named[r["recipe"]] = float(r["bits"])
    for m in e.get("measured") or []:
        named.setdefault(m["recipe"], float(m["bits"]))
    if not named:
        return "No measured recipe can be named best"
    menu = sorted(named.items(), key=lambda kv: kv[1])
    listed = ", ".join(f"{r} ({b:.3g} bits)" for r, b in menu)
    text = (f"The best measured recipe{'s' if len(menu) > 1 else ''} (the law's choice in any bootstrap resample and "
            f"those the measurement cannot rule out): {listed}; a choice among measured recipes, not an interval of P*")
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


def _optima_ratio_text(budgets: Sequence[dict]) -> str:
    """Where the IsoFLOP minima inside their sizes sit in tokens per parameter, per budget ('' if none)."""
    spans = []
    for b in budgets:
        ratios = [e["D_opt"] / e["N_opt"] for e in b["recipes"] if e.get("D_opt") and e.get("inside")]
        if ratios:
            spans.append(f"{min(ratios):.3g}–{max(ratios):.3g} tokens per parameter at C = {fmt(b['budget'])}")
    return f" The measured IsoFLOP optima (inside their sizes) sit at {'; '.join(spans)}." if spans else ""


def limitations(ok: pd.DataFrame, fit: Any | None, found: list[dict], heldout: float | None,
                budgets: Sequence[dict] = (), prediction: dict | None = None) -> str:
    """A paragraph written from the data's spans: what the measurements can and cannot support.
    budgets: the IsoFLOP analyses (findings.findings' "budgets"), for how well a parabola in N fits them.
    prediction: the registered prediction's facts (report.prediction_facts), whose miss at its budget is
    the law's extrapolation error in compute, stated beside the held-out sizes' error."""
    sentences = []
    n_sizes, n_max = ok["N"].nunique(), ok["N"].max()
    sentences.append(f"Our {n_sizes} model size{'s' if n_sizes != 1 else ''} reach at most {fmt(n_max)} non-embedding "
                     f"parameters and {fmt(ok['D'].max())} tokens, several orders of magnitude below the "
                     "billion-parameter models the published laws describe; every statement beyond that is the law's "
                     "extrapolation, not a measurement.")
    ratio = (ok["D"] / ok["N"]).median()
    if not math.isnan(ratio):
        side = "below" if ratio < CHINCHILLA_TOKENS_PER_PARAM / 2 else "above" if ratio > 2 * CHINCHILLA_TOKENS_PER_PARAM else "near"
        sentences.append(f"The median tokens-per-parameter ratio is {ratio:.3g}, {side} Chinchilla's compute-optimal "
                         f"≈{CHINCHILLA_TOKENS_PER_PARAM:g}; Kumar et al. find the cost of low precision grows with D/N, so "
                         "the sweet spot depends on where the runs sit on this axis." + _optima_ratio_text(budgets))
    last = ok[ok["D"] == ok["D"].max()]
    biggest = last[last["N"] == last["N"].max()].groupby("recipe")["val_loss"].mean()
    best = last.groupby(["recipe", "N"])["val_loss"].mean().groupby("recipe").min()
    worse = [p for p in biggest.index if ok["N"].nunique() > 1 and biggest[p] > best[p] + 1e-9]
    if worse:
        sentences.append(f"At the largest token budget the largest model ({fmt(last['N'].max())}) is worse than a smaller "
                         f"one at {len(worse)} of {len(biggest)} precisions: at these few tokens per parameter (and one "
                         "learning rate for every width) more parameters do not buy lower loss, the regime where "
                         "low precision's gain, a larger model for the same compute, is worth least.")
    rough = [b for b in budgets if b.get("sigma") and b.get("seed_sigma") and b["sigma"] > 1.2 * b["seed_sigma"]]
    if rough:
        where = ", ".join(f"{fmt(b['budget'])} ({b['sigma'] / b['seed_sigma']:.2g}x)" for b in rough)
        sentences.append(f"At C = {where} the IsoFLOP profiles scatter about their parabolas more than seeds do: "
                         "at fixed compute the loss depends on a model's shape (width against depth), not on N "
                         "alone, and that lack of fit is part of every CI above.")
    shaped = [b for b in budgets if (b.get("shape_share") or 0) >= 0.2]
    if shaped:
        where = ", ".join(f"{fmt(b['budget'])} ({b['shape_share']:.0%})" for b in shaped)
        sentences.append(f"A model's shape, not N alone, moves its loss: shape effects shared by every recipe explain "
                         f"part of the scatter about the IsoFLOP profiles at C = {where}; recipes measured on different "
                         "shapes are compared with those effects removed, and a minimum at the edge of a recipe's "
                         "shapes names no winner.")
    bits = sorted(ok["P"].dropna().unique())
    sentences.append(f"{len(bits)} distinct precision{'s' if len(bits) != 1 else ''} were measured "
                     f"({', '.join(f'{b:g}' for b in bits)} bits)" + (
                         "; with fewer than three, the precision term of the law is barely constrained." if len(bits) < 3 else "."))
    if fit is not None:
        k = len([p for p in fit.params if p not in (getattr(fit, "fixed", None) or {})])
        sentences.append(f"The law has {k} free parameters fitted to {len(ok)} points ({len(ok) / max(k, 1):.3g} points per parameter).")
        outside = [f for f in found if not bits or f["P"] < min(bits) or f["P"] > max(bits)]
        if outside:
            sentences.append(f"At {len(outside)} of {len(found)} budgets the optimum lies outside the measured precisions, "
                             "so it is an extrapolation in P.")
        wide = [f for f in found if f["ci"] and f["ci"][1] - f["ci"][0] > 2.0]
        if wide:
            sentences.append(f"The bootstrap CI of P* is wider than 2 bits at {len(wide)} of {len(found)} budgets: "
                             "the data do not pin the sweet spot down to one format.")
        floor = float(fit.params.get("E", math.inf))
        if floor < 1e-3:
            sentences.append(f"The irreducible loss E went to ≈0 ({floor:.2g}): the runs are far from the loss plateau, "
                             "so E, and with it the law's trade-off between size and tokens away from the data, is "
                             "not identified.")
        errors = law_errors(heldout, prediction)
        if errors:
            largest = max(e for e, _ in errors)
            sentences.append("The law's extrapolation errors are " + " and ".join(f"{e:.2%} of the loss {where}" for e, where in errors)
                             + f"; a difference between precisions that the law puts below {largest:.2%} is within its error.")
    sentences.append("Low precision is simulated (fake quantisation with FP32 accumulation) on CPU, so the results say "
                     "what the number formats do to learning, not how fast real low-precision hardware runs.")
    return " ".join(sentences)


def law_errors(heldout: float | None, prediction: dict | None) -> list[tuple[float, str]]:
    """The law's measured extrapolation errors as (fraction of the loss, where): the held-out largest
    sizes' and the registered prediction's miss at its budget. A difference the law puts below the
    largest of them is within its error (Limitations, the P* profile)."""
    errors = [(heldout, "on the largest sizes held out")] if heldout is not None else []
    miss = budget_miss(prediction)
    if miss is not None:
        errors.append((miss, f"on the budget predicted before it was trained (C = {fmt(prediction['budget'])})"))
    return errors


def budget_miss(prediction: dict | None) -> float | None:
    """The registered prediction's mean |measured - predicted| minimum as a fraction of the measured
    loss, over the recipes scored at its budget; None without a score."""
    scored = [r for r in ((prediction or {}).get("score") or {}).get("recipes", []) if r.get("measured") is not None]
    if not scored:
        return None
    return float(np.mean([abs(r["error"]) / r["measured"] for r in scored]))


def corpus_of(results: pd.DataFrame) -> str | None:
    for column in ("corpus", "corpus_source", "data_source"):
        if column in results.columns and results[column].notna().any():
            runs = results.drop_duplicates("run_id")[column].dropna().astype(str).value_counts()
            if len(runs) == 1:
                return runs.index[0]
            if "sweep" not in results.columns:
                return ", ".join(f"{c} ({n} runs)" for c, n in runs.items()) + " (not one corpus: see the findings)"
            each = results.drop_duplicates("run_id")
            by = each.groupby(column)["sweep"].agg(lambda s: ", ".join(sorted(set(s.astype(str)))))
            mixed = each.groupby("sweep")[column].nunique().gt(1).any()
            return (", ".join(f"{c} ({n} runs: {by[c]})" for c, n in runs.items())
                    + (" (a sweep on more than one corpus: see the findings)" if mixed else "; each sweep on one corpus"))
    return None


def _host_shift_text(p: dict) -> str:
    s = findings_lib.host_shift_between(p)
    if s is None:
        return "these runs do not measure how large it is"
    return (f"{s['runs']} runs ({', '.join(s['recipes'])}) trained again on the other kind, same configs and seeds, "
            f"measure it: {s['hosts'][0]} minus {s['hosts'][1]}, {s['mean']:+.4f} nats/byte on average over runs "
            f"(95% CI {s['ci'][0]:+.4f} to {s['ci'][1]:+.4f}, t over runs), {s['rms']:.4f} RMS over its "
            f"{s['points']} points")


def backtests_section(f: dict) -> str:
    """The calibrated predictor scored on a study's own budgets (scaling.study.calibrate.backtest_all, as
    `scaling predict --backtest` writes it): per pair of budgets the law's error, the old and the calibrated
    intervals' coverage and width on levels and on gaps, and how often each ranked the measured best first."""
    b = f["backtests"]
    level = f"{b['level']:.0%}"

    def rows_text(q: dict) -> str:
        return "–" if not q.get("n") else f"{q['inside']}/{q['n']} ({q['mean_width']:.3f})"

    def gaps_text(q: dict) -> str:
        return "–" if not q.get("gap_n") or q.get("gap_mean_width") is None else f"{q['gap_inside']}/{q['gap_n']} ({q['gap_mean_width']:.3f})"

    def rank_text(q: dict) -> str:
        return "–" if q.get("rank_hit") is None else f"{q['rank_hit']:.0%} (called {q['rank_called_right']}/{q['rank_called']})"

    lines = [f"Every pair of the study's budgets: the `{b['law']}` law fitted on the runs up to the lower one "
             f"({b['bootstrap']} bootstrap resamples) predicts every run at the higher one (measured − predicted, in "
             f"nats; a run with a row at the higher budget is left out of the fit). The old interval is the registered "
             "prediction's method: the law's resamples plus an in-sample lack of fit drawn per recipe. The calibrated "
             "one adds a zero-mean shift shared by every recipe, scaled by the misses of the backtests inside the pair's "
             "own fitted budgets (a t with as many dof as backtests), per-recipe and row terms from the same backtests, "
             "and each recipe's in-sample misfit carried forward as far as the backtests show it persists; so no pair is "
             f"scored on data its fit or its calibration has seen. Gaps are to {b['reference']} at matched (N, D, seed); "
             f"ranks: at each matched point, whether the recipe the draws most often put best was the measured best, and "
             f"how many points one recipe was called best with P ≥ 0.975 (right/called). {level} intervals; "
             "inside/n (mean width).", "",
             "| fitted on | predicted | rows | law: mean error (MAE) | shared part | old: rows | calibrated: rows | "
             "old: gaps | calibrated: gaps | old: best first | calibrated: best first |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    unavailable = []
    for p in b["pairs"]:
        old, cal = p["old"], p["calibrated"]
        if not cal.get("available"):
            unavailable.append((p, cal.get("reason")))
        lines.append(f"| {fmt(p['fit_budget'])} | {fmt(p['target_budget'])} | {p['n']} | {p['mean_error']:+.3f} "
                     f"({p['mean_abs_error']:.3f}) | {p['shared']:+.3f} | {rows_text(old)} | "
                     f"{rows_text(cal) if cal.get('available') else 'cannot be estimated'} | {gaps_text(old)} | "
                     f"{gaps_text(cal) if cal.get('available') else '–'} | {rank_text(old)} | "
                     f"{rank_text(cal) if cal.get('available') else '–'} |")
    notes = []
    if unavailable:
        which = ", ".join(f"{fmt(p['fit_budget'])} → {fmt(p['target_budget'])}" for p, _ in unavailable)
        notes.append(f"Calibrated intervals cannot be estimated for {which}: {unavailable[0][1]}.")
    scored = [p for p in b["pairs"] if p["calibrated"].get("available")]
    for p in scored:
        cal, old = p["calibrated"], p["old"]
        k = cal["calibration"]["k"]
        notes.append(f"Fitted on {fmt(p['fit_budget'])} and predicting {fmt(p['target_budget'])}, calibrated on {k} "
                     f"backtest{'s' if k != 1 else ''} inside: the calibrated intervals hold {cal['inside']} of {cal['n']} rows "
                     f"against the old {old['inside']}, at {cal['mean_width'] / old['mean_width']:.1f}x the old width"
                     + (" (the shared shift's scale rests on one backtest, a t with 1 dof: honest, and wide)" if k == 1 else "")
                     + (f"; gaps {cal['gap_inside']} of {cal['gap_n']} at {cal['gap_mean_width'] / old['gap_mean_width']:.2f}x "
                        f"the old gap width, where the shared shift cancels" if cal.get("gap_mean_width") and old.get("gap_mean_width") else "")
                     + ".")
    registered = (f.get("prediction") or {}).get("budget")
    if registered and any(math.isclose(p["target_budget"], registered, rel_tol=1e-9) for p in scored):
        notes.append(f"C = {fmt(registered)} is the budget predicted before it was trained: the registered prediction "
                     "above stays as it was made, and this row scores the calibrated method on it post hoc (its runs "
                     "existed when it was computed).")
    notes.append("A fourth budget would give the top pair two backtests inside and narrow its level intervals; only "
                 "new runs can show whether the calibrated coverage holds there.")
    return "\n\n".join(["\n".join(lines)] + notes)


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
    if not score:
        lines += ["| recipe | predicted minimum | 95% PI | at N (95% PI) | P(best) |", "| --- | --- | --- | --- | --- |"]
        for e in sorted(p["recipes"], key=lambda e: e["loss"]):
            lines.append(f"| {e['recipe']} | {e['loss']:.4g} | {e['loss_pi'][0]:.4g}–{e['loss_pi'][1]:.4g} | "
                         f"{fmt(e['N_opt'])} ({fmt(e['N_pi'][0])}–{fmt(e['N_pi'][1])}) | {e['p_best']:.2f} |")
        lines += ["", f"Predicted: {p['reason']}. Not measured yet: the results hold none of this budget's runs "
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
    return "\n".join(lines)


def prediction_sections(facts: dict) -> list[str]:
    """The held-out budget's registered prediction and, where one was made, its post-hoc re-prediction."""
    out = []
    if facts.get("prediction"):
        out += ["## A budget predicted before it was trained", "", prediction_section(facts["prediction"], facts["loss_unit"]), ""]
    if facts.get("prediction_posthoc"):
        out += ["### The same budget predicted again, post hoc", "",
                prediction_section(facts["prediction_posthoc"], facts["loss_unit"], posthoc=True), ""]
    return out
