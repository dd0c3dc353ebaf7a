"""The compute-optimal (N, D, P) of a fitted law: the precision sweet spot, iso-loss grids, the frontier.

Cost (`Cost`): a `scaling.train.compute.CostModel` (bits, nominal, h100, b200, ...) applied to a
hypothetical model of N params at P bits: C = 6·N·D·(c(P + overhead) + ratio(N)·c_high(P)), where
c is the model's cost per FLOP of a dense GEMM at those bits, overhead the scale bits per element
(MX: 0.25), and ratio(N) the FLOPs a run leaves unquantised (attention, head) per dense-GEMM FLOP,
a power law in N fitted to the trained runs (`compute.UnquantisedShare`; none: every FLOP is a quantised GEMM,
Kumar et al.'s assumption). With the defaults, C = 6·N·D·P/16. At compute C and precision P the token budget
is D = C / (per-token cost); the fitted loss is then a function of N alone, minimised over log N
(dense grid, then bounded Brent). Over P: a given set, or continuous P in a range (grid, then Brent
on the profile min_N L(N, C, P)).

`specification_range` repeats the optimisation across the modelling choices a reviewer could make
(laws that predict as well, fixed or fitted exponents, cost models) and reports the span of P*.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.optimize import minimize_scalar

from scaling.train import compute as compute_lib
from scaling.study.analysis import laws
from scaling.errors import ConfigError
from scaling.study.analysis.fit import FitResult, stored_share
from scaling.study.analysis.pstar.optimum_check import refuse_degenerate

TABLE_PRECISIONS = (4, 6, 8, 16, 32)
_N_GRID = 400  # log-N grid points before the Brent refinement


@dataclass(frozen=True)
class Cost:
    """Training compute of a hypothetical (N, D, P) in 16-bit FLOP units (see module doc)."""

    model: compute_lib.CostModel = field(default_factory=compute_lib.CostModel)
    share: compute_lib.UnquantisedShare = field(default_factory=compute_lib.UnquantisedShare)
    overhead: float = 0.0
    flops_per_param_token: float = 6.0

    def __post_init__(self):
        object.__setattr__(self, "model", compute_lib.get(self.model))
        if not 0 <= self.overhead < 4:
            raise ConfigError("overhead", self.overhead, "scale bits per element in [0, 4)")

    @property
    def name(self) -> str:
        parts = [self.model.name]
        if self.overhead:
            parts.append(f"+{self.overhead:g} scale bits")
        parts.append("unquantised share from the runs" if self.share.knots_N else "every FLOP quantised")
        return ", ".join(parts)

    def per_token(self, N, P):
        return compute_lib.hypothetical_compute(self.model, self.share, N, 1.0, P, self.overhead)

    def compute(self, N, D, P):
        return self.per_token(N, P) * np.asarray(D, float)

    def tokens(self, N, compute, P):
        """D affordable at `compute` for a model of N params trained at precision P."""
        return compute / self.per_token(N, P)


def _fit(fit: FitResult | Mapping[str, Any]) -> FitResult:
    """The fit as a FitResult; a degenerate one (FitResult.degenerate) is refused: no optimum,
    grid or frontier is derived from a law whose params ran off to a bound or never left their start."""
    fit = fit if isinstance(fit, FitResult) else FitResult.from_dict(fit)
    refuse_degenerate(fit)
    return fit


def precision_columns(law: laws.Law, P: float, context: Mapping[str, float], data: Mapping[str, Any]) -> list[dict]:
    """Candidate column settings that realise bit width P for this law (the best one is taken).

    kumar: P; kumar_roles: P_w = P_a = P_g = P; quartet: P_fwd = P_bwd = P; sun: every split 1 + E + M = P (E >= 1, M >= 0) at the
    block size from `context` (default: the median block of the fitted data). Other columns come from
    `context`; a law without precision columns (chinchilla) sees P only through the cost.
    """
    fixed = dict(context)
    if "recipe" in law.columns and isinstance(fixed.get("recipe"), str):  # a per-recipe law: the recipe's code
        if fixed["recipe"] not in law.recipes:
            raise ConfigError("recipe", fixed["recipe"], f"a recipe law {law.name} was fitted on ({', '.join(law.recipes)})")
        fixed["recipe"] = float(law.recipes.index(fixed["recipe"]))
    if "block" in law.columns and "block" not in fixed:
        block = data.get("columns", {}).get("block", {}).get("median")
        if block is None:
            raise ConfigError("context.block", None, "a block size for the sun law (e.g. context={'block': 128})")
        fixed["block"] = block
    if {"ebits", "mbits"} <= set(law.columns):
        if P != int(P) or P < 3:
            raise ConfigError("P", P, f"integer bit widths >= 3 for law {law.name} (1 sign + E >= 1 + M >= 1)")
        return [{**fixed, "ebits": float(e), "mbits": float(P - 1 - e)} for e in range(1, int(P) - 1)]
    cols = {c: P for c in ("P", "P_w", "P_a", "P_g", "P_fwd", "P_bwd") if c in law.columns}
    missing = [c for c in law.columns if c not in ("N", "D") and c not in cols and c not in fixed]
    if missing:
        raise ConfigError("context", sorted(fixed), f"values for columns {missing} of law {law.name}")
    return [{**fixed, **cols}]


def _loss(law: laws.Law, params: Mapping[str, float], N, D, cols: Mapping[str, float]) -> np.ndarray:
    N, D = np.broadcast_arrays(np.asarray(N, float), np.asarray(D, float))
    x = {"N": N, "D": D, **{c: np.broadcast_to(np.asarray(v, float), N.shape) for c, v in cols.items()}}
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return np.asarray(law.predict(params, x, np))


def _log_n_grids(compute, P, cost: Cost, n_range) -> np.ndarray:
    """The _N_GRID-point log-N grid of each P (rows; numpy.linspace's arithmetic) from n_range's low
    end up to the largest N the budget affords: D >= 1 and per-token cost >= 6·N·c(P), so
    N <= C / (6·c(P))."""
    P = np.asarray(P, float).reshape(-1, 1)
    n_max = compute / (cost.flops_per_param_token * np.asarray(cost.model.factor(P, cost.overhead), float))
    lo, hi = np.log(n_range[0]), np.log(np.minimum(n_range[1], n_max))
    if np.any(hi <= lo):
        bad = float(P[np.argmax(hi <= lo), 0])
        raise ConfigError("compute", compute, f"enough for N >= {n_range[0]:.3g} and D >= 1 at P = {bad}")
    grid = np.arange(_N_GRID, dtype=float)[None, :] * ((hi - lo) / (_N_GRID - 1)) + lo
    grid[:, -1] = hi[:, 0]
    return grid


def _best_n(law, params, compute, P, cols, cost: Cost, n_range, refine: bool = True) -> dict[str, float]:
    """min over N of L(N, D = C/(6·N·f(P)), P): log-N grid, then (refine) bounded Brent between the grid neighbours."""
    grid = _log_n_grids(compute, P, cost, n_range)[0]
    losses = _loss(law, params, np.exp(grid), cost.tokens(np.exp(grid), compute, P), cols)
    losses = np.where(np.isfinite(losses), losses, np.inf)
    i = int(np.argmin(losses))
    if not refine:
        N = float(np.exp(grid[i]))
        return {"P": float(P), "N": N, "D": float(cost.tokens(N, compute, P)), "loss": float(losses[i])}
    a, b = grid[max(i - 1, 0)], grid[min(i + 1, _N_GRID - 1)]

    def f(log_n):
        return float(_loss(law, params, np.exp(log_n), cost.tokens(np.exp(log_n), compute, P), cols))

    res = minimize_scalar(f, bounds=(a, b), method="bounded", options={"xatol": 1e-9})
    log_n, loss = (res.x, float(res.fun)) if res.fun <= losses[i] else (grid[i], float(losses[i]))
    N = float(np.exp(log_n))
    return {"P": float(P), "N": N, "D": float(cost.tokens(N, compute, P)), "loss": loss}


def _grid_profile(law, params, compute, p_grid, cost: Cost, context, data, n_range) -> np.ndarray:
    """`_best_n(..., refine=False)["loss"]` at every P of p_grid in one array evaluation (laws with one
    column set per P): the same log-N grids, the same numbers."""
    P = np.asarray(p_grid, float)[:, None]
    grid = _log_n_grids(compute, P, cost, n_range)
    (cols,) = precision_columns(law, P, context, data)
    losses = _loss(law, params, np.exp(grid), cost.tokens(np.exp(grid), compute, P), cols)
    return np.min(np.where(np.isfinite(losses), losses, np.inf), axis=1)


def _best_at_precision(law, params, compute, P, cost, context, data, n_range) -> dict[str, float]:
    best = None
    for cols in precision_columns(law, P, context, data):
        row = _best_n(law, params, compute, P, cols, cost, n_range)
        row.update({c: cols[c] for c in ("ebits", "mbits") if c in cols})
        if best is None or row["loss"] < best["loss"]:
            best = row
    return best


def optimal_precision(fit: FitResult | Mapping[str, Any], compute: float, precisions: Sequence[float] | None = None, *,
                      cost: Cost = Cost(), p_range: tuple[float, float] = (1.0, 32.0),
                      n_range: tuple[float, float] = (1.0, np.inf), context: Mapping[str, float] | None = None,
                      params: Mapping[str, float] | None = None, per_precision: bool = True) -> dict[str, Any]:
    """Minimise the fitted loss over N, D, P at training compute C under `cost`.

    precisions: a set to choose from (e.g. 4, 6, 8, 16, 32), or None for continuous P in p_range
    (integers in p_range for laws on exponent/mantissa bits). Returns dict(P, N, D, loss, compute,
    per_precision): per_precision has the best N, D, loss for each P of the set (continuous: of
    TABLE_PRECISIONS inside p_range) — "at the same budget FP16 trains a 2x larger model than FP32".
    params: evaluate other params than fit.params (e.g. one bootstrap resample). per_precision=False
    skips that table (None), for callers that keep only the optimum (bootstrap CIs, specification ranges).
    """
    fit = _fit(fit)
    law = fit.law_form
    params = dict(fit.params if params is None else params)
    context = dict(context or {})
    if not compute > 0:
        raise ConfigError("compute", compute, "a positive number of 16-bit FLOPs")
    if not 0 < p_range[0] < p_range[1]:
        raise ConfigError("p_range", p_range, "0 < low < high")

    def at(P):
        return _best_at_precision(law, params, compute, P, cost, context, fit.data, n_range)

    if precisions is not None:
        if len(precisions) == 0 or any(not p > 0 for p in precisions):
            raise ConfigError("precisions", list(precisions), "a non-empty list of positive bit widths")
        full = pd.DataFrame([at(float(p)) for p in precisions])
        best = full.loc[full["loss"].idxmin()].to_dict()
        table = full if per_precision else None
    elif {"ebits", "mbits"} <= set(law.columns):
        ints = range(max(3, int(np.ceil(p_range[0]))), int(np.floor(p_range[1])) + 1)
        full = pd.DataFrame([at(float(p)) for p in ints])
        best = full.loc[full["loss"].idxmin()].to_dict()
        table = full[full["P"].isin(TABLE_PRECISIONS)].reset_index(drop=True) if per_precision else None
    else:
        # bracket P* on a profile of each P's N-grid minimum (the 400-point log-N grid is fine enough to
        # rank neighbouring P), then the exact search (Brent in N inside Brent in P) only inside the bracket
        p_grid = np.linspace(p_range[0], p_range[1], int(4 * (p_range[1] - p_range[0])) + 1)
        profile = _grid_profile(law, params, compute, p_grid, cost, context, fit.data, n_range)
        i = int(np.argmin(profile))
        a, b = p_grid[max(i - 1, 0)], p_grid[min(i + 1, len(p_grid) - 1)]
        res = minimize_scalar(lambda p: at(p)["loss"], bounds=(a, b), method="bounded", options={"xatol": 1e-7})
        edge = at(float(p_grid[i]))
        best = at(float(res.x)) if res.fun <= edge["loss"] else edge
        table = pd.DataFrame([at(float(p)) for p in TABLE_PRECISIONS if p_range[0] <= p <= p_range[1]]) if per_precision else None
    return {"P": float(best["P"]), "N": float(best["N"]), "D": float(best["D"]), "loss": float(best["loss"]),
            "compute": float(compute), "per_precision": table,
            **{k: float(best[k]) for k in ("ebits", "mbits") if k in best}}


def optimal_precision_ci(fit: FitResult | Mapping[str, Any], compute: float, precisions: Sequence[float] | None = None,
                         *, level: float | None = None, max_samples: int | None = None, **kwargs: Any) -> dict[str, Any]:
    """Bootstrap CIs of the optimum (P, N, D, loss) at `compute`: the optimum of every resample's params
    (fit.samples, from fit.bootstrap / fit_law(bootstrap=n)), percentile interval at `level`
    (default: the bootstrap's). Returns {quantity: (lo, hi)} plus `samples` (DataFrame of optima)."""
    fit = _fit(fit)
    samples = fit.samples
    if samples.empty:
        raise ConfigError("fit.bootstrap", None, "a fit with bootstrap samples (scaling fit --bootstrap 1000)")
    level = level if level is not None else fit.bootstrap.get("level", 0.95)
    if max_samples is not None:
        samples = samples.iloc[:max_samples]
    optima = pd.DataFrame([
        {k: v for k, v in optimal_precision(fit, compute, precisions, params=row, per_precision=False, **kwargs).items()
         if k != "per_precision"}
        for row in samples.to_dict("records")
    ])
    tail = 100 * (1 - level) / 2
    out: dict[str, Any] = {q: (float(np.percentile(optima[q], tail)), float(np.percentile(optima[q], 100 - tail)))
                           for q in ("P", "N", "D", "loss")}
    out.update(level=level, samples=optima)
    return out


def frontier(fit: FitResult | Mapping[str, Any], computes: Sequence[float], precisions: Sequence[float] | None = None,
             **kwargs: Any) -> pd.DataFrame:
    """The compute-optimal frontier: one row (compute, P, N, D, loss) per budget."""
    rows = []
    for c in computes:
        best = optimal_precision(fit, float(c), precisions, **kwargs)
        rows.append({k: v for k, v in best.items() if k != "per_precision"})
    return pd.DataFrame(rows)


def iso_loss(fit: FitResult | Mapping[str, Any], compute: float, N: Sequence[float], P: Sequence[float], *,
             cost: Cost = Cost(), context: Mapping[str, float] | None = None) -> pd.DataFrame:
    """Loss over an (N, P) grid at fixed compute (D = C/(6·N·f(P))): long format N, P, D, loss
    (pivot for contours; for laws with E/M bits, each P takes its best split)."""
    fit = _fit(fit)
    law = fit.law_form
    N = np.asarray(N, float)
    rows = []
    for p in P:
        D = cost.tokens(N, compute, p)
        loss = np.min([_loss(law, fit.params, N, D, cols) for cols in precision_columns(law, float(p), context or {}, fit.data)], axis=0)
        rows.append(pd.DataFrame({"N": N, "P": float(p), "D": D, "loss": loss}))
    return pd.concat(rows, ignore_index=True)


def loss_grid(fit: FitResult | Mapping[str, Any], N: Sequence[float], D: Sequence[float], P: float, *,
              context: Mapping[str, float] | None = None) -> pd.DataFrame:
    """Loss over an (N, D) grid at precision P: long format N, D, P, loss (iso-loss contours in N-D)."""
    fit = _fit(fit)
    law = fit.law_form
    NN, DD = np.meshgrid(np.asarray(N, float), np.asarray(D, float), indexing="ij")
    loss = np.min([_loss(law, fit.params, NN.ravel(), DD.ravel(), cols)
                   for cols in precision_columns(law, float(P), context or {}, fit.data)], axis=0)
    return pd.DataFrame({"N": NN.ravel(), "D": DD.ravel(), "P": float(P), "loss": loss})


def critical_data_size(fit: FitResult | Mapping[str, Any], N, *, ebits: float, mbits: float, block: float) -> np.ndarray:
    """Token count beyond which more data *raises* the loss at fixed N (sun law; see laws.sun)."""
    fit = _fit(fit)
    if fit.law != "sun":
        raise ConfigError("law", fit.law, "sun (the only registered law whose loss rises with D: kumar's "
                          "post-training-quantisation term is not modelled)")
    if block < 2:
        raise ConfigError("block", block, ">= 2")
    return laws.sun_critical_data_size(fit.params, N, ebits, mbits, block)


# ----------------------------------------------------------------------------- specification range

def share_of(fit: FitResult) -> compute_lib.UnquantisedShare:
    """The unquantised share the fit's runs had (recorded by `scaling fit` in data, fit.stored_share)."""
    return compute_lib.UnquantisedShare.from_dict(stored_share(fit.data))


def cost_models(fit: FitResult, names: Sequence[str] = ("bits", "h100", "b200")) -> list[Cost]:
    """The cost models a P* is reported across: each named model with the runs' unquantised share,
    and `bits` also with MX's 0.25 scale bits per element and with every FLOP quantised."""
    share = share_of(fit)
    out = [Cost(model=n, share=share) for n in names]
    if "bits" in names:
        out.append(Cost(model="bits", share=share, overhead=0.25))
        if share.knots_N:
            out.append(Cost(model="bits"))
    return out


def specification_range(fits: Sequence[tuple[str, FitResult]], compute: float, costs: Sequence[Cost], *,
                        p_range: tuple[float, float] = (2.0, 32.0)) -> dict[str, Any]:
    """P* at `compute` for every (fit, cost) pair: the fits are the laws (and exponent choices) a
    reviewer could defend, the costs the hardware assumptions. Returns {"P_range": [lo, hi],
    "table": [{spec, cost_model, P, N, D, loss}]}; a pair that cannot be optimised is listed with its error."""
    rows = []
    for label, fit in fits:
        for cost in costs:
            try:
                best = optimal_precision(fit, compute, cost=cost, p_range=p_range, per_precision=False)
                rows.append({"spec": label, "cost_model": cost.name, "P": best["P"], "N": best["N"],
                             "D": best["D"], "loss": best["loss"]})
            except (ConfigError, ValueError) as e:
                rows.append({"spec": label, "cost_model": cost.name, "error": str(e)})
    ps = [r["P"] for r in rows if "P" in r]
    return {"P_range": [float(min(ps)), float(max(ps))] if ps else None, "table": rows}
