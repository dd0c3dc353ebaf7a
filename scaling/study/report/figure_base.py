"""What every figure module shares: the Figure and Skipped records, the figures' titles and file stems,
precision labels and colours, each recipe's one style (`recipe_style`) and label (`recipe_label`), the axis
helpers, and `_save`, the one place a figure is written.

scaling.study.report.plots draws the figures of measured data and lists all nine (`make_figures`);
scaling.study.report.law_plots draws those of a fitted law and scaling.study.report.chip_plots the per-chip
answer. Imports flow one way: figure_base <- law_plots, chip_plots <- plots. A test that stops figures being written patches `figure_base._save`, which every figure's
`_figure` calls.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

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
    9: "Where the law is biased: residuals by recipe",
    10: "On each chip: every recipe's best loss at each budget",
}
# Figure 8 (training time on GPU clusters) was a table drawn as an image: it is REPORT's cluster table now,
# and its number is not reused (REPORT's text and the docs cite figures by number).
STEMS = {1: "fig1_isoflop", 2: "fig2_iso_loss", 3: "fig3_fit_vs_observed", 4: "fig4_training_curves",
         5: "fig5_granularity_format", 6: "fig6_amax", 7: "fig7_outliers", 9: "fig9_residuals", 10: "fig10_chips"}



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


# ---------------------------------------------------------------------------------------------
# One style per recipe: a hue family per format family, shades and markers within it
# ---------------------------------------------------------------------------------------------

# Families in drawing order, each with its shades (hand-picked so neighbours contrast) and the name
# patterns that place a recipe in it. A recipe is placed by the narrowest format its name names
# (mxfp4-activations: FP4, what it quantises), so the patterns are tried narrowest first.
FAMILIES = ("FP32/BF16", "FP8", "FP6", "FP4", "INT", "other")
FAMILY_COLOURS = {
    "FP32/BF16": ("#000000", "#7f7f7f", "#404040", "#b0b0b0"),                      # greys and black
    "FP8": ("#1f5fbf", "#6baed6", "#08306b", "#17becf", "#3a89c9", "#9ecae1", "#2b4c7e", "#0e8fa8"),  # blues
    "FP6": ("#2ca02c", "#98d37f", "#00441b", "#41ae76", "#6b8e23", "#1b7837", "#a6dba0", "#3c6e47"),  # greens
    "FP4": ("#d62728", "#ff7f0e", "#7b3fb5", "#e377c2", "#a50f15", "#f9a65a", "#4a1486", "#c51b7d"),  # reds, oranges, purples
    "INT": ("#8c564b", "#d2a679", "#4d2a14", "#bf812d", "#a0522d", "#6b4226", "#c49c6b", "#5e3a1f"),  # browns
    "other": ("#bcbd22", "#7a7a1f", "#dbdb8d", "#4f4f0f"),                           # olives
}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")
LINESTYLES = ("-", "--", ":", "-.")
_FAMILY_PATTERNS = (("INT", r"int\d"), ("FP4", r"fp4|e2m1|quartet"), ("FP6", r"fp6|e2m3|e3m2"),
                    ("FP8", r"fp8|e4m3|e5m2"), ("FP32/BF16", r"bf16|fp16|bfloat16|float16|fp32|float32"))


def recipe_family(recipe: str) -> str:
    """The format family a recipe's name names (see FAMILIES): the narrowest it names, "other" if none."""
    name = str(recipe).lower()
    return next((family for family, pattern in _FAMILY_PATTERNS if re.search(pattern, name)), "other")


def recipe_order(recipes: Iterable[str]) -> list[str]:
    """Recipes by family (FAMILIES' order), then by name: the order figures list and draw them in."""
    return sorted({str(r) for r in recipes}, key=lambda r: (FAMILIES.index(recipe_family(r)), r))


def recipe_style(recipe: str, recipes: Iterable[str]) -> tuple[str, str, str]:
    """(colour, marker, linestyle) of `recipe` among `recipes` (the study's recipe list; `recipe` is added
    when absent): its family's hue, and the shade and marker of its place among the family's members by
    name. Deterministic from the names alone, so every figure drawn from one list styles a recipe alike;
    no two recipes of a list share (colour, marker)."""
    family = recipe_family(recipe)
    members = [r for r in recipe_order([*recipes, recipe]) if recipe_family(r) == family]
    i = members.index(str(recipe))
    shades = FAMILY_COLOURS[family]
    # the shade and the marker both advance with i, so (shade, marker) repeats only after lcm(8, 10) members
    return shades[i % len(shades)], MARKERS[i % len(MARKERS)], LINESTYLES[(i // len(shades)) % len(LINESTYLES)]


def recipe_styles(recipes: Iterable[str]) -> dict[str, tuple[str, str, str]]:
    """Every recipe's `recipe_style`, in `recipe_order`."""
    recipes = recipe_order(recipes)
    return {r: recipe_style(r, recipes) for r in recipes}


ROLE_COLUMNS = {"P_w": "weights", "P_a": "activations", "P_g": "gradients"}


def role_bits(df: pd.DataFrame | None) -> dict[str, dict[str, float]]:
    """Each recipe's bits per role ({"weights": 4, "activations": 4, "gradients": 32}) from a results table's
    P_w, P_a, P_g columns; {} without them. P, the law's bits, is the widest of these."""
    if df is None or "recipe" not in df.columns or not set(ROLE_COLUMNS) <= set(df.columns):
        return {}
    first = df.dropna(subset=list(ROLE_COLUMNS)).drop_duplicates("recipe")
    return {str(row["recipe"]): {role: float(row[col]) for col, role in ROLE_COLUMNS.items()}
            for _, row in first.iterrows()}


def recipe_label(recipe: str, bits: dict[str, float] | float | None = None) -> str:
    """A recipe's name and what it quantises: "fp8 (8-bit)" where every role has one width, "int4-fwd (4-bit
    weights, activations)" where roles differ (the roles left at 16 bits or more are not quantised, and
    are not named). bits: its role_bits entry, or one number (P) when the roles are not recorded."""
    if bits is None:
        return str(recipe)
    if not isinstance(bits, dict):
        return f"{recipe} ({float(bits):g}-bit)" if math.isfinite(float(bits)) else str(recipe)
    widths = sorted(set(bits.values()))
    if len(widths) == 1:
        return f"{recipe} ({widths[0]:g}-bit)"
    narrow = [w for w in widths if w < 16] or widths[:1]
    parts = [f"{w:g}-bit " + ", ".join(role for role, b in bits.items() if b == w) for w in narrow]
    return f"{recipe} ({'; '.join(parts)})"


def recipe_palette(df: pd.DataFrame, recipes: Iterable[str] | None = None) -> tuple[list[str], dict[str, Any]]:
    """The recipes of `df` in `recipe_order` and each one's colour (`recipe_style` among `recipes`, the
    study's list; default: df's own recipes)."""
    mine = [str(r) for r in df["recipe"].dropna().unique()]
    study = list(recipes) if recipes is not None else mine
    order = recipe_order(mine)
    return order, {r: recipe_style(r, study)[0] for r in order}


def recipe_handles(recipes: Sequence[str], study: Iterable[str], bits: dict | None = None, **kwargs: Any) -> list[Any]:
    """Legend handles: each recipe's marker and colour (and its line), labelled by `recipe_label`."""
    study = list(study)
    handles = []
    for r in recipes:
        colour, marker, ls = recipe_style(r, study)
        handles.append(matplotlib.lines.Line2D([], [], color=colour, marker=marker, ls=ls, mec="k", mew=0.5,
                                               label=recipe_label(r, (bits or {}).get(r)), **kwargs))
    return handles


def _legend_inches(entries: int, ncol: int = 4) -> float:
    """The height a legend of `entries` recipes in `ncol` columns at fontsize 8 takes under the panels."""
    return 0.2 * math.ceil(entries / ncol) + 0.15


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
