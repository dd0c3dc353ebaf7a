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

def _labels(rows: pd.DataFrame) -> np.ndarray:
    """Each row's budget label as a float (NaN where the table has none or it is not a number)."""
    if "budget" not in rows.columns:
        return np.full(len(rows), np.nan)
    col = rows["budget"]
    return col.to_numpy(float) if col.dtype == np.float64 else pd.to_numeric(col, errors="coerce").to_numpy(float)


def _recipes(rows: pd.DataFrame) -> np.ndarray:
    """rows["recipe"].astype(str).to_numpy() (a column of strings already is one)."""
    col = rows["recipe"]
    plain = isinstance(col.dtype, pd.StringDtype) and col.dtype.na_value is np.nan  # pandas' default str
    return col.to_numpy() if plain else col.astype(str).to_numpy()


def _run_codes(rows: pd.DataFrame) -> np.ndarray:
    """Each row's run as an integer code (-1 where the run id is missing)."""
    return pd.factorize(rows["run_id"])[0]


def effective_budget(rows: pd.DataFrame) -> np.ndarray:
    """Each row's budget: its label, or for an unlabelled row the smallest labelled budget its run reaches
    at or after the row's tokens (NaN where none)."""
    return _effective(rows, _labels(rows))


def _effective(rows: pd.DataFrame, label: np.ndarray, codes: np.ndarray | None = None) -> np.ndarray:
    """effective_budget from the rows' labels (_labels) and, where known, their run codes (_run_codes)."""
    label = np.where(label > 0, label, np.nan)
    out = label.copy()
    unlabelled = ~np.isfinite(label)
    if not unlabelled.any() or not np.isfinite(label).any():
        return out
    d = pd.to_numeric(rows["D"], errors="coerce").to_numpy(float)
    codes = _run_codes(rows) if codes is None else codes
    todo = np.flatnonzero(unlabelled & (codes >= 0))  # a row without a run id belongs to no run
    # each run's labelled rows by tokens (a NaN D is never at or after a row's tokens), the smallest label
    # at or after each of them (the minimum over the rest of its run)
    lab = np.flatnonzero(np.isfinite(label) & ~np.isnan(d) & np.isin(codes, codes[todo]))
    lab = lab[np.lexsort((d[lab], codes[lab]))]
    starts = np.searchsorted(codes[lab], codes[todo], side="left")
    ends = np.searchsorted(codes[lab], codes[todo], side="right")
    after = np.empty(len(lab))
    bounds = np.unique(np.concatenate([np.searchsorted(codes[lab], np.unique(codes[lab])), [len(lab)]]))
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        after[lo:hi] = np.minimum.accumulate(label[lab[lo:hi]][::-1])[::-1]
    for i, lo, hi in zip(todo, starts, ends):
        k = lo + np.searchsorted(d[lab[lo:hi]], d[i] * (1 - _TOL), side="left")
        if k < hi:
            out[i] = float(after[k])
    return out


def budgets(rows: pd.DataFrame) -> list[float]:
    """The labelled budgets of a table, ascending."""
    label = _labels(rows)
    return [float(v) for v in np.unique(label[label > 0])]


def split(rows: pd.DataFrame, fit_budget: float, target_budget: float) -> tuple[np.ndarray, np.ndarray]:
    """(fit mask, target mask) along compute: rows at or below fit_budget of runs with no row labelled
    target_budget, and the rows labelled target_budget."""
    fit, target, _, _ = _budget_split(rows, fit_budget, target_budget)
    return fit, target


def _budget_split(rows: pd.DataFrame, fit_budget: float, target_budget: float,
                  codes: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """split's (fit mask, target mask), the rows of the target rows' runs (`held`) and effective_budget;
    `codes`: the rows' _run_codes where the caller has them."""
    label, codes = _labels(rows), _run_codes(rows) if codes is None else codes
    eff = _effective(rows, label, codes)
    target = np.isclose(label, target_budget, rtol=_TOL)
    held = np.isin(codes, codes[target])  # codes: a row without a run id is held where a target row has none
    fit = (eff <= fit_budget * (1 + _TOL)) & ~held
    return fit, target, held, eff


def size_split(rows: pd.DataFrame, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """(fit mask, target mask) along N: rows with N < threshold, rows with N >= threshold. In a table with
    budget labels, only rows that count at a budget (effective_budget) take part: an evaluation past its
    run's last budget is a gap's reference, not a size's measurement."""
    n = rows["N"].to_numpy(float)
    label = _labels(rows)
    part = np.isfinite(_effective(rows, label)) if (label > 0).any() else np.ones(len(rows), bool)
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
    if spec.kind == "size":
        return rows[size_split(rows, spec.a)[0]].reset_index(drop=True)
    fit, _, held, eff = _budget_split(rows, spec.a, spec.b)
    return rows[fit | (~held & np.isnan(eff))].reset_index(drop=True)


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
        recipe = table["recipe"].astype(str)
        at = {r: k for k, r in enumerate(self.columns.index)}
        pos = np.array([at.get(r, -1) for r in recipe.to_numpy()], int)
        if (pos < 0).any():
            missing = sorted(set(recipe.to_numpy()[pos < 0]))
            raise ConfigError("recipe", missing[0], f"a recipe with runs in the fitted results "
                              f"({', '.join(map(str, self.columns.index))})")
        data = {"N": table["N"].array, "D": table["D"].array, "recipe": recipe.array}
        for c in self.columns.columns:
            data[c] = self.columns[c].to_numpy(float)[pos]
        return pd.DataFrame(data, index=table.index)

    def _columns(self, frame: pd.DataFrame) -> dict:
        # a per-recipe law (kumar_eff) carries the recipes it was fitted on
        return fit_lib._columns(self.fit.law_form, frame, require_rows=False)

    def centre(self, frame: pd.DataFrame, x: dict | None = None) -> np.ndarray:
        """The fit's prediction at each row of `frame` (draws' centre, without the bias); `x`: its
        columns (_columns) where the caller has them."""
        x = self._columns(frame) if x is None else x
        return np.asarray(self.fit.law_form.predict(self.fit.params, x, np), float)

    def draws(self, frame: pd.DataFrame, weight: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """(centre (rows,), draws (resamples, rows)): the fit's prediction and each resample's, each row
        plus `weight` times its recipe's `bias`."""
        law, x = self.fit.law_form, self._columns(frame)
        centre = self.centre(frame, x)
        samples = self.fit.samples.to_dict("records") if self.fit.bootstrap else []
        if samples:
            with np.errstate(all="ignore"):
                draws = np.array([np.asarray(law.predict(p, x, np), float) for p in samples])
            draws = draws[np.isfinite(draws).all(axis=1)]
        draws = draws if samples and len(draws) else centre[None].copy()  # no resample: the fit's own (finite or not)
        if weight:
            shift = weight * _lookup(self.bias, frame["recipe"].to_numpy(), 0.0)
            centre, draws = centre + shift, draws + shift[None, :]
        return centre, draws

    def distances(self, frame: pd.DataFrame) -> np.ndarray:
        """(rows, 3): decades beyond the fitted data in compute (6ND in budget units by the recipe's own
        runs, against the top fitted budget), in N (against the largest fitted N) and in D/N (outside the
        fitted range); 0 inside."""
        n, d = frame["N"].to_numpy(float), frame["D"].to_numpy(float)
        c = 6.0 * n * d * _lookup(self.ratio, frame["recipe"].to_numpy(), np.nan)
        dn = np.log10(d / n)
        return np.stack([np.maximum(0.0, np.log10(c / self.top)), np.maximum(0.0, np.log10(n / self.n_max)),
                         np.maximum(0.0, np.maximum(dn - self.dn_range[1], self.dn_range[0] - dn))], axis=1)

    def distance(self, frame: pd.DataFrame) -> np.ndarray:
        """Each row's distance from the fitted data: the length of `distances` (decades)."""
        return np.sqrt(np.sum(self.distances(frame) ** 2, axis=1))


def _lookup(values: pd.Series, keys: np.ndarray, missing: float) -> np.ndarray:
    """values.map over keys as floats (values' index unique), `missing` where a key is absent or its value
    is NaN (values.map(...).fillna(missing))."""
    table = dict(zip(values.index, values.to_numpy(float)))
    out = np.array([table.get(k, np.nan) for k in keys], float)
    return np.where(np.isnan(out), missing, out)


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
        return self._get(_rows_key(rows), lambda: rows, bootstrap)

    def of(self, rows: pd.DataFrame, mask: np.ndarray, bootstrap: bool = True) -> Model:
        """self(rows[mask]), the rows taken only where a fit or a bootstrap reads them."""
        return self._get(tuple(sorted(map(str, rows["row_key"].to_numpy()[mask].tolist()))), lambda: rows[mask],
                         bootstrap)

    def _get(self, key: tuple, taken, bootstrap: bool) -> Model:
        plain = None  # the rows as fitted (`taken()` without the key), made only where a fit or a bootstrap is run
        if key not in self.cache:
            plain = taken().drop(columns="row_key").reset_index(drop=True)
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
            plain = taken().drop(columns="row_key").reset_index(drop=True) if plain is None else plain
            fit_lib.bootstrap_fit(plain, entry[0].fit, self.n_boot, seed=self.seed, loss_column="val_loss")
            entry[1] = True
        return entry[0]


def _rows_key(rows: pd.DataFrame) -> tuple:
    return tuple(sorted(map(str, rows["row_key"].tolist())))


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
    return _pairs(values, frame["recipe"].to_numpy(), reference)


def _pairs(values: np.ndarray, recipes: np.ndarray, reference: str) -> list[tuple[int, int]]:
    """gap_pairs on the rows' key values (rows, keys) and recipes."""
    _, first_row, codes = np.unique(values, axis=0, return_index=True, return_inverse=True)
    codes = np.argsort(np.argsort(first_row))[codes.ravel()]  # groups numbered in order of first appearance
    valid = ~np.isnan(values).any(axis=1)  # a row with a missing key joins no group
    is_ref = (recipes == reference) & valid
    refs = np.flatnonzero(is_ref)
    groups, at = np.unique(codes[refs], return_index=True)
    first = np.full(len(first_row), -1)
    first[groups] = refs[at]  # each group's first reference row
    order = np.argsort(codes, kind="stable")
    order = order[valid[order] & ~is_ref[order] & (first[codes[order]] >= 0)]
    return list(zip(order.tolist(), first[codes[order]].tolist()))


def run(rows: pd.DataFrame, spec: Split, fits: Fits, reference: str | None, bootstrap: bool = True) -> dict[str, Any]:
    """One backtest on `rows` (keyed): what was fitted and predicted, the misses and their decomposition,
    the target rows' distances, and the matched gaps' misses; '_' holds the arrays the scoring reads."""
    key = (_rows_key(rows), spec, reference)
    if key in fits.runs:  # the same backtest recurs inside larger ones: its misses do not change
        done = fits.runs[key]
        fits.of(done["_"]["rows"], done["_"]["fit_mask"], bootstrap)  # bootstraps the cached fit where now asked to
        return {**done}
    codes = _run_codes(rows)
    if spec.kind == "budget":
        fit_mask, target_mask, held, _ = _budget_split(rows, spec.a, spec.b, codes)
    else:
        (fit_mask, target_mask), held = size_split(rows, spec.a), None
    model = fits.of(rows, fit_mask, bootstrap)
    recipe = _recipes(rows)
    fitted = set(model.columns.index)
    known = np.array([r in fitted for r in recipe], bool)
    unpredicted = sorted(set(recipe[target_mask & ~known]))
    target = rows[target_mask & known].reset_index(drop=True)
    frame = model.frame(target)
    centre = model.centre(frame)
    measured = target["val_loss"].to_numpy(float)
    errors = measured - centre
    recipes = frame["recipe"].to_numpy()
    delta = model.distance(frame)
    out = {"kind": spec.kind, "label": spec.label, "fit_budget": spec.a if spec.kind == "budget" else None,
           "target_budget": spec.b, "threshold": spec.a if spec.kind == "size" else None,
           "distance": float(math.log10(spec.b / spec.a)) if spec.kind == "budget" else None,
           "delta": float(np.mean(delta)) if len(delta) else None, "law": model.fit.law,
           "fit_rows": int(fit_mask.sum()), "fit_runs": _count_runs(codes[fit_mask]),
           "target_rows": int(target_mask.sum()), "target_runs": _count_runs(codes[target_mask]),
           "n": int(len(target)), "unpredicted": unpredicted,
           "mean_error": float(np.mean(errors)) if len(errors) else None,
           "mean_abs_error": float(np.mean(np.abs(errors))) if len(errors) else None}
    out.update(decompose(errors, recipes) if len(errors) else {"shared": None, "per_recipe": {}, "recipe_mean": {},
                                                               "row_sd": None, "row_ss": 0.0, "row_dof": 0})
    bias = model.bias.reindex(sorted(set(recipes))).fillna(0.0)
    out["recipe_bias"] = {r: float(v) for r, v in (bias - bias.mean()).items()}
    internal = {"model": model, "frame": frame, "measured": measured, "spec": spec, "rows": rows, "fit_mask": fit_mask}
    extra = None if held is None else held & ~target_mask & (recipe == reference)
    internal.update(_gaps(rows, target, internal, reference, extra))
    out.update(_gap_misses(internal, centre))
    fits.runs[key] = {**out, "_": internal}
    return {**out, "_": internal}


def _count_runs(codes: np.ndarray) -> int:
    """How many distinct runs these rows' run codes name (a missing run id not counted: nunique)."""
    return int(len(np.unique(codes[codes >= 0])))


def _gaps(rows: pd.DataFrame, target: pd.DataFrame, inner: Mapping[str, Any], reference: str | None,
          extra: np.ndarray | None) -> dict[str, Any]:
    """The scoring frame: the target rows (levels), then (along compute; `extra` the mask over `rows`) the
    target runs' reference rows at the same (N, D, seed) that are not target rows themselves (unlabelled
    evaluations: they enter the gaps alone), and the gap pairs at matched (N, D, seed)."""
    model, frame, measured = inner["model"], inner["frame"], inner["measured"]
    if reference is None or reference not in model.columns.index:
        return {"frame": frame, "measured": measured, "pairs": [], "n_levels": len(frame)}
    seed = _seeds(target)
    if extra is None or not extra.any():  # along N, or no such reference row: the target rows alone
        return {"frame": frame, "measured": measured, "n_levels": len(frame),
                "pairs": _pairs(_keys(frame, seed), frame["recipe"].to_numpy(), reference) if len(frame) else []}
    extra = rows[extra].reset_index(drop=True)
    both = pd.concat([frame, model.frame(extra)], ignore_index=True)
    seeds = np.concatenate([seed, _seeds(extra)])
    pairs = [(i, j) for i, j in _pairs(_keys(both, seeds), both["recipe"].to_numpy(), reference) if i < len(frame)]
    return {"frame": both, "measured": np.concatenate([measured, extra["val_loss"].to_numpy(float)]), "pairs": pairs,
            "n_levels": len(frame)}


def _seeds(rows: pd.DataFrame) -> np.ndarray:
    """Each row's seed as a number (0 where the table has no seed column; NaN where it is not a number)."""
    if "seed" not in rows.columns:
        return np.zeros(len(rows))
    return pd.to_numeric(rows["seed"], errors="coerce").to_numpy(float)


def _keys(frame: pd.DataFrame, seed: np.ndarray) -> np.ndarray:
    """(rows, 3): the rows' N, D and seed, the keys a gap is matched on."""
    return np.stack([pd.to_numeric(frame[k], errors="coerce").to_numpy(float) for k in ("N", "D")] + [seed], axis=1)


def _gap_misses(internal: dict[str, Any], centre: np.ndarray) -> dict[str, Any]:
    """The matched gaps' misses (their decomposition) and, into `internal`, the arrays the calibration reads;
    `centre`: the law's prediction at the target rows (the levels)."""
    pairs, model = internal["pairs"], internal["model"]
    if not pairs:
        return {"gap_n": 0, "gap_mean_error": None, "gap_recipe_mean": {}, "gap_row_sd": None, "gap_row_ss": 0.0,
                "gap_row_dof": 0}
    i, j = np.array(pairs).T
    if len(internal["frame"]) > internal["n_levels"]:  # reference rows beyond the levels: the law at every row
        centre = model.centre(internal["frame"])
    measured = internal["measured"]
    gap_errors = (measured[i] - measured[j]) - (centre[i] - centre[j])
    recipes = internal["frame"]["recipe"].to_numpy()
    bias = _lookup(model.bias, recipes, 0.0)
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
