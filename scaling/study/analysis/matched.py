"""Matched-token numerics: what a number format does to the loss at the same model, tokens and seed,
before any cost model decides which compute each recipe is charged.

A recipe's *matched gap* at a point is its loss minus the reference recipe's loss at the same (N, D,
seed) and model shape (and sweep, where the table has one): same initialisation, same data order, same
tokens; only the numerics differ. `matched_gaps` fits, per recipe, one paired regression over every
matched point of every budget together:

    gap = a + b·(ln N − m_N) + c·(ln(D/N) − m_DN)

where m_N and m_DN are the means of ln N and ln(D/N) over *that recipe's* matched points, so `a` is
exactly the recipe's mean matched gap over its points (the centre is reported as N and D/N, geometric
means), b the change per e-fold of N at fixed D/N, c per e-fold of D/N (tokens per parameter) at fixed N.

Why clustered, and how: a seed fixes both the initialisation and the data order, so a run's deviation is
shared by every evaluation of that run (every D of one (N, seed)), and it correlates across recipes (a
seed's luck shows in every recipe trained with it). Points are not independent; the independent units are the
(N, seed) cells. Standard errors are the cluster-robust sandwich over those cells with the CR1
small-sample factor G/(G−1)·(n−1)/(n−p), and intervals use Student t with G−1 degrees of freedom
(Cameron & Miller 2015). Chosen over a cluster bootstrap because a study has 7–20 cells per recipe, and
resampling so few cells often drops every cell at one N or one D/N (a singular refit) and gives intervals
that are too narrow; the sandwich is deterministic, and vectorises over replications for the coverage test.

Family-wise: `matched_gaps` reports several recipes × three coefficients, and a verdict read off 1 of
many intervals is a multiple comparison. The family-wise interval is Bonferroni over every estimable
coefficient of every recipe reported (m of them): t quantile at 1 − (1 − level)/(2m). Bonferroni, not
max-t, because the recipes' estimates are correlated through the shared reference runs and seeds, and
Bonferroni holds under any dependence without estimating the cross-recipe covariance (max-t would need
it, from the same few clusters). Each recipe's verdict ("lower than the reference", "higher than the
reference", "cannot tell") is read from its `a` family-wise interval.

An interval that cannot be estimated is None with a reason, never zero width: fewer than 2 clusters,
no residual degrees of freedom, a coefficient not identified by the design (every point at one N or one
D/N, or ln N and ln(D/N) collinear: the coefficient is dropped from the model and reported None), or a
zero residual spread.

`paired_contrast(df, a, b)` is the same paired, clustered model for recipe a minus recipe b (e.g. mxfp6 −
fp8) at the points both measured, with the counts of negative and positive differences. An IsoFLOP
design under a bits cost model gives each recipe its own tokens at a budget, so two low-precision recipes
share no matched point; `via=R` then contrasts their matched gaps to R (each at its own tokens, stacked in
one regression clustered by (N, seed) across both, a − b at a common centre).

Coverage (tests/study/test_matched.py, 15 (N, seed) cells × 4 D/N, cluster noise dominating): the
family-wise 95% intervals cover all 9 coefficients of 3 recipes together in 0.92–0.94 of replications
(CR1 with 15 clusters runs a little short, mostly in the N slope); naive iid intervals in 0.31.

Pure pandas/numpy/scipy: no JAX.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from scaling.errors import ConfigError
from scaling.study.analysis.isoflop import LEVEL, high_precision_recipe, ok_rows, study_part

SHAPE_COLUMNS = ("size", "n_layers", "d_model")  # model shape columns paired on where the table has them
POINT_COLUMNS = ("sweep", "N", "D", "seed")  # a matched point (sweep where present: other sweeps may differ in setup)
CLUSTER_COLUMNS = ("N", "seed")  # one run's seed: its deviation is shared by every D of that run
TERMS = ("a", "b", "c")  # intercept (the mean gap at the centre), slope per e-fold of N, per e-fold of D/N
TERM_NAMES = {"a": "mean gap at the centre", "b": "per e-fold of N", "c": "per e-fold of D/N"}
CONTRAST_TERMS = ("a0", "b0", "c0", "a", "b", "c")  # b's gap model, then a's minus b's (paired_contrast via=)
CONTRAST_NAMES = {"a": "a − b at the centre", "b": "a − b, per e-fold of N", "c": "a − b, per e-fold of D/N"}
METHOD = ("paired OLS gap = a + b·(ln N − mean) + c·(ln(D/N) − mean), centred on the recipe's matched points; "
          "CR1 cluster-robust SEs by (N, seed), t with G−1 dof")
NAIVE_METHOD = "paired OLS, points treated as independent (iid SEs, t with n−p dof): for comparison only"
COLLINEAR = 0.99  # |correlation| of ln N and ln(D/N) above which the D/N slope is not identified apart from N's
_REL_TOL = 1e-9  # a coefficient whose SE is below this (relative to 1 + |estimate|) has no estimable spread


# ----------------------------------------------------------------------------- the estimator

@dataclass
class ClusterFit:
    """One or many (k) regressions sharing a design x (n × len(terms)) and clusters. beta, se:
    (len(terms),) or (len(terms), k), NaN where a term has no estimate or no SE; reasons: term -> why it
    has no interval (None where it has one); dof: the t distribution's degrees of freedom (G − 1
    clustered, n − p iid); p: the coefficients fitted (identified terms)."""

    terms: tuple[str, ...]
    beta: np.ndarray
    se: np.ndarray
    dof: int
    n: int
    clusters: int
    p: int
    reasons: dict[str, str | None] = field(default_factory=dict)

    def interval(self, term: str, q: float) -> tuple[np.ndarray, np.ndarray] | None:
        """(lo, hi) at t multiplier q, or None where the term has no interval."""
        if self.reasons.get(term):
            return None
        i = self.terms.index(term)
        return self.beta[i] - q * self.se[i], self.beta[i] + q * self.se[i]


def identified(x: np.ndarray, terms: Sequence[str], reasons: dict[str, str | None]) -> dict[str, str | None]:
    """reasons, with every column that adds no rank to the ones before it (in order, skipping those already
    excused) marked not identified: a singular design is reduced, never inverted."""
    reasons = dict(reasons)
    kept: list[np.ndarray] = []
    for i, t in enumerate(terms):
        if reasons.get(t):
            continue
        col = x[:, i]
        scale = np.sqrt(np.mean(col ** 2)) if col.size else 0.0
        if scale < 1e-12:
            reasons[t] = "not identified: the column is zero at every matched point"
            continue
        z = np.column_stack(kept + [col / scale])
        s = np.linalg.svd(z, compute_uv=False)
        if s[-1] / s[0] < 1e-6:
            reasons[t] = "not identified: collinear with the other terms over the matched points"
            continue
        kept.append(col / scale)
    return reasons


def cluster_ols(x: np.ndarray, y: np.ndarray, clusters: np.ndarray | None, terms: Sequence[str] = TERMS,
                reasons: dict[str, str | None] | None = None) -> ClusterFit:
    """OLS of y (n,) or (n, k) — k replications sharing x and clusters — on the columns of x not excused in
    `reasons` (those stay NaN), with CR1 cluster-robust SEs, factor G/(G−1)·(n−1)/(n−p), and G − 1 dof;
    clusters=None: classic iid SEs, s²(X'X)⁻¹, with n − p dof (the naive analysis, for comparison)."""
    terms = tuple(terms)
    x, y = np.asarray(x, float).reshape(-1, len(terms)), np.asarray(y, float)
    single = y.ndim == 1
    y2 = y[:, None] if single else y
    n, k = y2.shape
    reasons = {t: (reasons or {}).get(t) for t in terms}
    if n:
        reasons = identified(x, terms, reasons)
    keep = [i for i, t in enumerate(terms) if not reasons[t]]
    p = len(keep)
    labels = None if clusters is None else pd.factorize(np.asarray(clusters, dtype=object).ravel())[0]
    g = n if labels is None else (int(labels.max()) + 1 if n else 0)
    beta, se = np.full((len(terms), k), np.nan), np.full((len(terms), k), np.nan)
    dof = (n - p) if labels is None else (g - 1)

    def out() -> ClusterFit:
        return ClusterFit(terms, beta[:, 0] if single else beta, se[:, 0] if single else se, dof, n, g, p, reasons)

    if n == 0:
        reasons.update({t: reasons[t] or "no matched points" for t in terms})
        return out()
    xk = x[:, keep]
    bread = np.linalg.inv(xk.T @ xk)
    b = bread @ xk.T @ y2
    beta[keep] = b
    why = None
    if labels is not None and g < 2:
        why = f"fewer than 2 clusters (N, seed cells): {g}"
    elif n <= p:
        why = f"no residual degrees of freedom ({n} points, {p} coefficients)"
    if why is None:
        e = y2 - xk @ b
        if labels is None:
            var = np.diag(bread)[:, None] * ((e ** 2).sum(axis=0) / (n - p))[None, :]
        else:
            onehot = np.zeros((g, n))
            onehot[labels, np.arange(n)] = 1.0
            u = np.einsum("gn,np,nk->kgp", onehot, xk, e)  # each cluster's score, per replication
            v = np.einsum("pq,kgq,kgr,rs->kps", bread, u, u, bread, optimize=True)
            var = np.diagonal(v, axis1=1, axis2=2).T * (g / (g - 1) * (n - 1) / (n - p))
        se[keep] = np.sqrt(np.maximum(var, 0.0))
    for i in keep:
        t = terms[i]
        if why is not None:
            reasons[t] = why
        elif np.all(se[i] <= _REL_TOL * (1 + np.abs(beta[i]))):
            reasons[t] = "zero residual spread: an interval would have zero width"
    return out()


def t_quantile(level: float, dof: int, m: int = 1) -> float:
    """The two-sided t multiplier at `level`, Bonferroni-split over m intervals (m = 1: pointwise)."""
    return float(stats.t.ppf(1 - (1 - level) / (2 * m), dof))


def gap_design(log_n: np.ndarray, log_dn: np.ndarray) -> tuple[np.ndarray, dict[str, str | None], dict[str, float]]:
    """The gap model's design (n × 3: 1, ln N − mean, ln(D/N) − mean over these points), the reason each
    slope is not identified (None where it is), and the centre (N and D/N, geometric means)."""
    log_n, log_dn = np.asarray(log_n, float), np.asarray(log_dn, float)
    reasons: dict[str, str | None] = {t: None for t in TERMS}
    if not log_n.size:
        return np.zeros((0, 3)), reasons, {}
    centre = {"N": float(np.exp(log_n.mean())), "D_over_N": float(np.exp(log_dn.mean()))}
    x = np.column_stack([np.ones_like(log_n), log_n - log_n.mean(), log_dn - log_dn.mean()])
    if np.ptp(log_n) < 1e-9:
        reasons["b"] = "not identified: every matched point at one N"
    if np.ptp(log_dn) < 1e-9:
        reasons["c"] = "not identified: every matched point at one D/N"
    elif np.ptp(log_n) >= 1e-9 and abs(r := float(np.corrcoef(log_n, log_dn)[0, 1])) > COLLINEAR:
        # the points lie on one line in (ln N, ln D/N) (one budget): the two slopes trade off against each
        # other and neither has a meaning of its own; the gap is modelled along N alone
        reasons["c"] = f"not identified: ln N and ln(D/N) collinear over the matched points (r = {r:.3f})"
    return x, reasons, centre


def contrast_design(log_n: np.ndarray, log_dn: np.ndarray, is_a: np.ndarray, a: str, b: str
                    ) -> tuple[np.ndarray, dict[str, str | None], dict[str, float]]:
    """The stacked design for recipe a's gaps minus recipe b's (each to the same third recipe, at its own
    matched points): columns a0, b0, c0 (b's gap model) and a, b, c (a's minus b's), ln N and ln(D/N)
    centred on the union of both recipes' points."""
    log_n, log_dn, ind = np.asarray(log_n, float), np.asarray(log_dn, float), np.asarray(is_a, float)
    reasons: dict[str, str | None] = {t: None for t in CONTRAST_TERMS}
    if not log_n.size:
        return np.zeros((0, 6)), reasons, {}
    centre = {"N": float(np.exp(log_n.mean())), "D_over_N": float(np.exp(log_dn.mean()))}
    zn, zd = log_n - log_n.mean(), log_dn - log_dn.mean()
    x = np.column_stack([np.ones_like(zn), zn, zd, ind, ind * zn, ind * zd])
    for name, side in ((b, ind == 0), (a, ind == 1)):
        if not side.any():
            reasons["a"] = f"no matched points of {name}"
        else:
            if np.ptp(log_n[side]) < 1e-9:
                reasons["b"] = f"not identified: every matched point of {name} at one N"
            if np.ptp(log_dn[side]) < 1e-9:
                reasons["c"] = f"not identified: every matched point of {name} at one D/N"
    return x, reasons, centre


# ----------------------------------------------------------------------------- matched points

def match_keys(df: pd.DataFrame) -> list[str]:
    """The columns a matched point is paired on: sweep (where present), N, D, seed, and the shape columns
    the table has."""
    return [c for c in (*POINT_COLUMNS, *SHAPE_COLUMNS) if c in df.columns]


def matched_points(df: pd.DataFrame, a: str, b: str, loss_column: str = "val_loss",
                   carry: Sequence[str] = ()) -> pd.DataFrame:
    """Recipe a's and recipe b's losses at the points both measured: one row per matched point with the
    key columns (match_keys), `loss_a`, `loss_b`, `diff` (a − b), `log_N`, `log_DN` (ln(D/N)), `cluster`
    ('N/seed') and the `carry` columns of a's row (e.g. budget). Repeated rows of one recipe at one point
    (none in a study table) are averaged."""
    for col in ("recipe", "N", "D", loss_column):
        if col not in df.columns:
            raise ConfigError("matched table columns", col, "a table with recipe, N, D and the loss column")
    keys = match_keys(df)
    rows = df.assign(_loss=pd.to_numeric(df[loss_column], errors="coerce"))
    rows = rows[np.isfinite(rows["_loss"])]
    carry = [c for c in carry if c in rows.columns]

    def side(recipe: str, extra: Sequence[str]) -> pd.DataFrame:
        part = rows[rows["recipe"].astype(str) == recipe]
        agg = {"_loss": "mean", **{c: "first" for c in extra}}
        return part.groupby(keys, dropna=False, sort=True).agg(agg)

    left = side(a, carry).rename(columns={"_loss": "loss_a"})
    right = side(b, ()).rename(columns={"_loss": "loss_b"})
    pair = left.join(right, how="inner").dropna(subset=["loss_a", "loss_b"]).reset_index()
    pair["diff"] = pair["loss_a"] - pair["loss_b"]
    pair["log_N"] = np.log(pair["N"].astype(float))
    pair["log_DN"] = np.log(pair["D"].astype(float) / pair["N"].astype(float))
    seed = pair["seed"].astype(str) if "seed" in pair.columns else "0"
    pair["cluster"] = pair["N"].astype(str) + "/" + seed
    return pair


def _interval(fit: ClusterFit, term: str, q: float) -> list[float] | None:
    iv = fit.interval(term, q)
    return None if iv is None else [float(iv[0]), float(iv[1])]


def _coef(fit: ClusterFit, term: str, level: float, m: int | None, meaning: str) -> dict[str, Any]:
    i = fit.terms.index(term)
    est = fit.beta[i]
    out: dict[str, Any] = {"term": term, "meaning": meaning, "estimate": None if np.isnan(est) else float(est),
                           "se": None if fit.reasons.get(term) else float(fit.se[i]),
                           "ci": None, "reason": fit.reasons.get(term)}
    if not fit.reasons.get(term):
        out["ci"] = _interval(fit, term, t_quantile(level, fit.dof))
    if m is not None:
        out["familywise_ci"] = None if fit.reasons.get(term) else _interval(fit, term, t_quantile(level, fit.dof, m))
    return out


def _verdict(ci: list[float] | None, lower: str, higher: str) -> str:
    if ci is None:
        return "cannot tell"
    return lower if ci[1] < 0 else higher if ci[0] > 0 else "cannot tell"


# ----------------------------------------------------------------------------- the two analyses

def matched_gaps(df: pd.DataFrame, reference: str | None = None, level: float = LEVEL,
                 loss_column: str = "val_loss", *, recipes: Sequence[str] | None = None,
                 clustered: bool = True) -> dict[str, Any]:
    """Each recipe's gap to `reference` at matched (N, D, seed, shape) points, modelled over every budget
    together (module doc). df: the rows to use (filter first, e.g. `ok_rows(study_part(df, "main"))`).
    reference: default the table's high_precision_recipe. recipes: default every other recipe in df.
    clustered=False: the naive iid analysis, for comparison only.

    Returns a JSON-friendly dict: reference, loss_column, level, keys (paired on), clustered_by, method,
    familywise {rule: 'Bonferroni', m, level, over}, recipes: [{recipe, n, clusters, dof, centre {N,
    D_over_N}, mean (= a: the mean matched gap over the recipe's points), mean_ci, mean_familywise_ci,
    coefficients {a, b, c: {estimate, se, ci, familywise_ci, reason}}, verdict (from a's family-wise
    interval), reason (why the mean has no interval, else None)}]."""
    if "recipe" not in df.columns:
        raise ConfigError("matched table columns", "recipe", "a table with a recipe column")
    names = list(dict.fromkeys(df["recipe"].astype(str)))
    if reference is None and "P" not in df.columns:
        raise ConfigError("reference", None, f"a recipe of {names} (no P column to pick the most precise one)")
    reference = reference if reference is not None else high_precision_recipe(df)
    if reference not in names:
        raise ConfigError("reference", reference, names)
    for r in recipes or ():
        if r not in names:
            raise ConfigError("recipe", r, names)
    wanted = [r for r in (recipes if recipes is not None else names) if r != reference]
    fits = []
    for r in wanted:
        pair = matched_points(df, r, reference, loss_column)
        x, reasons, centre = gap_design(pair["log_N"].to_numpy(), pair["log_DN"].to_numpy())
        fit = cluster_ols(x, pair["diff"].to_numpy(float), pair["cluster"].to_numpy() if clustered else None,
                          TERMS, reasons)
        fits.append((r, fit, centre))
    m = max(1, sum(1 for _, fit, _ in fits for t in TERMS if not fit.reasons.get(t)))
    out = []
    for r, fit, centre in fits:
        coefs = {t: _coef(fit, t, level, m, TERM_NAMES[t]) for t in TERMS}
        a = coefs["a"]
        out.append({"recipe": r, "n": int(fit.n), "clusters": int(fit.clusters), "dof": int(fit.dof) if fit.n else None,
                    "centre": centre, "mean": a["estimate"], "mean_ci": a["ci"],
                    "mean_familywise_ci": a["familywise_ci"], "coefficients": coefs,
                    "verdict": _verdict(a["familywise_ci"], "lower than the reference", "higher than the reference"),
                    "reason": a["reason"]})
    return {"reference": reference, "loss_column": loss_column, "level": level, "keys": match_keys(df),
            "clustered_by": list(CLUSTER_COLUMNS) if clustered else None,
            "method": METHOD if clustered else NAIVE_METHOD,
            "familywise": {"rule": "Bonferroni", "m": m, "level": level,
                           "over": "every estimable coefficient (a, b, c) of every recipe reported"},
            "recipes": out}


def paired_contrast(df: pd.DataFrame, a: str, b: str, level: float = LEVEL, loss_column: str = "val_loss",
                    *, via: str | None = None, clustered: bool = True) -> dict[str, Any]:
    """Recipe a minus recipe b at matched tokens, with the gap model's centring and (N, seed) clustering;
    one contrast, so pointwise intervals at `level`.

    via=None: a − b at the (N, D, seed, shape) points both measured (none where a design gives each recipe
    its own tokens at a budget, as an IsoFLOP design under a bits cost model does: then the reason says so).
    via=R: a's matched gap to R minus b's matched gap to R, each at its own matched points: the stacked
    regression gap = a0 + b0·zN + c0·zDN + [recipe a]·(a + b·zN + c·zDN), zN, zDN centred on both recipes'
    points together, clustered by (N, seed) across both (they share R's runs and the seeds); `a` is a's gap
    minus b's at that common centre. Counts (n_pairs, negative, positive) are then over the cells (N, seed,
    budget where the table has one) where both have a gap; `same_cell` also counts the raw losses there
    (matched compute as the design charged it, not matched tokens).

    Returns {a, b, via, loss_column, level, keys, clustered_by, method, n (points in the regression),
    clusters, dof, n_pairs, negative, positive, centre, mean (= coefficient a), ci, coefficients {a, b, c},
    verdict ('<a> lower than <b>', '<a> higher than <b>', 'cannot tell'), reason; via: n_a, n_b, same_cell}."""
    names = set(df["recipe"].astype(str)) if "recipe" in df.columns else set()
    for r in (a, b) + ((via,) if via is not None else ()):
        if r not in names:
            raise ConfigError("recipe", r, sorted(names))
    if via is not None and via in (a, b):
        raise ConfigError("via", via, f"a third recipe, not {a} or {b}")
    clusters = (lambda pair: pair["cluster"].to_numpy() if clustered else None)
    out: dict[str, Any] = {"a": a, "b": b, "via": via, "loss_column": loss_column, "level": level,
                           "keys": match_keys(df), "clustered_by": list(CLUSTER_COLUMNS) if clustered else None,
                           "method": (METHOD if clustered else NAIVE_METHOD)
                           + ("" if via is None else f"; a's and b's gaps to {via} stacked, a − b at a common centre")}
    if via is None:
        pair = matched_points(df, a, b, loss_column)
        x, reasons, centre = gap_design(pair["log_N"].to_numpy(), pair["log_DN"].to_numpy())
        if pair.empty:
            reasons = {t: f"no matched points: {a} and {b} were never evaluated at the same (N, D, seed)"
                       + (" (pass via=<a third recipe> to compare their matched gaps to it)") for t in TERMS}
        fit = cluster_ols(x, pair["diff"].to_numpy(float), clusters(pair), TERMS, reasons)
        d = pair["diff"].to_numpy(float)
        out.update(n_pairs=int(len(d)), negative=int((d < 0).sum()), positive=int((d > 0).sum()))
    else:
        pa = matched_points(df, a, via, loss_column, carry=("budget",)).assign(_is_a=1)
        pb = matched_points(df, b, via, loss_column, carry=("budget",)).assign(_is_a=0)
        both = pd.concat([pa, pb], ignore_index=True)
        x, reasons, centre = contrast_design(both["log_N"].to_numpy(), both["log_DN"].to_numpy(),
                                             both["_is_a"].to_numpy(), a, b)
        fit = cluster_ols(x, both["diff"].to_numpy(float), clusters(both), CONTRAST_TERMS, reasons)
        cell = [c for c in match_keys(df) if c != "D"] + (["budget"] if "budget" in df.columns else [])
        gaps = _cells(pa, pb, cell, "diff")
        losses = _cells(*(_recipe_rows(df, r, loss_column) for r in (a, b)), cell, "_loss")
        out.update(n_pairs=int(len(gaps)), negative=int((gaps < 0).sum()), positive=int((gaps > 0).sum()),
                   n_a=int(len(pa)), n_b=int(len(pb)),
                   same_cell={"by": cell, "n": int(len(losses)), "a_lower": int((losses < 0).sum()),
                              "note": f"raw loss {a} − {b} in the same cell: matched compute as the design "
                                      "charged it, not matched tokens"})
    coefs = {t: _coef(fit, t, level, None, CONTRAST_NAMES[t]) for t in TERMS}
    out.update(n=int(fit.n), clusters=int(fit.clusters), dof=int(fit.dof) if fit.n else None, centre=centre,
               mean=coefs["a"]["estimate"], ci=coefs["a"]["ci"], coefficients=coefs,
               verdict=_verdict(coefs["a"]["ci"], f"{a} lower than {b}", f"{a} higher than {b}"),
               reason=coefs["a"]["reason"])
    return out


def _recipe_rows(df: pd.DataFrame, recipe: str, loss_column: str) -> pd.DataFrame:
    rows = df[df["recipe"].astype(str) == recipe].assign(_loss=pd.to_numeric(df[loss_column], errors="coerce"))
    return rows[np.isfinite(rows["_loss"])]


def _cells(left: pd.DataFrame, right: pd.DataFrame, cell: list[str], column: str) -> np.ndarray:
    """left[column] − right[column] over the cells where each side has exactly one row."""
    cell = [c for c in cell if c in left.columns and c in right.columns]

    def one(side):
        if side.empty:
            return pd.Series(dtype=float)
        size = side.groupby(cell, dropna=False)[column].transform("size")
        return side[size == 1].set_index(cell)[column]

    j = pd.concat({"l": one(left), "r": one(right)}, axis=1, join="inner").dropna()
    return (j["l"] - j["r"]).to_numpy(float)


# ----------------------------------------------------------------------------- reading the result

def gaps_table(result: dict[str, Any]) -> pd.DataFrame:
    """matched_gaps' result as one row per recipe: recipe, n, clusters, mean, ci, familywise ci, the
    slopes b and c with their family-wise CIs, verdict."""
    def fmt(ci):
        return None if ci is None else f"{ci[0]:+.4f} to {ci[1]:+.4f}"

    rows = []
    for r in result["recipes"]:
        co = r["coefficients"]
        rows.append({"recipe": r["recipe"], "n": r["n"], "clusters": r["clusters"],
                     "mean": None if r["mean"] is None else round(r["mean"], 4),
                     "ci": fmt(r["mean_ci"]), "familywise_ci": fmt(r["mean_familywise_ci"]),
                     "b (per e-fold N)": None if co["b"]["estimate"] is None else round(co["b"]["estimate"], 4),
                     "b fw ci": fmt(co["b"].get("familywise_ci")),
                     "c (per e-fold D/N)": None if co["c"]["estimate"] is None else round(co["c"]["estimate"], 4),
                     "c fw ci": fmt(co["c"].get("familywise_ci")),
                     "verdict": r["verdict"], "reason": r["reason"]})
    return pd.DataFrame(rows)


def committed(path: str = "results/isoflop.csv", reference: str = "bf16",
              contrasts: Sequence[tuple[str, str]] = (("mxfp6", "fp8"),), level: float = LEVEL) -> dict[str, Any]:
    """The committed study's matched-token numerics: the IsoFLOP sweep's rows that landed ok
    (`ok_rows(study_part(df, "main"))`); gaps: every recipe's gap to `reference`; naive: the same with
    points treated as independent (for comparison); contrasts: each (a, b) directly at matched points and
    via `reference` (a's matched gap minus b's)."""
    rows = ok_rows(study_part(pd.read_csv(path), "main"))
    return {"gaps": matched_gaps(rows, reference, level),
            "naive": matched_gaps(rows, reference, level, clustered=False),
            "contrasts": [paired_contrast(rows, a, b, level, via=v) for a, b in contrasts for v in (None, reference)]}


__all__ = ["ClusterFit", "cluster_ols", "committed", "contrast_design", "gap_design", "gaps_table", "identified",
           "match_keys", "matched_gaps", "matched_points", "paired_contrast", "t_quantile"]
