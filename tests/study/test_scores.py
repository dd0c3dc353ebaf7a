"""Proper scores (scaling.study.analysis.prediction.scores) against their closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from scaling.errors import ConfigError
from scaling.study.analysis.prediction import scores


def gaussian_crps(mu: float, sigma: float, y: np.ndarray) -> np.ndarray:
    """CRPS of N(mu, sigma^2) at y (Gneiting & Raftery 2007, eq. 22): sigma (z (2 Phi(z) - 1) + 2 phi(z) - 1/sqrt(pi))."""
    z = (y - mu) / sigma
    return sigma * (z * (2 * stats.norm.cdf(z) - 1) + 2 * stats.norm.pdf(z) - 1 / math.sqrt(math.pi))


def test_crps_of_gaussian_draws_matches_the_closed_form():
    rng = np.random.default_rng(0)
    draws = rng.normal(1.0, 0.2, (40_000, 1)) * np.ones((1, 5))
    y = np.array([1.0, 1.1, 0.7, 1.5, 2.0])
    assert scores.crps(draws, y) == pytest.approx(gaussian_crps(1.0, 0.2, y), rel=0.01, abs=2e-4)


def test_crps_equals_the_brute_force_pairwise_estimator_and_the_point_case():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(60, 3))
    y = np.array([0.0, 0.5, -2.0])
    brute = np.abs(x - y).mean(0) - 0.5 * np.abs(x[:, None, :] - x[None, :, :]).mean((0, 1))
    assert scores.crps(x, y) == pytest.approx(brute, abs=1e-12)
    # one draw: the CRPS of a point forecast is the absolute error
    assert scores.crps(np.array([[1.0, 2.0]]), np.array([1.5, 2.0])) == pytest.approx([0.5, 0.0])


def test_interval_score_is_width_plus_the_charged_miss():
    lo, hi = np.array([0.0, 0.0, 0.0]), np.array([1.0, 1.0, 1.0])
    y = np.array([0.5, -0.1, 1.3])
    assert scores.interval_score(lo, hi, y, 0.05) == pytest.approx([1.0, 1.0 + 40 * 0.1, 1.0 + 40 * 0.3])
    with pytest.raises(ConfigError, match="alpha"):
        scores.interval_score(lo, hi, y, 1.5)


def test_interval_score_of_gaussian_draws_matches_its_expectation():
    """For y ~ N(0, 1) and the true central 95% interval, E[score] = 2 z sigma + (2/alpha) * 2 sigma (phi(z) - z (1 - Phi(z)))."""
    rng = np.random.default_rng(2)
    y = rng.normal(size=200_000)
    z = stats.norm.ppf(0.975)
    found = scores.interval_score(np.full_like(y, -z), np.full_like(y, z), y, 0.05).mean()
    expected = 2 * z + (2 / 0.05) * 2 * (stats.norm.pdf(z) - z * (1 - stats.norm.cdf(z)))
    assert found == pytest.approx(expected, rel=0.02)


def test_coverage_and_score_of_a_calibrated_gaussian():
    rng = np.random.default_rng(3)
    draws = np.sort(rng.normal(size=(2000, 1)), axis=0) * np.ones((1, 1500))
    y = rng.normal(size=1500)
    found = scores.score(draws, y)
    for level, cov in found["coverage"].items():
        assert cov == pytest.approx(float(level), abs=0.04)
    assert found["crps"] == pytest.approx(1 / math.sqrt(math.pi), rel=0.05)  # E over y of N(0,1)'s CRPS
    assert found["width"] == pytest.approx(2 * stats.norm.ppf(0.975), rel=0.02) and found["n"] == 1500
    # a shifted predictor scores worse on both proper scores
    worse = scores.score(draws + 0.5, y)
    assert worse["crps"] > found["crps"] and worse["interval_score"] > found["interval_score"]
    with pytest.raises(ConfigError, match="draws"):
        scores.score(draws, y[:10])
