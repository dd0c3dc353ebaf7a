"""The analysis of a study: which runs belong to which part, compute budgets, the loss of each run at
exactly a budget, IsoFLOP profiles per recipe, and the statistics of "which recipe is best".

The direct measurement is Hoffmann et al.'s Approach 2, per recipe: at a budget C (16-bit FLOP units
under a named `scaling.train.compute.CostModel`), every run of the recipe gives its loss at the tokens C
affords it, and loss against log N is fitted with a parabola whose minimum is the recipe's best loss
at C. A run contributes at C only if one of its evaluations lands on C (an IsoFLOP design's run
(scaling.study.sweeps.design) lands on each budget it serves at the nearest whole step and labels that evaluation
`budget`; otherwise within one part in a thousand) or, for tables made without such a design, if two of its
WSD cooldown evaluations bracket C: then log loss is interpolated linearly in log D between them
(flagged `interpolated`). Nothing is extrapolated and no minimum is picked across sweeps.

Shape and uncertainty (scaling.study.analysis.shapes): the profiles of all recipes at a budget are fitted jointly
with an effect per model shape (d_model, n_layers) that every recipe shares, identified where recipes
share shapes, so recipes measured on different shapes are compared on shape-adjusted minima. The noise
is the scatter about that joint fit (seed replicates included as points; `seed_sigma`, from seed
replicates anywhere in the table (`replicate_noise`), is reported beside it, and stands in only where
the fit leaves no degrees of freedom). A parametric bootstrap redraws every point as fit + sigma·z,
refits, and takes each recipe's minimum over its measured size range: a CI per recipe's minimum, the
probability that each recipe is the best, and the paired difference of the best two. `winner` is the
best recipe only when that difference's CI excludes zero and every recipe's minimum lies inside its
measured sizes (a minimum at the edge could be lower beyond it); otherwise None, with the reason.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import pandas as pd

from scaling.train import compute as compute_lib
from scaling.study.analysis import fit, shapes
from scaling.errors import ConfigError

MATCH_RTOL = 1e-3  # an evaluation "lands on" a budget within this relative compute difference
MIN_SIZES = 3  # a parabola needs three distinct sizes; the design asks for five
LEVEL = 0.95  # the confidence level of the study's intervals (selection, predict and findings import it)
# Sweeps that feed one figure each (experiments/<name>.toml; figure number); every other sweep is the
# main study (the ladder, or quick), which the law is fitted on.
PURPOSE_SWEEPS = {"granularity": 5, "outliers": 7, "isocompute": 1}


# ----------------------------------------------------------------------------- parts of a study

def sweep_family(sweeps: pd.Series) -> pd.Series:
    """Sweep names with the old direct test's two halves (`isocompute`, `isocompute_law`) as one."""
    return sweeps.astype(str).str.replace(r"^isocompute.*$", "isocompute", regex=True)


def study_part(df: pd.DataFrame | None, part: str) -> pd.DataFrame | None:
    """The rows of one part of a multi-sweep study (the `sweep` column names each row's sweep):
    'main' (every sweep not in PURPOSE_SWEEPS), 'law' (main + isocompute), or a PURPOSE_SWEEPS name.
    Tables without a `sweep` column, or without a row of the part asked for, are returned whole."""
    if df is None or "sweep" not in df.columns:
        return df
    names = sweep_family(df["sweep"])
    if part == "main":
        mask = ~names.isin(list(PURPOSE_SWEEPS))
    elif part == "law":
        mask = ~names.isin([n for n in PURPOSE_SWEEPS if n != "isocompute"])
    elif part in PURPOSE_SWEEPS:
        mask = names == part
    else:
        raise ConfigError("study part", part, ["main", "law", *PURPOSE_SWEEPS])
    return df[mask].reset_index(drop=True) if mask.any() else df


def ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Rows that landed `ok` with a finite validation loss."""
    ok = df if "status" not in df.columns else df[df["status"].fillna("ok") == "ok"]
    return ok[np.isfinite(pd.to_numeric(ok["val_loss"], errors="coerce"))].reset_index(drop=True)


def high_precision_recipe(df: pd.DataFrame) -> str | None:
    """The reference recipe of a table, by the one rule law selection uses too (fit.recipes_reference_first:
    the largest P, then the other precision columns, so a weights-only or backward-only recipe with P = 32
    is not the reference; ties by name)."""
    if df.empty or "recipe" not in df.columns:
        return None
    return fit.recipes_reference_first(df)[0]


# ----------------------------------------------------------------------------- budgets and points

def with_cost(df: pd.DataFrame, cost: compute_lib.CostModel) -> pd.DataFrame:
    """df with `C` (training compute in 16-bit FLOP units under `cost`) and `bits_eff` (the effective
    bits as `cost` counts them: a forward-only recipe's unquantised backward at 16, not 32) columns."""
    df = compute_lib.backfill(df)
    return df.assign(C=cost.compute(df), bits_eff=cost.effective_bits(df))


# what points_at reads of a run's rows
_POINT_COLUMNS = ("run_id", "recipe", "seed", "N", "D", "P", "C", "bits_eff", "val_loss", "budget", "budget_cost",
                  "d_model", "n_layers")


def points_at(df: pd.DataFrame, budget: float, cost: compute_lib.CostModel) -> pd.DataFrame:
    """Each run's loss at exactly compute `budget`: one row per run that reaches it (see module doc).
    Columns: run_id, recipe, seed, N, D, P, bits_eff, loss, interpolated, shape (shape_label)."""
    df = with_cost(ok_rows(df), cost)
    df = df[[c for c in _POINT_COLUMNS if c in df.columns]]  # the groupby copies every column of every run
    rows = []
    for run_id, run in df.groupby("run_id", sort=False):
        run = run.sort_values("D")
        c, loss, d = run["C"].to_numpy(float), run["val_loss"].to_numpy(float), run["D"].to_numpy(float)
        hit = np.flatnonzero(np.abs(c / budget - 1) <= MATCH_RTOL)
        if "budget" in run.columns and "budget_cost" in run.columns and (run["budget_cost"] == cost.name).all():
            # a design's run lands on its budgets at the nearest whole step: its labels say which
            labelled = np.flatnonzero(np.isclose(pd.to_numeric(run["budget"], errors="coerce"), budget, rtol=1e-9))
            hit = labelled if labelled.size else hit
        first = run.iloc[0]
        if hit.size:
            value, tokens, interpolated = loss[hit[0]], d[hit[0]], False
        else:
            above = np.flatnonzero(c > budget)
            if not above.size or above[0] == 0:
                continue  # C outside this run's evaluations: no extrapolation
            i = above[0]
            t = (math.log(budget) - math.log(c[i - 1])) / (math.log(c[i]) - math.log(c[i - 1]))
            value = math.exp((1 - t) * math.log(loss[i - 1]) + t * math.log(loss[i]))
            tokens, interpolated = math.exp((1 - t) * math.log(d[i - 1]) + t * math.log(d[i])), True
        rows.append({"run_id": run_id, "recipe": str(first["recipe"]), "seed": first.get("seed", 0),
                     "N": float(first["N"]), "D": float(tokens), "P": float(first["P"]),
                     "bits_eff": float(first["bits_eff"]), "loss": float(value), "interpolated": interpolated,
                     "shape": shape_label(first)})
    return pd.DataFrame(rows, columns=["run_id", "recipe", "seed", "N", "D", "P", "bits_eff", "loss", "interpolated",
                                       "shape"])


def shape_label(row: pd.Series) -> str:
    """A run's model shape: 'd64×2' (d_model × n_layers) where the row records both, else its N."""
    d, layers = row.get("d_model"), row.get("n_layers")
    if d is not None and layers is not None and pd.notna(d) and pd.notna(layers):
        return f"d{int(d)}×{int(layers)}"
    return f"N={float(row['N']):.6g}"


def default_budgets(df: pd.DataFrame, cost: compute_lib.CostModel, max_budgets: int = 3) -> list[float]:
    """Budgets to analyse: an IsoFLOP design's own (the `budget` column its runs record), else, on a
    grid of 8 per decade, the budgets at which the most recipes have MIN_SIZES sizes reaching them:
    the smallest and largest of those (and the middle one), at least a factor 2 apart."""
    df = ok_rows(df)
    if df.empty:
        return []
    if "budget" in df.columns and "budget_cost" in df.columns:
        labelled = df[df["budget"].notna() & (df["budget_cost"] == cost.name)]
        if not labelled.empty:
            return sorted(float(b) for b in labelled["budget"].unique())
    costed = with_cost(df, cost)
    spans = costed.groupby("run_id").agg(lo=("C", "min"), hi=("C", "max"), recipe=("recipe", "first"), N=("N", "first"))
    grid = np.exp(np.arange(math.log(spans["lo"].min()), math.log(spans["hi"].max()), math.log(10) / 8))

    def covered(c):
        inside = spans[(spans["lo"] <= c * (1 + MATCH_RTOL)) & (spans["hi"] >= c * (1 - MATCH_RTOL))]
        return int((inside.groupby("recipe")["N"].nunique() >= MIN_SIZES).sum())

    score = np.array([covered(c) for c in grid])
    if score.max() == 0:
        return []
    good = grid[score == score.max()]
    picks = [good[0]] + ([good[len(good) // 2]] if max_budgets >= 3 else []) + [good[-1]]
    out: list[float] = []
    for c in picks:
        if all(abs(math.log(c / o)) >= math.log(2) for o in out):
            out.append(float(c))
    return sorted(out)[:max_budgets]


# ----------------------------------------------------------------------------- IsoFLOP profiles

def replicate_noise(df: pd.DataFrame) -> tuple[float, int]:
    """(sum of squares, dof) of the loss about its mean within cells of one sweep, recipe, N and D
    trained at several seeds: run-to-run noise measured directly, pooled into isoflop's sigma.
    (Across sweeps the same cell may differ in more than the seed, e.g. warmup, so they are not pooled.)"""
    df = ok_rows(df)
    if "seed" not in df.columns or df.empty:
        return 0.0, 0
    keys = [k for k in ("sweep", "recipe", "N", "D") if k in df.columns]
    seeds = df.groupby(keys)["seed"].transform("nunique")
    rep = df[seeds >= 2]
    if rep.empty:
        return 0.0, 0
    dev = rep["val_loss"] - rep.groupby(keys)["val_loss"].transform("mean")
    return float(np.sum(dev ** 2)), int(len(rep) - rep.groupby(keys).ngroups)


def _empty_isoflop(pts: pd.DataFrame, budget: float, cost: compute_lib.CostModel, level: float,
                   noise: tuple[float, int]) -> dict[str, Any]:
    """isoflop's result before any fit: every field empty, one entry per recipe with its runs at the budget."""
    out: dict[str, Any] = {"budget": float(budget), "cost_model": cost.name, "level": level, "recipes": [],
                           "sigma": None, "dof": 0, "noise_source": None, "best": None, "runner_up": None,
                           "diff": None, "seed_sigma": math.sqrt(noise[0] / noise[1]) if noise[1] else None,
                           "seed_dof": int(noise[1]), "sigma_parabolas": None, "shape_share": None,
                           "shape_effects": [], "diff_ci": None, "winner": None, "reason": "", "pairs": []}
    for recipe, g in pts.groupby("recipe", sort=True):
        out["recipes"].append({"recipe": recipe, "bits_eff": float(g["bits_eff"].iloc[0]), "P": float(g["P"].iloc[0]),
                               "runs": int(len(g)), "sizes": int(g["N"].nunique()),
                               "interpolated": int(g["interpolated"].sum()), "N_opt": None, "D_opt": None, "loss": None,
                               "ci": None, "inside": None, "p_best": None, "parabola": None, "gap": None,
                               "gap_ci": None})
    return out


def _shape_effects(out: dict[str, Any], design: shapes.JointDesign, res: dict[str, np.ndarray], rss_parabolas: np.ndarray,
                   pts: pd.DataFrame) -> None:
    """Fill out's shape_share and shape_effects from the joint fit (nothing without shared shapes)."""
    if design.shapes:
        rss = float(res["rss"][0])
        out["shape_share"] = float(1 - rss / rss_parabolas[0]) if rss_parabolas[0] > 0 else None
        for shape, sx, u in zip(design.shapes, design.shape_x, res["shape_effects"][0]):
            on = sorted(set(pts.loc[pts["shape"] == shape, "recipe"]))
            out["shape_effects"].append({"shape": str(shape), "N": float(math.exp(sx)), "effect": float(u), "recipes": on})


def _minima(fitted: list[dict[str, Any]], pts: pd.DataFrame, res: dict[str, np.ndarray]) -> None:
    """Fill each fitted recipe's minimum: N_opt, D_opt, loss, inside, parabola, ci, p_best."""
    for j, e in enumerate(fitted):
        mine = pts[pts["recipe"] == e["recipe"]].sort_values("N")
        # the tokens at the optimum: log D interpolated in log N between the recipe's runs (D ~ C / N)
        e["D_opt"] = float(np.exp(np.interp(res["x_opt"][0, j], np.log(mine["N"].to_numpy(float)),
                                            np.log(mine["D"].to_numpy(float)))))
        e.update(N_opt=float(math.exp(res["x_opt"][0, j])), loss=float(res["loss"][0, j]), inside=bool(res["inside"][0, j]),
                 parabola=[float(c) for c in res["coef"][0, 3 * j:3 * j + 3]], ci=[float(c) for c in res["ci"][0, j]],
                 p_best=float(res["p_best"][0, j]))


def _gaps_and_pairs(out: dict[str, Any], fitted: list[dict[str, Any]], names: list[str], pts: pd.DataFrame,
                    res: dict[str, np.ndarray], pairs: Sequence[tuple[str, str]], level: float) -> None:
    """Fill each fitted recipe's gap to the reference and out's `pairs`, paired over the same resamples."""
    reference = high_precision_recipe(pts[["recipe", "P"]])
    for e in fitted:
        if e["recipe"] != reference:
            e["gap"], e["gap_ci"] = _paired(res, names, e["recipe"], reference, level)
    for a, b_ in pairs:
        if a in names and b_ in names:
            diff, pci = _paired(res, names, a, b_, level)
            both_inside = bool(res["inside"][0, names.index(a)] and res["inside"][0, names.index(b_)])
            out["pairs"].append({"a": a, "b": b_, "diff": diff, "ci": pci, "inside": both_inside,
                                 "verdict": pair_verdict(a, b_, diff, pci, both_inside, level)})


def _winner(out: dict[str, Any], fitted: list[dict[str, Any]], names: list[str], res: dict[str, np.ndarray],
            shaped: bool, level: float) -> None:
    """Fill out's best, runner_up, diff, diff_ci, winner and reason: a winner only where the difference's CI
    excludes zero and every fitted minimum lies inside its sizes."""
    b, r = int(res["best"][0]), int(res["runner_up"][0])
    ci = [float(c) for c in res["diff_ci"][0]]
    out.update(best=names[b], runner_up=names[r], diff=float(res["diff"][0]), diff_ci=ci)
    edge = [e["recipe"] for e in fitted if not e["inside"]]
    adjusted = " (shape-adjusted)" if shaped else ""
    if ci[0] <= 0:
        out["reason"] = (f"cannot tell: {names[b]} vs {names[r]} differ by {out['diff']:.3f} nats{adjusted}, "
                         f"{level:.0%} CI [{ci[0]:.3f}, {ci[1]:.3f}] includes zero")
    elif edge:
        out["reason"] = (f"cannot tell: the minimum of {', '.join(edge)} lies at the edge of its sizes "
                         "(it may be lower beyond them)")
    else:
        out["winner"] = names[b]
        out["reason"] = (f"{names[b]} beats {names[r]} by {out['diff']:.3f} nats{adjusted} "
                         f"({level:.0%} CI [{ci[0]:.3f}, {ci[1]:.3f}])")


def isoflop(df: pd.DataFrame, budget: float, cost: compute_lib.CostModel | str = "bits", *,
            n_boot: int = 2000, seed: int = 0, level: float = LEVEL,
            noise: tuple[float, int] = (0.0, 0), shape_term: bool = True,
            pairs: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """The IsoFLOP analysis at one budget (see module doc and scaling.study.analysis.shapes). Returns a JSON-friendly
    dict: budget, cost_model, level, sigma (the noise the verdict resamples with: the scatter about the
    joint fit of parabolas and shape effects) and dof, noise_source ('joint fit', or 'seed replicates'
    where the fit leaves no dof), seed_sigma and seed_dof (seed replicates alone, from `noise`; None without
    any: a sigma well above it is lack of fit), sigma_parabolas (scatter about the parabolas alone),
    shape_share (the share of that scatter the shape effects explain), shape_effects [{shape, N, effect,
    recipes}] (empty without shapes shared by enough recipes), recipes: [{recipe, bits_eff, P, runs,
    sizes, interpolated, N_opt, D_opt (tokens there), loss, ci, inside, p_best, parabola (shape-adjusted: loss = c0 + c1·ln N +
    c2·ln² N at the shapes' common curve)}], best, runner_up, diff (runner-up minus best) with diff_ci,
    winner (or None) and reason. Each fitted recipe also carries `gap` and `gap_ci`: its minimum minus the
    reference's (high_precision_recipe of the fitted ones), paired over the same resamples (None for the
    reference). pairs: (a, b) recipe pairs whose paired difference a − b is wanted as well, returned as
    `pairs` [{a, b, diff, ci, inside (both minima inside their sizes), verdict}] where both were fitted.
    noise: (sum of squares, dof) of seed replicates (replicate_noise). shape_term=False fits the parabolas alone."""
    cost = compute_lib.get(cost)
    pts = points_at(df, budget, cost)
    out = _empty_isoflop(pts, budget, cost, level, noise)
    fitted = [e for e in out["recipes"] if e["sizes"] >= MIN_SIZES]
    if len(fitted) < 2:
        out["reason"] = f"fewer than two recipes with {MIN_SIZES}+ sizes reaching this budget"
        return out
    names = [e["recipe"] for e in fitted]
    pts = pts[pts["recipe"].isin(names)].reset_index(drop=True)
    x, y = np.log(pts["N"].to_numpy(float)), pts["loss"].to_numpy(float)
    recipe_of = pts["recipe"].map({n: i for i, n in enumerate(names)}).to_numpy(int)
    design = shapes.joint_design(x, recipe_of, list(pts["shape"]), shape_term=shape_term)
    parabolas = shapes.joint_design(x, recipe_of, list(pts["shape"]), shape_term=False)
    _, rss_parabolas = shapes.fit(parabolas, y)
    if parabolas.dof >= 1:
        out["sigma_parabolas"] = math.sqrt(float(rss_parabolas[0]) / parabolas.dof)
    if design.dof >= 1:
        sigma, dof, out["noise_source"] = None, design.dof, "joint fit"
    elif noise[1] >= 1:
        sigma, dof, out["noise_source"] = math.sqrt(noise[0] / noise[1]), int(noise[1]), "seed replicates"
    else:
        out["reason"] = "no degrees of freedom left to estimate run-to-run noise (need more runs than 3 per profile)"
        return out
    res = shapes.compare(design, y, n_boot=n_boot, level=level, rng=np.random.default_rng(seed), sigma=sigma, dof=dof)
    out.update(sigma=float(res["sigma"][0]), dof=int(dof))
    _shape_effects(out, design, res, rss_parabolas, pts)
    _minima(fitted, pts, res)
    _gaps_and_pairs(out, fitted, names, pts, res, pairs, level)
    _winner(out, fitted, names, res, bool(design.shapes), level)
    return out


def _paired(res: dict[str, np.ndarray], names: list[str], a: str, b: str, level: float) -> tuple[float, list[float]]:
    """Minimum of a minus minimum of b at one budget, with the CI of that difference over the same
    bootstrap resamples (paired: the shared noise of the joint fit cancels)."""
    i, j = names.index(a), names.index(b)
    tail = 100 * (1 - level) / 2
    ci = np.percentile(res["boot_min"][0, :, i] - res["boot_min"][0, :, j], [tail, 100 - tail])
    return float(res["loss"][0, i] - res["loss"][0, j]), [float(c) for c in ci]


def pair_verdict(a: str, b: str, diff: float, ci: Sequence[float], inside: bool, level: float,
                 interval: str = "CI") -> str:
    """One sentence: which of a and b is lower at a budget, or "cannot tell" and why. `interval` names
    the interval (e.g. "family-wise CI" where it is one of several claims' simultaneous intervals)."""
    name = f"{level:.0%} {interval}"
    if ci[0] <= 0 <= ci[1]:
        return f"cannot tell: {a} − {b} = {diff:+.3f} nats, {name} [{ci[0]:+.3f}, {ci[1]:+.3f}] includes zero"
    if not inside:
        return (f"cannot tell: {a} − {b} = {diff:+.3f} nats ({name} [{ci[0]:+.3f}, {ci[1]:+.3f}]), but a "
                "minimum lies at the edge of its sizes")
    lower, higher = (a, b) if diff < 0 else (b, a)
    return f"{lower} lower than {higher} by {abs(diff):.3f} nats ({name} of {a} − {b} [{ci[0]:+.3f}, {ci[1]:+.3f}])"


def analyse(df: pd.DataFrame, budgets: Sequence[float] | None = None, cost: compute_lib.CostModel | str = "bits",
            **kwargs: Any) -> list[dict[str, Any]]:
    """isoflop() at every budget (default_budgets when none are given)."""
    cost = compute_lib.get(cost)
    budgets = list(budgets) if budgets else default_budgets(df, cost)
    kwargs.setdefault("noise", replicate_noise(df))
    return [isoflop(df, c, cost, **kwargs) for c in budgets]


# ----------------------------------------------------------------------------- precision gaps

def gaps_to_reference_recipe(df: pd.DataFrame) -> pd.DataFrame:
    """Each ok run's val_loss minus the mean of the reference recipe's (high_precision_recipe) at the
    same size, tokens and seed (where one exists): columns recipe, N, D, seed, gap. The quantity a
    precision law must predict. (Law selection's per-row gaps, with its own reference rule, are
    scaling.study.analysis.selection.gaps_to_reference_rows.)"""
    df = ok_rows(df)
    ref = high_precision_recipe(df)
    if ref is None:
        return pd.DataFrame(columns=["recipe", "N", "D", "seed", "gap"])
    keys = ["N", "D"] + (["seed"] if "seed" in df.columns else [])
    base = df[df["recipe"] == ref].groupby(keys, as_index=False)["val_loss"].mean().rename(columns={"val_loss": "ref"})
    merged = df[df["recipe"] != ref].merge(base, on=keys)
    return merged.assign(gap=merged["val_loss"] - merged["ref"])[["recipe", *keys, "gap"]]
