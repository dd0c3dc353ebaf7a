"""Law selection (`select_law`, `scaling fit --law auto`): every candidate law is scored by how well it
predicts held-out *precision gaps* (loss minus the matching high-precision run's loss) after leaving
out the largest size or the longest budget; what matters for choosing a precision is the gap, not the
loss level every law fits about equally well. The fitting itself is scaling.study.fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from scaling.study import fit, laws
from scaling.study.fit import FitResult
from scaling.errors import ConfigError

# Splits for held-out errors: leave out the largest size (N), the longest run (D), or, in an IsoFLOP
# design, the largest compute budget (`budget`, with the reference rows at the same (N, D)).
SELECTION_SPLITS = ("N", "D", "budget")
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


def _heldout_gap_errors(df: pd.DataFrame, cand: Candidate, by: str, loss_column: str, ref: np.ndarray,
                        ids: np.ndarray, fit_kwargs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray] | str:
    """Fit on the rows below the largest `by`, predict the precision gaps of the held-out rows:
    (positions, predicted - measured gap), or the reason it could not be done. For `budget` the
    held-out rows are the largest budget's and every row with the same (N, D, seed) as one of them
    (the reference evaluated there), so the fit sees nothing at the held-out points. A split whose
    held-out gaps come from one run only is not used: one run's error has no standard error."""
    if by not in df.columns:
        return f"no {by} column"
    key = pd.to_numeric(df[by], errors="coerce").to_numpy(float)
    if not np.isfinite(key).any():
        return f"no {by} values"
    test = key == np.nanmax(key)
    if by == "budget":
        if len(np.unique(key[np.isfinite(key)])) < 2:
            return "one budget: nothing left to fit on"
        test = np.isin(ids, ids[test])
    if test.all():
        return f"one value of {by}: nothing left to fit on"
    reason = fit.unfittable_reason(df[~test], cand.law, cand.fixed, loss_column)
    if reason:
        return f"without the largest {by}: {reason}"
    pos, measured = _gaps(pd.to_numeric(df[loss_column]).to_numpy(float), ids, ref, test)
    if len(pos) == 0:
        return f"no held-out row at the largest {by} has a matching reference run"
    runs = df["run_id"].to_numpy()[pos] if "run_id" in df.columns else pos
    if len(np.unique(runs)) < 2:
        return f"the held-out gaps at the largest {by} come from one run: no standard error, not used"
    try:
        fitted = fit.fit_law(df[~test], cand.law, fixed=cand.fixed, loss_column=loss_column, **fit_kwargs)
    except ConfigError as e:
        return f"without the largest {by}: {e}"
    _, predicted = _gaps(fitted.predict(df), ids, ref, test)
    return pos, predicted - measured


def _clustered_mean_and_var(d: np.ndarray, clusters: np.ndarray) -> tuple[float, float]:
    """Mean of d and the variance of that mean with rows of one cluster (run) correlated (sandwich form):
    G/(G-1) · sum_c (sum_{i in c} (d_i - mean))^2 / n^2; 0 with a single cluster."""
    mean = float(np.mean(d))
    _, c = np.unique(clusters, return_inverse=True)
    sums = np.bincount(c, weights=d - mean)
    g = len(sums)
    return mean, float(g / (g - 1) * np.sum(sums ** 2) / len(d) ** 2) if g > 1 else 0.0


def _finite(v: Any) -> Any:
    """JSON-safe: NaN / inf -> None."""
    return float(v) if v is not None and np.isfinite(v) else None


def _evaluate(df: pd.DataFrame, cand: Candidate, loss_column: str, ref: np.ndarray, ids: np.ndarray,
              fit_kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], FitResult | None, dict]:
    """One candidate: (its summary entry, its full-data fit or None, {split: (positions, gap errors)})."""
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
        return entry, None, {}
    loss = pd.to_numeric(df[loss_column]).to_numpy(float)
    entry.update(fittable=True, reason=None, n_params=len(law.free_params(cand.fixed)),
                 aic=fit.aic(fitted, n=fitted.data["n_units"]), mare=fit.mean_abs_rel_error(fitted.predict(df), loss),
                 objective=fitted.objective, heldout_gap_mae={}, n_heldout={}, heldout_notes={})
    errors = {}
    for by in SELECTION_SPLITS:
        got = _heldout_gap_errors(df, cand, by, loss_column, ref, ids, fit_kwargs)
        if isinstance(got, str):
            entry["heldout_gap_mae"][by], entry["n_heldout"][by], entry["heldout_notes"][by] = None, 0, got
        else:
            errors[by] = got
            entry["heldout_gap_mae"][by], entry["n_heldout"][by] = float(np.mean(np.abs(got[1]))), int(len(got[0]))
    entry["params"] = fitted.params
    return entry, fitted, errors


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
    clusters = pd.factorize(df["run_id"])[0] if "run_id" in df.columns else np.arange(len(df))
    init = dict(fit_kwargs.get("init") or {})
    entries, fits, errors = [], {}, {}
    for cand in parsed:
        # An init grid applies to every law that has those params.
        kwargs = {**fit_kwargs, "init": {k: v for k, v in init.items() if k in laws.get(cand.law).params}}
        entry, fitted, errs = _evaluate(df, cand, loss_column, ref, ids, kwargs)
        entries.append(entry)
        if fitted is not None:
            fits[cand.name] = fitted
        errors.update({(cand.name, by): e for by, e in errs.items()})
    chosen, criterion = _choose(entries, errors, clusters)
    summary = {"chosen": chosen, "criterion": criterion, "loss_column": loss_column,
               "reference": _describe_reference(df, ref), "splits": list(SELECTION_SPLITS),
               "noise_se": NOISE_SE, "candidates": entries}
    return _json_safe(summary), fits


def _choose(entries: list[dict[str, Any]], errors: Mapping[tuple[str, str], tuple[np.ndarray, np.ndarray]],
            clusters: np.ndarray) -> tuple[str | None, str]:
    """Pick the law with the lowest mean over splits of the held-out gap MAE, and mark within_noise.

    Only splits where some law has errors count; a law needs errors on all of them to be ranked. For each
    ranked law k against the best b, per split s: d_i = |e_k,i| - |e_b,i| on the same held-out rows,
    Delta_s = mean d, Var_s its run-clustered variance; Delta = mean_s Delta_s, SE = sqrt(sum_s Var_s) / S
    (splits treated as independent). within_noise: Delta <= NOISE_SE · SE (the best law: Delta = 0).
    """
    fitted = [e for e in entries if e["fittable"]]
    splits = [s for s in SELECTION_SPLITS if any((e["name"], s) in errors for e in fitted)]
    ranked = [e for e in fitted if splits and all((e["name"], s) in errors for s in splits)]
    for e in entries:
        e["within_noise"], e["score"], e["gap_mae_diff"] = False, None, None
    if not ranked:
        if not fitted:
            return None, "none: no candidate could be fitted"
        best = min(fitted, key=lambda e: (e["aic"], e["n_params"]))
        best["within_noise"] = True
        return best["name"], "aic (no held-out precision gap could be measured)"
    for e in ranked:
        e["score"] = float(np.mean([e["heldout_gap_mae"][s] for s in splits]))
    best = min(ranked, key=lambda e: (e["score"], e["n_params"]))
    for e in ranked:
        deltas, variances = [], []
        for s in splits:
            pos, err = errors[(e["name"], s)]
            pos_b, err_b = errors[(best["name"], s)]
            assert np.array_equal(pos, pos_b)  # held-out rows depend on the data only, not the law
            mean, var = _clustered_mean_and_var(np.abs(err) - np.abs(err_b), clusters[pos])
            deltas.append(mean)
            variances.append(var)
        delta, se = float(np.mean(deltas)), float(np.sqrt(np.sum(variances)) / len(splits))
        e["gap_mae_diff"] = {"value": delta, "se": se}
        e["within_noise"] = bool(delta <= NOISE_SE * se)
    return best["name"], f"heldout_gap_mae (mean over leaving out the largest {' and the largest '.join(splits)})"


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
    """Fit every candidate law and pick the one that best predicts held-out *precision gaps*.

    candidates: names or variants ('kumar', 'kumar[kappa free]', 'kumar[kappa=2]'); default: every
        registered law plus each with its default-fixed params freed (default_candidates()).
    reference: the high-precision recipe (a `recipe` value); default: the rows with the largest P.
    fit_kwargs: passed to fit_law (init, iters, polish, ...); an `init` grid applies to every law that
        has those params.

    A gap is a row's loss minus the loss of the reference run with the same (N, D, seed if present);
    the law's predicted gap is law(x) - law(x_ref). In turn the largest size (N), the longest run
    (D) and, in an IsoFLOP design, the largest compute budget (`budget`) are left out, the law is
    fitted on the rest and the held-out gaps are predicted (rows without a matching reference are
    dropped; the count is n_heldout; a split with gaps from fewer than two runs is not used). The
    chosen law has the lowest mean of the held-out gap MAEs (nats) over the usable splits; `within_noise` marks laws whose excess over it is within
    NOISE_SE run-clustered standard errors (see _choose). Also per law: AIC with n = number of runs,
    in-sample MARE of the loss, params. Laws that cannot be fitted are listed with the reason.

    Returns {"chosen": name or None, "criterion", "loss_column", "reference", "splits", "noise_se",
    "candidates": [{name, law, fixed, fittable, reason, n_params, aic, mare, objective,
    heldout_gap_mae: {N, D, budget}, n_heldout: {N, D, budget}, heldout_notes, score, gap_mae_diff: {value, se},
    within_noise, params}, ...]} (unfittable entries: name, law, fixed, fittable False, reason,
    within_noise False, score None, gap_mae_diff None).
    """
    return select(df, candidates, loss_column, reference, fit_kwargs)[0]
