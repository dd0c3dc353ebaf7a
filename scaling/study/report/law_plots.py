"""The figures drawn from a fitted law (`scaling figures`, listed by scaling.study.report.plots.make_figures).

  2 iso_loss            the law's L(N, D(C, N, P), P) over (N, P) at fixed C under the findings'
                        cost model, with the frontier N*(P)
  3 fitted_vs_observed  predicted vs measured loss, y = x, held-out points marked
  9 residuals           observed - fitted loss per recipe against N, with each recipe's mean and CI
                        (scaling.study.analysis.findings.residuals_by_recipe): where the law is biased

with the fit adapters they read the law through (its bootstrap samples, precision grid, optimum,
fitted sizes, held-out split), and the cluster-time table (training days on GPU clusters from
`scaling.plan.cluster`: cluster_time_table) that REPORT's cluster section writes as markdown
(table_markdown); it was figure 8, a table drawn as an image, and is no figure now. Each figure writes <stem>.png and <stem>.pdf through
scaling.study.report.figure_base and returns a `Figure`, as the measured-data figures of scaling.study.report.plots do.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")  # figures are files; never open a window (CI, ssh, Ray workers)

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from scaling import plan  # noqa: E402
from scaling.errors import ConfigError  # noqa: E402
from scaling.study.analysis import laws  # noqa: E402
from scaling.study.analysis.pstar import optimal, optimum_check  # noqa: E402
from scaling.study.report.figure_base import (TITLES, Figure, _figure, _fmt, _log_n_axis, loss_label,  # noqa: E402
    palette_for, recipe_handles, recipe_order, recipe_style, with_precision)
from scaling.study.analysis.fit import FitResult, literature_exponents  # noqa: E402

# The continuous precision grid of the law's curves (bits, log-spaced).
P_GRID = np.geomspace(3.0, 32.0, 48)


# ---------------------------------------------------------------------------------------------
# Fit adapters
# ---------------------------------------------------------------------------------------------


def param_samples(fit: FitResult) -> list[dict]:
    """The bootstrap's per-resample parameter sets (empty when the fit was made without a bootstrap)."""
    samples = getattr(fit, "samples", None)
    return [] if samples is None or len(samples) == 0 else samples.to_dict("records")


def precision_grid(fit: FitResult) -> np.ndarray:
    """Bits to draw L*(P) at: log-spaced in 3-32 bits, or the integers 3..32 for laws on (E, M) bits."""
    if {"ebits", "mbits"} <= set(laws.get(fit.law).columns):
        return np.arange(3.0, 33.0)
    return P_GRID


def optimum(fit: FitResult, compute: float, precisions: Sequence[float] | None = None, params: dict | None = None,
            n_range: tuple[float, float] = (1.0, np.inf), cost: Any = None) -> dict:
    """scaling.study.analysis.pstar.optimal.optimal_precision: the best (P, N, D, loss) and the per_precision table."""
    return optimal.optimal_precision(fit, compute=compute, precisions=None if precisions is None else list(precisions),
                                     params=params, n_range=n_range, **({"cost": cost} if cost is not None else {}))


def fitted_sizes(fit: Any) -> tuple[float, float] | None:
    """The (smallest, largest) N the law was fitted on, from the fit's data summary; None if not recorded.
    fit: a FitResult or its dict (FitResult.to_dict, as a fit JSON holds it)."""
    data = (fit.get("data") if isinstance(fit, dict) else getattr(fit, "data", None)) or {}
    n = data.get("columns", {}).get("N", {})
    return (float(n["min"]), float(n["max"])) if "min" in n and "max" in n else None


def loss_vs_precision(fit: FitResult, compute: float, bits: Sequence[float] | None = None, params: dict | None = None,
                      cost: Any = None) -> pd.DataFrame:
    """L*(P; C): for each P the cost-model-optimal N, D and loss (scaling.study.analysis.pstar.optimal's per_precision table)."""
    bits = precision_grid(fit) if bits is None else bits
    table = optimum(fit, compute, bits, params, cost=cost)["per_precision"]
    return table.sort_values("P").reset_index(drop=True)



# ---------------------------------------------------------------------------------------------
# 2, 3, 9: the law against the runs
# ---------------------------------------------------------------------------------------------


def iso_loss(fit: FitResult, compute: float, stem: str | Path, cost: Any = None, unit: str = "nats/token",
             chosen: str | None = None) -> Figure:
    """Figure 2: the law's loss over (N, P) at fixed C, each (N, P) given the tokens C affords it under
    `cost` (a scaling.study.analysis.pstar.optimal.Cost; default: the fit's runs' unquantised share under the `bits` cost model);
    the frontier N*(P) and the optimum, under the optimum check `scaling optimal` prints (optimum_check.check):
    a filled star only for an optimum that exists inside the trained runs, a hollow one labelled
    extrapolated for one outside them, none where no optimum exists (the caption says why). chosen: the
    law selection chose, where `fit` is another (profile.profile_source: the chosen law has no bits axis)."""
    cost = cost or optimal.Cost(share=optimal.share_of(fit))
    best = optimum(fit, compute, cost=cost)
    check = optimum_check.check(fit, best, cost)
    frontier = loss_vs_precision(fit, compute, cost=cost)
    sizes = fitted_sizes(fit)
    n_lo = min(frontier["N"].min(), best["N"], *(sizes or ())) / 10
    n_hi = max(frontier["N"].max(), best["N"], *(sizes or ())) * 10
    n_grid = np.geomspace(n_lo, n_hi, 120)
    p_grid = precision_grid(fit)
    grid = optimal.iso_loss(fit, compute, n_grid, p_grid, cost=cost).pivot(index="P", columns="N", values="loss")
    NN, PP = np.meshgrid(grid.columns.to_numpy(float), grid.index.to_numpy(float))
    loss = grid.to_numpy(float)
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    lo, hi = np.nanmin(loss), np.nanpercentile(loss, 90)
    levels = np.linspace(lo, hi, 14)
    filled = ax.contourf(NN, PP, np.minimum(loss, hi), levels=levels, cmap="viridis_r")
    lines = ax.contour(NN, PP, loss, levels=levels[1::2], colors="white", linewidths=0.6)
    ax.clabel(lines, fmt="%.3g", fontsize=7)
    fig.colorbar(filled, ax=ax, label=loss_label(unit), format="%.3g")
    if sizes:  # where the law is a measurement, not an extrapolation
        ax.axvspan(*sizes, facecolor="none", edgecolor="k", hatch="//", lw=0.8, alpha=0.5, label="model sizes fitted")
    inside = np.ones(len(frontier), bool) if not sizes else \
        ((frontier["N"] >= sizes[0]) & (frontier["N"] <= sizes[1])).to_numpy()
    n_star, p_star = frontier["N"].to_numpy(float), frontier["P"].to_numpy(float)
    if inside.any():
        ax.plot(np.where(inside, n_star, np.nan), p_star, color="tab:red", lw=2, label="compute-optimal N*(P)")
    if not inside.all():  # where N* leaves the fitted sizes the line is the law's extrapolation, drawn as such
        ax.plot(np.where(~inside, n_star, np.nan), p_star, color="tab:red", lw=2, ls="--",
                label="N*(P), extrapolated: outside the fitted sizes")
    line = ("the red line is the best N for each P" if inside.all() else
            "the red line is the best N for each P, dashed where it lies outside the fitted sizes (an extrapolation: "
            + ("all of it" if not inside.any() else f"{(~inside).sum()} of {len(inside)} points") + ")")
    split = f" (E{best['ebits']:g}M{best['mbits']:g}, whole bits)" if "ebits" in best else ""
    if check["exists"] and not check["extrapolated"]:
        ax.scatter([best["N"]], [best["P"]], marker="*", s=220, color="tab:red", edgecolor="k", zorder=4,
                   label=f"optimum: P* = {best['P']:.2g} bits, N = {_fmt(best['N'])}")
        star = f"the star the overall optimum (P* = {best['P']:.3g} bits{split}, loss {best['loss']:.4g})"
    elif check["exists"]:
        ax.scatter([best["N"]], [best["P"]], marker="*", s=220, facecolor="none", edgecolor="tab:red", lw=1.5,
                   zorder=4, label=f"law's optimum, extrapolated: P = {best['P']:.2g} bits, N = {_fmt(best['N'])}")
        star = (f"the hollow star the law's optimum, an extrapolation (P = {best['P']:.3g} bits{split}, loss "
                f"{best['loss']:.4g}; " + "; ".join(e["text"] for e in check["extrapolation"]) + ")")
    else:
        star = "no optimum is starred: " + "; ".join(check["reasons"])
    ax.set_xscale("log")
    ax.set_yscale("log", base=2)
    ticks = [3, 4, 6, 8, 12, 16, 32]
    ax.set_yticks(ticks)
    ax.set_yticklabels([str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("non-embedding parameters N")
    ax.set_ylabel("precision P (bits)")
    ax.set_title(f"{TITLES[2]}\nC = {_fmt(compute)} (16-bit FLOP units, {cost.model.name} cost model): D = what C affords",
                 fontsize=10)
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    drawn = (f" (within noise of the chosen {chosen} law, which has no bits axis: see P*)"
             if chosen and chosen != fit.law else "")
    caption = (f"iso-loss contours of the fitted {fit.law} law{drawn} at C = {_fmt(compute)}; {line}, "
               f"{star}"
               + (f"; hatched: the model sizes the law was fitted on ({_fmt(sizes[0])}–{_fmt(sizes[1])})." if sizes else "."))
    return _figure(2, Path(stem), fig, caption)


def heldout_mask(fit: FitResult, results: pd.DataFrame) -> np.ndarray | None:
    """Which result rows the fit's held-out test predicted (None when the fit records no held-out test).

    scaling.study.analysis.fit.holdout_error holds out the rows whose split key (N, or compute 6·N·D) is >= threshold.
    """
    heldout = getattr(fit, "heldout", None)
    if not heldout or "threshold" not in heldout:
        return None
    by = heldout.get("by", "N")
    key = results["N"].to_numpy(float) * (6.0 * results["D"].to_numpy(float) if by == "compute" else 1.0)
    return key >= float(heldout["threshold"])


def heldout_predictions(fit: FitResult, results: pd.DataFrame, mask: np.ndarray | None) -> np.ndarray:
    """The law's prediction per row: the full fit, except held-out rows when the fit kept the params of its
    held-out fit (fitted without those rows), which then predicts them — the extrapolation test itself."""
    predicted = np.asarray(fit.predict(results), float)
    params = (getattr(fit, "heldout", None) or {}).get("params")
    if mask is not None and mask.any() and params:
        extrapolating = dataclasses.replace(fit, params={**fit.params, **params})
        predicted[mask] = np.asarray(extrapolating.predict(results[mask]), float)
    return predicted


def fitted_vs_observed(fit: FitResult, results: pd.DataFrame, stem: str | Path, heldout: np.ndarray | None = None,
                       unit: str = "nats/token", recipes: Sequence[str] | None = None, bits: dict | None = None) -> Figure:
    """Figure 3: the law's prediction against every measured loss; held-out points hollow. Points are styled
    by recipe (figure_base.recipe_style among `recipes`, the study's list; labelled with `bits`, role_bits)
    where the table names recipes, else by precision."""
    df = with_precision(results)
    df["heldout"] = np.zeros(len(df), bool) if heldout is None else np.asarray(heldout, bool)
    df["predicted"] = heldout_predictions(fit, df, heldout)
    # without the held-out fit's params the held-out rows can only be shown with the full fit's prediction
    extrapolated = bool((getattr(fit, "heldout", None) or {}).get("params"))
    held_label = " (held out)" if extrapolated else " (held-out set, full-fit prediction)"
    by_recipe = "recipe" in df.columns and df["recipe"].notna().all()
    drawn = recipe_order(df["recipe"].astype(str)) if by_recipe else []
    # many recipes: their legend goes beside the axes, which keep their own width
    fig, ax = plt.subplots(figsize=(8.4 if len(drawn) > 6 else 5.4, 5.0))
    if by_recipe:
        study = list(recipes) if recipes is not None else drawn
        for recipe in drawn:
            colour, marker, _ = recipe_style(recipe, study)
            for held in (False, True):
                part = df[(df["recipe"].astype(str) == recipe) & (df["heldout"] == held)]
                if len(part):
                    ax.scatter(part["val_loss"], part["predicted"], s=26, marker=marker, linewidth=1.1,
                               facecolor="none" if held else colour, edgecolor=colour if held else "k")
        handles = recipe_handles(drawn, study, bits, lw=0)
        if df["heldout"].any():
            handles.append(matplotlib.lines.Line2D([], [], marker="o", ls="", mfc="none", mec="0.3",
                                                   label=f"hollow: held out{held_label.replace(' (held out)', '')}"))
    else:
        palette = palette_for(df["precision"])
        for label in palette:
            for held, marker in ((False, "o"), (True, "s")):
                part = df[(df["precision"] == label) & (df["heldout"] == held)]
                if part.empty:
                    continue
                ax.scatter(part["val_loss"], part["predicted"], s=30, marker=marker,
                           facecolor="none" if held else palette[label], edgecolor=palette[label], linewidth=1.3,
                           label=f"{label}{held_label if held else ''}")
    lo = float(min(df["val_loss"].min(), df["predicted"].min()))
    hi = float(max(df["val_loss"].max(), df["predicted"].max()))
    pad = 0.03 * (hi - lo or 1.0)
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="0.3", ls="--", lw=1, label="y = x")
    if by_recipe:
        handles.append(matplotlib.lines.Line2D([], [], color="0.3", ls="--", lw=1, label="y = x"))
    rel = np.abs(df["predicted"] / df["val_loss"] - 1)
    # one in-sample number (the full fit on every point, as REPORT's fitted-law section states it) and
    # one out-of-sample number (the held-out fit on the points it did not see)
    full = np.abs(np.asarray(fit.predict(df), float) / df["val_loss"].to_numpy(float) - 1)
    text = f"mean |rel. error| of the fit on its {len(df)} points: {full.mean():.2%}"
    if df["heldout"].any():
        recorded = fit.heldout.get("mare")
        if extrapolated:
            text += (f"; fitted without the {int(df['heldout'].sum())} held-out points, the law predicts them within "
                     f"{rel[df['heldout']].mean():.2%}")
        elif recorded is not None:
            text += f"; the fit's held-out test: {recorded:.2%}"
    ax.text(0.03, 0.97, text.replace("; ", ";\n"), transform=ax.transAxes, va="top", fontsize=8)
    ax.set_xlabel(f"observed {loss_label(unit)}")
    ax.set_ylabel(f"fitted {loss_label(unit)}")
    ax.set_title(f"{TITLES[3]} ({fit.law} law, {len(df)} points)", fontsize=10)
    if len(drawn) > 6:  # many recipes: one legend beside the axes, never over the points
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    else:
        ax.legend(handles=handles if by_recipe else None, fontsize=7, loc="lower right")
    fig.tight_layout()
    caption = text + (" (no held-out split recorded in the fit)" if heldout is None else "") + "."
    return _figure(3, Path(stem), fig, caption)


def residuals(rows: pd.DataFrame, by_recipe: pd.DataFrame, fit: FitResult, stem: str | Path, unit: str = "nats/token",
              recipes: Sequence[str] | None = None) -> Figure:
    """Figure 9: each evaluation's residual (observed - fitted) against N, styled by recipe
    (figure_base.recipe_style among `recipes`, the study's list), and each recipe's mean residual over runs
    with its CI (findings.residuals_by_recipe)."""
    study = list(recipes) if recipes is not None else list(by_recipe["recipe"].astype(str))
    recipes = list(by_recipe["recipe"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    for recipe in recipe_order(recipes):
        part = rows[rows["recipe"] == recipe]
        colour, marker, _ = recipe_style(recipe, study)
        left.scatter(part["N"], part["residual"], s=16, alpha=0.75, color=colour, marker=marker, label=recipe)
    left.axhline(0, color="0.3", lw=1)
    _log_n_axis(left)
    left.set_ylabel(f"observed - fitted loss ({unit})")
    left.legend(fontsize=7, ncol=2 if len(recipes) > 7 else 1)
    y = np.arange(len(recipes))
    for i, r in enumerate(by_recipe.itertuples()):  # each mean in its recipe's style, its CI in black
        colour, marker, _ = recipe_style(r.recipe, study)
        right.errorbar([r.mean], [i], xerr=[[r.mean - r.lo], [r.hi - r.mean]], fmt=marker, mfc=colour, mec="k",
                       ecolor="k", capsize=3)
    right.axvline(0, color="0.3", lw=1)
    right.set_yticks(y, [f"{r} (n={n})" for r, n in zip(recipes, by_recipe["runs"])], fontsize=8)
    right.set_xlabel(f"mean residual over runs ({unit}), 95% CI")
    fig.suptitle(f"{TITLES[9]} ({fit.law} law)", fontsize=10)
    fig.tight_layout()
    parts = []
    for r in by_recipe.itertuples():
        ci = "" if not np.isfinite(r.lo) else f", 95% CI [{r.lo:+.3f}, {r.hi:+.3f}]"
        biased = np.isfinite(r.lo) and (r.lo > 0 or r.hi < 0)
        parts.append(f"{r.recipe} {r.mean:+.3f}{ci}, n = {r.runs} runs{' (biased)' if biased else ''}")
    return _figure(9, Path(stem), fig, f"mean residual (observed - fitted, {unit}): " + "; ".join(parts) + ".")


# ---------------------------------------------------------------------------------------------
# The cluster-time table (REPORT's cluster section; it was figure 8)
# ---------------------------------------------------------------------------------------------

# The talk's reference runs (issue #6: name -> step-model preset, training FLOPs): inputs, not results.
REFERENCE_RUNS = {name: (model, flops) for name, (model, flops, _) in plan.TALK_TABLE.items()}
CLUSTERS = (1024, 5000, 10000)
# The budget at which the fitted law's per-precision optima are put on a cluster: a cluster-scale
# run (DeepSeek-V3's), since our CPU budgets would take microseconds there.
CLUSTER_COMPUTE = REFERENCE_RUNS["DeepSeek-V3"][1]


def cluster_time_table(fit: FitResult | None = None, compute: float = CLUSTER_COMPUTE, gpus: Sequence[int] = CLUSTERS,
                       gpu: str = "h100") -> pd.DataFrame:
    """Days on `gpus` GPUs from the step model (scaling.plan.cluster.cluster_step): the reference runs in
    BF16 and FP8 under their written-down layouts (plan.CLUSTER_RECIPES), and, given a fit, its
    compute-optimal (N, D) per precision at `compute` as dense shapes (plan.DENSE_RECIPE) at the
    hardware format for P bits: only where its exponents are plausible and split compute as the published
    laws do (fit.literature_exponents), else an optimum at this budget is not credible."""
    rows, not_planned = [dict(row) for row in _reference_rows(tuple(gpus), gpu)], []
    if fit is not None and laws.get(fit.law).bits_axis and literature_exponents(fit):
        best = optimum(fit, compute, [32.0, 16.0, 8.0, 6.0, 4.0])
        for point in best["per_precision"].sort_values("P", ascending=False).to_dict("records"):
            try:
                p = plan.plan_optimum(point, list(gpus), gpu)
            except ConfigError as e:  # a shape the planner cannot lay out: its row is left out, saying why
                not_planned.append(f"P = {point['P']:g} (N = {_fmt(point['N'])}): {e}")
                continue
            rows.append({"run": f"law optimum, P = {point['P']:g}", "P (bits)": point["P"], "hardware": p.hardware_precision,
                         "N": point["N"], "D": point["D"], "FLOPs": p.flops,
                         **{f"days @ {k:,} GPUs": r.days for k, r in zip(gpus, p.runs)}})
    table = pd.DataFrame(rows)
    table.attrs["gpu"] = plan.get_gpu(gpu).name
    table.attrs["not_planned"] = not_planned
    return table


@functools.lru_cache(maxsize=8)
def _reference_rows(gpus: tuple[int, ...], gpu: str) -> tuple[dict[str, Any], ...]:
    """cluster_time_table's rows of the reference runs (BF16 and FP8 under their written-down layouts): the
    same for every fit, so planned once per process (each cluster_step tries a dozen layouts: about a
    second of CPU for the table, which every report writes). Callers copy the rows they change."""
    rows = []
    for name, (model_name, flops) in REFERENCE_RUNS.items():
        model, recipe = plan.load_model(model_name), plan.CLUSTER_RECIPES[model_name]
        for precision in ("bf16", "fp8"):
            days = {k: plan.plan_run(flops, k, gpu, step=plan.cluster_step(model, gpu, k, precision, recipe)).days for k in gpus}
            rows.append({"run": name, "P (bits)": None, "hardware": precision, "N": None, "D": None, "FLOPs": flops,
                         **{f"days @ {k:,} GPUs": d for k, d in days.items()}})
    return tuple(rows)


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, (int, float, np.floating, np.integer)):
        return _fmt(float(v)) if abs(v) >= 1e4 else f"{float(v):.3g}"
    return str(v)


def table_cells(table: pd.DataFrame) -> list[list[str]]:
    """Every cell as text: numbers in 3 significant figures, missing values as '–'."""
    return [[_cell(v) for v in row] for row in table.itertuples(index=False)]


def table_markdown(table: pd.DataFrame) -> str:
    """A GitHub markdown table of `table_cells`, without the columns that hold no value in any row (the
    cluster table's P, N and D where no law optimum is planned)."""
    table = table[[c for c in table.columns if any(_cell(v) != "–" for v in table[c])]]
    header = "| " + " | ".join(map(str, table.columns)) + " |"
    rule = "| " + " | ".join("---" for _ in table.columns) + " |"
    return "\n".join([header, rule, *("| " + " | ".join(row) + " |" for row in table_cells(table))])
