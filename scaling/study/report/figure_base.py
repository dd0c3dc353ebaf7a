"""What every figure module shares: the Figure and Skipped records, the nine figures' titles and file
stems, precision labels and colours, the axis helpers, and `_save`, the one place a figure is written.

scaling.study.report.plots draws the figures of measured data and lists all nine (`make_figures`);
scaling.study.report.law_plots draws those of a fitted law. Imports flow one way: figure_base <- law_plots <-
plots. A test that stops figures being written patches `figure_base._save`, which every figure's
`_figure` calls.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import matplotlib

matplotlib.use("Agg")  # figures are files; never open a window (CI, ssh, Ray workers)

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

PRECISION_ORDER = ("FP32", "BF16", "FP16", "FP8", "FP6", "FP4")
# colorblind-safe; BF16 (the reference) grey, so it is never mistaken for FP8's vermillion
PALETTE = dict(zip(PRECISION_ORDER, [sns.color_palette("colorblind", 10)[i] for i in (0, 7, 2, 3, 4, 5)]))


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


def _fmt(x: float) -> str:
    """3 significant digits, exponent without '+': 1.2e+18 -> '1.2e18'."""
    return f"{x:.3g}".replace("e+", "e")


# ---------------------------------------------------------------------------------------------
# Axes
# ---------------------------------------------------------------------------------------------


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
