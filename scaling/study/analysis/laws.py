"""Scaling-law forms L(N, D, P, ...): each a small pure function of named params, plus a registry.

A law is written as the *log-terms* of a sum of positive terms, L = sum_k exp(t_k), so the
fitter predicts log L = logsumexp_k t_k without overflow (A·N^-alpha is computed as
log A - alpha·log N). The function takes `p` (param name -> value, natural scale) and `x`
(column name -> array) and an array namespace `xp` (numpy or jax.numpy), so the same code
is evaluated by numpy (prediction, optimal precision) and by jit/vmap'd JAX (fitting).

Register a new form in a few lines:

    @laws.register(params=("E", "A", "alpha"), positive=("E", "A"), columns=("N",),
                   init_grid={"E": [1.0, 2.0], "A": [10.0, 1e3], "alpha": [0.2, 0.5]})
    def my_law(p, x, xp):
        '''L = E + A·N^-alpha'''
        return [xp.log(p["E"]), xp.log(p["A"]) - p["alpha"] * xp.log(x["N"])]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
from scipy.optimize import brentq

from scaling.errors import ConfigError
from scaling.train.compute import UNQUANTISED_BITS  # one definition: the bits of a part no recipe quantises

LogTerms = Callable[[Mapping[str, Any], Mapping[str, Any], Any], Sequence[Any]]

# Columns that state a precision in bits: a law reading one has a bits axis (Law.bits_axis).
BITS_COLUMNS = ("P", "P_w", "P_a", "P_g", "P_fwd", "P_bwd", "ebits", "mbits")


@dataclass(frozen=True)
class Law:
    """A registered law form.

    params: all parameter names (including ones a fit may hold fixed, such as kumar's kappa).
    positive: params constrained > 0; the fitter optimises their logarithm.
    columns: DataFrame columns the law reads (besides `loss`).
    init_grid: param -> starting values (natural scale); the fitter starts from their product.
    fixed: params held fixed by default (name -> value); pass `fixed={}` to fit_law to free them.
    varying: column groups of which at least one column must take two or more values for the law's
        params to be identifiable (default: every column on its own). selection.select_law lists a law whose
        group is constant on the data as not fittable instead of fitting a flat direction.
    """

    name: str
    log_terms: LogTerms
    params: tuple[str, ...]
    positive: frozenset[str]
    columns: tuple[str, ...]
    init_grid: Mapping[str, tuple[float, ...]]
    fixed: Mapping[str, float] = field(default_factory=dict)
    doc: str = ""
    varying: tuple[tuple[str, ...], ...] = ()
    # per_recipe: params the law has once per recipe (kumar_eff's eN, eD; recipe_gap's k), held at
    # per_recipe_reference's value (default 1, a multiplier) for the reference recipe. The registered law
    # declares the base names; `for_recipes` expands them into `name[recipe]` params for the recipes a
    # table holds (the reference's fixed), positive where the base name is, and `log_predict` hands
    # log_terms each as a per-row value read off the `recipe` column.
    per_recipe: tuple[str, ...] = ()
    per_recipe_reference: Mapping[str, float] = field(default_factory=dict)
    recipes: tuple[str, ...] = ()  # the recipes of an expanded law (for_recipes), sorted: rows hold codes into it
    # nests: the registered law this one reduces to at a boundary of its params (kumar -> chinchilla as
    # gamma -> 0; kumar_data -> kumar as C_T -> 0): selection tests the extra term with a likelihood test.
    nests: str | None = None

    def for_recipes(self, recipes: Sequence[str], reference: str | None = None) -> "Law":
        """This per-recipe law expanded for `recipes`: `recipes` sorted (row codes index them), params
        `name[recipe]` for each, those of `reference` (default the first given) fixed at the reference value
        (per_recipe_reference, default 1)."""
        if not self.per_recipe:
            return self
        given = [str(r) for r in recipes]
        if not given:
            raise ConfigError(f"laws.{self.name}.recipes", [], "at least the reference recipe")
        ordered = tuple(sorted(set(given)))
        reference = given[0] if reference is None else str(reference)
        expanded = tuple(f"{n}[{r}]" for n in self.per_recipe for r in ordered)
        grid = {k: v for k, v in self.init_grid.items() if k not in self.per_recipe}
        grid.update({f"{n}[{r}]": self.init_grid.get(n, (1.0,)) for n in self.per_recipe for r in ordered})
        fixed = {k: v for k, v in self.fixed.items() if k not in self.per_recipe}
        fixed.update({f"{n}[{reference}]": float(self.per_recipe_reference.get(n, 1.0)) for n in self.per_recipe})
        positive = {f"{n}[{r}]" for n in self.per_recipe if n in self.positive for r in ordered}
        return replace(self, params=tuple(p for p in self.params if p not in self.per_recipe) + expanded,
                       init_grid=grid, fixed=fixed, recipes=ordered,
                       positive=(self.positive - set(self.per_recipe)) | positive)

    def for_params(self, names: Iterable[str]) -> "Law":
        """The expanded law whose params are `names` (a fit's params, the reference's fixed ones included):
        its recipes read off the `name[recipe]` keys (codes index them sorted, so any order of `names`
        gives the same law)."""
        if not self.per_recipe:
            return self
        first = self.per_recipe[0]
        return self.for_recipes([n[len(first) + 1:-1] for n in names if n.startswith(first + "[") and n.endswith("]")])

    @property
    def bits_axis(self) -> bool:
        """Whether the law reads precision as bits (a column of BITS_COLUMNS), so that it can be evaluated
        at a hypothetical precision and a compute-optimal P* is continuous. A law on quantisation errors
        (capacity, capacity_roles) can only rank the measured recipes; chinchilla has no precision term."""
        return bool(set(BITS_COLUMNS) & set(self.columns))

    @property
    def error_columns(self) -> tuple[str, ...]:
        """The law's quantisation-error columns (QERR_COLUMNS or MEASURED_QERR_COLUMNS): what a measured
        recipe supplies when the law is read at that recipe."""
        return tuple(c for c in self.columns if c in QERR_COLUMNS + MEASURED_QERR_COLUMNS)

    @property
    def precision_axis(self) -> str | None:
        """'bits', 'quantisation error', 'recipe' (a fitted efficiency or gap per recipe) or None (no precision term)."""
        if self.bits_axis:
            return "bits"
        return "quantisation error" if self.error_columns else "recipe" if self.per_recipe else None

    @property
    def per_recipe_term(self) -> str | None:
        """What a per-recipe law fits per recipe: "gap" (additive, 0 for the reference: recipe_gap) or
        "efficiency" (a multiplier, 1 for the reference: kumar_eff); None for other laws."""
        if not self.per_recipe:
            return None
        return "gap" if self.per_recipe_reference and not any(self.per_recipe_reference.values()) else "efficiency"

    @property
    def no_bits_reason(self) -> str | None:
        """Why the law has no loss at a hypothetical bit width (so no P* and no profile), or None where it does."""
        if self.bits_axis:
            return None
        if self.error_columns:
            return (f"the {self.name} law prices precision by measured quantisation error, not bits, so it has no "
                    "loss at a format it was not measured at")
        if self.per_recipe:
            return (f"the {self.name} law prices precision by a fitted {self.per_recipe_term} per recipe, not bits, so it has no "
                    "loss at a format it was not fitted on")
        return f"the {self.name} law has no precision term"

    def free_params(self, fixed: Mapping[str, float]) -> tuple[str, ...]:
        return tuple(p for p in self.params if p not in fixed)

    def log_predict(self, p: Mapping[str, Any], x: Mapping[str, Any], xp: Any = np) -> Any:
        """log L = logsumexp of the law's log-terms (stable for any magnitude of the terms). A per-recipe
        law's x["recipe"] holds codes into self.recipes (fit._columns)."""
        if self.per_recipe:
            p = dict(p)
            for name in self.per_recipe:
                p[name] = sum(xp.where(x["recipe"] == i, p[f"{name}[{r}]"], 0.0) for i, r in enumerate(self.recipes))
        terms = [t + xp.zeros_like(x[self.columns[0]]) for t in self.log_terms(p, x, xp)]
        stacked = xp.stack(terms)
        m = xp.max(stacked, axis=0)
        return m + xp.log(xp.sum(xp.exp(stacked - m), axis=0))

    def predict(self, p: Mapping[str, Any], x: Mapping[str, Any], xp: Any = np) -> Any:
        return xp.exp(self.log_predict(p, x, xp))


_REGISTRY: dict[str, Law] = {}


def register(
    params: Sequence[str],
    columns: Sequence[str],
    init_grid: Mapping[str, Iterable[float]],
    positive: Iterable[str] = (),
    fixed: Mapping[str, float] | None = None,
    name: str | None = None,
    varying: Sequence[Sequence[str]] | None = None,
    per_recipe: Sequence[str] = (),
    nests: str | None = None,
    per_recipe_reference: Mapping[str, float] | None = None,
) -> Callable[[LogTerms], LogTerms]:
    """Decorator: register `fn(p, x, xp) -> list of log-terms` as a law named `name or fn.__name__`.
    per_recipe: params the law has once per recipe (Law.per_recipe; a `recipe` column is then one of
    `columns`), positive only where listed in `positive`; per_recipe_reference: their value at the
    reference recipe (default 1); nests: the law this one reduces to at a boundary of its params (Law.nests)."""

    def decorate(fn: LogTerms) -> LogTerms:
        law_name = name or fn.__name__
        grid = {k: tuple(float(v) for v in vals) for k, vals in init_grid.items()}
        missing = [p for p in params if p not in grid]
        if missing:
            raise ConfigError(f"laws.{law_name}.init_grid", sorted(grid), f"a grid for every param, missing {missing}")
        if per_recipe and "recipe" not in columns:
            raise ConfigError(f"laws.{law_name}.columns", list(columns), "a `recipe` column (the law has per-recipe params)")
        pos = frozenset(positive)
        reference = dict(per_recipe_reference or {})
        stray_ref = sorted(set(reference) - set(per_recipe))
        if stray_ref:
            raise ConfigError(f"laws.{law_name}.per_recipe_reference", stray_ref, f"per-recipe params: {list(per_recipe)}")
        for p in set(per_recipe) & pos:
            if not reference.get(p, 1.0) > 0:
                raise ConfigError(f"laws.{law_name}.per_recipe_reference.{p}", reference[p], "> 0 (param is positive)")
        groups = tuple(tuple(g) for g in varying) if varying is not None else tuple((c,) for c in columns)
        stray = sorted({c for g in groups for c in g} - set(columns))
        if stray:
            raise ConfigError(f"laws.{law_name}.varying", stray, f"columns of the law: {', '.join(columns)}")
        for p in pos:
            if any(v <= 0 for v in grid[p]):
                raise ConfigError(f"laws.{law_name}.init_grid.{p}", grid[p], "positive values (param is positive)")
        _REGISTRY[law_name] = Law(
            name=law_name, log_terms=fn, params=tuple(params), positive=pos, columns=tuple(columns),
            init_grid=grid, fixed=dict(fixed or {}), doc=(fn.__doc__ or "").strip(), varying=groups,
            per_recipe=tuple(per_recipe), per_recipe_reference=reference, nests=nests,
        )
        return fn

    return decorate


def has_bits_axis(name: str) -> bool:
    """Law.bits_axis of a registered law: whether its P* is continuous in bits."""
    return get(name).bits_axis


def get(name: str) -> Law:
    if name not in _REGISTRY:
        raise ConfigError("law", name, sorted(_REGISTRY))
    return _REGISTRY[name]


def names() -> list[str]:
    return sorted(_REGISTRY)


def _exp_grid(logs: Iterable[float]) -> list[float]:
    return [math.exp(v) for v in logs]


# Besiroglu et al. 2024 / Hoffmann et al. 2022 grid: alpha, beta in {0, .5, ..., 2}, log E in
# {-1, -.5, ..., 1}, log A, log B in {0, 5, ..., 25}: 5·5·5·6·6 = 4,500 starts.
CHINCHILLA_GRID = {
    "E": _exp_grid([-1.0, -0.5, 0.0, 0.5, 1.0]),
    "A": _exp_grid([0.0, 5.0, 10.0, 15.0, 20.0, 25.0]),
    "B": _exp_grid([0.0, 5.0, 10.0, 15.0, 20.0, 25.0]),
    "alpha": [0.0, 0.5, 1.0, 1.5, 2.0],
    "beta": [0.0, 0.5, 1.0, 1.5, 2.0],
}


@register(params=("E", "A", "B", "alpha", "beta"), positive=("E", "A", "B"), columns=("N", "D"),
          init_grid=CHINCHILLA_GRID)
def chinchilla(p, x, xp):
    """Hoffmann et al. 2022: L = E + A·N^-alpha + B·D^-beta."""
    return [xp.log(p["E"]), xp.log(p["A"]) - p["alpha"] * xp.log(x["N"]),
            xp.log(p["B"]) - p["beta"] * xp.log(x["D"])]


# Smaller than Chinchilla's grid per axis (gamma adds an axis): 3·4·4·3·3·4 = 1,728 starts.
_KUMAR_GRID = {
    "E": _exp_grid([-1.0, 0.0, 1.0]),
    "A": _exp_grid([0.0, 5.0, 10.0, 20.0]),
    "B": _exp_grid([0.0, 5.0, 10.0, 20.0]),
    "alpha": [0.1, 0.5, 1.0],
    "beta": [0.1, 0.5, 1.0],
    "gamma": [0.5, 1.0, 2.0, 4.0],
}


def log_precision_factor(P, gamma, kappa, xp):
    """log (1 - e^(-P/gamma))^kappa, via expm1 so small P/gamma keeps its digits."""
    return kappa * xp.log(-xp.expm1(-P / gamma))


@register(params=("E", "A", "B", "alpha", "beta", "gamma", "kappa"),
          positive=("E", "A", "B", "gamma", "kappa"), columns=("N", "D", "P"),
          init_grid={**_KUMAR_GRID, "kappa": [1.0, 3.0]}, fixed={"kappa": 3.0}, nests="chinchilla")
def kumar(p, x, xp):
    """Kumar et al. 2024, one precision P shared by the quantised tensors:
    L = E + A·N_eff^-alpha + B·D^-beta,  N_eff = N·(1 - e^(-P/gamma))^kappa.

    kappa = number of tensor roles sharing P (3: weights, activations, gradients), fixed by default.
    At fixed compute C ∝ N·D·P the sweet spot maximises (1 - e^(-P/gamma))^kappa / P:
    P* = gamma·x with e^x - 1 = kappa·x (kappa = 3: x ≈ 1.904); for kappa <= 1 there is no
    interior optimum and the lowest allowed P wins.
    """
    log_n_eff = xp.log(x["N"]) + log_precision_factor(x["P"], p["gamma"], p["kappa"], xp)
    return [xp.log(p["E"]), xp.log(p["A"]) - p["alpha"] * log_n_eff,
            xp.log(p["B"]) - p["beta"] * xp.log(x["D"])]


# kumar's grid plus two values per penalty param: 3·3·3·2·2·2·2·2·2·2 = 3,456 starts (kappa fixed).
_KUMAR_DATA_GRID = {
    **_KUMAR_GRID,
    "A": _exp_grid([0.0, 10.0, 20.0]), "B": _exp_grid([0.0, 10.0, 20.0]),
    "alpha": [0.2, 0.6], "beta": [0.2, 0.6], "gamma": [1.0, 3.0],
    "C_T": [0.01, 1.0], "gamma_D": [0.2, 0.6], "gamma_N": [0.2, 0.6], "gamma_P": [1.0, 3.0],
}


@register(params=("E", "A", "B", "alpha", "beta", "gamma", "kappa", "C_T", "gamma_D", "gamma_N", "gamma_P"),
          positive=("E", "A", "B", "gamma", "kappa", "C_T", "gamma_P"), columns=("N", "D", "P"),
          init_grid={**_KUMAR_DATA_GRID, "kappa": [1.0, 3.0]}, fixed={"kappa": 3.0}, nests="kumar")
def kumar_data(p, x, xp):
    """Kumar et al. 2024 with their data-dependent degradation term (their post-training-quantisation
    penalty delta_PTQ, applied here to the training precision P):
    L = E + A·N_eff^-alpha + B·D^-beta + C_T·(D^gamma_D / N^gamma_N)·e^(-P/gamma_P),
    N_eff = N·(1 - e^(-P/gamma))^kappa as in kumar (kappa fixed 3 by default).

    For gamma_D > 0 the precision penalty grows with the data seen at fixed N (overtrained models are
    more sensitive to quantisation), unlike kumar, whose gap to high precision does not depend on D.
    gamma_D and gamma_N are left signed so that the fit, not the form, says which way the penalty goes.
    """
    log_n_eff = xp.log(x["N"]) + log_precision_factor(x["P"], p["gamma"], p["kappa"], xp)
    log_d, log_n = xp.log(x["D"]), xp.log(x["N"])
    return [xp.log(p["E"]), xp.log(p["A"]) - p["alpha"] * log_n_eff,
            xp.log(p["B"]) - p["beta"] * log_d,
            xp.log(p["C_T"]) + p["gamma_D"] * log_d - p["gamma_N"] * log_n - x["P"] / p["gamma_P"]]


@register(params=("E", "A", "B", "alpha", "beta", "gamma_w", "gamma_a", "gamma_g"),
          positive=("E", "A", "B", "gamma_w", "gamma_a", "gamma_g"),
          columns=("N", "D", "P_w", "P_a", "P_g"),
          init_grid={**{k: v for k, v in _KUMAR_GRID.items() if k != "gamma"},
                     "A": _exp_grid([0.0, 10.0, 20.0]), "B": _exp_grid([0.0, 10.0, 20.0]),
                     "gamma_w": [1.0, 3.0], "gamma_a": [1.0, 3.0], "gamma_g": [1.0, 3.0]})
def kumar_roles(p, x, xp):
    """Kumar et al. 2024 with one precision per tensor role (weights, activations, gradients):
    L = E + A·N_eff^-alpha + B·D^-beta,
    N_eff = N·(1 - e^(-P_w/gamma_w))·(1 - e^(-P_a/gamma_a))·(1 - e^(-P_g/gamma_g)).
    """
    log_n_eff = xp.log(x["N"])
    for role in ("w", "a", "g"):
        log_n_eff = log_n_eff + log_precision_factor(x[f"P_{role}"], p[f"gamma_{role}"], 1.0, xp)
    return [xp.log(p["E"]), xp.log(p["A"]) - p["alpha"] * log_n_eff,
            xp.log(p["B"]) - p["beta"] * xp.log(x["D"])]


# Chinchilla-like axes at 3 values (A, B, E) or 2 (exponents), 2 per efficiency param: 3·3·3·2·2·2·2 = 432.
_SMALL_CHINCHILLA_GRID = {
    "E": _exp_grid([-1.0, 0.0, 1.0]), "A": _exp_grid([0.0, 10.0, 20.0]), "B": _exp_grid([0.0, 10.0, 20.0]),
    "alpha": [0.2, 0.6], "beta": [0.2, 0.6],
}


@register(params=("E", "A", "B", "alpha", "beta", "gamma_N", "gamma_D"),
          positive=("E", "A", "B", "gamma_N", "gamma_D"), columns=("N", "D", "P_fwd", "P_bwd"),
          init_grid={**_SMALL_CHINCHILLA_GRID, "gamma_N": [1.0, 3.0], "gamma_D": [1.0, 3.0]})
def quartet(p, x, xp):
    """Castro et al. 2025 (Quartet): the forward pass's precision scales parameter efficiency, the
    backward pass's scales data efficiency:
    L = E + A·(N·eff_N(P_fwd))^-alpha + B·(D·eff_D(P_bwd))^-beta,
    eff_N(P) = 1 - e^(-P/gamma_N),  eff_D(P) = 1 - e^(-P/gamma_D)   (both in (0, 1], -> 1 at high P).

    Quartet fits eff_N and eff_D as one free number per training scheme (and an outer exponent on the
    sum of the two power terms); here each efficiency is Kumar et al.'s saturating form in the pass's
    element bits (kappa = 1), so a fit extrapolates to precisions it has not seen and stays identifiable
    with a handful of formats. P_fwd = max(P_w, P_a), P_bwd = P_g (32 where gradients are unquantised).
    """
    log_n_eff = xp.log(x["N"]) + log_precision_factor(x["P_fwd"], p["gamma_N"], 1.0, xp)
    log_d_eff = xp.log(x["D"]) + log_precision_factor(x["P_bwd"], p["gamma_D"], 1.0, xp)
    return [xp.log(p["E"]), xp.log(p["A"]) - p["alpha"] * log_n_eff,
            xp.log(p["B"]) - p["beta"] * log_d_eff]


@register(params=("E", "A", "B", "alpha", "beta", "eN", "eD"), positive=("E", "A", "B", "eN", "eD"),
          columns=("N", "D", "recipe"), init_grid={**_SMALL_CHINCHILLA_GRID, "eN": [1.0], "eD": [1.0]},
          per_recipe=("eN", "eD"), nests="chinchilla")
def kumar_eff(p, x, xp):
    """A fitted efficiency per recipe (Castro et al. 2025, Quartet, and Quartet II: "effective parameter /
    data multipliers"): L = E + A·(N·eN_r)^-alpha + B·(D·eD_r)^-beta, one eN_r and eD_r per recipe r,
    both 1 for the reference (highest-precision) recipe.

    Recipes of equal bits can differ (NVFP4 with and without its rotations, MXFP4 on weights or on
    activations): no form in bits ties them together. The price: no bits axis, so no continuous P*; it
    ranks the recipes it was fitted on and refuses any other. 2 params per recipe beyond Chinchilla.
    Named for Kumar et al.'s effective parameter count, here measured per recipe, not modelled in P.
    """
    return [xp.log(p["E"]), xp.log(p["A"]) - p["alpha"] * (xp.log(x["N"]) + xp.log(p["eN"])),
            xp.log(p["B"]) - p["beta"] * (xp.log(x["D"]) + xp.log(p["eD"]))]


# |log of the gap's scale D^gamma_D/N^gamma_N| kept under this: a wild start of the float32 ranking pass
# stays finite (e^60 ~ 1e26), far beyond any scale a fit lands on.
_GAP_LOG_SCALE_MAX = 60.0
# Every k_r starts at 0 (no gap): a start with a gap of the wrong shape (gamma_N 0.5 at N = 1e8) drove
# gamma_N up until the gap, and its gradient, vanished (the synthetic roles test of test_laws_recipe_gap.py).


@register(params=("E", "A", "B", "alpha", "beta", "gamma_D", "gamma_N", "k"), positive=("E", "A", "B"),
          columns=("N", "D", "recipe"),
          init_grid={**_SMALL_CHINCHILLA_GRID, "gamma_D": [0.0, 0.5], "gamma_N": [0.0, 0.5], "k": [0.0]},
          per_recipe=("k",), per_recipe_reference={"k": 0.0}, nests="chinchilla")
def recipe_gap(p, x, xp):
    """Chinchilla for the reference recipe plus an additive gap per recipe r (the QAT gap of Chen et al.
    2025, "Scaling law for quantization-aware training", fitted on 268 runs: k·D^gamma_D·(log2 G)^gamma_G
    / N^gamma_N; here k_r per recipe, which absorbs the block size G and everything else a recipe does):
    L = E + A·N^-alpha + B·D^-beta + k_r·D^gamma_D / N^gamma_N,   k_r = 0 for the reference recipe.

    Additive in loss because that is what was measured: a recipe's loss minus the reference's at matched
    (N, D, seed) (matched.matched_gaps; Chen et al. and Sun et al. 2025 add their precision terms too).
    The gap grows with D/N at fixed N at rate gamma_D per e-fold (d ln gap / d ln(D/N) = gamma_D), which
    neither kumar_eff (its eD term shrinks with D) nor capacity (N only) can say. gamma_D and gamma_N are
    shared by the recipes (one shape, a level each) and signed, so the fit, not the form, says which way
    the gap goes with data and size (a Quartet-style data-efficiency loss shrinks with D, Chen's grows).
    k_r is signed too: a recipe may match or beat the reference within noise (an 8-bit forward-only
    recipe can), and a positive k would pin those at its bound 0, which a fit's degeneracy check
    reads as a vanished term. Roles, kept layers and backward algorithms act through their own k_r: recipes
    of equal bits get different gaps. No bits axis (no continuous P*); it refuses a recipe it was not
    fitted on. 1 param per recipe + 2 beyond Chinchilla. E + gap sits in one log-term (the gap may be
    negative), floored at a tiny positive value so a wild start stays finite.
    """
    log_scale = xp.clip(p["gamma_D"] * xp.log(x["D"]) - p["gamma_N"] * xp.log(x["N"]),
                        -_GAP_LOG_SCALE_MAX, _GAP_LOG_SCALE_MAX)
    floor = p["E"] + p["k"] * xp.exp(log_scale)
    return [xp.log(xp.maximum(floor, 1e-12)), xp.log(p["A"]) - p["alpha"] * xp.log(x["N"]),
            xp.log(p["B"]) - p["beta"] * xp.log(x["D"])]


def recipe_gap_at(p: Mapping[str, float], recipe: str, N, D):
    """recipe_gap's gap of `recipe` to the reference at (N, D): k_r·D^gamma_D / N^gamma_N (numpy)."""
    return p[f"k[{recipe}]"] * np.asarray(D, float) ** p["gamma_D"] / np.asarray(N, float) ** p["gamma_N"]


QERR_COLUMNS = ("qerr_w", "qerr_a", "qerr_g")


def log_tanh(z, xp):
    """log tanh(z) for z > 0 without cancellation at small z or overflow at large z."""
    e = xp.exp(-2.0 * z)
    return xp.log(-xp.expm1(-2.0 * z)) - xp.log1p(e)


def log_capacity(qerr, F, C, xp):
    """log tanh(F·b^C), b = log4(1 / qerr) the Gaussian-MSE 'bits' of a representation (each bit of a
    uniform grid cuts the MSE 4x); exactly 0 (capacity 1) for an unquantised role, qerr = 0.
    qerr = 0 is swapped for a harmless value before the logs and masked after: a where() alone would
    still send the infinite branch's NaN into the fitter's gradient."""
    quantised = qerr > 0
    bits = -xp.log(xp.where(quantised, qerr, 0.5)) / math.log(4.0)
    z = xp.exp(xp.log(F) + C * xp.log(bits))
    return xp.where(quantised, log_tanh(z, xp), 0.0)


@register(params=("E", "A", "B", "alpha", "beta", "F", "C"),
          positive=("E", "A", "B", "F", "C"), columns=("N", "D") + QERR_COLUMNS,
          init_grid={**_SMALL_CHINCHILLA_GRID, "F": [0.1, 0.3, 1.0], "C": [1.0, 2.0]},
          varying=(("N",), ("D",), QERR_COLUMNS))
def capacity(p, x, xp):
    """Panferov et al. 2025 ("Unified scaling laws for compressed representations"): a representation's
    capacity rho, read off how well it fits Gaussian data, scales the parameter count:
    L = E + A·(N·rho)^-alpha + B·D^-beta,
    rho = prod over roles r in (w, a, g) of tanh(F·b_r^C),  b_r = log4(1 / qerr_r),
    qerr_r the role's relative MSE on Gaussian data (0 for an unquantised role: factor 1).

    One saturating function of the Gaussian MSE shared by the roles (capacities of separately compressed
    tensors multiply), so format, scale granularity and rounding all act through a single axis, qerr.
    2 params beyond Chinchilla: F (scale) and C (shape); b must be > 0, i.e. qerr < 1. The tanh(F·b^C)
    shape is our reading of the paper's capacity fit, not checked against its exact parametrisation;
    its overall scale is dropped (it would only rescale A).
    """
    log_rho = sum(log_capacity(x[col], p["F"], p["C"], xp) for col in QERR_COLUMNS)
    return [xp.log(p["E"]), xp.log(p["A"]) - p["alpha"] * (xp.log(x["N"]) + log_rho),
            xp.log(p["B"]) - p["beta"] * xp.log(x["D"])]


# Each role's quantisation error as measured in training: the run's telemetry logs `<role>_snr_db`
# (10·log10 of signal over quantisation-error power on the role's tensors, results schema), so the
# relative MSE is 10^(-SNR/10); a role the recipe leaves unquantised (P_<role> = 32) logs no SNR: 0.
MEASURED_QERR_COLUMNS = ("qerr_train_w", "qerr_train_a", "qerr_train_g")
_TELEMETRY_ROLE = {"w": "weight", "a": "activation", "g": "grad"}


def measured_qerr(df: Any, role: str) -> np.ndarray:
    """Relative quantisation error of role 'w', 'a' or 'g' as measured in training, from the results
    table `df` (pandas): 10^(-snr_db/10) from `<role>_snr_db`; 0 where the SNR is infinite (exact) or
    where it is missing and P_<role> says the role is unquantised, or the run quantised no GEMM at all
    (every block kept in high precision: the flops_fprop/dgrad/wgrad columns all 0); NaN where it is
    missing otherwise or not positive (an error as large as the signal)."""
    import pandas as pd

    n = len(df)
    snr_col = f"{_TELEMETRY_ROLE[role]}_snr_db"
    snr = pd.to_numeric(df[snr_col], errors="coerce").to_numpy(float) if snr_col in df.columns else np.full(n, np.nan)
    bits = pd.to_numeric(df[f"P_{role}"], errors="coerce").to_numpy(float) if f"P_{role}" in df.columns else np.full(n, np.nan)
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.where(snr > 0, 10.0 ** (-snr / 10.0), np.nan)
    out[np.isposinf(snr)] = 0.0
    out[np.isnan(snr) & (bits >= UNQUANTISED_BITS)] = 0.0
    parts = [c for c in ("flops_fprop", "flops_dgrad", "flops_wgrad") if c in df.columns]
    if parts:
        quantised = sum(pd.to_numeric(df[c], errors="coerce").to_numpy(float) for c in parts)
        out[np.isnan(snr) & (quantised == 0)] = 0.0
    return out


def with_derived_columns(df: Any, columns: Iterable[str]) -> Any:
    """df with those of `columns` that are derived from other columns (MEASURED_QERR_COLUMNS, from the
    telemetry SNR) added where df lacks them and has a source (`<role>_snr_db` or P_<role>); df itself
    when nothing is added. A fit or prediction calls this first, so results tables need no new columns."""
    add = {}
    for c in columns:
        if c in MEASURED_QERR_COLUMNS and c not in df.columns:
            role = c[-1]
            if f"{_TELEMETRY_ROLE[role]}_snr_db" in df.columns or f"P_{role}" in df.columns:
                add[c] = measured_qerr(df, role)
    if not add:
        return df
    import pandas as pd

    return pd.concat([df, pd.DataFrame(add, index=df.index)], axis=1)  # one block: a wide table stays whole


@register(params=("E", "A", "B", "alpha", "beta", "F", "C", "w_w", "w_a", "w_g"),
          positive=("E", "A", "B", "F", "C", "w_w", "w_a", "w_g"), columns=("N", "D") + MEASURED_QERR_COLUMNS,
          init_grid={**_SMALL_CHINCHILLA_GRID, "F": [0.1, 0.3, 1.0], "C": [1.0, 2.0],
                     "w_w": [1.0], "w_a": [1.0], "w_g": [1.0]},
          varying=(("N",), ("D",), MEASURED_QERR_COLUMNS))
def capacity_roles(p, x, xp):
    """capacity on each role's quantisation error as measured in training, each role with its own weight:
    L = E + A·(N·rho)^-alpha + B·D^-beta,
    log rho = sum over roles r in (w, a, g) of w_r · log tanh(F·b_r^C),  b_r = log4(1 / qerr_train_r),
    qerr_train_r = 10^(-SNR_r/10) from the run's `<role>_snr_db` telemetry (0 for an unquantised role).

    capacity reads each role's error off Gaussian data, the same for every role of a format (MXFP4's
    weights and activations alike), so it cannot say that one role costs more; here the errors are the
    ones training saw and w_a > w_w says activations cost more capacity than weights at the same error.
    With w_w = w_a = w_g = 1 it is capacity on the measured errors. 3 params beyond capacity. Like
    capacity it has no bits axis: it ranks measured recipes and gives no continuous P*.
    """
    log_rho = sum(p[f"w_{col[-1]}"] * log_capacity(x[col], p["F"], p["C"], xp) for col in MEASURED_QERR_COLUMNS)
    return [xp.log(p["E"]), xp.log(p["A"]) - p["alpha"] * (xp.log(x["N"]) + log_rho),
            xp.log(p["B"]) - p["beta"] * xp.log(x["D"])]


@register(params=("n", "d", "eps", "alpha", "beta", "gamma", "delta", "nu"),
          positive=("n", "d", "eps", "gamma"), columns=("N", "D", "ebits", "mbits", "block"),
          init_grid={"n": _exp_grid([0.0, 5.0, 10.0]), "d": _exp_grid([0.0, 5.0, 10.0]),
                     "eps": _exp_grid([-1.0, 0.0, 1.0]), "alpha": [0.2, 0.5], "beta": [0.2, 0.5],
                     "gamma": _exp_grid([5.0, 10.0, 15.0, 20.0]), "delta": [0.0, 2.0],
                     "nu": [0.0, 2.0]})
def sun(p, x, xp):
    """Sun et al. 2025, floating-point quantised training (E exponent bits, M mantissa bits, B block size):
    L = n·N^-alpha + d·D^-beta + eps + (D^beta / N^alpha)·log2(B) / (gamma·(E+0.5)^delta·(M+0.5)^nu).

    The last term grows with D: at fixed N (and format) the loss is minimal at the critical data size
    D_crit = (d·gamma·N^alpha·(E+0.5)^delta·(M+0.5)^nu / log2 B)^(1/(2·beta)); more data beyond it hurts.
    Needs B >= 2 (log2 B > 0); B = 1 would make the precision term vanish.
    """
    log_n, log_d = xp.log(x["N"]), xp.log(x["D"])
    precision_term = (p["beta"] * log_d - p["alpha"] * log_n + xp.log(xp.log2(x["block"]))
                      - xp.log(p["gamma"]) - p["delta"] * xp.log(x["ebits"] + 0.5)
                      - p["nu"] * xp.log(x["mbits"] + 0.5))
    return [xp.log(p["n"]) - p["alpha"] * log_n, xp.log(p["d"]) - p["beta"] * log_d,
            xp.log(p["eps"]), precision_term]


def sun_critical_data_size(p: Mapping[str, float], N, ebits, mbits, block):
    """D where dL/dD = 0 for the sun law: -beta·d·D^(-beta-1) + beta·K·D^(beta-1)/N^alpha = 0,
    K = log2 B / (gamma·(E+0.5)^delta·(M+0.5)^nu)  =>  D_crit = (d·N^alpha / K)^(1/(2·beta))."""
    k = np.log2(block) / (p["gamma"] * (ebits + 0.5) ** p["delta"] * (mbits + 0.5) ** p["nu"])
    return (p["d"] * np.asarray(N, dtype=float) ** p["alpha"] / k) ** (1.0 / (2.0 * p["beta"]))


def kumar_sweet_spot_x(kappa: float) -> float:
    """Positive root x of e^x - 1 = kappa·x (the sweet spot is P* = gamma·x); none for kappa <= 1."""
    if kappa <= 1:
        raise ConfigError("kappa", kappa, "> 1 (for kappa <= 1 the lowest allowed precision is optimal)")
    # f(x) = e^x - 1 - kappa·x is negative just right of 0 (f'(0) = 1 - kappa < 0) and positive for
    # large x; the bracket's upper end 2·log(kappa) + 2 is past the root for any kappa > 1.
    return brentq(lambda x: math.expm1(x) - kappa * x, 1e-9, 2 * math.log(kappa) + 2, xtol=1e-14)
