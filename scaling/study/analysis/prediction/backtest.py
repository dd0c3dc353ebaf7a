"""Backtests: a law fitted on part of the results predicts the rest, and its misses are measured.

Two kinds, each holding out everything at or beyond its threshold:

- along compute (`Split("budget", a, b)`): fit the rows at IsoFLOP budgets <= a of the runs with no row
  at b (a scored run is never a fitted run's later checkpoint), predict the rows labelled b. A row
  without a label (the reference evaluated at another recipe's step) counts at the smallest labelled
  budget its run reaches at or after its tokens (`effective_budget`); past its run's last budget it is
  never fitted, only the matched reference of a gap.
- along N (`Split("size", t)`): fit the rows with N < t, predict every row with N >= t (a run has one N,
  so runs are held out whole). Thresholds (`size_thresholds`): distinct sizes that leave at least half
  of the table's distinct sizes, and MIN_SIZES of them, in the fit; at most SIZE_SPLITS, spread evenly.

Each backtest keeps every target row's distance from the data its law was fitted on (`Model.distances`:
decades beyond the fitted compute, beyond the fitted N, outside the fitted range of D/N), and splits its
misses (measured - predicted, nats) into a part shared by every recipe, per-recipe parts and the rows'
scatter about their recipe's mean (`decompose`), which the calibration (calibrate.py) reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from scaling.errors import ConfigError
from scaling.study.analysis import isoflop as analysis, fit as fit_lib, laws, selection

MIN_SIZES = 3  # distinct sizes a size backtest fits at least (a law with an N term and a D term needs a few)
SIZE_SPLITS = 3  # size thresholds per table at most: each is one more fit, nested ones one per outer backtest
_TOL = 1e-9


@dataclass(frozen=True)
class Split:
    """One backtest: kind 'budget' (fit budgets <= a, predict budget b) or 'size' (fit N < a, predict N >= a)."""

    kind: str
    a: float
    b: float | None = None

    @property
    def label(self) -> str:
        return f"C {self.a:.3g} -> {self.b:.3g}" if self.kind == "budget" else f"N >= {self.a:.3g}"

    def order(self) -> tuple[float, ...]:
        """Later backtests sort last: the nearest to the top of the data."""
        return (self.b, self.a) if self.kind == "budget" else (self.a,)


# ----------------------------------------------------------------------------- which rows

def effective_budget(rows: pd.DataFrame) -> np.ndarray:
    """Each row's budget: its label, or for an unlabelled row the smallest labelled budget its run reaches
    at or after the row's tokens (NaN where none)."""
    rows = rows.reset_index(drop=True)
    label = pd.to_numeric(rows.get("budget", pd.Series(np.nan, index=rows.index)), errors="coerce").to_numpy(float)
    label = np.where(label > 0, label, np.nan)
    out = label.copy()
    unlabelled = ~np.isfinite(label)
    if not unlabelled.any() or not np.isfinite(label).any():
        return out
    d = pd.to_numeric(rows["D"], errors="coerce").to_numpy(float)
    runs = rows["run_id"].to_numpy()
    wanted = np.flatnonzero(rows["run_id"].isin(set(runs[unlabelled])).to_numpy())
    for _, idx in rows.iloc[wanted].groupby("run_id", sort=False).indices.items():
        idx = wanted[idx]
        lab = idx[np.isfinite(label[idx])]
        for i in idx[~np.isfinite(label[idx])]:
            later = lab[d[lab] >= d[i] * (1 - _TOL)]
            if len(later):
                out[i] = float(np.min(label[later]))
    return out


def budgets(rows: pd.DataFrame) -> list[float]:
    """The labelled budgets of a table, ascending."""
    b = pd.to_numeric(rows.get("budget", pd.Series(dtype=float)), errors="coerce")
    return sorted({float(v) for v in b.dropna() if v > 0})


def split(rows: pd.DataFrame, fit_budget: float, target_budget: float) -> tuple[np.ndarray, np.ndarray]:
    """(fit mask, target mask) along compute: rows at or below fit_budget of runs with no row labelled
    target_budget, and the rows labelled target_budget."""
    rows = rows.reset_index(drop=True)
    eff = effective_budget(rows)
    label = pd.to_numeric(rows.get("budget", pd.Series(np.nan, index=rows.index)), errors="coerce").to_numpy(float)
    target = np.isclose(label, target_budget, rtol=_TOL)
    held = rows["run_id"].isin(set(rows.loc[target, "run_id"])).to_numpy()
    fit = (eff <= fit_budget * (1 + _TOL)) & ~held
    return fit, target


def size_split(rows: pd.DataFrame, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """(fit mask, target mask) along N: rows with N < threshold, rows with N >= threshold. In a table with
    budget labels, only rows that count at a budget (effective_budget) take part: an evaluation past its
    run's last budget is a gap's reference, not a size's measurement."""
    rows = rows.reset_index(drop=True)
    n = rows["N"].to_numpy(float)
    part = np.isfinite(effective_budget(rows)) if budgets(rows) else np.ones(len(rows), bool)
    beyond = n >= threshold * (1 - _TOL)
    return part & ~beyond, part & beyond


def masks(rows: pd.DataFrame, spec: Split) -> tuple[np.ndarray, np.ndarray]:
    return split(rows, spec.a, spec.b) if spec.kind == "budget" else size_split(rows, spec.a)


def size_thresholds(rows: pd.DataFrame) -> list[float]:
    """The size backtests' thresholds (module doc), ascending."""
    fit, _ = size_split(rows, math.inf)
    sizes = np.unique(rows["N"].to_numpy(float)[fit])
    first = max(MIN_SIZES, math.ceil(len(sizes) / 2))
    if len(sizes) <= first:
        return []
    picks = np.unique(np.round(np.linspace(first, len(sizes) - 1, min(SIZE_SPLITS, len(sizes) - first))).astype(int))
    return [float(sizes[i]) for i in picks]


def splits(rows: pd.DataFrame) -> list[Split]:
    """Every backtest a table offers: each ordered pair of its budgets, then each size threshold."""
    found = budgets(rows)
    return ([Split("budget", a, b) for j, b in enumerate(found) for a in found[:j]]
            + [Split("size", t) for t in size_thresholds(rows)])


def why_not(rows: pd.DataFrame, spec: Split) -> str | None:
    """Why a backtest cannot be made, in words (None: it can)."""
    fit, target = masks(rows, spec)
    if not target.any():
        return f"no row at {spec.label}"
    if not fit.any():
        if spec.kind == "size":
            return f"no row below N {spec.a:.3g} to fit"
        return ("every run at the lower budget also has a row at the higher one (cooldown branches of one run "
                "serve both), and a backtest fits only runs it does not score: nothing is left to fit")
    return None


def unbacktestable(rows: pd.DataFrame, fit_budget: float, target_budget: float) -> str | None:
    """why_not for the budget backtest fit_budget -> target_budget."""
    return why_not(rows, Split("budget", fit_budget, target_budget))


def inner_rows(rows: pd.DataFrame, spec: Split) -> pd.DataFrame:
    """The rows a backtest may learn from: its fitted rows, plus (along compute) the reference's
    evaluations past its last budget on runs it does not score (never fitted; a gap's matched reference)."""
    fit, target = masks(rows, spec)
    if spec.kind == "size":
        return rows[fit].reset_index(drop=True)
    held = rows["run_id"].isin(set(rows.loc[target, "run_id"])).to_numpy()
    return rows[fit | (~held & np.isnan(effective_budget(rows)))].reset_index(drop=True)


# ----------------------------------------------------------------------------- a fitted law, its draws

@dataclass
class Model:
    """A law fitted on some rows, with its bootstrap and what a new row needs: each recipe's median of
    the law's other columns (`columns`), each recipe's budget units per 6ND (`ratio`), the fitted data's
    reach (top budget, largest N, range of log10 D/N), the in-sample RMS residual in nats (`sigma_in`)
    and each recipe's in-sample mean residual less their mean over recipes (`bias`)."""

    fit: fit_lib.FitResult
    columns: pd.DataFrame
    ratio: pd.Series
    top: float
    sigma_in: float
    bias: pd.Series
    n_max: float = math.inf
    dn_range: tuple[float, float] = (-math.inf, math.inf)

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
        samples = (self.fit.samples.to_dict("records") if self.fit.bootstrap else []) or [dict(self.fit.params)]
        with np.errstate(all="ignore"):
            draws = np.array([np.asarray(law.predict(p, x, np), float) for p in samples])
        draws = draws[np.isfinite(draws).all(axis=1)]
        draws = draws if len(draws) else centre[None]
        if weight:
            shift = weight * frame["recipe"].map(self.bias).fillna(0.0).to_numpy(float)
            centre, draws = centre + shift, draws + shift[None, :]
        return centre, draws

    def distances(self, frame: pd.DataFrame) -> np.ndarray:
        """(rows, 3): decades beyond the fitted data in compute (6ND in budget units by the recipe's own
        runs, against the top fitted budget), in N (against the largest fitted N) and in D/N (outside the
        fitted range); 0 inside."""
        n, d = frame["N"].to_numpy(float), frame["D"].to_numpy(float)
        c = 6.0 * n * d * frame["recipe"].map(self.ratio).to_numpy(float)
        dn = np.log10(d / n)
        return np.stack([np.maximum(0.0, np.log10(c / self.top)), np.maximum(0.0, np.log10(n / self.n_max)),
                         np.maximum(0.0, np.maximum(dn - self.dn_range[1], self.dn_range[0] - dn))], axis=1)

    def distance(self, frame: pd.DataFrame) -> np.ndarray:
        """Each row's distance from the fitted data: the length of `distances` (decades)."""
        return np.sqrt(np.sum(self.distances(frame) ** 2, axis=1))


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
    n, d = rows["N"].astype(float), rows["D"].astype(float)
    six = 6.0 * n * d
    ratio = (label / six).where(label > 0).groupby(rows["recipe"].astype(str)).median()
    ratio = ratio.reindex(columns.index).fillna(float(ratio.median()) if ratio.notna().any() else 1.0)
    top = float(label[label > 0].max()) if (label > 0).any() else float(six.max())
    resid = rows["val_loss"].to_numpy(float) - fitted.predict(rows)
    means = pd.Series(resid).groupby(rows["recipe"].astype(str).to_numpy()).mean()
    dn = np.log10(d / n)
    return Model(fitted, columns, ratio, top, float(np.sqrt(np.mean(resid ** 2))), means - means.mean(),
                 float(n.max()), (float(dn.min()), float(dn.max())))


class Fits:
    """Fitted models cached by the rows they were fitted on (a backtest recurs inside larger ones; so does
    a law that cannot be fitted on them: its ConfigError is raised again), and each backtest's misses
    (`runs`, by rows, split and reference); the bootstrap is run only where a predictor's draws are
    scored (`bootstrap=True`), once per fit."""

    def __init__(self, law, candidates, bootstrap, seed, fit_kwargs):
        self.law, self.candidates, self.n_boot, self.seed, self.fit_kwargs = law, candidates, bootstrap, seed, fit_kwargs
        self.cache: dict[tuple, list] = {}
        self.runs: dict[tuple, dict] = {}  # run's backtests by (rows, split, reference)

    def __call__(self, rows: pd.DataFrame, bootstrap: bool = True) -> Model:
        key = _rows_key(rows)
        plain = rows.drop(columns="row_key").reset_index(drop=True)
        if key not in self.cache:
            try:
                model = fit_model(plain, self.law, candidates=self.candidates, bootstrap=0, seed=self.seed,
                                  fit_kwargs=self.fit_kwargs)
            except ConfigError as e:
                self.cache[key] = [e, False]
                raise
            self.cache[key] = [model, False]
        entry = self.cache[key]
        if isinstance(entry[0], ConfigError):
            raise entry[0]
        if bootstrap and self.n_boot and not entry[1]:
            fit_lib.bootstrap_fit(plain, entry[0].fit, self.n_boot, seed=self.seed, loss_column="val_loss")
            entry[1] = True
        return entry[0]


def _rows_key(rows: pd.DataFrame) -> tuple:
    return tuple(sorted(map(str, rows["row_key"])))


def keyed(rows: pd.DataFrame) -> pd.DataFrame:
    """ok rows with a key per (run, D, budget) (the fit cache's key); a table without budget labels gets
    an empty budget column."""
    rows = analysis.ok_rows(rows)
    if "budget" not in rows.columns:
        rows = rows.assign(budget=np.nan)
    return rows.assign(row_key=[f"{r}|{d!r}|{b!r}" for r, d, b in zip(rows["run_id"], rows["D"], rows["budget"])])


# ----------------------------------------------------------------------------- one backtest's misses

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


def gap_pairs(frame: pd.DataFrame, reference: str | None, keys: Sequence[str] = ("N", "D")) -> list[tuple[int, int]]:
    """(row, reference row) positions: every non-reference row with a reference row at the same keys (the
    first such reference row), groups in order of first appearance, rows in order within each."""
    if reference is None:
        return []
    if not len(frame):
        return []
    values = np.stack([pd.to_numeric(frame[k], errors="coerce").to_numpy(float) for k in keys], axis=1)
    _, first_row, codes = np.unique(values, axis=0, return_index=True, return_inverse=True)
    codes = np.argsort(np.argsort(first_row))[codes.ravel()]  # groups numbered in order of first appearance
    valid = ~np.isnan(values).any(axis=1)  # a row with a missing key joins no group
    is_ref = (frame["recipe"].to_numpy() == reference) & valid
    first: dict[int, int] = {}
    for i in np.flatnonzero(is_ref):
        first.setdefault(int(codes[i]), int(i))
    order = np.argsort(codes, kind="stable")
    return [(int(i), first[int(codes[i])]) for i in order if valid[i] and not is_ref[i] and int(codes[i]) in first]


def run(rows: pd.DataFrame, spec: Split, fits: Fits, reference: str | None, bootstrap: bool = True) -> dict[str, Any]:
    """One backtest on `rows` (keyed): what was fitted and predicted, the misses and their decomposition,
    the target rows' distances, and the matched gaps' misses; '_' holds the arrays the scoring reads."""
    key = (_rows_key(rows), spec, reference)
    if key in fits.runs:  # the same backtest recurs inside larger ones: its misses do not change
        done = fits.runs[key]
        fits(done["_"]["fitted_rows"], bootstrap)  # bootstraps the cached fit where now asked to
        return {**done}
    fit_mask, target_mask = masks(rows, spec)
    fitted_rows, target = rows[fit_mask], rows[target_mask]
    model = fits(fitted_rows, bootstrap)
    known = target["recipe"].astype(str).isin(set(model.columns.index)).to_numpy()
    unpredicted = sorted(set(target.loc[~known, "recipe"].astype(str)))
    target = target[known].reset_index(drop=True)
    frame = model.frame(target)
    centre, _ = model.draws(frame)
    measured = target["val_loss"].to_numpy(float)
    errors = measured - centre
    recipes = frame["recipe"].to_numpy()
    delta = model.distance(frame)
    out = {"kind": spec.kind, "label": spec.label, "fit_budget": spec.a if spec.kind == "budget" else None,
           "target_budget": spec.b, "threshold": spec.a if spec.kind == "size" else None,
           "distance": float(math.log10(spec.b / spec.a)) if spec.kind == "budget" else None,
           "delta": float(np.mean(delta)) if len(delta) else None, "law": model.fit.law,
           "fit_rows": int(len(fitted_rows)), "fit_runs": int(fitted_rows["run_id"].nunique()),
           "target_rows": int(target_mask.sum()), "target_runs": int(rows.loc[target_mask, "run_id"].nunique()),
           "n": int(len(target)), "unpredicted": unpredicted,
           "mean_error": float(np.mean(errors)) if len(errors) else None,
           "mean_abs_error": float(np.mean(np.abs(errors))) if len(errors) else None}
    out.update(decompose(errors, recipes) if len(errors) else {"shared": None, "per_recipe": {}, "recipe_mean": {},
                                                               "row_sd": None, "row_ss": 0.0, "row_dof": 0})
    bias = model.bias.reindex(sorted(set(recipes))).fillna(0.0)
    out["recipe_bias"] = {r: float(v) for r, v in (bias - bias.mean()).items()}
    internal = {"model": model, "frame": frame, "measured": measured, "spec": spec, "fitted_rows": fitted_rows}
    internal.update(_gaps(rows, target, internal, reference, spec))
    out.update(_gap_misses(internal))
    fits.runs[key] = {**out, "_": internal}
    return {**out, "_": internal}


def _gaps(rows: pd.DataFrame, target: pd.DataFrame, inner: Mapping[str, Any], reference: str | None,
          spec: Split) -> dict[str, Any]:
    """The scoring frame: the target rows (levels), then (along compute) the target runs' reference rows at
    the same (N, D, seed) that are not target rows themselves (unlabelled evaluations: they enter the gaps
    alone), and the gap pairs at matched (N, D, seed)."""
    model, frame, measured = inner["model"], inner["frame"], inner["measured"]
    seed = target.get("seed", pd.Series(0, index=target.index)).reset_index(drop=True)
    if reference is None or reference not in model.columns.index:
        return {"frame": frame, "measured": measured, "pairs": [], "n_levels": len(frame)}
    if spec.kind == "size":
        return {"frame": frame, "measured": measured, "n_levels": len(frame),
                "pairs": gap_pairs(frame.assign(seed=seed.to_numpy()), reference, ("N", "D", "seed"))}
    target_mask = masks(rows, spec)[1]
    extra = rows[rows["run_id"].isin(set(rows.loc[target_mask, "run_id"])) & ~target_mask
                 & (rows["recipe"].astype(str) == reference)]
    both = pd.concat([frame, model.frame(extra.reset_index(drop=True))], ignore_index=True)
    seeds = pd.concat([seed, extra.get("seed", pd.Series(0, index=extra.index)).reset_index(drop=True)], ignore_index=True)
    pairs = [(i, j) for i, j in gap_pairs(both.assign(seed=seeds.to_numpy()), reference, ("N", "D", "seed"))
             if i < len(frame)]
    return {"frame": both, "measured": np.concatenate([measured, extra["val_loss"].to_numpy(float)]), "pairs": pairs,
            "n_levels": len(frame)}


def _gap_misses(internal: dict[str, Any]) -> dict[str, Any]:
    """The matched gaps' misses (their decomposition) and, into `internal`, the arrays the calibration reads."""
    pairs, model = internal["pairs"], internal["model"]
    if not pairs:
        return {"gap_n": 0, "gap_mean_error": None, "gap_recipe_mean": {}, "gap_row_sd": None, "gap_row_ss": 0.0,
                "gap_row_dof": 0}
    i, j = np.array(pairs).T
    centre, _ = model.draws(internal["frame"])
    measured = internal["measured"]
    gap_errors = (measured[i] - measured[j]) - (centre[i] - centre[j])
    recipes = internal["frame"]["recipe"].to_numpy()
    bias = pd.Series(recipes).map(model.bias).fillna(0.0).to_numpy(float)
    internal.update(gap_errors=gap_errors, gap_recipes=recipes[i], gap_bias=bias[i] - bias[j])
    gap = decompose(gap_errors, recipes[i])
    return {"gap_n": len(pairs), "gap_mean_error": float(np.mean(gap_errors)), "gap_recipe_mean": gap["recipe_mean"],
            "gap_row_sd": gap["row_sd"], "gap_row_ss": gap["row_ss"], "gap_row_dof": gap["row_dof"]}


def run_all(rows: pd.DataFrame, specs: Sequence[Split], fits: Fits, reference: str | None,
            bootstrap: bool = False) -> tuple[list[dict[str, Any]], list[tuple[Split, str]]]:
    """The backtests of `specs` that can be made, and the others as (split, why not)."""
    done, skipped = [], []
    for spec in specs:
        why = why_not(rows, spec)
        if why is None:
            try:
                done.append(run(rows, spec, fits, reference, bootstrap))
                continue
            except ConfigError as e:  # the law cannot be fitted on the rows below the threshold alone
                why = f"the law cannot be fitted on the rows below {spec.label} ({e})"
        skipped.append((spec, why))
    return done, skipped
