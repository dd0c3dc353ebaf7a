"""Every figure of the report, from results, curves and a fitted law alone (`scaling figures`).

One function per figure; each takes DataFrames / a fit and an output path stem, writes
<stem>.png and <stem>.pdf (atomically) and returns a `Figure` (paths and a caption written from
the data). `make_figures` runs them all: a figure whose input is absent is skipped with a
one-line note; malformed input (a table without the columns it must have, a fit file that
does not parse) raises `ConfigError`.

  1 isoflop_profiles    the direct measurement (scaling.study.analysis.isoflop): per budget C, each recipe's
                        loss at exactly C against N, its parabola in log N and its minimum with
                        the bootstrap CI; the verdict (winner, or why none)
  2 iso_loss            the law's L(N, D(C, N, P), P) over (N, P) at fixed C under the findings'
                        cost model, with the frontier N*(P)
  3 fitted_vs_observed  predicted vs measured loss, y = x, held-out points marked
  4 training_curves     training loss vs tokens per recipe, one panel per model size
  5 granularity_format  final validation loss per scaling granularity × format × scale timing
  6 amax_distributions  per-tensor amax vs per-block amax quantiles over training, per role
  7 outliers            largest activation magnitude and loss with and without Smooth-SwiGLU
  8 cluster_table       training days on GPU clusters from `scaling.plan.cluster`
  9 residuals           observed - fitted loss per recipe against N, with each recipe's mean and CI
                        (scaling.study.findings.residuals_by_recipe): where the law is biased

Analysis lives in scaling.study.analysis; this module only draws what it computes. It stays one
module (about 830 lines) on purpose: nine figure functions of 40-100 lines each, independent of one
another, sharing one style, palette and the Figure/Skipped records; the list above is its table of
contents.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import matplotlib

matplotlib.use("Agg")  # figures are files; never open a window (CI, ssh, Ray workers)

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from scaling.study import laws, optimal, analysis
from scaling.study import findings as findings_lib
from scaling.study import optimum_check, profile
from scaling.train import compute
from scaling import plan
from scaling.study import curves as curves_lib  # noqa: E402
from scaling.errors import ConfigError  # noqa: E402
from scaling.study.analysis import study_part  # noqa: E402
from scaling.study.findings import final_rows  # noqa: E402  (each figure reads its own study part)

PRECISION_ORDER = ("FP32", "BF16", "FP16", "FP8", "FP6", "FP4")
# colorblind-safe; BF16 (the reference) grey, so it is never mistaken for FP8's vermillion
PALETTE = dict(zip(PRECISION_ORDER, [sns.color_palette("colorblind", 10)[i] for i in (0, 7, 2, 3, 4, 5)]))
GRANULARITY_ORDER = ("tensor", "channel", "block", "block2d", "mx", "nvfp4")
# The continuous precision grid of the law's curves (bits, log-spaced).
P_GRID = np.geomspace(3.0, 32.0, 48)
RESULTS_REQUIRED = ("run_id", "N", "D", "P", "val_loss")


@dataclass(frozen=True)
class Figure:
    """A written figure: its number, file stem, the PNG and PDF paths and a caption from the data."""

    number: int
    title: str
    png: Path
    pdf: Path
    caption: str


@dataclass(frozen=True)
class Skipped:
    number: int
    title: str
    reason: str


TITLES = {
    1: "IsoFLOP profiles: loss vs model size per recipe at fixed compute",
    2: "Iso-loss contours over (N, P) at fixed compute",
    3: "Fitted vs observed loss",
    4: "Training curves per precision and size",
    5: "Scaling granularity × format",
    6: "amax per tensor vs per block over training",
    7: "Outliers with and without Smooth-SwiGLU",
    8: "Training time on GPU clusters",
    9: "Where the law is biased: residuals by recipe",
}
STEMS = {1: "fig1_isoflop", 2: "fig2_iso_loss", 3: "fig3_fit_vs_observed", 4: "fig4_training_curves",
         5: "fig5_granularity_format", 6: "fig6_amax", 7: "fig7_outliers", 8: "fig8_cluster_time",
         9: "fig9_residuals"}


# ---------------------------------------------------------------------------------------------
# Labels, colours, saving
# ---------------------------------------------------------------------------------------------


def loss_label(unit: str = "nats/token", kind: str = "validation") -> str:
    """An axis label for a loss in `unit` (findings.loss_unit: nats/byte for byte-tokenised corpora)."""
    return f"{kind} loss ({unit})"


def precision_label(bits: float, fmt: Any = None, recipe: Any = None) -> str:
    """FP32 / BF16 / FP16 / FP8 / FP6 / FP4 from a run's bits and format; INTk and 'P-bit' otherwise."""
    names = f"{fmt or ''} {recipe or ''}".lower()
    if bits is None or (isinstance(bits, float) and math.isnan(bits)):
        return "unknown"
    bits = float(bits)
    if "int" in names:
        return f"INT{bits:g}"
    if bits == 16:
        return "FP16" if "fp16" in names else "BF16"
    if bits in (32, 8, 6, 4):
        return f"FP{bits:g}"
    return f"{bits:g}-bit"


def with_precision(df: pd.DataFrame) -> pd.DataFrame:
    """A copy with a `precision` label column (see `precision_label`)."""
    df = df.copy()
    fmt = df["format"] if "format" in df.columns else pd.Series([None] * len(df), index=df.index)
    rec = df["recipe"] if "recipe" in df.columns else pd.Series([None] * len(df), index=df.index)
    df["precision"] = [precision_label(p, f, r) for p, f, r in zip(df["P"], fmt, rec)]
    return df


def precision_order(labels: Iterable[str]) -> list[str]:
    """Named precisions in PRECISION_ORDER first, the rest (INT4, 12-bit, ...) by bits descending."""
    labels = set(labels)
    known = [p for p in PRECISION_ORDER if p in labels]

    def bits(label: str) -> float:
        digits = "".join(ch for ch in label if ch.isdigit() or ch == ".")
        return float(digits) if digits else 0.0

    return known + sorted(labels - set(known), key=lambda s: (-bits(s), s))


def palette_for(labels: Iterable[str]) -> dict[str, Any]:
    order = precision_order(labels)
    extra = iter(sns.color_palette("dark", max(1, len(order))))
    return {label: PALETTE[label] if label in PALETTE else next(extra) for label in order}


def recipe_palette(df: pd.DataFrame) -> tuple[list[str], dict[str, Any]]:
    """Recipes ordered by bits descending; recipes of one precision family share its colour in shades."""
    runs = with_precision(df.drop_duplicates("recipe"))
    fam = palette_for(runs["precision"])
    order, colours = [], {}
    for label in fam:
        recipes = sorted(runs.loc[runs["precision"] == label, "recipe"].astype(str))
        shades = sns.dark_palette(fam[label], n_colors=len(recipes) + 1, reverse=True)[: len(recipes)] \
            if len(recipes) > 1 else [fam[label]]
        for recipe, shade in zip(recipes, shades):
            order.append(recipe)
            colours[recipe] = shade
    return order, colours


def _save(fig: plt.Figure, stem: Path) -> tuple[Path, Path]:
    """<stem>.png and <stem>.pdf, each written to a temp file in the same directory then renamed."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in ("png", "pdf"):
        path = stem.with_suffix(f".{ext}")
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        try:
            # no creation date: regenerated figures differ only where the data do
            metadata = {"CreationDate": None} if ext == "pdf" else {}
            fig.savefig(tmp, format=ext, dpi=150, bbox_inches="tight", metadata=metadata)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        paths.append(path)
    plt.close(fig)
    return paths[0], paths[1]


def _figure(number: int, stem: Path, fig: plt.Figure, caption: str) -> Figure:
    png, pdf = _save(fig, stem)
    return Figure(number, TITLES[number], png, pdf, caption)


def _bits_axis(ax: plt.Axes, lo: float, hi: float) -> None:
    ax.set_xscale("log", base=2)
    ticks = [t for t in (3, 4, 5, 6, 8, 10, 12, 16, 24, 32) if lo <= t <= hi]
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlim(lo / 1.06, hi * 1.06)  # a margin, so markers at the end precisions are drawn whole


def _fmt(x: float) -> str:
    """3 significant digits, exponent without '+': 1.2e+18 -> '1.2e18'."""
    return f"{x:.3g}".replace("e+", "e")


# ---------------------------------------------------------------------------------------------
# Inputs: results, fit adapters, compute budgets
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


def param_samples(fit: Any) -> list[dict]:
    """The bootstrap's per-resample parameter sets (empty when the fit was made without a bootstrap)."""
    samples = getattr(fit, "samples", None)
    return [] if samples is None or len(samples) == 0 else samples.to_dict("records")


def precision_grid(fit: Any) -> np.ndarray:
    """Bits to draw L*(P) at: log-spaced in 3-32 bits, or the integers 3..32 for laws on (E, M) bits."""
    if {"ebits", "mbits"} <= set(laws.get(fit.law).columns):
        return np.arange(3.0, 33.0)
    return P_GRID


def optimum(fit: Any, compute: float, precisions: Sequence[float] | None = None, params: dict | None = None,
            n_range: tuple[float, float] = (1.0, np.inf), cost: Any = None) -> dict:
    """scaling.study.optimal.optimal_precision: the best (P, N, D, loss) and the per_precision table."""
    return optimal.optimal_precision(fit, compute=compute, precisions=None if precisions is None else list(precisions),
                                     params=params, n_range=n_range, **({"cost": cost} if cost is not None else {}))


def fitted_sizes(fit: Any) -> tuple[float, float] | None:
    """The (smallest, largest) N the law was fitted on, from the fit's data summary; None if not recorded."""
    data = (fit.get("data") if isinstance(fit, dict) else getattr(fit, "data", None)) or {}
    n = data.get("columns", {}).get("N", {})
    return (float(n["min"]), float(n["max"])) if "min" in n and "max" in n else None


def loss_vs_precision(fit: Any, compute: float, bits: Sequence[float] | None = None, params: dict | None = None,
                      cost: Any = None) -> pd.DataFrame:
    """L*(P; C): for each P the cost-model-optimal N, D and loss (scaling.study.optimal's per_precision table)."""
    bits = precision_grid(fit) if bits is None else bits
    table = optimum(fit, compute, bits, params, cost=cost)["per_precision"]
    return table.sort_values("P").reset_index(drop=True)


# ---------------------------------------------------------------------------------------------
# 1: the direct measurement; 2-3, 9: the law
# ---------------------------------------------------------------------------------------------


SHARED_LEGEND_FROM = 5  # recipes; more share one legend under the panels


def _count_label(value: float, _pos: object = None) -> str:
    """20k, 100k, 2M: a parameter count as an axis label."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:g}{suffix}"
    return f"{value:g}"


def _log_n_axis(ax: Any) -> None:
    """A log N x-axis with ticks at 1, 2 and 5 per decade labelled 20k / 100k / 2M: a profile spans
    less than a decade, so the default decade ticks would leave it unlabelled."""
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_count_label))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("non-embedding parameters N")


def isoflop_profiles(points: Sequence[tuple[dict, pd.DataFrame]], stem: str | Path, unit: str = "nats/token") -> Figure:
    """Figure 1: per budget (a analysis.isoflop entry and its analysis.points_at rows), each recipe's loss
    against N (less its shape's shared effect), its shape-adjusted parabola in log N and its minimum with
    the bootstrap CI; where shapes are shared, a last panel with the shape effects."""
    shaped = any(entry.get("shape_effects") for entry, _ in points)
    fig, axes = plt.subplots(1, len(points) + shaped, figsize=(5.2 * (len(points) + shaped), 4.4), squeeze=False)
    recipes = sorted({e["recipe"] for entry, _ in points for e in entry["recipes"]})
    colours = dict(zip(recipes, sns.color_palette("colorblind", len(recipes))))
    captions = []
    for ax, (entry, pts) in zip(axes[0], points):
        for e in entry["recipes"]:
            g = pts[pts["recipe"] == e["recipe"]]
            colour = colours[e["recipe"]]
            # points with their shape's shared effect removed, on the same footing as the adjusted parabola
            effect = {s["shape"]: s["effect"] for s in entry.get("shape_effects") or []}
            shift = g["shape"].map(effect).fillna(0.0) if "shape" in g.columns else 0.0
            ax.scatter(g["N"], g["loss"] - shift, s=28, color=colour, edgecolor="k", lw=0.5, zorder=3,
                       label=f"{e['recipe']} ({e.get('P', float('nan')):g} bits, {e['runs']} runs)")
            if e["parabola"] is None:
                continue
            x = np.linspace(np.log(g["N"].min()), np.log(g["N"].max()), 60)
            c0, c1, c2 = e["parabola"]
            ax.plot(np.exp(x), c0 + c1 * x + c2 * x * x, color=colour, lw=1.4)
            lo, hi = e["ci"] if e["ci"] else (e["loss"], e["loss"])
            # the CI as a thick bar drawn over the star, so an interval narrower than the marker still shows
            ax.scatter([e["N_opt"]], [e["loss"]], marker="*", s=160, color=colour, edgecolor="k", zorder=4)
            ax.errorbar([e["N_opt"]], [e["loss"]], yerr=[[e["loss"] - lo], [hi - e["loss"]]], fmt="none",
                        ecolor="k", elinewidth=2.2, capsize=5, capthick=1.6, zorder=5)
        _log_n_axis(ax)
        ax.set_ylabel(f"validation loss ({unit})")
        verdict = f"winner: {entry['winner']}" if entry["winner"] else "no winner"
        ax.set_title(f"C = {_fmt(entry['budget'])} ({entry['cost_model']} cost model)\n{verdict}", fontsize=9)
        if len(recipes) <= SHARED_LEGEND_FROM:
            ax.legend(fontsize=7, loc="upper left")
        captions.append(f"at C = {_fmt(entry['budget'])}: {entry['reason'] or 'no analysis'}")
    if shaped:
        _shape_effects_panel(axes[0][-1], [entry for entry, _ in points], unit)
    level = next((entry.get("level") for entry, _ in points if entry.get("level")), 0.95)
    fig.suptitle(f"{TITLES[1]}\nstars: each recipe's shape-adjusted minimum, black bars its {level:.0%} bootstrap CI",
                 fontsize=10)
    if len(recipes) > SHARED_LEGEND_FROM:  # one legend under the panels: inside, it would cover the points
        bits = {e["recipe"]: e.get("P", float("nan")) for entry, _ in points for e in entry["recipes"]}  # P, as the law sees it
        handles = [matplotlib.lines.Line2D([], [], color=colours[r], marker="o", mec="k", mew=0.5, lw=1.4,
                                           label=f"{r} ({bits[r]:g} bits)") for r in recipes]
        fig.legend(handles=handles, loc="lower center", ncol=min(5, len(recipes)), fontsize=8, frameon=False)
        fig.tight_layout(rect=(0, 0.06 * math.ceil(len(recipes) / 5), 1, 1))
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


def iso_loss(fit: Any, compute: float, stem: str | Path, cost: Any = None, unit: str = "nats/token",
             chosen: str | None = None) -> Figure:
    """Figure 2: the law's loss over (N, P) at fixed C, each (N, P) given the tokens C affords it under
    `cost` (a scaling.study.optimal.Cost; default: the fit's runs' shape under the `bits` cost model);
    the frontier N*(P) and the optimum, under the verdict `scaling optimal` prints (optimum_check.verdict):
    a filled star only for an optimum that exists inside the trained runs, a hollow one labelled
    extrapolated for one outside them, none where no optimum exists (the caption says why). chosen: the
    law selection chose, where `fit` is another (profile.profile_source: the chosen law has no bits axis)."""
    cost = cost or optimal.Cost(shape=optimal.shape_of(fit))
    best = optimum(fit, compute, cost=cost)
    check = optimum_check.verdict(fit, best, cost)
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
    ax.plot(frontier["N"], frontier["P"], color="tab:red", lw=2, label="compute-optimal N*(P)")
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
    caption = (f"iso-loss contours of the fitted {fit.law} law{drawn} at C = {_fmt(compute)}; the red line is the best N for each P, "
               f"{star}"
               + (f"; hatched: the model sizes the law was fitted on ({_fmt(sizes[0])}–{_fmt(sizes[1])})." if sizes else "."))
    return _figure(2, Path(stem), fig, caption)


def heldout_mask(fit: Any, results: pd.DataFrame) -> np.ndarray | None:
    """Which result rows the fit's held-out test predicted (None when the fit records no held-out test).

    scaling.study.fit.holdout_error holds out the rows whose split key (N, or compute 6·N·D) is >= threshold.
    """
    heldout = getattr(fit, "heldout", None)
    if not heldout or "threshold" not in heldout:
        return None
    by = heldout.get("by", "N")
    key = results["N"].to_numpy(float) * (6.0 * results["D"].to_numpy(float) if by == "compute" else 1.0)
    return key >= float(heldout["threshold"])


def heldout_predictions(fit: Any, results: pd.DataFrame, mask: np.ndarray | None) -> np.ndarray:
    """The law's prediction per row: the full fit, except held-out rows when the fit kept the params of its
    held-out fit (fitted without those rows), which then predicts them — the extrapolation test itself."""
    predicted = np.asarray(fit.predict(results), float)
    params = (getattr(fit, "heldout", None) or {}).get("params")
    if mask is not None and mask.any() and params:
        extrapolating = dataclasses.replace(fit, params={**fit.params, **params})
        predicted[mask] = np.asarray(extrapolating.predict(results[mask]), float)
    return predicted


def fitted_vs_observed(fit: Any, results: pd.DataFrame, stem: str | Path, heldout: np.ndarray | None = None,
                       unit: str = "nats/token") -> Figure:
    """Figure 3: the law's prediction against every measured loss; held-out points hollow."""
    df = with_precision(results)
    df["heldout"] = np.zeros(len(df), bool) if heldout is None else np.asarray(heldout, bool)
    df["predicted"] = heldout_predictions(fit, df, heldout)
    # without the held-out fit's params the held-out rows can only be shown with the full fit's prediction
    extrapolated = bool((getattr(fit, "heldout", None) or {}).get("params"))
    held_label = " (held out)" if extrapolated else " (held-out set, full-fit prediction)"
    palette = palette_for(df["precision"])
    fig, ax = plt.subplots(figsize=(5.4, 5.0))
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
    ax.text(0.03, 0.97, text, transform=ax.transAxes, va="top", fontsize=8)
    ax.set_xlabel(f"observed {loss_label(unit)}")
    ax.set_ylabel(f"fitted {loss_label(unit)}")
    ax.set_title(f"{TITLES[3]} ({fit.law} law, {len(df)} points)", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    caption = text + (" (no held-out split recorded in the fit)" if heldout is None else "") + "."
    return _figure(3, Path(stem), fig, caption)


def residuals(rows: pd.DataFrame, by_recipe: pd.DataFrame, fit: Any, stem: str | Path, unit: str = "nats/token") -> Figure:
    """Figure 9: each evaluation's residual (observed - fitted) against N, coloured by recipe, and
    each recipe's mean residual over runs with its CI (findings.residuals_by_recipe)."""
    recipes = list(by_recipe["recipe"])
    colours = dict(zip(recipes, sns.color_palette("colorblind", len(recipes))))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    for recipe in recipes:
        part = rows[rows["recipe"] == recipe]
        left.scatter(part["N"], part["residual"], s=16, alpha=0.7, color=colours[recipe], label=recipe)
    left.axhline(0, color="0.3", lw=1)
    _log_n_axis(left)
    left.set_ylabel(f"observed - fitted loss ({unit})")
    left.legend(fontsize=7)
    y = np.arange(len(recipes))
    right.errorbar(by_recipe["mean"], y, xerr=[by_recipe["mean"] - by_recipe["lo"], by_recipe["hi"] - by_recipe["mean"]],
                   fmt="o", color="k", capsize=3)
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
# 4-7: training dynamics
# ---------------------------------------------------------------------------------------------


def _size_label(n: float) -> str:
    return f"N = {n / 1e6:.3g}M" if n >= 1e5 else f"N = {n / 1e3:.3g}k"


def training_curves(curves: pd.DataFrame, stem: str | Path, unit: str = "nats/token") -> Figure:
    """Figure 4: training loss vs tokens, one colour per recipe, one panel per size (mean ± sd over seeds).

    Each run's logged loss is smoothed by a centred moving average over 1/20 of its points (the
    per-batch noise at these batch sizes is larger than the gaps between precisions); the y-axis
    starts after the first tenth of training, where the recipes separate. Circles are the
    validation losses the curves hold (each run's evaluations of its trunk, after its cooldown)."""
    df = curves.dropna(subset=["loss", "tokens", "N", "recipe"]).sort_values(["run_id", "tokens"]).copy()
    df["smoothed"] = df.groupby("run_id")["loss"].transform(
        lambda s: s.rolling(max(1, len(s) // 20), center=True, min_periods=1).mean())
    df["panel"] = [_size_label(n) for n in df["N"]]
    panels = [_size_label(n) for n in sorted(df["N"].unique())]
    order, colours = recipe_palette(df)
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
                text += f" ({np.mean(minima == 0):.0%} of logged smallest-block amax exactly 0)"
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
# 8: cluster time
# ---------------------------------------------------------------------------------------------

# The talk's reference runs (issue #6: name -> step-model preset, training FLOPs): inputs, not results.
REFERENCE_RUNS = {name: (model, flops) for name, (model, flops, _) in plan.TALK_TABLE.items()}
CLUSTERS = (1024, 5000, 10000)
# The budget at which the fitted law's per-precision optima are put on a cluster: a cluster-scale
# run (DeepSeek-V3's), since our CPU budgets would take microseconds there.
CLUSTER_COMPUTE = REFERENCE_RUNS["DeepSeek-V3"][1]


def cluster_time_table(fit: Any = None, compute: float = CLUSTER_COMPUTE, gpus: Sequence[int] = CLUSTERS,
                       gpu: str = "h100") -> pd.DataFrame:
    """Days on `gpus` GPUs from the step model (scaling.plan.cluster.cluster_step): the reference runs in
    BF16 and FP8 under their written-down layouts (plan.CLUSTER_RECIPES), and, given a fit, its
    compute-optimal (N, D) per precision at `compute` as dense shapes (plan.DENSE_RECIPE) at the
    hardware format for P bits."""
    rows = []
    for name, (model_name, flops) in REFERENCE_RUNS.items():
        model, recipe = plan.load_model(model_name), plan.CLUSTER_RECIPES[model_name]
        for precision in ("bf16", "fp8"):
            days = {k: plan.plan_run(flops, k, gpu, step=plan.cluster_step(model, gpu, k, precision, recipe)).days for k in gpus}
            rows.append({"run": name, "P (bits)": None, "hardware": precision, "N": None, "D": None, "FLOPs": flops,
                         **{f"days @ {k:,} GPUs": d for k, d in days.items()}})
    if fit is not None and laws.get(fit.law).bits_axis:
        best = optimum(fit, compute, [32.0, 16.0, 8.0, 6.0, 4.0])
        for point in best["per_precision"].sort_values("P", ascending=False).to_dict("records"):
            p = plan.plan_optimum(point, list(gpus), gpu)
            rows.append({"run": f"law optimum, P = {point['P']:g}", "P (bits)": point["P"], "hardware": p.hardware_precision,
                         "N": point["N"], "D": point["D"], "FLOPs": p.flops,
                         **{f"days @ {k:,} GPUs": r.days for k, r in zip(gpus, p.runs)}})
    table = pd.DataFrame(rows)
    table.attrs["gpu"] = plan.get_gpu(gpu).name
    return table


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
    """A GitHub markdown table of `table_cells`."""
    header = "| " + " | ".join(map(str, table.columns)) + " |"
    rule = "| " + " | ".join("---" for _ in table.columns) + " |"
    return "\n".join([header, rule, *("| " + " | ".join(row) + " |" for row in table_cells(table))])


def cluster_table(table: pd.DataFrame, stem: str | Path) -> Figure:
    """Figure 8: the cluster-time table drawn as a table."""
    fig, ax = plt.subplots(figsize=(1.35 * len(table.columns) + 1, 0.36 * len(table) + 1.2))
    ax.axis("off")
    drawn = ax.table(cellText=table_cells(table), colLabels=list(table.columns), loc="center", cellLoc="center")
    drawn.auto_set_font_size(False)
    drawn.set_fontsize(8)
    drawn.scale(1.0, 1.3)
    gpu = table.attrs.get("gpu", "GPU")
    ax.set_title(f"{TITLES[8]}: days on {gpu} clusters (scaling.plan.cluster step model)", fontsize=10)
    fig.tight_layout()
    return _figure(8, Path(stem), fig, f"days of training on {gpu} clusters from the op-by-op step model of each run "
                   "under a written-down layout (scaling.plan.cluster.cluster_step); FLOPs = 6·N·D.")


# ---------------------------------------------------------------------------------------------
# All figures
# ---------------------------------------------------------------------------------------------


def with_base_lr(curves: pd.DataFrame, results: pd.DataFrame | None) -> pd.DataFrame:
    """Curves with each run's configured learning rate (`base_lr`, from the results table): the
    curves' own `lr` column is the scheduled value at each step."""
    if results is None or "lr" not in results.columns or "run_id" not in curves.columns:
        return curves
    return curves.assign(base_lr=curves["run_id"].map(results.drop_duplicates("run_id").set_index("run_id")["lr"]))


def make_figures(results: pd.DataFrame | None, fit: Any, out_dir: str | Path, *, curves: pd.DataFrame | None = None,
                 facts: dict | None = None, plan_table: pd.DataFrame | None = None) -> list[Figure | Skipped]:
    """Every figure whose inputs are present, in number order; a `Skipped` (with its reason) for the rest.
    facts: scaling.study.findings.findings of the results (computed here when absent): figure 1 draws its
    IsoFLOP analyses, figure 2 its largest budget under its cost model."""
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
    jobs: list[tuple[int, str | None, Callable[[], Figure]]] = [
        (1, None if analysed else "no budget with IsoFLOP profiles (3+ sizes of 2+ recipes landing on it)",
         lambda: isoflop_profiles([(b, analysis.points_at(main, b["budget"], compute.get(cost_name))) for b in analysed],
                                  stem[1], unit)),
        (2, law_missing or (None if largest else "no compute budget (results without FLOPs by part)"),
         lambda: iso_loss(iso_fit, largest, stem[2], optimal.Cost(model=compute.get(cost_name), shape=optimal.shape_of(fit)),
                          unit, chosen=fit.law)),
        (3, _need(fit=fit, results=main), lambda: fitted_vs_observed(fit, main, stem[3], heldout_mask(fit, main), unit)),
        (4, _need_curves(main_curves, ("tokens", "N", "recipe")), lambda: training_curves(main_curves, stem[4], unit)),
        (5, _no_granularity_sweep(results) or _need_granularity(grain), lambda: granularity_format(grain, stem[5], unit)),
        (6, _need_amax(amax_curves), lambda: amax_distributions(curves_lib.amax_long(amax_curves), stem[6])),
        (7, _need_outliers(outlier_curves), lambda: outliers(outlier_curves, stem[7], unit)),
        (8, None, lambda: cluster_table(plan_table if plan_table is not None else cluster_time_table(fit), stem[8])),
        (9, _need(fit=fit, results=main), lambda: residuals(*findings_lib.residuals_by_recipe(main, fit), fit, stem[9], unit)),
    ]
    made: list[Figure | Skipped] = []
    for number, missing, draw in jobs:
        made.append(Skipped(number, TITLES[number], missing) if missing else draw())
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
