"""Proper scores of a predictive distribution given as draws, against what was measured.

A predictor is judged by how its whole distribution meets the measurement, not by coverage alone (a
wide interval covers everything and says little; a narrow biased one covers nothing): CRPS rewards a
sharp distribution centred on the truth, the interval score of Gneiting & Raftery (2007, eq. 43)
charges an interval its width plus 2/alpha times each miss. Both are in the measurement's units
(nats), lower is better, and both are proper: no predictor scores better in expectation than the
distribution the measurements come from.

`draws` has shape (n_draws, n_points), `measured` shape (n_points,). Intervals are central: the
alpha/2 and 1 - alpha/2 quantiles of each point's draws.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from scaling.errors import ConfigError

LEVELS = (0.5, 0.8, 0.9, 0.95)  # the coverage levels a backtest reports
INTERVAL_LEVEL = 0.95  # the interval score's level (alpha = 0.05)


def _check(draws: np.ndarray, measured: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    draws, measured = np.asarray(draws, float), np.asarray(measured, float)
    if draws.ndim == 1:
        draws = draws[:, None]
    if draws.ndim != 2 or measured.shape != (draws.shape[1],) or len(draws) == 0:
        raise ConfigError("draws", f"shape {draws.shape} against {measured.shape} measured",
                          "draws of shape (n_draws >= 1, n_points) and n_points measured values")
    return draws, measured


def interval(draws: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) per point: the central `level` interval of its draws."""
    return intervals(draws, (level,))[level]


def intervals(draws: np.ndarray, levels: Sequence[float]) -> dict[float, tuple[np.ndarray, np.ndarray]]:
    """interval at each of `levels` ({level: (lo, hi)}), the draws partitioned once for all of them (each
    quantile is the same number whichever others are asked with it)."""
    for level in levels:
        if not 0 < level < 1:
            raise ConfigError("level", level, "a number strictly between 0 and 1")
    qs = [q for level in levels for q in ((1 - level) / 2, (1 + level) / 2)]
    found = np.quantile(np.asarray(draws, float), qs, axis=0)
    return {level: (found[2 * k], found[2 * k + 1]) for k, level in enumerate(levels)}


def crps(draws: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """CRPS of each point's empirical distribution: E|X - y| - E|X - X'| / 2 over the draws (X, X'
    independent draws with replacement, so the value is exactly the CRPS of the draws' step CDF).
    E|X - X'| comes from the sorted draws in O(m log m): sum_{i,j} |x_i - x_j| = 2 sum_i (2i - m - 1) x_(i)."""
    draws, measured = _check(draws, measured)
    m = len(draws)
    first = np.mean(np.abs(draws - measured[None, :]), axis=0)
    ranks = 2 * np.arange(1, m + 1) - m - 1
    spread = 2 * (ranks @ np.sort(draws, axis=0)) / m**2
    return first - spread / 2


def interval_score(lo: np.ndarray, hi: np.ndarray, measured: np.ndarray, alpha: float) -> np.ndarray:
    """Gneiting & Raftery's interval score of the central (1 - alpha) interval [lo, hi] per point:
    (hi - lo) + 2/alpha (lo - y) 1[y < lo] + 2/alpha (y - hi) 1[y > hi]."""
    if not 0 < alpha < 1:
        raise ConfigError("alpha", alpha, "a number strictly between 0 and 1")
    lo, hi, y = (np.asarray(v, float) for v in (lo, hi, measured))
    return (hi - lo) + 2 / alpha * (np.maximum(lo - y, 0.0) + np.maximum(y - hi, 0.0))


def coverage(draws: np.ndarray, measured: np.ndarray, levels: Sequence[float] = LEVELS) -> dict[str, float]:
    """The share of points inside their central interval at each level, keyed by the level ('0.95')."""
    draws, measured = _check(draws, measured)
    return _coverage(intervals(draws, levels), measured, levels)


def _coverage(found: dict[float, tuple[np.ndarray, np.ndarray]], measured: np.ndarray,
              levels: Sequence[float]) -> dict[str, float]:
    return {f"{level:g}": float(np.mean((found[level][0] <= measured) & (measured <= found[level][1])))
            for level in levels}


def score(draws: np.ndarray, measured: np.ndarray, levels: Sequence[float] = LEVELS,
          level: float = INTERVAL_LEVEL, found: dict[float, tuple[np.ndarray, np.ndarray]] | None = None) -> dict[str, Any]:
    """Every score of one predictor on a set of points: n, coverage at `levels`, mean CRPS, the mean
    interval score and mean width of the central `level` interval, and the mean error of the draws'
    median (measured - predicted). `found`: intervals(draws, ...) at `level` and `levels` where the
    caller has them."""
    draws, measured = _check(draws, measured)
    found = intervals(draws, (level, *levels)) if found is None else found
    lo, hi = found[level]
    return {"n": int(len(measured)), "coverage": _coverage(found, measured, levels),
            "crps": float(np.mean(crps(draws, measured))),
            "interval_score": float(np.mean(interval_score(lo, hi, measured, 1 - level))),
            "width": float(np.mean(hi - lo)), "level": level,
            "median_error": float(np.mean(measured - np.median(draws, axis=0)))}
