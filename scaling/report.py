"""REPORT.md: what was run, the fitted law, the measured sweet spot, how it compares, and its limits.

Every sentence that states a finding is computed from the numbers passed in: the comparison with
the published sweet spots (Kumar et al. 2024: compute-optimal precision 7-8 bits; Sun et al. 2025:
4-8 bits) is `compare_with_range(P*, CI, range)`, and the limitations paragraph is written from
the data's own spans (sizes, tokens, points per parameter, precisions measured). Figures are
made by `scaling.plots.make_figures` into the same directory and embedded by relative path;
figures whose inputs are absent are listed with the reason. The file is written atomically.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from scaling import plots
from scaling._io import atomic_write_text

# Chinchilla's compute-optimal ratio (Hoffmann et al. 2022), for the limitations paragraph.
CHINCHILLA_TOKENS_PER_PARAM = 20.0


# ---------------------------------------------------------------------------------------------
# Sentences computed from numbers
# ---------------------------------------------------------------------------------------------


def position(value: float, lo: float, hi: float) -> str:
    """'below', 'inside' or 'above' the closed interval [lo, hi]."""
    return "below" if value < lo else "above" if value > hi else "inside"


def compare_with_range(p_star: float, ci: tuple[float, float] | None, name: str, lo: float, hi: float) -> str:
    """One sentence placing our optimal precision (and its CI, if any) against a published range."""
    where = position(p_star, lo, hi)
    sentence = f"P* = {p_star:.3g} bits is {where} the {lo:g}–{hi:g} bit range of {name}"
    if ci is None:
        return sentence + " (no bootstrap CI, so the uncertainty is not quantified)."
    a, b = ci
    ci_text = f"95% CI {a:.3g}–{b:.3g} bits"
    if b < lo or a > hi:
        return sentence + f", and so is its whole {ci_text}: the data disagree with that range."
    if a >= lo and b <= hi:
        return sentence + f", and its whole {ci_text} lies inside it: the data agree with that range."
    if where == "inside":
        return sentence + f"; its {ci_text} extends beyond it, so the data are consistent with but do not pin down that range."
    return sentence + f", but its {ci_text} overlaps it, so the disagreement is not significant."


def _fmt(x: Any) -> str:
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
    return _fmt(lo) if lo == hi else f"{_fmt(lo)}–{_fmt(hi)}"


def _markdown(table: pd.DataFrame) -> str:
    header = "| " + " | ".join(map(str, table.columns)) + " |"
    rule = "| " + " | ".join("---" for _ in table.columns) + " |"
    rows = ["| " + " | ".join(v if isinstance(v, str) else _fmt(v) for v in row) + " |"
            for row in table.itertuples(index=False)]
    return "\n".join([header, rule, *rows])


# ---------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------


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
        f"- Seeds: {ok['seed'].nunique() if 'seed' in ok.columns else '–'}.",
        f"- Corpus: {corpus or 'not recorded in the results table'}.",
    ]
    return "\n".join(lines)


def _sweeps(all_rows: pd.DataFrame, ok: pd.DataFrame) -> str:
    """Each sweep with its run count and what it feeds (plots.study_part: the main study is fitted)."""
    if "sweep" not in all_rows.columns:
        return "–"
    sweeps = all_rows.drop_duplicates("run_id")["sweep"].astype(str)
    runs = sweeps.value_counts()
    family = dict(zip(sweeps, plots.sweep_family(sweeps)))
    role = {name: f"figure {plots.PURPOSE_SWEEPS[family[name]]}" for name in runs.index if family[name] in plots.PURPOSE_SWEEPS}
    role["isocompute"] = "figure 1 and the direct test: each precision at its cost-model size, same tokens"
    role["isocompute_law"] = "figure 1 and the direct test: each precision at the law's optimal N, D"
    main = sorted(name for name in runs.index if family[name] not in plots.PURPOSE_SWEEPS)
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
    text = [f"Law: `{fit.law}`, fitted by Huber loss on log-loss residuals (objective {_fmt(getattr(fit, 'objective', None))}); "
            f"CIs from {n_samples} bootstrap resamples (unit: {(getattr(fit, 'bootstrap', None) or {}).get('unit', 'run')})." if n_samples else
            f"Law: `{fit.law}` (objective {_fmt(getattr(fit, 'objective', None))}); no bootstrap samples stored with the fit.",
            "", _markdown(pd.DataFrame(rows))]
    return "\n".join(text)


def heldout_error(fit: Any, ok: pd.DataFrame) -> tuple[str, float | None]:
    """In-sample error of the law and, when the fit ran one (`scaling fit --holdout`), its held-out
    extrapolation error: fit on the smaller runs, mean absolute relative error on the largest."""
    rel = np.abs(np.asarray(fit.predict(ok), float) / ok["val_loss"].to_numpy(float) - 1)
    text = f"Mean absolute relative error of the fitted law on its {len(ok)} points: {rel.mean():.2%}."
    heldout = getattr(fit, "heldout", None) or {}
    if heldout.get("mare") is None:
        return text + " The fit records no held-out test (`scaling fit --holdout N`), so this is in-sample only.", None
    by = "N" if heldout.get("by", "N") == "N" else "compute 6·N·D"
    text += (f" Held-out extrapolation: fitted on the {heldout.get('n_train', '?')} points with {by} below "
             f"{_fmt(heldout.get('threshold'))}, the law predicts the other {heldout.get('n_test', '?')} "
             f"with a mean absolute relative error of {float(heldout['mare']):.2%}.")
    return text, float(heldout["mare"])


def precision_gaps(ok: pd.DataFrame) -> pd.DataFrame:
    """Loss minus the FP32 run's at the same size, tokens and seed, for every other precision:
    columns precision, N, D, gap (nats/token). Empty without FP32 runs to pair with."""
    labelled = plots.with_precision(ok)
    keys = ["N", "D"] + (["seed"] if "seed" in ok.columns else [])
    base = labelled[labelled["precision"] == "FP32"].groupby(keys)["val_loss"].mean().rename("fp32")
    others = labelled[labelled["precision"] != "FP32"].join(base, on=keys, how="inner")
    return others.assign(gap=others["val_loss"] - others["fp32"])[["precision", "N", "D", "gap"]].reset_index(drop=True)


def cost_of_precision(ok: pd.DataFrame, fit: Any) -> str:
    """How much each precision loses to FP32 at each token budget (mean over sizes), and whether the
    lowest precision's loss grows with tokens per parameter: the kumar form (precision lowers the
    effective N only) predicts a gap that does not depend on D."""
    gaps = precision_gaps(ok)
    if gaps.empty:
        return ""
    table = gaps.groupby(["precision", "D"])["gap"].mean().unstack("D")
    table = table.loc[plots.precision_order(table.index)]
    rows = [{"precision": name, **{f"D = {_fmt(d)}": f"{v:+.3f}" for d, v in row.items() if not math.isnan(v)}}
            for name, row in table.iterrows()]
    text = ["Validation loss minus the FP32 run's at the same size, tokens and seed (nats/token), mean over "
            "model sizes:", "", _markdown(pd.DataFrame(rows))]
    lowest = table.index[-1]
    mine = gaps[gaps["precision"] == lowest]
    if mine.groupby("N")["D"].nunique().max() > 1:
        # least squares within each size (size fixed effects): how the gap moves with D at a fixed N
        centred = mine.assign(log_d=np.log2(mine["D"]))
        centred[["log_d", "gap"]] -= centred.groupby("N")[["log_d", "gap"]].transform("mean")
        slope = float((centred["log_d"] * centred["gap"]).sum() / (centred["log_d"] ** 2).sum())
        first, last = table.loc[lowest].dropna().iloc[[0, -1]]
        text += ["", f"{lowest}'s gap goes from {first:+.3f} at the fewest tokens to {last:+.3f} at the most; at a fixed "
                 f"model size it {'grows' if slope > 0 else 'shrinks'} by {abs(slope):.3f} nats/token per doubling of "
                 "the tokens."]
        if fit is not None and fit.law == "kumar" and slope > 0:
            text[-1] += (" The kumar law lowers only the effective parameter count, so its gap does not change with D: "
                         "a gap that grows with D (as Kumar et al. found for post-training quantisation) means the law "
                         "understates low precision's cost for long training and overstates it for short, and the "
                         "sweet spot is likely to move to more bits at higher tokens per parameter than ours.")
    return "\n".join(text)


def sweet_spot(fit: Any, ok: pd.DataFrame, computes: Sequence[float]) -> tuple[str, list[dict]]:
    """Per budget: the law's optimum with its bootstrap CI, the per-precision table and the measured runs."""
    found, parts = [], []
    for compute in computes:
        best = plots.optimum(fit, compute)
        ci = plots.optimal_p_interval(fit, compute)
        found.append({"compute": compute, "P": float(best["P"]), "ci": ci, "N": best["N"], "D": best["D"], "loss": best["loss"]})
        ci_text = f" (95% bootstrap CI {ci[0]:.3g}–{ci[1]:.3g} bits)" if ci else " (no bootstrap CI)"
        parts.append(f"### C = {_fmt(compute)} FLOPs (16-bit units)\n\n"
                     f"Compute-optimal precision **P* = {best['P']:.3g} bits**{ci_text}, at N = {_fmt(best['N'])}, "
                     f"D = {_fmt(best['D'])}, predicted loss {best['loss']:.4g}.")
        sizes = plots.fitted_sizes(fit)
        if sizes and sizes[0] < sizes[1] and not sizes[0] <= best["N"] <= sizes[1]:
            inside = plots.optimum(fit, compute, n_range=sizes)
            found[-1]["P_within_sizes"] = float(inside["P"])
            parts.append(extrapolation_check(best, inside, sizes))
        parts.append("")
        table = plots.loss_vs_precision(fit, compute, sorted(plots.NAMED_BITS.values(), reverse=True))
        table = table.sort_values("P", ascending=False)
        measured = plots.measured_at(ok, compute, fit)
        best_runs = plots.best_measured(measured)
        if best_runs["precision"].nunique() > 1:
            found[-1]["measured_best"] = best_runs.loc[best_runs["loss"].idxmin()].to_dict()
            found[-1]["measured"] = best_runs
        rows = []
        for point in table.to_dict("records"):
            mine = best_runs[best_runs["P"] == point["P"]]
            rows.append({"P (bits)": f"{point['P']:g}", "N* (params)": point["N"], "D* (tokens)": point["D"],
                         "law loss at N*, D*": point["loss"], "best measured loss": _measured_cell(mine),
                         "law loss at that run's N, D": mine["law"].iloc[0] if len(mine) else None})
        parts.append(_markdown(pd.DataFrame(rows)))
        if best_runs["precision"].nunique() == 1:
            parts.append(f"\nDirect test: only {best_runs['precision'].iloc[0]} was measured within "
                         f"×{plots.COMPUTE_MATCH_FACTOR:g} of this budget, so there is nothing to compare.")
        elif not measured.empty:
            law_winner = plots.precision_label(table.loc[table["loss"].idxmin(), "P"])
            parts.append("\n" + direct_test(best_runs, law_winner, int(measured["n"].sum())))
        else:
            parts.append("\nDirect test: no measured runs within "
                         f"×{plots.COMPUTE_MATCH_FACTOR:g} of this budget (run experiments/isocompute.toml).")
        parts.append("")
    if len(found) > 1:
        ps = [f"{f['P']:.3g}" for f in found]
        parts.append(f"P* is {ps[0]} bits at {_all_budgets(len(found))}." if len(set(ps)) == 1 else
                     f"Across the {len(found)} budgets P* ranges {min(f['P'] for f in found):.3g}–"
                     f"{max(f['P'] for f in found):.3g} bits.")
        parts.append("")
    return "\n".join(parts), found


def extrapolation_check(best: dict, inside: dict, sizes: tuple[float, float]) -> str:
    """The law's optimum N lies outside the fitted sizes: say how far, and what the law picks inside them."""
    factor = max(sizes[0] / best["N"], best["N"] / sizes[1])
    verdict = ("the same precision, so P* does not hinge on the extrapolation" if abs(inside["P"] - best["P"]) < 0.5 else
               "a different precision: P* hinges on extrapolating the size term, and these data do not determine it")
    return (f"This N lies ×{factor:,.0f} outside the model sizes the law was fitted on ({_fmt(sizes[0])}–{_fmt(sizes[1])}). "
            f"Restricted to those sizes, the law's optimum is P = {inside['P']:.3g} bits (N = {_fmt(inside['N'])}, "
            f"D = {_fmt(inside['D'])}, predicted loss {inside['loss']:.4g}): {verdict}.")


def direct_test(best_runs: pd.DataFrame, law_winner: str, n_runs: int) -> str:
    """Whether the precision with the lowest measured loss at a budget is the law's best named precision,
    and whether the gap to the law's choice is larger than the seeds' spread (2 standard errors)."""
    winner = best_runs.loc[best_runs["loss"].idxmin()]
    text = (f"Direct test: among runs within ×{plots.COMPUTE_MATCH_FACTOR:g} of this budget ({n_runs} runs at "
            f"{best_runs['precision'].nunique()} precisions), the lowest measured loss is {winner['precision']} "
            f"({winner['loss']:.4g} at N = {_fmt(winner['N'])}); ")
    if winner["precision"] == law_winner:
        return text + f"this agrees with the law's best named precision ({law_winner})."
    text += f"this differs from the law's best named precision ({law_winner})"
    rival = best_runs[best_runs["precision"] == law_winner]
    if rival.empty:
        return text + ", which was not measured at this budget."
    rival = rival.iloc[0]
    gap = float(rival["loss"] - winner["loss"])
    if min(winner["n"], rival["n"]) < 2:
        return text + f" by {gap:.3g} nats/token, with a single run on one side: no error bar to judge it by."
    se = math.sqrt(winner["sd"] ** 2 / winner["n"] + rival["sd"] ** 2 / rival["n"])
    judged = "more" if gap > 2 * se else "less"
    return text + f" by {gap:.3g} nats/token, {judged} than twice its standard error ({se:.2g})."


def _measured_cell(rows: pd.DataFrame) -> str:
    if rows.empty:
        return "–"
    r = rows.iloc[0]
    spread = f" ± {r['sd']:.2g}" if r["n"] > 1 else ""
    return f"{r['loss']:.4g}{spread} (N = {_fmt(r['N'])}, {int(r['n'])} run{'s' if r['n'] > 1 else ''})"


def summary(found: list[dict], law: str) -> str:
    """The findings in a few sentences: the law's sweet spot and its CI, what the direct test measured
    at each budget (winner, runner-up, whether the gap exceeds the seeds' spread), and both against
    the published ranges."""
    if not found:
        return "No compute budget to report at, so no sweet spot."
    stars = {round(f["P"], 2) for f in found}
    f0 = found[0]
    ci = f" (95% bootstrap CI {f0['ci'][0]:.3g}–{f0['ci'][1]:.3g} bits)" if f0["ci"] else " (no bootstrap CI)"
    if len(stars) == 1:
        where = f", the same at {_all_budgets(len(found))}" if len(found) > 1 else f" at C = {_fmt(f0['compute'])}"
        lines = [f"- **The fitted `{law}` law puts the compute-optimal precision at P* = {f0['P']:.3g} bits**{ci}"
                 f"{where}."]
    else:
        lines = [f"- The fitted `{law}` law's compute-optimal precision ranges "
                 f"{min(f['P'] for f in found):.3g}–{max(f['P'] for f in found):.3g} bits across the {len(found)} budgets."]
    inside = [f for f in found if f.get("P_within_sizes") is not None and abs(f["P_within_sizes"] - f["P"]) >= 0.5]
    if inside:
        lines.append(f"- At {len(inside)} of {len(found)} budgets that optimum needs a model size outside the fitted "
                     "ones, and restricted to the fitted sizes the law picks another precision: the sweet spot rests on "
                     "extrapolating N.")
    for f in found:
        runs = f.get("measured")
        if runs is None:
            continue
        ranked = runs.sort_values("loss").reset_index(drop=True)
        first, second = ranked.iloc[0], ranked.iloc[1]
        text = (f"- **Measured directly at C = {_fmt(f['compute'])}** (each precision at its best measured size for "
                f"that budget): {first['precision']} has the lowest loss, {_mean_sd(first)}, ahead of "
                f"{second['precision']}, {_mean_sd(second)}")
        gap = float(second["loss"] - first["loss"])
        if min(first["n"], second["n"]) >= 2:
            se = math.sqrt(first["sd"] ** 2 / first["n"] + second["sd"] ** 2 / second["n"])
            text += (f": a gap of {gap:.3g} nats/token, {'more' if gap > 2 * se else 'less'} than twice its standard "
                     f"error ({se:.2g}).")
        else:
            text += f": a gap of {gap:.3g} nats/token with a single run on one side, so no error bar to judge it by."
        order = " < ".join(f"{r['precision']} {r['loss']:.4g}" for _, r in ranked.iterrows())
        lines.append(text + f" All: {order}.")
    if inside:
        evidence = ("; the direct measurements above are the evidence (see the comparison below)"
                    if any(f.get("measured") is not None for f in found) else
                    ", and no run was measured at these budgets (the full preset's iso-compute sweep measures them)")
        lines.append("- Against the published sweet spots: the law's P* rests on extrapolating N, so it neither confirms "
                     f"nor contradicts them{evidence}.")
    else:
        lines.append("- Against the published sweet spots: " + " ".join(
            compare_with_range(f0["P"], f0["ci"], name, lo, hi) for name, (lo, hi) in plots.PUBLISHED.items()))
    return "\n".join(lines)


def _mean_sd(row: pd.Series) -> str:
    return f"{row['loss']:.4g} ± {row['sd']:.2g} ({int(row['n'])} runs)" if row["n"] > 1 else f"{row['loss']:.4g} (1 run)"


def comparison(found: list[dict]) -> str:
    """The law's P* and each budget's measured winner against the published ranges; a sentence that
    holds at several budgets is written once, naming them."""
    sentences: dict[str, list[str]] = {}
    for f in found:
        at = _fmt(f["compute"])
        for name, (lo, hi) in plots.PUBLISHED.items():
            inside = f.get("P_within_sizes")
            if inside is not None and abs(inside - f["P"]) >= 0.5:
                text = (f"the law's P* = {f['P']:.3g} bits is {position(f['P'], lo, hi)} the {lo:g}–{hi:g} bit "
                        f"range of {name}, but restricted to the fitted model sizes it is {inside:.3g} bits, "
                        f"{position(inside, lo, hi)} it: the law's sweet spot rests on extrapolating N, so the fit "
                        "neither confirms nor contradicts that range.")
            else:
                text = "the law's " + compare_with_range(f["P"], f["ci"], name, lo, hi)
            sentences.setdefault(text, []).append(at)
        measured = f.get("measured_best")
        if measured is not None:
            n_runs = int(measured["n"])
            where = "; ".join(f"{position(measured['P'], lo, hi)} the {lo:g}–{hi:g} bits of {name}"
                              for name, (lo, hi) in plots.PUBLISHED.items())
            text = (f"measured directly, the lowest loss is {measured['precision']} ({measured['P']:g} bits, "
                    f"{n_runs} run{'s' if n_runs > 1 else ''}): {where}.")
            sentences.setdefault(text, []).append(at)
    return "\n".join(f"- At C = {', '.join(budgets)}: {text}" for text, budgets in sentences.items())


def limitations(ok: pd.DataFrame, fit: Any | None, found: list[dict], heldout: float | None) -> str:
    """A paragraph written from the data's spans: what the measurements can and cannot support."""
    sentences = []
    n_sizes, n_max = ok["N"].nunique(), ok["N"].max()
    sentences.append(f"Our {n_sizes} model size{'s' if n_sizes != 1 else ''} reach at most {_fmt(n_max)} non-embedding "
                     f"parameters and {_fmt(ok['D'].max())} tokens, several orders of magnitude below the "
                     "billion-parameter models the published laws describe; every statement beyond that is the law's "
                     "extrapolation, not a measurement.")
    ratio = (ok["D"] / ok["N"]).median()
    if not math.isnan(ratio):
        side = "below" if ratio < CHINCHILLA_TOKENS_PER_PARAM / 2 else "above" if ratio > 2 * CHINCHILLA_TOKENS_PER_PARAM else "near"
        sentences.append(f"The median tokens-per-parameter ratio is {ratio:.3g}, {side} Chinchilla's compute-optimal "
                         f"≈{CHINCHILLA_TOKENS_PER_PARAM:g}; Kumar et al. find the cost of low precision grows with D/N, so "
                         "the sweet spot depends on where the runs sit on this axis.")
    last = ok[ok["D"] == ok["D"].max()]
    biggest = last[last["N"] == last["N"].max()].groupby("recipe")["val_loss"].mean()
    best = last.groupby(["recipe", "N"])["val_loss"].mean().groupby("recipe").min()
    worse = [p for p in biggest.index if ok["N"].nunique() > 1 and biggest[p] > best[p] + 1e-9]
    if worse:
        sentences.append(f"At the largest token budget the largest model ({_fmt(last['N'].max())}) is worse than a smaller "
                         f"one at {len(worse)} of {len(biggest)} precisions: at these few tokens per parameter (and one "
                         "learning rate for every width) more parameters do not buy lower loss, the regime where "
                         "low precision's gain, a larger model for the same compute, is worth least.")
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
        if heldout is not None:
            sentences.append(f"The held-out (extrapolation) error is {heldout:.2%} of the loss; differences between "
                             "precisions smaller than that are within the law's error.")
    sentences.append("Low precision is simulated (fake quantisation with FP32 accumulation) on CPU, so the results say "
                     "what the number formats do to learning, not how fast real low-precision hardware runs.")
    return " ".join(sentences)


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------


def _corpus(results: pd.DataFrame) -> str | None:
    for column in ("corpus", "corpus_source", "data_source"):
        if column in results.columns and results[column].notna().any():
            return ", ".join(sorted(map(str, results[column].dropna().unique())))
    return None


def _all_budgets(n: int) -> str:
    return "both budgets" if n == 2 else f"all {n} budgets"


def _allocation_note(fit_result) -> str:
    """How the fitted exponents split compute between N and D (Chinchilla: N* ∝ C^(β/(α+β)))."""
    params = {} if fit_result is None else fit_result.params
    if not {"alpha", "beta"} <= set(params):
        return ""
    alpha, beta = params["alpha"], params["beta"]
    a = beta / (alpha + beta)
    return (f" With the fitted exponents (alpha = {alpha:.3g}, beta = {beta:.3g}) the optimal N grows as C^{a:.2f} and"
            f" D as C^{1 - a:.2f}, so at this budget the law's allocation is far from any run's: read these rows as"
            " what the fit implies, not as a training plan.")


def write_report(results_df: pd.DataFrame, fit_result: Any, out_dir: str | Path, *, curves: pd.DataFrame | None = None,
                 plan_table: pd.DataFrame | None = None, compute: float | Sequence[float] | None = None) -> Path:
    """Make every figure into `out_dir` and write out_dir/REPORT.md; returns the report's path."""
    out_dir = Path(out_dir)
    ok = plots.validate_results(results_df)
    fitted, law_rows = plots.study_part(ok, "main"), plots.study_part(ok, "law")  # see plots.study_part
    computes = ([compute] if isinstance(compute, (int, float)) else list(compute)) if compute is not None \
        else plots.default_budgets(ok)
    table = plan_table if plan_table is not None else plots.cluster_time_table(fit_result)
    figures = plots.make_figures(results_df, fit_result, out_dir, curves=curves, computes=computes, plan_table=table)

    sections = ["# Precision-aware scaling: report",
                "",
                "At a fixed training budget, which numeric precision gives the lowest loss? Generated by "
                "`scaling figures` / `paper_figures/make_figures.py` from committed results and fits; every number "
                "below is computed, none typed in.",
                "",
                "## What was run",
                "",
                what_was_run(results_df, ok, _corpus(results_df)),
                ""]
    found: list[dict] = []
    heldout = None
    if fit_result is not None and not ok.empty:
        error_text, heldout = heldout_error(fit_result, fitted)
        sections += ["## Fitted law", "", fitted_law(fit_result), "", error_text, ""]
        gap_text = cost_of_precision(fitted, fit_result)
        if gap_text:
            sections += ["## The cost of low precision, by tokens", "", gap_text, ""]
        if not plots.precision_term(fit_result):
            sections += [f"The `{fit_result.law}` law has no precision term, so it cannot locate a sweet spot; "
                         "fit a precision-aware law (`scaling fit --law kumar`).", ""]
        elif computes:
            text, found = sweet_spot(fit_result, law_rows, computes)
            sections[4:4] = ["## Summary", "", summary(found, fit_result.law), ""]
            sections += ["## The sweet spot", "",
                         f"Cost model {plots.COST_MODEL}: at one budget FP16 trains a 2× larger model than FP32, "
                         "FP8 4×, FP4 8× (same tokens).", "", text,
                         "## Comparison with published sweet spots", "", comparison(found), ""]
    else:
        sections += ["## Fitted law", "", "No fitted law was given (`--fit`), so there is no sweet spot to report.", ""]
    sections += ["## Figures", ""]
    for fig in figures:
        if isinstance(fig, plots.Figure):
            rel = fig.png.relative_to(out_dir) if fig.png.is_relative_to(out_dir) else fig.png
            sections += [f"### Figure {fig.number}. {fig.title}", "", f"![{fig.title}]({rel.as_posix()})", "",
                         f"{fig.caption} ([PDF]({Path(rel).with_suffix('.pdf').as_posix()}))", ""]
    skipped = [f for f in figures if isinstance(f, plots.Skipped)]
    if skipped:
        sections += ["Skipped figures (their inputs are absent):", ""]
        sections += [f"- Figure {s.number} ({s.title}): skipped, {s.reason}." for s in skipped]
        sections += [""]
    sections += ["## Training time on GPU clusters", "",
                 f"From `scaling.plan` on {table.attrs.get('gpu', 'GPUs')} (FLOPs = 6·N·D; a P-bit recipe runs at "
                 "the narrowest hardware format with ≥ P bits). Rows labelled *law optimum* give our fitted law's "
                 f"compute-optimal (N, D) per precision at C = {_fmt(plots.CLUSTER_COMPUTE)} (DeepSeek-V3's budget): an "
                 f"extrapolation far beyond the measured sizes.{_allocation_note(fit_result)}", "",
                 plots.table_markdown(table), ""]
    if not ok.empty:
        sections += ["## Limitations", "", limitations(fitted, fit_result, found, heldout), ""]
    path = out_dir / "REPORT.md"
    atomic_write_text(path, "\n".join(sections))
    return path
