"""Law selection (`select_law`, `scaling fit --law auto`): every candidate law is scored by how well it
predicts held-out *precision gaps* (loss minus the matching high-precision run's loss) on three held-out
splits, each fitted without the runs it scores: the largest compute budget, the largest size, and the
largest tokens per parameter (D/N). What matters for choosing a precision is the gap, not the loss level
every law fits about equally well. The fitting itself is scaling.study.analysis.fit.

The choice (see _choose): (1) the precision test: does the best law with a precision term predict the
held-out gaps better than `chinchilla`, which has none (a clustered held-out likelihood test)? If not,
`chinchilla` is chosen and the summary says so. (2) Otherwise the precision law with the lowest mean
held-out gap error over the splits, then (3) nested laws (Law.nests: kumar within kumar_data) are
settled by the same test: the larger law only where it beats the smaller one.

Why whole runs: an IsoFLOP run serves several budgets (its evaluations at each budget's tokens), so a
row at the largest budget is usually a later checkpoint of a run whose earlier evaluation would
otherwise be fitted, and a law that memorises runs would look as if it extrapolated. Why the MAE
comparison is clustered by recipe: a law's errors are systematic by recipe (its form misprices a
format), so the rows of one recipe are not independent evidence. Why the likelihood test is clustered by
(N, seed): a gap is one run's loss minus the reference run's at the same (N, seed), so every gap of that
cell shares the reference's luck and every checkpoint of a run shares the run's; (N, seed) holds both.

One module: the splits, the scores, the likelihood tests and the choice all read the
same held-out errors, computed once per candidate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from scaling.study.analysis import fit, laws
from scaling.study.analysis.isoflop import LEVEL  # also the per-recipe residual intervals' level
from scaling.study.analysis.fit import FitResult
from scaling.errors import ConfigError

# The held-out splits, in order: compute (the largest IsoFLOP `budget`; a table without budgets: the
# largest N·D), size (the largest N) and tokens per parameter (the largest D/N). Each holds out whole
# runs. D/N rather than D: at a fixed N the largest D is the largest D/N, but across sizes the largest D
# belongs to the largest models, which the N split already holds out; D/N is the axis along which a
# precision penalty that grows with the data (kumar_data's D^gamma_D / N^gamma_N) shows, whatever the size.
SPLITS = ("compute", "N", "D/N")
SELECTION_SPLITS = ("budget", "N")  # heldout_split's (the first usable of these): kept for its callers
# A continuous key (N·D without budgets, D/N) holds out its largest values holding at most this share of
# the rows (at least the largest value), as fit.holdout_error's frac.
TOP_SHARE = 0.2
# within_noise: a law whose held-out gap error exceeds the chosen one's by at most this many standard errors.
NOISE_SE = 2.0
# The likelihood tests (precision term vs none, nested laws): one-sided level, and the fewest clusters a
# test is made on: with G clusters the clustered variance has G - 1 degrees of freedom, and with two or
# three it can come out near zero (a quick study's nested test gave t = 7e15 on 2 clusters).
ALPHA = 0.05
MIN_TEST_CLUSTERS = 4
# Held-out gaps scored separately by the recipe's bits (the `P` column): name -> (lowest, highest) P.
BITS_GROUPS = {"6-8": (6.0, 8.0), "<=4": (0.0, 4.0)}


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
    """Every registered law but those with per-recipe params (kumar_eff: opt-in), plus each law that holds
    params fixed by default with them freed (kumar -> also 'kumar[kappa free]')."""
    out = []
    for name in laws.names():
        if laws.get(name).per_recipe:
            continue  # opt-in (--candidate kumar_eff): two params per recipe, slow to fit on many recipes
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
    if not any(c in df.columns for c in fit.REFERENCE_ORDER):
        raise ConfigError("reference", None, "a recipe name (the data has no precision column P to find the highest-precision recipe)")
    return fit.highest_precision_mask(df)


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


def _split_at(df: pd.DataFrame, by: str, scored: np.ndarray, ids: np.ndarray) -> Split | str:
    """The Split scoring the rows `scored`: every run with a row at one of their (N, D, seed) points, the
    reference's included, is left out of the fit whole; or why that leaves nothing to fit on."""
    runs = _run_ids(df)
    held = np.isin(runs, runs[np.isin(ids, ids[scored])])
    if held.all():
        return f"every run has a row at the largest {by}'s points: nothing left to fit on"
    return Split(by, scored, ~held, int(len(np.unique(runs[held]))))


def _top_rows(key: np.ndarray, share: float = TOP_SHARE) -> np.ndarray:
    """Rows at the largest values of a continuous key that together hold at most `share` of the keyed rows
    (at least the largest value); values equal to 6 significant digits count as one."""
    finite = np.isfinite(key) & (key > 0)
    rounded = np.where(finite, np.round(np.log(np.where(finite, key, 1.0)), 6), -np.inf)
    values, counts = np.unique(rounded[finite], return_counts=True)
    cum = np.cumsum(counts[::-1]) / finite.sum()
    threshold = values[::-1][max(0, int(np.searchsorted(cum, share, side="right")) - 1)]
    return finite & (rounded >= threshold)


def heldout_splits(df: pd.DataFrame, ids: np.ndarray | None = None, ref: np.ndarray | None = None
                   ) -> tuple[list[Split], dict[str, str]]:
    """Every held-out split the table allows (SPLITS, in order) and, by name, why each other one is not made.

    compute: the largest IsoFLOP `budget` (by 'budget'); a table without two budgets: the rows at the
    largest N·D (by 'compute', TOP_SHARE). N: the largest size. D/N: the largest tokens per parameter
    (TOP_SHARE). "Largest" among the rows with a measurable gap (a matching reference row, `ref`:
    reference_mask by default): a size trained only in low precision has no gap to hold out, and the
    split moves to the largest size that has one. Each scores the rows it selects and fits on every run
    without a row at their points."""
    df = df.reset_index(drop=True)
    ids = _match_ids(df) if ids is None else ids
    ref = reference_mask(df) if ref is None else ref
    n_ids = int(ids.max()) + 1 if len(ids) else 0
    gappable = ~ref & (np.bincount(ids[ref], minlength=n_ids)[ids] > 0) if n_ids else np.zeros(len(df), bool)
    num = {c: np.where(gappable, pd.to_numeric(df[c], errors="coerce").to_numpy(float), np.nan)
           for c in ("N", "D", "budget") if c in df.columns}
    splits, notes = [], {}
    for name in SPLITS:
        if name == "compute" and "budget" in num and len(np.unique(num["budget"][np.isfinite(num["budget"])])) >= 2:
            by, scored = "budget", np.isfinite(num["budget"]) & (num["budget"] == np.nanmax(num["budget"]))
        elif name != "N" and not {"N", "D"} <= set(num):
            notes[name] = "no N and D columns"
            continue
        elif name == "N":
            if "N" not in num or len(np.unique(num["N"][np.isfinite(num["N"])])) < 2:
                notes[name] = "fewer than two values of N with a gap to the reference" if "N" in num else "no N column"
                continue
            by, scored = "N", np.isfinite(num["N"]) & (num["N"] == np.nanmax(num["N"]))
        else:
            key = num["N"] * num["D"] if name == "compute" else num["D"] / num["N"]
            if len(np.unique(np.round(np.log(key[np.isfinite(key) & (key > 0)]), 6))) < 2:
                notes[name] = f"fewer than two values of {'N·D' if name == 'compute' else 'D/N'} with a gap to the reference"
                continue
            by, scored = name, _top_rows(key)
        got = _split_at(df, by, scored, ids)
        if isinstance(got, str):
            notes[name] = got
        else:
            splits.append(got)
    return splits, notes


def heldout_split(df: pd.DataFrame, ids: np.ndarray | None = None) -> Split | str:
    """The first split of SELECTION_SPLITS (the largest `budget`, else the largest N) the table allows
    (Split, with `note` saying why an earlier one could not be used), or why there is none. select
    scores every split of heldout_splits; this one is the `split` its summary describes first."""
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
        got = _split_at(df, by, finite & (key == np.nanmax(key)), ids)
        if isinstance(got, str):
            reasons.append(got)
            continue
        return Split(got.by, got.scored, got.train, got.held_runs, "; ".join(reasons) or None)
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
    needed = split.scored | (ref & np.isin(ids, ids[pos]))  # a per-recipe law predicts only recipes it saw
    values = np.full(len(df), np.nan)
    try:
        values[needed] = fitted.predict(df[needed])
    except ConfigError as e:
        return f"without the runs at the largest {split.by}: {e}"
    _, predicted = _gaps(values, ids, ref, split.scored)
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


def pooled_mean_and_var(parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[float, float, int]:
    """The mean over splits of each split's mean of d, and its variance with every cluster's rows correlated
    across all the splits (a row may be scored on several): parts = [(d, clusters), ...] per split; each
    row weighs 1/(S·n_s), deviations from its split's mean, G/(G-1) · sum_c (sum_{i in c} w_i·dev_i)^2.
    One split: clustered_mean_and_var. Returns (mean, variance, G); variance NaN with one cluster."""
    s = len(parts)
    means = [float(np.mean(d)) for d, _ in parts]
    u = np.concatenate([(np.asarray(d, float) - m) / (s * len(d)) for (d, _), m in zip(parts, means)])
    _, c = np.unique(np.concatenate([np.asarray(cl) for _, cl in parts]), return_inverse=True)
    sums = np.bincount(c, weights=u)
    g = len(sums)
    return float(np.mean(means)), (float(g / (g - 1) * np.sum(sums ** 2)) if g > 1 else float("nan")), g


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


def _bits_groups(df: pd.DataFrame, pos: np.ndarray) -> dict[str, np.ndarray]:
    """BITS_GROUPS name -> mask over `pos` (by the `P` column; none without it)."""
    if "P" not in df.columns:
        return {}
    bits = pd.to_numeric(df["P"], errors="coerce").to_numpy(float)[pos]
    return {name: (bits >= lo) & (bits <= hi) for name, (lo, hi) in BITS_GROUPS.items()}


def _evaluate(df: pd.DataFrame, cand: Candidate, splits: Sequence[Split] | str, loss_column: str, ref: np.ndarray,
              ids: np.ndarray, fit_kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], FitResult | None, dict[str, tuple]]:
    """One candidate: (its summary entry, its full-data fit or None, {split: (positions, held-out gap errors)})."""
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
    entry.update(fittable=True, reason=None, n_params=len(fitted.law_form.free_params(fitted.fixed)),
                 precision_axis=law.precision_axis,
                 aic=fit.aic(fitted, n=fitted.data["n_units"]), mare=fit.mean_abs_rel_error(fitted.predict(df), loss),
                 objective=fitted.objective, heldout_gap_mae={}, n_heldout={}, heldout_notes={},
                 heldout_gap_mae_by_bits={g: {} for g in BITS_GROUPS})
    errors = {}
    for split in ([] if isinstance(splits, str) else splits):
        got = _heldout_gap_errors(df, cand, split, loss_column, ref, ids, fit_kwargs)
        if isinstance(got, str):
            entry["heldout_gap_mae"][split.by], entry["n_heldout"][split.by] = None, 0
            entry["heldout_notes"][split.by] = got
            continue
        errors[split.by] = got
        entry["heldout_gap_mae"][split.by], entry["n_heldout"][split.by] = float(np.mean(np.abs(got[1]))), int(len(got[0]))
        for group, mask in _bits_groups(df, got[0]).items():
            entry["heldout_gap_mae_by_bits"][group][split.by] = float(np.mean(np.abs(got[1][mask]))) if mask.any() else None
    if isinstance(splits, str) or not splits:
        entry["heldout_gap_mae"]["budget"], entry["n_heldout"]["budget"] = None, 0
        entry["heldout_notes"]["budget"] = splits if isinstance(splits, str) else "no held-out split"
    entry["params"] = fitted.params
    entry["degenerate"] = fitted.degenerate
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
    splits, split_notes = heldout_splits(df, ids, ref)
    primary = heldout_split(df, ids)
    clusters, clustered_by = recipe_clusters(df)
    init = dict(fit_kwargs.get("init") or {})
    entries, fits, errors = [], {}, {}
    for cand in parsed:
        # An init grid applies to every law that has those params.
        kwargs = {**fit_kwargs, "init": {k: v for k, v in init.items() if k in laws.get(cand.law).params}}
        entry, fitted, errs = _evaluate(df, cand, splits or "; ".join(f"{k}: {v}" for k, v in split_notes.items()),
                                        loss_column, ref, ids, kwargs)
        entries.append(entry)
        if fitted is not None:
            fits[cand.name] = fitted
        if errs:
            errors[cand.name] = errs
    tests: dict[str, Any] = {}
    chosen, criterion = _choose(entries, errors, clusters, _test_clusters(df), tests)
    used = tests.pop("splits", [])
    first = used[0] if used else None
    summary = {"chosen": chosen, "criterion": criterion, "loss_column": loss_column,
               "reference": _describe_reference(df, ref),
               "splits": used,
               "split": _describe_split(df, next((sp for sp in splits if sp.by == first), primary)),
               "split_details": [_describe_split(df, sp) for sp in splits],
               "split_notes": split_notes,
               "noise_se": NOISE_SE, "clustered_by": clustered_by,
               "bits_groups": {k: list(v) for k, v in BITS_GROUPS.items()},
               **tests,
               "within_noise": [e["name"] for e in entries if e.get("within_noise")],
               "chosen_residuals": heldout_errors_by_recipe(df, *errors[chosen][first]) if chosen in errors and first in errors[chosen] else [],
               "chosen_residuals_by_split": {by: heldout_errors_by_recipe(df, *errors[chosen][by]) for by in used
                                             if chosen in errors and by in errors[chosen]},
               "candidates": entries}
    return _json_safe(summary), fits


def chosen_fit(df: pd.DataFrame, choice: dict[str, Any], fits: Mapping[str, FitResult], *, bootstrap: int = 0,
               seed: int = 0, loss_column: str = "val_loss") -> FitResult:
    """The chosen law's full-data fit (select's `fits[choice["chosen"]]`) carrying `choice` as its selection,
    with `bootstrap` resamples. A law without a bits axis (capacity, kumar_eff) has no loss at a format it
    was not measured at, so the P* profile over the formats chips run is drawn from another law: the
    sound one with a bits axis that the data cannot tell from the chosen law (`within_noise`) and has the
    lowest held-out score, fitted on the same rows and resampled as the chosen one; stored as
    `choice["profile"]` = {name, fit: its FitResult.to_dict() without residuals}, or None (the chosen law
    has a bits axis, or no such law is within noise, or each one's resamples make it degenerate)."""
    result = fits[choice["chosen"]]
    result.selection = choice
    if bootstrap:
        fit.bootstrap_fit(df, result, bootstrap, seed, loss_column)
        result = _sound_after_bootstrap(df, choice, fits, result, bootstrap, seed, loss_column)
    choice["profile"] = None
    if laws.get(result.law).bits_axis:
        return result
    ranked = sorted((e for e in choice["candidates"] if e.get("within_noise") and e["name"] in fits
                     and laws.get(e["law"]).bits_axis and e.get("degenerate") is None), key=lambda e: e["score"])
    for entry in ranked:
        alt = fits[entry["name"]]
        if bootstrap:
            fit.bootstrap_fit(df, alt, bootstrap, seed, loss_column)
        if alt.degenerate is None:
            choice["profile"] = {"name": entry["name"],
                                 "fit": {k: v for k, v in alt.to_dict().items() if k not in ("residuals", "selection")}}
            break
    return result


def _describe_split(df: pd.DataFrame, split: Split | str) -> dict[str, Any]:
    """What was held out: the split, its smallest held-out value (the largest value for budget and N),
    runs left out and rows fitted (or why none)."""
    if isinstance(split, str):
        return {"by": None, "note": split}
    if split.by in ("budget", "N"):
        value = pd.to_numeric(df[split.by], errors="coerce").max()
    else:
        n, d = (pd.to_numeric(df[c], errors="coerce").to_numpy(float) for c in ("N", "D"))
        value = float(np.min((n * d if split.by == "compute" else d / n)[split.scored]))
    return {"by": split.by, "value": float(value), "held_runs": split.held_runs,
            "train_rows": int(split.train.sum()), "train_runs": int(len(np.unique(_run_ids(df)[split.train]))),
            "note": split.note}


def _test_clusters(df: pd.DataFrame) -> np.ndarray:
    """The likelihood tests' clusters: (N, seed) cells (module doc), the run where there is no N."""
    keys = [c for c in ("N", "seed") if c in df.columns]
    return df.groupby(keys, sort=False, dropna=False).ngroup().to_numpy() if "N" in keys else _run_ids(df)


def _as_splits(errs: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return errs if isinstance(errs, dict) else {"heldout": errs}


def likelihood_test(big: Mapping[str, tuple], small: Mapping[str, tuple], clusters: np.ndarray,
                    splits: Sequence[str]) -> dict[str, Any]:
    """Does law `big` predict the held-out gaps better than `small`? A held-out Gaussian likelihood ratio,
    paired by row and clustered: each row's contribution d_i = (e_small,i^2 - e_big,i^2) / (2·s^2) (the
    difference of the two laws' log-likelihoods of the held-out gap under a common N(0, s^2), s^2 the big
    law's mean squared error), averaged over `splits` (each split weighs the same), its variance clustered
    (pooled_mean_and_var), t = mean / SE, one-sided p from t with G - 1 dof.

    Held out, not in-sample: in-sample the larger of two nested laws never fits worse, and where the smaller
    one is true the ratio sits at the boundary of its params (gamma -> 0, C_T -> 0), so neither chi-square
    nor a normal reference holds; on held-out rows the extra params cost their estimation noise and the
    paired difference is centred at or below zero when they add nothing (a conservative test for nested
    laws: Clark and McCracken). loglik_ratio: the sum of d_i over the rows of all splits. With fewer than
    MIN_TEST_CLUSTERS clusters there is no statistic (p_value None, `reason` says why): the test does not
    decide, so the smaller law is kept."""
    parts, total = [], 0.0
    s2 = float(np.mean(np.concatenate([big[by][1] ** 2 for by in splits]))) or 1.0
    for by in splits:
        (pos, e_big), (_, e_small) = big[by], small[by]
        d = (e_small ** 2 - e_big ** 2) / (2 * s2)
        parts.append((d, clusters[pos]))
        total += float(np.sum(d))
    mean, var, g = pooled_mean_and_var(parts)
    out = {"statistic": None, "p_value": None, "n_clusters": g, "n": int(sum(len(d) for d, _ in parts)),
           "loglik_ratio": total, "mean_loglik_diff": mean, "splits": list(splits)}
    if g < MIN_TEST_CLUSTERS:
        out["reason"] = f"{g} clusters: a clustered test needs at least {MIN_TEST_CLUSTERS}, so it cannot decide"
    elif var > 0:
        t = mean / np.sqrt(var)
        out.update(statistic=float(t), p_value=float(stats.t.sf(t, g - 1)))
    return out


def _sound_after_bootstrap(df: pd.DataFrame, choice: dict[str, Any], fits: Mapping[str, FitResult], result: FitResult,
                           bootstrap: int, seed: int, loss_column: str) -> FitResult:
    """The chosen fit, or, where its resamples make it degenerate (fit.degenerate_reason), the next candidate
    in the selection's own order (held-out score, else AIC) whose full-data fit and resamples are sound:
    no optimum may be derived from a degenerate fit, so one is never kept while a sound one exists. Each
    law set aside is recorded in `choice["set_aside"]` (name, reason) and the criterion says so."""
    if result.degenerate is None:
        return result
    order = sorted((e for e in choice["candidates"] if e["fittable"] and e["name"] in fits
                    and e["name"] != choice["chosen"] and e.get("degenerate") is None),
                   key=lambda e: (e["score"] if e.get("score") is not None else np.inf, e["aic"], e["n_params"]))
    choice["set_aside"] = [{"name": choice["chosen"], "reason": result.degenerate}]
    for entry in order:
        alt = fits[entry["name"]]
        fit.bootstrap_fit(df, alt, bootstrap, seed, loss_column)
        if alt.degenerate is None:
            choice["criterion"] += "; " + "; ".join(f"`{a['name']}` set aside: its bootstrap made it degenerate ({a['reason']})"
                                                     for a in choice["set_aside"]) + f"; `{entry['name']}` is the next sound one"
            choice["chosen"] = entry["name"]
            alt.selection = choice
            return alt
        choice["set_aside"].append({"name": entry["name"], "reason": alt.degenerate})
    return result  # every candidate is degenerate: the first, as chosen, says why


def _choose(entries: list[dict[str, Any]], errors: Mapping[str, Any], clusters: np.ndarray,
            test_clusters: np.ndarray | None = None, tests: dict[str, Any] | None = None) -> tuple[str | None, str]:
    """Choose a law and mark every law within noise of it; returns (chosen, criterion) and fills `tests`
    (precision_test, nested_tests, choice_rule, splits: those ranked on).

    errors: name -> {split: (positions, held-out gap errors)} (or one (positions, errors) pair). The splits
    ranked on are those every scored law was scored on (else the one most were). Score: the mean over
    them of each split's held-out gap MAE. Then:
    1. precision test: the best-scoring sound law with a precision term against the `chinchilla`
       candidate (likelihood_test, clustered by `test_clusters`); unless it beats chinchilla at ALPHA,
       chinchilla is chosen. Without a chinchilla candidate this step is skipped.
    2. otherwise the best-scoring sound law with a precision term (the best-scoring sound law where
       there is no precision test); a degenerate full-data fit (fit.degenerate_reason) is scored but
       chosen only when every law is;
    3. nested laws (Law.nests, same fixed params): the chosen law gives way to the law it nests unless it
       beats it at ALPHA, and to a law nesting it that beats it at ALPHA (repeated; never down to
       chinchilla once the precision test said yes).
    within_noise: for each scored law k, Delta = the split-averaged mean of |e_k| - |e_chosen| on the
    same rows, SE clustered by `clusters` (recipes) across splits (pooled_mean_and_var); within noise if
    Delta <= NOISE_SE · SE (negative Delta: better than the chosen, within noise); with a single cluster
    every scored law is. The chosen law is always within noise.
    """
    tests = {} if tests is None else tests
    tests.update({"precision_test": None, "nested_tests": [], "choice_rule": CHOICE_RULE, "splits": []})
    fitted = [e for e in entries if e["fittable"]]
    errors = {k: _as_splits(v) for k, v in errors.items()}
    for e in entries:
        e["within_noise"], e["score"], e["gap_mae_diff"] = False, None, None
    scored = [e for e in fitted if errors.get(e["name"])]
    if scored:
        common = set.intersection(*(set(errors[e["name"]]) for e in scored))
        if not common:
            counts: dict[str, int] = {}
            for e in scored:
                for by in errors[e["name"]]:
                    counts[by] = counts.get(by, 0) + 1
            common = {max(counts, key=counts.get)}
        order = [by for e in scored for by in errors[e["name"]]]
        used = [by for by in dict.fromkeys(order) if by in common]
        ranked = [e for e in scored if set(used) <= set(errors[e["name"]])]
    else:
        used, ranked = [], []
    tests["splits"] = used
    if not ranked:
        if not fitted:
            return None, "none: no candidate could be fitted"
        best = min([e for e in fitted if not e.get("degenerate")] or fitted, key=lambda e: (e["aic"], e["n_params"]))
        best["within_noise"] = True
        return best["name"], ("aic (no held-out precision gap could be measured; the sound fit with the lowest AIC, "
                              "degenerate fits only where every fit is)")
    for e in ranked:
        e["score"] = float(np.mean([np.mean(np.abs(errors[e["name"]][by][1])) for by in used]))
    test_clusters = clusters if test_clusters is None else test_clusters
    sound = [e for e in ranked if not e.get("degenerate")] or ranked
    best = min(sound, key=lambda e: (e["score"], e["n_params"]))
    memo: dict[tuple[str, str], dict[str, Any]] = {}

    def test(big: dict, small: dict) -> dict[str, Any]:
        key = (big["name"], small["name"])
        if key not in memo:
            memo[key] = {"big": big["name"], "small": small["name"], "alpha": ALPHA,
                         **likelihood_test(errors[big["name"]], errors[small["name"]], test_clusters, used)}
            p = memo[key]["p_value"]
            memo[key]["beats"] = bool(p is not None and p < ALPHA)
        return memo[key]

    chosen, how = best, "the lowest mean held-out gap MAE"
    chin = next((e for e in sound if e.get("law") == "chinchilla" and e["name"] == "chinchilla"), None) or \
        next((e for e in sound if e.get("law") == "chinchilla"), None)
    precise = [e for e in sound if e.get("law") and laws.get(e["law"]).precision_axis]
    if chin is not None and precise:
        top = min(precise, key=lambda e: (e["score"], e["n_params"]))
        pt = tests["precision_test"] = test(top, chin)
        pt["verdict"] = (f"`{top['name']}` beats `{chin['name']}` (no precision term)" if pt["beats"] else
                         f"no law with a precision term beats `{chin['name']}`: it is chosen")
        chosen, how = (top, "the precision law with the lowest mean held-out gap MAE") if pt["beats"] else \
            (chin, "the precision test (no precision law beats chinchilla)")
    elif precise and chin is None:
        listed = next((e for e in entries if e.get("law") == "chinchilla"), None)
        why = ("no chinchilla candidate to test a precision term against" if listed is None else
               f"`{listed['name']}` could not be fitted" if not listed["fittable"] else
               f"`{listed['name']}` is degenerate ({listed['degenerate']})" if listed.get("degenerate") else
               f"`{listed['name']}` was not scored on the held-out splits {', '.join(used)}")
        tests["precision_test"] = {"verdict": None, "reason": why}
    if chosen.get("law") and (chosen is not chin or chin is None):
        same = {e["name"]: e for e in sound if e.get("law")}
        for _ in range(8):  # a chain of nested laws is short; each step is one test
            law = laws.get(chosen["law"])
            smaller = next((e for e in same.values() if law.nests and e["law"] == law.nests and e["fixed"] == chosen["fixed"]
                            and (e is not chin or chin is None)), None)
            bigger = next((e for e in same.values() if laws.get(e["law"]).nests == chosen["law"] and e["fixed"] == chosen["fixed"]), None)
            if smaller is not None and not test(chosen, smaller)["beats"]:
                chosen, how = smaller, f"the nested test (`{chosen['name']}` does not beat `{smaller['name']}`)"
                continue
            if bigger is not None and test(bigger, chosen)["beats"]:
                chosen, how = bigger, f"the nested test (`{bigger['name']}` beats `{chosen['name']}`)"
                continue
            break
    tests["nested_tests"] = [t for k, t in memo.items() if tests["precision_test"] is not t]
    c_errs = errors[chosen["name"]]
    for e in ranked:
        parts = []
        for by in used:
            pos, err = errors[e["name"]][by]
            pos_c, err_c = c_errs[by]
            assert np.array_equal(pos, pos_c)  # held-out rows depend on the data only, not the law
            parts.append((np.abs(err) - np.abs(err_c), clusters[pos]))
        delta, var, _ = pooled_mean_and_var(parts)
        se = float(np.sqrt(var))
        e["gap_mae_diff"] = {"value": delta, "se": _finite(se)}
        e["within_noise"] = bool(e is chosen or not np.isfinite(se) or delta <= NOISE_SE * se)
    labels = ", ".join(used)
    return chosen["name"], f"heldout_gap_mae (mean over the held-out splits {labels}; chosen by {how})"


CHOICE_RULE = ("score = mean over the held-out splits (largest compute budget, largest N, largest D/N; whole runs "
               "left out) of the held-out precision-gap MAE; precision test: the best-scoring sound law with a "
               "precision term vs chinchilla, a held-out likelihood ratio clustered by (N, seed), one-sided at "
               f"{ALPHA:g}: if it does not beat chinchilla, chinchilla is chosen; else that law, and nested laws "
               "(kumar within kumar_data) by the same test; within noise: excess MAE over the chosen law <= "
               f"{NOISE_SE:g} recipe-clustered SEs; degenerate fits scored, never chosen while a sound one exists")


def _describe_reference(df: pd.DataFrame, ref: np.ndarray) -> dict[str, Any]:
    out: dict[str, Any] = {"n_rows": int(ref.sum())}
    if "recipe" in df.columns:
        out["recipes"] = sorted(df.loc[ref, "recipe"].astype(str).unique())
    for c in fit.REFERENCE_ORDER:
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
