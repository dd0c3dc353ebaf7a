"""The compute-optimal (N, D, P) of a fitted law: the precision sweet spot, iso-loss grids, the frontier.

Cost model (Kumar et al. 2024, in 16-bit FLOP units: halving the bits halves the cost):

    C = 6·N·D·(g·P/16 + (1 - g)),    g = gemm_fraction (1: every FLOP scales with P)

At compute C and precision P the token budget is D = C / (6·N·(g·P/16 + 1 - g)); the fitted loss is
then a function of N alone, minimised over log N (dense grid, then bounded Brent). Over P: a given
set, or continuous P in a range (grid, then Brent on the profile min_N L(N, C, P)).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.optimize import minimize_scalar

from scaling import laws
from scaling.errors import ConfigError
from scaling.fit import FitResult

TABLE_PRECISIONS = (4, 6, 8, 16, 32)
_N_GRID = 400  # log-N grid points before the Brent refinement


@dataclass(frozen=True)
class Cost:
    """Training compute in 16-bit FLOP units: C = flops_per_param_token·N·D·(g·P/ref_bits + 1 - g)."""

    flops_per_param_token: float = 6.0
    ref_bits: float = 16.0
    gemm_fraction: float = 1.0

    def __post_init__(self):
        if not 0 <= self.gemm_fraction <= 1:
            raise ConfigError("gemm_fraction", self.gemm_fraction, "a fraction in [0, 1]")
        if self.flops_per_param_token <= 0 or self.ref_bits <= 0:
            raise ConfigError("cost", (self.flops_per_param_token, self.ref_bits), "positive numbers")

    def precision_factor(self, P):
        return self.gemm_fraction * np.asarray(P, float) / self.ref_bits + (1.0 - self.gemm_fraction)

    def compute(self, N, D, P):
        return self.flops_per_param_token * np.asarray(N, float) * np.asarray(D, float) * self.precision_factor(P)

    def tokens(self, N, compute, P):
        """D affordable at `compute` for a model of N params trained at precision P."""
        return compute / (self.flops_per_param_token * np.asarray(N, float) * self.precision_factor(P))


def _fit(fit: FitResult | Mapping[str, Any]) -> FitResult:
    return fit if isinstance(fit, FitResult) else FitResult.from_dict(fit)


def precision_columns(law: laws.Law, P: float, context: Mapping[str, float], data: Mapping[str, Any]) -> list[dict]:
    """Candidate column settings that realise bit width P for this law (the best one is taken).

    kumar: P; kumar_roles: P_w = P_a = P_g = P; sun: every split 1 + E + M = P (E >= 1, M >= 0) at the
    block size from `context` (default: the median block of the fitted data). Other columns come from
    `context`; a law without precision columns (chinchilla) sees P only through the cost.
    """
    fixed = dict(context)
    if "block" in law.columns and "block" not in fixed:
        block = data.get("columns", {}).get("block", {}).get("median")
        if block is None:
            raise ConfigError("context.block", None, "a block size for the sun law (e.g. context={'block': 128})")
        fixed["block"] = block
    if {"ebits", "mbits"} <= set(law.columns):
        if P != int(P) or P < 3:
            raise ConfigError("P", P, f"integer bit widths >= 3 for law {law.name} (1 sign + E >= 1 + M >= 1)")
        return [{**fixed, "ebits": float(e), "mbits": float(P - 1 - e)} for e in range(1, int(P) - 1)]
    cols = {c: P for c in ("P", "P_w", "P_a", "P_g") if c in law.columns}
    missing = [c for c in law.columns if c not in ("N", "D") and c not in cols and c not in fixed]
    if missing:
        raise ConfigError("context", sorted(fixed), f"values for columns {missing} of law {law.name}")
    return [{**fixed, **cols}]


def _loss(law: laws.Law, params: Mapping[str, float], N, D, cols: Mapping[str, float]) -> np.ndarray:
    N, D = np.broadcast_arrays(np.asarray(N, float), np.asarray(D, float))
    x = {"N": N, "D": D, **{c: np.full(N.shape, v, float) for c, v in cols.items()}}
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return np.asarray(law.predict(params, x, np))


def _best_n(law, params, compute, P, cols, cost: Cost, n_range) -> dict[str, float]:
    """min over N of L(N, D = C/(6·N·f(P)), P): log-N grid, then bounded Brent between the grid neighbours."""
    lo, hi = np.log(n_range[0]), np.log(min(n_range[1], compute / (cost.flops_per_param_token * cost.precision_factor(P))))
    if hi <= lo:
        raise ConfigError("compute", compute, f"enough for N >= {n_range[0]:.3g} and D >= 1 at P = {P}")
    grid = np.linspace(lo, hi, _N_GRID)
    losses = _loss(law, params, np.exp(grid), cost.tokens(np.exp(grid), compute, P), cols)
    losses = np.where(np.isfinite(losses), losses, np.inf)
    i = int(np.argmin(losses))
    a, b = grid[max(i - 1, 0)], grid[min(i + 1, _N_GRID - 1)]

    def f(log_n):
        return float(_loss(law, params, np.exp(log_n), cost.tokens(np.exp(log_n), compute, P), cols))

    res = minimize_scalar(f, bounds=(a, b), method="bounded", options={"xatol": 1e-9})
    log_n, loss = (res.x, float(res.fun)) if res.fun <= losses[i] else (grid[i], float(losses[i]))
    N = float(np.exp(log_n))
    return {"P": float(P), "N": N, "D": float(cost.tokens(N, compute, P)), "loss": loss}


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
                      params: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Minimise the fitted loss over N, D, P at training compute C under `cost`.

    precisions: a set to choose from (e.g. 4, 6, 8, 16, 32), or None for continuous P in p_range
    (integers in p_range for laws on exponent/mantissa bits). Returns dict(P, N, D, loss, compute,
    per_precision): per_precision has the best N, D, loss for each P of the set (continuous: of
    TABLE_PRECISIONS inside p_range) — "at the same budget FP16 trains a 2x larger model than FP32".
    params: evaluate other params than fit.params (e.g. one bootstrap resample).
    """
    fit = _fit(fit)
    law = laws.get(fit.law)
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
        table = pd.DataFrame([at(float(p)) for p in precisions])
        best = table.loc[table["loss"].idxmin()].to_dict()
    elif {"ebits", "mbits"} <= set(law.columns):
        ints = range(max(3, int(np.ceil(p_range[0]))), int(np.floor(p_range[1])) + 1)
        full = pd.DataFrame([at(float(p)) for p in ints])
        best = full.loc[full["loss"].idxmin()].to_dict()
        table = full[full["P"].isin(TABLE_PRECISIONS)].reset_index(drop=True)
    else:
        p_grid = np.linspace(p_range[0], p_range[1], int(4 * (p_range[1] - p_range[0])) + 1)
        profile = [at(p)["loss"] for p in p_grid]
        i = int(np.argmin(profile))
        a, b = p_grid[max(i - 1, 0)], p_grid[min(i + 1, len(p_grid) - 1)]
        res = minimize_scalar(lambda p: at(p)["loss"], bounds=(a, b), method="bounded", options={"xatol": 1e-7})
        best = at(float(res.x)) if res.fun <= profile[i] else at(float(p_grid[i]))
        table = pd.DataFrame([at(float(p)) for p in TABLE_PRECISIONS if p_range[0] <= p <= p_range[1]])
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
        {k: v for k, v in optimal_precision(fit, compute, precisions, params=row, **kwargs).items() if k != "per_precision"}
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
    law = laws.get(fit.law)
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
    law = laws.get(fit.law)
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


# ----------------------------------------------------------------------------- CLI: scaling optimal

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("fit", metavar="FIT", help="fit JSON written by `scaling fit`")
    parser.add_argument("--compute", type=float, required=True, help="training compute in 16-bit FLOPs, e.g. 1e18")
    parser.add_argument("--precisions", type=float, nargs="+", default=None,
                        help="bit widths to choose from (default: continuous P in 1..32)")
    parser.add_argument("--gemm-fraction", type=float, default=1.0,
                        help="share of FLOPs that scales with P (default 1: C = 6/16·N·D·P)")
    parser.add_argument("--ci-samples", type=int, default=200,
                        help="bootstrap resamples used for the CI of the optimum when the fit has them (0: skip)")


def _table(df: pd.DataFrame, columns: Sequence[str]) -> str:
    fmt = {"P": "{:.3g}", "N": "{:.4g}", "D": "{:.4g}", "loss": "{:.5f}", "ebits": "{:.0f}", "mbits": "{:.0f}",
           "N/N_best": "{:.3g}"}
    cells = [[fmt.get(c, "{}").format(v) for c, v in zip(columns, row)] for row in df[list(columns)].itertuples(index=False)]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    fit = FitResult.from_json(args.fit)
    cost = Cost(gemm_fraction=args.gemm_fraction)
    best = optimal_precision(fit, args.compute, args.precisions, cost=cost)
    table = best["per_precision"].copy()
    table["N/N_best"] = table["N"] / best["N"]
    cols = [c for c in ("P", "ebits", "mbits", "N", "D", "loss", "N/N_best") if c in table.columns]
    print(f"law {fit.law}, compute {args.compute:.3g} (16-bit FLOPs), C = 6·N·D·({cost.gemm_fraction:g}·P/16 + {1 - cost.gemm_fraction:g})")
    print(_table(table, cols))
    print(f"optimum: P = {best['P']:.3g} bits, N = {best['N']:.4g}, D = {best['D']:.4g}, loss = {best['loss']:.5f}")
    if fit.bootstrap and args.ci_samples > 0:
        ci = optimal_precision_ci(fit, args.compute, args.precisions, cost=cost, max_samples=args.ci_samples)
        print(f"{ci['level']:.0%} bootstrap CI ({len(ci['samples'])} resamples): "
              + ", ".join(f"{q} [{ci[q][0]:.4g}, {ci[q][1]:.4g}]" for q in ("P", "N", "D", "loss")))
    return 0
