"""REPORT.md's sentences about what was measured, and the formatting every section shares.

Every sentence that states a finding is computed from the numbers passed in: what was run, the
matched-token gaps, the IsoFLOP findings, the chips' verdicts, and the limitations paragraph from the
data's own spans (sizes, tokens, points per parameter, precisions measured). The fitted law's text (how it
was chosen, its P*) is scaling.study.report.law_prose's and the prediction's and backtests' is
scaling.study.report.prediction_prose's; both import the helpers here (`fmt`, `_markdown`) and this module
never imports them. The purpose sweeps' text (granularity, outliers) is scaling.study.report.purpose_prose's,
re-exported here. scaling.study.report orders the sections, adds a study's own and writes the file; a study's
own sections use `fmt`, `verdict_sentence` and `findings_section` as the built-in ones do.

One function per section (and its small helpers): the main study's wording stays in one place, so a
sentence and the ones it must agree with (the answer, the IsoFLOP verdicts, the limitations) are read and
changed together.
"""

from __future__ import annotations

import math
import re
from pathlib import PurePosixPath
from typing import Any, Sequence

import numpy as np
import pandas as pd

from scaling.study.analysis import chips as chips_lib, isoflop as analysis
from scaling.study.report import plots
from scaling.study.analysis import findings as findings_lib
from scaling.study.analysis.fit import FitResult
from scaling.study.sweeps.design_checks import HIGH_BITS, QUANTISED_PARTS, UNQUANTISED_DOMINATES
from scaling.study.report.purpose_prose import (  # noqa: F401  (the names callers read here)
    granularity_headline, granularity_section, outliers_headline, outliers_section)

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


def matched_section(f: dict) -> str:
    """Each recipe's gap to the reference at matched tokens (findings' `matched`): the numerics alone,
    before any cost model; continuous differences with their intervals, then each one's direction."""
    m, unit = f["matched"], f["loss_unit"]
    fw = m["familywise"]
    lines = [f"Each recipe's loss minus {m['reference']}'s at the same model size, tokens and seed (same initialisation, "
             f"same data order, same tokens: only the numerics differ), paired on {', '.join(m['keys'])}. One regression "
             f"per recipe over every budget: gap = a + b·(ln N − mean) + c·(ln(D/N) − mean), so a is the recipe's mean "
             f"matched gap at the centre of its points; errors clustered by ({', '.join(m['clustered_by'])}) (a seed fixes "
             f"both the initialisation and the data order; CR1, t with G − 1 dof). The family-wise intervals are "
             f"{fw['rule']} over {fw['m']} coefficients ({fw['level']:.0%} for all together); each direction is read "
             f"from them. Loss in {unit}. No cost model enters here: the IsoFLOP sections below add one.", "",
             "| recipe | points (clusters) | matched gap a | 95% CI | family-wise CI | per e-fold of D/N, c (family-wise CI) | direction |",
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
    """Each recipe on each chip (findings' `cost_models`): its charge per 6ND under every cost model, then
    per chip and budget every recipe's best loss at the tokens it buys there, where, its difference to the
    best with the family-wise interval, and what that reading rests on beyond what was measured."""
    c = f["cost_models"]
    ch, unit = c["charges"], f["loss_unit"]
    models = list(c["chips"])
    lines = ["A chip charges each GEMM by the rate its tensor cores run its format at (dense peaks from the planner's "
             "table, `scaling plan`); `bits` charges by the operands' bits. A recipe's tokens at a budget follow from "
             f"its charge. Charge per 6ND at N = {fmt(ch['N'])}, and the tokens it buys relative to {ch['reference']}:", "",
             "| recipe | " + " | ".join(f"{m}: charge (tokens)" for m in models) + " |",
             "| --- | " + " | ".join("---" for _ in models) + " |"]
    for r in ch["rows"]:
        lines.append(f"| {r['recipe']} | " + " | ".join(
            f"{r[m]:.3f} ({r[m + '_tokens']:.2f}x)" if m in r else "–" for m in models) + " |")
    fw = c["familywise"]
    lines += ["", f"How each verdict is computed: {c['method']} ({c['draws']} draws). Differences to the best recipe "
                  f"with {c['level']:.0%} intervals family-wise over {fw['m']} comparisons (normal, bootstrap SE × "
                  f"{fw['z']:.2f}). Loss in {unit}; N and D at each recipe's best size."]
    if c.get("excluded"):
        lines += ["", "Not compared: " + "; ".join(f"{r} ({why})" for r, why in c["excluded"].items()) + "."]
    for chip, entry in c["chips"].items():
        budgets = entry["budgets"]
        lines += ["", f"**{chip}** ({entry['description']})"
                  + ("; not priced: " + "; ".join(f"{r} ({why})" for r, why in entry["not_priced"].items())
                     if entry.get("not_priced") else "") + ". Best loss at each budget (minus the best, family-wise CI):", "",
                  "| recipe | " + " | ".join(f"C = {fmt(b['budget_reference'])}" for b in budgets) + " |",
                  "| --- | " + " | ".join("---" for _ in budgets) + " |"]
        cells = {e["recipe"]: {} for e in budgets[-1]["recipes"]}
        for i, b in enumerate(budgets):
            for e in b["recipes"]:
                ci = "" if e["diff_ci"] is None else f" ({e['diff']:+.3f} [{e['diff_ci'][0]:+.3f}, {e['diff_ci'][1]:+.3f}])"
                cells.setdefault(e["recipe"], {})[i] = f"{e['loss']:.3f}{ci}{' *' if e['notes'] else ''}"
        for recipe, row in cells.items():
            lines.append(f"| {recipe} | " + " | ".join(row.get(i, "–") for i in range(len(budgets))) + " |")
    lines += ["", "\\* read beyond what was measured: the reference's loss beyond the tokens measured at that size, "
                  "the recipe's gap beyond the (N, D/N) it was measured at, or the best size at the edge of the sizes "
                  "(findings.json's `cost_models` names each)."]
    return "\n".join(lines)


def bits_cell(e: dict) -> str:
    """A recipe's bits P as a table cell ('–' where the results do not record it)."""
    return "–" if e.get("P") is None else f"{e['P']:g}"


def answer_section(f: dict) -> str:
    """REPORT's and README's first words: the answer per chip and budget (findings' `cost_models`), then what
    the formats do at matched tokens; without per-chip verdicts, the `bits` design's (bits_answer)."""
    c = f.get("cost_models") or {}
    if not c.get("chips"):
        return bits_answer(f)
    fw, compared = c["familywise"], {b["compared"] for e in c["chips"].values() for b in e["budgets"]}
    lines = [f"The lowest loss at a fixed compute budget C on each chip: the best recipe and its lead, or the recipes "
             "these runs cannot tell apart and the closest one's difference "
             f"({'/'.join(map(str, sorted(compared)))} recipes in every cell; {c['level']:.0%} intervals, family-wise "
             f"over each chip's {fw['m']} comparisons; \\* read beyond what was measured). A recipe's loss: the "
             "reference's measured loss curve at the tokens its cost buys on that chip, plus its gap at matched tokens; "
             "`bits`: half the bits, twice the throughput.", "", chips_lib.answer_table(c)]
    matched = matched_line(f)
    return "\n".join(lines + (["", matched] if matched else []))


def matched_line(f: dict) -> str | None:
    """One sentence: each recipe's mean gap to the reference at matched tokens, grouped by its family-wise
    direction (findings' `verdict` key), each group with the span of its intervals (REPORT's matched section has each interval)."""
    m = f.get("matched")
    if not m:
        return None
    measured = sorted((r for r in m["recipes"] if r["mean"] is not None), key=lambda r: r["mean"])
    said = []
    for direction in ("lower than the reference", "cannot tell", "higher than the reference"):
        group = [r for r in measured if r["verdict"] == direction]
        if group:
            lo = min(r["mean_familywise_ci"][0] for r in group)
            hi = max(r["mean_familywise_ci"][1] for r in group)
            said.append(f"{direction.replace('the reference', m['reference'])} ({lo:+.3f} to {hi:+.3f}): "
                        + ", ".join(f"{r['recipe']} {r['mean']:+.3f}" for r in group))
    return (f"At matched tokens (the numerics alone: same size, tokens and seed as {m['reference']}; "
            f"{sum(r['n'] for r in measured)} paired points clustered by (N, seed); mean gap in {f['loss_unit']}, the "
            f"span of the {m['familywise']['level']:.0%} intervals, family-wise over {m['familywise']['m']} coefficients, "
            "in parentheses): " + "; ".join(said) + ".")


def bits_answer(f: dict) -> str:
    """The answer from the `bits` design's IsoFLOP minima alone: which precision to train in, in plain words, from the verdicts at each budget
    (under the study's cost model) and what the formats do at matched tokens. A recipe that leads at a fixed
    budget without a lower matched-token loss owes its place to the tokens its cheaper FLOPs buy."""
    cost, unit = str(f["cost_model"]).split(":")[0], f["loss_unit"]
    budgets = [b for b in f.get("budgets") or [] if any(e["loss"] is not None for e in b["recipes"])]
    if not budgets:
        return ("These runs cannot say which precision to train in: no budget is reached by three or more sizes of "
                "two recipes, so no IsoFLOP minimum can be compared.")
    lines = [f"Under the `{cost}` cost model (each FLOP charged by its operands' bits; a chip's rates are further "
             "below), at each budget:", ""]
    below: dict[str, float] = {}  # recipe -> tokens it buys per token of the reference, where its minimum is lower
    for b in budgets:
        ranked = sorted((e for e in b["recipes"] if e.get("p_best") is not None), key=lambda e: -e["p_best"])
        if b["winner"]:
            head = (f"**train in {b['winner']}**: its IsoFLOP minimum is {b['diff']:.3f} {unit} below {b['runner_up']}'s "
                    f"(95% CI {b['diff_ci'][0]:.3f} to {b['diff_ci'][1]:.3f})")
        else:
            head = f"**cannot tell** which is best ({b['reason'].removeprefix('cannot tell: ')})"
        seen = [e for e in ranked if round(e["p_best"], 2) > 0]
        never = len(ranked) - len(seen)
        likely = ", ".join(f"{e['recipe']} {e['p_best']:.2f}" for e in seen) + (
            f"; the other {never} recipe{'s' if never > 1 else ''} under 0.005" if never else "")
        lines.append(f"- C = {fmt(b['budget'])}: {head}. How often each is best over the bootstrap: {likely}.")
        ref = next((e for e in b["recipes"] if e["recipe"] == (f.get("matched") or {}).get("reference")), None)
        for e in b["recipes"]:
            if ref is not None and ref["loss"] is not None and e["loss"] is not None and e["loss"] < ref["loss"]:
                below[e["recipe"]] = ref["bits_eff"] / e["bits_eff"]
    m = f.get("matched") or {}
    rows = [r for r in m.get("recipes") or [] if r.get("mean") is not None]
    if rows:
        fw = m["familywise"]
        lines += ["", f"At matched tokens (same model, tokens and seed as {m['reference']}: the numerics alone; "
                      f"{fw['level']:.0%} family-wise intervals): "
                  + "; ".join(f"{r['recipe']} {r['mean']:+.3f} ({r['mean_familywise_ci'][0]:+.3f} to "
                              f"{r['mean_familywise_ci'][1]:+.3f}): {r['verdict']}"
                              for r in sorted(rows, key=lambda r: r["mean"])) + "."]
        by = {r["recipe"]: r for r in rows}
        bought = [(r, x) for r, x in below.items() if r in by and not by[r]["verdict"].startswith("lower")]
        if bought:
            names = ", ".join(r for r, _ in bought[:-1]) + (" and " if len(bought) > 1 else "") + bought[-1][0]
            lines += ["", f"So where {names} {'sit' if len(bought) > 1 else 'sits'} below {m['reference']} at a fixed "
                      f"budget, that comes from the tokens cheaper FLOPs buy under `{cost}` ("
                      + ", ".join(f"{r} {x:.2g}x" for r, x in bought) + f" {m['reference']}'s tokens at the same size), "
                      "not from a lower loss at the same tokens" + (
                          f" ({', '.join(r for r, _ in bought if by[r]['verdict'].startswith('higher'))}: higher there)"
                          if any(by[r]["verdict"].startswith("higher") for r, _ in bought) else "") + "."]
    if not any(b["winner"] for b in budgets):
        seeds = _range_text(f["seeds_per_cell"])
        lines += ["", f"These {f['runs']} runs cannot pick a precision ({seeds} seed{'s' if seeds != '1' else ''} per "
                      "cell): more seeds, and sizes on both sides of each minimum, are what would tell."]
    return "\n".join(lines)


# the IsoFLOP section's sentence where no budget has profiles to compare (README's GPU pilot line says it too)
NO_BUDGETS = ("No budget is reached by three or more sizes of two recipes: no IsoFLOP profile can be fitted, so the "
              "data cannot tell which precision is best.")


def runs_sentence(f: dict) -> str:
    """How many runs the IsoFLOP findings rest on, their seeds per cell and the loss unit (the IsoFLOP
    section's and README's)."""
    return (f"{f['runs']} runs; seeds per (size, recipe, tokens) cell: {_range_text(f['seeds_per_cell'])}; "
            f"loss in {f['loss_unit']}.")


def findings_section(f: dict) -> str:
    """Per budget: each recipe's IsoFLOP minimum with its CI, runs and P(best); the verdict sentence."""
    unit = f["loss_unit"]
    lines = [f"Compute in 16-bit FLOP units, cost model *{f['cost_model']}*. {runs_sentence(f)} "
             "A recipe's bits P are its forward GEMM operands' element width, as the law sees them; what the cost "
             "model charges for one of its FLOPs, in 16-bit FLOPs, is a separate column: every verdict below holds "
             "for this cost model only."]
    if not f["budgets"]:
        return "\n".join(lines + ["", NO_BUDGETS])
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


def _range_text(r: Sequence[int]) -> str:
    return f"{r[0]}" if r[0] == r[1] else f"{r[0]}-{r[1]}"


def corpora_sentence(corpora: dict[str, dict[str, int]]) -> str:
    """A budget's runs on more than one corpus, in one sentence (the IsoFLOP section's and README's): how
    many runs on each, and the recipes with no run on the corpus most runs trained on."""
    names = list(corpora)
    main = max(names, key=lambda c: sum(corpora[c].values()))
    off = sorted(r for c in names if c != main for r in corpora[c] if not corpora[main].get(r))
    return (f"Not one corpus: these runs trained on {len(names)} ({', '.join(f'{c}: {sum(corpora[c].values())} runs' for c in names)})"
            + (f"; no run on {main}: {', '.join(sorted(set(off)))}" if off else "") + ".")


def _corpora_lines(corpora: dict[str, dict[str, int]]) -> list[str]:
    """Where a budget's runs trained on more than one corpus: which recipe on which, since a comparison
    of runs on different data is not like with like (the data's effect is confounded with the recipe's)."""
    if len(corpora) < 2:
        return []
    return ["", corpora_sentence(corpora) + " A corpus is what the training installation holds (`pysrc`: its venv's packages and checkout path), "
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
    """A budget's verdict under its cost model (budget_headline: the winner or why none, each recipe's gap to
    the reference), then the noise the bootstrap drew from."""
    return budget_headline(b, unit) + _noise_text(b, unit)


def budget_headline(b: dict, unit: str) -> str:
    """A budget's verdict in one sentence (the winner and its lead, or why there is none), then each
    recipe's IsoFLOP minimum minus the reference's with its 95% CI where the analysis paired them (README's
    line for the GPU pilot's budgets)."""
    if b["winner"]:
        w = next(e for e in b["recipes"] if e["recipe"] == b["winner"])
        text = (f"{b['winner']} has the lowest IsoFLOP minimum, {b['diff']:.3f} {unit} below {b['runner_up']} "
                f"(95% CI of the difference {b['diff_ci'][0]:.3f}–{b['diff_ci'][1]:.3f}; {w['runs']} runs; "
                f"P(best) = {w['p_best']:.2f}).")
    elif b["reason"].startswith("cannot tell: "):
        text = f"No winner, cannot tell: {b['reason'].removeprefix('cannot tell: ')}."
    else:
        text = f"No winner: {b['reason']}."
    return text + gaps_sentence(b)


def gaps_sentence(b: dict) -> str:
    """' Minimum minus <reference>'s (95% CI): <recipe> <gap> [lo, hi]; ...' over a budget's recipes with a
    paired gap to the reference, lowest first, a minimum at the edge of its sizes marked; '' without any."""
    reference = next((e["recipe"] for e in b["recipes"] if e.get("gap") is None and e.get("loss") is not None), None)
    gaps = sorted((e for e in b["recipes"] if e.get("gap") is not None and e.get("gap_ci")), key=lambda e: e["gap"])
    if not reference or not gaps:
        return ""
    return (f" Minimum minus {reference}'s (95% CI): "
            + "; ".join(f"{e['recipe']} {e['gap']:+.3f} [{e['gap_ci'][0]:+.3f}, {e['gap_ci'][1]:+.3f}]"
                        + ("" if e.get("inside", True) else " (edge)") for e in gaps) + ".")


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


def _optima_ratio_text(budgets: Sequence[dict]) -> str:
    """Where the IsoFLOP minima inside their sizes sit in tokens per parameter, per budget ('' if none)."""
    spans = []
    for b in budgets:
        ratios = [e["D_opt"] / e["N_opt"] for e in b["recipes"] if e.get("D_opt") and e.get("inside")]
        if ratios:
            lo, hi = f"{min(ratios):.3g}", f"{max(ratios):.3g}"
            spans.append(f"{lo if lo == hi else f'{lo}–{hi}'} tokens per parameter at C = {fmt(b['budget'])}")
    return f" The measured IsoFLOP optima (inside their sizes) sit at {'; '.join(spans)}." if spans else ""


def limitations(ok: pd.DataFrame, fit: FitResult | None, found: list[dict], heldout: float | None,
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


def corpus_name(corpus: str) -> str:
    """A results row's corpus ('<source> <fingerprint> [tokenizer]') as a report names it: a file or
    directory source by its own name, not the absolute path it had on the machine that trained it."""
    m = re.match(r"^(.*?) ([0-9a-f]{12}(?: \S+)?)$", corpus)
    source, tail = (m.group(1), " " + m.group(2)) if m else (corpus, "")
    if source.startswith(("/", "~")):
        source = PurePosixPath(source).name or source
    return source + tail


def corpus_of(results: pd.DataFrame) -> str | None:
    for column in ("corpus", "corpus_source", "data_source"):
        if column in results.columns and results[column].notna().any():
            runs = results.drop_duplicates("run_id")[column].dropna().astype(str).map(corpus_name).value_counts()
            if len(runs) == 1:
                return runs.index[0]
            if "sweep" not in results.columns:
                return ", ".join(f"{c} ({n} runs)" for c, n in runs.items()) + " (not one corpus: see the findings)"
            each = results.drop_duplicates("run_id")
            each = each.assign(**{column: each[column].astype("string").map(corpus_name, na_action="ignore")})
            by = each.groupby(column)["sweep"].agg(lambda s: ", ".join(sorted(set(s.astype(str)))))
            mixed = each.groupby("sweep")[column].nunique().gt(1).any()
            return (", ".join(f"{c} ({n} runs: {by[c]})" for c, n in runs.items())
                    + (" (a sweep on more than one corpus: see the findings)" if mixed else "; each sweep on one corpus"))
    return None
