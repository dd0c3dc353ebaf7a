"""Whether a fitted law's compute optimum exists, and how far it reaches past the runs: the one place
that decides it. The check `scaling optimal` and `scaling plan --fit` print; the run-count rule
(`min_runs`, `too_few_runs_reason`, `too_few_runs`) REPORT's P* and the dry run follow; the refusal every
optimiser applies to a degenerate fit (`refuse_degenerate`).

`check(fit, optimum=None, cost=None)` -> {"exists", "reasons", "extrapolated", "extrapolation",
"unchecked", "cost_model"}:

- reasons: why no optimum exists; any at all and `exists` is False and no (N, D, P) is reported. A
  degenerate fit (FitResult.degenerate as stored, else fit.degenerate_reason under today's rules, so a fit
  written before a rule existed is judged by it), and too few runs for the law's free parameters
  (`too_few_runs_reason`, the rule REPORT.md's P* follows).
- extrapolated / extrapolation: N*, D* (and P*, for a law that reads bits) outside the range the fit's
  points span, saying which side and by what factor. A flag, not a refusal: reading a law beyond its runs
  is what it is fitted for, but every verb says so.
- unchecked: what the fit JSON does not record (fits from an older `scaling fit`), said, not guessed.
- cost_model: the name of the cost model the optimum's compute is counted under (optimal.Cost.name).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import pandas as pd

from scaling.study.analysis import laws
from scaling.errors import ConfigError
from scaling.study.analysis.fit import FitResult, degenerate_reason

# A bootstrap resample of n runs holds about (1 - 1/e)·n distinct ones; a law's P* and its CI need each
# resampled fit to keep as many residual degrees of freedom as free parameters, so that many distinct
# runs, twice the free parameters. Below it the CI cannot cover a rerun (12 runs for kumar's 6
# parameters: a rerun with another seed can put P* outside the first run's interval).
DISTINCT_RUNS_PER_PARAM = 2.0

# columns that hold a precision in bits: the optimum sets each to its P (optimal.precision_columns)
_BITS_COLUMNS = ("P", "P_w", "P_a", "P_g", "P_fwd", "P_bwd")


def min_runs(law: str, fixed: Mapping[str, float] | None = None) -> int:
    """The fewest runs a P* from a fit of `law` with `fixed` held needs (see DISTINCT_RUNS_PER_PARAM)."""
    k = len(laws.get(law).free_params(dict(fixed or {})))
    return math.ceil(DISTINCT_RUNS_PER_PARAM * k / (1 - math.exp(-1)))


def too_few_runs_reason(n_runs: int, law: str, fixed: Mapping[str, float] | None = None) -> str | None:
    """Why `n_runs` runs are too few for a P* from a fit of `law` (see DISTINCT_RUNS_PER_PARAM), or None."""
    needed = min_runs(law, fixed)
    if n_runs >= needed:
        return None
    k = len(laws.get(law).free_params(dict(fixed or {})))
    return (f"too few runs for a P*: {n_runs} runs for the {k} free parameters of `{law}` (a bootstrap resample "
            f"holds about {(1 - math.exp(-1)) * n_runs:.0f} distinct runs; a CI that covers a rerun needs at least "
            f"{DISTINCT_RUNS_PER_PARAM * k:.0f}, twice the parameters, so at least {needed} runs)")


def too_few_runs(df: pd.DataFrame, fit: FitResult) -> str | None:
    """Why these runs are too few for a P* from `fit`, or None: too_few_runs_reason on the runs of `df`."""
    n = int(df["run_id"].nunique()) if "run_id" in df.columns else len(df)
    return too_few_runs_reason(n, fit.law, fit.fixed)


def refuse_degenerate(fit: FitResult, key: str = "fit") -> None:
    """One-line ConfigError naming `key` when the fit is degenerate."""
    if fit.degenerate:
        raise ConfigError(key, f"{fit.law} fit, degenerate: {fit.degenerate}",
                          "a fit that is not degenerate (more shapes, seeds or budgets, or another law)")


def _number(v: float, bits: bool = False) -> str:
    if bits:
        return f"{v:.3g}"
    return f"{v:,.0f}" if 1 <= abs(v) < 1e7 else f"{v:.3g}"


def _outside(quantity: str, column: str, value: float, span: Mapping[str, Any], bits: bool) -> dict | None:
    """The extrapolation of `value` against the trained range of `column`, or None inside it."""
    lo, hi = float(span["min"]), float(span["max"])
    if lo * (1 - 1e-9) <= value <= hi * (1 + 1e-9):
        return None
    below = value < lo
    bound = lo if below else hi
    factor = bound / value if below else value / bound
    text = (f"{quantity}* {_number(value, bits)} {'below the smallest' if below else 'above the largest'} "
            f"trained {column} {_number(bound, bits)} ({factor:.3g}x {'smaller' if below else 'larger'})")
    return {"quantity": quantity, "column": column, "value": float(value), "trained": [lo, hi],
            "side": "below" if below else "above", "factor": float(factor), "text": text}


def _extrapolation(fit: FitResult, optimum: Mapping[str, Any], unchecked: list[str]) -> list[dict]:
    law = laws.get(fit.law)
    columns = (fit.data or {}).get("columns") or {}
    checks = [("N", "N", optimum.get("N")), ("D", "D", optimum.get("D"))]
    checks += [("P", c, optimum.get("P")) for c in _BITS_COLUMNS if c in law.columns]
    checks += [(c, c, optimum.get(c)) for c in ("ebits", "mbits") if c in law.columns and c in optimum]
    out = []
    for quantity, column, value in checks:
        if value is None:
            continue
        span = columns.get(column) or {}
        if "min" not in span or "max" not in span:
            unchecked.append(f"the fit records no trained range of {column} (data.columns.{column}; a fit from an "
                             f"older `scaling fit`): whether {quantity}* is an extrapolation is not checked")
            continue
        found = _outside(quantity, column, float(value), span, bits=quantity not in ("N", "D"))
        if found:
            out.append(found)
    return out


def check(fit: FitResult | Mapping[str, Any], optimum: Mapping[str, Any] | None = None,
            cost: Any = None) -> dict[str, Any]:
    """Does an optimum exist for `fit`, and is `optimum` (a dict with N, D, P, as optimal.optimal_precision
    returns; None: judge the fit alone) an extrapolation? `cost`: the optimal.Cost (or its name) the
    optimum's compute is counted under. See the module doc for the keys."""
    fit = fit if isinstance(fit, FitResult) else FitResult.from_dict(fit)
    reasons: list[str] = []
    unchecked: list[str] = []
    degenerate = fit.degenerate or degenerate_reason(fit)
    if degenerate:
        reasons.append(f"degenerate: {degenerate}")
    n_runs = (fit.data or {}).get("n_units")
    if n_runs is None:
        unchecked.append("the fit records no run count (data.n_units; a fit from an older `scaling fit`): "
                         "whether its runs are too few for its free parameters is not checked")
    else:
        few = too_few_runs_reason(int(n_runs), fit.law, fit.fixed)
        if few:
            reasons.append(few)
    extrapolation = _extrapolation(fit, optimum, unchecked) if optimum is not None and not reasons else []
    return {"exists": not reasons, "reasons": reasons, "extrapolated": bool(extrapolation),
            "extrapolation": extrapolation, "unchecked": unchecked,
            "cost_model": None if cost is None else getattr(cost, "name", str(cost))}


def describe(v: Mapping[str, Any]) -> list[str]:
    """The check's lines for a verb's text output: 'no optimum: ...', 'extrapolated: ...', 'not checked: ...'."""
    lines = []
    if not v["exists"]:
        lines.append("no optimum: " + "; ".join(v["reasons"]))
    if v["extrapolated"]:
        lines.append("extrapolated: " + "; ".join(e["text"] for e in v["extrapolation"]))
    lines += [f"not checked: {u}" for u in v["unchecked"]]
    return lines
