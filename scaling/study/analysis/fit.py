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

Choosing among laws by held-out precision gaps is scaling.study.analysis.selection. One module
keeps one job, a law fitted to data: the prepared problem, the solvers, the bootstrap and the
held-out checks all work on the same `_Problem` and `FitResult`.
"""

from __future__ import annotations

import collections
import copy
import functools
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from scaling.study.analysis import laws
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


def resolve_fixed(law: laws.Law, fixed: Mapping[str, float] | None) -> dict[str, float]:
    """The params held fixed (None: the law's defaults), checked against the law, as floats."""
    fixed = dict(law.fixed if fixed is None else fixed)
    for name, value in fixed.items():
        if name not in law.params:
            raise ConfigError("fixed", name, f"params of law {law.name}: {', '.join(law.params)}")
        if name in law.positive and not value > 0:
            raise ConfigError(f"fixed.{name}", value, "> 0")
    return {k: float(v) for k, v in fixed.items()}


# Precision columns, larger = more precise; the reference recipe maximises them in this order, so a
# recipe that quantises only the weights or only the backward pass (P = 32 as well) is not the reference.
REFERENCE_ORDER = ("P", "P_fwd", "P_w", "P_a", "P_g", "P_bwd")


def highest_precision_mask(df: pd.DataFrame) -> np.ndarray:
    """Rows with the largest P, ties broken by the other precision columns (REFERENCE_ORDER), larger wins;
    every row where the table has none of them. The one definition of the default reference recipe
    (selection's gaps, a per-recipe law's multipliers fixed at 1)."""
    mask = np.ones(len(df), dtype=bool)
    for c in (c for c in REFERENCE_ORDER if c in df.columns):
        v = pd.to_numeric(df[c], errors="coerce").to_numpy(float)
        if np.isfinite(v[mask]).any():
            mask &= v == np.nanmax(v[mask])
    return mask


def recipes_reference_first(df: pd.DataFrame) -> list[str]:
    """The table's recipes, the reference first (the most common recipe among the highest-precision
    rows, highest_precision_mask; ties: alphabetical), the rest alphabetical."""
    if "recipe" not in df.columns:
        raise ConfigError("results columns", "missing recipe", "a table with a recipe column (a per-recipe law)")
    recipes = df["recipe"].astype(str)
    top = recipes[highest_precision_mask(df)].value_counts()
    ref = sorted(top.index[top == top.max()])[0] if len(top) else None
    return ([ref] if ref is not None else []) + sorted(set(recipes) - {ref})


def _recipe_codes(law: laws.Law, df: pd.DataFrame) -> np.ndarray:
    """Each row's recipe as its index in law.recipes; a recipe the law was not fitted on is refused."""
    known = {r: i for i, r in enumerate(law.recipes)}
    recipes = df["recipe"].astype(str).to_numpy()
    unseen = sorted(set(recipes) - set(known))
    if unseen:
        raise ConfigError("recipe", unseen[0], f"a recipe law {law.name} was fitted on ({', '.join(law.recipes)})")
    return np.array([known[r] for r in recipes], dtype=float)


def _columns(law: laws.Law, df: pd.DataFrame, require_rows: bool = True) -> dict[str, np.ndarray]:
    df = laws.with_derived_columns(df, law.columns)  # e.g. capacity_roles' errors from the telemetry SNR
    missing = [c for c in law.columns if c not in df.columns]
    if missing:
        raise ConfigError("results columns", f"missing {', '.join(missing)}", f"a table with {', '.join(law.columns)} (law {law.name})")
    x = {}
    for c in law.columns:
        if c == "recipe" and law.per_recipe:
            x[c] = _recipe_codes(law, df)
            continue
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
    if law.per_recipe and not law.recipes:  # one eN[r], eD[r] per recipe present, the reference's fixed at 1
        law = law.for_recipes(recipes_reference_first(df))
    fixed = {**{k: v for k, v in law.fixed.items() if law.per_recipe and "[" in k}, **resolve_fixed(law, fixed)}
    x = _columns(law, df)
    if loss_column not in df.columns:
        losses = [str(c) for c in df.columns if "loss" in str(c)]
        raise ConfigError("loss column", loss_column,
                          f"a column of the table ({', '.join(losses[:6])})" if losses else "a column of the table (it has none named *loss*)")
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
    law = problem.law
    # a per-recipe param's base name (kumar_eff's eN) sets the starts of every recipe's
    init = {e: v for k, v in (init or {}).items()
            for e in ([f"{k}[{r}]" for r in law.recipes] if k in law.per_recipe else [k])}
    grid = {**law.init_grid, **{k: tuple(v) for k, v in init.items()}}
    for k in init:
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

    law = laws.get(law_name).for_params(free + fixed_names)  # a per-recipe law: expanded for its recipes
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

    from scaling.train import data  # lazy: `scaling fit --help` loads no JAX

    data.use_compilation_cache()  # each law's solver compiles for seconds: the next fit loads it
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
    degenerate: str | None = None  # why no optimum may be derived from this fit (`degenerate_reason`); None: sound

    @property
    def law_form(self) -> laws.Law:
        """The registered law, expanded for the recipes it was fitted on where it has per-recipe params."""
        return laws.get(self.law).for_params(self.params)

    def predict(self, df: pd.DataFrame) -> np.ndarray:
        """The law's loss at df's rows; a per-recipe law refuses a recipe it was not fitted on (ConfigError)."""
        law = self.law_form
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
        return s[[p for p in self.law_form.params if p in s.columns]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "law": self.law, "params": self.params, "fixed": self.fixed, "objective": self.objective,
            "residuals": [float(r) for r in self.residuals],
            "ci": {k: list(v) for k, v in self.ci.items()}, "bootstrap": self.bootstrap,
            "data": self.data, "heldout": self.heldout, "optimizer": self.optimizer,
            "selection": self.selection, "degenerate": self.degenerate,
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
                   optimizer=d.get("optimizer") or {}, selection=d.get("selection"),
                   degenerate=d.get("degenerate"))

    @classmethod
    def from_json(cls, path: str | Path) -> FitResult:
        path = Path(path)
        if not path.is_file():
            raise ConfigError("fit", str(path), "an existing fit JSON (from `scaling fit ... -o`)")
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except json.JSONDecodeError as e:
            raise ConfigError("fit", str(path), f"valid JSON ({e.msg} at line {e.lineno})") from None


# ----------------------------------------------------------------------------- degenerate fits

EXPONENTS = ("alpha", "beta")  # power-law exponents: a fit where one is <= 0 has no scaling to extrapolate
# A positive param is optimised as its log, so its bound 0 is never reached exactly: a value below this
# fraction of the smallest value it started from has run off towards it.
AT_BOUND = 1e-4
COLLAPSED_CI = 1e-4  # a CI narrower than this fraction of its value: the resamples never moved it
# A CI narrower than this fraction of the narrowest the fitted data allow (`_narrowest_ci`): the resamples
# stalled on a direction the data barely constrain. The bound is a floor the data cannot beat even with
# every other param known and every point as sensitive as the most sensitive corner of their range, so
# an honest CI sits above it, or near it (a term alive only at the smallest N can come within a
# factor of ten); a stalled one sits orders of magnitude below (a floor resampled to the same value to
# five digits is about 1e-5 of it).
BELOW_DATA_RESOLUTION = 1e-2


def _narrowest_ci(result: FitResult, law: laws.Law, name: str) -> float | None:
    """The narrowest CI of free param `name` that the fitted data allow (log scale for a positive param):
    z·s/(sqrt(n)·g), s the RMS of the fit's log-loss residuals, n its points, g the largest
    |d log L / d theta| over the box of its columns' recorded (min, median, max), z the two-sided normal
    width at the bootstrap's level (3.92 at 95%). That is the CI with every other param known (the
    conditional information never exceeds the marginal) and every point as informative as the most
    sensitive one. None where the fit does not record its residuals or its columns' ranges."""
    cols = (result.data or {}).get("columns") or {}
    resid = np.asarray(result.residuals, float)
    n = (result.data or {}).get("n_points") or resid.size
    if resid.size == 0 or not n or any(c not in cols or "min" not in cols[c] for c in law.columns):
        return None
    grid = [[float(i) for i in range(len(law.recipes))] if c == "recipe" and law.per_recipe else
            sorted({float(cols[c]["min"]), float(cols[c].get("median", cols[c]["min"])), float(cols[c]["max"])})
            for c in law.columns]
    box = np.array(list(itertools.product(*grid)), float).T
    x = dict(zip(law.columns, box))
    value, h = result.params[name], 1e-6
    moved = dict(result.params, **{name: value * np.exp(h) if name in law.positive else value + h * max(1.0, abs(value))})
    with np.errstate(all="ignore"):
        slope = (np.asarray(law.log_predict(moved, x, np)) - np.asarray(law.log_predict(result.params, x, np))) / h
        if name not in law.positive:
            slope = slope / max(1.0, abs(value))
    slope = np.abs(slope[np.isfinite(slope)])
    if slope.size == 0 or not slope.max() > 0:
        return None
    level = float((result.bootstrap or {}).get("level", 0.95))
    z = 2 * NormalDist().inv_cdf(0.5 + level / 2)
    return float(z * np.sqrt(np.mean(resid ** 2)) / (np.sqrt(n) * slope.max()))


def degenerate_reason(result: FitResult) -> str | None:
    """Why no optimum, figure or plan may be derived from a fit, or None for a sound one: a free param
    that is not finite, a positive param at its bound 0 (or a CI reaching it), a power-law exponent
    <= 0, or a bootstrap CI collapsed (a flat direction the resamples never left). Collapsed, for every
    law and free param alike: narrower than COLLAPSED_CI of its value, or, where the fit records its
    residuals and data ranges, narrower than BELOW_DATA_RESOLUTION of the narrowest CI those data allow
    (`_narrowest_ci`; width in log for a positive param)."""
    law = result.law_form
    free = [(name, result.params.get(name, np.nan)) for name in law.free_params(result.fixed)]
    floor = {name: AT_BOUND * min(law.init_grid[name]) for name, _ in free if name in law.positive}
    for name, value in free:
        if not np.isfinite(value):
            return f"{name} = {value} is not finite"
    for name, value in free:  # the most telling reason first: no scaling at all
        if name in EXPONENTS and value <= 0:
            return f"exponent {name} = {value:.3g} <= 0 (the loss does not fall with scale)"
    for name, value in free:
        if name in floor and value < floor[name]:
            return f"{name} = {value:.3g} is at its bound 0"
    for name, value in free:
        if name in result.ci:
            lo, hi = result.ci[name]
            if name in floor and lo < floor[name]:
                return f"the CI of {name} ({lo:.3g} to {hi:.3g}) reaches its bound 0"
            if abs(hi - lo) < COLLAPSED_CI * abs(value):
                return f"the CI of {name} ({lo:.6g} to {hi:.6g}) has collapsed to its value"
            narrowest = _narrowest_ci(result, law, name)
            width = (np.log(hi / lo) if lo > 0 else np.inf) if name in law.positive else hi - lo
            if narrowest is not None and width < BELOW_DATA_RESOLUTION * narrowest:
                scale = " in log" if name in law.positive else ""
                return (f"the CI of {name} ({lo:.6g} to {hi:.6g}) has collapsed: {width:.2g} wide{scale}, "
                        f"{width / narrowest:.1g} of the narrowest ({narrowest:.2g}) its data allow")
    return None


# What published Chinchilla-form fits put the exponents at. Each of alpha, beta lies in 0.07-0.7
# (Kaplan et al. 2020 0.076/0.095; Hoffmann et al. 2022 0.34/0.28; Besiroglu et al. 2024 0.35/0.37;
# Kumar et al. 2024 0.2-0.5), so one above 1 (loss falling faster than 1/N or 1/D) is implausible. The
# compute split N* ∝ C^(beta / (alpha + beta)): Hoffmann et al. 2022 find 0.46-0.50, Kaplan et al. 2020 0.73.
PLAUSIBLE_EXPONENT = 1.0
LITERATURE_SPLIT = (0.4, 0.75)


def exponent_note(result: FitResult) -> str | None:
    """Why a fit's exponents are unlike every published law's (a note, not a refusal: the fit may still
    describe its own data), or None; None too for a law without both exponents. A fit with a note is
    not extrapolated to cluster scale."""
    params = result.params
    if not set(EXPONENTS) <= set(params):
        return None
    high = [f"{name} = {params[name]:.3g}" for name in EXPONENTS if params[name] > PLAUSIBLE_EXPONENT]
    if high:
        return (f"implausible exponent{'s' if len(high) > 1 else ''} {', '.join(high)} > {PLAUSIBLE_EXPONENT:g} "
                "(the loss would fall faster than 1/N or 1/D; published fits: 0.07-0.7)")
    a, b = params["alpha"], params["beta"]
    if a <= 0 or b <= 0:
        return None  # degenerate_reason says why
    split = b / (a + b)
    if not LITERATURE_SPLIT[0] <= split <= LITERATURE_SPLIT[1]:
        return f"N* ∝ C^{split:.2f}, outside the published {LITERATURE_SPLIT[0]:g}-{LITERATURE_SPLIT[1]:g}"
    return None


def literature_exponents(result: FitResult | None) -> bool:
    """Whether a fit's exponents are positive and split compute between N and D as the published laws do,
    so its optimum may be extrapolated to cluster scale."""
    return (result is not None and set(EXPONENTS) <= set(result.params) and min(result.params[n] for n in EXPONENTS) > 0
            and exponent_note(result) is None)


def data_summary(df: pd.DataFrame, law: str, fixed: Mapping[str, float] | None = None,
                 loss_column: str = "val_loss") -> dict[str, Any]:
    """What fit_law records of the data `law` is fitted on (`FitResult.data`): points, units, each column's
    min, max and median (a law read at a hypothetical format takes its block size from here), the runs'
    unquantised share."""
    return {**_data_summary(_prepare(df, law, fixed, loss_column)), **_share(df)}


def _data_summary(problem: _Problem) -> dict[str, Any]:
    cols = {c: {"min": float(v.min()), "max": float(v.max()), "median": float(np.median(v)),
                "n_unique": int(len(np.unique(v)))} for c, v in problem.x.items()}
    loss = np.exp(problem.log_loss)
    cols["loss"] = {"min": float(loss.min()), "max": float(loss.max()), "median": float(np.median(loss))}
    return {"n_points": int(len(loss)), "n_units": int(len(np.unique(problem.units))), "columns": cols}


SHARE_KEY = "unquantised_share"  # FitResult.data's key of the fitted runs' compute.UnquantisedShare


def stored_share(data: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The unquantised share a fit's data records (compute.UnquantisedShare.to_dict()), or None."""
    data = data or {}
    return data.get(SHARE_KEY) or data.get("shape")  # "shape": the key of fits written before the rename


def _share(df: pd.DataFrame) -> dict[str, Any]:
    """The fitted runs' unquantised FLOPs per dense FLOP by N (compute.UnquantisedShare), which
    scaling.study.analysis.pstar.optimal needs to cost a hypothetical model like the runs it was fitted on; {} for
    tables without FLOPs by part."""
    share = compute.UnquantisedShare.from_results(df)
    return {SHARE_KEY: share.to_dict()} if share.knots_N else {}


# ----------------------------------------------------------------------------- fitting

# fit_law's results by their inputs, newest last: in one process the same fit is asked for more than once
# (law selection fits every candidate on all rows, then the chosen fit and the report's specification fits
# ask again; tests write several reports from one table). A pure function of its inputs, so a repeat is a
# copy of the first answer, bit for bit.
_FITTED: collections.OrderedDict[tuple, tuple[laws.Law, FitResult]] = collections.OrderedDict()
FITTED_KEPT = 32


def _fit_key(df: pd.DataFrame, law: str | laws.Law, args: tuple) -> tuple | None:
    """What a fit is a function of: the table's contents (values, index, column names and dtypes), the
    registered law (by identity: a test may register another under the same name) and the arguments.
    None where a column cannot be hashed (a fit then runs uncached)."""
    try:
        rows = pd.util.hash_pandas_object(df, index=True).to_numpy().tobytes()
        columns = tuple((str(c), str(t)) for c, t in df.dtypes.items())
        form = laws.get(law) if isinstance(law, str) else law
        return (hashlib.sha256(rows).hexdigest(), columns, form.name, id(form), json.dumps(args, sort_keys=True, default=repr))
    except (TypeError, ValueError, ConfigError):
        return None


def fit_law(df: pd.DataFrame, law: str | laws.Law = "kumar", *, fixed: Mapping[str, float] | None = None,
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
    A fit asked for again with the same inputs in the same process is a copy of the first (`_FITTED`).
    """
    args = (None if fixed is None else dict(fixed), None if init is None else {k: list(v) for k, v in init.items()},
            loss_column, delta, list(iters), keep, polish, bootstrap, seed, level)
    key = _fit_key(df, law, args)
    if key is not None and key in _FITTED:
        _FITTED.move_to_end(key)
        return copy.deepcopy(_FITTED[key][1])
    result = _fit(df, law, fixed=fixed, init=init, loss_column=loss_column, delta=delta, iters=iters, keep=keep,
                  polish=polish, bootstrap=bootstrap, seed=seed, level=level)
    if key is not None:
        form = laws.get(law) if isinstance(law, str) else law
        _FITTED[key] = (form, copy.deepcopy(result))  # the law kept alive: its id in the key is not reused
        while len(_FITTED) > FITTED_KEPT:
            _FITTED.popitem(last=False)
    return result


def _fit(df: pd.DataFrame, law: str | laws.Law, *, fixed: Mapping[str, float] | None, init: Mapping[str, Sequence[float]] | None,
         loss_column: str, delta: float, iters: tuple[int, int], keep: float, polish: int, bootstrap: int, seed: int,
         level: float) -> FitResult:
    """fit_law, uncached."""
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
        data={**_data_summary(problem), **_share(df)},
        optimizer={"method": "batched L-BFGS (JAX) over the init grid + scipy L-BFGS-B float64 polish",
                   "n_starts": int(len(starts)), "iters": list(iters), "keep": keep, "polished": polish,
                   "huber_delta": delta, "loss_column": loss_column,
                   "init": {name: sorted({round(float(v), 12) for v in starts[:, i]}) for i, name in enumerate(problem.free)}},
    )
    if bootstrap:
        _add_bootstrap(problem, result, best_theta, bootstrap, seed, level, delta)
    result.degenerate = degenerate_reason(result)
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
        # no standard deviation: a positive parameter's resamples can span hundreds of orders of
        # magnitude where the data barely identify it (A ~ 1e200 at alpha ~ 25 on 12 runs), so its
        # square overflows and says nothing; the percentile CI above is the spread
        "median": {name: float(np.median(v)) for name, v in samples.items()},
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
    law_obj = laws.get(law).for_params(params)
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


def bootstrap_fit(df: pd.DataFrame, result: FitResult, n: int, seed: int, loss_column: str) -> None:
    """Add bootstrap CIs to an existing fit (resamples start from its optimum, as in fit_law)."""
    problem = _prepare(df, result.law, result.fixed, loss_column)
    _add_bootstrap(problem, result, problem.theta(result.params), n, seed, 0.95,
                   result.optimizer.get("huber_delta", HUBER_DELTA))
    result.degenerate = degenerate_reason(result)
