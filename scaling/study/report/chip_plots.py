"""Figure 10, the answer per chip (`chip_verdicts`): findings' `cost_models`
(scaling.study.analysis.chips.chip_verdicts) drawn, one panel per budget, in it one group per chip with each
recipe's best loss on that chip and its family-wise interval.

Apart from scaling.study.report.plots (which lists it among every figure in `make_figures` and re-exports
`chip_verdicts`): the figure reads the per-chip verdicts, not the results table, and its panel range, cut
intervals and caption are its own. What it shares with the other figures (titles, each recipe's style and
legend, saving) is scaling.study.report.figure_base's; this module imports no other figure module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")  # figures are files; never open a window (CI, ssh, Ray workers)

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from scaling.errors import ConfigError  # noqa: E402
from scaling.study.report.figure_base import (TITLES, Figure, _figure, _fmt, _legend_inches, recipe_handles,  # noqa: E402
    recipe_order, recipe_style)

CHIP_NAMES = {"bits": "bits (idealised)"}


def _chip_name(chip: str) -> str:
    return CHIP_NAMES.get(chip, chip.upper())


def chip_verdicts(cost_models: dict, stem: str | Path, unit: str = "nats/token", recipes: Sequence[str] | None = None,
                  bits: dict | None = None) -> Figure:
    """Figure 10: findings' `cost_models` (scaling.study.analysis.chips.chip_verdicts) drawn: one panel per
    budget, one group per chip, in it each recipe's best loss on that chip with loss ± z·se, z the family-wise
    z the verdicts use. Filled markers: the recipes the verdict cannot tell from the best (its `tied`, or the
    winner alone); hollow: those it puts behind. An interval wider than the panel's is cut at its edge with
    an arrow (the caption names it). recipes/bits: as isoflop_profiles'."""
    chips = [c for c in cost_models.get("chips", {}) if c == "bits"] + \
        [c for c in cost_models.get("chips", {}) if c != "bits"]
    budgets = sorted({b["budget_reference"] for c in chips for b in cost_models["chips"][c]["budgets"]})
    if not chips or not budgets:
        raise ConfigError("findings cost_models", "no chip with a budget", "chips with per-budget verdicts")
    z = float((cost_models.get("familywise") or {}).get("z") or 1.959964)
    drawn = recipe_order({r["recipe"] for c in chips for b in cost_models["chips"][c]["budgets"] for r in b["recipes"]})
    study = list(recipes) if recipes is not None else drawn
    fig, axes = plt.subplots(len(budgets), 1, figsize=(max(8.0, 1.5 * len(chips) + 2), 3.3 * len(budgets) + 0.8),
                             squeeze=False)
    width = 0.8 / max(1, len(drawn))
    captions, cut = [], {}
    for ax, budget in zip(axes[:, 0], budgets):
        captions.append(_budget_panel(ax, cost_models, chips, budget, drawn, study, z, width, unit, cut))
    level = cost_models.get("level") or 0.95
    fig.suptitle(f"{TITLES[10]}\nbars: loss ± {z:.2f}·se (family-wise {level:.0%}); filled: cannot be told from the "
                 "best; hollow: behind it", fontsize=10)
    fig.legend(handles=recipe_handles(drawn, study, bits, lw=0), loc="lower center", ncol=min(4, len(drawn)),
               fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, _legend_inches(len(drawn)) / fig.get_figheight(), 1, 1))
    caption = (f"each recipe's best loss on each chip (its loss surface at the tokens the chip's cost buys, plus its "
               f"matched-token gap, minimised over N), with loss ± {z:.2f}·se, the family-wise z the verdicts use. "
               "Filled markers are the recipes the verdict cannot tell from the best, read from the interval of "
               "each recipe's difference to the best (REPORT, 'On each chip'), which can be narrower than these: "
               "recipes share the reference surface. " + "; ".join(captions) + ".")
    if cut:
        caption += _cut_caption(cut, chips)
    return _figure(10, Path(stem), fig, caption)


def _budget_panel(ax: Any, cost_models: dict, chips: Sequence[str], budget: float, drawn: Sequence[str],
                  study: Sequence[str], z: float, width: float, unit: str, cut: dict) -> str:
    """Figure 10's panel at one budget: each chip's group (a chip without a verdict at this budget is
    'not priced'), the chips' ticks naming each verdict, the axes; returns the caption's words for it (its
    winners). An interval cut at the panel's edge is added to `cut`."""
    cells = {c: next((b for b in cost_models["chips"][c]["budgets"] if b["budget_reference"] == budget), None)
             for c in chips}
    lo, hi = _panel_range(cells, z)
    ticks = []
    for x, chip in enumerate(chips):
        cell = cells[chip]
        if cell is None:
            ticks.append(f"{_chip_name(chip)}\nnot priced")
            continue
        verdict = _chip_group(ax, x, chip, cell, budget, drawn, study, z, width, lo, hi, cut)
        ticks.append(f"{_chip_name(chip)}\n{verdict}")
    for x in range(1, len(chips)):
        ax.axvline(x - 0.5, color="0.85", lw=0.8, zorder=0)
    ax.set_xticks(range(len(chips)), ticks, fontsize=8)
    ax.set_xlim(-0.5, len(chips) - 0.5)
    ax.set_ylim(lo, hi)
    ax.set_ylabel(f"best loss ({unit})", fontsize=9)
    ax.set_title(f"C = {_fmt(budget)} (16-bit FLOP units on the reference recipe)", fontsize=9)
    winners = {c: cells[c]["winner"] for c in chips if cells[c] and cells[c].get("winner")}
    return f"at C = {_fmt(budget)}: " + (", ".join(f"{w} on {_chip_name(c)}" for c, w in winners.items())
                                         if winners else "no chip has a single winner")


def _panel_range(cells: dict, z: float) -> tuple[float, float]:
    """A panel's loss range: every estimate, and the intervals no wider than 3x the panel's median interval,
    padded by 5% (wider intervals are cut at its edge)."""
    halves = [z * r["loss_se"] for b in cells.values() if b for r in b["recipes"] if r.get("loss_se") is not None]
    limit = 3 * float(np.median(halves)) if halves else 0.0
    ends = [v for b in cells.values() if b for r in b["recipes"]
            for v in ([r["loss"]] + ([r["loss"] - z * r["loss_se"], r["loss"] + z * r["loss_se"]]
                                    if r.get("loss_se") is not None and z * r["loss_se"] <= limit else []))]
    lo, hi = min(ends), max(ends)
    pad = 0.05 * (hi - lo or 0.1)
    return lo - pad, hi + pad


def _chip_group(ax: Any, x: int, chip: str, cell: dict, budget: float, drawn: Sequence[str], study: Sequence[str],
                z: float, width: float, lo: float, hi: float, cut: dict) -> str:
    """One chip's group at one budget: each recipe's best loss (filled where the verdict cannot tell it from
    the best) with loss ± z·se, an interval beyond [lo, hi] cut at the edge with an arrow and recorded in
    `cut`; returns the verdict its tick names (the winner, how many tied, or none)."""
    tied = set(cell.get("tied") or ([cell["winner"]] if cell.get("winner") else []))
    for r in cell["recipes"]:
        j = drawn.index(r["recipe"])
        at = x - 0.4 + width * (j + 0.5)
        colour, marker, _ = recipe_style(r["recipe"], study)
        se = r.get("loss_se")
        if se is not None and np.isfinite(se):
            a, b = r["loss"] - z * se, r["loss"] + z * se
            clipped = a < lo or b > hi
            ax.plot([at, at], [max(a, lo), min(b, hi)], color=colour, lw=0.8 if clipped else 1.2,
                    ls=":" if clipped else "-", zorder=2)
            for end, edge, arrow in ((a, lo, "v"), (b, hi, "^")):
                if (end < edge) if arrow == "v" else (end > edge):
                    ax.plot([at], [edge], marker=arrow, color=colour, ms=5, zorder=3, clip_on=False)
            if clipped:
                cut.setdefault((r["recipe"], budget), []).append((chip, z * se))
        ax.scatter([at], [r["loss"]], marker=marker, s=34, zorder=4, linewidths=1.0,
                   facecolor=colour if r["recipe"] in tied else "white", edgecolor=colour if r["recipe"] not in tied else "k")
    return cell["winner"] if cell.get("winner") else (f"{len(tied)} tied" if tied else "no verdict")


def _cut_caption(cut: dict, chips: Sequence[str]) -> str:
    """The caption's sentence naming each interval cut at a panel's edge: recipe, budget, its half-width
    and the chips it was cut on."""
    parts = []
    for (recipe, budget), where in cut.items():
        halves = sorted(h for _, h in where)
        span = f"{halves[0]:.2g}" if f"{halves[0]:.2g}" == f"{halves[-1]:.2g}" else f"{halves[0]:.2g}-{halves[-1]:.2g}"
        on = "every chip" if len(where) == len(chips) else ", ".join(_chip_name(c) for c, _ in where)
        parts.append(f"{recipe} at C = {_fmt(budget)} (± {span}, on {on})")
    return " Intervals wider than three times a panel's median are cut at its edge (arrows, dotted): " \
        + "; ".join(parts) + "."
