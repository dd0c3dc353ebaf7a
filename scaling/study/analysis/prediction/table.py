"""Any rows (N, D, recipe) predicted by the predictor the results' own backtests choose
(`scaling predict --rows`): the law fitted on every ok row, every backtest the results offer scored
(calibrate.score_backtest), the predictor chosen on CRPS (calibrate.choose: the calibrated one unless a
baseline beats it beyond chance), and each row's interval, gap to the reference recipe and P(best) from
its draws calibrated on all of those backtests."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from scaling.errors import ConfigError
from scaling.study.analysis import isoflop as analysis
from scaling.study.analysis.isoflop import LEVEL
from scaling.study.analysis.prediction import backtest as bt_lib, calibrate, scores

COLUMNS = ["N", "D", "recipe", "loss", "loss_lo", "loss_hi", "law_loss", "distance", "gap_reference", "gap", "gap_lo",
           "gap_hi", "p_best", "old_lo", "old_hi", "interval", "predictor", "level"]


def _checked(table: pd.DataFrame) -> pd.DataFrame:
    missing = [c for c in ("N", "D", "recipe") if c not in table.columns]
    if missing:
        raise ConfigError("rows", f"missing {', '.join(missing)}", "a table with columns N, D, recipe")
    for c in ("N", "D"):
        v = pd.to_numeric(table[c], errors="coerce").to_numpy(float)
        if not (np.isfinite(v) & (v > 0)).all():
            bad = table[c].tolist()[int(np.flatnonzero(~(np.isfinite(v) & (v > 0)))[0])]
            raise ConfigError(c, bad, "numbers > 0 in every row")
    if len(table) == 0:
        raise ConfigError("rows", 0, "at least one row to predict")
    return table.assign(N=pd.to_numeric(table["N"]).astype(float), D=pd.to_numeric(table["D"]).astype(float),
                        recipe=table["recipe"].astype(str)).reset_index(drop=True)


def _backtests(rows: pd.DataFrame, fits, reference, level, draws, seed) -> tuple[list[dict], list]:
    """Every backtest of the results, scored (the choice reads them; the calibration their misses)."""
    done, skipped = [], []
    for spec in bt_lib.splits(rows):
        why = bt_lib.why_not(rows, spec)
        if why is None:
            try:
                done.append(calibrate.score_backtest(rows, spec, fits, reference, level, draws, seed))
                continue
            except ConfigError as e:
                why = f"the law cannot be fitted on the rows below {spec.label} ({e})"
        skipped.append((spec, why))
    return done, skipped


def predict_table(results: pd.DataFrame, table: pd.DataFrame, law: str | None = None, *,
                  candidates: Sequence[str] | None = None, bootstrap: int = 30, seed: int = 0, level: float = LEVEL,
                  reference: str | None = None, fit_kwargs: Mapping[str, Any] | None = None,
                  draws: int = calibrate.DRAWS, predictor: str | None = None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Each row of `table` (N, D, recipe; any other column ignored) predicted (module doc). Returns (the
    table with loss (the chosen predictor's centre), loss_lo, loss_hi (its `level` interval), law_loss
    (the law alone), distance (decades from the fitted data), gap_reference, gap, gap_lo, gap_hi (to the
    reference recipe's row at the same N, D, where the table has one), p_best (among the rows at the same
    N, D; NaN alone), old_lo, old_hi (the bootstrap interval), interval and predictor (the chosen
    predictor's name), level; facts {law, fixed, params, level, method, predictor, choice, budgets,
    top_budget, reference, calibration, backtests, notes}). `predictor`: one of calibrate.PREDICTORS instead
    of the winner (the choice is still reported)."""
    if predictor is not None and predictor not in calibrate.PREDICTORS:
        raise ConfigError("predictor", predictor, f"one of {', '.join(calibrate.PREDICTORS)}")
    table = _checked(table)
    rows = bt_lib.keyed(results)
    known = set(rows["recipe"].astype(str))
    unknown = [r for r in dict.fromkeys(table["recipe"]) if r not in known]
    if unknown:
        raise ConfigError("recipe", unknown[0], f"a recipe with runs in the results ({', '.join(sorted(known))})")
    fits = calibrate.Fits(law, candidates, bootstrap, seed, fit_kwargs)
    model = fits(rows)
    reference = reference or analysis.high_precision_recipe(rows)
    backtests, skipped = _backtests(rows, fits, reference, level, draws, seed)
    calib = calibrate.calibration(backtests, skipped, prefer="budget")
    choice = calibrate.choose(backtests)
    name = predictor or choice["winner"]
    if calibrate.unavailable(calib, name) is not None:
        if predictor is not None:
            raise ConfigError("predictor", predictor, f"a predictor these results can calibrate "
                              f"({calibrate.unavailable(calib, name)})")
        name = "bootstrap"  # the designed default cannot be built: the law's own interval
    frame = model.frame(table)
    law_centre, old = calibrate.predictive(model, frame, None, "bootstrap", n=draws, seed=seed)
    centre, new = calibrate.predictive(model, frame, calib, name, n=draws, seed=seed + 1)
    out = table.copy()
    out["loss"], out["law_loss"], out["distance"] = centre, law_centre, model.distance(frame)
    out["old_lo"], out["old_hi"] = scores.interval(old, level)
    out["loss_lo"], out["loss_hi"] = scores.interval(new, level)
    out["interval"] = out["predictor"] = name
    out["level"] = level
    _gaps_and_ranks(out, model, frame, calib if name == "calibrated" else None, new, reference, seed)
    notes = list(calib["notes"])
    if not bt_lib.budgets(rows):
        notes.insert(0, "the results carry no IsoFLOP budget labels: only backtests along N can calibrate")
    if name != choice["winner"] and predictor is None:
        notes.append(f"the {choice['winner']} predictor cannot be built here ({calibrate.unavailable(calib, choice['winner'])}): "
                     "the law's own bootstrap interval instead")
    facts = {"law": model.fit.law, "fixed": model.fit.fixed, "params": model.fit.params, "level": level,
             "method": calibrate.METHOD, "predictor": name, "choice": choice, "budgets": bt_lib.budgets(rows),
             "top_budget": model.top, "reference": reference, "calibration": _public(calib),
             "backtests": [_public(b) for b in backtests], "notes": notes}
    return out[COLUMNS + [c for c in out.columns if c not in COLUMNS]], facts


def _gaps_and_ranks(out: pd.DataFrame, model, frame: pd.DataFrame, calib: Mapping[str, Any] | None, draws: np.ndarray,
                    reference: str | None, seed: int) -> None:
    """Each row's gap to the reference row at its (N, D) with its interval, and P(best) among the rows at
    its (N, D) (the reference at 0 on the gap draws), into `out`. `calib`: the calibrated predictor's gap
    terms; None (another predictor won) takes gaps as differences of its level draws, as it was scored."""
    for c in ("gap", "gap_lo", "gap_hi", "p_best"):
        out[c] = np.nan
    out["gap_reference"] = ""
    pairs = bt_lib.gap_pairs(frame, reference)
    relative = draws.copy()
    if pairs:
        i, j = np.array(pairs).T
        gaps = calibrate.gap_draws(model, frame, pairs, calib, draws, seed=seed + 2)
        out.loc[i, "gap"] = out["loss"].to_numpy()[i] - out["loss"].to_numpy()[j]
        out.loc[i, "gap_reference"] = reference
        out.loc[i, "gap_lo"], out.loc[i, "gap_hi"] = scores.interval(gaps, float(out["level"].iloc[0]))
        relative[:, i], relative[:, j] = gaps, 0.0
    for idx in frame.groupby(["N", "D"], sort=False).indices.values():
        if len(set(frame["recipe"].to_numpy()[idx])) > 1:
            best = np.argmin(relative[:, idx], axis=1)
            out.loc[idx, "p_best"] = np.bincount(best, minlength=len(idx)) / len(draws)


def _public(b: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in b.items() if k != "_"}
