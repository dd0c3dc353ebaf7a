"""The predictors of scaling.study.analysis.prediction.calibrate judged by proper scores on synthetic
data whose truth is known, over enough replications that coverage is a rate, not one draw:

(i) a known shared shift: chinchilla losses (exponents held at the truth) shifted by SHIFT per half
    decade of compute at every budget, so the law fitted on the lower budgets misses the top one and
    the backtests inside them show it; the top budget predicted from the four below;
(ii) held-out larger sizes: a grid of runs (no budgets) whose truth bends away from chinchilla above
    the third size (+BEND·log10(N/N_3)^2); fitted on the six smallest sizes, the next four (1.4-4x the
    largest fitted N) predicted.

Each replication is one backtest_pair / backtest_size with `nested` on, so `chosen` is the predictor
`scaling predict --rows` would have used with the fitted data alone. REPLICATIONS datasets each; the
numbers are printed by `python tests/study/test_predict_scores.py` (about a minute of CPU for both truths). Coverage is pooled over the rows
of all replications; its binomial interval (rows of one replication share the shift, so the interval
is optimistic) is printed with -s. The fits skip the bootstrap (its compilation alone costs ~10 s), so
the `bootstrap` predictor is the law plus its in-sample RMS residual."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from scaling.study.analysis import laws
from scaling.study.analysis.prediction import calibrate

TRUTH = dict(E=1.8, A=400.0, B=2000.0, alpha=0.34, beta=0.36)
LAW = "chinchilla[alpha=0.34, beta=0.36]"
FIT_KWARGS = {"init": {"E": [1.5, 2.0], "A": [100.0, 1000.0], "B": [500.0, 5000.0]}, "polish": 1, "iters": (20, 60)}
BUDGETS = tuple(10 ** (16 + k / 2) for k in range(5))
SIZES = (0.4, 0.63, 1.0, 1.6, 2.5)  # N / N_opt at each budget
RECIPES = {"bf16": (16, 0.0), "fp8": (8, 0.004), "fp6": (6, 0.008), "fp4": (4, 0.015)}  # P, planted offset
SHIFT = 0.03  # nats per half decade of compute, invisible to the law
NOISE = 0.01  # row noise (nats)
BEND = 0.05  # nats per decade^2 of N beyond the third size
REPLICATIONS = 16


def _loss(n: float, d: float) -> float:
    return float(laws.get("chinchilla").predict(TRUTH, {"N": np.array([n]), "D": np.array([d])})[0])


def shifted(seed: int) -> pd.DataFrame:
    """Every recipe at every budget on five sizes, each budget's losses up by SHIFT per half decade."""
    rng = np.random.default_rng(seed)
    rows = []
    for k, c in enumerate(BUDGETS):
        n_opt = np.sqrt(c / 120)
        for f in SIZES:
            n, d = n_opt * f, c / (6 * n_opt * f)
            for recipe, (p, offset) in RECIPES.items():
                rows.append({"run_id": f"{recipe}-{k}-{f}", "recipe": recipe, "P": p, "N": n, "D": d, "seed": 0,
                             "budget": c, "status": "ok",
                             "val_loss": _loss(n, d) + offset + SHIFT * k + NOISE * rng.standard_normal()})
    return pd.DataFrame(rows)


GRID = tuple(1e6 * 2 ** (j / 2) for j in range(10))  # ten sizes, sqrt(2) apart


def bent(seed: int) -> pd.DataFrame:
    """A grid: ten sizes x three D/N x two recipes, the truth bending up above the third size."""
    rng = np.random.default_rng(seed)
    rows = []
    for j, n in enumerate(GRID):
        for ratio in (10, 20, 40):
            d = n * ratio
            bend = BEND * max(0.0, np.log10(n / GRID[2])) ** 2
            for recipe, (p, offset) in (("bf16", (16, 0.0)), ("fp8", (8, 0.01))):
                rows.append({"run_id": f"{recipe}-{j}-{ratio}", "recipe": recipe, "P": p, "N": n, "D": d, "seed": 0,
                             "status": "ok", "val_loss": _loss(n, d) + offset + bend + NOISE * rng.standard_normal()})
    return pd.DataFrame(rows)


def _replicate(kind: str) -> list[dict]:
    out = []
    for seed in range(REPLICATIONS):
        if kind == "shift":
            out.append(calibrate.backtest_pair(shifted(seed), BUDGETS[-2], BUDGETS[-1], LAW, bootstrap=0,
                                               fit_kwargs=FIT_KWARGS, draws=1000, seed=seed))
        else:
            out.append(calibrate.backtest_size(bent(seed), GRID[6], LAW, bootstrap=0, fit_kwargs=FIT_KWARGS,
                                               draws=1000, seed=seed))
    return out


def summary(found: list[dict]) -> dict[str, dict]:
    """Per predictor (and `chosen`): coverage pooled over rows with a 95% binomial interval, mean CRPS,
    mean 95% interval score, mean width."""
    out = {}
    for name in (*calibrate.PREDICTORS, "chosen"):
        sc = [b["chosen"]["scores"] if name == "chosen" else b["scores"][name] for b in found]
        n = sum(s["n"] for s in sc)
        cov = {}
        for level in sc[0]["coverage"]:
            p = sum(s["coverage"][level] * s["n"] for s in sc) / n
            half = 1.96 * np.sqrt(p * (1 - p) / n)
            cov[level] = (round(p, 3), round(max(0.0, p - half), 3), round(min(1.0, p + half), 3))
        out[name] = {"n": n, "coverage": cov, "crps": float(np.mean([s["crps"] for s in sc])),
                     "interval_score": float(np.mean([s["interval_score"] for s in sc])),
                     "width": float(np.mean([s["width"] for s in sc]))}
    out["chosen"]["picked"] = [b["chosen"]["predictor"] for b in found]
    return out


@pytest.fixture(scope="module", params=["shift", "size"])
def scored(request, once_per_run):
    """(kind, summary), each truth's replications made once per pytest run (as JSON: the intervals are lists)
    however many xdist workers its tests land on."""
    kind = request.param
    return kind, once_per_run(f"predict-scores-{kind}", lambda _: summary(_replicate(kind)))[1]


@pytest.mark.slow
def test_the_calibrated_predictor_covers_at_95_and_beats_both_baselines_on_crps(scored):
    """On both truths the calibrated predictor's 95% intervals cover 90-98% of the rows and its mean CRPS
    is no worse than the bootstrap's or the shifted law's."""
    kind, s = scored
    print(kind, s)
    cal = s["calibrated"]
    assert 0.90 <= cal["coverage"]["0.95"][0] <= 0.98, (kind, cal)
    assert cal["crps"] <= min(s["bootstrap"]["crps"], s["shifted"]["crps"]), (kind, s)


@pytest.mark.slow
def test_the_chosen_predictor_covers_at_50_and_95_and_is_no_worse_than_either_baseline(scored):
    """Issue 71's bar, the choice included: the calibrated predictor's 50% intervals cover 40-60% (were 67% on
    held-out sizes: its spread rested on one miss per decade, too wide at the centre for its tails), and the
    predictor chosen on the backtests inside each fitted table alone covers 90-98% at 95% and 40-60% at 50%
    with CRPS no worse than either baseline (the choice on one or two backtests often took the bootstrap,
    whose intervals miss the shift: a baseline now replaces the calibrated predictor only beyond chance)."""
    kind, s = scored
    chosen, cal = s["chosen"], s["calibrated"]
    assert 0.40 <= cal["coverage"]["0.5"][0] <= 0.60, (kind, cal)
    assert 0.90 <= chosen["coverage"]["0.95"][0] <= 0.98, (kind, chosen)
    assert 0.40 <= chosen["coverage"]["0.5"][0] <= 0.60, (kind, chosen)
    assert chosen["crps"] <= min(s["bootstrap"]["crps"], s["shifted"]["crps"]), (kind, s)


if __name__ == "__main__":  # the numbers the report quotes: python tests/study/test_predict_scores.py
    import json
    import sys

    for kind in sys.argv[1:] or ("shift", "size"):
        print(kind, json.dumps(summary(_replicate(kind)), indent=1))
