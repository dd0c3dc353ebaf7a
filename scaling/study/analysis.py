"""The analysis of a study: which runs belong to which part, compute budgets, the loss of each run at
exactly a budget, IsoFLOP profiles per recipe, and the statistics of "which recipe is best".

The direct measurement is Hoffmann et al.'s Approach 2, per recipe: at a budget C (16-bit FLOP units
under a named `scaling.train.compute.CostModel`), every run of the recipe gives its loss at the tokens C
affords it, and loss against log N is fitted with a parabola whose minimum is the recipe's best loss
at C. A run contributes at C only if one of its evaluations lands on C (an IsoFLOP design's run
(scaling.study.design) lands on each budget it serves at the nearest whole step and labels that evaluation
`budget`; otherwise within one part in a thousand) or, for tables made without such a design, if two of its
WSD cooldown evaluations bracket C: then log loss is interpolated linearly in log D between them
(flagged `interpolated`). Nothing is extrapolated and no minimum is picked across sweeps.

Uncertainty: a parametric bootstrap. Each profile's residuals about its parabola, pooled over the
recipes at a budget (sigma² = sum RSS / sum (n - 3)) and with the scatter of seed replicates
anywhere in the table (`replicate_noise`), give the noise about the profiles (seed scatter plus
the parabola's lack of fit; `seed_sigma` is the seeds' part alone); every resample
redraws each run's loss as fit + sigma·z, refits every profile, and takes each recipe's minimum
over its measured size range. From the resamples: a CI per recipe's minimum, the probability that
each recipe is the best, and the paired difference of the best two. `winner` is the best recipe
only when that difference's CI excludes zero and every recipe's minimum lies inside its measured
sizes (a minimum at the edge could be lower beyond it); otherwise None, with the reason.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import pandas as pd

from scaling.train import compute as compute_lib
from scaling.errors import ConfigError

MATCH_RTOL = 1e-3  # an evaluation "lands on" a budget within this relative compute difference
MIN_SIZES = 3  # a parabola needs three distinct sizes; the design asks for five
LEVEL = 0.95
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
    """The reference recipe of a table: the one with the most bits (P), ties by name."""
    if df.empty or "recipe" not in df.columns:
        return None
    by = df.drop_duplicates("recipe").sort_values(["P", "recipe"], ascending=[False, True])
    return str(by["recipe"].iloc[0])


# ----------------------------------------------------------------------------- budgets and points

def with_cost(df: pd.DataFrame, cost: compute_lib.CostModel) -> pd.DataFrame:
    """df with `C` (training compute in 16-bit FLOP units under `cost`) and `bits_eff` (the effective
    bits as `cost` counts them: a forward-only recipe's unquantised backward at 16, not 32) columns."""
    df = compute_lib.backfill(df)
    return df.assign(C=cost.compute(df), bits_eff=cost.effective_bits(df))


def points_at(df: pd.DataFrame, budget: float, cost: compute_lib.CostModel) -> pd.DataFrame:
    """Each run's loss at exactly compute `budget`: one row per run that reaches it (see module doc).
    Columns: run_id, recipe, seed, N, D, P, bits_eff, loss, interpolated."""
    df = with_cost(ok_rows(df), cost)
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
                     "bits_eff": float(first["bits_eff"]), "loss": float(value), "interpolated": interpolated})
    return pd.DataFrame(rows, columns=["run_id", "recipe", "seed", "N", "D", "P", "bits_eff", "loss", "interpolated"])


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

def _parabola(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Least-squares y = a + b·x + c·x² -> (coefficients [a, b, c], residual sum of squares)."""
    X = np.stack([np.ones_like(x), x, x * x], axis=-1)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    return coef, float(np.sum((X @ coef - y) ** 2))


def _minimum(coef: np.ndarray, lo: float, hi: float) -> tuple[float, float, bool]:
    """(x*, y*, inside) of a parabola's minimum over [lo, hi]: the vertex if it is a minimum inside
    the range, else the lower end value (then `inside` is False)."""
    a, b, c = coef
    if c > 0:
        x = -b / (2 * c)
        if lo <= x <= hi:
            return x, a + b * x + c * x * x, True
    ends = np.array([lo, hi])
    vals = a + b * ends + c * ends * ends
    i = int(np.argmin(vals))
    return float(ends[i]), float(vals[i]), False


def _batched_minima(X: np.ndarray, Y: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Minimum over [lo, hi] of the least-squares parabola through (X, Y[k]) for every row k of Y."""
    A = np.stack([np.ones_like(X), X, X * X], axis=-1)
    coef = np.linalg.lstsq(A, Y.T, rcond=None)[0].T  # (K, 3)
    a, b, c = coef[:, 0], coef[:, 1], coef[:, 2]
    with np.errstate(divide="ignore", invalid="ignore"):
        xv = np.where(c > 0, -b / (2 * c), np.nan)
    inside = (c > 0) & (xv >= lo) & (xv <= hi)
    at = lambda x: a + b * x + c * x * x  # noqa: E731
    ends = np.minimum(at(lo), at(hi))
    return np.where(inside, at(np.where(inside, xv, lo)), ends)


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


def isoflop(df: pd.DataFrame, budget: float, cost: compute_lib.CostModel | str = "bits", *,
            n_boot: int = 2000, seed: int = 0, level: float = LEVEL,
            noise: tuple[float, int] = (0.0, 0)) -> dict[str, Any]:
    """The IsoFLOP analysis at one budget (see module doc). Returns a JSON-friendly dict:
    budget, cost_model, sigma (noise about the profiles, nats: parabola residuals and seed replicates
    pooled), dof, seed_sigma and seed_dof (the seed replicates alone; None without any: a sigma well
    above it is the parabola's lack of fit), recipes: [{recipe, bits_eff, P,
    runs, sizes, interpolated, N_opt, loss, ci, inside, p_best}], best, runner_up, diff (runner-up
    minus best) with diff_ci, winner (or None) and reason.
    noise: (sum of squares, dof) from seed replicates (replicate_noise), pooled with the residuals."""
    cost = compute_lib.get(cost)
    pts = points_at(df, budget, cost)
    out: dict[str, Any] = {"budget": float(budget), "cost_model": cost.name, "level": level, "recipes": [],
                           "sigma": None, "dof": 0, "best": None, "runner_up": None, "diff": None,
                           "seed_sigma": math.sqrt(noise[0] / noise[1]) if noise[1] else None, "seed_dof": int(noise[1]),
                           "diff_ci": None, "winner": None, "reason": ""}
    profiles = {}
    rss, dof = noise
    for recipe, g in pts.groupby("recipe", sort=True):
        x, y = np.log(g["N"].to_numpy(float)), g["loss"].to_numpy(float)
        n_sizes = len(np.unique(x))
        entry = {"recipe": recipe, "bits_eff": float(g["bits_eff"].iloc[0]), "P": float(g["P"].iloc[0]),
                 "runs": int(len(g)), "sizes": n_sizes, "interpolated": int(g["interpolated"].sum()),
                 "N_opt": None, "loss": None, "ci": None, "inside": None, "p_best": None, "parabola": None}
        if n_sizes >= MIN_SIZES:
            coef, r = _parabola(x, y)
            xs, ys, inside = _minimum(coef, x.min(), x.max())
            entry.update(N_opt=float(math.exp(xs)), loss=float(ys), inside=bool(inside),
                         parabola=[float(c) for c in coef])  # loss = c0 + c1·ln N + c2·ln² N
            profiles[recipe] = (x, y, coef)
            rss, dof = rss + r, dof + len(x) - 3
        out["recipes"].append(entry)
    fitted = [e for e in out["recipes"] if e["loss"] is not None]
    if len(fitted) < 2:
        out["reason"] = f"fewer than two recipes with {MIN_SIZES}+ sizes reaching this budget"
        return out
    if dof < 1:
        out["reason"] = "no degrees of freedom left to estimate run-to-run noise (need more runs than 3 per profile)"
        return out
    sigma = math.sqrt(rss / dof)
    out.update(sigma=sigma, dof=int(dof))
    rng = np.random.default_rng(seed)
    names = [e["recipe"] for e in fitted]
    minima = np.empty((n_boot, len(names)))
    for j, name in enumerate(names):
        x, y, coef = profiles[name]
        mean = coef[0] + coef[1] * x + coef[2] * x * x
        # sigma itself is uncertain with few dof: scale each resample's noise by a chi draw
        scale = np.sqrt(dof / rng.chisquare(dof, size=(n_boot, 1)))
        Y = mean[None, :] + sigma * scale * rng.standard_normal((n_boot, len(x)))
        minima[:, j] = _batched_minima(x, Y, x.min(), x.max())
    tail = 100 * (1 - level) / 2
    best_idx = np.argmin(minima, axis=1)
    for j, e in enumerate(fitted):
        e["ci"] = [float(np.percentile(minima[:, j], tail)), float(np.percentile(minima[:, j], 100 - tail))]
        e["p_best"] = float(np.mean(best_idx == j))
    order = sorted(range(len(names)), key=lambda j: fitted[j]["loss"])
    b, r = order[0], order[1]
    diff = minima[:, r] - minima[:, b]
    ci = [float(np.percentile(diff, tail)), float(np.percentile(diff, 100 - tail))]
    out.update(best=names[b], runner_up=names[r], diff=float(fitted[r]["loss"] - fitted[b]["loss"]), diff_ci=ci)
    edge = [e["recipe"] for e in fitted if not e["inside"]]
    if ci[0] <= 0:
        out["reason"] = (f"cannot tell: {names[b]} vs {names[r]} differ by {out['diff']:.3f} nats, "
                         f"{level:.0%} CI [{ci[0]:.3f}, {ci[1]:.3f}] includes zero")
    elif edge:
        out["reason"] = (f"cannot tell: the minimum of {', '.join(edge)} lies at the edge of its sizes "
                         "(it may be lower beyond them)")
    else:
        out["winner"] = names[b]
        out["reason"] = (f"{names[b]} beats {names[r]} by {out['diff']:.3f} nats "
                         f"({level:.0%} CI [{ci[0]:.3f}, {ci[1]:.3f}])")
    return out


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
    scaling.study.selection.gaps_to_reference_rows.)"""
    df = ok_rows(df)
    ref = high_precision_recipe(df)
    if ref is None:
        return pd.DataFrame(columns=["recipe", "N", "D", "seed", "gap"])
    keys = ["N", "D"] + (["seed"] if "seed" in df.columns else [])
    base = df[df["recipe"] == ref].groupby(keys, as_index=False)["val_loss"].mean().rename(columns={"val_loss": "ref"})
    merged = df[df["recipe"] != ref].merge(base, on=keys)
    return merged.assign(gap=merged["val_loss"] - merged["ref"])[["recipe", *keys, "gap"]]
