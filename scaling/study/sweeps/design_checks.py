"""What an experiment can answer, said before it runs (`scaling sweep --dry-run`): per recipe and
budget, whether its IsoFLOP minimum is bracketed (from the landed runs, else from where the design
expects it); warnings, one line each, for profiles that leave no degrees of freedom for noise, minima
that cannot be bracketed, and shapes whose FLOPs go mostly to parts the recipes leave unquantised.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from scaling.study.sweeps import design as design_lib
from scaling.study.sweeps import sweep
from scaling.train import compute as compute_lib
from scaling.train import config, ladder

PARABOLA_PARAMS = 3  # an IsoFLOP profile is a parabola in log N
UNQUANTISED_DOMINATES = 0.5  # share of a step's FLOPs in unquantised parts above which a shape is flagged
QUANTISED_PARTS = ("fprop", "dgrad", "wgrad", "rotations")  # the projections a recipe quantises (and its rotations)
HIGH_BITS = 16.0  # BF16 and wider: high precision
PART_FAMILIES = {"projections": ("fprop", "dgrad", "wgrad", "kept_fprop", "kept_dgrad", "kept_wgrad"),
                 "head": ("head_fprop", "head_dgrad", "head_wgrad"), "attention": ("attn_fwd", "attn_bwd"),
                 "rotations": ("rotations",)}


def check(path: str | Path, overrides: Sequence[str] = (), landed_root: str | Path | None = None,
          summary=None) -> tuple[list[str], list[str]]:
    """(notes, warnings) of an experiment file: the bracket of each recipe's minimum per budget (notes,
    or a warning where it cannot be bracketed), too few points for noise, unquantised FLOPs that
    dominate. `landed_root`: the results root whose landed runs say where the minima are, with
    those of the sweep's committed `summary` (scaling.study.sweeps.summary.Summary)."""
    name, base, points, design = sweep.experiment_points(path, list(overrides))
    vocab = sweep._vocab(base)
    cfgs = [c for _, c in points]
    warnings = flops_warnings([config.validate(c) for c in cfgs] if design is None else
                              [r for runs in design_lib.design_runs(cfgs, design, vocab) for r in runs], vocab)
    if design is None:
        return [], warnings
    from scaling.study.sweeps.summary import landed_rows

    landed = landed_rows(Path(landed_root) / name if landed_root is not None else None, summary)
    designed = design_lib.extend_edges(cfgs, design_lib.design_runs(cfgs, design, vocab), design, landed, vocab)
    labels = [_label(point, config.validate(cfg).recipe.name) for point, cfg in points]
    notes, unbracketed = bracket_lines(cfgs, labels, designed, design, landed, vocab)
    n_runs = len({c.run_id for runs in designed for c in runs})
    # replicates come once minima land: at most each budget's minimum and its two neighbours per seed
    replicates = sum(min(len(runs), 3 * len(design.budgets)) for runs in designed) * len(design.replicates)
    return notes, unbracketed + noise_warnings(labels, designed, design) + pstar_warnings(n_runs, replicates) + warnings


def pstar_warnings(n_runs: int, replicates: int = 0) -> list[str]:
    """One line when the design's runs (with at most `replicates` more) are too few for a P* from every
    law with a precision term, with what each needs (optimum_check.min_runs at the law's default fixed
    parameters: the rule the fit's P* follows)."""
    from scaling.study.analysis import laws
    from scaling.study.analysis.pstar import optimum_check

    needs = sorted((optimum_check.min_runs(name, laws.get(name).fixed), name) for name in laws.names()
                   if laws.get(name).precision_axis)
    if not needs or n_runs + replicates >= needs[0][0]:
        return []
    runs = f"{n_runs} runs" + (f" (and at most {replicates} replicates)" if replicates else "")
    return [f"{runs}: too few for a P* from any law ({', '.join(f'{name} needs {n}' for n, name in needs)}); "
            "add shapes, budgets or seeds (isoflop.replicates)"]


def _label(point: dict, recipe: str) -> str:
    """A grid point as the recipe it trains (by its name, whether the grid gives a preset, a table or a
    recipe file), with its other grid values where it has any."""
    recipe = recipe if "precision" in point else None
    rest = ", ".join(f"{k}={v}" for k, v in point.items() if k != "precision")
    return " ".join(x for x in (str(recipe) if recipe else "", f"({rest})" if rest else "") if x) or "base"


def _at_budget(cfgs: Sequence[config.RunConfig], budget: float) -> list[config.RunConfig]:
    return [c for c in cfgs if any(np.isclose(b, budget, rtol=1e-9) for b in c.study.flop_budgets if b)]


def bracket_lines(points: Sequence[dict], labels: Sequence[str], designed: Sequence[Sequence[config.RunConfig]],
                  design: design_lib.Design, landed: pd.DataFrame, vocab: int) -> tuple[list[str], list[str]]:
    """(notes, warnings): per grid point and budget, where its minimum is against its shapes there.
    Landed (all of its runs at the budget ok): the observed minimum, inside, at an edge that
    extend_edges follows, or at an edge with no shape beyond (a warning). Not landed: the shape
    nearest design.tokens_per_param, the design's expected optimum, and a warning when it is the
    smallest or largest shape the design offers the recipe at that budget."""
    ok = landed[landed["status"] == "ok"] if "status" in landed.columns else landed
    notes, warnings = [], []
    for point, label, cfgs in zip(points, labels, designed):
        base = config.validate(point)
        table = design_lib._shapes(base, design, vocab)
        for budget in design.budgets:
            runs = _at_budget(cfgs, budget)
            if not runs:
                continue
            n_at = sorted(float(table.loc[table["shape"] == _shape(c), "N"].iloc[0]) for c in runs)
            span = f"{len(n_at)} shapes, N {n_at[0]:.3g}-{n_at[-1]:.3g}"
            where = f"{label} at {budget:g}"
            landed_all = not ok.empty and "budget" in ok.columns and {c.run_id for c in runs} <= set(ok["run_id"])
            if landed_all:
                at = design_lib._profile(ok, runs, design, budget)
                k = int(np.argmin(at["val_loss"].to_numpy(float)))
                n_min = float(at["N"].iloc[k])
                if 0 < k < len(at) - 1:
                    notes.append(f"{where}: bracketed, minimum at N {n_min:.3g} ({span})")
                    continue
                side = "smallest" if k == 0 else "largest"
                beyond = table[table["N"] < n_min] if k == 0 else table[table["N"] > n_min]
                if beyond.empty:
                    warnings.append(f"{where}: minimum at the {side} shape (N {n_min:.3g}) and isoflop.sizes has none "
                                    f"beyond: it cannot be bracketed ({span})")
                elif design.extend_edges:
                    notes.append(f"{where}: minimum at the {side} shape (N {n_min:.3g}): extend_edges adds the next "
                                 f"shape for every recipe ({span})")
                else:
                    warnings.append(f"{where}: minimum at the {side} shape (N {n_min:.3g}), not bracketed: set "
                                    f"isoflop.extend_edges = true or add shapes ({span})")
                continue
            steps = {_shape(c): c.train.tokens * max(f for f, b in zip(c.train.eval_at, c.study.flop_budgets)
                                                     if np.isclose(b, budget, rtol=1e-9)) for c in runs}
            rows = table[table["shape"].isin(list(steps))].copy()
            rows["tokens_per_param"] = [steps[s] / n for s, n in zip(rows["shape"], rows["N"])]
            k = int(np.argmin(np.abs(np.log(rows["tokens_per_param"].to_numpy(float) / design.tokens_per_param))))
            n_exp = float(rows["N"].iloc[k])
            if 0 < k < len(rows) - 1:
                notes.append(f"{where}: expected minimum (about {design.tokens_per_param:g} tokens per parameter) at "
                             f"N {n_exp:.3g}, inside ({span})")
            else:
                warnings.append(f"{where}: expected minimum (about {design.tokens_per_param:g} tokens per parameter) at "
                                f"the {'smallest' if k == 0 else 'largest'} shape, N {n_exp:.3g}: it cannot be bracketed "
                                f"without shapes beyond ({span})")
    return notes, warnings


def _shape(cfg: config.RunConfig) -> tuple[int, int | None]:
    return cfg.model.size, ladder.depth_override(cfg.model.size, cfg.model.n_layers)


def noise_warnings(labels: Sequence[str], designed: Sequence[Sequence[config.RunConfig]],
                   design: design_lib.Design) -> list[str]:
    """One line per budget whose profiles leave no degrees of freedom for noise: points (shapes, plus
    the replicate seeds at the minimum and its two neighbours) minus a parabola's 3 parameters <= 0."""
    out = []
    for budget in design.budgets:
        short: dict[tuple[int, int], list[str]] = {}
        for label, cfgs in zip(labels, designed):
            shapes = len({_shape(c) for c in _at_budget(cfgs, budget)})
            if shapes == 0:
                continue
            points = shapes + len(design.replicates) * min(3, shapes)
            if points - PARABOLA_PARAMS <= 0:
                short.setdefault((shapes, 1 + len(design.replicates)), []).append(label)
        for (shapes, seeds), who in short.items():
            out.append(f"at {budget:g}: {shapes} shapes x {seeds} seed{'s' if seeds > 1 else ''} leave no degrees of "
                       f"freedom for noise in a parabola ({PARABOLA_PARAMS} parameters) for {', '.join(who)}: add "
                       "shapes (isoflop.sizes_per_budget) or seeds (isoflop.replicates)")
    return out


def flops_shares(cfg: config.RunConfig, vocab: int) -> dict[str, float]:
    """Shares of one training step's FLOPs per token by part family (projections, head, attention,
    rotations); `unquantised`: the share in the parts besides the quantised projections that the recipe
    keeps in high precision (the head, attention, kept blocks); `reference`: 1 for a recipe whose
    projections run in high precision too (BF16, FP32), else 0."""
    parts = compute_lib.parts(cfg.model.shape(vocab), cfg.recipe, cfg.tokens_per_step)
    total = sum(p.flops for p in parts)
    shares = {family: sum(p.flops for p in parts if p.name in names) / total for family, names in PART_FAMILIES.items()}
    shares["unquantised"] = sum(p.flops for p in parts if p.name not in QUANTISED_PARTS and min(p.bits) >= HIGH_BITS) / total
    shares["reference"] = float(min(next(p for p in parts if p.name == "fprop").bits) >= HIGH_BITS)
    return shares


def flops_warnings(cfgs: Sequence[config.RunConfig], vocab: int) -> list[str]:
    """One line per model shape where, for a low-precision recipe, more than half the FLOPs go to the
    parts it keeps in high precision (`flops_shares`): there a precision comparison measures mostly them."""
    worst: dict[tuple, tuple[float, config.RunConfig, dict]] = {}
    for cfg in cfgs:
        shares = flops_shares(cfg, vocab)
        if shares["reference"]:  # a high-precision recipe has nothing left out
            continue
        key = (cfg.model.size, cfg.model.n_layers, cfg.model.seq_len)
        if shares["unquantised"] > UNQUANTISED_DOMINATES and shares["unquantised"] > worst.get(key, (0.0,))[0]:
            worst[key] = (shares["unquantised"], cfg, shares)
    out = []
    for key in sorted(worst, key=lambda k: (k[0], k[1] or 0, k[2])):
        share, cfg, shares = worst[key]
        m = cfg.model.shape(vocab)
        where = ", ".join(f"{family} {shares[family]:.0%}" for family in PART_FAMILIES if shares[family] > 0)
        out.append(f"FLOPs per token at d_model {m.d_model} x {m.n_layers} layers, vocab {vocab}: {where}; "
                   f"{share:.0%} in parts {cfg.recipe.name} keeps in high precision: a precision comparison there "
                   "measures mostly them")
    return out
