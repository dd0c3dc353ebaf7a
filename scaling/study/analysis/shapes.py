"""IsoFLOP profiles fitted jointly with the effect of a model's shape, and the verdict "which recipe is best".

At one budget every recipe's runs give loss against x = ln N; but a run's loss depends on its shape
(d_model, n_layers), not on N alone, and recipes measured on different shapes are compared on different
models unless the shape's own effect is removed. The joint model, fitted by least squares:

    loss = a_r + b_r·x + c_r·x² + u_s + noise

with a parabola per recipe r and an effect u_s per shape s that every recipe shares. u is identified
only from shapes measured by at least two recipes, and only up to a quadratic in x (which any recipe's
parabola absorbs): it is fitted on the shapes shared by two or more recipes, orthogonal to 1, x and x²
over those shapes (so u reads as the shape's departure from a smooth curve in N common to every
recipe; a shape measured by one recipe only has no effect of its own). Where fewer than four shapes are
shared, or the shared shapes leave the model rank-deficient, there is no shape term. When every recipe
ran the same shapes, u leaves each parabola as it was and only moves systematic scatter out of the noise.

The noise is what the joint fit leaves: sigma² = RSS / (points - parameters), seed replicates included
as separate points (a seed-replicate sigma alone would miss the systematic part). A parametric
bootstrap redraws every point as fit + sigma·z (sigma scaled by a chi draw for its dof), refits the
joint model and takes each recipe's parabola minimum over its measured range of N. The best two
recipes by their fitted minima are compared by the paired difference of their resampled minima; the
verdict names the best only when that difference's CI excludes zero and every recipe's minimum lies
inside its measured sizes. Everything below is batched over independent data sets (rows of Y), so a
calibration study of many synthetic seeds runs as one array computation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_SHARED_SHAPES = 4  # a shape effect orthogonal to quadratics in x needs four shared shapes


@dataclass(frozen=True)
class JointDesign:
    """The joint model's design matrix for fixed points: X (points x parameters), the first 3·R columns
    recipe r's [1, x, x²] (x = ln N, zero off its rows), then the shape term's columns (shared shapes'
    dummies times `basis`). shapes: the shared shapes' labels; basis: (shared shapes x shape columns)."""
    X: np.ndarray
    recipe_of: np.ndarray
    n_recipes: int
    x_range: np.ndarray  # (R, 2): each recipe's smallest and largest ln N
    shapes: tuple
    shape_x: np.ndarray  # each shared shape's mean ln N
    basis: np.ndarray
    shape_of_point: np.ndarray  # index into `shapes`, -1 for a shape measured by one recipe only

    @property
    def dof(self) -> int:
        return int(self.X.shape[0] - self.X.shape[1])


def joint_design(x: np.ndarray, recipe_of: np.ndarray, shape_labels: list, *, shape_term: bool = True) -> JointDesign:
    """The JointDesign of points at ln N `x`, recipe index `recipe_of` (0..R-1) and a hashable shape label
    per point (see module doc); shape_term=False gives the parabolas alone (the analysis without shapes)."""
    x, recipe_of = np.asarray(x, float), np.asarray(recipe_of, int)
    n_recipes = int(recipe_of.max()) + 1
    cols = []
    for r in range(n_recipes):
        on = (recipe_of == r).astype(float)
        cols += [on, on * x, on * x * x]
    X = np.stack(cols, axis=1)
    x_range = np.array([[x[recipe_of == r].min(), x[recipe_of == r].max()] for r in range(n_recipes)])
    recipes_on = {}
    for s, r in zip(shape_labels, recipe_of):
        recipes_on.setdefault(s, set()).add(int(r))
    shared = tuple(s for s in dict.fromkeys(shape_labels) if len(recipes_on[s]) >= 2) if shape_term else ()
    none = JointDesign(X, recipe_of, n_recipes, x_range, (), np.zeros(0), np.zeros((0, 0)), np.full(len(x), -1))
    if len(shared) < MIN_SHARED_SHAPES:
        return none
    index = {s: i for i, s in enumerate(shared)}
    shape_of_point = np.array([index.get(s, -1) for s in shape_labels])
    shape_x = np.array([x[shape_of_point == i].mean() for i in range(len(shared))])
    # the complement of span{1, x, x²} over the shared shapes: u is identified only modulo a quadratic
    poly = np.stack([np.ones_like(shape_x), shape_x, shape_x ** 2], axis=1)
    q, _ = np.linalg.qr(poly, mode="complete")
    basis = q[:, 3:]
    dummies = (shape_of_point[:, None] == np.arange(len(shared))[None, :]).astype(float)
    full = np.concatenate([X, dummies @ basis], axis=1)
    if np.linalg.matrix_rank(full) < full.shape[1] or full.shape[0] <= full.shape[1]:
        return none
    return JointDesign(full, recipe_of, n_recipes, x_range, shared, shape_x, basis, shape_of_point)


def fit(design: JointDesign, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least squares for every row of Y (data sets x points) -> (coefficients (sets x params), RSS (sets,))."""
    Y = np.atleast_2d(Y)
    coef = Y @ np.linalg.pinv(design.X).T
    rss = np.sum((Y - coef @ design.X.T) ** 2, axis=1)
    return coef, rss


def shape_effects(design: JointDesign, coef: np.ndarray) -> np.ndarray:
    """u per shared shape (sets x shapes) from joint coefficients (zero columns without a shape term)."""
    coef = np.atleast_2d(coef)
    return coef[:, 3 * design.n_recipes:] @ design.basis.T


def minima(design: JointDesign, coef: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each recipe's parabola minimum over its measured range: (x*, loss*, inside), each (..., R). The
    vertex where it is a minimum inside the range, else the lower end (inside False)."""
    par = coef[..., :3 * design.n_recipes].reshape(*coef.shape[:-1], design.n_recipes, 3)
    a, b, c = par[..., 0], par[..., 1], par[..., 2]
    lo, hi = design.x_range[:, 0], design.x_range[:, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        vertex = np.where(c > 0, -b / (2 * c), np.nan)
    inside = (c > 0) & (vertex >= lo) & (vertex <= hi)
    at = lambda z: a + b * z + c * z * z  # noqa: E731
    at_lo, at_hi = at(lo), at(hi)
    end_x = np.where(at_lo <= at_hi, lo, hi)
    xs = np.where(inside, np.where(inside, vertex, lo), end_x)
    return xs, at(xs), inside


def compare(design: JointDesign, Y: np.ndarray, *, n_boot: int, level: float, rng: np.random.Generator,
            sigma: np.ndarray | None = None, dof: int | None = None) -> dict[str, np.ndarray]:
    """The verdict for every data set (row of Y): fitted minima and their bootstrap CIs, P(best), the
    best two and the CI of their paired difference, and the winner (-1 for none) with why not:
    reason 0 named, 1 the difference's CI includes zero, 2 a minimum at the edge of its sizes; boot_min
    (sets, n_boot, R): the resampled minima, for other paired differences.
    sigma/dof: the noise to resample with (default: the joint fit's residual scatter and its dof)."""
    Y = np.atleast_2d(np.asarray(Y, float))
    coef, rss = fit(design, Y)
    dof = design.dof if dof is None else dof
    sigma = np.sqrt(rss / dof) if sigma is None else np.broadcast_to(np.asarray(sigma, float), rss.shape)
    xs, loss, inside = minima(design, coef)
    sets, n = Y.shape
    fitted = coef @ design.X.T
    # sigma itself is uncertain with few dof: each resample's noise is scaled by a chi draw
    scale = np.sqrt(dof / rng.chisquare(dof, size=(sets, n_boot, 1)))
    boot = fitted[:, None, :] + sigma[:, None, None] * scale * rng.standard_normal((sets, n_boot, n))
    boot_coef = boot @ np.linalg.pinv(design.X).T
    boot_min = minima(design, boot_coef)[1]  # (sets, n_boot, R)
    tail = 100 * (1 - level) / 2
    ci = np.percentile(boot_min, [tail, 100 - tail], axis=1)  # (2, sets, R)
    p_best = np.stack([np.mean(np.argmin(boot_min, axis=2) == r, axis=1) for r in range(design.n_recipes)], axis=1)
    order = np.argsort(loss, axis=1)
    best, runner = order[:, 0], order[:, 1]
    rows = np.arange(sets)
    diff_boot = boot_min[rows, :, runner] - boot_min[rows, :, best]
    diff_ci = np.percentile(diff_boot, [tail, 100 - tail], axis=1).T  # (sets, 2)
    excludes_zero = diff_ci[:, 0] > 0
    all_inside = inside.all(axis=1)
    winner = np.where(excludes_zero & all_inside, best, -1)
    reason = np.where(~excludes_zero, 1, np.where(~all_inside, 2, 0))
    return {"coef": coef, "rss": rss, "sigma": sigma, "dof": np.full(sets, dof), "x_opt": xs, "loss": loss,
            "inside": inside, "ci": np.moveaxis(ci, 0, -1), "p_best": p_best, "boot_min": boot_min, "best": best, "runner_up": runner,
            "diff": loss[rows, runner] - loss[rows, best], "diff_ci": diff_ci, "winner": winner, "reason": reason,
            "shape_effects": shape_effects(design, coef)}
