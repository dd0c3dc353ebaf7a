"""Each chip's verdict computed from what was measured: which recipe trains to the lowest loss at a fixed
compute budget on a chip, from the reference recipe's loss surface and each recipe's matched-token gap.

    L_c(r, N, C) = L_ref(N, C / cost_c(r, N)) + g_r(N, D/N),   minimised over the trained sizes N

cost_c(r, N) is what one training token of recipe r at size N costs under cost model c (a chip of the
planner's table, `bits`, or a user's throughput table: `scaling.train.compute.get`), so C / cost_c is the
tokens D that r buys with C on c. Why computed rather than read off an IsoFLOP design: a design lands its
runs on its budgets under the one cost model it was designed with; under another model a run's loss at C
has to be interpolated between evaluations (biased one way: a loss curve is convex in log D, so a
log-linear reading between two cooldown points lies above it), and a recipe the chip makes cheaper than
the design did simply stops before the budget and is absent. Here every recipe with a gap
model is present on every chip at every budget.

The two measured pieces:

- L_ref: the reference recipe's loss at each trained size as a curve in D, L_ref(N_i, D) = u_i + B·D^-beta
  (u_i one per size, B and beta shared). Per size, not a Chinchilla surface in N: the sizes are different
  shapes (depth and width), and a smooth surface in N can miss a size by more than most gaps are large,
  while per size the curves miss by about the seed noise. So N is minimised over the trained sizes, and D
  is read along each size's curve: beyond the D that size was measured at, the verdict says so.
- g_r: recipe r's matched-token gap model, `scaling.study.analysis.matched` (a + b·ln N + c·ln(D/N),
  centred), fitted on r's points paired with the reference's at the same (N, D, seed, shape). Read at a
  (N, D/N) outside the hull of r's matched points, the verdict says so.

Uncertainty: a cluster bootstrap over the (N, seed) cells, the independent units of both pieces (a
seed fixes initialisation and data order, so every evaluation of a run and every gap of that cell share
its luck). Each draw reweights the cells (multinomial counts) and refits the reference curves and every
gap model on the same draw, so a recipe's gap and the reference it is measured against move together.
A verdict compares every recipe with the best one at that chip and budget: the difference's interval
is the bootstrap standard error times the normal quantile at the family-wise level, Bonferroni over
every comparison of one chip's row (every recipe against the best at every budget: a reader asks which
recipe to train on the chip they have; a percentile interval at that level would need far more draws
than a study can afford). "cannot tell between" lists the best and every recipe whose
interval does not exclude zero.

Pure numpy/pandas/scipy (no JAX).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
import warnings
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import spatial, stats

from scaling.errors import ConfigError
from scaling.study.analysis import matched
from scaling.study.analysis.isoflop import LEVEL, high_precision_recipe, ok_rows
from scaling.train import compute as compute_lib

DRAWS = 200  # bootstrap draws: standard errors to about 5% (1/sqrt(2·200))
BETA_GRID = np.exp(np.linspace(np.log(0.05), np.log(3.0), 240))  # the D exponent, searched on a log grid
HULL_TOL = 0.05  # a point within this distance (in ln N, ln D/N) of a degenerate hull is inside it
D_TOL = 0.05  # a D within 5% of a size's measured range is read on it, not beyond it
METHOD = ("L_c(r, N, C) = L_ref(N, C / cost_c(r, N)) + g_r(N, D/N), minimised over the trained sizes; "
          "L_ref per size u_i + B·D^-beta, g_r the matched-token gap model; cluster bootstrap over (N, seed) cells")


# ----------------------------------------------------------------------------- the measured pieces

@dataclass(frozen=True)
class Data:
    """What a verdict is computed from, as arrays: the reference's rows (size index, ln D, loss, cell)
    and each recipe's matched points (ln N, ln D/N, gap, cell), cells numbered over both."""

    sizes: np.ndarray  # (S,) the reference's trained sizes N, ascending
    d_range: np.ndarray  # (S, 2) ln D measured per size
    ref_size: np.ndarray  # (n,) index into sizes
    ref_log_d: np.ndarray
    ref_loss: np.ndarray
    ref_cell: np.ndarray
    gaps: dict[str, dict[str, np.ndarray]]  # recipe -> log_N, log_DN, gap, cell
    n_cells: int

    @classmethod
    def from_rows(cls, rows: pd.DataFrame, reference: str, recipes: Sequence[str],
                  loss_column: str = "val_loss") -> "Data":
        ref = rows[rows["recipe"].astype(str) == reference]
        seed = (lambda d: d["seed"].astype(str)) if "seed" in rows.columns else (lambda d: "0")
        ref_cells = (ref["N"].astype(float).astype(str) + "/" + seed(ref)).to_numpy()
        points = {r: matched.matched_points(rows, r, reference, loss_column) for r in recipes}
        point_cells = {r: (p["N"].astype(float).astype(str) + "/" + (p["seed"].astype(str) if "seed" in p.columns
                                                                     else "0")).to_numpy()
                       for r, p in points.items()}
        labels, _ = pd.factorize(np.concatenate([ref_cells, *point_cells.values()]))
        size_idx, sizes = pd.factorize(ref["N"].astype(float), sort=True)
        log_d = np.log(ref["D"].to_numpy(float))
        d_range = np.array([[log_d[size_idx == i].min(), log_d[size_idx == i].max()] for i in range(len(sizes))])
        gaps, at = {}, len(ref)
        for r, p in points.items():
            gaps[r] = {"log_N": p["log_N"].to_numpy(float), "log_DN": p["log_DN"].to_numpy(float),
                       "gap": p["diff"].to_numpy(float), "cell": labels[at:at + len(p)]}
            at += len(p)
        return cls(np.asarray(sizes, float), d_range, size_idx, log_d, pd.to_numeric(ref[loss_column]).to_numpy(float),
                   labels[:len(ref)], gaps, int(labels.max()) + 1 if len(labels) else 0)


def fit_reference(data: Data, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weighted least squares of the reference curves, one fit per row of `weights` (draws × cells):
    (u (draws, sizes; NaN for a size with no weight in that draw), B (draws,), beta (draws,)). beta is
    the best of BETA_GRID, refined by a parabola through its neighbours; for each beta the rest is linear."""
    w = weights[:, data.ref_cell]  # (k, n)
    k, S = len(weights), len(data.sizes)
    onehot = np.eye(S)[data.ref_size]  # (n, S)
    present = (w @ onehot) > 0  # (k, S)
    rows = [data.ref_size == i for i in range(S)]
    w_loss = w * data.ref_loss

    def total(a: np.ndarray) -> np.ndarray:
        """a summed over its last axis one term after another, in row order (np.cumsum's order, not
        np.sum's pairwise one): the order in which einsum summed the design's products before."""
        return np.cumsum(a, axis=-1)[..., -1] if a.shape[-1] else np.zeros(a.shape[:-1])

    def solve(beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per draw at its beta: coefficients (k, S+1) and weighted SSE (k,). The design x (n, S+1) is a
        one-hot of each row's size and e = D^-beta, so X'WX and X'Wy are sums of w, w·e, w·e·e, w·y and
        w·e·y over each size's rows (the products einsum formed, summed in the same order: the same bits)."""
        e = np.exp(-beta[:, None] * data.ref_log_d[None, :])  # (k, n)
        we = w * e
        xtx = np.zeros((k, S + 1, S + 1))
        xty = np.zeros((k, S + 1))
        for i, at in enumerate(rows):
            xtx[:, i, i] = total(w[:, at])
            xtx[:, i, S] = xtx[:, S, i] = total(we[:, at])
            xty[:, i] = total(w_loss[:, at])
        xtx[:, S, S] = total(we * e)
        xty[:, S] = total(we * data.ref_loss)
        xtx[:, np.arange(S), np.arange(S)] += ~present  # an absent size: its u is 0 here, NaN below
        coef = np.linalg.solve(xtx, xty[..., None])[..., 0]
        resid = data.ref_loss[None, :] - (coef[:, data.ref_size] + e * coef[:, S:])
        return coef, (w * resid ** 2).sum(axis=1)

    sse = np.stack([solve(np.full(k, b))[1] for b in BETA_GRID], axis=1)  # (k, grid)
    j = np.clip(sse.argmin(axis=1), 1, len(BETA_GRID) - 2)
    lo, mid, hi = (sse[np.arange(k), j + d] for d in (-1, 0, 1))
    x0, x1, x2 = (np.log(BETA_GRID[j + d]) for d in (-1, 0, 1))
    denom = lo - 2 * mid + hi
    step = np.where(denom > 0, 0.5 * (lo - hi) / np.where(denom > 0, denom, 1.0), 0.0)
    beta = np.exp(x1 + np.clip(step, -1, 1) * (x2 - x1))
    coef, _ = solve(beta)
    u = np.where(present, coef[:, :S], np.nan)
    return u, coef[:, S], beta


@dataclass(frozen=True)
class GapModel:
    """One recipe's matched-gap regression (matched.gap_design's terms, centred on its points)."""

    centre: tuple[float, float]  # mean ln N, mean ln D/N of its points
    keep: tuple[bool, bool, bool]  # the terms identified on the full data (a, b, c)
    hull: np.ndarray  # its points in (ln N, ln D/N), for the extrapolation check

    @classmethod
    def of(cls, g: Mapping[str, np.ndarray]) -> "GapModel":
        _, reasons, _ = matched.gap_design(g["log_N"], g["log_DN"])
        return cls((float(g["log_N"].mean()), float(g["log_DN"].mean())),
                   tuple(not reasons[t] for t in matched.TERMS), np.column_stack([g["log_N"], g["log_DN"]]))

    def design(self, log_n, log_dn) -> np.ndarray:
        log_n, log_dn = np.broadcast_arrays(np.asarray(log_n, float), np.asarray(log_dn, float))
        cols = [np.ones_like(log_n), log_n - self.centre[0], log_dn - self.centre[1]]
        return np.stack([c for c, keep in zip(cols, self.keep) if keep], axis=-1)

    def fit(self, g: Mapping[str, np.ndarray], weights: np.ndarray) -> np.ndarray:
        """Coefficients per draw (draws, kept terms), weighted OLS (pinv: a draw that loses a slope's
        spread gets the minimum-norm solution rather than a singular one)."""
        x, w = self.design(g["log_N"], g["log_DN"]), weights[:, g["cell"]]
        xtx = np.einsum("kn,ni,nj->kij", w, x, x)
        return np.einsum("kij,kj->ki", np.linalg.pinv(xtx), np.einsum("kn,ni,n->ki", w, x, g["gap"]))

    def inside(self, log_n: float, log_dn: float) -> bool:
        return _in_region(self._region, np.array([log_n, log_dn]))

    @functools.cached_property
    def _region(self) -> tuple[np.ndarray, Any]:
        """_hull_region of its points, triangulated once (every chip and budget asks the same hull)."""
        return _hull_region(self.hull)


def _inside(points: np.ndarray, q: np.ndarray) -> bool:
    """Is q within the convex hull of points (2-D), or within HULL_TOL of it where the hull is a segment
    or a point (every point at one N, or ln N and ln D/N collinear: one budget)?"""
    return _in_region(_hull_region(points), q)


def _hull_region(points: np.ndarray) -> tuple[np.ndarray, Any]:
    """The distinct points (to 9 decimals) and their Delaunay triangulation (None where they are fewer than
    three or collinear)."""
    pts = np.unique(np.round(points, 9), axis=0)
    if len(pts) >= 3:
        try:
            return pts, spatial.Delaunay(pts)
        except spatial.QhullError:
            pass  # collinear: a segment
    return pts, None


def _in_region(region: tuple[np.ndarray, Any], q: np.ndarray) -> bool:
    """_inside, on a _hull_region."""
    pts, triangulation = region
    if triangulation is not None:
        return bool(triangulation.find_simplex(q) >= 0)
    centre = pts.mean(axis=0)
    axis = np.linalg.svd(pts - centre)[2][0] if len(pts) > 1 else np.array([1.0, 0.0])
    along = (pts - centre) @ axis
    t = float((q - centre) @ axis)
    off = np.linalg.norm(q - centre - t * axis)
    return bool(along.min() - HULL_TOL <= t <= along.max() + HULL_TOL and off <= HULL_TOL)


# ----------------------------------------------------------------------------- charges

Charges = Mapping[str, np.ndarray]  # recipe -> cost per token at each of the reference's sizes (S,)


def charges_from_rows(rows: pd.DataFrame, cost: Any, sizes: np.ndarray, recipes: Sequence[str]) -> tuple[dict, dict]:
    """Each recipe's cost per training token at each trained size under `cost` (anything with
    per_token(df): a CostModel, a throughput table), the median over its rows at that size; at a size
    the recipe was not trained at, the reference's charge there times the recipe's charge ratio to the
    reference at the nearest sizes (interpolated in ln N: the ratio varies slowly, the absolute charge
    jumps with the shape). Returns (charges, why not) with a reason for each recipe it cannot price."""
    rows = compute_lib.backfill(rows)
    out, why = {}, {}
    per_size: dict[str, pd.Series] = {}
    for r in recipes:
        part = rows[rows["recipe"].astype(str) == r]
        try:
            per_token = np.asarray(cost.per_token(part), float)
        except ConfigError as e:
            why[r] = str(e)
            continue
        per_size[r] = pd.Series(per_token, index=part["N"].astype(float).to_numpy()).groupby(level=0).median()
    ref = recipes[0]
    if ref not in per_size:
        raise ConfigError("reference recipe", ref, f"a recipe the cost model {getattr(cost, 'name', cost)} prices ({why.get(ref)})")
    ref_at = per_size[ref].reindex(sizes).to_numpy(float)
    for r, series in per_size.items():
        ratio = series / per_size[ref].reindex(series.index)
        ratio = ratio[np.isfinite(ratio)]
        if ratio.empty:
            why[r] = "no trained size shared with the reference to price it at"
            continue
        out[r] = ref_at * np.interp(np.log(sizes), np.log(ratio.index.to_numpy(float)), ratio.to_numpy(float))
    return out, why


# ----------------------------------------------------------------------------- the verdicts

def _cell_weights(n_cells: int, draws: int, seed: int) -> np.ndarray:
    """Row 0: every cell once (the estimate); rows 1..draws: multinomial resamples of the cells."""
    rng = np.random.default_rng(seed)
    boot = rng.multinomial(n_cells, np.full(n_cells, 1.0 / n_cells), size=draws) if draws else np.zeros((0, n_cells))
    return np.vstack([np.ones((1, n_cells)), boot]).astype(float)


def losses_at(data: Data, fitted: Mapping[str, Any], charges: Charges, budget: float) -> dict[str, dict[str, np.ndarray]]:
    """Per recipe, per draw: the loss L_c(r, N_i, C) at each trained size (draws, sizes; NaN at a size
    outside the sizes the recipe's gap was measured at) and its ln D (sizes,)."""
    u, B, beta = fitted["u"], fitted["B"], fitted["beta"]
    log_n = np.log(data.sizes)
    out = {}
    for r, charge in charges.items():
        log_d = np.log(budget / charge)  # (S,)
        ref = u + B[:, None] * np.exp(-beta[:, None] * log_d[None, :])
        model = fitted["models"].get(r)
        if model is None:  # the reference itself
            out[r] = {"loss": ref, "log_D": log_d}
            continue
        gap = np.einsum("si,ki->ks", model.design(log_n, log_d - log_n), fitted["gaps"][r])
        # a gap is not read at a size outside the sizes it was measured at (a linear model in ln N read
        # beyond them can put a recipe's loss anywhere): the recipe's optimum is sought among those sizes
        measured = (log_n >= model.hull[:, 0].min() - HULL_TOL) & (log_n <= model.hull[:, 0].max() + HULL_TOL)
        out[r] = {"loss": np.where(measured[None, :], ref + gap, np.nan), "log_D": log_d}
    return out


def fit_all(data: Data, weights: np.ndarray) -> dict[str, Any]:
    """The reference curves and every gap model, refitted on each draw's cell weights."""
    u, B, beta = fit_reference(data, weights)
    models = {r: GapModel.of(g) for r, g in data.gaps.items()}
    return {"u": u, "B": B, "beta": beta, "models": models,
            "gaps": {r: models[r].fit(g, weights) for r, g in data.gaps.items()}}


def _notes(data: Data, fitted: Mapping[str, Any], recipe: str, i: int, log_d: float) -> list[str]:
    """What a recipe's optimum at size i and ln D rests on beyond what was measured."""
    notes = []
    model = fitted["models"].get(recipe)
    sizes = np.log(data.sizes) if model is None else model.hull[:, 0]
    log_n = float(np.log(data.sizes[i]))
    if np.isclose(log_n, sizes.min()) or np.isclose(log_n, sizes.max()):
        which = "smallest" if np.isclose(log_n, sizes.min()) else "largest"
        notes.append(f"at the {which} size {'trained' if model is None else 'its gap was measured at'}: "
                     "the optimum may lie beyond it")
    lo, hi = data.d_range[i]
    if not lo + np.log1p(-D_TOL) <= log_d <= hi + np.log1p(D_TOL):
        notes.append(f"the reference read at D = {np.exp(log_d):.3g}, beyond the {np.exp(lo):.3g}-{np.exp(hi):.3g} "
                     f"tokens measured at N = {data.sizes[i]:.3g}")
    if model is not None and not model.inside(log_n, log_d - log_n):
        notes.append(f"its gap read at N = {data.sizes[i]:.3g}, D/N = {np.exp(log_d - log_n):.3g}, outside the "
                     "(N, D/N) where it was measured")
    return notes


def verdict_at(data: Data, fitted: Mapping[str, Any], charges: Charges, budget: float, z: float) -> dict[str, Any]:
    """One chip and budget: every recipe's best loss over the trained sizes (estimate, draw SE, at which
    N and D), its difference to the best recipe with a family-wise interval (± z·SE), and the verdict."""
    got = losses_at(data, fitted, charges, budget)
    with warnings.catch_warnings():  # a draw that lost every size a recipe's gap was measured at: NaN, skipped
        warnings.simplefilter("ignore", RuntimeWarning)
        best_loss = {r: np.nanmin(g["loss"], axis=1) for r, g in got.items()}  # (draws+1,)
    ranked = sorted(best_loss, key=lambda r: best_loss[r][0])
    best = ranked[0]
    entries = []
    for r in ranked:
        i = int(np.nanargmin(got[r]["loss"][0]))
        diff = best_loss[r] - best_loss[best]
        se = float(np.nanstd(diff[1:], ddof=1)) if len(diff) > 2 else float("nan")
        ci = None if r == best or not np.isfinite(se) else [float(diff[0] - z * se), float(diff[0] + z * se)]
        entries.append({"recipe": r, "loss": float(best_loss[r][0]),
                        "loss_se": float(np.nanstd(best_loss[r][1:], ddof=1)) if len(diff) > 2 else None,
                        "N_opt": float(data.sizes[i]), "D_opt": float(np.exp(got[r]["log_D"][i])),
                        "diff": float(diff[0]), "diff_ci": ci, "notes": _notes(data, fitted, r, i, float(got[r]["log_D"][i]))})
    tied = [best] + [e["recipe"] for e in entries[1:] if e["diff_ci"] is None or e["diff_ci"][0] <= 0]
    runner = entries[1] if len(entries) > 1 else None
    return {"budget": float(budget), "compared": len(entries), "best": best,
            "winner": best if len(tied) == 1 else None, "tied": tied,
            "verdict": best if len(tied) == 1 else "cannot tell between " + ", ".join(tied),
            "runner_up": runner["recipe"] if runner else None,
            "diff": runner["diff"] if runner else None, "diff_ci": runner["diff_ci"] if runner else None,
            "recipes": entries}


def chip_verdicts(rows: pd.DataFrame, budgets: Sequence[float], cost_models: Sequence[Any], *,
                  reference: str | None = None, draws: int = DRAWS, level: float = LEVEL, seed: int = 0,
                  loss_column: str = "val_loss") -> dict[str, Any]:
    """Every recipe with a gap model on every cost model at every budget (module doc).

    rows: the study's rows (filter first: `ok_rows(study_part(df, "main"))`); budgets: reference-
    equivalent, the compute the reference recipe spends under `bits` (as `costs.verdicts_by_cost`), each
    becoming budget · k under a model (k = 1 for a BF16 reference on every chip); cost_models: names or
    objects (`compute.get`'s, or anything with name, describe() and per_token(rows): budgets under such
    an object are in its own units, k = 1). Returns JSON-friendly
    {reference, method, level, draws, clustered_by, familywise {rule, m, z}, reference_curves {beta, B,
    u per size}, gaps {recipe: {coefficients, centre}}, excluded {recipe: why}, chips {name: {description,
    reference_factor, not_priced {recipe: why}, charged_as [a format the chip has no path for, charged at the
    next wider one's rate], budgets: [verdict_at's dict + budget_reference]}}}."""
    from scaling.study.analysis import costs  # costs imports isoflop; kept local so this module reads alone

    rows = compute_lib.backfill(ok_rows(rows))  # once: every cost model prices the same FLOPs-by-part columns
    if not len(budgets):
        raise ConfigError("budgets", budgets, "at least one compute budget")
    reference = reference or high_precision_recipe(rows)
    names = sorted(set(rows["recipe"].astype(str)) - {reference})
    data = Data.from_rows(rows, reference, names, loss_column)
    with_gap = [r for r in names if len(data.gaps[r]["gap"])]
    excluded = {r: "no point matched with the reference (same N, D, seed, shape): no gap model" for r in names
                if r not in with_gap}
    data = dataclasses.replace(data, gaps={r: data.gaps[r] for r in with_gap})
    fitted = fit_all(data, _cell_weights(data.n_cells, draws, seed))
    recipes = [reference, *with_gap]
    priced = {}
    for name in cost_models:
        cost = name if hasattr(name, "per_token") else compute_lib.get(name)
        k = costs.reference_factor(rows, cost, reference)[0] if isinstance(cost, compute_lib.CostModel) else 1.0
        got, why = charges_from_rows(rows, cost, data.sizes, recipes)
        priced[cost.name] = (cost, k, got, why)
    # one family per chip (a reader asks which recipe to train on the chip they have): every recipe
    # against the best at every budget of that chip's row
    m = max(1, max(len(got) - 1 for _, _, got, _ in priced.values()) * len(budgets))
    z = float(stats.norm.ppf(1 - (1 - level) / (2 * m)))
    chips = {}
    for name, (cost, k, got, why) in priced.items():
        verdicts = [{**verdict_at(data, fitted, got, b * k, z), "budget_reference": float(b)} for b in budgets]
        # a chip without a path for a format charges it at the next wider one's rate: say so beside the verdict
        charged_as = [str(f) for f in cost.fallbacks(rows[rows["recipe"].isin(recipes)])] if hasattr(cost, "fallbacks") else []
        chips[name] = {"description": cost.describe(), "reference_factor": k, "not_priced": why,
                       "charged_as": charged_as, "budgets": verdicts}
    return {"reference": reference, "method": METHOD, "level": level, "draws": draws,
            "clustered_by": ["N", "seed"], "familywise": {"rule": "Bonferroni", "m": m, "z": z,
                                                          "over": "every recipe against the best at every budget, per chip"},
            "reference_curves": {"beta": float(fitted["beta"][0]), "B": float(fitted["B"][0]),
                                 "u": {f"{n:g}": float(v) for n, v in zip(data.sizes, fitted["u"][0])}},
            "gaps": {r: {"centre": {"N": float(np.exp(fitted["models"][r].centre[0])),
                                    "D_over_N": float(np.exp(fitted["models"][r].centre[1]))},
                         "coefficients": dict(zip([t for t, keep in zip(matched.TERMS, fitted["models"][r].keep) if keep],
                                                  map(float, fitted["gaps"][r][0])))} for r in with_gap},
            "excluded": excluded, "chips": chips}


# ----------------------------------------------------------------------------- text

CHIP_ORDER = ("h100", "h200", "b200", "b300", "mi300x", "mi355x")  # rows of the answer: chips first, `bits` last


def answer_table(result: Mapping[str, Any]) -> str:
    """Markdown: one row per chip (chips with the same answer in every cell share a row), one column per
    budget. Each cell: the winner and its lead over the
    runner-up with the family-wise interval, or the recipes tied with the best ("a or b", "+k" more) with the
    difference of the closest tied one and its interval; * where the best recipe's reading goes beyond what
    was measured."""
    order = {name: i for i, name in enumerate(CHIP_ORDER)}
    chips = sorted(result["chips"], key=lambda c: (c == "bits", order.get(c, len(order)), c))
    budgets = [b["budget_reference"] for b in result["chips"][chips[0]]["budgets"]]
    lines = ["| chip | " + " | ".join(f"C = {b:.0e}" for b in budgets) + " |",
             "| --- | " + " | ".join("---" for _ in budgets) + " |"]
    rows: dict[str, list[str]] = {}  # cells -> chips: chips whose relative rates agree give one answer, one row
    for chip in chips:
        cells = []
        for v in result["chips"][chip]["budgets"]:
            ci = "" if v["diff_ci"] is None else f" [{v['diff_ci'][0]:+.3f}, {v['diff_ci'][1]:+.3f}]"
            star = " \\*" if v["recipes"][0]["notes"] else ""
            if v["winner"] is not None:
                cells.append(f"**{v['winner']}**{star}, {v['diff']:.3f} below {v['runner_up']}{ci}"
                             if v["runner_up"] else f"**{v['winner']}**{star}")
                continue
            more, second = len(v["tied"]) - 2, next(e for e in v["recipes"] if e["recipe"] == v["tied"][1])
            ci = "" if second["diff_ci"] is None else f" [{second['diff_ci'][0]:+.3f}, {second['diff_ci'][1]:+.3f}]"
            cells.append(f"{v['tied'][0]}{star} or {v['tied'][1]}" + (f" +{more}" if more > 0 else "")
                         + f" ({second['diff']:+.3f}{ci})")
        rows.setdefault(" | ".join(cells), []).append(chip)
    lines += [f"| {', '.join(names)} | {cells} |" for cells, names in rows.items()]
    return "\n".join(lines)


__all__ = ["CHIP_ORDER", "DRAWS", "Data", "GapModel", "answer_table", "charges_from_rows", "chip_verdicts", "fit_reference",
           "losses_at", "verdict_at"]
