"""A budget predicted before it is trained, then scored against what it measured.

`predict`: fit the laws on the lower budgets alone and predict, for each recipe of a held-out IsoFLOP
design, the minimum of its IsoFLOP profile (loss and N there) with a prediction interval, and the
winner or "cannot tell". The error bar holds what is not known:

- the fit: each law's bootstrap (resampling runs), its resamples' profiles;
- the law form: every law the selection could not tell from the best (selection.select's
  `within_noise`, the chosen one included) contributes the same number of resamples;
- the measurement: the analysis reads a measured minimum off a parabola through a few noisy runs
  (its CI at the lower budgets gives `sigma_measurement`), and the law misses the lower budgets'
  measured minima by more than that (`sigma_lack_of_fit`, the excess in quadrature). Each predictive
  draw adds independent normal noise of both, per recipe.

A recipe's profile is predicted on the design's own (N, D) line at the held-out budget: the shapes'
D interpolated in log N between them, the law's loss minimised over log N within their range (a
minimum at the range's edge is flagged). Each recipe enters a law with its median columns (P,
formats, measured quantisation errors) over its lower-budget runs.

`score`: the measured IsoFLOP analysis at that budget (scaling.study.analysis.isoflop) against the
prediction, per recipe: the error, whether the measured minimum fell inside its interval, each
recipe's gap to the reference predicted against measured (a law can miss the level of every minimum
alike and still rank the precisions right), and the predicted against the measured winner.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from scaling.errors import ConfigError
from scaling.study.analysis import isoflop as analysis, fit as fit_lib, laws, selection
from scaling.study.analysis.isoflop import LEVEL
from scaling.train import compute as compute_lib

GRID = 200  # log-N points of a predicted profile


def design_line(cfgs: Sequence[Any], budget: float, vocab: int = 256) -> pd.DataFrame:
    """The held-out design's (recipe, N, D) at `budget`: each run config serving it, D the tokens at
    the step labelled with that budget (a reference run that trains on for others' steps included)."""
    rows = []
    for cfg in cfgs:
        budgets = list(cfg.study.flop_budgets)
        at = [i for i, b in enumerate(budgets) if b and math.isclose(b, budget, rel_tol=1e-9)]
        if not at:
            continue
        row = compute_lib.run_row(cfg, vocab)
        rows.append({"recipe": cfg.recipe.name, "N": row["N"], "D": float(cfg.train.eval_at[at[0]] * cfg.train.tokens),
                     "seed": cfg.seed})
    df = pd.DataFrame(rows, columns=["recipe", "N", "D", "seed"])
    return df.drop_duplicates(["recipe", "N"]).drop(columns="seed").sort_values(["recipe", "N"]).reset_index(drop=True)


def recipe_columns(rows: pd.DataFrame, law: str) -> pd.DataFrame:
    """Per recipe, the median of each of a law's columns other than N and D over its rows."""
    cols = [c for c in laws.get(law).columns if c not in ("N", "D")]
    df = laws.with_derived_columns(rows, cols)
    return df.groupby("recipe")[cols].median(numeric_only=True) if cols else pd.DataFrame(index=sorted(set(df["recipe"])))


def profile_minimum(fit: fit_lib.FitResult, line: pd.DataFrame, columns: pd.Series | None,
                    params: dict[str, float] | None = None) -> tuple[float, float, bool]:
    """(loss, N, at_edge) of a law's minimum along one recipe's design line (see module doc)."""
    logn = np.log(line["N"].to_numpy(float))
    grid = np.linspace(logn.min(), logn.max(), GRID)
    frame = pd.DataFrame({"N": np.exp(grid), "D": np.exp(np.interp(grid, logn, np.log(line["D"].to_numpy(float))))})
    for c, v in (columns if columns is not None else pd.Series(dtype=float)).items():
        frame[c] = v
    law = fit.law_form  # a per-recipe law (kumar_eff) carries the recipes it was fitted on
    x = fit_lib._columns(law, frame, require_rows=False)
    loss = np.asarray(law.predict(params or fit.params, x, np), float)
    if not np.isfinite(loss).any():
        return math.nan, math.nan, False
    k = int(np.nanargmin(loss))
    return float(loss[k]), float(math.exp(grid[k])), k in (0, len(grid) - 1)


def _law_draws(fit: fit_lib.FitResult, line: pd.DataFrame, recipes: list[str], columns: pd.DataFrame,
               max_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """(loss, N) at each recipe's predicted minimum: row 0 the fit, then one row per resample."""
    samples = [dict(fit.params)] + fit.samples.iloc[:max_samples].to_dict("records")
    loss, n_opt = np.full((len(samples), len(recipes)), np.nan), np.full((len(samples), len(recipes)), np.nan)
    for j, recipe in enumerate(recipes):
        cols = columns.loc[recipe] if recipe in columns.index else None
        if cols is None and len(columns.columns):
            continue  # the law needs columns this recipe's runs do not carry
        for i, params in enumerate(samples):
            loss[i, j], n_opt[i, j], _ = profile_minimum(fit, line[line["recipe"] == recipe], cols, params)
    return loss, n_opt


def measurement_sigma(rows: pd.DataFrame, budgets: Sequence[float], cost: str) -> tuple[float, list[dict]]:
    """(sigma, the lower budgets' analyses): the median half-width of the measured minima's CIs over
    recipes and budgets, as a normal sigma; each analysis as scaling.study.analysis.isoflop returns it."""
    noise = analysis.replicate_noise(rows)
    found = [analysis.isoflop(rows, b, cost, noise=noise) for b in budgets]
    widths = [(e["ci"][1] - e["ci"][0]) / 2 for a in found for e in a["recipes"] if e.get("ci")]
    if not widths:
        raise ConfigError("results", "no measured IsoFLOP minimum with a CI at the lower budgets",
                          "lower budgets whose profiles the analysis can read (3+ sizes per recipe)")
    return float(np.median(widths)) / _z(LEVEL), found


def _z(level: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(0.5 + level / 2))


def predict(rows: pd.DataFrame, line: pd.DataFrame, budget: float, *, cost: str = "bits", bootstrap: int = 50,
            seed: int = 0, candidates: Sequence[str] | None = None, level: float = LEVEL) -> dict[str, Any]:
    """The prediction for `budget` (see module doc) from `rows` (the lower budgets' results) and `line`
    (design_line of the held-out design). JSON-friendly."""
    rows = analysis.ok_rows(rows)
    lower = sorted({float(b) for b in pd.to_numeric(rows.get("budget"), errors="coerce").dropna() if b > 0})
    if not lower:
        raise ConfigError("results", "no rows labelled with an IsoFLOP budget", "the lower budgets' results")
    if max(lower) >= budget:
        raise ConfigError("budget", f"{budget:g}", f"a budget above every fitted one (the rows reach {max(lower):g})")
    recipes = sorted(set(line["recipe"]))
    missing = [r for r in recipes if r not in set(rows["recipe"])]
    if missing:
        raise ConfigError("recipe", missing[0], "a recipe of the held-out design with lower-budget runs to fit")
    choice, fits = selection.select(rows, candidates, loss_column="val_loss")
    names = [n for n in choice["within_noise"] if n in fits and fits[n].degenerate is None]
    if not names:
        raise ConfigError("results", "no sound law within noise of the best", "data on which a law can be fitted")
    sigma_meas, found = measurement_sigma(rows, lower, cost)
    draws, fitted, laws_used = [], [], []
    for name in names:
        fit = fits[name]
        if bootstrap:
            fit_lib.bootstrap_fit(rows, fit, bootstrap, seed=seed, loss_column="val_loss")
        columns = recipe_columns(rows, fit.law)
        loss, n_opt = _law_draws(fit, line, recipes, columns, bootstrap)
        if np.isnan(loss).all(axis=0).any():
            continue
        draws.append((loss[1:] if len(loss) > 1 else loss, n_opt[1:] if len(n_opt) > 1 else n_opt))
        fitted.append(loss[0])
        laws_used.append({"name": name, "law": fit.law, "resamples": int(len(loss) - 1),
                          "loss": {r: float(v) for r, v in zip(recipes, loss[0])},
                          "lack_of_fit": _lack_of_fit(fit, rows, found)})
    if not draws:
        raise ConfigError("results", "no law predicts every recipe", "laws whose columns the recipes' runs carry")
    miss = [m for entry in laws_used for m in entry["lack_of_fit"]]
    sigma_lack = math.sqrt(max(0.0, float(np.mean(np.square(miss))) - sigma_meas**2)) if miss else 0.0
    loss = np.concatenate([d[0] for d in draws])
    n_opt = np.concatenate([d[1] for d in draws])
    rng = np.random.default_rng(seed)
    noisy = loss + rng.normal(0.0, math.hypot(sigma_meas, sigma_lack), loss.shape)
    q = (50 * (1 - level), 50 * (1 + level))
    centre = np.nanmean(np.asarray(fitted), axis=0)  # the laws' own fits, averaged over the laws
    best_of = np.nanargmin(noisy, axis=1)
    out_recipes = []
    for j, recipe in enumerate(recipes):
        sub = line[line["recipe"] == recipe]
        n_centre = float(np.exp(np.nanmean(np.log(n_opt[:, j]))))
        out_recipes.append({
            "recipe": recipe, "loss": float(centre[j]), "loss_pi": [float(v) for v in np.nanpercentile(noisy[:, j], q)],
            "N_opt": n_centre, "N_pi": [float(v) for v in np.nanpercentile(n_opt[:, j], q)],
            "edge": bool(np.mean(np.isclose(n_opt[:, j], sub["N"].min(), rtol=1e-6) |
                                 np.isclose(n_opt[:, j], sub["N"].max(), rtol=1e-6)) > 0.5),
            "p_best": float(np.mean(best_of == j)), "shapes": [float(n) for n in sub["N"]]})
    order = np.argsort(centre)
    b, r = int(order[0]), int(order[1])
    diff = noisy[:, r] - noisy[:, b]
    diff_pi = [float(v) for v in np.nanpercentile(diff, q)]
    if diff_pi[0] > 0:
        winner, reason = recipes[b], (f"{recipes[b]} predicted to beat {recipes[r]} by {centre[r] - centre[b]:.3f} "
                                      f"({level:.0%} PI [{diff_pi[0]:.3f}, {diff_pi[1]:.3f}])")
    else:
        winner, reason = None, (f"cannot tell: {recipes[b]} vs {recipes[r]} predicted {centre[r] - centre[b]:.3f} apart, "
                                f"{level:.0%} PI [{diff_pi[0]:.3f}, {diff_pi[1]:.3f}] includes zero")
    return {"budget": float(budget), "cost_model": cost, "level": level,
            "fitted_on": {"budgets": lower, "runs": int(rows["run_id"].nunique()), "rows": int(len(rows)),
                          "recipes": sorted(set(rows["recipe"])),
                          "run_ids": sorted(set(rows["run_id"])),  # which runs, for a later reader
                          "corpora": sorted(map(str, rows["corpus"].dropna().unique())) if "corpus" in rows else []},
            "chosen_law": choice["chosen"], "laws": laws_used, "draws": int(len(loss)),
            "sigma_measurement": sigma_meas, "sigma_lack_of_fit": sigma_lack,
            "recipes": out_recipes, "best": recipes[b], "runner_up": recipes[r],
            "diff": float(centre[r] - centre[b]), "diff_pi": diff_pi, "winner": winner, "reason": reason}


def _lack_of_fit(fit: fit_lib.FitResult, rows: pd.DataFrame, found: list[dict]) -> list[float]:
    """The law's minimum minus the measured one, per recipe and lower budget (in-sample)."""
    columns = recipe_columns(rows, fit.law)
    cost = compute_lib.get(found[0]["cost_model"]) if found else None
    out = []
    for a in found:
        pts = analysis.points_at(rows, a["budget"], cost)
        for e in a["recipes"]:
            if e.get("loss") is None or e["recipe"] not in set(pts["recipe"]):
                continue
            line = pts[pts["recipe"] == e["recipe"]].groupby("N", as_index=False)["D"].mean()
            cols = columns.loc[e["recipe"]] if e["recipe"] in columns.index else None
            if len(line) < 2 or (cols is None and len(columns.columns)):
                continue
            loss, _, _ = profile_minimum(fit, line.assign(recipe=e["recipe"]), cols)
            if math.isfinite(loss):
                out.append(loss - e["loss"])
    return out


def score(prediction: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """Predicted against measured at the held-out budget (measured: analysis.isoflop there): per recipe
    the errors, whether the measured minimum fell inside the prediction interval, and the winners."""
    got = {e["recipe"]: e for e in measured.get("recipes", []) if e.get("loss") is not None}
    rows = []
    for p in prediction["recipes"]:
        m = got.get(p["recipe"])
        if m is None:
            rows.append({"recipe": p["recipe"], "measured": None})
            continue
        rows.append({"recipe": p["recipe"], "predicted": p["loss"], "pi": p["loss_pi"], "measured": m["loss"],
                     "measured_ci": m.get("ci"), "error": m["loss"] - p["loss"],
                     "inside": p["loss_pi"][0] <= m["loss"] <= p["loss_pi"][1],
                     "N_predicted": p["N_opt"], "N_pi": p["N_pi"], "N_measured": m.get("N_opt"),
                     "N_inside": m.get("N_opt") is not None and p["N_pi"][0] <= m["N_opt"] <= p["N_pi"][1],
                     "measured_at_edge": m.get("inside") is False})
    scored = [r for r in rows if r.get("measured") is not None]
    errors = np.array([r["error"] for r in scored], float)
    reference = next((r for r, m in got.items() if m.get("gap") is None), None)  # the analysis' own: no gap
    gaps = _gap_scores(prediction, got, reference)
    gap_errors = np.array([g["error"] for g in gaps], float)
    return {"budget": prediction["budget"], "recipes": rows, "n": len(scored),
            "inside": int(sum(r["inside"] for r in scored)), "N_inside": int(sum(r["N_inside"] for r in scored)),
            "mean_error": float(errors.mean()) if len(errors) else None,
            "mean_abs_error": float(np.abs(errors).mean()) if len(errors) else None,
            "reference": reference, "gaps": gaps,
            "gaps_inside": int(sum(g["inside"] for g in gaps)),
            "gap_mean_abs_error": float(np.abs(gap_errors).mean()) if len(gaps) else None,
            "predicted_winner": prediction.get("winner"), "measured_winner": measured.get("winner"),
            "measured_reason": measured.get("reason", "")}


def _gap_scores(prediction: dict[str, Any], got: dict[str, dict], reference: str | None) -> list[dict[str, Any]]:
    """Each recipe's gap to the measured reference, predicted (the difference
    of the two predicted minima) against measured (the analysis' paired, shape-adjusted gap). `inside`:
    the predicted gap lies in the measured gap's CI; the prediction holds no interval for gaps, so
    this counts the measurement's uncertainty only."""
    predicted = {e["recipe"]: e["loss"] for e in prediction["recipes"]}
    if reference not in predicted:
        return []
    out = []
    for recipe, m in got.items():
        if recipe == reference or recipe not in predicted or m.get("gap") is None or not m.get("gap_ci"):
            continue
        gap = predicted[recipe] - predicted[reference]
        out.append({"recipe": recipe, "predicted": gap, "measured": m["gap"], "measured_ci": m["gap_ci"],
                    "error": m["gap"] - gap, "inside": m["gap_ci"][0] <= gap <= m["gap_ci"][1]})
    return sorted(out, key=lambda g: g["predicted"])


def load(path: str | Path) -> dict[str, Any]:
    """A prediction JSON (`scaling predict`), checked to be one."""
    path = Path(path)
    try:
        found = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError("prediction", str(path), f"a prediction JSON from `scaling predict` ({e})") from None
    if not isinstance(found, dict) or not {"recipes", "budget", "reason"} <= set(found):
        raise ConfigError("prediction", str(path), "a prediction JSON from `scaling predict`")
    return found
