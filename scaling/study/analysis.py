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

import copy
import math
from typing import Any, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from scaling.train import compute as compute_lib
from scaling.study import laws, optimal
from scaling.study import fit as fit_lib
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


# ----------------------------------------------------------------------------- findings

def lr_optima(df: pd.DataFrame, loss_column: str = "val_loss") -> pd.DataFrame:
    """The best AdamW peak rate per (recipe, N) of a learning-rate probe (experiments/lr_precision.toml):
    at each run's last evaluation, the vertex of a parabola in log lr through the three best rates
    (the grid's best rate if that vertex falls outside them; `edge` when the best rate is the grid's
    smallest or largest, so the optimum may lie beyond it). `shift` is log2(best / the high-precision
    recipe's best at the same N); `resolution` the grid's step in log2; `differs` is |shift| above
    one step, the probe's resolution. Columns: recipe, N, lr, edge, shift, resolution, differs."""
    rows = ok_rows(df)
    last = rows.loc[rows.groupby("run_id")["D"].idxmax()]
    out = []
    for (recipe, n), g in last.groupby(["recipe", "N"], sort=True):
        g = g.sort_values("lr")
        x, y = np.log2(g["lr"].to_numpy(float)), g[loss_column].to_numpy(float)
        i = int(np.argmin(y))
        best = x[i]
        if 0 < i < len(x) - 1:
            a, b, c = np.polyfit(x[i - 1:i + 2], y[i - 1:i + 2], 2)
            if a > 0 and x[i - 1] <= -b / (2 * a) <= x[i + 1]:
                best = -b / (2 * a)
        step = float(np.median(np.diff(x))) if len(x) > 1 else math.nan
        out.append({"recipe": recipe, "N": float(n), "lr": float(2 ** best), "edge": i in (0, len(x) - 1),
                    "resolution": step})
    table = pd.DataFrame(out, columns=["recipe", "N", "lr", "edge", "resolution"])
    reference = high_precision_recipe(last)
    ref = table[table["recipe"] == reference].set_index("N")["lr"]
    table["shift"] = np.log2(table["lr"] / table["N"].map(ref))
    table["differs"] = table["shift"].abs() > table["resolution"]
    return table[["recipe", "N", "lr", "edge", "shift", "resolution", "differs"]]


def residuals_by_recipe(df: pd.DataFrame, fit: Any, level: float = LEVEL,
                        loss_column: str = "val_loss") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Where a fitted law is biased: (rows with `residual` = observed - fitted loss, per recipe the
    mean residual over runs with a t confidence interval: recipe, mean, lo, hi, runs). A run's
    evaluations share its noise, so the interval treats runs, not rows, as independent."""
    rows = ok_rows(df)
    rows = rows.assign(residual=rows[loss_column].to_numpy(float) - np.asarray(fit.predict(rows), float))
    per_run = rows.groupby(["recipe", "run_id"], sort=True)["residual"].mean()
    out = []
    for recipe, r in per_run.groupby(level=0):
        n, mean = len(r), float(r.mean())
        half = float(stats.t.ppf(0.5 + level / 2, n - 1) * r.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
        out.append({"recipe": recipe, "mean": mean, "lo": mean - half, "hi": mean + half, "runs": n})
    return rows, pd.DataFrame(out, columns=["recipe", "mean", "lo", "hi", "runs"])


PUBLISHED = {"Kumar et al. 2024": (7.0, 8.0), "Sun et al. 2025": (4.0, 8.0)}
KAPPAS = (2.0, 4.0)  # fixed-kappa alternatives to a kumar-family fit's kappa = 3 (plus kappa fitted)


def loss_unit(df: pd.DataFrame) -> str:
    """'nats/byte' for byte-tokenised corpora (every corpus the toolkit trains on today), else 'nats/token'."""
    if "tokenizer" in df.columns and df["tokenizer"].dropna().astype(str).ne("bytes").any():
        return "nats/token"
    return "nats/byte"


def verdict(interval: Sequence[float] | None, lo: float, hi: float) -> str:
    """A published range against our P* interval (CI and specification range together): 'inside' if
    the whole interval lies in [lo, hi], 'outside' if none of it does, else 'cannot tell'."""
    if interval is None:
        return "cannot tell"
    a, b = interval
    if lo <= a and b <= hi:
        return "inside"
    if b < lo or a > hi:
        return "outside"
    return "cannot tell"


def specification_fits(df: pd.DataFrame, fit: Any, loss_column: str = "val_loss") -> list[tuple[str, Any]]:
    """The fits P* is reported across: the chosen law; for a law with kappa, kappa at each of KAPPAS
    and fitted; every candidate the selection found within noise of the best (fit.selection) whose
    precision axis is bits (`_has_bits`)."""
    out = [(f"{fit.law} (chosen{', kappa ' + format(fit.params['kappa'], 'g') if 'kappa' in fit.params else ''})", fit)]
    rows = ok_rows(df)
    if "kappa" in fit.params:
        for kappa in (*KAPPAS, None):
            fixed = {**(fit.fixed or {}), "kappa": kappa} if kappa is not None else \
                {k: v for k, v in (fit.fixed or {}).items() if k != "kappa"}
            try:
                alt = fit_lib.fit_law(rows, fit.law, fixed=fixed, loss_column=loss_column)
            except ConfigError:
                continue
            alt.data = {**alt.data, "shape": (fit.data or {}).get("shape")}
            out.append((f"{fit.law}, kappa {'fitted' if kappa is None else format(kappa, 'g')}", alt))
    chosen = (getattr(fit, "selection", None) or {}).get("chosen")
    for cand in (getattr(fit, "selection", None) or {}).get("candidates", []):
        if cand.get("within_noise") and cand.get("params") and cand.get("name") != chosen and _has_bits(cand["law"]):
            alt = fit_lib.FitResult(law=cand["law"], params=dict(cand["params"]), objective=0.0,
                                    residuals=np.zeros(0), fixed=cand.get("fixed") or {}, data=fit.data)
            out.append((f"{cand['name']} (within noise)", alt))
    return out


def _has_bits(law: str) -> bool:
    """Whether a law's precision axis is bits, which P* optimises over: not chinchilla (no precision
    term: the cost alone would pick the fewest bits) nor capacity (precision as each role's
    quantisation error, with no map from a hypothetical P to that error)."""
    return bool({"P", "P_w", "P_a", "P_g", "P_fwd", "P_bwd", "ebits", "mbits"} & set(laws.get(law).columns))


def integer_arm(df: pd.DataFrame) -> pd.DataFrame:
    """The like-for-like arm for Kumar et al. 2024, who trained integer weights and activations in the
    forward pass only: the rows of recipes whose forward GEMMs are integer and whose backward GEMMs
    are unquantised (format int*, P_bwd >= 16), plus the high-precision reference recipe's rows.
    Empty unless at least two such integer recipes are present."""
    if not {"format", "P_bwd", "recipe"} <= set(df.columns):
        return df.iloc[0:0]
    integer = df["format"].astype(str).str.startswith("int") & (df["P_bwd"].astype(float) >= 16)
    if df.loc[integer, "recipe"].nunique() < 2:
        return df.iloc[0:0]
    reference = high_precision_recipe(df)
    return df[integer | (df["recipe"] == reference)]


def findings(df: pd.DataFrame, fit: Any | None, *, cost: str = "bits", budgets: Sequence[float] | None = None,
             n_boot: int = 2000, ci_samples: int = 100, loss_column: str = "val_loss",
             noise_rows: pd.DataFrame | None = None) -> dict[str, Any]:
    """Everything REPORT.md may claim, as numbers: per budget the IsoFLOP analysis (each recipe's
    effective bits, minimum loss, CI, runs, probability of being best; winner or None), and P* at
    each budget with its bootstrap CI (chosen law, chosen cost model), its specification range
    (across specification_fits x optimal.cost_models) and the verdict against each published range.
    `integer_arm`: the same IsoFLOP analysis over the forward-only integer recipes and the reference
    alone (`integer_arm`), the comparison like for like with Kumar et al.; [] without that arm.
    noise_rows: the table whose seed replicates measure run-to-run noise (default df)."""
    cost_model = compute_lib.get(cost)
    main = compute_lib.backfill(ok_rows(df))
    noise_rows = df if noise_rows is None else noise_rows
    costable = "flops_fprop" in main.columns and main["flops_fprop"].notna().all()
    if not budgets:
        budgets = default_budgets(main, cost_model) if costable else []
    out = _measured_findings(df, main, budgets, cost_model, n_boot, noise_rows, costable)
    if costable:
        out["integer_arm"] = _integer_arm_findings(main, noise_rows, budgets, cost_model, n_boot)
    if fit is None:
        return out
    out["law"] = {"name": fit.law, "params": fit.params, "fixed": fit.fixed,
                  "heldout": fit.heldout, "selection": getattr(fit, "selection", None)}
    if not ({"P", "P_w", "P_a", "P_g", "P_fwd", "P_bwd", "ebits", "qerr_w"} & set(_law_columns(fit))):
        return out
    fit = _with_shape(fit, main)
    specs = specification_fits(main, fit, loss_column)
    chosen_cost = optimal.Cost(model=cost_model, shape=optimal.shape_of(fit))
    # no IsoFLOP budget: the law is still read at the largest compute a run reached
    at = budgets or ([float(with_cost(main, cost_model)["C"].max())] if costable else [])
    # what the IsoFLOP measurement itself cannot rule out at each budget: part of every P* interval, so a
    # law that disagrees with the measurement widens the interval instead of overruling it
    measured = {float(b["budget"]): measured_choice(b) for b in out["budgets"]}
    for c in at:
        if _has_bits(fit.law):
            entry = _pstar_over_bits(fit, c, specs, chosen_cost, ci_samples, measured.get(float(c), []))
        else:
            entry = _pstar_over_recipes(main, fit, c, specs, chosen_cost, cost_model, ci_samples,
                                        measured.get(float(c), []))
        out["P_star"].append(entry)
    return out


def _measured_findings(df: pd.DataFrame, main: pd.DataFrame, budgets: Sequence[float],
                       cost_model: compute_lib.CostModel, n_boot: int, noise_rows: pd.DataFrame,
                       costable: bool) -> dict[str, Any]:
    """findings' measured part: units, runs, seeds, and the IsoFLOP analysis at every budget (none
    when the results cannot be placed at a budget, with the reason as `note`); law parts empty."""
    return {
        "loss_unit": loss_unit(df), "cost_model": cost_model.describe(),
        "runs": int(main["run_id"].nunique()) if "run_id" in main.columns else len(main),
        "seeds_per_cell": _seeds_per_cell(main),
        "budgets": analyse(main, budgets, cost_model, n_boot=n_boot,
                           noise=replicate_noise(noise_rows)) if costable else [],
        "note": None if costable else "the results do not record FLOPs by part (nor size, recipe and "
                                      "flops_per_token to derive them), so no run can be placed at a budget",
        "law": None, "P_star": [], "integer_arm": [],
    }


def _integer_arm_findings(main: pd.DataFrame, noise_rows: pd.DataFrame, budgets: Sequence[float],
                          cost_model: compute_lib.CostModel, n_boot: int) -> list[dict[str, Any]]:
    """The IsoFLOP analysis of the forward-only integer arm at every budget, compared with the
    published ranges on the forward precision P (Kumar et al.'s), not effective bits; [] without the arm."""
    arm = integer_arm(main)
    if arm.empty:
        return []
    out = analyse(arm, budgets, cost_model, n_boot=n_boot, noise=replicate_noise(integer_arm(noise_rows)))
    for b in out:
        b["measured"] = measured_choice(b)
        forward = [m["P"] for m in b["measured"]]
        b["P_interval"] = [min(forward), max(forward)] if forward else None
        b["published"] = {name: verdict(b["P_interval"], lo, hi) for name, (lo, hi) in PUBLISHED.items()}
    return out


def _with_shape(fit: Any, main: pd.DataFrame) -> Any:
    """The fit, carrying its runs' unquantised share (for the cost of a hypothetical model) if it lacks one."""
    if (fit.data or {}).get("shape"):
        return fit
    fit = copy.copy(fit)
    fit.data = {**(fit.data or {}), "shape": compute_lib.Shape.from_results(compute_lib.backfill(main)).to_dict()}
    return fit


def _pstar_over_bits(fit: Any, compute: float, specs: list[tuple[str, Any]], chosen_cost: optimal.Cost,
                     ci_samples: int, measured: list[dict]) -> dict[str, Any]:
    """P* at `compute` for a law whose precision axis is bits: the optimum with its bootstrap CI, the
    specification range across laws and cost models, and the interval spanning them and the measured
    choice, with its verdict against each published range (or `error` if the optimum cannot be found)."""
    entry: dict[str, Any] = {"compute": float(compute), "measured": measured}
    try:
        best = optimal.optimal_precision(fit, compute, cost=chosen_cost, p_range=(2.0, 32.0))
        entry.update(P=best["P"], N=best["N"], D=best["D"])
        if len(getattr(fit, "samples", [])) >= 2:
            entry["P_ci"] = list(optimal.optimal_precision_ci(fit, compute, cost=chosen_cost, p_range=(2.0, 32.0),
                                                              max_samples=ci_samples)["P"])
        else:
            entry["P_ci"] = None
    except ConfigError as e:
        entry["error"] = str(e)
        return entry
    spec = optimal.specification_range(specs, compute, optimal.cost_models(fit))
    entry.update(P_range=spec["P_range"], specifications=spec["table"])
    span = [entry["P"], *(entry["P_ci"] or []), *(spec["P_range"] or []), *(m["bits"] for m in entry["measured"])]
    lo, hi = min(span), max(span)
    entry["interval"] = [lo, hi]
    entry["published"] = {name: verdict([lo, hi], a, b) for name, (a, b) in PUBLISHED.items()}
    return entry


def _pstar_over_recipes(main: pd.DataFrame, fit: Any, compute: float, specs: list[tuple[str, Any]],
                        chosen_cost: optimal.Cost, cost_model: compute_lib.CostModel, ci_samples: int,
                        measured: list[dict]) -> dict[str, Any]:
    """P* at `compute` for a law without a bits axis (e.g. capacity: precision as measured quantisation
    error, with no map from a hypothetical P to it). The law still ranks the measured recipes (each at
    its own quantisation errors and cost) under every cost model; a continuous P* comes only from the
    within-noise laws whose axis is bits, if any. `error` when nothing gives a P*."""
    costs = optimal.cost_models(fit)
    bits_specs = [(label, alt) for label, alt in specs[1:] if _has_bits(alt.law)]
    entry = {"compute": float(compute), "P": None, "P_ci": None, "no_bits_axis": fit.law,
             "recipes": recipe_optima(main, fit, compute, chosen_cost, cost_model, ci_samples),
             "measured": measured}
    table = []
    for cst in costs:
        top = (recipe_optima(main, fit, compute, cst, cost_model, bootstrap=False) or [None])[0]
        if top:
            table.append({"spec": f"{fit.law} (chosen; best recipe {top['recipe']})", "cost_model": cst.name,
                          "P": top["bits"], "N": top["N"], "D": top["D"], "loss": top["loss"]})
    if bits_specs:
        table += optimal.specification_range(bits_specs, compute, costs)["table"]
    ps = [r["P"] for r in table if "P" in r]
    if ps:
        entry.update(P_range=[float(min(ps)), float(max(ps))], specifications=table)
    bits = [e["bits"] for e in entry["recipes"] if e["best"]] + [b for e in entry["recipes"] for b in e["bits_ci"]]
    span = [*bits, *ps, *(m["bits"] for m in entry["measured"])]
    if not span:
        entry["error"] = (f"the chosen law ({fit.law}) prices precision by measured quantisation error, not "
                          "bits, and no law with a bits axis is within noise of it: these data give no P*")
    else:
        entry["interval"] = [min(span), max(span)]
        entry["published"] = {name: verdict(entry["interval"], a, b) for name, (a, b) in PUBLISHED.items()}
    return entry


def measured_choice(analysis: dict, level: float = LEVEL) -> list[dict]:
    """The recipes an IsoFLOP analysis at one budget (`isoflop`) cannot rule out as best: P(best) at
    least (1 - level) / 2 in the bootstrap, best first, with their effective bits."""
    keep = [e for e in analysis["recipes"] if e.get("p_best") is not None and e["p_best"] >= (1 - level) / 2]
    return [{"recipe": e["recipe"], "bits": float(e["bits_eff"]), "P": float(e["P"]), "p_best": float(e["p_best"])}
            for e in sorted(keep, key=lambda e: -e["p_best"])]


def recipe_optima(df: pd.DataFrame, fit: Any, compute: float, cost: optimal.Cost, cost_model: compute_lib.CostModel,
                  ci_samples: int | None = None, bootstrap: bool = True) -> list[dict]:
    """A law on quantisation errors (capacity) read at `compute` for each measured recipe: its median
    qerr_w/a/g over the runs and its mean effective bits as the cost's P (every quantised FLOP at
    that width: an approximation for recipes that quantise only some roles); the compute-optimal
    N, D and loss under the law, sorted best first. With bootstrap samples: p_best (share of resamples
    in which the recipe is the law's best) and bits_ci (the best recipe's bits over the resamples, on
    the best recipe's row only; `bootstrap=False` skips the resamples). Recipes with no quantisation
    error recorded are left out."""
    cols = [c for c in laws.QERR_COLUMNS if c in df.columns]
    if not cols or "recipe" not in df.columns:
        return []
    runs = with_cost(df, cost_model).dropna(subset=cols)
    per = runs.groupby("recipe").agg(**{c: (c, "median") for c in cols}, bits=("bits_eff", "mean"))

    def rank(params: dict | None) -> list[dict]:
        rows = []
        for recipe, r in per.iterrows():
            best = optimal.optimal_precision(fit, compute, [float(r["bits"])], cost=cost, params=params,
                                             context={c: float(r[c]) for c in cols})
            rows.append({"recipe": str(recipe), "bits": float(r["bits"]), "N": best["N"], "D": best["D"],
                         "loss": best["loss"]})
        return sorted(rows, key=lambda e: e["loss"])

    table = rank(None)
    samples = getattr(fit, "samples", pd.DataFrame()) if bootstrap else pd.DataFrame()
    samples = samples.iloc[:ci_samples] if ci_samples else samples
    winners = [rank(row)[0] for row in samples.to_dict("records")] if len(samples) >= 2 else []
    for i, e in enumerate(table):
        e["best"] = i == 0
        e["p_best"] = sum(w["recipe"] == e["recipe"] for w in winners) / len(winners) if winners else None
        e["bits_ci"] = ([float(np.percentile([w["bits"] for w in winners], q)) for q in (2.5, 97.5)]
                        if winners and i == 0 else [])
    return table


def _law_columns(fit: Any) -> tuple[str, ...]:
    return laws.get(fit.law).columns


def _seeds_per_cell(df: pd.DataFrame) -> list[int]:
    """[min, max] number of seeds per (sweep, recipe, N, D) cell."""
    if df.empty or "seed" not in df.columns:
        return [1, 1]
    keys = [k for k in ("sweep", "recipe", "N", "D") if k in df.columns]
    n = df.groupby(keys)["seed"].nunique()
    return [int(n.min()), int(n.max())]


# ----------------------------------------------------------------------------- the purpose sweeps

def final_rows(results: pd.DataFrame) -> pd.DataFrame:
    """Each run's row at the largest token budget it evaluated."""
    return results.sort_values("D").groupby("run_id", as_index=False).tail(1)


def purpose_rows(df: pd.DataFrame | None, name: str) -> pd.DataFrame | None:
    """The rows of one purpose sweep (PURPOSE_SWEEPS), each run's last evaluation; None if it has none."""
    if df is None or "sweep" not in df.columns:
        return None
    part = df[sweep_family(df["sweep"]) == name]
    return None if part.empty else final_rows(part).reset_index(drop=True)


def _direction(ci: Sequence[float] | None) -> str:
    """'lower' or 'higher' where an interval of a difference excludes zero, else 'cannot tell'."""
    if ci is None or ci[0] <= 0 <= ci[1]:
        return "cannot tell"
    return "lower" if ci[1] < 0 else "higher"


def _status_counts(df: pd.DataFrame, by: str) -> dict[str, dict[str, int]]:
    """{value of `by`: {status: runs}} for the runs that did not finish ok (diverged, failed, ...)."""
    bad = df[df["status"].astype(str) != "ok"] if "status" in df.columns else df.iloc[0:0]
    return {str(k): {str(s): int(n) for s, n in g["status"].value_counts().items()} for k, g in bad.groupby(by)}


def scheme_effects(df: pd.DataFrame, level: float = LEVEL) -> dict[str, Any] | None:
    """The granularity sweep: each scaling scheme (granularity x scale timing) against per-tensor,
    current scaling in the same format, paired by seed (same initialisation and data order).

    The paired differences' scatter about their means, pooled over the comparisons (sigma, dof = sum
    of (pairs - 1)), gives each mean difference a t interval; a comparison whose scatter is far above
    the others' (F test of the largest against the rest, repeated) keeps its own (`own_noise`). The
    intervals are simultaneous at `level` over all m comparisons (Bonferroni: each at 1 - (1 - level)
    / m), so "lower" or "higher" is a claim about the whole table, and "cannot tell" where an
    interval includes zero.
    Runs that did not finish ok are counted, not compared. None without the sweep's columns."""
    need = {"recipe", "format", "granularity", "scaling", "seed", "val_loss"}
    if df is None or not need <= set(df.columns):
        return None
    ok = ok_rows(df)
    cells = ok.groupby(["format", "granularity", "scaling", "seed"], as_index=False)["val_loss"].mean()
    recipes = ok.groupby(["format", "granularity", "scaling"])["recipe"].first()
    pairs = []
    for (fmt, gran, timing), recipe in recipes.items():
        if (gran, timing) == ("tensor", "current") or (fmt, "tensor", "current") not in recipes.index:
            continue
        mine = cells[(cells["format"] == fmt) & (cells["granularity"] == gran) & (cells["scaling"] == timing)]
        ref = cells[(cells["format"] == fmt) & (cells["granularity"] == "tensor") & (cells["scaling"] == "current")]
        both = mine.merge(ref, on="seed", suffixes=("", "_ref"))
        if len(both):
            pairs.append({"format": str(fmt), "recipe": str(recipe), "granularity": str(gran), "scaling": str(timing),
                          "reference": str(recipes[(fmt, "tensor", "current")]),
                          "d": (both["val_loss"] - both["val_loss_ref"]).to_numpy(),
                          "loss": float(both["val_loss"].mean()), "loss_ref": float(both["val_loss_ref"].mean())})
    m = len(pairs)
    for p in pairs:
        p["dof"] = len(p["d"]) - 1
        p["ss"] = float(np.sum((p["d"] - p["d"].mean()) ** 2))
    # One noise level for every comparison, unless one's scatter is far above the rest's (a scheme that
    # trains chaotically, e.g. delayed per-tensor scales at 6 bits): the largest is F-tested against the
    # others' pooled scatter at (1 - level) / k and, while it fails, keeps its own scatter.
    pooled = [p for p in pairs if p["dof"] >= 1]
    while len(pooled) >= 2:
        worst = max(pooled, key=lambda p: p["ss"] / p["dof"])
        rest = [p for p in pooled if p is not worst]
        rest_dof = sum(p["dof"] for p in rest)
        rest_var = sum(p["ss"] for p in rest) / rest_dof
        if rest_var > 0 and stats.f.sf(worst["ss"] / worst["dof"] / rest_var, worst["dof"], rest_dof) >= (1 - level) / len(pooled):
            break
        worst["own"] = True
        pooled = rest
    dof = sum(p["dof"] for p in pooled)
    sigma = math.sqrt(sum(p["ss"] for p in pooled) / dof) if dof else None
    rows = []
    for p in pairs:
        own = p.pop("own", False)
        mine = (math.sqrt(p["ss"] / p["dof"]), p["dof"]) if own else (sigma, dof)
        diff = float(p["d"].mean())
        ci = None
        if mine[0] is not None and mine[1] >= 1:
            half = float(stats.t.ppf(1 - (1 - level) / (2 * m), mine[1])) * mine[0] / math.sqrt(len(p["d"]))
            ci = [diff - half, diff + half]
        rows.append({k: v for k, v in p.items() if k not in ("d", "ss", "dof")} |
                    {"n": len(p["d"]), "diff": diff, "ci": ci, "own_noise": own, "verdict": _direction(ci)})
    return {"runs": int(df["run_id"].nunique()) if "run_id" in df.columns else len(df),
            "comparisons": m, "sigma": sigma, "dof": dof, "level": level, "rows": rows,
            "not_ok": _status_counts(df, "recipe")}


def smooth_swiglu_effect(df: pd.DataFrame, level: float = LEVEL) -> dict[str, Any] | None:
    """The outlier sweep: final validation loss with Smooth-SwiGLU on minus off, paired by everything
    else (recipe, learning rate, seed); the mean difference with a t interval on the pairs' own
    scatter (n - 1 dof), "cannot tell" where it includes zero. Runs that did not finish ok are
    counted by Smooth-SwiGLU on/off. None without the sweep's columns."""
    need = {"smooth_swiglu", "recipe", "lr", "seed", "val_loss"}
    if df is None or not need <= set(df.columns):
        return None
    keys = ["recipe", "lr", "seed"]
    ok = ok_rows(df).assign(smooth_swiglu=lambda d: d["smooth_swiglu"].astype(bool))
    on, off = (ok[ok["smooth_swiglu"] == flag].groupby(keys, as_index=False)["val_loss"].mean() for flag in (True, False))
    both = on.merge(off, on=keys, suffixes=("_on", "_off"))
    d = (both["val_loss_on"] - both["val_loss_off"]).to_numpy()
    n = len(d)
    diff = float(d.mean()) if n else None
    ci = None
    if n >= 2:
        half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * float(d.std(ddof=1)) / math.sqrt(n)
        ci = [diff - half, diff + half]
    status = df.assign(smooth_swiglu=df["smooth_swiglu"].astype(bool).map({True: "on", False: "off"}))
    return {"runs": int(df["run_id"].nunique()) if "run_id" in df.columns else len(df), "n": n, "diff": diff,
            "ci": ci, "level": level,
            "verdict": _direction(ci),
            "pairs": [{"recipe": str(r.recipe), "lr": float(r.lr), "seed": int(r.seed), "on": float(r.val_loss_on),
                       "off": float(r.val_loss_off)} for r in both.itertuples()],
            "not_ok": _status_counts(status, "smooth_swiglu")}
