"""Predictors of any run, judged by proper scores on backtests, and the one that wins them.

Why: a law fitted on some runs misses runs beyond them, mostly by a shift shared by every recipe that
grows the further the runs lie from the fitted data (in compute, in N, in D/N). A predictor should
correct the shift that earlier misses show and widen with that distance; whether it does better than
the law's own interval is a measurement, so every backtest (backtest.py: along compute and along N)
scores three predictors with coverage, CRPS and the 95% interval score (scores.py), each calibrated
only on backtests inside its own fitted data:

- `bootstrap`: the law's resamples plus a normal of its in-sample RMS residual per row (uncalibrated);
- `shifted`: that, moved by the latest earlier backtest's mean miss (its interval unwidened);
- `calibrated`: the law + each recipe's in-sample misfit weighted by how far it persisted in the earlier
  backtests + a shift beta·delta, where delta is the row's distance from the fitted data (decades, the
  length of (compute, N, D/N) beyond it) and beta the shared misses of the latest backtest of each kind
  regressed on their distances through 0; its spread: the law's resamples, a shared normal of scale
  tau·delta (tau the scatter of those misses per decade about beta, inflated by sqrt(1 + 1/k) for beta's
  own error), a per-recipe t and a per-row normal from the backtests' own scatter. With backtests of one
  kind only, one miss cannot tell the spread from the centre, so tau is as large as the misses per decade
  of every backtest of that kind (their root mean square less the rows' noise) and beta's error is what
  the rows' noise puts into its one miss (`_shift_terms`): the spread from one miss alone made the width
  a ratio of one noisy number, too wide at the centre for its tails.

The choice (`choose`; `predict_table`, `scaling predict --rows`, predicts with it): `calibrated` is the
designed predictor (it corrects the bias that backtests show instead of absorbing it as width) and the
other two are its baselines, so a baseline replaces it only where the backtests show it better beyond
chance: lower CRPS on so many of the backtests that scored all three (each one vote) that a one-sided
sign test rejects "no better than `calibrated`" at CHOICE_ALPHA, split over the two baselines, and the
lower mean CRPS over them. Why not the lowest mean CRPS: a table offers few backtests (one or two
latest ones per kind), and which predictor wins one of them is close to a coin toss, while what each
predictor does wrong at a longer reach (the bootstrap's interval never holds the shift) shows only at
that reach; with fewer than six votes no baseline can pass, and `calibrated` stands.

Gaps to a reference recipe are drawn from the backtests' own gap misses, where the shared shift cancels.
Errors are measured - predicted, in nats.
"""

from __future__ import annotations

import math
import time
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from scaling.errors import ConfigError
from scaling.study.analysis import isoflop as analysis
from scaling.study.analysis.isoflop import LEVEL
from scaling.study.analysis.prediction import scores
from scaling.study.analysis.prediction.backtest import (  # noqa: F401  (the names callers import from here)
    Fits, Model, Split, budgets, decompose, effective_budget, fit_model, gap_pairs, split, unbacktestable)
from scaling.study.analysis.prediction import backtest as bt_lib

DRAWS = 4000  # predictive draws per predictor (the law's resamples cycled)
PREDICTORS = ("bootstrap", "shifted", "calibrated")
DEFAULT = "calibrated"  # kept unless another predictor wins the backtests beyond chance (choose)
CHOICE_ALPHA = 0.05  # the sign test's level (choose), split over the challengers
METHOD = ("three predictors scored by CRPS on backtests along compute and N: the law's bootstrap; the law shifted "
          "by the latest earlier backtest's mean miss; the law + a shift per decade of distance from the fitted "
          "data (compute, N, D/N) with a spread per decade, both from earlier backtests")


# ----------------------------------------------------------------------------- the calibration

def calibration(backtests: Sequence[Mapping[str, Any]], skipped: Sequence[tuple[Split, str]] = (),
                prefer: str = "budget") -> dict[str, Any]:
    """The calibrated terms from backtests (module doc), and the `shifted` baseline's shift (the mean miss
    of the latest backtest of kind `prefer`, else of the other kind). None and a note where a term cannot
    be estimated."""
    offered = [b for b in backtests if b.get("shared") is not None and (b.get("delta") or 0) > 0]
    done = [max(mine, key=_order) for kind in ("budget", "size") if (mine := [b for b in offered if b["kind"] == kind])]
    k = len(done)
    out: dict[str, Any] = {"k": k, "offered": len(offered), "backtests": [b["label"] for b in done], "shared": [b["shared"] for b in done],
                           "delta": [b["delta"] for b in done], "shift": None, "tau": None, "shared_scale": None,
                           "latest": None, "latest_shift": None, "recipe_weight": 0.0, "recipe_rms": None,
                           "sigma_recipe": None, "recipe_dof": 0, "sigma_row": None, "row_dof": 0,
                           "sigma_gap_recipe": None, "gap_recipe_dof": 0, "sigma_gap_row": None, "gap_row_dof": 0,
                           "notes": []}
    if not k:
        by_why: dict[str, list[str]] = {}
        for spec, reason in skipped:
            by_why.setdefault(reason, []).append(spec.label)
        why = "; ".join(f"{', '.join(p)}: {r}" for r, p in by_why.items()) if skipped else "none can be made"
        out["notes"].append(f"no backtest inside the fitted data ({why}): the shift, its spread and the "
                            "per-recipe and row terms cannot be estimated")
        return out
    latest = next((b for b in done if b["kind"] == prefer), done[0])
    out["latest"], out["latest_shift"] = latest["label"], latest["mean_error"]
    out.update(_recipe_terms(done))
    out.update(_shift_terms(done, out["sigma_row"] or 0.0, offered))
    if k == 1:
        out["notes"].append("backtests of one kind: the shift per decade rests on the latest one's miss, so its "
                            f"spread is taken as large as the shifts per decade of all {len(offered)} of them")
    if out["sigma_row"] is None:
        out["notes"].append("no backtest row beyond one per recipe: the row scatter cannot be estimated")
    out.update(_gap_terms(done, out["recipe_weight"]))
    if out["sigma_gap_row"] is None:
        out["notes"].append("no matched gaps to the reference in the backtests: gap intervals come from the level "
                            "draws (their shared part cancels, their row terms do not)")
    return out


def _order(b: Mapping[str, Any]) -> tuple:
    """Later backtests sort last: fitted on the most data of their kind (then the nearest target)."""
    return (b["fit_budget"], -b["target_budget"]) if b["kind"] == "budget" else (b["threshold"],)


def _shift_terms(done: Sequence[Mapping[str, Any]], sigma_row: float,
                 offered: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The shift per decade beta (the backtests' shared misses m_i regressed on their distances d_i through
    0), the spread of the per-decade misses about it, tau (their scatter less what the rows' noise alone
    gives, sigma_row^2 / n_i, floored at 0), and the shared term's scale per decade for a new row,
    sqrt(tau^2 + var(beta)): the spread plus beta's own error.

    With one backtest (one kind) the spread cannot be told from the centre, so it is taken as large as
    the shifts themselves: tau^2 the mean squared miss per decade over every backtest `offered` (each
    threshold or pair, not the latest alone), less each one's row noise, floored at 0; var(beta) what the
    rows' noise puts into the one miss, sigma_row^2 / (n d^2). Taking tau = |beta| of the latest miss alone
    made the width a ratio of one noisy number (too wide where that miss happened large, too narrow where
    it happened small: the predictive too wide at its centre for its tails), and adding tau^2 to var(beta)
    as well counted that spread twice."""
    m, d = np.array([b["shared"] for b in done]), np.array([b["delta"] for b in done])
    noise = sigma_row ** 2 / np.array([b["n"] for b in done], float)
    beta = float(m @ d / (d @ d))
    if len(done) >= 2:
        tau2 = max(0.0, float(np.sum(((m - beta * d) ** 2 - noise) / d ** 2)) / (len(done) - 1))
        var_beta = float(np.sum(d ** 2 * (tau2 * d ** 2 + noise))) / float(d @ d) ** 2
    else:
        every = list(offered) or list(done)
        mo, do = np.array([b["shared"] for b in every]), np.array([b["delta"] for b in every])
        no = sigma_row ** 2 / np.array([b["n"] for b in every], float)
        tau2 = max(0.0, float(np.mean((mo ** 2 - no) / do ** 2)))
        var_beta = float(noise[0] / d[0] ** 2)
    return {"shift": beta, "tau": math.sqrt(tau2), "shared_scale": math.sqrt(tau2 + var_beta)}


def _recipe_terms(done: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The per-recipe correction's weight w (the least-squares slope of the backtests' per-recipe misses
    on their fits' in-sample misfits, in [0, 1]), what is left per recipe (sigma_recipe, t dof) and the
    rows' pooled scatter about their recipe's mean (sigma_row)."""
    law_parts = np.array([p for b in done for p in b["per_recipe"].values()])
    bias = np.array([b["recipe_bias"].get(r, 0.0) for b in done for r in b["per_recipe"]])
    weight = float(np.clip(law_parts @ bias / (bias @ bias), 0.0, 1.0)) if bias @ bias > 0 else 0.0
    parts = law_parts - weight * bias
    out = {"recipe_weight": weight, "recipe_rms": {"law": float(np.sqrt(np.mean(law_parts ** 2))),
                                                   "corrected": float(np.sqrt(np.mean(parts ** 2)))},
           "sigma_recipe": 0.0, "recipe_dof": 0, "sigma_row": None, "row_dof": 0}
    row_dof = sum(b["row_dof"] for b in done)
    if row_dof > 0:
        out["sigma_row"], out["row_dof"] = math.sqrt(sum(b["row_ss"] for b in done) / row_dof), int(row_dof)
    dof = sum(max(0, len(b["per_recipe"]) - 1) for b in done)
    if dof:  # a recipe's measured part holds its rows' noise too (about sigma_row^2 R / n): not counted twice
        noise = (out["sigma_row"] or 0.0) ** 2 * float(np.mean([len(b["per_recipe"]) / b["n"] for b in done]))
        out["sigma_recipe"] = math.sqrt(max(0.0, float(np.sum(parts ** 2)) / dof - noise))
        out["recipe_dof"] = int(dof)
    return out


def _gap_terms(done: Sequence[Mapping[str, Any]], weight: float) -> dict[str, Any]:
    """The gap terms: the RMS of the recipes' mean gap misses (t with as many dof as those means) and the
    gap rows' scatter about them, after the weighted per-recipe correction."""
    gaps = [decompose(b["_"]["gap_errors"] - weight * b["_"]["gap_bias"], b["_"]["gap_recipes"])
            for b in done if "gap_errors" in b.get("_", {})]
    means = [m for g in gaps for m in g["recipe_mean"].values()]
    dof = sum(g["row_dof"] for g in gaps)
    if not means or dof <= 0:
        return {}
    return {"sigma_gap_recipe": math.sqrt(float(np.mean(np.square(means)))), "gap_recipe_dof": len(means),
            "sigma_gap_row": math.sqrt(sum(g["row_ss"] for g in gaps) / dof), "gap_row_dof": int(dof)}


def unavailable(calib: Mapping[str, Any], name: str) -> str | None:
    """Why predictor `name` cannot be built from this calibration, or None."""
    if name == "bootstrap":
        return None
    if name == "shifted":
        return None if calib.get("latest_shift") is not None else "; ".join(calib.get("notes") or ["no backtest"])
    if calib.get("shift") is None or calib.get("sigma_row") is None:
        return "; ".join(calib.get("notes") or ["not calibrated"])
    return None


def usable(calib: Mapping[str, Any]) -> str | None:
    """Why the calibrated predictor cannot be built, or None."""
    return unavailable(calib, "calibrated")


# ----------------------------------------------------------------------------- the predictors' draws

def predictive(model: Model, frame: pd.DataFrame, calib: Mapping[str, Any] | None, name: str = "calibrated", *,
               n: int = DRAWS, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(centre (rows,), draws (n, rows)) of each row's loss under predictor `name` (module doc)."""
    if name == "bootstrap" or calib is None:
        centre, law = model.draws(frame)
        base = law[np.arange(n) % len(law)]
        return centre, base + np.random.default_rng(seed).normal(0.0, model.sigma_in, base.shape)
    if name == "shifted":
        centre, draws = predictive(model, frame, None, n=n, seed=seed)
        return centre + calib["latest_shift"], draws + calib["latest_shift"]
    centre, law = model.draws(frame, calib["recipe_weight"])
    rng = np.random.default_rng(seed)
    delta = model.distance(frame)
    centre = centre + calib["shift"] * delta
    base = law[np.arange(n) % len(law)] + calib["shift"] * delta[None, :]
    shared = calib["shared_scale"] * rng.standard_normal((n, 1)) * delta[None, :]
    names, idx = np.unique(frame["recipe"].to_numpy(), return_inverse=True)
    z = rng.standard_t(calib["recipe_dof"], size=(n, len(names))) if calib["recipe_dof"] else np.zeros((n, len(names)))
    return centre, base + shared + calib["sigma_recipe"] * z[:, idx] + rng.normal(0.0, calib["sigma_row"], base.shape)


def joint_draws(model: Model, frame: pd.DataFrame, calib: Mapping[str, Any] | None, *, n: int = DRAWS,
                seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The calibrated predictor's (centre, draws), or the bootstrap's where `calib` is None."""
    return predictive(model, frame, calib, "calibrated" if calib is not None else "bootstrap", n=n, seed=seed)


def gap_draws(model: Model, frame: pd.DataFrame, pairs: Sequence[tuple[int, int]], calib: Mapping[str, Any] | None,
              level_draws: np.ndarray, *, seed: int = 0) -> np.ndarray:
    """Draws (n, pairs) of each pair's gap, row i minus its reference row j: calibrated on the backtests'
    own gap misses where they had matched gaps (the law's resampled gap with the weighted correction + a
    per-recipe t + a gap-row normal), else the difference of the level draws."""
    n = len(level_draws)
    if not pairs:
        return np.zeros((n, 0))
    i, j = np.array(pairs).T
    if calib is None or calib.get("sigma_gap_row") is None:
        return level_draws[:, i] - level_draws[:, j]
    _, law = model.draws(frame, calib["recipe_weight"])
    base = law[np.arange(n) % len(law)]
    rng = np.random.default_rng(seed)
    names, idx = np.unique(frame["recipe"].to_numpy()[i], return_inverse=True)
    recipe = calib["sigma_gap_recipe"] * rng.standard_t(calib["gap_recipe_dof"], size=(n, len(names)))[:, idx]
    return base[:, i] - base[:, j] + recipe + rng.normal(0.0, calib["sigma_gap_row"], (n, len(i)))


# ----------------------------------------------------------------------------- scoring one backtest

def _coverage_keys(draws: np.ndarray, measured: np.ndarray, pairs: list[tuple[int, int]], level: float,
                   n_levels: int, gaps: np.ndarray, found: Mapping[float, tuple] | None = None) -> dict[str, Any]:
    """At `level`: the level intervals' coverage (the first n_levels rows) and the gap intervals' (pairs).
    `found`: scores.intervals of the level draws where the caller has them."""
    lo, hi = scores.interval(draws[:, :n_levels], level) if found is None else found[level]
    inside = (lo <= measured[:n_levels]) & (measured[:n_levels] <= hi)
    out = {"coverage": float(inside.mean()) if len(inside) else None, "inside": int(inside.sum()), "n": int(len(inside)),
           "mean_width": float(np.mean(hi - lo)) if len(inside) else None,
           "gap_coverage": None, "gap_inside": 0, "gap_n": len(pairs), "gap_mean_width": None}
    if pairs:
        i, j = np.array(pairs).T
        glo, ghi = scores.interval(gaps, level)
        g = measured[i] - measured[j]
        gin = (glo <= g) & (g <= ghi)
        out.update(gap_coverage=float(gin.mean()), gap_inside=int(gin.sum()), gap_mean_width=float(np.mean(ghi - glo)),
                   gap_crps=float(np.mean(scores.crps(gaps, g))))
        out.update(_rank_score(gaps, pairs, measured))
    return out


def _rank_score(gaps: np.ndarray, pairs: list[tuple[int, int]], measured: np.ndarray) -> dict[str, Any]:
    """Ranks at each matched point (a reference row and the rows paired with it): `rank_hit` the share of
    points where the row the gap draws most often put best (the reference at 0) is the measured best,
    `rank_p_measured` the mean P(best) of the measured best, `rank_called` the points where one row's
    P(best) >= 0.975 and `rank_called_right` how many of those it was the measured best."""
    i, j = np.array(pairs).T
    hits, p_measured, called, right = [], [], 0, 0
    for ref in np.unique(j):
        mine = np.flatnonzero(j == ref)
        rel = np.concatenate([np.zeros((len(gaps), 1)), gaps[:, mine]], axis=1)
        p = np.bincount(np.argmin(rel, axis=1), minlength=rel.shape[1]) / len(gaps)
        truth = int(np.argmin(np.concatenate([[measured[ref]], measured[i[mine]]])))
        hits.append(int(np.argmax(p)) == truth)
        p_measured.append(p[truth])
        if p.max() >= 0.975:
            called += 1
            right += int(np.argmax(p)) == truth
    return {"rank_points": len(hits), "rank_hit": float(np.mean(hits)), "rank_p_measured": float(np.mean(p_measured)),
            "rank_called": called, "rank_called_right": right}


def score_backtest(rows: pd.DataFrame, spec: Split, fits: Fits, reference: str | None, level: float = LEVEL,
                   draws: int = DRAWS, seed: int = 0, nested: bool = False) -> dict[str, Any]:
    """One backtest with every predictor scored on it, each calibrated on the backtests inside its fitted
    data: keys `old` (the bootstrap predictor), `shifted`, `calibrated` (coverage at `level`, gaps, ranks,
    `scores`: scores.score's), `scores` {predictor: scores.score} and `winner` (lowest CRPS). `nested`:
    also `chosen`, the predictor `predict_table` would have used with this backtest's fitted data alone
    (choose over the backtests inside it, each scored the same way) and its scores here: the whole
    procedure, choice included, judged on data it never saw."""
    out = bt_lib.run(rows, spec, fits, reference)
    internal = out["_"]
    # the backtests inside its fitted data (both kinds), unbootstrapped: its calibration
    seen = bt_lib.inner_rows(rows, spec)
    inside = bt_lib.splits(seen)
    found, skipped = bt_lib.run_all(seen, inside, fits, reference, bootstrap=False)
    calib = calibration(found, skipped, prefer=spec.kind)
    frame, measured, n_levels = internal["frame"], internal["measured"], internal["n_levels"]
    model, pairs = internal["model"], internal["pairs"]
    entries = {}
    for k, name in enumerate(PREDICTORS):
        reason = unavailable(calib, name)
        if reason is not None:
            entries[name] = {"available": False, "reason": reason}
            continue
        centre, d = predictive(model, frame, calib, name, n=draws, seed=seed + k)
        gaps = gap_draws(model, frame, pairs, calib if name == "calibrated" else None, d, seed=seed + 3)
        errors = measured[:n_levels] - centre[:n_levels]
        found = scores.intervals(d[:, :n_levels], tuple(dict.fromkeys((level, scores.INTERVAL_LEVEL, *scores.LEVELS))))
        entries[name] = {"available": True, "reason": None,
                         **_coverage_keys(d, measured, pairs, level, n_levels, gaps, found),
                         "scores": scores.score(d[:, :n_levels], measured[:n_levels], found=found),
                         "mean_error": float(np.mean(errors)), "mean_abs_error": float(np.mean(np.abs(errors)))}
    out["old"] = {**entries["bootstrap"], "sigma": model.sigma_in}
    out["shifted"] = {**entries["shifted"], "shift": calib["latest_shift"], "from": calib["latest"]}
    out["calibrated"] = {**entries["calibrated"], "calibrated_on": calib["backtests"], "calibration": calib}
    out["scores"] = {n: e["scores"] for n, e in entries.items() if e["available"]}
    out["winner"] = min(out["scores"], key=lambda n: out["scores"][n]["crps"])
    if nested:
        scored = [score_backtest(seen, s, fits, reference, level, draws, seed) for s in inside
                  if bt_lib.why_not(seen, s) is None and _fits_below(seen, s, fits)]
        choice = choose(scored)
        name = choice["winner"] if choice["winner"] in out["scores"] else "bootstrap"
        out["chosen"] = {"predictor": name, "choice": choice, "scores": out["scores"][name]}
    return out


def _fits_below(rows: pd.DataFrame, spec: Split, fits: Fits) -> bool:
    """Whether the law can be fitted on a backtest's fitted rows (a nested choice skips one it cannot)."""
    try:
        fits.of(rows, bt_lib.masks(rows, spec)[0], bootstrap=False)
        return True
    except ConfigError:
        return False


def choose(backtests: Sequence[Mapping[str, Any]], alpha: float = CHOICE_ALPHA) -> dict[str, Any]:
    """The predictor `predict_table` uses (module doc, "The choice"): DEFAULT unless another predictor has
    the lower CRPS on so many of the backtests that scored all three (each one vote) that a one-sided sign
    test rejects "no better than DEFAULT" at `alpha` (Bonferroni over the challengers) and has the lower
    mean CRPS too; then the lowest mean CRPS of those that do. Keys: winner, n, backtests, crps (mean per
    predictor), runner_up (the best other by mean CRPS) and margin, relative (its CRPS less the winner's,
    nats and share: negative where DEFAULT is kept with the higher mean), wins (backtests each predictor
    scored best of all three), sign_test {challenger: {wins, n, p, passed}} (wins against DEFAULT alone),
    summary, rule."""
    scored = [b for b in backtests if set(PREDICTORS) <= set(b.get("scores", {}))]
    scored.sort(key=lambda b: (b["kind"] != "budget", _order(b)))
    if not scored:
        return {"winner": DEFAULT, "n": 0, "crps": {}, "runner_up": None, "margin": None, "relative": None,
                "wins": {}, "sign_test": {}, "rule": "not scored: no backtest has an earlier one inside its fitted "
                                                     f"data, so the {DEFAULT} predictor is used as designed"}
    n = len(scored)
    crps = {p: float(np.mean([b["scores"][p]["crps"] for b in scored])) for p in PREDICTORS}
    challengers = [p for p in PREDICTORS if p != DEFAULT]
    tests = {}
    for p in challengers:
        w = sum(b["scores"][p]["crps"] < b["scores"][DEFAULT]["crps"] for b in scored)
        pv = sign_test(w, n)
        tests[p] = {"wins": int(w), "n": n, "p": pv, "passed": pv <= alpha / len(challengers) and crps[p] < crps[DEFAULT]}
    passed = [p for p in challengers if tests[p]["passed"]]
    winner = min(passed, key=crps.get) if passed else DEFAULT
    runner_up = min((p for p in PREDICTORS if p != winner), key=crps.get)
    wins = {p: sum(min(b["scores"], key=lambda m: b["scores"][m]["crps"]) == p for b in scored) for p in PREDICTORS}
    summary = {p: {"crps": crps[p],
                   "interval_score": float(np.mean([b["scores"][p]["interval_score"] for b in scored])),
                   "coverage": {lv: float(np.mean([b["scores"][p]["coverage"][lv] for b in scored]))
                                for lv in scored[0]["scores"][p]["coverage"]}} for p in PREDICTORS}
    margin = crps[runner_up] - crps[winner]
    return {"winner": winner, "n": n, "backtests": [b["label"] for b in scored], "crps": crps,
            "runner_up": runner_up, "margin": margin,
            "relative": margin / crps[runner_up] if crps[runner_up] > 0 else None,
            "wins": wins, "sign_test": tests, "summary": summary,
            "rule": (f"{DEFAULT} unless another predictor has the lower CRPS on enough of the backtests that scored "
                     f"all three for a one-sided sign test at {alpha:g} (Bonferroni over {len(challengers)}), and the "
                     "lower mean CRPS")}


def sign_test(wins: int, n: int) -> float:
    """One-sided sign test: P(at least `wins` of `n` fair coin flips) (1.0 when n is 0)."""
    return float(sum(math.comb(n, k) for k in range(wins, n + 1)) / 2 ** n) if n else 1.0


# ----------------------------------------------------------------------------- every backtest

def _public(b: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in b.items() if k != "_"}


def backtest_all(rows: pd.DataFrame, law: str | None = None, *, candidates: Sequence[str] | None = None,
                 bootstrap: int = 30, seed: int = 0, level: float = LEVEL, reference: str | None = None,
                 fit_kwargs: Mapping[str, Any] | None = None, draws: int = DRAWS, nested: bool = True) -> dict[str, Any]:
    """Every backtest of the table (each ordered pair of budgets, then each size threshold), every
    predictor scored on each, and `choice` (choose's). Keys: method, law, level, bootstrap, budgets,
    reference, pairs (the budget backtests), sizes (the size ones), skipped [{label, reason}], choice,
    seconds; `nested`: each backtest's `chosen` (score_backtest). reference: the recipe gaps are taken to (default the highest-precision recipe)."""
    start = time.perf_counter()
    rows = bt_lib.keyed(rows)
    fits = Fits(law, candidates, bootstrap, seed, fit_kwargs)
    reference = reference or analysis.high_precision_recipe(rows)
    every = bt_lib.splits(rows)
    if not every:
        raise ConfigError("results", f"{len(budgets(rows))} budget(s), {rows['N'].nunique()} size(s)",
                          f"results a backtest can split (two or more IsoFLOP budgets, or more than {bt_lib.MIN_SIZES} "
                          "distinct sizes)")
    skipped = [(s, why) for s in every if (why := bt_lib.why_not(rows, s))]
    if len(skipped) == len(every):
        raise ConfigError("results", ", ".join(s.label for s in every), f"a design a backtest can split ({skipped[0][1]})")
    done = []
    for spec in every:
        if bt_lib.why_not(rows, spec):
            continue
        try:
            done.append(_public(score_backtest(rows, spec, fits, reference, level, draws, seed, nested)))
        except ConfigError as e:  # the law cannot be fitted below this threshold
            skipped.append((spec, f"the law cannot be fitted on the rows below {spec.label} ({e})"))
    return {"method": METHOD, "law": law or "selected per fit", "level": level, "bootstrap": bootstrap,
            "budgets": budgets(rows), "reference": reference, "predictors": list(PREDICTORS),
            "pairs": [b for b in done if b["kind"] == "budget"], "sizes": [b for b in done if b["kind"] == "size"],
            "skipped": [{"label": s.label, "fit_budget": s.a if s.kind == "budget" else None, "target_budget": s.b,
                         "reason": why} for s, why in skipped],
            "choice": choose(done), "seconds": time.perf_counter() - start}


def _one(rows: pd.DataFrame, spec: Split, law, candidates, bootstrap, seed, level, reference, fit_kwargs,
         draws, nested) -> dict[str, Any]:
    rows = bt_lib.keyed(rows)
    fits = Fits(law, candidates, bootstrap, seed, fit_kwargs)
    reference = reference or analysis.high_precision_recipe(rows)
    why = bt_lib.why_not(rows, spec)
    if why:
        raise ConfigError("backtest", spec.label, f"a split a backtest can make ({why})")
    return _public(score_backtest(rows, spec, fits, reference, level, draws, seed, nested))


def backtest_pair(rows: pd.DataFrame, fit_budget: float, target_budget: float, law: str | None = None, *,
                  candidates: Sequence[str] | None = None, bootstrap: int = 30, seed: int = 0, level: float = LEVEL,
                  reference: str | None = None, fit_kwargs: Mapping[str, Any] | None = None,
                  draws: int = DRAWS, nested: bool = True) -> dict[str, Any]:
    """One budget backtest of backtest_all (the same keys), calibrated on the backtests inside its fitted data."""
    return _one(rows, Split("budget", fit_budget, target_budget), law, candidates, bootstrap, seed, level, reference,
                fit_kwargs, draws, nested)


def backtest_size(rows: pd.DataFrame, threshold: float, law: str | None = None, *,
                  candidates: Sequence[str] | None = None, bootstrap: int = 30, seed: int = 0, level: float = LEVEL,
                  reference: str | None = None, fit_kwargs: Mapping[str, Any] | None = None,
                  draws: int = DRAWS, nested: bool = True) -> dict[str, Any]:
    """One size backtest (fit N < threshold, predict N >= threshold), calibrated on the backtests inside
    its fitted data."""
    return _one(rows, Split("size", threshold), law, candidates, bootstrap, seed, level, reference, fit_kwargs, draws,
                nested)

