"""A calibrated predictor: a law's prediction of any run, with an interval that holds how far the law's
extrapolations have missed before, measured by backtests inside the budgets it was fitted on.

Why: a law fitted on lower IsoFLOP budgets can miss the next budget by one level shift shared by every
recipe (REPORT's "A budget predicted before it was trained" and its backtests say by how much).
scaling.study.analysis.prediction.predict's interval is mostly an in-sample, zero-mean lack of fit drawn independently per recipe, so it neither
covers a shared miss nor lets a gap's interval shrink where the shared part cancels. Here:

Backtest (`backtest_pair`): fit the law on the rows with budget <= a, predict the rows labelled with a
higher budget b. Whole runs: a run with any row at b is left out of the fit (as selection.heldout_split
does), so no scored row is a later checkpoint of a fitted run. A row without a budget label (the
reference evaluated at another recipe's step) counts at the smallest labelled budget its run reaches at
or after its tokens; one past its run's last budget (a low-bit recipe's step, up to 4x the reference's
compute) counts at none: it is never fitted, only the matched reference of a gap. Each recipe at b enters the law with the median of the
law's other columns over its fitted rows (as predict.recipe_columns). Errors, measured - predicted in
nats, are split three ways: `shared` (one number per backtest: the mean over recipes of each recipe's
mean error), `per_recipe` (each recipe's mean minus the shared) and the rows' scatter about their
recipe's mean (`row_sd`).

Calibration (`calibration`), from the k backtests inside the fitted budgets (every pair a' < b' of them):
- the shared shift is a zero-mean random shift whose scale grows linearly with the distance beyond the
  top fitted budget in decades of compute, d = log10(C / top): tau = sqrt(mean_i (shared_i / d_i)^2)
  per decade, drawn as tau·d·t_k (Student t with k dof). Zero-mean, not a bias correction: with one
  or two backtests the sign of the next miss is one or two draws, and a correction would need a spread
  of the misses about their mean that k = 1 cannot give. The t_k tail is the exact predictive
  distribution of a new draw from k draws of a zero-mean normal with unknown scale, so the interval
  covers at its nominal rate when the per-decade misses are exchangeable; with k = 1 that tail is
  Cauchy's (t quantile 12.7 at 95%), so a level interval from one backtest is honestly wide, while
  gaps and ranks, where the shared part cancels, are not.
- per recipe, a correction and a term. A law that misprices a recipe tends to keep mispricing it, so
  each recipe's in-sample mean residual, less their mean over recipes (`bias`: it leaves the shared
  part alone), is added to its prediction with a weight w in [0, 1]: the least-squares slope of the
  backtests' per-recipe parts on their own fits' in-sample biases (learned from R recipes per backtest,
  not from k backtests; 0 without a backtest): near 1 on data whose offsets persist, lower where a
  recipe's in-sample misfit does not carry over (REPORT's backtests give the committed study's). What the backtests miss per recipe after the weighted correction gives
  sigma_recipe = sqrt(sum of squared parts / (k (R - 1))), t with k (R - 1) dof, one draw per recipe
  and draw (not scaled by distance);
- per row: sigma_row, the pooled scatter of backtest rows about their recipe's mean error (noise and
  the law's misfit along N), normal.
- the fit: the law's bootstrap resamples (runs resampled), one per draw, cycled.

A draw of a row's loss is law_b(x) + w·bias_recipe + S·d + delta_recipe + eps_row, with S common to
every row and recipe of the draw; a level interval is the percentile interval of a row's draws.

Gaps (a row minus the reference recipe's row at the same N, D; seed too in a backtest) are calibrated on
the backtests' own gap errors, where the shared shift has already cancelled: the law's resampled gap
(with the weighted correction) + a zero-mean per-recipe gap term (the RMS of the recipes' mean gap
errors over the backtests, t with as many dof as those means) + the gap rows' scatter about their
recipe's mean. Not the difference of two level draws: a law's misfit along N is mostly common to the
recipes at one N, so the level rows' scatter (larger than the gap rows' on the committed study) would
count twice what a gap sees. Without matched gaps in the backtests a gap falls back
to the difference of the level draws. P(best) is the share of draws in which a row is the lowest of the
rows at its (N, D) (with the reference there, on the gap draws, the reference at 0). Where a term cannot
be estimated (no backtest inside one budget; no rows to scatter), the interval it enters is None and
`notes` says why in words. Rows at or below the top fitted budget have d = 0.

The old interval (scaling.study.analysis.prediction.predict's kind, per row): the bootstrap draws plus a normal of the
fit's in-sample RMS residual (nats), independent per row, no shared term.

`backtest_all` (`backtest_pair` for one pair) scores both on every ordered pair of budgets, the
calibrated one calibrated only on the pairs inside its own fitted budgets, so no prediction is scored
on data its fit or its calibration has seen (a pair with no backtest below it gets `available` False and the reason).

JSON keys. backtest_all -> {method, law, level, bootstrap, budgets, reference, seconds, pairs: [pair],
skipped: [{fit_budget, target_budget, reason}] (pairs no backtest can split: every run serves both)},
pair =
{fit_budget, target_budget, distance (decades), law, fit_rows, fit_runs, target_rows, target_runs,
n (rows predicted), unpredicted (recipes at the target without fitted runs), mean_error,
mean_abs_error, shared (all of the law alone, no correction), recipe_bias {recipe: the fit's in-sample
misfit, centred over the target's recipes}, per_recipe {recipe: part}, recipe_mean {recipe: mean error}, row_sd, row_ss,
row_dof, gap_n (matched gaps to the reference), gap_mean_error, gap_recipe_mean {recipe: mean gap
error}, gap_row_sd, gap_row_ss, gap_row_dof,
old: {coverage, inside, n, mean_width, sigma, gap_coverage, gap_inside, gap_n, gap_mean_width,
rank_points, rank_hit, rank_p_measured, rank_called, rank_called_right (see _rank_score; rank keys
only where there are matched gaps)},
calibrated: {available, reason, calibrated_on [[a, b], ...], the same coverage keys as old, mean_error,
mean_abs_error, gap_mean_error, gap_mean_abs_error (of the corrected centre), and calibration}};
calibration = {k, backtests [[a, b], ...], shared [per backtest], distance [per backtest], tau (shared
shift per decade, or None), shared_dof, recipe_weight (w), recipe_rms {law, corrected} (the backtests'
per-recipe parts before and after the correction), sigma_recipe, recipe_dof,
sigma_row, row_dof, sigma_gap_recipe, gap_recipe_dof, sigma_gap_row, gap_row_dof, notes [str]}.
Errors are measured - predicted (negative: the runs came in lower than the law said). Widths are the
mean of hi - lo over the rows (or gaps) scored.

One module: the backtests, the calibration and the calibrated draws read one decomposition of the
misses (shared, per recipe, rows).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from scaling.errors import ConfigError
from scaling.study.analysis import isoflop as analysis, fit as fit_lib, laws, selection
from scaling.study.analysis.isoflop import LEVEL

DRAWS = 4000  # joint predictive draws (the law's resamples cycled)
METHOD = ("law + each recipe's in-sample misfit + bootstrap, a zero-mean shared shift tau·d·t_k (tau per decade "
          "from k backtests inside the fitted budgets), a per-recipe term and row scatter from the same backtests; "
          "gaps on the backtests' own gap errors")


# ----------------------------------------------------------------------------- which rows

def effective_budget(rows: pd.DataFrame) -> np.ndarray:
    """Each row's budget: its label, or for an unlabelled row the smallest labelled budget its run reaches
    at or after the row's tokens (NaN where none)."""
    rows = rows.reset_index(drop=True)
    label = pd.to_numeric(rows.get("budget", pd.Series(np.nan, index=rows.index)), errors="coerce").to_numpy(float)
    label = np.where(label > 0, label, np.nan)
    out = label.copy()
    unlabelled = ~np.isfinite(label)
    if not unlabelled.any():
        return out
    d = pd.to_numeric(rows["D"], errors="coerce").to_numpy(float)
    runs = rows["run_id"].to_numpy()
    wanted = np.flatnonzero(rows["run_id"].isin(set(runs[unlabelled])).to_numpy())
    for _, idx in rows.iloc[wanted].groupby("run_id", sort=False).indices.items():
        idx = wanted[idx]
        lab = idx[np.isfinite(label[idx])]
        for i in idx[~np.isfinite(label[idx])]:
            later = lab[d[lab] >= d[i] * (1 - 1e-9)]
            if len(later):
                out[i] = float(np.min(label[later]))
    return out


def budgets(rows: pd.DataFrame) -> list[float]:
    """The labelled budgets of a table, ascending."""
    b = pd.to_numeric(rows.get("budget", pd.Series(dtype=float)), errors="coerce")
    return sorted({float(v) for v in b.dropna() if v > 0})


def split(rows: pd.DataFrame, fit_budget: float, target_budget: float) -> tuple[np.ndarray, np.ndarray]:
    """(fit mask, target mask): rows at or below fit_budget of runs with no row labelled target_budget,
    and the rows labelled target_budget."""
    rows = rows.reset_index(drop=True)
    eff = effective_budget(rows)
    label = pd.to_numeric(rows["budget"], errors="coerce").to_numpy(float)
    target = np.isclose(label, target_budget, rtol=1e-9)
    held = rows["run_id"].isin(set(rows.loc[target, "run_id"])).to_numpy()
    fit = (eff <= fit_budget * (1 + 1e-9)) & ~held
    return fit, target


def unbacktestable(rows: pd.DataFrame, fit_budget: float, target_budget: float) -> str | None:
    """Why the backtest fit_budget -> target_budget cannot be made, in words (None: it can). A scored run
    is left out of the fit whole, so a design whose runs all serve both budgets (one run's cooldown
    branches at every budget) leaves nothing to fit."""
    fit, target = split(rows, fit_budget, target_budget)
    if not target.any():
        return f"no row at budget {target_budget:g}"
    if not fit.any():
        return ("every run at the lower budget also has a row at the higher one (cooldown branches of one run "
                "serve both), and a backtest fits only runs it does not score: nothing is left to fit")
    return None


# ----------------------------------------------------------------------------- a fitted law, its draws

@dataclass
class Model:
    """A law fitted on some rows, with its bootstrap and what a new row needs: each recipe's median of
    the law's other columns (`columns`), each recipe's budget units per 6ND (`ratio`), the top fitted
    budget, the in-sample RMS residual in nats (`sigma_in`, the old interval's noise) and each recipe's
    in-sample mean residual less their mean over recipes (`bias`, the per-recipe correction)."""

    fit: fit_lib.FitResult
    columns: pd.DataFrame
    ratio: pd.Series
    top: float
    sigma_in: float
    bias: pd.Series

    def frame(self, table: pd.DataFrame) -> pd.DataFrame:
        """table (N, D, recipe) with the law's other columns filled from the recipe's runs."""
        missing = sorted(set(table["recipe"].astype(str)) - set(self.columns.index))
        if missing:
            raise ConfigError("recipe", missing[0], f"a recipe with runs in the fitted results "
                              f"({', '.join(map(str, self.columns.index))})")
        out = table[["N", "D", "recipe"]].copy()
        out["recipe"] = out["recipe"].astype(str)
        for c in self.columns.columns:
            out[c] = out["recipe"].map(self.columns[c]).to_numpy(float)
        return out

    def draws(self, frame: pd.DataFrame, weight: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """(centre (rows,), draws (resamples, rows)): the fit's prediction and each resample's, each row
        plus `weight` times its recipe's `bias`."""
        law = self.fit.law_form  # a per-recipe law (kumar_eff) carries the recipes it was fitted on
        x = fit_lib._columns(law, frame, require_rows=False)
        centre = np.asarray(law.predict(self.fit.params, x, np), float)
        samples = self.fit.samples.to_dict("records") or [dict(self.fit.params)]
        with np.errstate(all="ignore"):
            draws = np.array([np.asarray(law.predict(p, x, np), float) for p in samples])
        draws = draws[np.isfinite(draws).all(axis=1)]
        draws = draws if len(draws) else centre[None]
        if weight:
            shift = weight * frame["recipe"].map(self.bias).fillna(0.0).to_numpy(float)
            centre, draws = centre + shift, draws + shift[None, :]
        return centre, draws

    def distance(self, frame: pd.DataFrame) -> np.ndarray:
        """Decades of compute beyond the top fitted budget (0 at or below it): 6ND in budget units by the
        recipe's own runs."""
        c = 6.0 * frame["N"].to_numpy(float) * frame["D"].to_numpy(float) * frame["recipe"].map(self.ratio).to_numpy(float)
        return np.maximum(0.0, np.log10(c / self.top))


def fit_model(rows: pd.DataFrame, law: str | None, *, candidates: Sequence[str] | None = None, bootstrap: int = 30,
              seed: int = 0, fit_kwargs: Mapping[str, Any] | None = None) -> Model:
    """Fit `law` (a candidate spec like 'kumar[kappa free]'; None: selection.select among `candidates`)
    on `rows` (ok rows, val_loss) and bootstrap it by runs."""
    rows = rows.reset_index(drop=True)
    fit_kwargs = dict(fit_kwargs or {})
    if law is None:
        choice, fits = selection.select(rows, candidates, loss_column="val_loss", fit_kwargs=fit_kwargs)
        if choice["chosen"] is None or choice["chosen"] not in fits:
            raise ConfigError("law", None, "data on which a candidate law can be fitted")
        fitted = fits[choice["chosen"]]
    else:
        cand = selection.parse_candidate(law)
        reason = fit_lib.unfittable_reason(rows, cand.law, cand.fixed, "val_loss")
        if reason:
            raise ConfigError("law", law, f"a law the results can fit ({reason})")
        fitted = fit_lib.fit_law(rows, cand.law, fixed=cand.fixed, loss_column="val_loss", **fit_kwargs)
    if bootstrap:
        fit_lib.bootstrap_fit(rows, fitted, bootstrap, seed=seed, loss_column="val_loss")
    cols = [c for c in laws.get(fitted.law).columns if c not in ("N", "D")]
    df = laws.with_derived_columns(rows, cols)
    columns = (df.groupby(df["recipe"].astype(str))[cols].median(numeric_only=True) if cols
               else pd.DataFrame(index=sorted(set(df["recipe"].astype(str)))))
    label = pd.to_numeric(rows["budget"], errors="coerce") if "budget" in rows else pd.Series(np.nan, index=rows.index)
    six = 6.0 * rows["N"].astype(float) * rows["D"].astype(float)
    ratio = (label / six).where(label > 0).groupby(rows["recipe"].astype(str)).median()
    ratio = ratio.reindex(columns.index).fillna(float(ratio.median()) if ratio.notna().any() else 1.0)
    top = float(label[label > 0].max()) if (label > 0).any() else float(six.max())
    resid = rows["val_loss"].to_numpy(float) - fitted.predict(rows)
    means = pd.Series(resid).groupby(rows["recipe"].astype(str).to_numpy()).mean()
    return Model(fitted, columns, ratio, top, float(np.sqrt(np.mean(resid ** 2))), means - means.mean())


# ----------------------------------------------------------------------------- backtests and calibration

def decompose(errors: np.ndarray, recipes: np.ndarray) -> dict[str, Any]:
    """measured - predicted errors -> shared (mean over recipes of each recipe's mean), per-recipe parts,
    each recipe's mean, and the rows' scatter about their recipe's mean (row_sd, row_dof, row_ss)."""
    names = sorted(set(recipes))
    means = {r: float(np.mean(errors[recipes == r])) for r in names}
    shared = float(np.mean(list(means.values())))
    resid = errors - np.array([means[r] for r in recipes])
    dof = len(errors) - len(names)
    ss = float(np.sum(resid ** 2))
    return {"shared": shared, "per_recipe": {r: m - shared for r, m in means.items()}, "recipe_mean": means,
            "row_sd": math.sqrt(ss / dof) if dof > 0 else None, "row_ss": ss, "row_dof": int(dof)}


class _Fits:
    """Fitted models cached by the rows they were fitted on (a backtest pair recurs inside larger ones)."""

    def __init__(self, law, candidates, bootstrap, seed, fit_kwargs):
        self.args, self.cache = (law, candidates, bootstrap, seed, fit_kwargs), {}

    def __call__(self, rows: pd.DataFrame) -> Model:
        key = tuple(sorted(map(str, rows["row_key"])))
        if key not in self.cache:
            law, candidates, bootstrap, seed, fit_kwargs = self.args
            self.cache[key] = fit_model(rows.drop(columns="row_key"), law, candidates=candidates, bootstrap=bootstrap,
                                        seed=seed, fit_kwargs=fit_kwargs)
        return self.cache[key]


def _backtest(rows: pd.DataFrame, a: float, b: float, fits: _Fits, reference: str | None) -> dict[str, Any]:
    """One backtest on `rows` (with row_key): the fit, the target frame, errors and their decomposition,
    and the matched gaps' errors and theirs."""
    fit_mask, target_mask = split(rows, a, b)
    fitted_rows, target = rows[fit_mask], rows[target_mask]
    model = fits(fitted_rows)
    known = target["recipe"].astype(str).isin(set(model.columns.index)).to_numpy()
    unpredicted = sorted(set(target.loc[~known, "recipe"].astype(str)))
    target = target[known].reset_index(drop=True)
    frame = model.frame(target)
    centre, draws = model.draws(frame)
    measured = target["val_loss"].to_numpy(float)
    errors = measured - centre
    recipes = frame["recipe"].to_numpy()
    out = {"fit_budget": float(a), "target_budget": float(b), "distance": float(math.log10(b / a)),
           "law": model.fit.law, "fit_rows": int(len(fitted_rows)), "fit_runs": int(fitted_rows["run_id"].nunique()),
           "target_rows": int(target_mask.sum()), "target_runs": int(rows.loc[target_mask, "run_id"].nunique()),
           "n": int(len(target)), "unpredicted": unpredicted,
           "mean_error": float(np.mean(errors)) if len(errors) else None,
           "mean_abs_error": float(np.mean(np.abs(errors))) if len(errors) else None}
    out.update(decompose(errors, recipes) if len(errors) else {"shared": None, "per_recipe": {}, "recipe_mean": {},
                                                               "row_sd": None, "row_ss": 0.0, "row_dof": 0})
    bias = model.bias.reindex(sorted(set(recipes))).fillna(0.0)
    out["recipe_bias"] = {r: float(v) for r, v in (bias - bias.mean()).items()}
    internal = {"model": model, "frame": frame, "target": target, "centre": centre, "draws": draws, "measured": measured}
    internal.update(_matched_gaps(rows, target, internal, reference, b))
    pairs = internal["pairs"]
    if pairs:
        i, j = np.array(pairs).T
        full_centre, _ = model.draws(internal["frame"])
        gap_errors = (internal["measured"][i] - internal["measured"][j]) - (full_centre[i] - full_centre[j])
        gap_recipes = internal["frame"]["recipe"].to_numpy()
        gap_bias = (pd.Series(gap_recipes).map(model.bias).fillna(0.0).to_numpy(float))
        internal.update(gap_errors=gap_errors, gap_recipes=gap_recipes[i], gap_bias=gap_bias[i] - gap_bias[j])
        gap = decompose(gap_errors, gap_recipes[i])
        out.update(gap_n=len(pairs), gap_mean_error=float(np.mean(gap_errors)), gap_recipe_mean=gap["recipe_mean"],
                   gap_row_sd=gap["row_sd"], gap_row_ss=gap["row_ss"], gap_row_dof=gap["row_dof"])
    else:
        out.update(gap_n=0, gap_mean_error=None, gap_recipe_mean={}, gap_row_sd=None, gap_row_ss=0.0, gap_row_dof=0)
    return {**out, "_": internal}


def _backtests(rows: pd.DataFrame, pairs: Sequence[tuple[float, float]], fits: _Fits,
               reference: str | None) -> tuple[list[dict[str, Any]], list[tuple[float, float, str]]]:
    """The backtests of `pairs` that can be made, and the others as (a, b, why not)."""
    done, skipped = [], []
    for a, b in pairs:
        why = unbacktestable(rows, a, b)
        if why is None:
            try:
                done.append(_backtest(rows, a, b, fits, reference))
                continue
            except ConfigError as e:  # the law cannot be fitted on the runs below the target alone
                why = f"the law cannot be fitted on the runs at budgets <= {a:g} ({e})"
        skipped.append((a, b, why))
    return done, skipped


def calibration(backtests: Sequence[Mapping[str, Any]], skipped: Sequence[tuple[float, float, str]] = ()) -> dict[str, Any]:
    """The calibrated terms from backtests (see module doc); None and a note where one cannot be estimated
    (`skipped`: the backtests that could not be made, (a, b, why))."""
    done = [bt for bt in backtests if bt.get("shared") is not None]
    k = len(done)
    out: dict[str, Any] = {"k": k, "backtests": [[bt["fit_budget"], bt["target_budget"]] for bt in done],
                           "shared": [bt["shared"] for bt in done], "distance": [bt["distance"] for bt in done],
                           "tau": None, "shared_dof": k, "recipe_weight": 0.0, "recipe_rms": None,
                           "sigma_recipe": None, "recipe_dof": 0,
                           "sigma_row": None, "row_dof": 0, "sigma_gap_recipe": None, "gap_recipe_dof": 0,
                           "sigma_gap_row": None, "gap_row_dof": 0, "notes": []}
    if not k:
        by_why: dict[str, list[str]] = {}
        for a, b, reason in skipped:
            by_why.setdefault(reason, []).append(f"{a:g} -> {b:g}")
        why = "; ".join(f"{', '.join(p)}: {r}" for r, p in by_why.items()) if skipped else "they hold one budget"
        out["notes"].append(f"no backtest inside the fitted budgets ({why}): the shared shift, "
                            "per-recipe and row terms cannot be estimated")
        return out
    out["tau"] = math.sqrt(float(np.mean([(bt["shared"] / bt["distance"]) ** 2 for bt in done])))
    law_parts = np.array([p for bt in done for p in bt["per_recipe"].values()])
    bias = np.array([bt["recipe_bias"].get(r, 0.0) for bt in done for r in bt["per_recipe"]])
    weight = float(np.clip(law_parts @ bias / (bias @ bias), 0.0, 1.0)) if bias @ bias > 0 else 0.0
    out["recipe_weight"] = weight
    out["recipe_rms"] = {"law": float(np.sqrt(np.mean(law_parts ** 2))),
                         "corrected": float(np.sqrt(np.mean((law_parts - weight * bias) ** 2)))}
    parts = list(law_parts - weight * bias)
    dof = sum(max(0, len(bt["per_recipe"]) - 1) for bt in done)
    if dof:
        out["sigma_recipe"], out["recipe_dof"] = math.sqrt(float(np.sum(np.square(parts))) / dof), int(dof)
    else:
        out["sigma_recipe"] = 0.0
        out["notes"].append("one recipe per backtest: no per-recipe part apart from the shared one")
    row_dof = sum(bt["row_dof"] for bt in done)
    if row_dof > 0:
        out["sigma_row"], out["row_dof"] = math.sqrt(sum(bt["row_ss"] for bt in done) / row_dof), int(row_dof)
    else:
        out["notes"].append("no backtest row beyond one per recipe: the row scatter cannot be estimated")
    gaps = [decompose(bt["_"]["gap_errors"] - weight * bt["_"]["gap_bias"], bt["_"]["gap_recipes"])
            for bt in done if "gap_errors" in bt.get("_", {})]
    gap_means = [m for g in gaps for m in g["recipe_mean"].values()]
    gap_dof = sum(g["row_dof"] for g in gaps)
    if gap_means and gap_dof > 0:
        out["sigma_gap_recipe"] = math.sqrt(float(np.mean(np.square(gap_means))))
        out["gap_recipe_dof"] = len(gap_means)
        out["sigma_gap_row"] = math.sqrt(sum(g["row_ss"] for g in gaps) / gap_dof)
        out["gap_row_dof"] = int(gap_dof)
    else:
        out["notes"].append("no matched gaps to the reference in the backtests: gap intervals come from the level "
                            "draws (their shared part cancels, their row terms do not)")
    if k == 1:
        out["notes"].append("one backtest: the shared shift's scale rests on one draw (t with 1 dof), so level "
                            "intervals are wide; gaps and ranks, where it cancels, are not")
    return out


def usable(calib: Mapping[str, Any]) -> str | None:
    """Why a calibration cannot give intervals, or None."""
    if calib.get("tau") is None or calib.get("sigma_row") is None:
        return "; ".join(calib.get("notes") or ["not calibrated"])
    return None


# ----------------------------------------------------------------------------- joint draws

def joint_draws(model: Model, frame: pd.DataFrame, calib: Mapping[str, Any] | None, *, distance: np.ndarray | None = None,
                n: int = DRAWS, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(centre, draws (n, rows)) of each row's loss: calibrated when `calib` is given (see module doc),
    else the old kind (law resamples + independent in-sample noise per row)."""
    centre, law = model.draws(frame, calib["recipe_weight"] if calib is not None else 0.0)
    rng = np.random.default_rng(seed)
    base = law[np.arange(n) % len(law)]
    if calib is None:
        return centre, base + rng.normal(0.0, model.sigma_in, base.shape)
    d = model.distance(frame) if distance is None else np.asarray(distance, float)
    shared = calib["tau"] * rng.standard_t(max(calib["shared_dof"], 1), size=(n, 1)) * d[None, :]
    names, idx = np.unique(frame["recipe"].to_numpy(), return_inverse=True)
    recipe_z = rng.standard_t(calib["recipe_dof"], size=(n, len(names))) if calib["recipe_dof"] else np.zeros((n, len(names)))
    per_recipe = calib["sigma_recipe"] * recipe_z[:, idx]
    return centre, base + shared + per_recipe + rng.normal(0.0, calib["sigma_row"], base.shape)


def gap_draws(model: Model, frame: pd.DataFrame, pairs: Sequence[tuple[int, int]], calib: Mapping[str, Any] | None,
              level_draws: np.ndarray, *, seed: int = 0) -> np.ndarray:
    """Draws (n, pairs) of each pair's gap, row i minus its reference row j: calibrated on the backtests'
    own gap errors where they had matched gaps (the law's resampled gap (with the weighted correction) + a zero-mean per-recipe gap term,
    t with as many dof as recipe means, + a gap-row normal), else the difference of the level draws."""
    n = len(level_draws)
    if not pairs:
        return np.zeros((n, 0))
    i, j = np.array(pairs).T
    if calib is None or calib.get("sigma_gap_row") is None:
        return level_draws[:, i] - level_draws[:, j]
    _, law = model.draws(frame, calib["recipe_weight"])
    base = law[np.arange(n) % len(law)]
    rng = np.random.default_rng(seed)
    names, idx = np.unique(frame["recipe"].to_numpy()[i], return_inverse=True)
    recipe = calib["sigma_gap_recipe"] * rng.standard_t(calib["gap_recipe_dof"], size=(n, len(names)))[:, idx]
    return base[:, i] - base[:, j] + recipe + rng.normal(0.0, calib["sigma_gap_row"], (n, len(i)))


def _interval(draws: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    q = (50 * (1 - level), 50 * (1 + level))
    lo, hi = np.percentile(draws, q, axis=0)
    return lo, hi


def gap_pairs(frame: pd.DataFrame, reference: str | None, keys: Sequence[str] = ("N", "D")) -> list[tuple[int, int]]:
    """(row, reference row) positions: every non-reference row with a reference row at the same keys."""
    if reference is None:
        return []
    frame = frame.reset_index(drop=True)
    groups = frame.groupby([frame[k] for k in keys], sort=False).indices
    out = []
    for idx in groups.values():
        refs = [i for i in idx if frame.at[i, "recipe"] == reference]
        out += [(int(i), int(refs[0])) for i in idx if refs and frame.at[i, "recipe"] != reference]
    return out


def _score(draws: np.ndarray, measured: np.ndarray, pairs: list[tuple[int, int]], level: float,
           n_levels: int, gaps: np.ndarray) -> dict[str, Any]:
    """Coverage of the level intervals (the first n_levels rows) and of the gap intervals (pairs)."""
    lo, hi = _interval(draws[:, :n_levels], level)
    inside = (lo <= measured[:n_levels]) & (measured[:n_levels] <= hi)
    out = {"coverage": float(inside.mean()) if len(inside) else None, "inside": int(inside.sum()), "n": int(len(inside)),
           "mean_width": float(np.mean(hi - lo)) if len(inside) else None,
           "gap_coverage": None, "gap_inside": 0, "gap_n": len(pairs), "gap_mean_width": None}
    if pairs:
        i, j = np.array(pairs).T
        glo, ghi = _interval(gaps, level)
        g = measured[i] - measured[j]
        gin = (glo <= g) & (g <= ghi)
        out.update(gap_coverage=float(gin.mean()), gap_inside=int(gin.sum()), gap_mean_width=float(np.mean(ghi - glo)))
        out.update(_rank_score(gaps, pairs, measured))
    return out


def _rank_score(gaps: np.ndarray, pairs: list[tuple[int, int]], measured: np.ndarray) -> dict[str, Any]:
    """Ranks at each matched point (a reference row and the rows paired with it): P(best) of each row from
    the gap draws (the reference at 0); `rank_hit` the share of points where the row most often best is
    the measured best, `rank_p_measured` the mean P(best) given to the measured best (1/rows: no better
    than a guess), `rank_called` the points where one row's P(best) >= 0.975 and `rank_called_right` how
    many of those it was the measured best."""
    i, j = np.array(pairs).T
    hits, p_measured, called, right = [], [], 0, 0
    for ref in np.unique(j):
        mine = np.flatnonzero(j == ref)
        rel = np.concatenate([np.zeros((len(gaps), 1)), gaps[:, mine]], axis=1)
        p = np.bincount(np.argmin(rel, axis=1), minlength=rel.shape[1]) / len(gaps)
        truth = int(np.argmin(np.concatenate([[measured[ref]], measured[i[mine]]])))
        hits.append(int(np.argmax(p)) == truth)
        p_measured.append(p[truth])
        if p.max() >= 0.975:
            called += 1
            right += int(np.argmax(p)) == truth
    return {"rank_points": len(hits), "rank_hit": float(np.mean(hits)), "rank_p_measured": float(np.mean(p_measured)),
            "rank_called": called, "rank_called_right": right}


# ----------------------------------------------------------------------------- every pair

def _keyed(rows: pd.DataFrame, need_budgets: bool = True) -> pd.DataFrame:
    """ok rows with a key per (run, D, budget); `need_budgets`: refused without budget labels (a backtest
    splits by them; predicting rows does not need them)."""
    rows = analysis.ok_rows(rows)
    if "budget" not in rows.columns or not budgets(rows):
        if need_budgets:
            raise ConfigError("results", "no rows labelled with an IsoFLOP budget", "results of an IsoFLOP design (a budget column)")
        rows = rows.assign(budget=np.nan)
    return rows.assign(row_key=[f"{r}|{d!r}|{b!r}" for r, d, b in zip(rows["run_id"], rows["D"], rows["budget"])])


def _inner(rows: pd.DataFrame, a: float, b: float, fits: _Fits, reference: str | None) -> list[dict[str, Any]]:
    """The backtests inside the fitted budgets of pair (a, b): every pair a' < b' <= a on the runs without
    a row at b, their rows at budgets <= a, plus the reference's evaluations past its last budget at
    other recipes' steps (no budget of their own: never fitted, the matched reference of a gap at b')."""
    _, target_mask = split(rows, a, b)
    held = rows["run_id"].isin(set(rows.loc[target_mask, "run_id"])).to_numpy()
    eff = effective_budget(rows)
    seen = rows[~held & ((eff <= a * (1 + 1e-9)) | np.isnan(eff))].reset_index(drop=True)
    inner = [x for x in budgets(seen) if x <= a * (1 + 1e-9)]
    return _backtests(seen, [(a2, b2) for j, b2 in enumerate(inner) for a2 in inner[:j]], fits, reference)


def backtest_all(rows: pd.DataFrame, law: str | None = None, *, candidates: Sequence[str] | None = None,
                 bootstrap: int = 30, seed: int = 0, level: float = LEVEL, reference: str | None = None,
                 fit_kwargs: Mapping[str, Any] | None = None, draws: int = DRAWS) -> dict[str, Any]:
    """Every ordered pair of budgets (fit on <= a, predict b > a), scored with the old and the calibrated
    intervals (keys: module doc). reference: the recipe gaps are taken to (default the table's
    highest-precision recipe); gaps are scored at matched (N, D, seed) rows of the target budget's runs."""
    start = time.perf_counter()
    rows = _keyed(rows)
    found = budgets(rows)
    fits = _Fits(law, candidates, bootstrap, seed, fit_kwargs)
    reference = reference or analysis.high_precision_recipe(rows)
    if len(found) < 2:
        raise ConfigError("results", f"one budget ({found[0]:g})", "results at two or more IsoFLOP budgets (a backtest "
                          "fits the lower budgets and scores a higher one)")
    every = [(a, b) for j, b in enumerate(found) for a in found[:j]]
    skipped = [(a, b, why) for a, b in every if (why := unbacktestable(rows, a, b))]
    if len(skipped) == len(every):
        raise ConfigError("results", f"budgets {', '.join(f'{b:g}' for b in found)}",
                          f"a design a backtest can split ({skipped[0][2]})")
    pairs = [_score_pair(rows, a, b, fits, reference, level, draws, seed) for a, b in every
             if not unbacktestable(rows, a, b)]
    return {"method": METHOD, "law": law or "selected per fit", "level": level, "bootstrap": bootstrap,
            "budgets": found, "reference": reference, "pairs": pairs,
            "skipped": [{"fit_budget": a, "target_budget": b, "reason": why} for a, b, why in skipped],
            "seconds": time.perf_counter() - start}


def backtest_pair(rows: pd.DataFrame, fit_budget: float, target_budget: float, law: str | None = None, *,
                  candidates: Sequence[str] | None = None, bootstrap: int = 30, seed: int = 0, level: float = LEVEL,
                  reference: str | None = None, fit_kwargs: Mapping[str, Any] | None = None,
                  draws: int = DRAWS) -> dict[str, Any]:
    """One pair of backtest_all (the same keys), calibrated on the pairs inside its fitted budgets."""
    rows = _keyed(rows)
    fits = _Fits(law, candidates, bootstrap, seed, fit_kwargs)
    reference = reference or analysis.high_precision_recipe(rows)
    why = unbacktestable(rows, fit_budget, target_budget)
    if why:
        raise ConfigError("backtest", f"{fit_budget:g} -> {target_budget:g}", f"a pair of budgets a backtest can split ({why})")
    return _score_pair(rows, fit_budget, target_budget, fits, reference, level, draws, seed)


def _score_pair(rows: pd.DataFrame, a: float, b: float, fits: _Fits, reference: str | None, level: float,
                draws: int, seed: int) -> dict[str, Any]:
    bt = _backtest(rows, a, b, fits, reference)
    inner = bt.pop("_")
    calib = calibration(*_inner(rows, a, b, fits, reference))
    frame, measured, n_levels, model, pairs = (inner["frame"], inner["measured"], inner["n_levels"], inner["model"],
                                               inner["pairs"])
    _, old = joint_draws(model, frame, None, n=draws, seed=seed)
    bt["old"] = {**_score(old, measured, pairs, level, n_levels, gap_draws(model, frame, pairs, None, old)),
                 "sigma": model.sigma_in}
    reason = usable(calib)
    cal = {"available": reason is None, "reason": reason, "calibrated_on": calib["backtests"], "calibration": calib}
    if reason is None:
        dist = np.full(len(frame), math.log10(b / a))
        centre, new = joint_draws(model, frame, calib, distance=dist, n=draws, seed=seed + 1)
        gaps = gap_draws(model, frame, pairs, calib, new, seed=seed + 2)
        cal.update(_score(new, measured, pairs, level, n_levels, gaps))
        errors = measured[:n_levels] - centre[:n_levels]
        cal.update(mean_error=float(np.mean(errors)), mean_abs_error=float(np.mean(np.abs(errors))))
        if pairs:
            i, j = np.array(pairs).T
            gap_errors = (measured[i] - measured[j]) - (centre[i] - centre[j])
            cal.update(gap_mean_error=float(np.mean(gap_errors)), gap_mean_abs_error=float(np.mean(np.abs(gap_errors))))
    bt["calibrated"] = cal
    return bt


def _matched_gaps(rows: pd.DataFrame, target: pd.DataFrame, inner: Mapping[str, Any], reference: str | None,
                  b: float) -> dict[str, Any]:
    """The scoring frame: the target rows (levels) followed by the target runs' reference rows at the same
    (N, D, seed) that are not target rows themselves (unlabelled evaluations), and the gap pairs."""
    model, frame, measured = inner["model"], inner["frame"], inner["measured"]
    if reference is None or reference not in model.columns.index:
        return {"frame": frame, "measured": measured, "pairs": [], "n_levels": len(frame)}
    label = pd.to_numeric(rows["budget"], errors="coerce").to_numpy(float)
    target_mask = np.isclose(label, b, rtol=1e-9)
    runs = set(rows.loc[target_mask, "run_id"])
    extra = rows[rows["run_id"].isin(runs) & ~target_mask & (rows["recipe"].astype(str) == reference)]
    ext_frame = model.frame(extra.reset_index(drop=True))
    both = pd.concat([frame, ext_frame], ignore_index=True)
    seeds = pd.concat([target.get("seed", pd.Series(0, index=target.index)).reset_index(drop=True),
                       extra.get("seed", pd.Series(0, index=extra.index)).reset_index(drop=True)], ignore_index=True)
    keyed = both.assign(seed=seeds.to_numpy())
    pairs = [(i, j) for i, j in gap_pairs(keyed, reference, ("N", "D", "seed")) if i < len(frame)]
    # levels are scored on the target rows only: the extra rows enter the gaps alone
    return {"frame": both, "measured": np.concatenate([measured, extra["val_loss"].to_numpy(float)]), "pairs": pairs,
            "n_levels": len(frame)}


# ----------------------------------------------------------------------------- any rows

def predict_table(results: pd.DataFrame, table: pd.DataFrame, law: str | None = None, *,
                  candidates: Sequence[str] | None = None, bootstrap: int = 30, seed: int = 0, level: float = LEVEL,
                  reference: str | None = None, fit_kwargs: Mapping[str, Any] | None = None,
                  draws: int = DRAWS) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Each row of `table` (N, D, recipe) predicted by the law fitted on every ok row of `results`,
    calibrated by the backtests inside the results' budgets (module doc). Returns (the table with
    loss (the law plus its recipe's correction), loss_lo, loss_hi, law_loss (the law alone), distance (decades beyond the top fitted budget), gap_reference, gap,
    gap_lo, gap_hi (to the reference recipe's row at the same N, D, where the table has one), p_best
    (among the rows at the same N, D; NaN alone), old_lo, old_hi (the old interval), interval
    ('calibrated', or why there is none), level; facts {law, fixed, params, level, method, budgets,
    top_budget, reference, calibration, backtests [pair facts without scores], notes})."""
    missing = [c for c in ("N", "D", "recipe") if c not in table.columns]
    if missing:
        raise ConfigError("rows", f"missing {', '.join(missing)}", "a table with columns N, D, recipe")
    for c in ("N", "D"):
        v = pd.to_numeric(table[c], errors="coerce").to_numpy(float)
        if not (np.isfinite(v) & (v > 0)).all():
            bad = table[c].tolist()[int(np.flatnonzero(~(np.isfinite(v) & (v > 0)))[0])]
            raise ConfigError(c, bad, "numbers > 0 in every row")
    if len(table) == 0:
        raise ConfigError("rows", 0, "at least one row to predict")
    rows = _keyed(results, need_budgets=False)
    known = set(rows["recipe"].astype(str))
    unknown = [r for r in dict.fromkeys(table["recipe"].astype(str)) if r not in known]
    if unknown:
        raise ConfigError("recipe", unknown[0], f"a recipe with runs in the results ({', '.join(sorted(known))})")
    fits = _Fits(law, candidates, bootstrap, seed, fit_kwargs)
    model = fits(rows)
    found = budgets(rows)
    reference = reference or analysis.high_precision_recipe(rows)
    backtests, skipped = _backtests(rows, [(a, b) for j, b in enumerate(found) for a in found[:j]], fits, reference)
    calib = calibration(backtests, skipped)
    if not found:  # a grid of runs, not an IsoFLOP design: the law's own interval, saying why
        calib["notes"] = ["the results carry no IsoFLOP budget labels, so no backtest inside them calibrates the "
                          "interval: the shared shift, per-recipe and row terms cannot be estimated"]
    for bt in backtests:
        bt.pop("_")
    table = table.assign(N=pd.to_numeric(table["N"]).astype(float), D=pd.to_numeric(table["D"]).astype(float),
                         recipe=table["recipe"].astype(str)).reset_index(drop=True)
    frame = model.frame(table)
    reason = usable(calib)
    law_centre, old = joint_draws(model, frame, None, n=draws, seed=seed)
    centre, _ = model.draws(frame, calib["recipe_weight"])
    out = table.copy()
    out["loss"], out["law_loss"] = centre, law_centre
    out["distance"] = model.distance(frame)
    out["old_lo"], out["old_hi"] = _interval(old, level)
    for c in ("loss_lo", "loss_hi", "gap", "gap_lo", "gap_hi", "p_best"):
        out[c] = np.nan
    out["gap_reference"] = ""
    pairs = gap_pairs(frame, reference)
    for i, j in pairs:
        out.loc[i, "gap"], out.loc[i, "gap_reference"] = centre[i] - centre[j], reference
    if reason is None:
        _, new = joint_draws(model, frame, calib, n=draws, seed=seed + 1)
        out["loss_lo"], out["loss_hi"] = _interval(new, level)
        gaps = gap_draws(model, frame, pairs, calib, new, seed=seed + 2)
        relative = new.copy()  # within an (N, D) with the reference: each row's gap draw, the reference at 0
        if pairs:
            i, j = np.array(pairs).T
            out.loc[i, "gap_lo"], out.loc[i, "gap_hi"] = _interval(gaps, level)
            relative[:, i], relative[:, j] = gaps, 0.0
        for idx in frame.groupby(["N", "D"], sort=False).indices.values():
            if len(set(frame["recipe"].to_numpy()[idx])) > 1:
                best = np.argmin(relative[:, idx], axis=1)
                out.loc[idx, "p_best"] = np.bincount(best, minlength=len(idx)) / len(new)
    out["interval"] = "calibrated" if reason is None else f"none: {reason}"
    out["level"] = level
    facts = {"law": model.fit.law, "fixed": model.fit.fixed, "params": model.fit.params, "level": level, "method": METHOD, "budgets": found,
             "top_budget": model.top, "reference": reference, "calibration": calib,
             "backtests": [{k: v for k, v in bt.items()} for bt in backtests], "notes": calib["notes"]}
    cols = ["N", "D", "recipe", "loss", "loss_lo", "loss_hi", "law_loss", "distance", "gap_reference", "gap", "gap_lo", "gap_hi",
            "p_best", "old_lo", "old_hi", "interval", "level"]
    return out[cols + [c for c in out.columns if c not in cols]], facts
