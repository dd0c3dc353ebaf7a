"""Every figure of the report, from results, curves and a fitted law alone (`scaling figures`).

One function per figure; each takes DataFrames / a fit and an output path stem, writes
<stem>.png and <stem>.pdf (atomically) and returns a `Figure` (paths and a caption written from
the data). `make_figures` runs them all: a figure whose input is absent is skipped with a
one-line note; malformed input (a table without the columns it must have, a fit file that
does not parse) raises `ConfigError`.

  1 isoflop_profiles    the direct measurement (scaling.study.analysis.isoflop): per budget C, each recipe's
                        loss at exactly C against N, its parabola in log N and its minimum with
                        the bootstrap CI; the verdict (winner, or why none)
  2 iso_loss            (law_plots) the law's L(N, D(C, N, P), P) over (N, P) at fixed C
  3 fitted_vs_observed  (law_plots) predicted vs measured loss, y = x, held-out points marked
  4 training_curves     training loss vs tokens per recipe, one panel per model size
  5 granularity_format  final validation loss per scaling granularity × format × scale timing
  6 amax_distributions  per-tensor amax vs per-block amax quantiles over training, per role
  7 outliers            largest activation magnitude and loss with and without Smooth-SwiGLU
  9 residuals           (law_plots) observed - fitted loss per recipe against N: where the law is biased
 10 chip_verdicts       (chip_plots) each recipe's best loss on each chip at each budget, with its
                        family-wise interval (findings' cost_models: scaling.study.analysis.chips)

There is no figure 8: training time on GPU clusters is a table, REPORT's cluster section
(law_plots.cluster_time_table, written by law_plots.table_markdown); the other numbers are kept.
Every figure that draws recipes styles one alike (figure_base.recipe_style, from the study's recipe
list) and labels it by what it quantises (figure_base.recipe_label).

This module holds the figures of the results and curves (1, 4-7), the input checks and `make_figures`,
the list of them all; the figures drawn from a fitted law (2, 3, 9) and their fit adapters are in
scaling.study.report.law_plots, the per-chip answer drawn from findings' verdicts (10) in
scaling.study.report.chip_plots, and what they share (the Figure/Skipped records, titles, labels, palette,
legends, axis helpers and saving) in scaling.study.report.figure_base. The names callers read from this
module before those splits are re-exported here (`__all__`). Analysis lives in scaling.study.analysis; these
modules only draw what it computes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import matplotlib

matplotlib.use("Agg")  # figures are files; never open a window (CI, ssh, Ray workers)

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from scaling.study.analysis import laws, isoflop as analysis  # noqa: E402
from scaling.study.analysis.pstar import optimal  # noqa: E402
from scaling.study.analysis import findings as findings_lib  # noqa: E402
from scaling.study.analysis.pstar import profile  # noqa: E402
from scaling.train import compute  # noqa: E402
from scaling.study.sweeps import curves as curves_lib  # noqa: E402
from scaling.errors import ConfigError  # noqa: E402
from scaling.study.analysis.isoflop import study_part  # noqa: E402
from scaling.study.analysis.findings import final_rows  # noqa: E402  (each figure reads its own study part)
from scaling.study.report.figure_base import (STEMS, TITLES, Figure, Skipped, _figure, _fmt, _legend_inches,  # noqa: E402
    _log_n_axis, loss_label, palette_for, precision_label, precision_order, recipe_handles, recipe_label, recipe_order,
    recipe_palette, recipe_style, role_bits, with_precision)
from scaling.study.analysis.fit import FitResult  # noqa: E402
from scaling.study.report.law_plots import (CLUSTER_COMPUTE, cluster_time_table, fitted_sizes,  # noqa: E402
    fitted_vs_observed, heldout_mask, heldout_predictions, iso_loss, param_samples, residuals, table_markdown)
from scaling.study.report.chip_plots import chip_verdicts  # noqa: E402

__all__ = [
    # the measured-data figures, their inputs and the list of all nine
    "isoflop_profiles", "training_curves", "granularity_format", "amax_distributions", "outliers",
    "outlier_column", "final_loss_by", "chip_verdicts", "validate_results", "with_base_lr", "make_figures",
    "GRANULARITY_ORDER", "OUTLIER_COLUMNS", "RESULTS_REQUIRED", "SHARED_LEGEND_FROM",
    # re-exported from figure_base and law_plots for the callers that read them here
    "Figure", "Skipped", "TITLES", "STEMS", "loss_label", "precision_label", "precision_order", "with_precision",
    "palette_for", "recipe_palette", "recipe_style", "recipe_label", "role_bits", "iso_loss", "fitted_vs_observed", "heldout_mask", "heldout_predictions",
    "fitted_sizes", "param_samples", "residuals", "cluster_time_table", "table_markdown",
    "CLUSTER_COMPUTE",
]

GRANULARITY_ORDER = ("tensor", "channel", "block", "block2d", "mx", "nvfp4")
RESULTS_REQUIRED = ("run_id", "N", "D", "P", "val_loss")


# ---------------------------------------------------------------------------------------------
# Inputs: results
# ---------------------------------------------------------------------------------------------


def validate_results(df: pd.DataFrame, source: str = "results") -> pd.DataFrame:
    """Rows that landed `ok` with a finite loss; malformed tables raise ConfigError."""
    missing = [c for c in RESULTS_REQUIRED if c not in df.columns]
    if missing:
        raise ConfigError(f"{source} columns", f"missing {', '.join(missing)}", f"a results table with {', '.join(RESULTS_REQUIRED)}")
    for col in ("N", "D", "P", "val_loss"):
        if len(df) and not pd.api.types.is_numeric_dtype(df[col]):
            raise ConfigError(f"{source} column {col}", str(df[col].dtype), "numbers")
    ok = df if "status" not in df.columns else df[df["status"].fillna("ok") == "ok"]
    return ok[np.isfinite(ok["val_loss"].astype(float))].reset_index(drop=True)


# ---------------------------------------------------------------------------------------------
# 1: the direct measurement
# ---------------------------------------------------------------------------------------------


SHARED_LEGEND_FROM = 5  # recipes; more share one legend under the panels


def isoflop_profiles(points: Sequence[tuple[dict, pd.DataFrame]], stem: str | Path, unit: str = "nats/token",
                     recipes: Sequence[str] | None = None, bits: dict | None = None) -> Figure:
    """Figure 1: per budget (a analysis.isoflop entry and its analysis.points_at rows), each recipe's loss
    against N (less its shape's shared effect), its shape-adjusted parabola in log N and its minimum with
    the bootstrap CI; where shapes are shared, a last panel with the shape effects. recipes: the study's
    recipe list, which fixes each recipe's style (figure_base.recipe_style; default: the recipes drawn);
    bits: figure_base.role_bits of the results, which label each recipe by what it quantises."""
    shaped = any(entry.get("shape_effects") for entry, _ in points)
    fig, axes = plt.subplots(1, len(points) + shaped, figsize=(5.2 * (len(points) + shaped), 4.4), squeeze=False)
    drawn = recipe_order({e["recipe"] for entry, _ in points for e in entry["recipes"]})
    study = list(recipes) if recipes is not None else drawn
    # a recipe's P is the widest of its roles' bits (mxfp4-activations: 16): labelled by what it quantises
    bits = {**{e["recipe"]: e.get("P") for entry, _ in points for e in entry["recipes"] if e.get("P") is not None},
            **(bits or {})}
    captions = []
    for ax, (entry, pts) in zip(axes[0], points):
        for e in entry["recipes"]:
            g = pts[pts["recipe"] == e["recipe"]]
            colour, marker, ls = recipe_style(e["recipe"], study)
            # points with their shape's shared effect removed, on the same footing as the adjusted parabola
            effect = {s["shape"]: s["effect"] for s in entry.get("shape_effects") or []}
            shift = g["shape"].map(effect).fillna(0.0) if "shape" in g.columns else 0.0
            ax.scatter(g["N"], g["loss"] - shift, s=30, color=colour, marker=marker, edgecolor="k", lw=0.5, zorder=3,
                       label=f"{recipe_label(e['recipe'], bits.get(e['recipe']))}, {e['runs']} runs")
            if e["parabola"] is None:
                continue
            x = np.linspace(np.log(g["N"].min()), np.log(g["N"].max()), 60)
            c0, c1, c2 = e["parabola"]
            ax.plot(np.exp(x), c0 + c1 * x + c2 * x * x, color=colour, ls=ls, lw=1.4)
            lo, hi = e["ci"] if e["ci"] else (e["loss"], e["loss"])
            # the CI as a thick bar drawn over the star, so an interval narrower than the marker still shows
            ax.scatter([e["N_opt"]], [e["loss"]], marker="*", s=160, color=colour, edgecolor="k", zorder=4)
            ax.errorbar([e["N_opt"]], [e["loss"]], yerr=[[e["loss"] - lo], [hi - e["loss"]]], fmt="none",
                        ecolor="k", elinewidth=2.2, capsize=5, capthick=1.6, zorder=5)
        _log_n_axis(ax)
        ax.set_ylabel(f"validation loss ({unit})")
        verdict = f"winner: {entry['winner']}" if entry["winner"] else "no winner"
        ax.set_title(f"C = {_fmt(entry['budget'])} ({entry['cost_model']} cost model)\n{verdict}", fontsize=9)
        if len(drawn) <= SHARED_LEGEND_FROM:
            ax.legend(fontsize=7, loc="upper left")
        captions.append(f"at C = {_fmt(entry['budget'])}: {entry['reason'] or 'no analysis'}")
    if shaped:
        _shape_effects_panel(axes[0][-1], [entry for entry, _ in points], unit)
    level = next((entry.get("level") for entry, _ in points if entry.get("level")), 0.95)
    fig.suptitle(f"{TITLES[1]}\nstars: each recipe's shape-adjusted minimum, black bars its {level:.0%} bootstrap CI",
                 fontsize=10)
    if len(drawn) > SHARED_LEGEND_FROM:  # one legend under the panels: inside, it would cover the points
        handles = recipe_handles(drawn, study, bits, lw=1.4)
        fig.legend(handles=handles, loc="lower center", ncol=min(4, len(drawn)), fontsize=8, frameon=False)
        fig.tight_layout(rect=(0, _legend_inches(len(drawn)) / fig.get_figheight(), 1, 1))
    else:
        fig.tight_layout()
    return _figure(1, Path(stem), fig, "; ".join(captions) + ".")


def _shape_effects_panel(ax: Any, entries: Sequence[dict], unit: str) -> None:
    """Figure 1's last panel: per budget, each shared shape's effect on the loss against its N; each shape
    labelled once (a shape at several budgets sits at one N), labels alternately above and below."""
    top: dict[str, dict] = {}  # shape -> its point furthest from zero, where its label goes
    for entry, marker in zip(entries, "osD^v"):
        effects = sorted(entry.get("shape_effects") or [], key=lambda e: e["N"])
        if not effects:
            continue
        ax.plot([e["N"] for e in effects], [e["effect"] for e in effects], marker=marker, lw=0.8, mec="k", mew=0.5,
                label=f"C = {_fmt(entry['budget'])}")
        for e in effects:
            if e["shape"] not in top or abs(e["effect"]) > abs(top[e["shape"]]["effect"]):
                top[e["shape"]] = e
    for i, e in enumerate(sorted(top.values(), key=lambda e: e["N"])):
        ax.annotate(e["shape"], (e["N"], e["effect"]), fontsize=6, xytext=(2, 4 if i % 2 == 0 else -9),
                    textcoords="offset points")
    ax.axhline(0, color="0.5", lw=0.6)
    _log_n_axis(ax)
    ax.set_ylabel(f"shape effect ({unit})")
    ax.set_title("shape effects shared by every recipe\n(departure from a curve smooth in N)", fontsize=9)
    ax.legend(fontsize=7)


# ---------------------------------------------------------------------------------------------
# 4-7: training dynamics
# ---------------------------------------------------------------------------------------------


def _size_label(n: float) -> str:
    return f"N = {n / 1e6:.3g}M" if n >= 1e5 else f"N = {n / 1e3:.3g}k"


def training_curves(curves: pd.DataFrame, stem: str | Path, unit: str = "nats/token",
                    recipes: Sequence[str] | None = None) -> Figure:
    """Figure 4: training loss vs tokens, one colour per recipe, one panel per size (mean ± sd over seeds).

    Each run's logged loss is smoothed by a centred moving average over 1/20 of its points (the
    per-batch noise at these batch sizes is larger than the gaps between precisions); the y-axis
    starts after the first tenth of training, where the recipes separate. Circles are the
    validation losses the curves hold (each run's evaluations of its trunk, after its cooldown).
    recipes: the study's recipe list, which fixes each recipe's colour (figure_base.recipe_style)."""
    df = curves.dropna(subset=["loss", "tokens", "N", "recipe"]).sort_values(["run_id", "tokens"]).copy()
    df["smoothed"] = df.groupby("run_id")["loss"].transform(
        lambda s: s.rolling(max(1, len(s) // 20), center=True, min_periods=1).mean())
    df["panel"] = [_size_label(n) for n in df["N"]]
    panels = [_size_label(n) for n in sorted(df["N"].unique())]
    order, colours = recipe_palette(df, recipes)
    grid = _band_relplot(df, "tokens", "smoothed", "recipe", order, colours, "panel", panels, "sd",
                         col_wrap=min(3, len(panels)), height=3.2, aspect=1.2, facet_kws={"sharey": False, "sharex": False})
    evals = df.dropna(subset=["val_loss"]) if "val_loss" in df.columns else df.iloc[:0]
    for panel, ax in grid.axes_dict.items():
        mine = df[df["panel"] == panel]
        late = mine[mine["tokens"] >= 0.1 * mine["tokens"].max()]["smoothed"]
        points = evals[evals["panel"] == panel]
        for recipe, grp in points.groupby("recipe"):
            ax.scatter(grp["tokens"], grp["val_loss"], s=18, color=colours.get(recipe, "0.5"), edgecolor="k",
                       linewidth=0.5, zorder=3)
        values = pd.concat([late, points["val_loss"]])
        if len(values):
            pad = 0.03 * (values.max() - values.min() + 1e-9)
            ax.set_ylim(values.min() - pad, values.max() + pad)
    grid.set_axis_labels("tokens seen", loss_label(unit, "training") + ", smoothed")
    grid.set_titles("{col_name}")
    grid.figure.suptitle(TITLES[4], y=1.03)
    caption = (f"{df['run_id'].nunique()} runs, {len(order)} recipes, {len(panels)} model sizes; lines are the "
               "training loss (moving average over 1/20 of each run), mean over seeds with ± 1 sd bands; circles "
               "are validation losses (after the cooldown).")
    return _figure(4, Path(stem), grid.figure, caption)


def _band_relplot(df: pd.DataFrame, x: str, y: str, hue: str, hue_order: Sequence[str], palette: dict, col: str,
                  col_order: Sequence[str], band: str, **kwargs: Any) -> sns.FacetGrid:
    """A line per `hue` per panel (`col`) with a band: `band` "sd" the mean ± 1 sd over the rows at each x,
    "iqr" the median and the interquartile range. Aggregated once with a vectorised groupby and drawn as
    given (seaborn's own aggregation applies a Python function per x per line: minutes on long curves)."""
    keys = [col, hue, x]
    groups = df.groupby(keys, sort=True)[y]
    if band == "sd":
        agg = pd.concat([groups.mean().rename("center"), groups.std().rename("spread")], axis=1).reset_index()
        agg["lo"], agg["hi"] = agg["center"] - agg["spread"], agg["center"] + agg["spread"]
    else:
        agg = pd.concat([groups.median().rename("center"), groups.quantile(0.25).rename("lo"),
                         groups.quantile(0.75).rename("hi")], axis=1).reset_index()
    grid = sns.relplot(data=agg, x=x, y="center", hue=hue, hue_order=list(hue_order), palette=palette, col=col,
                       col_order=list(col_order), kind="line", estimator=None, **kwargs)
    for panel, ax in grid.axes_dict.items():
        for name in hue_order:
            part = agg[(agg[col] == panel) & (agg[hue] == name)]
            if part[["lo", "hi"]].notna().all(axis=1).any():
                ax.fill_between(part[x], part["lo"], part["hi"], color=palette.get(name, "0.5"), alpha=0.2, linewidth=0)
    return grid


def granularity_format(results: pd.DataFrame, stem: str | Path, unit: str = "nats/token") -> Figure:
    """Figure 5: final validation loss per granularity (x) and precision (colour), one panel per scale timing."""
    df = with_precision(final_rows(results))
    df = df[df["P"].isin([8, 6, 4])]
    # only the sizes where the scaling scheme was actually varied (a ladder adds nothing here)
    schemes = df.groupby("N")[["granularity", "scaling"]].apply(lambda g: len(g.drop_duplicates()))
    df = df[df["N"].isin(schemes[schemes > 1].index)]
    order = [g for g in GRANULARITY_ORDER if g in set(df["granularity"])] + \
        sorted(set(df["granularity"]) - set(GRANULARITY_ORDER))
    timings = [t for t in ("current", "delayed") if t in set(df["scaling"])] + sorted(set(df["scaling"]) - {"current", "delayed"})
    palette = palette_for(df["precision"])
    row = "panel_N" if df["N"].nunique() > 1 else None
    row_order = [_size_label(n) for n in sorted(df["N"].unique())] if row else None
    if row:
        df["panel_N"] = [_size_label(n) for n in df["N"]]
    grid = sns.catplot(data=df, x="granularity", y="val_loss", order=order, hue="precision", hue_order=list(palette),
                       palette=palette, col="scaling", col_order=timings, row=row, row_order=row_order, kind="point", errorbar="sd",
                       dodge=0.3, markers="o", linestyles="none", height=3.4, aspect=1.2,
                       sharey="row" if row else True)  # "row" sharing with a single row draws nothing (seaborn 0.13)
    grid.set_axis_labels("scaling granularity", f"final {loss_label(unit)}")
    grid.set_titles("{col_name} scaling" if row is None else "{row_name}, {col_name} scaling")
    grid.figure.suptitle(TITLES[5], y=1.03)
    seeds = df.groupby(["precision", "granularity", "scaling"])["seed"].nunique() if "seed" in df.columns else None
    caption = (f"{df['run_id'].nunique()} runs, {_range_text_int(seeds) if seeds is not None else 1} seed(s) per scheme; "
               "points are means over seeds, bars ± 1 sd. Each scheme against per-tensor scaling, with "
               "simultaneous CIs: REPORT.md, 'Scaling granularity and scale timing'.")
    return _figure(5, Path(stem), grid.figure, caption)


def _range_text_int(counts: pd.Series) -> str:
    lo, hi = int(counts.min()), int(counts.max())
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def amax_distributions(amax: pd.DataFrame, stem: str | Path) -> Figure:
    """Figure 6: per-tensor amax and per-block amax quantiles vs tokens, one panel per tensor role.

    `amax` is the tidy table of curves.amax_long (role, granularity, stat, amax per run and step);
    lines are the median over runs, bands the interquartile range. The y axis is symlog so a
    per-block amax of exactly 0 (an all-zero block) is drawn, not dropped.
    """
    df = amax.copy()
    x = "tokens" if "tokens" in df.columns and df["tokens"].notna().all() else "step"
    df["series"] = np.where(df["granularity"] == "tensor", "per tensor (amax)", "per block: " + df["stat"].astype(str))
    series = ["per tensor (amax)"] + sorted(s for s in df["series"].unique() if s != "per tensor (amax)")
    roles = [r for r in ("weight", "activation", "grad", "attention") if r in set(df["role"])]
    roles += sorted(set(df["role"]) - set(roles))
    shown = [s for s in series if s in set(df["series"])]
    grid = _band_relplot(df, x, "amax", "series", shown, dict(zip(shown, sns.color_palette(n_colors=len(shown)))),
                         "role", roles, "iqr", height=3.2, aspect=1.15, facet_kws={"sharey": False})
    for role, ax in grid.axes_dict.items():
        values = df.loc[df["role"] == role, "amax"]
        positive = values[values > 0]
        if (values == 0).any() and len(positive):  # zeros have no log: linear below the smallest nonzero
            ax.set_yscale("symlog", linthresh=float(positive.min()))
            ax.set_ylim(bottom=-0.3 * float(positive.min()))  # a magnitude: only a margin below 0, so a line at 0 shows
        elif len(positive):
            ax.set_yscale("log")
        ax.set_xscale("log")
    grid.set_axis_labels("tokens seen" if x == "tokens" else "training step", "amax (absolute value, linear units)")
    grid.set_titles("{col_name}")
    grid.figure.suptitle(TITLES[6], y=1.03)
    parts = []
    for role in roles:  # each role on its own scale: a gradient's amax is orders of magnitude below a weight's
        of_role = df[df["role"] == role]
        tensor, block = (of_role.loc[of_role["granularity"] == g, "amax"] for g in ("tensor", "block"))
        text = f"{role}: per-tensor amax {_span(tensor)}" if len(tensor) else f"{role}: no per-tensor amax"
        if len(block):
            minima = of_role.loc[(of_role["granularity"] == "block") & (of_role["stat"] == "min"), "amax"]
            text += f", per-block amax {_span(block)}"
            if len(minima):
                text += f" ({np.mean(minima == 0):.0%} of logged smallest-block amax exactly 0"
                if role == "grad" and (minima == 0).any():
                    text += (": the qkv projection's output gradient, whose query part is zero at each sequence's "
                             "first position, where the query attends to one key and the softmax cannot change")
                text += ")"
        parts.append(text)
    caption = "; ".join(parts) if parts else "no amax logged"
    return _figure(6, Path(stem), grid.figure, caption + ".")


def _span(values: pd.Series) -> str:
    low, high = f"{values.min():.3g}", f"{values.max():.3g}"
    return low if low == high else f"{low}–{high}"


# Largest-activation columns, best first: the SwiGLU product (the down-projection input, where Fishman et al.
# 2024 find the outliers that Smooth-SwiGLU tames; logged before the smoothing scale), the residual
# stream, the quantised activation role.
OUTLIER_COLUMNS = {"swiglu_max": "largest |SwiGLU output| (linear units)",
                   "act_max": "largest |residual activation| (linear units)",
                   "activation_amax": "largest |GEMM input activation| (linear units)"}


def outlier_column(curves: pd.DataFrame) -> str | None:
    """The curve column holding the largest activation magnitude (see OUTLIER_COLUMNS)."""
    return next((c for c in OUTLIER_COLUMNS if c in curves.columns and curves[c].notna().any()), None)


def outliers(curves: pd.DataFrame, stem: str | Path, unit: str = "nats/token") -> Figure:
    """Figure 7: largest activation magnitude (top row) and training loss (bottom row) vs tokens, one column
    per recipe (and learning rate, when the sweep varies it), Smooth-SwiGLU off and on in each panel."""
    column = outlier_column(curves)
    df = curves.dropna(subset=[column, "tokens", "recipe", "smooth_swiglu"]).copy()
    df["Smooth-SwiGLU"] = np.where(df["smooth_swiglu"].astype(bool), "on", "off")
    if "base_lr" in df.columns and df["base_lr"].nunique() > 1:  # one column per recipe and learning rate
        df["recipe"] = df["recipe"].astype(str) + ", lr " + df["base_lr"].map(lambda v: f"{v:g}")
    order, _ = recipe_palette(df)
    colours = {"off": "#4d4d4d", "on": "#d62728"}
    fig, axes = plt.subplots(2, len(order), figsize=(3.2 * len(order) + 0.6, 5.6), sharex=True, sharey="row",
                             squeeze=False)
    for j, recipe in enumerate(order):
        part = df[df["recipe"] == recipe]
        for i, (y, label) in enumerate(((column, OUTLIER_COLUMNS[column]), ("loss", loss_label(unit, "training")))):
            ax = axes[i, j]
            sns.lineplot(data=part, x="tokens", y=y, hue="Smooth-SwiGLU", hue_order=["off", "on"], palette=colours,
                         errorbar="sd", ax=ax, legend=(i, j) == (0, len(order) - 1))
            ax.set_xscale("log")
            ax.set_ylabel(label if j == 0 else "")
            ax.set_xlabel("tokens seen" if i == 1 else "")
            if i == 0:
                ax.set_yscale("log")
                ax.set_title(recipe, fontsize=9)
    fig.suptitle(TITLES[7], fontsize=10)
    fig.tight_layout()
    peaks = df.groupby("Smooth-SwiGLU")[column].max()
    caption = f"peak {OUTLIER_COLUMNS[column].split(' (')[0]} " + ", ".join(f"{_fmt(v)} with Smooth-SwiGLU {k}" for k, v in peaks.items())
    final = final_loss_by(df, "Smooth-SwiGLU")
    caption += "; final training loss " + ", ".join(f"{v:.4g} ({k})" for k, v in final.items()) + "."
    return _figure(7, Path(stem), fig, caption)


def final_loss_by(curves: pd.DataFrame, column: str) -> pd.Series:
    last = curves.sort_values("step").groupby("run_id").tail(1)
    return last.groupby(column)["loss"].mean()


# ---------------------------------------------------------------------------------------------
# All figures
# ---------------------------------------------------------------------------------------------


def with_base_lr(curves: pd.DataFrame, results: pd.DataFrame | None) -> pd.DataFrame:
    """Curves with each run's configured learning rate (`base_lr`, from the results table): the
    curves' own `lr` column is the scheduled value at each step."""
    if results is None or "lr" not in results.columns or "run_id" not in curves.columns:
        return curves
    return curves.assign(base_lr=curves["run_id"].map(results.drop_duplicates("run_id").set_index("run_id")["lr"]))


def make_figures(results: pd.DataFrame | None, fit: FitResult | None, out_dir: str | Path, *, curves: pd.DataFrame | None = None,
                 facts: dict | None = None, plan_table: pd.DataFrame | None = None) -> list[Figure | Skipped]:
    """Every figure whose inputs are present, in number order (1-7, 9, 10: there is no figure 8); a `Skipped`
    (with its reason) for the rest. facts: scaling.study.analysis.findings.findings of the results (computed
    here when absent): figure 1 draws its IsoFLOP analyses, figure 2 its largest budget under its cost model,
    figure 10 its per-chip verdicts (`cost_models`). plan_table: accepted and not drawn (the cluster table is
    REPORT's cluster section, written by the report writer)."""
    out_dir = Path(out_dir)
    results = validate_results(results) if results is not None else None
    curves = curves_lib.validate_curves(curves) if curves is not None else None
    stem = {n: out_dir / s for n, s in STEMS.items()}
    # each figure reads its own part of a multi-sweep study (see study_part)
    main = study_part(results, "main")
    grain = study_part(results, "granularity")
    main_curves = study_part(curves, "main")
    outlier_curves = study_part(curves, "outliers")
    if outlier_curves is not None:
        outlier_curves = with_base_lr(outlier_curves, results)
    amax_curves = main_curves if _need_amax(main_curves) is None else curves
    if facts is None and main is not None and not main.empty:
        facts = findings_lib.findings(main, fit)
    analysed = [b for b in (facts or {}).get("budgets", []) if any(e["parabola"] for e in b["recipes"])]
    cost_name = analysed[0]["cost_model"] if analysed else "bits"
    unit = (facts or {}).get("loss_unit", "nats/token")
    # figure 2 needs a bits axis: the chosen law's, or the within-noise law its selection stored for one
    iso_fit = profile.profile_source(fit)[0] if fit is not None else None
    law_missing = _need(fit=fit) or laws.get(iso_fit.law).no_bits_reason
    largest = max([b["budget"] for b in (facts or {}).get("budgets", [])]
                  + [p["compute"] for p in (facts or {}).get("P_star", []) or []], default=None)
    if largest is None and main is not None and not main.empty and "flops_fprop" in main.columns:
        largest = float(analysis.with_cost(main, compute.get(cost_name))["C"].max())
    # one recipe list for every figure, so a recipe has one style in all of them (figure_base.recipe_style)
    study = recipe_order(main["recipe"].dropna().astype(str)) if main is not None and "recipe" in main.columns else None
    bits = role_bits(main)
    cost_models = (facts or {}).get("cost_models")
    jobs: list[tuple[int, str | None, Callable[[], Figure]]] = [
        (1, None if analysed else "no budget with IsoFLOP profiles (3+ sizes of 2+ recipes landing on it)",
         lambda: isoflop_profiles([(b, analysis.points_at(main, b["budget"], compute.get(cost_name))) for b in analysed],
                                  stem[1], unit, recipes=study, bits=bits)),
        (2, law_missing or (None if largest else "no compute budget (results without FLOPs by part)"),
         lambda: iso_loss(iso_fit, largest, stem[2], optimal.Cost(model=compute.get(cost_name), share=optimal.share_of(fit)),
                          unit, chosen=fit.law)),
        (3, _need(fit=fit, results=main), lambda: fitted_vs_observed(fit, main, stem[3], heldout_mask(fit, main), unit,
                                                                     recipes=study, bits=bits)),
        (4, _need_curves(main_curves, ("tokens", "N", "recipe")),
         lambda: training_curves(main_curves, stem[4], unit, recipes=study)),
        (5, _no_granularity_sweep(results) or _need_granularity(grain), lambda: granularity_format(grain, stem[5], unit)),
        (6, _need_amax(amax_curves), lambda: amax_distributions(curves_lib.amax_long(amax_curves), stem[6])),
        (7, _need_outliers(outlier_curves), lambda: outliers(outlier_curves, stem[7], unit)),
        (9, _need(fit=fit, results=main), lambda: residuals(*findings_lib.residuals_by_recipe(main, fit), fit, stem[9], unit,
                                                            recipes=study)),
        (10, None if cost_models and cost_models.get("chips") else
         "the findings have no per-chip verdicts (cost_models: a study with matched-token gaps to a reference recipe)",
         lambda: chip_verdicts(cost_models, stem[10], unit, recipes=study, bits=bits)),
    ]
    made: list[Figure | Skipped] = []
    for number, missing, draw in jobs:
        if not missing:
            try:
                made.append(draw())
                continue
            except ConfigError as e:  # what these data cannot support costs its figure, never the report
                plt.close("all")
                missing = f"it could not be drawn from these data ({e})"
        made.append(Skipped(number, TITLES[number], missing))
    return made


def _need(**inputs: Any) -> str | None:
    absent = [name for name, value in inputs.items() if value is None or (hasattr(value, "__len__") and len(value) == 0)]
    words = {"fit": "no fitted law (--fit)", "results": "no results"}
    return "; ".join(words[a] for a in absent) or None


def _need_curves(curves: pd.DataFrame | None, columns: Sequence[str]) -> str | None:
    if curves is None or curves.empty:
        return "no per-step curves (--curves)"
    missing = [c for c in columns if c not in curves.columns or curves[c].isna().all()]
    return f"curves lack {', '.join(missing)}" if missing else None


def _no_granularity_sweep(results: pd.DataFrame | None) -> str | None:
    """A study with named sweeps but no granularity sweep: its recipes differ in format, size and tokens
    at once, so their final losses say nothing about the scale scheme."""
    if results is not None and "sweep" in results.columns and \
            not (analysis.sweep_family(results["sweep"]) == "granularity").any():
        return "the results hold no granularity sweep (scale schemes compared at one size and token count)"
    return None


def _need_granularity(results: pd.DataFrame | None) -> str | None:
    if results is None or results.empty or "granularity" not in results.columns or "scaling" not in results.columns:
        return "no results with granularity and scaling columns"
    low = results[results["P"].isin([8, 6, 4])]
    if low.empty or low.groupby("N")[["granularity", "scaling"]].apply(lambda g: len(g.drop_duplicates())).max() < 2:
        return "results have no model size trained with two or more scaling schemes at FP8/FP6/FP4"
    return None


def _need_amax(curves: pd.DataFrame | None) -> str | None:
    missing = _need_curves(curves, ())
    if missing:
        return missing
    if curves_lib.amax_long(curves).empty:
        return "curves carry no amax telemetry (<role>_amax, <role>_block_amax_<stat>)"
    return None


def _need_outliers(curves: pd.DataFrame | None) -> str | None:
    missing = _need_curves(curves, ("tokens", "smooth_swiglu", "recipe"))
    if missing:
        return missing
    if outlier_column(curves) is None:
        return f"curves carry no activation magnitude ({', '.join(OUTLIER_COLUMNS)})"
    if curves["smooth_swiglu"].dropna().astype(bool).nunique() < 2:
        return "curves have no runs both with and without Smooth-SwiGLU"
    return None
