"""Fit a scaling law to a DataFrame (Chinchilla Approach 3) with bootstrap CIs and validation.

Objective (Hoffmann et al. 2022; Besiroglu et al. 2024): with theta the free params (positive ones as
their logarithm),

    J(theta) = sum_i w_i · Huber_delta( log L_hat(x_i; theta) - log L_i ),   delta = 1e-3,

summed over points (a mean would scale the gradient by 1/n and make L-BFGS stop early), log L_hat
computed as a logsumexp of the law's log-terms. Minimised by L-BFGS from every point of an
initialisation grid, best kept.

Speed: the whole grid is optimised at once in JAX with exact gradients: a batched L-BFGS (two-loop
recursion, a line search that tries a short ladder of step sizes in parallel) is jit'd and vmap'd
over the starts, so 4,500 starts cost a few hundred batched evaluations instead of 4,500
Python-level scipy runs. This stage only ranks the starts, so it runs in float32 (XLA's float32
exp/log are many times faster on CPU): all starts a few iterations, the best tenth many more. The
best few distinct results are then polished by scipy L-BFGS-B in float64 with the float64 JAX
gradient, and the lowest float64 objective is reported. `reference_fit` is the plain per-start
scipy loop it must agree with (tests and benchmarks/bench_fit.py compare them).

Bootstrap: resampling units (runs, by `run_id`, or rows) with replacement is a multinomial weight
per row, so all resamples are one batched weighted float64 fit, started from the full-data optimum.

Law selection (`select_law`, `scaling fit --law auto`): every candidate law is scored by how well it
predicts held-out *precision gaps* (loss minus the matching high-precision run's loss) after leaving
out the largest size or the longest budget; what matters for choosing a precision is the gap, not the
loss level every law fits about equally well.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from scaling.study import laws, results
from scaling.train import compute
from scaling._io import atomic_write_json
from scaling.errors import ConfigError

# JAX (the batched L-BFGS solvers) is imported inside the functions that fit: `scaling plan --fit`
# and `scaling optimal` read a fitted law without loading it.

HUBER_DELTA = 1e-3
# Line search: steps sigma·t for t in this ladder are tried in parallel along the L-BFGS direction, the
# lowest objective wins. sigma (per start) is 1 (the quasi-Newton step) while steps succeed, shrinks 16x
# below the ladder when none improves, and grows back 4x per success. Each ladder entry costs one
# batched evaluation, so the ladder is short.
_STEP_LADDER = (2.0, 1.0, 0.3, 0.05)
# Columns that must be > 0 wherever a law reads them (logs are taken).
_POSITIVE_COLUMNS = ("N", "D", "P", "P_w", "P_a", "P_g", "P_fwd", "P_bwd")


# ----------------------------------------------------------------------------- data preparation

@dataclass(frozen=True)
class _Problem:
    """A law + its fixed params + validated float64 data, in the order the optimiser sees them."""

    law: laws.Law
    free: tuple[str, ...]
    fixed: dict[str, float]
    x: dict[str, np.ndarray]
    log_loss: np.ndarray
    units: np.ndarray  # resampling unit of each row (integer codes)
    unit_name: str  # "run_id" (rows of a run resampled together) or "row"

    def params(self, theta: np.ndarray) -> dict[str, float]:
        p = {name: float(np.exp(t) if name in self.law.positive else t) for name, t in zip(self.free, theta)}
        return {**p, **self.fixed}

    def theta(self, params: Mapping[str, float]) -> np.ndarray:
        return np.array([np.log(params[n]) if n in self.law.positive else params[n] for n in self.free])


def _resolve_fixed(law: laws.Law, fixed: Mapping[str, float] | None) -> dict[str, float]:
    fixed = dict(law.fixed if fixed is None else fixed)
    for name, value in fixed.items():
        if name not in law.params:
            raise ConfigError("fixed", name, f"params of law {law.name}: {', '.join(law.params)}")
        if name in law.positive and not value > 0:
            raise ConfigError(f"fixed.{name}", value, "> 0")
    return {k: float(v) for k, v in fixed.items()}


def _columns(law: laws.Law, df: pd.DataFrame, require_rows: bool = True) -> dict[str, np.ndarray]:
    missing = [c for c in law.columns if c not in df.columns]
    if missing:
        raise ConfigError("columns", sorted(map(str, df.columns)), f"law {law.name} needs {', '.join(law.columns)} (missing {', '.join(missing)})")
    x = {}
    for c in law.columns:
        col = pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=float)
        if np.isnan(col).any():
            raise ConfigError(c, f"{int(np.isnan(col).sum())} NaN/non-numeric rows", "finite numbers (drop or fix those rows)")
        if c in _POSITIVE_COLUMNS and (col <= 0).any():
            raise ConfigError(c, float(col[col <= 0][0]), "values > 0")
        x[c] = col
    if "block" in x and (x["block"] < 2).any():
        raise ConfigError("block", float(x["block"].min()), "block sizes >= 2 (the law uses log2 B)")
    for c in laws.QERR_COLUMNS:
        if c in x and ((x[c] < 0) | (x[c] >= 1)).any():
            bad = x[c][(x[c] < 0) | (x[c] >= 1)]
            raise ConfigError(c, float(bad[0]), "relative errors in [0, 1) (0 for an unquantised role)")
    if require_rows and len(df) == 0:
        raise ConfigError("rows", 0, "at least one row")
    return x


def _prepare(df: pd.DataFrame, law: str | laws.Law, fixed: Mapping[str, float] | None,
             loss_column: str = "loss") -> _Problem:
    law = laws.get(law) if isinstance(law, str) else law
    if not isinstance(df, pd.DataFrame):
        raise ConfigError("df", type(df).__name__, "a pandas DataFrame")
    fixed = _resolve_fixed(law, fixed)
    x = _columns(law, df)
    if loss_column not in df.columns:
        raise ConfigError("columns", sorted(map(str, df.columns)), f"a loss column {loss_column!r}")
    loss = pd.to_numeric(df[loss_column], errors="coerce").to_numpy(dtype=float)
    if np.isnan(loss).any():
        raise ConfigError(loss_column, f"{int(np.isnan(loss).sum())} NaN rows", "finite losses (drop failed runs first)")
    if (loss <= 0).any():
        raise ConfigError(loss_column, float(loss[loss <= 0][0]), "losses > 0")
    free = law.free_params(fixed)
    if len(df) <= len(free):
        raise ConfigError("rows", len(df), f"more than {len(free)} (the free params of {law.name}: {', '.join(free)})")
    units = (pd.factorize(df["run_id"])[0] if "run_id" in df.columns else np.arange(len(df))).astype(np.int64)
    return _Problem(law=law, free=free, fixed=fixed, x=x, log_loss=np.log(loss), units=units,
                    unit_name="run_id" if "run_id" in df.columns else "row")


def _grid(problem: _Problem, init: Mapping[str, Sequence[float]] | None) -> np.ndarray:
    """Cartesian product of the init grids of the free params, in optimiser space (log for positive)."""
    grid = {**problem.law.init_grid, **{k: tuple(v) for k, v in (init or {}).items()}}
    for k in (init or {}):
        if k not in problem.law.params:
            raise ConfigError("init", k, f"params of law {problem.law.name}: {', '.join(problem.law.params)}")
    axes = []
    for name in problem.free:
        vals = np.asarray(grid[name], dtype=float)
        if name in problem.law.positive:
            if (vals <= 0).any():
                raise ConfigError(f"init.{name}", list(vals), "positive values")
            vals = np.log(vals)
        axes.append(vals)
    return np.array(list(itertools.product(*axes)), dtype=float).reshape(-1, len(problem.free))


# ----------------------------------------------------------------------------- objective (numpy + JAX)

def _huber(r, delta, xp):
    a = xp.abs(r)
    return xp.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))


def _objective(theta, law: laws.Law, free, positive_mask, fixed, x, log_loss, weights, delta, xp):
    natural = xp.where(positive_mask, xp.exp(theta), theta)
    p = {name: natural[i] for i, name in enumerate(free)}
    p.update(fixed)
    r = law.log_predict(p, x, xp) - log_loss
    return xp.sum(weights * _huber(r, delta, xp))


@functools.lru_cache(maxsize=64)
def _jax_solvers(law_name: str, free: tuple[str, ...], fixed_names: tuple[str, ...], memory: int):
    """jit'd (value_and_grad, batched L-BFGS) for one law and set of free params (cached: compile once)."""
    import jax
    import jax.numpy as jnp

    law = laws.get(law_name)
    positive_mask = np.array([n in law.positive for n in free])

    def objective(theta, fixed_vals, x, log_loss, weights, delta):
        fixed = dict(zip(fixed_names, fixed_vals))
        return _objective(theta, law, free, positive_mask, fixed, x, log_loss, weights, delta, jnp)

    value_and_grad = jax.value_and_grad(objective)

    def lbfgs_one(theta0, weights, fixed_vals, x, log_loss, delta, iters):
        tiny = jnp.finfo(theta0.dtype).tiny  # keeps 1/|g| finite at a zero gradient
        def f(th):
            return objective(th, fixed_vals, x, log_loss, weights, delta)

        def vg(th):
            return value_and_grad(th, fixed_vals, x, log_loss, weights, delta)

        def direction(g, S, Y):
            # Two-loop recursion; empty (zero) memory slots have rho = 0 and drop out.
            sy = jnp.sum(S * Y, axis=1)
            rho = jnp.where(sy > 0, 1.0 / jnp.where(sy > 0, sy, 1.0), 0.0)
            q = g
            alphas = []
            for i in reversed(range(memory)):
                a = rho[i] * jnp.dot(S[i], q)
                q = q - a * Y[i]
                alphas.append(a)
            yy = jnp.dot(Y[-1], Y[-1])
            # Initial Hessian scale s·y/y·y (Nocedal & Wright 7.20); before any pair, a unit-length step.
            h0 = jnp.where(sy[-1] > 0, sy[-1] / jnp.where(yy > 0, yy, 1.0), 1.0 / (jnp.linalg.norm(g) + tiny))
            r = h0 * q
            for i, a in zip(range(memory), reversed(alphas)):
                b = rho[i] * jnp.dot(Y[i], r)
                r = r + S[i] * (a - b)
            return -r

        def step(carry):
            th, v, g, S, Y, sigma = carry
            d = direction(g, S, Y)
            d = jnp.where(jnp.dot(d, g) < 0, d, -g / (jnp.linalg.norm(g) + tiny))
            ladder = jnp.asarray(_STEP_LADDER, th.dtype)
            candidates = th[None, :] + sigma * ladder[:, None] * d[None, :]
            values = jax.vmap(f)(candidates)
            values = jnp.where(jnp.isfinite(values), values, jnp.inf)
            best = jnp.argmin(values)
            improved = values[best] < v
            th_new = jnp.where(improved, candidates[best], th)
            v_new, g_new = vg(th_new)
            s, y = th_new - th, g_new - g
            keep = improved & (jnp.dot(s, y) > 1e-12 * jnp.dot(s, s))
            S_new = jnp.where(keep, jnp.concatenate([S[1:], s[None]]), S)
            Y_new = jnp.where(keep, jnp.concatenate([Y[1:], y[None]]), Y)
            # No step improved: forget the curvature pairs so the next try is steepest descent.
            S_new = jnp.where(improved, S_new, jnp.zeros_like(S))
            Y_new = jnp.where(improved, Y_new, jnp.zeros_like(Y))
            sigma = jnp.where(improved, jnp.minimum(1.0, 4.0 * sigma), sigma * ladder[-1] / 16.0)
            return th_new, v_new, g_new, S_new, Y_new, sigma

        v0, g0 = vg(theta0)
        zeros = jnp.zeros((memory, theta0.shape[0]), theta0.dtype)
        one = jnp.ones((), theta0.dtype)
        # fori_loop with a traced trip count: one compilation serves every iteration budget.
        th, v, *_ = jax.lax.fori_loop(0, iters, lambda _, c: step(c), (theta0, v0, g0, zeros, zeros, one))
        return th, v

    batched = jax.vmap(lbfgs_one, in_axes=(0, 0, None, None, None, None, None))
    return jax.jit(value_and_grad), jax.jit(batched)


def _jax_args(problem: _Problem):
    fixed_names = tuple(sorted(problem.fixed))
    fixed_vals = tuple(problem.fixed[k] for k in fixed_names)
    return fixed_names, fixed_vals


def _pad(a: np.ndarray, size: int, axis: int) -> np.ndarray:
    """Pad `a` along `axis` to `size` by repeating its first slice (padding rows get weight 0 or are dropped)."""
    extra = size - a.shape[axis]
    return a if extra == 0 else np.concatenate([a, np.repeat(np.take(a, [0], axis=axis), extra, axis=axis)], axis=axis)


def _batched_lbfgs(problem: _Problem, starts: np.ndarray, weights: np.ndarray, iters: int,
                   delta: float, dtype: str = "float64", memory: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Run L-BFGS from every row of `starts` (weights: one row of point weights per start).

    dtype float32 is for ranking starts only (XLA's float32 exp/log are many times faster on CPU);
    every reported optimum is refined in float64. Shapes are bucketed (starts in chunks of 64 or 512,
    points padded with zero-weight copies to a multiple of 64) so a handful of compilations serve all fits.
    """
    import jax

    fixed_names, fixed_vals = _jax_args(problem)
    _, batched = _jax_solvers(problem.law.name, problem.free, fixed_names, memory)
    x, log_loss, weights = _padded_data(problem, weights, dtype)
    chunk = 64 if len(starts) <= 64 else 512
    thetas, values = [], []
    # Scoped: float64 inside this block only; the training code in the same process keeps its dtypes.
    with jax.enable_x64(dtype == "float64"):
        for lo in range(0, len(starts), chunk):
            n = min(chunk, len(starts) - lo)
            th, v = batched(_pad(starts[lo:lo + n], chunk, 0).astype(dtype), _pad(weights[lo:lo + n], chunk, 0),
                            tuple(np.asarray(f, dtype) for f in fixed_vals), x, log_loss,
                            np.asarray(delta, dtype), np.int32(iters))
            thetas.append(np.asarray(th)[:n])
            values.append(np.asarray(v)[:n])
    values = np.concatenate(values)
    return np.concatenate(thetas), np.where(np.isfinite(values), values, np.inf)


def _padded_data(problem: _Problem, weights: np.ndarray, dtype: str):
    """Points padded with zero-weight copies to a multiple of 64 (fewer distinct shapes to compile)."""
    n_pad = -(-len(problem.log_loss) // 64) * 64
    x = {k: _pad(v, n_pad, 0).astype(dtype) for k, v in problem.x.items()}
    zeros = np.zeros(weights.shape[:-1] + (n_pad - weights.shape[-1],))
    return x, _pad(problem.log_loss, n_pad, 0).astype(dtype), np.concatenate([weights, zeros], axis=-1).astype(dtype)


def _polish(problem: _Problem, theta0: np.ndarray, weights: np.ndarray, delta: float, memory: int = 5):
    """scipy L-BFGS-B in float64 from theta0 with the exact JAX gradient -> (theta, value)."""
    import jax

    fixed_names, fixed_vals = _jax_args(problem)
    value_and_grad, _ = _jax_solvers(problem.law.name, problem.free, fixed_names, memory)
    x, log_loss, weights = _padded_data(problem, weights, "float64")
    with jax.enable_x64(True):
        def fun(th):
            v, g = value_and_grad(th, fixed_vals, x, log_loss, weights, delta)
            v = float(v)
            return (v, np.asarray(g)) if np.isfinite(v) else (np.inf, np.zeros_like(th))

        res = minimize(fun, theta0, jac=True, method="L-BFGS-B", options={"maxiter": 2000, "ftol": 1e-15, "gtol": 1e-12})
    return res.x, float(res.fun)


def _numpy_objective(problem: _Problem, theta: np.ndarray, delta: float = HUBER_DELTA,
                     weights: np.ndarray | None = None) -> float:
    positive_mask = np.array([n in problem.law.positive for n in problem.free])
    w = np.ones_like(problem.log_loss) if weights is None else weights
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        v = _objective(np.asarray(theta, float), problem.law, problem.free, positive_mask, problem.fixed,
                       problem.x, problem.log_loss, w, delta, np)
    return float(v) if np.isfinite(v) else np.inf


def _distinct_best(thetas: np.ndarray, values: np.ndarray, k: int, tol: float = 1e-3) -> list[int]:
    """Indices of the k best results that are not duplicates of a better one (many starts converge together)."""
    chosen: list[int] = []
    for i in np.argsort(values):
        if not np.isfinite(values[i]):
            break
        if all(np.max(np.abs(thetas[i] - thetas[j])) > tol for j in chosen):
            chosen.append(int(i))
        if len(chosen) == k:
            break
    return chosen


# ----------------------------------------------------------------------------- results

@dataclass
class FitResult:
    """A fitted law. `params` in natural units (fixed ones included); `ci` name -> (lo, hi) once bootstrapped.

    `bootstrap` (when run): n, seed, level, unit ('run_id' or 'row'), and `samples` (name -> per-resample
    values) so derived quantities (e.g. optimal.optimal_precision_ci) get CIs from the same resamples.
    """

    law: str
    params: dict[str, float]
    objective: float
    residuals: np.ndarray
    fixed: dict[str, float] = field(default_factory=dict)
    ci: dict[str, tuple[float, float]] = field(default_factory=dict)
    bootstrap: dict[str, Any] | None = None
    data: dict[str, Any] = field(default_factory=dict)
    heldout: dict[str, Any] | None = None
    optimizer: dict[str, Any] = field(default_factory=dict)
    selection: dict[str, Any] | None = None  # select_law's summary when the law was picked by `--law auto`

    def predict(self, df: pd.DataFrame) -> np.ndarray:
        law = laws.get(self.law)
        x = _columns(law, df, require_rows=False)
        return np.asarray(law.predict(self.params, x, np))

    @property
    def samples(self) -> pd.DataFrame:
        """Per-resample params (one row per bootstrap resample); empty without a bootstrap."""
        if not self.bootstrap:
            return pd.DataFrame(columns=list(self.params))
        s = pd.DataFrame(self.bootstrap["samples"])
        for k, v in self.fixed.items():
            s[k] = v
        return s[[p for p in laws.get(self.law).params if p in s.columns]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "law": self.law, "params": self.params, "fixed": self.fixed, "objective": self.objective,
            "residuals": [float(r) for r in self.residuals],
            "ci": {k: list(v) for k, v in self.ci.items()}, "bootstrap": self.bootstrap,
            "data": self.data, "heldout": self.heldout, "optimizer": self.optimizer,
            "selection": self.selection,
        }

    def to_json(self, path: str | Path) -> Path:
        atomic_write_json(path, self.to_dict())
        return Path(path)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FitResult:
        missing = [k for k in ("law", "params", "objective") if k not in d]
        if missing:
            raise ConfigError("fit json", sorted(d), f"a fit with keys law, params, objective (missing {missing})")
        laws.get(d["law"])
        return cls(law=d["law"], params={k: float(v) for k, v in d["params"].items()},
                   objective=float(d["objective"]), residuals=np.asarray(d.get("residuals", []), float),
                   fixed={k: float(v) for k, v in (d.get("fixed") or {}).items()},
                   ci={k: (float(v[0]), float(v[1])) for k, v in (d.get("ci") or {}).items()},
                   bootstrap=d.get("bootstrap"), data=d.get("data") or {}, heldout=d.get("heldout"),
                   optimizer=d.get("optimizer") or {}, selection=d.get("selection"))

    @classmethod
    def from_json(cls, path: str | Path) -> FitResult:
        path = Path(path)
        if not path.is_file():
            raise ConfigError("fit", str(path), "an existing fit JSON (from `scaling fit ... -o`)")
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except json.JSONDecodeError as e:
            raise ConfigError("fit", str(path), f"valid JSON ({e.msg} at line {e.lineno})") from None


def _data_summary(problem: _Problem) -> dict[str, Any]:
    cols = {c: {"min": float(v.min()), "max": float(v.max()), "median": float(np.median(v)),
                "n_unique": int(len(np.unique(v)))} for c, v in problem.x.items()}
    loss = np.exp(problem.log_loss)
    cols["loss"] = {"min": float(loss.min()), "max": float(loss.max()), "median": float(np.median(loss))}
    return {"n_points": int(len(loss)), "n_units": int(len(np.unique(problem.units))), "columns": cols}


def _shape(df: pd.DataFrame) -> dict[str, Any]:
    """The fitted runs' unquantised FLOPs per dense FLOP by N (compute.Shape), which scaling.study.optimal
    needs to cost a hypothetical model like the runs it was fitted on; {} for tables without FLOPs by part."""
    shape = compute.Shape.from_results(df)
    return {"shape": shape.to_dict()} if shape.knots_N else {}


# ----------------------------------------------------------------------------- fitting

def fit_law(df: pd.DataFrame, law: str = "kumar", *, fixed: Mapping[str, float] | None = None,
            init: Mapping[str, Sequence[float]] | None = None, loss_column: str = "loss",
            delta: float = HUBER_DELTA, iters: tuple[int, int] = (30, 100), keep: float = 0.1,
            polish: int = 5, bootstrap: int = 0, seed: int = 0, level: float = 0.95) -> FitResult:
    """Fit `law` to df (columns: the law's columns + `loss_column`) by grid-started L-BFGS, best kept.

    fixed: params held fixed (default: the law's, e.g. kumar's kappa = 3; `{}` frees them all).
    init: per-param start values overriding the law's default grid (natural scale).
    Schedule: every start gets iters[0] batched L-BFGS iterations (float32, for ranking), the best
    `keep` fraction iters[1] more, then the `polish` best distinct results are refined by scipy
    L-BFGS-B in float64 with exact gradients; the lowest float64 objective wins.
    bootstrap: if > 0, also resample (see `bootstrap`) and fill .ci / .bootstrap.
    """
    problem = _prepare(df, law, fixed, loss_column)
    starts = _grid(problem, init)
    n = len(problem.log_loss)
    thetas, values = _batched_lbfgs(problem, starts, np.ones((len(starts), n)), iters[0], delta, "float32")
    survivors = np.argsort(values)[:max(polish, int(np.ceil(keep * len(starts))))]
    thetas, values = _batched_lbfgs(problem, thetas[survivors], np.ones((len(survivors), n)), iters[1], delta, "float32")
    if not np.isfinite(values).any():
        raise ConfigError("fit", problem.law.name, "data the law can be evaluated on (every start gave a non-finite objective)")
    best_theta, best_value = None, np.inf
    for i in _distinct_best(thetas, values, polish):
        th, v = _polish(problem, thetas[i].astype(float), np.ones(n), delta)
        if v < best_value:
            best_theta, best_value = th, v
    params = problem.params(best_theta)
    residuals = np.asarray(problem.law.log_predict(params, problem.x, np)) - problem.log_loss
    result = FitResult(
        law=problem.law.name, params=params, objective=best_value, residuals=residuals, fixed=problem.fixed,
        data={**_data_summary(problem), **_shape(df)},
        optimizer={"method": "batched L-BFGS (JAX) over the init grid + scipy L-BFGS-B float64 polish",
                   "n_starts": int(len(starts)), "iters": list(iters), "keep": keep, "polished": polish,
                   "huber_delta": delta, "loss_column": loss_column,
                   "init": {name: sorted({round(float(v), 12) for v in starts[:, i]}) for i, name in enumerate(problem.free)}},
    )
    if bootstrap:
        _add_bootstrap(problem, result, best_theta, bootstrap, seed, level, delta)
    return result


def bootstrap(df: pd.DataFrame, law: str = "kumar", n: int = 1000, seed: int = 0, *, level: float = 0.95,
              fixed: Mapping[str, float] | None = None, init: Mapping[str, Sequence[float]] | None = None,
              loss_column: str = "loss", delta: float = HUBER_DELTA) -> FitResult:
    """fit_law + `n` bootstrap resamples -> FitResult with percentile `ci` at `level` and per-resample
    `samples` (FitResult.samples), from which derived quantities get CIs (optimal.optimal_precision_ci).

    Resampling unit: runs (rows sharing `run_id`, if that column exists), else rows. A resample is a
    multinomial count per unit, i.e. a weight per row; all resamples are re-optimised together
    (batched L-BFGS, float64) from the full-data optimum.
    """
    return fit_law(df, law, fixed=fixed, init=init, loss_column=loss_column, delta=delta,
                   bootstrap=n, seed=seed, level=level)


BOOTSTRAP_ITERS = 60


def _add_bootstrap(problem: _Problem, result: FitResult, best_theta: np.ndarray, n: int, seed: int,
                   level: float, delta: float) -> None:
    if not 0 < level < 1:
        raise ConfigError("level", level, "a probability in (0, 1)")
    rng = np.random.default_rng(seed)
    n_units = int(problem.units.max()) + 1
    counts = rng.multinomial(n_units, np.full(n_units, 1.0 / n_units), size=n)  # (resamples, units)
    weights = counts[:, problem.units].astype(float)  # (resamples, rows)
    thetas, values = _batched_lbfgs(problem, np.repeat(best_theta[None], n, axis=0), weights,
                                    BOOTSTRAP_ITERS, delta, "float64")
    ok = np.isfinite(values)
    samples = {name: [float(problem.params(t)[name]) for t in thetas[ok]] for name in problem.free}
    tail = 100 * (1 - level) / 2
    result.ci = {name: (float(np.percentile(v, tail)), float(np.percentile(v, 100 - tail)))
                 for name, v in samples.items()}
    result.bootstrap = {
        "n": n, "seed": seed, "level": level, "unit": problem.unit_name,
        "n_units": n_units, "failed": int((~ok).sum()), "iters": BOOTSTRAP_ITERS,
        "median": {name: float(np.median(v)) for name, v in samples.items()},
        "se": {name: float(np.std(v, ddof=1)) for name, v in samples.items()},
        "samples": samples,
    }


def reference_fit(df: pd.DataFrame, law: str = "chinchilla", *, starts: np.ndarray | None = None,
                  fixed: Mapping[str, float] | None = None, init: Mapping[str, Sequence[float]] | None = None,
                  loss_column: str = "loss", delta: float = HUBER_DELTA) -> dict[str, Any]:
    """The plain method fit_law must agree with: scipy L-BFGS-B from each start in a Python loop, numpy
    objective, finite-difference gradients (as in Besiroglu et al.'s code), best kept.

    starts: rows of optimiser-space starts (default: the law's full grid). Returns params, objective, theta.
    """
    problem = _prepare(df, law, fixed, loss_column)
    starts = _grid(problem, init) if starts is None else np.asarray(starts, float)
    best = None
    for s in starts:
        res = minimize(lambda th: _numpy_objective(problem, th, delta), s, method="L-BFGS-B")
        if np.isfinite(res.fun) and (best is None or res.fun < best.fun):
            best = res
    return {"params": problem.params(best.x), "objective": float(best.fun), "theta": best.x}


def grid_starts(df: pd.DataFrame, law: str, *, fixed: Mapping[str, float] | None = None,
                init: Mapping[str, Sequence[float]] | None = None, loss_column: str = "loss") -> np.ndarray:
    """The optimiser-space starts fit_law uses (rows; positive params as logs), e.g. for reference_fit."""
    return _grid(_prepare(df, law, fixed, loss_column), init)


def objective(df: pd.DataFrame, law: str, params: Mapping[str, float], *, loss_column: str = "loss",
              delta: float = HUBER_DELTA) -> float:
    """J(params) on df: the summed Huber loss on log residuals that fit_law minimises."""
    law_obj = laws.get(law)
    missing = [p for p in law_obj.params if p not in params]
    if missing:
        raise ConfigError("params", sorted(params), f"values for every param of {law}: missing {missing}")
    problem = _prepare(df, law_obj, {}, loss_column)
    return _numpy_objective(problem, problem.theta(params), delta)


# ----------------------------------------------------------------------------- validation

def _split_key(df: pd.DataFrame, by: str) -> np.ndarray:
    if by == "N":
        return pd.to_numeric(df["N"]).to_numpy(float)
    if by == "compute":
        return 6.0 * pd.to_numeric(df["N"]).to_numpy(float) * pd.to_numeric(df["D"]).to_numpy(float)
    raise ConfigError("by", by, ["N", "compute"])


def mean_abs_rel_error(predicted: np.ndarray, actual: np.ndarray) -> float:
    """mean |predicted - actual| / actual."""
    return float(np.mean(np.abs(np.asarray(predicted) - np.asarray(actual)) / np.asarray(actual)))


def holdout_error(df: pd.DataFrame, law: str = "kumar", *, by: str = "N", frac: float = 0.2,
                  loss_column: str = "loss", **fit_kwargs: Any) -> dict[str, Any]:
    """Extrapolation test: hold out the largest values of `by` (N, or compute 6·N·D) that together hold at
    most `frac` of the rows (at least the largest value: with a few discrete sizes, the largest size),
    fit on the rest, predict the held-out losses.
    Returns mare (mean absolute relative error of the held-out loss), threshold, n_train, n_test, params.
    """
    key = _split_key(df, by)
    values, counts = np.unique(key, return_counts=True)
    share = np.cumsum(counts[::-1]) / len(key)  # share of rows at or above each value, largest first
    threshold = float(values[::-1][max(0, int(np.searchsorted(share, frac, side="right")) - 1)])
    test = key >= threshold
    if test.all() or not test.any():
        raise ConfigError("frac", frac, f"a fraction leaving both training and held-out rows ({by} has {len(np.unique(key))} values)")
    train_df, test_df = df[~test], df[test]
    fitted = fit_law(train_df, law, loss_column=loss_column, **fit_kwargs)
    actual = pd.to_numeric(test_df[loss_column]).to_numpy(float)
    return {"by": by, "threshold": threshold, "n_train": int((~test).sum()), "n_test": int(test.sum()),
            "mare": mean_abs_rel_error(fitted.predict(test_df), actual), "params": fitted.params}


def leave_one_size_out(df: pd.DataFrame, law: str = "kumar", *, loss_column: str = "loss",
                       **fit_kwargs: Any) -> pd.DataFrame:
    """For each distinct N: fit on the other sizes, predict this one. Columns N, n_test, mare."""
    rows = []
    for n in np.unique(pd.to_numeric(df["N"]).to_numpy(float)):
        mask = df["N"].to_numpy(float) == n
        fitted = fit_law(df[~mask], law, loss_column=loss_column, **fit_kwargs)
        actual = pd.to_numeric(df[mask][loss_column]).to_numpy(float)
        rows.append({"N": n, "n_test": int(mask.sum()), "mare": mean_abs_rel_error(fitted.predict(df[mask]), actual)})
    return pd.DataFrame(rows)


def aic(result: FitResult, n: int | None = None) -> float:
    """AIC from a Gaussian likelihood of the log residuals: n·log(RSS/n_points) + 2k, k = free params.
    n defaults to the number of points; select_law passes the number of runs, since the points of one
    run (its losses at several budgets) are far from independent and would let extra params look cheap.
    (The fit itself is robust Huber; AIC is for ranking laws on the same data only.)"""
    r = np.asarray(result.residuals)
    k = len([p for p in result.params if p not in result.fixed])
    n = len(r) if n is None else n
    return float(n * np.log(np.sum(r * r) / len(r)) + 2 * k)


def compare_laws(df: pd.DataFrame, laws_to_compare: Sequence[str] = ("chinchilla", "kumar"), *,
                 by: str = "N", frac: float = 0.2, loss_column: str = "loss", **fit_kwargs: Any) -> pd.DataFrame:
    """Fit each law on the same data; one row per law: n_params, objective, rmse_log, aic, heldout_mare
    (holdout_error with `by`/`frac`). Lower aic and heldout_mare are better. An `init` grid applies
    to every law that has those params."""
    rows = []
    init = fit_kwargs.pop("init", None) or {}
    for name in laws_to_compare:
        law_init = {k: v for k, v in init.items() if k in laws.get(name).params}
        fitted = fit_law(df, name, loss_column=loss_column, init=law_init, **fit_kwargs)
        held = holdout_error(df, name, by=by, frac=frac, loss_column=loss_column, init=law_init, **fit_kwargs)
        rows.append({"law": name, "n_params": len([p for p in fitted.params if p not in fitted.fixed]),
                     "objective": fitted.objective,
                     "rmse_log": float(np.sqrt(np.mean(np.asarray(fitted.residuals) ** 2))),
                     "aic": aic(fitted), "heldout_mare": held["mare"]})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- law selection

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
    return Candidate(spec.strip(), law.name, _resolve_fixed(law, fixed))


def default_candidates() -> list[str]:
    """Every registered law, plus each law that holds params fixed by default with them freed
    (kumar -> also 'kumar[kappa free]')."""
    out = []
    for name in laws.names():
        out.append(name)
        if laws.get(name).fixed:
            out.append(f"{name}[{', '.join(f'{k} free' for k in laws.get(name).fixed)}]")
    return out


def unfittable_reason(df: pd.DataFrame, law: str, fixed: Mapping[str, float] | None = None,
                      loss_column: str = "loss") -> str | None:
    """Why `law` cannot be fitted on df (missing/bad columns, too few rows, a column group the law needs
    to vary that is constant), or None if it can."""
    try:
        problem = _prepare(df, law, fixed, loss_column)
    except ConfigError as e:
        return str(e)
    for group in problem.law.varying:
        if all(len(np.unique(problem.x[c])) < 2 for c in group):
            values = ", ".join(f"{c} = {problem.x[c][0]:g}" for c in group)
            return f"constant on the data ({values}): the params of {problem.law.name} that it sets cannot be identified"
    return None


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


def precision_gaps(df: pd.DataFrame, loss_column: str = "val_loss", reference: str | None = None) -> pd.Series:
    """Each row's loss minus the mean loss of the reference rows with the same (N, D, seed if present);
    NaN for the reference rows themselves and for rows with no matching reference run."""
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
    reason = unfittable_reason(df[~test], cand.law, cand.fixed, loss_column)
    if reason:
        return f"without the largest {by}: {reason}"
    pos, measured = _gaps(pd.to_numeric(df[loss_column]).to_numpy(float), ids, ref, test)
    if len(pos) == 0:
        return f"no held-out row at the largest {by} has a matching reference run"
    runs = df["run_id"].to_numpy()[pos] if "run_id" in df.columns else pos
    if len(np.unique(runs)) < 2:
        return f"the held-out gaps at the largest {by} come from one run: no standard error, not used"
    try:
        fitted = fit_law(df[~test], cand.law, fixed=cand.fixed, loss_column=loss_column, **fit_kwargs)
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
    reason = unfittable_reason(df, cand.law, cand.fixed, loss_column)
    if reason is None:
        try:
            fitted = fit_law(df, cand.law, fixed=cand.fixed, loss_column=loss_column, **fit_kwargs)
        except ConfigError as e:  # e.g. every start gave a non-finite objective
            reason = str(e)
    if reason is not None:
        entry.update(fittable=False, reason=reason)
        return entry, None, {}
    loss = pd.to_numeric(df[loss_column]).to_numpy(float)
    entry.update(fittable=True, reason=None, n_params=len(law.free_params(cand.fixed)),
                 aic=aic(fitted, n=fitted.data["n_units"]), mare=mean_abs_rel_error(fitted.predict(df), loss),
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


# ----------------------------------------------------------------------------- CLI: scaling fit

def _runs_to_fit(df: pd.DataFrame, loss_column: str | None) -> tuple[pd.DataFrame, str]:
    """Only runs that landed (`status` ok, if present); loss column: given, else `loss`, else `val_loss`."""
    if "status" in df.columns:
        df = df[df["status"] == "ok"]
    if loss_column is None:
        loss_column = next((c for c in ("loss", "val_loss") if c in df.columns), "loss")
    return df.reset_index(drop=True), loss_column


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", metavar="RESULTS", help="results .csv / .parquet file or results directory")
    parser.add_argument("--law", default="kumar",
                        help=f"law to fit: {', '.join(laws.names())} (default kumar), or auto: fit every candidate and keep "
                             "the one that best predicts held-out precision gaps (fit.select_law)")
    parser.add_argument("--candidate", action="append", default=[], metavar="LAW[VARIANT]",
                        help="with --law auto: a candidate (repeatable), e.g. kumar or 'kumar[kappa free]'; "
                             "default: every law, plus each with its fixed params freed")
    parser.add_argument("--reference", default=None, metavar="RECIPE",
                        help="with --law auto: the high-precision reference recipe (default: the rows with the largest P)")
    parser.add_argument("--sweep", default=None, help="fit only the rows of this sweep (a multi-sweep table's `sweep` column)")
    parser.add_argument("-o", "--output", required=True, help="where to write the fit JSON, e.g. fits/NAME.json")
    parser.add_argument("--bootstrap", type=int, default=0, metavar="N", help="bootstrap resamples for CIs (e.g. 1000)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    parser.add_argument("--loss-column", default=None, help="loss column (default: loss, else val_loss)")
    parser.add_argument("--fix", action="append", default=[], metavar="NAME=VALUE",
                        help="hold a param fixed (repeatable); default: the law's (kumar: kappa=3); --fix none frees all")
    parser.add_argument("--holdout", choices=["N", "compute"], default=None,
                        help="also record the held-out error (fit on the smaller 80%% by N or compute)")


def _parse_fixed(items: Sequence[str]) -> dict[str, float] | None:
    if not items:
        return None
    if items == ["none"]:
        return {}
    fixed = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            fixed[name] = float(value)
        except ValueError:
            raise ConfigError("--fix", item, "NAME=VALUE with a number, or none") from None
    return fixed


def _print_fit(result: FitResult) -> None:
    width = max(len(k) for k in result.params)
    print(f"law {result.law}: {result.data.get('n_points')} points, objective {result.objective:.6g}")
    header = f"  {'param':<{width}}  {'value':>12}"
    if result.ci:
        header += f"  {'ci lo':>12}  {'ci hi':>12}"
    print(header)
    for k, v in result.params.items():
        line = f"  {k:<{width}}  {v:>12.5g}"
        if k in result.ci:
            line += f"  {result.ci[k][0]:>12.5g}  {result.ci[k][1]:>12.5g}"
        elif k in result.fixed:
            line += "  (fixed)"
        print(line)
    if result.heldout:
        print(f"  held-out (by {result.heldout['by']}): mean abs rel error {result.heldout['mare']:.4%}")


def _print_selection(selection: Mapping[str, Any]) -> None:
    """One line per candidate law: the chosen one starred, unfittable ones with the reason."""
    ref = selection["reference"]
    print(f"law selection: held-out precision-gap MAE (nats) vs the reference ({', '.join(ref.get('recipes', [])) or ref}), "
          f"leaving out the largest N / D / budget; within noise: excess over the best <= {selection['noise_se']:g} SE")
    width = max(len(c["name"]) for c in selection["candidates"])
    print(f"  {'law':<{width}}  {'k':>2}  {'AIC(runs)':>10}  {'MARE':>7}  {'gap|N':>8}  {'gap|D':>8}  {'gap|C':>8}"
          f"  {'vs best':>18}")

    def num(v, fmt):
        return format(v, fmt) if v is not None else "-"

    for c in selection["candidates"]:
        mark = "*" if c["name"] == selection["chosen"] else " "
        if not c["fittable"]:
            print(f"{mark} {c['name']:<{width}}  not fitted: {c['reason']}")
            continue
        gap, diff = c["heldout_gap_mae"], c["gap_mae_diff"]
        versus = "-" if diff is None else "best" if mark == "*" else f"{diff['value']:+.4f} ± {diff['se']:.4f}"
        print(f"{mark} {c['name']:<{width}}  {c['n_params']:>2}  {num(c['aic'], '10.2f')}  {num(c['mare'], '7.3%')}"
              f"  {num(gap.get('N'), '8.4f')}  {num(gap.get('D'), '8.4f')}  {num(gap.get('budget'), '8.4f')}  {versus:>18}"
              f"{'  within noise' if c['within_noise'] and mark != '*' else ''}")


def bootstrap_fit(df: pd.DataFrame, result: FitResult, n: int, seed: int, loss_column: str) -> None:
    """Add bootstrap CIs to an existing fit (resamples start from its optimum, as in fit_law)."""
    problem = _prepare(df, result.law, result.fixed, loss_column)
    _add_bootstrap(problem, result, problem.theta(result.params), n, seed, 0.95,
                   result.optimizer.get("huber_delta", HUBER_DELTA))


def main(args: argparse.Namespace) -> int:
    df = results.load(args.results)
    if args.sweep is not None:
        sweeps = sorted(df["sweep"].astype(str).unique()) if "sweep" in df.columns else []
        if args.sweep not in sweeps:
            raise ConfigError("--sweep", args.sweep, f"a sweep of the results ({', '.join(sweeps) or 'none recorded'})")
        df = df[df["sweep"].astype(str) == args.sweep]
    df, loss_column = _runs_to_fit(df, args.loss_column)
    if args.bootstrap < 0:
        raise ConfigError("--bootstrap", args.bootstrap, "a count >= 0")
    fixed = _parse_fixed(args.fix)
    if args.law == "auto":
        if fixed is not None:
            raise ConfigError("--fix", args.fix, "no --fix with --law auto (name a variant: --candidate 'kumar[kappa=2]')")
        selection, fits = select(df, args.candidate or None, loss_column, args.reference, {})
        _print_selection(selection)
        if selection["chosen"] is None:
            raise ConfigError("--law", "auto", "data on which at least one candidate law can be fitted (see the table)")
        result = fits[selection["chosen"]]
        result.selection = selection
        law, fixed = result.law, result.fixed
        if args.bootstrap:
            bootstrap_fit(df, result, args.bootstrap, args.seed, loss_column)
    else:
        if args.candidate or args.reference:
            raise ConfigError("--candidate/--reference", args.candidate or args.reference, "only with --law auto")
        law = args.law
        result = fit_law(df, law, fixed=fixed, loss_column=loss_column, bootstrap=args.bootstrap, seed=args.seed)
    if args.holdout:
        result.heldout = holdout_error(df, law, by=args.holdout, fixed=fixed, loss_column=loss_column)
    result.to_json(args.output)
    _print_fit(result)
    print(f"wrote {args.output}")
    return 0
