"""The held-out evidence law selection (scaling.study.analysis.selection) chooses on: which rows each
held-out split leaves out, the precision gaps (loss minus the matching high-precision reference run's
loss) it scores, the clustered statistics of held-out errors (means and their variances with the
rows of a cluster correlated, the paired held-out likelihood test) and their cluster resamples (_resample,
on which selection's stability repeats the choice). None of it depends on a law: the splits are a
property of the data, and selection fits and compares the laws on them.

Strict splits (heldout_splits): each split is a threshold on one key (a row's compute, N or D/N); every
row at or beyond it is held out of the fit, whatever run it belongs to, the reference's rows and cooldown
branches included, and every fitted row is strictly below it. A run's earlier rows below the threshold stay
in the fit: predicting a run's later tokens from its earlier ones is the honest test in D, while leaving a
later checkpoint in the fit would let a law that memorises runs look as if it extrapolated. The scored
rows are the held-out rows with a measurable gap (a matching reference row). Each split's `label` says
what it holds out ("every row with N >= 8.04e5 held out (k rows of m runs)").

Why apart from selection: these are what a held-out score means (which rows, which gaps, which standard
errors), while selection decides which law to keep; tests and figures read the splits without the choice.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from scaling.study.analysis import fit
from scaling.errors import ConfigError

# The held-out splits, in order: compute (the largest IsoFLOP `budget`; a table without budgets: the
# largest N·D), size (the largest N) and tokens per parameter (the largest D/N). Each holds out every row
# at or beyond its threshold. D/N rather than D: at a fixed N the largest D is the largest D/N, but across
# sizes the largest D belongs to the largest models, which the N split already holds out; D/N is the axis
# along which a precision penalty that grows with the data (kumar_data's D^gamma_D / N^gamma_N) shows.
SPLITS = ("compute", "N", "D/N")
SELECTION_SPLITS = ("budget", "N")  # heldout_split's (the first usable of these): kept for its callers
# A continuous key (N·D without budgets, D/N) holds out its largest values holding at most this share of
# the rows with a gap (at least the largest value), as fit.holdout_error's frac.
TOP_SHARE = 0.2
# Keys equal to 6 significant digits count as one (a D logged as 4e9 by one run and 3.9999999e9 by another):
# a row is held out where key >= threshold · (1 - REL_TOL), so every fitted row is strictly below the threshold.
REL_TOL = 1e-6
# The likelihood test's fewest clusters: with G clusters the clustered variance has G - 1 degrees of
# freedom, and with two or three it can come out near zero (a quick study's nested test gave t = 7e15 on
# 2 clusters).
MIN_TEST_CLUSTERS = 4


@dataclass(frozen=True)
class Split:
    """A held-out split: `by` ('budget', 'compute', 'N' or 'D/N'), the threshold on its key (`key`: 'budget',
    'N·D', 'N' or 'D/N'), the rows the law is fitted on (`train`: every row strictly below the threshold),
    the rows whose gaps are scored (`scored`: the held-out rows with a matching reference row), how many
    rows and runs have a row held out, `label` (the rule in words) and `note` (why an earlier split could
    not be used, or None)."""

    by: str
    scored: np.ndarray
    train: np.ndarray
    held_runs: int
    note: str | None = None
    key: str = ""
    threshold: float = float("nan")
    held_rows: int = 0
    label: str = ""


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


def _describe_reference(df: pd.DataFrame, ref: np.ndarray) -> dict[str, Any]:
    out: dict[str, Any] = {"n_rows": int(ref.sum())}
    if "recipe" in df.columns:
        out["recipes"] = sorted(df.loc[ref, "recipe"].astype(str).unique())
    for c in fit.REFERENCE_ORDER:
        if c in df.columns:
            out[c] = float(pd.to_numeric(df.loc[ref, c]).max())
    return out


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


def _short(x: float) -> str:
    """3 significant digits, exponents without '+' or leading zeros: 8.04e5, 1e13, 55.7."""
    return f"{x:.3g}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")


def _row_compute(df: pd.DataFrame) -> np.ndarray:
    """Each row's compute in its `budget` labels' units (a budget is priced by its own cost model, not 6·N·D):
    a labelled row's budget; an unlabelled one (a cooldown branch, an intermediate evaluation) its run's
    budget per token times its D; a run with no label, 6·N·D times the median ratio of budget to 6·N·D over
    the labelled rows of its recipe (of every labelled row where its recipe has none)."""
    budget = pd.to_numeric(df["budget"], errors="coerce").to_numpy(float)
    d = pd.to_numeric(df["D"], errors="coerce").to_numpy(float)
    nd6 = 6.0 * pd.to_numeric(df["N"], errors="coerce").to_numpy(float) * d
    per_token = pd.Series(budget / d).groupby(_run_ids(df)).transform("median").to_numpy(float)
    ratio = pd.Series(budget / nd6)
    if "recipe" in df.columns:
        by_recipe = ratio.groupby(df["recipe"].astype(str).to_numpy()).transform("median").to_numpy(float)
        ratio = np.where(np.isfinite(by_recipe), by_recipe, np.nanmedian(ratio))
    else:
        ratio = np.full(len(df), np.nanmedian(ratio))
    return np.where(np.isfinite(budget), budget, np.where(np.isfinite(per_token), per_token * d, ratio * nd6))


def _top_threshold(key: np.ndarray, share: float = TOP_SHARE) -> float:
    """The smallest of the largest values of `key` (finite, > 0) that together hold at most `share` of those
    rows (at least the largest value); values equal to 6 significant digits count as one."""
    key = key[np.isfinite(key) & (key > 0)]
    rounded = np.round(np.log(key), 6)
    values, counts = np.unique(rounded, return_counts=True)
    cum = np.cumsum(counts[::-1]) / len(key)
    top = values[::-1][max(0, int(np.searchsorted(cum, share, side="right")) - 1)]
    return float(np.min(key[rounded >= top]))


def _strict_split(df: pd.DataFrame, by: str, key_name: str, key: np.ndarray, threshold: float,
                  gappable: np.ndarray) -> Split | str:
    """The Split holding out every row with key >= threshold (a row without a key too: it cannot be shown to
    be below), scoring those with a gap (`gappable`); or why that leaves nothing to fit on."""
    held = ~(key < threshold * (1 - REL_TOL))
    if held.all():
        return f"every row has {key_name} >= {_short(threshold)}: nothing left to fit on"
    runs = len(np.unique(_run_ids(df)[held]))
    label = f"every row with {key_name} >= {_short(threshold)} held out ({int(held.sum())} rows of {runs} runs)"
    return Split(by, held & gappable, ~held, runs, None, key_name, float(threshold), int(held.sum()), label)


def _gappable(df: pd.DataFrame, ids: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Rows with a measurable gap: not reference rows, with a reference row of the same (N, D, seed)."""
    n_ids = int(ids.max()) + 1 if len(ids) else 0
    return ~ref & (np.bincount(ids[ref], minlength=n_ids)[ids] > 0) if n_ids else np.zeros(len(df), bool)


def heldout_splits(df: pd.DataFrame, ids: np.ndarray | None = None, ref: np.ndarray | None = None
                   ) -> tuple[list[Split], dict[str, str]]:
    """Every held-out split the table allows (SPLITS, in order) and, by name, why each other one is not made.

    compute: threshold the largest IsoFLOP `budget`, key each row's compute in budget units (_row_compute;
    by 'budget'); a table without two budgets: the largest N·D (by 'compute', TOP_SHARE). N: the largest
    size. D/N: the largest tokens per parameter (TOP_SHARE). Thresholds are set among the rows with a
    measurable gap (a matching reference row, `ref`: reference_mask by default): a size trained only in low
    precision has no gap to score, so the N threshold is the largest size that has one, and every row at or
    beyond it (that size included) is held out. _strict_split holds out and scores."""
    df = df.reset_index(drop=True)
    ids = _match_ids(df) if ids is None else ids
    ref = reference_mask(df) if ref is None else ref
    gappable = _gappable(df, ids, ref)
    num = {c: pd.to_numeric(df[c], errors="coerce").to_numpy(float) for c in ("N", "D", "budget") if c in df.columns}
    splits, notes = [], {}
    for name in SPLITS:
        if name == "compute" and {"budget", "N", "D"} <= set(num) and \
                len(np.unique(num["budget"][gappable & np.isfinite(num["budget"])])) >= 2:
            got = _strict_split(df, "budget", "budget", _row_compute(df), np.nanmax(num["budget"][gappable]), gappable)
        elif not ({"N"} if name == "N" else {"N", "D"}) <= set(num):
            notes[name] = "no N column" if name == "N" else "no N and D columns"
            continue
        else:
            key_name = {"compute": "N·D", "N": "N", "D/N": "D/N"}[name]
            key = {"compute": lambda: num["N"] * num["D"], "N": lambda: num["N"], "D/N": lambda: num["D"] / num["N"]}[name]()
            values = key[gappable & np.isfinite(key) & (key > 0)]
            if len(np.unique(np.round(np.log(values), 6))) < 2:
                notes[name] = f"fewer than two values of {key_name} with a gap to the reference"
                continue
            threshold = float(np.max(values)) if name == "N" else _top_threshold(values)
            got = _strict_split(df, name, key_name, key, threshold, gappable)
        if isinstance(got, str):
            notes[name] = got
        else:
            splits.append(got)
    return splits, notes


def heldout_split(df: pd.DataFrame, ids: np.ndarray | None = None) -> Split | str:
    """The first split of SELECTION_SPLITS (the largest `budget`, else the largest N) heldout_splits makes
    (Split, with `note` saying why the budget split could not be used), or why there is none."""
    splits, notes = heldout_splits(df.reset_index(drop=True), ids)
    made = {sp.by: sp for sp in splits}
    if "budget" in made:
        return made["budget"]
    reasons = ["no budget column" if "budget" not in df.columns else
               notes.get("compute") if "compute" in notes and "N·D" not in notes["compute"] else
               "fewer than two values of budget with a gap to the reference"]
    if "N" in made:
        return replace(made["N"], note=reasons[0])
    return "; ".join(reasons + [notes.get("N", "no N split")])


def _describe_split(df: pd.DataFrame, split: Split | str) -> dict[str, Any]:
    """What was held out: the split, its key and threshold (`value`), the rule in words (`label`), rows and
    runs held out (a run counts if any of its rows is), rows scored, rows and runs fitted; or why none."""
    if isinstance(split, str):
        return {"by": None, "note": split}
    return {"by": split.by, "key": split.key, "value": split.threshold, "label": split.label,
            "held_rows": split.held_rows, "held_runs": split.held_runs, "scored_rows": int(split.scored.sum()),
            "train_rows": int(split.train.sum()), "train_runs": int(len(np.unique(_run_ids(df)[split.train]))),
            "note": split.note}


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


def _resample(errors: Mapping[str, dict], cells: np.ndarray, draw: np.ndarray, n: int) -> dict[str, dict]:
    """The held-out errors of a cluster resample: the rows of each drawn cell, the j-th draw's rows at
    positions j·n + pos (a cell drawn twice counts as two clusters)."""
    out: dict[str, dict] = {name: {} for name in errors}
    for by in {by for errs in errors.values() for by in errs}:
        pos = next(errs[by][0] for errs in errors.values() if by in errs)
        rows = [(j, np.flatnonzero(cells[pos] == c)) for j, c in enumerate(draw)]
        take = np.concatenate([r for _, r in rows])
        if len(take) == 0:
            continue  # no drawn cell has a row in this split
        new_pos = np.concatenate([j * n + pos[r] for j, r in rows])
        for name, errs in errors.items():
            if by in errs:
                out[name][by] = (new_pos, errs[by][1][take])
    return out
