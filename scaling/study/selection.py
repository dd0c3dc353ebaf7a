"""Law selection (`select_law`, `scaling fit --law auto`): every candidate law is scored by how well it
predicts held-out *precision gaps* (loss minus the matching high-precision run's loss) at the largest
compute budget, fitted without any run that reaches that budget; what matters for choosing a precision
is the gap, not the loss level every law fits about equally well. The fitting itself is scaling.study.fit.

Why whole runs: an IsoFLOP run serves several budgets (its evaluations at each budget's tokens), so a
row at the largest budget is usually a later checkpoint of a run whose earlier evaluation would
otherwise be fitted, and a law that memorises runs would look as if it extrapolated. Why clustered by
recipe: a law's errors are systematic by recipe (its form misprices a format), so the rows of one
recipe are not independent evidence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from scaling.study import fit, laws
from scaling.study.analysis import LEVEL  # also the per-recipe residual intervals' level
from scaling.study.fit import FitResult
from scaling.errors import ConfigError

# The held-out split: the largest compute budget (`budget`) in an IsoFLOP design; a table without
# budgets holds out its largest size (`N`) instead. Either way whole runs are held out. The longest
# run (D) is never a split: its held-out rows are later checkpoints of runs whose earlier ones are fitted.
SELECTION_SPLITS = ("budget", "N")
# Precision columns, larger = more precise; the reference recipe maximises them in this order, so a
# recipe that quantises only the weights or only the backward pass (P = 32 as well) is not the reference.
_REFERENCE_ORDER = ("P", "P_fwd", "P_w", "P_a", "P_g", "P_bwd")
# within_noise: a law whose held-out gap error exceeds the best one's by at most this many standard errors.
NOISE_SE = 2.0


@dataclass(frozen=True)
class Candidate:
    """A law with the params it holds fixed; `name` is how selection reports it, e.g. 'kumar[kappa free]'."""

    name: str
    law: str
    fixed: dict[str, float]


@dataclass(frozen=True)
class Split:
    """The held-out split: `by` ('budget' or 'N'), the rows whose gaps are scored (`scored`: rows at the
    largest `by`), and the rows the law is fitted on (`train`: every row of every run with no row at a
    held-out point, the reference evaluated there included). `held_runs`: how many runs are left out;
    `note`: why an earlier split (the budget) could not be used, or None."""

    by: str
    scored: np.ndarray
    train: np.ndarray
    held_runs: int
    note: str | None = None


def parse_candidate(spec: str) -> Candidate:
    """'kumar' (the law's default fixed params), 'kumar[kappa free]', 'kumar[kappa=2]', 'x[a free, b=1]'."""
    head, bracket, rest = spec.strip().partition("[")
    law = laws.get(head.strip())
    fixed = dict(law.fixed)
    if bracket:
        if not rest.endswith("]"):
            raise ConfigError("candidate", spec, "NAME or NAME[PARAM free, PARAM=VALUE, ...]")
        for item in filter(None, (t.strip() for t in rest[:-1].split(","))):
            param, eq, value = item.partition("=")
            if not eq and item.endswith(" free"):
                param = item[:-len(" free")].strip()
                if param not in law.params:
                    raise ConfigError("candidate", spec, f"params of law {law.name}: {', '.join(law.params)}")
                fixed.pop(param, None)
                continue
            try:
                fixed[param.strip()] = float(value)
            except ValueError:
                raise ConfigError("candidate", spec, "NAME or NAME[PARAM free, PARAM=VALUE, ...]") from None
    return Candidate(spec.strip(), law.name, fit.resolve_fixed(law, fixed))


def default_candidates() -> list[str]:
    """Every registered law, plus each law that holds params fixed by default with them freed
    (kumar -> also 'kumar[kappa free]')."""
    out = []
    for name in laws.names():
        out.append(name)
        if laws.get(name).fixed:
            out.append(f"{name}[{', '.join(f'{k} free' for k in laws.get(name).fixed)}]")
    return out


def reference_mask(df: pd.DataFrame, reference: str | None = None) -> np.ndarray:
    """Rows of the high-precision reference recipe: those whose `recipe` is `reference`, or by default
    the rows with the largest P (ties broken by the other precision columns, larger wins)."""
    if reference is not None:
        if "recipe" not in df.columns:
            raise ConfigError("reference", reference, "a value of column recipe (the data has no recipe column)")
        mask = (df["recipe"].astype(str) == str(reference)).to_numpy()
        if not mask.any():
            raise ConfigError("reference", reference, sorted(df["recipe"].astype(str).unique()))
        return mask
    cols = [c for c in _REFERENCE_ORDER if c in df.columns]
    if not cols:
        raise ConfigError("reference", None, "a recipe name (the data has no precision column P to find the highest-precision recipe)")
    mask = np.ones(len(df), dtype=bool)
    for c in cols:
        v = pd.to_numeric(df[c], errors="coerce").to_numpy(float)
        if np.isfinite(v[mask]).any():
            mask &= v == np.nanmax(v[mask])
    return mask


def _match_ids(df: pd.DataFrame) -> np.ndarray:
    """Rows sharing (N, D, seed if present) share an id: a row's gap is taken to the reference rows with its id."""
    keys = [c for c in ("N", "D", "seed") if c in df.columns]
    return df.groupby(keys, sort=False, dropna=False).ngroup().to_numpy()


def _run_ids(df: pd.DataFrame) -> np.ndarray:
    """One id per training run: `run_id`, or without it (N, recipe or P, seed), the rows a run's
    checkpoints would share."""
    if "run_id" in df.columns:
        return pd.factorize(df["run_id"].astype(str))[0]
    keys = [c for c in ("N", "recipe" if "recipe" in df.columns else "P", "seed") if c in df.columns]
    return df.groupby(keys, sort=False, dropna=False).ngroup().to_numpy()


def recipe_clusters(df: pd.DataFrame) -> tuple[np.ndarray, str]:
    """(cluster per row, what a cluster is): the recipe where the table names one, else the run."""
    if "recipe" in df.columns:
        return pd.factorize(df["recipe"].astype(str))[0], "recipe"
    return _run_ids(df), "run"


def _gaps(values: np.ndarray, ids: np.ndarray, ref: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions, gaps): values - mean of values over the matching reference rows, for the rows of the
    boolean mask `rows` that are not reference rows themselves and have a matching reference row."""
    n = int(ids.max()) + 1 if len(ids) else 0
    counts = np.bincount(ids[ref], minlength=n)
    means = np.bincount(ids[ref], weights=values[ref], minlength=n) / np.maximum(counts, 1)
    pos = np.flatnonzero(rows & ~ref & (counts[ids] > 0))
    return pos, values[pos] - means[ids[pos]]


def gaps_to_reference_rows(df: pd.DataFrame, loss_column: str = "val_loss", reference: str | None = None) -> pd.Series:
    """Each row's loss minus the mean loss of the reference rows (reference_mask) with the same (N, D,
    seed if present), aligned with df's index; NaN for the reference rows themselves and for rows with
    no matching reference run. (The report's table of gaps per recipe is
    scaling.study.analysis.gaps_to_reference_recipe.)"""
    index, df = df.index, df.reset_index(drop=True)
    ref = reference_mask(df, reference)
    pos, gaps = _gaps(pd.to_numeric(df[loss_column]).to_numpy(float), _match_ids(df), ref, np.ones(len(df), bool))
    out = np.full(len(df), np.nan)
    out[pos] = gaps
    return pd.Series(out, index=index, name="gap")


def heldout_split(df: pd.DataFrame, ids: np.ndarray | None = None) -> Split | str:
    """The split law selection scores on (Split), or why there is none. `budget` when the table has two
    or more compute budgets, else `N` (two or more sizes): the rows at the largest value are scored, and
    every run with a row at one of their (N, D, seed) points, the reference's included, is left out of
    the fit whole, so no held-out gap is a later checkpoint of a fitted run."""
    df = df.reset_index(drop=True)
    ids = _match_ids(df) if ids is None else ids
    reasons = []
    for by in SELECTION_SPLITS:
        if by not in df.columns:
            reasons.append(f"no {by} column")
            continue
        key = pd.to_numeric(df[by], errors="coerce").to_numpy(float)
        finite = np.isfinite(key)
        if len(np.unique(key[finite])) < 2:
            reasons.append(f"fewer than two values of {by}")
            continue
        scored = finite & (key == np.nanmax(key))
        runs = _run_ids(df)
        at_points = np.isin(ids, ids[scored])
        held = np.isin(runs, runs[at_points])
        if held.all():
            reasons.append(f"every run has a row at the largest {by}'s points: nothing left to fit on")
            continue
        return Split(by, scored, ~held, int(len(np.unique(runs[held]))), "; ".join(reasons) or None)
    return "; ".join(reasons)


def _heldout_gap_errors(df: pd.DataFrame, cand: Candidate, split: Split, loss_column: str, ref: np.ndarray,
                        ids: np.ndarray, fit_kwargs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray] | str:
    """Fit on split.train, predict the precision gaps of split.scored: (positions, predicted - measured
    gap), or the reason it could not be done. Gaps from fewer than two runs are not used: one run's
    error has no standard error."""
    train = df[split.train]
    reason = fit.unfittable_reason(train, cand.law, cand.fixed, loss_column)
    if reason:
        return f"without the runs at the largest {split.by}: {reason}"
    pos, measured = _gaps(pd.to_numeric(df[loss_column]).to_numpy(float), ids, ref, split.scored)
    if len(pos) == 0:
        return f"no row at the largest {split.by} has a matching reference run"
    if len(np.unique(_run_ids(df)[pos])) < 2:
        return f"the held-out gaps at the largest {split.by} come from one run: no standard error, not used"
    try:
        fitted = fit.fit_law(train, cand.law, fixed=cand.fixed, loss_column=loss_column, **fit_kwargs)
    except ConfigError as e:
        return f"without the runs at the largest {split.by}: {e}"
    _, predicted = _gaps(fitted.predict(df), ids, ref, split.scored)
    return pos, predicted - measured


def clustered_mean_and_var(d: np.ndarray, clusters: np.ndarray) -> tuple[float, float]:
    """Mean of d and the variance of that mean with the rows of one cluster correlated (sandwich form):
    G/(G-1) · sum_c (sum_{i in c} (d_i - mean))^2 / n^2 over G clusters; NaN with a single cluster
    (one cluster's error has no standard error)."""
    d = np.asarray(d, float)
    mean = float(np.mean(d))
    _, c = np.unique(clusters, return_inverse=True)
    sums = np.bincount(c, weights=d - mean)
    g = len(sums)
    return mean, float(g / (g - 1) * np.sum(sums ** 2) / len(d) ** 2) if g > 1 else float("nan")


def heldout_errors_by_recipe(df: pd.DataFrame, pos: np.ndarray, errors: np.ndarray, level: float = LEVEL) -> list[dict[str, Any]]:
    """Per recipe, the held-out gap errors (predicted - measured, nats) at `pos`: n, runs, their mean and
    a `level` t interval clustered by run (G - 1 dof over its G runs; none with a single run)."""
    recipes = df["recipe"].astype(str).to_numpy()[pos] if "recipe" in df.columns else np.full(len(pos), "all")
    runs = _run_ids(df)[pos]
    out = []
    for recipe in sorted(set(recipes)):
        mine = recipes == recipe
        mean, var = clustered_mean_and_var(errors[mine], runs[mine])
        g = len(np.unique(runs[mine]))
        half = float(stats.t.ppf(0.5 + level / 2, g - 1) * np.sqrt(var)) if g > 1 else None
        out.append({"recipe": recipe, "n": int(mine.sum()), "runs": g, "mean": mean,
                    "ci": [mean - half, mean + half] if half is not None else None})
    return out


def _finite(v: Any) -> Any:
    """JSON-safe: NaN / inf -> None."""
    return float(v) if v is not None and np.isfinite(v) else None


def _evaluate(df: pd.DataFrame, cand: Candidate, split: Split | str, loss_column: str, ref: np.ndarray,
              ids: np.ndarray, fit_kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], FitResult | None, tuple | None]:
    """One candidate: (its summary entry, its full-data fit or None, (positions, held-out gap errors) or None)."""
    law = laws.get(cand.law)
    entry: dict[str, Any] = {"name": cand.name, "law": cand.law, "fixed": cand.fixed}
    reason = fit.unfittable_reason(df, cand.law, cand.fixed, loss_column)
    if reason is None:
        try:
            fitted = fit.fit_law(df, cand.law, fixed=cand.fixed, loss_column=loss_column, **fit_kwargs)
        except ConfigError as e:  # e.g. every start gave a non-finite objective
            reason = str(e)
    if reason is not None:
        entry.update(fittable=False, reason=reason)
        return entry, None, None
    loss = pd.to_numeric(df[loss_column]).to_numpy(float)
    entry.update(fittable=True, reason=None, n_params=len(law.free_params(cand.fixed)),
                 aic=fit.aic(fitted, n=fitted.data["n_units"]), mare=fit.mean_abs_rel_error(fitted.predict(df), loss),
                 objective=fitted.objective, heldout_gap_mae={}, n_heldout={}, heldout_notes={})
    got = _heldout_gap_errors(df, cand, split, loss_column, ref, ids, fit_kwargs) if isinstance(split, Split) else split
    by = split.by if isinstance(split, Split) else "budget"
    if isinstance(got, str):
        entry["heldout_gap_mae"][by], entry["n_heldout"][by], entry["heldout_notes"][by] = None, 0, got
        got = None
    else:
        entry["heldout_gap_mae"][by], entry["n_heldout"][by] = float(np.mean(np.abs(got[1]))), int(len(got[0]))
    entry["params"] = fitted.params
    entry["degenerate"] = fitted.degenerate
    return entry, fitted, got


def select(df: pd.DataFrame, candidates: Sequence[str] | None, loss_column: str = "val_loss",
           reference: str | None = None, fit_kwargs: Mapping[str, Any] | None = None
           ) -> tuple[dict[str, Any], dict[str, FitResult]]:
    """select_law's summary plus the full-data FitResult of every fitted candidate (by name)."""
    fit_kwargs = fit_kwargs or {}
    for key in ("fixed", "bootstrap"):
        if key in fit_kwargs:
            raise ConfigError(key, fit_kwargs[key], "not with select_law (name variants as candidates, e.g. 'kumar[kappa=2]'; bootstrap the chosen fit)")
    if not isinstance(df, pd.DataFrame):
        raise ConfigError("df", type(df).__name__, "a pandas DataFrame")
    df = df.reset_index(drop=True)
    parsed = [parse_candidate(c) for c in dict.fromkeys(candidates or default_candidates())]
    ref, ids = reference_mask(df, reference), _match_ids(df)
    split = heldout_split(df, ids)
    clusters, clustered_by = recipe_clusters(df)
    init = dict(fit_kwargs.get("init") or {})
    entries, fits, errors = [], {}, {}
    for cand in parsed:
        # An init grid applies to every law that has those params.
        kwargs = {**fit_kwargs, "init": {k: v for k, v in init.items() if k in laws.get(cand.law).params}}
        entry, fitted, errs = _evaluate(df, cand, split, loss_column, ref, ids, kwargs)
        entries.append(entry)
        if fitted is not None:
            fits[cand.name] = fitted
        if errs is not None:
            errors[cand.name] = errs
    chosen, criterion = _choose(entries, errors, clusters)
    summary = {"chosen": chosen, "criterion": criterion, "loss_column": loss_column,
               "reference": _describe_reference(df, ref),
               "splits": [split.by] if isinstance(split, Split) else [],
               "split": _describe_split(df, split), "noise_se": NOISE_SE, "clustered_by": clustered_by,
               "within_noise": [e["name"] for e in entries if e.get("within_noise")],
               "chosen_residuals": heldout_errors_by_recipe(df, *errors[chosen]) if chosen in errors else [],
               "candidates": entries}
    return _json_safe(summary), fits


def _describe_split(df: pd.DataFrame, split: Split | str) -> dict[str, Any]:
    """What was held out: the split, its largest value, runs left out and rows fitted (or why none)."""
    if isinstance(split, str):
        return {"by": None, "note": split}
    value = pd.to_numeric(df[split.by], errors="coerce").max()
    return {"by": split.by, "value": float(value), "held_runs": split.held_runs,
            "train_rows": int(split.train.sum()), "train_runs": int(len(np.unique(_run_ids(df)[split.train]))),
            "note": split.note}


def _choose(entries: list[dict[str, Any]], errors: Mapping[str, tuple[np.ndarray, np.ndarray]],
            clusters: np.ndarray) -> tuple[str | None, str]:
    """Pick the law with the lowest held-out gap MAE and mark every law within noise of it.

    For each ranked law k against the best b: d_i = |e_k,i| - |e_b,i| on the same held-out rows,
    Delta = mean d, SE = sqrt of its cluster-robust variance over `clusters` (recipes: a law's errors
    are systematic by recipe). The best is the lowest among the laws whose full-data fit is not
    degenerate (fit.degenerate_reason), unless all are; a degenerate law can still be within noise. within_noise: Delta <= NOISE_SE · SE (the best law: Delta = 0); with a
    single cluster the SE is unknown and every ranked law is within noise.
    """
    fitted = [e for e in entries if e["fittable"]]
    ranked = [e for e in fitted if e["name"] in errors]
    for e in entries:
        e["within_noise"], e["score"], e["gap_mae_diff"] = False, None, None
    if not ranked:
        if not fitted:
            return None, "none: no candidate could be fitted"
        best = min(fitted, key=lambda e: (e["aic"], e["n_params"]))
        best["within_noise"] = True
        return best["name"], "aic (no held-out precision gap could be measured)"
    for e in ranked:
        e["score"] = float(np.mean(np.abs(errors[e["name"]][1])))
    # a degenerate full-data fit (a param at its bound, an exponent <= 0) predicts no optimum: it is
    # scored, but chosen only when every law is degenerate (and then nothing is derived from it)
    sound = [e for e in ranked if not e.get("degenerate")] or ranked
    best = min(sound, key=lambda e: (e["score"], e["n_params"]))
    pos_b, err_b = errors[best["name"]]
    for e in ranked:
        pos, err = errors[e["name"]]
        assert np.array_equal(pos, pos_b)  # held-out rows depend on the data only, not the law
        delta, var = clustered_mean_and_var(np.abs(err) - np.abs(err_b), clusters[pos])
        se = float(np.sqrt(var))
        e["gap_mae_diff"] = {"value": delta, "se": _finite(se)}
        e["within_noise"] = bool(not np.isfinite(se) or delta <= NOISE_SE * se)
    by = next(iter(best["heldout_gap_mae"]))
    return best["name"], f"heldout_gap_mae (fitted without the runs at the largest {by}, scored on its gaps)"


def _describe_reference(df: pd.DataFrame, ref: np.ndarray) -> dict[str, Any]:
    out: dict[str, Any] = {"n_rows": int(ref.sum())}
    if "recipe" in df.columns:
        out["recipes"] = sorted(df.loc[ref, "recipe"].astype(str).unique())
    for c in _REFERENCE_ORDER:
        if c in df.columns:
            out[c] = float(pd.to_numeric(df.loc[ref, c]).max())
    return out


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return _finite(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def select_law(df: pd.DataFrame, candidates: Sequence[str] | None = None, loss_column: str = "val_loss",
               reference: str | None = None, **fit_kwargs: Any) -> dict[str, Any]:
    """Fit every candidate law and rank them by how well they predict held-out *precision gaps*.

    candidates: names or variants ('kumar', 'kumar[kappa free]', 'kumar[kappa=2]'); default: every
        registered law plus each with its default-fixed params freed (default_candidates()).
    reference: the high-precision recipe (a `recipe` value); default: the rows with the largest P.
    fit_kwargs: passed to fit_law (init, iters, polish, ...); an `init` grid applies to every law that
        has those params.

    A gap is a row's loss minus the loss of the reference run with the same (N, D, seed if present);
    the law's predicted gap is law(x) - law(x_ref). The held-out split (heldout_split) is the largest
    compute budget (`budget`), or the largest size (N) in a table without budgets: each law is fitted
    without every run that has a row at the held-out points and predicts the gaps there (rows without
    a matching reference are dropped; the count is n_heldout; gaps from fewer than two runs are not
    used). `chosen` has the lowest held-out gap MAE (nats); `within_noise` lists every law whose excess
    over it is within NOISE_SE standard errors clustered by recipe (see _choose): the data do not
    decide among those. Also per law: AIC with n = number of runs, in-sample MARE of the loss, params;
    and the chosen law's held-out gap errors per recipe (heldout_errors_by_recipe). Laws that cannot be
    fitted are listed with the reason.

    Returns {"chosen": name or None, "criterion", "loss_column", "reference", "splits": [by] or [],
    "split": {by, value, held_runs, train_rows, train_runs, note}, "noise_se", "clustered_by",
    "within_noise": [names], "chosen_residuals": [{recipe, n, runs, mean, ci}, ...],
    "candidates": [{name, law, fixed, fittable, reason, n_params, aic, mare, objective,
    heldout_gap_mae: {by}, n_heldout: {by}, heldout_notes, score, gap_mae_diff: {value, se},
    within_noise, params, degenerate (why the full-data fit is degenerate, or None)}, ...]} (unfittable entries: name, law, fixed, fittable False, reason,
    within_noise False, score None, gap_mae_diff None).
    """
    return select(df, candidates, loss_column, reference, fit_kwargs)[0]
