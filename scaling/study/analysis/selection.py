"""Law selection (`select_law`, `scaling fit --law auto`): every candidate law is scored by how well it
predicts held-out *precision gaps* (loss minus the matching high-precision run's loss) on three held-out
splits: the largest compute budget, the largest size, and the largest tokens per parameter (D/N). What
matters for choosing a precision is the gap, not the loss level every law fits about equally well. The
fitting itself is scaling.study.analysis.fit.

The held-out evidence (the strict splits, the gaps they score, the clustered statistics, the
likelihood test and the cluster resamples of the held-out errors) is scaling.study.analysis.heldout; its
names stay importable from here.

The choice (_choose), on the held-out errors computed once per candidate:
(1) score: the mean over the splits of each law's held-out gap MAE. (2) Within noise, fewest params
(TIE_RULE, the one-standard-error rule of Breiman et al. 1984 and Hastie et al. 2009, sec. 7.10): among
the sound laws with a precision term whose score is at most the best score plus NOISE_SE of the best
law's own recipe-clustered standard errors, the one with the fewest free params (ties: the lower score);
the data do not rank those, so the simplest is kept. The band is set by the best law's SE, not by each
law's paired difference: a law whose errors are wild on one recipe has a huge paired SE, and a band
that widened with it would call a far worse law "within noise". (3) The precision test: is that law better
than `chinchilla` (no precision term) on the held-out gaps (a clustered held-out likelihood test)? It was
picked on the same scores among K sound precision laws, so it must pass at ALPHA / K (Bonferroni: under
the null that no precision term helps, the chance that whichever law is picked passes is at most ALPHA).
If not, `chinchilla` is chosen and the summary says so. (4) Nested laws (Law.nests: kumar within
kumar_data) by the same test at ALPHA: the larger law only where it beats the smaller one.

Stability (stability): the (N, seed) cells of the scored rows are resampled with replacement
STABILITY_RESAMPLES times and the whole choice is repeated on each resample's held-out errors (no refit);
`stability` is each law's share of wins. (N, seed) cells, not recipes: a cell holds what one draw of the
data shares (the reference run's luck and every checkpoint of a run), the recipes are the fixed set the
law is chosen for, and a study has many more cells than recipes.

Why the MAE comparison is clustered by recipe: a law's errors are systematic by recipe (its form
misprices a format), so the rows of one recipe are not independent evidence. Why the likelihood test is
clustered by (N, seed): a gap is one run's loss minus the reference run's at the same (N, seed), so every
gap of that cell shares the reference's luck and every checkpoint of a run shares the run's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from scaling.study.analysis import fit, laws
from scaling.study.analysis.isoflop import LEVEL  # also the per-recipe residual intervals' level
from scaling.study.analysis.fit import FitResult
from scaling.study.analysis.heldout import (  # noqa: F401  (the names callers import from here)
    MIN_TEST_CLUSTERS, SELECTION_SPLITS, SPLITS, TOP_SHARE, Split, _describe_reference, _describe_split, _gaps,
    _match_ids, _resample, _run_ids, _short, _strict_split, clustered_mean_and_var, gaps_to_reference_rows,
    heldout_split, heldout_splits, likelihood_test, pooled_mean_and_var, reference_mask)
from scaling.errors import ConfigError

# within_noise: a law whose score is at most the best score plus this many of the best law's standard
# errors (the one-standard-error rule).
NOISE_SE = 1.0
# The likelihood tests (precision term vs none, nested laws): their one-sided level (the fewest clusters
# a test is made on is heldout.MIN_TEST_CLUSTERS).
ALPHA = 0.05
# How many cluster resamples the stability of the choice is measured on (each repeats _choose, no refit).
STABILITY_RESAMPLES = 50
TIE_RULE = (f"among the sound laws with a precision term whose score is within {NOISE_SE:g} standard error of the "
            "best score (the best law's SE, clustered by recipe: the one-standard-error rule), the one with the "
            "fewest free params (ties: the lower score); nested laws then by the likelihood test")
# Held-out gaps scored separately by the recipe's bits (the `P` column): name -> (lowest, highest) P.
BITS_GROUPS = {"6-8": (6.0, 8.0), "<=4": (0.0, 4.0)}


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
    return Candidate(spec.strip(), law.name, fit.resolve_fixed(law, fixed))


def default_candidates() -> list[str]:
    """Every registered law, the per-recipe ones (kumar_eff, recipe_gap) included, plus each law that holds
    params fixed by default with them freed (kumar -> also 'kumar[kappa free]'). Per-recipe laws are
    slower to fit (a param or two per recipe) but they are the only ones that can give recipes of equal
    bits different gaps, so whether the data need that is the selection's call, not the user's."""
    out = []
    for name in laws.names():
        out.append(name)
        if laws.get(name).fixed:
            out.append(f"{name}[{', '.join(f'{k} free' for k in laws.get(name).fixed)}]")
    return out


def recipe_clusters(df: pd.DataFrame) -> tuple[np.ndarray, str]:
    """(cluster per row, what a cluster is): the recipe where the table names one, else the run."""
    if "recipe" in df.columns:
        return pd.factorize(df["recipe"].astype(str))[0], "recipe"
    return _run_ids(df), "run"


def _heldout_gap_errors(df: pd.DataFrame, cand: Candidate, split: Split, loss_column: str, ref: np.ndarray,
                        ids: np.ndarray, fit_kwargs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray] | str:
    """Fit on split.train, predict the precision gaps of split.scored: (positions, predicted - measured
    gap), or the reason it could not be done. Gaps from fewer than two runs are not used: one run's
    error has no standard error."""
    train = df[split.train]
    below = f"fitted below {split.key} = {_short(split.threshold)}"
    reason = fit.unfittable_reason(train, cand.law, cand.fixed, loss_column)
    if reason:
        return f"{below}: {reason}"
    pos, measured = _gaps(pd.to_numeric(df[loss_column]).to_numpy(float), ids, ref, split.scored)
    if len(pos) == 0:
        return f"no row with {split.key} >= {_short(split.threshold)} has a matching reference run"
    if len(np.unique(_run_ids(df)[pos])) < 2:
        return f"the held-out gaps at {split.key} >= {_short(split.threshold)} come from one run: no standard error, not used"
    try:
        fitted = fit.fit_law(train, cand.law, fixed=cand.fixed, loss_column=loss_column, **fit_kwargs)
    except ConfigError as e:
        return f"{below}: {e}"
    needed = split.scored | (ref & np.isin(ids, ids[pos]))  # a per-recipe law predicts only recipes it saw
    values = np.full(len(df), np.nan)
    try:
        values[needed] = fitted.predict(df[needed])
    except ConfigError as e:
        return f"{below}: {e}"
    _, predicted = _gaps(values, ids, ref, split.scored)
    return pos, predicted - measured


def heldout_errors_by_recipe(df: pd.DataFrame, pos: np.ndarray, errors: np.ndarray, level: float = LEVEL) -> list[dict[str, Any]]:
    """Per recipe, the held-out gap errors (predicted - measured, nats) at `pos`: n, runs, their mean and
    a `level` t interval clustered by run (G - 1 dof over its G runs; none with a single run)."""
    recipes = df["recipe"].astype(str).to_numpy()[pos] if "recipe" in df.columns else np.full(len(pos), "all")
    runs = _run_ids(df)[pos]
    out = []
    for recipe in sorted(set(recipes)):
        mine = recipes == recipe
        mean, var = clustered_mean_and_var(errors[mine], runs[mine])
        g = len(np.unique(runs[mine]))
        half = float(stats.t.ppf(0.5 + level / 2, g - 1) * np.sqrt(var)) if g > 1 else None
        out.append({"recipe": recipe, "n": int(mine.sum()), "runs": g, "mean": mean,
                    "ci": [mean - half, mean + half] if half is not None else None})
    return out


def _finite(v: Any) -> Any:
    """JSON-safe: NaN / inf -> None."""
    return float(v) if v is not None and np.isfinite(v) else None


def _bits_groups(df: pd.DataFrame, pos: np.ndarray) -> dict[str, np.ndarray]:
    """BITS_GROUPS name -> mask over `pos` (by the `P` column; none without it)."""
    if "P" not in df.columns:
        return {}
    bits = pd.to_numeric(df["P"], errors="coerce").to_numpy(float)[pos]
    return {name: (bits >= lo) & (bits <= hi) for name, (lo, hi) in BITS_GROUPS.items()}


def _evaluate(df: pd.DataFrame, cand: Candidate, splits: Sequence[Split] | str, loss_column: str, ref: np.ndarray,
              ids: np.ndarray, fit_kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], FitResult | None, dict[str, tuple]]:
    """One candidate: (its summary entry, its full-data fit or None, {split: (positions, held-out gap errors)})."""
    law = laws.get(cand.law)
    entry: dict[str, Any] = {"name": cand.name, "law": cand.law, "fixed": cand.fixed}
    reason = fit.unfittable_reason(df, cand.law, cand.fixed, loss_column)
    if reason is None:
        try:
            fitted = fit.fit_law(df, cand.law, fixed=cand.fixed, loss_column=loss_column, **fit_kwargs)
        except ConfigError as e:  # e.g. every start gave a non-finite objective
            reason = str(e)
    if reason is not None:
        entry.update(fittable=False, reason=reason)
        return entry, None, {}
    loss = pd.to_numeric(df[loss_column]).to_numpy(float)
    entry.update(fittable=True, reason=None, n_params=len(fitted.law_form.free_params(fitted.fixed)),
                 precision_axis=law.precision_axis,
                 aic=fit.aic(fitted, n=fitted.data["n_units"]), mare=fit.mean_abs_rel_error(fitted.predict(df), loss),
                 objective=fitted.objective, heldout_gap_mae={}, n_heldout={}, heldout_notes={},
                 heldout_gap_mae_by_bits={g: {} for g in BITS_GROUPS})
    errors = {}
    for split in ([] if isinstance(splits, str) else splits):
        got = _heldout_gap_errors(df, cand, split, loss_column, ref, ids, fit_kwargs)
        if isinstance(got, str):
            entry["heldout_gap_mae"][split.by], entry["n_heldout"][split.by] = None, 0
            entry["heldout_notes"][split.by] = got
            continue
        errors[split.by] = got
        entry["heldout_gap_mae"][split.by], entry["n_heldout"][split.by] = float(np.mean(np.abs(got[1]))), int(len(got[0]))
        for group, mask in _bits_groups(df, got[0]).items():
            entry["heldout_gap_mae_by_bits"][group][split.by] = float(np.mean(np.abs(got[1][mask]))) if mask.any() else None
    if isinstance(splits, str) or not splits:
        entry["heldout_gap_mae"]["budget"], entry["n_heldout"]["budget"] = None, 0
        entry["heldout_notes"]["budget"] = splits if isinstance(splits, str) else "no held-out split"
    entry["params"] = fitted.params
    entry["degenerate"] = fitted.degenerate
    return entry, fitted, errors


def select(df: pd.DataFrame, candidates: Sequence[str] | None, loss_column: str = "val_loss",
           reference: str | None = None, fit_kwargs: Mapping[str, Any] | None = None, *,
           resamples: int = STABILITY_RESAMPLES) -> tuple[dict[str, Any], dict[str, FitResult]]:
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
    splits, split_notes = heldout_splits(df, ids, ref)
    init = dict(fit_kwargs.get("init") or {})
    evaluated = []
    for cand in parsed:
        # An init grid applies to every law that has those params.
        kwargs = {**fit_kwargs, "init": {k: v for k, v in init.items() if k in laws.get(cand.law).params}}
        evaluated.append(_evaluate(df, cand, splits or "; ".join(f"{k}: {v}" for k, v in split_notes.items()),
                                   loss_column, ref, ids, kwargs))
    return decide(df, evaluated, loss_column, reference, resamples=resamples)


def decide(df: pd.DataFrame, evaluated: Sequence[tuple[dict[str, Any], FitResult | None, dict[str, tuple]]],
           loss_column: str = "val_loss", reference: str | None = None, *,
           resamples: int = STABILITY_RESAMPLES) -> tuple[dict[str, Any], dict[str, FitResult]]:
    """select's second half: the choice and its summary from each candidate's (entry, full-data fit, held-out
    errors) as _evaluate returns them on the same `df` (the expensive part, kept apart so a study's
    candidates can be evaluated one at a time, resumably, and decided once)."""
    df = df.reset_index(drop=True)
    ref, ids = reference_mask(df, reference), _match_ids(df)
    splits, split_notes = heldout_splits(df, ids, ref)
    primary = heldout_split(df, ids)
    clusters, clustered_by = recipe_clusters(df)
    entries = [entry for entry, _, _ in evaluated]
    fits = {entry["name"]: fitted for entry, fitted, _ in evaluated if fitted is not None}
    errors = {entry["name"]: errs for entry, _, errs in evaluated if errs}
    tests: dict[str, Any] = {}
    chosen, criterion = _choose(entries, errors, clusters, _test_clusters(df), tests)
    shares = stability(entries, errors, clusters, _test_clusters(df), resamples) if tests["splits"] else None
    used = tests.pop("splits", [])
    first = used[0] if used else None
    summary = {"chosen": chosen, "criterion": criterion, "loss_column": loss_column,
               "reference": _describe_reference(df, ref),
               "splits": used,
               "split": _describe_split(df, next((sp for sp in splits if sp.by == first), primary)),
               "split_details": [_describe_split(df, sp) for sp in splits],
               "split_notes": split_notes,
               "noise_se": NOISE_SE, "clustered_by": clustered_by, "rule": TIE_RULE,
               "stability": shares, "stability_resamples": resamples if shares else 0,
               "stability_unit": "(N, seed) cell" if "N" in df.columns else "run",
               "bits_groups": {k: list(v) for k, v in BITS_GROUPS.items()},
               **tests,
               "within_noise": [e["name"] for e in entries if e.get("within_noise")],
               "chosen_residuals": heldout_errors_by_recipe(df, *errors[chosen][first]) if chosen in errors and first in errors[chosen] else [],
               "chosen_residuals_by_split": {by: heldout_errors_by_recipe(df, *errors[chosen][by]) for by in used
                                             if chosen in errors and by in errors[chosen]},
               "candidates": entries}
    return _json_safe(summary), fits


def chosen_fit(df: pd.DataFrame, choice: dict[str, Any], fits: Mapping[str, FitResult], *, bootstrap: int = 0,
               seed: int = 0, loss_column: str = "val_loss") -> FitResult:
    """The chosen law's full-data fit (select's `fits[choice["chosen"]]`) carrying `choice` as its selection,
    with `bootstrap` resamples. A law without a bits axis (capacity, kumar_eff) has no loss at a format it
    was not measured at, so the P* profile over the formats chips run is drawn from another law: the
    sound one with a bits axis that the data cannot tell from the chosen law (`within_noise`) and has the
    lowest held-out score, fitted on the same rows and resampled as the chosen one; stored as
    `choice["profile"]` = {name, fit: its FitResult.to_dict() without residuals}, or None (the chosen law
    has a bits axis, or no such law is within noise, or each one's resamples make it degenerate)."""
    result = fits[choice["chosen"]]
    result.selection = choice
    if bootstrap:
        fit.bootstrap_fit(df, result, bootstrap, seed, loss_column)
        result = _sound_after_bootstrap(df, choice, fits, result, bootstrap, seed, loss_column)
    choice["profile"] = None
    if laws.get(result.law).bits_axis:
        return result
    ranked = sorted((e for e in choice["candidates"] if e.get("within_noise") and e["name"] in fits
                     and laws.get(e["law"]).bits_axis and e.get("degenerate") is None), key=lambda e: e["score"])
    for entry in ranked:
        alt = fits[entry["name"]]
        if bootstrap:
            fit.bootstrap_fit(df, alt, bootstrap, seed, loss_column)
        if alt.degenerate is None:
            choice["profile"] = {"name": entry["name"],
                                 "fit": {k: v for k, v in alt.to_dict().items() if k not in ("residuals", "selection")}}
            break
    return result


def _test_clusters(df: pd.DataFrame) -> np.ndarray:
    """The likelihood tests' clusters: (N, seed) cells (module doc), the run where there is no N."""
    keys = [c for c in ("N", "seed") if c in df.columns]
    return df.groupby(keys, sort=False, dropna=False).ngroup().to_numpy() if "N" in keys else _run_ids(df)


def _as_splits(errs: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return errs if isinstance(errs, dict) else {"heldout": errs}


def _sound_after_bootstrap(df: pd.DataFrame, choice: dict[str, Any], fits: Mapping[str, FitResult], result: FitResult,
                           bootstrap: int, seed: int, loss_column: str) -> FitResult:
    """The chosen fit, or, where its resamples make it degenerate (fit.degenerate_reason), the next candidate
    in the selection's own order (held-out score, else AIC) whose full-data fit and resamples are sound:
    no optimum may be derived from a degenerate fit, so one is never kept while a sound one exists. Each
    law set aside is recorded in `choice["set_aside"]` (name, reason) and the criterion says so."""
    if result.degenerate is None:
        return result
    order = sorted((e for e in choice["candidates"] if e["fittable"] and e["name"] in fits
                    and e["name"] != choice["chosen"] and e.get("degenerate") is None),
                   key=lambda e: (e["score"] if e.get("score") is not None else np.inf, e["aic"], e["n_params"]))
    choice["set_aside"] = [{"name": choice["chosen"], "reason": result.degenerate}]
    for entry in order:
        alt = fits[entry["name"]]
        fit.bootstrap_fit(df, alt, bootstrap, seed, loss_column)
        if alt.degenerate is None:
            choice["criterion"] += "; " + "; ".join(f"`{a['name']}` set aside: its bootstrap made it degenerate ({a['reason']})"
                                                     for a in choice["set_aside"]) + f"; `{entry['name']}` is the next sound one"
            choice["chosen"] = entry["name"]
            alt.selection = choice
            return alt
        choice["set_aside"].append({"name": entry["name"], "reason": alt.degenerate})
    return result  # every candidate is degenerate: the first, as chosen, says why


def _ranked_splits(fitted: list[dict[str, Any]], errors: Mapping[str, dict]) -> tuple[list[str], list[dict[str, Any]]]:
    """(the splits ranked on, the laws scored on each of them): the splits every scored law was scored on
    (else the one most were), in the order the laws list them."""
    scored = [e for e in fitted if errors.get(e["name"])]
    if not scored:
        return [], []
    common = set.intersection(*(set(errors[e["name"]]) for e in scored))
    if not common:
        counts: dict[str, int] = {}
        for e in scored:
            for by in errors[e["name"]]:
                counts[by] = counts.get(by, 0) + 1
        common = {max(counts, key=counts.get)}
    used = [by for by in dict.fromkeys(by for e in scored for by in errors[e["name"]]) if by in common]
    return used, [e for e in scored if set(used) <= set(errors[e["name"]])]


def _excess(e: dict, base: dict, errors: Mapping[str, dict], used: Sequence[str], clusters: np.ndarray) -> tuple[float, float]:
    """(the split-averaged mean of |e's error| - |base's| on the same held-out rows, its SE clustered by
    `clusters` across splits: pooled_mean_and_var; NaN with a single cluster)."""
    parts = []
    for by in used:
        (pos, err), (pos_b, err_b) = errors[e["name"]][by], errors[base["name"]][by]
        assert np.array_equal(pos, pos_b)  # held-out rows depend on the data only, not the law
        parts.append((np.abs(err) - np.abs(err_b), clusters[pos]))
    delta, var, _ = pooled_mean_and_var(parts)
    return delta, float(np.sqrt(var))


def _score_se(e: dict, errors: Mapping[str, dict], used: Sequence[str], clusters: np.ndarray) -> float:
    """The SE of e's score (the split-averaged mean |error|), clustered by `clusters` across splits
    (pooled_mean_and_var); NaN with a single cluster."""
    parts = [(np.abs(errors[e["name"]][by][1]), clusters[errors[e["name"]][by][0]]) for by in used]
    return float(np.sqrt(pooled_mean_and_var(parts)[1]))


def _band(group: list[dict], errors: Mapping[str, dict], used: Sequence[str], clusters: np.ndarray) -> tuple[dict, float]:
    """(the best-scoring law of `group`, the highest score within noise of it: its score + NOISE_SE of its
    SE; infinite with a single cluster, where the data cannot rank any law)."""
    best = min(group, key=lambda e: (e["score"], e["n_params"]))
    se = _score_se(best, errors, used, clusters)
    return best, (best["score"] + NOISE_SE * se if np.isfinite(se) else np.inf)


def _simplest_within_noise(group: list[dict], errors: Mapping[str, dict], used: Sequence[str], clusters: np.ndarray) -> dict:
    """TIE_RULE: among `group`, the laws within noise of the best score, the one with the fewest free params."""
    best, top = _band(group, errors, used, clusters)
    return min((e for e in group if e is best or e["score"] <= top), key=lambda e: (e["n_params"], e["score"]))


def _tester(errors: Mapping[str, dict], clusters: np.ndarray, used: Sequence[str]):
    """(test(big, small, alpha): likelihood_test memoised with `beats` = p < alpha, the memo)."""
    memo: dict[tuple, dict[str, Any]] = {}

    def test(big: dict, small: dict, alpha: float = ALPHA) -> dict[str, Any]:
        key = (big["name"], small["name"], alpha)
        if key not in memo:
            memo[key] = {"big": big["name"], "small": small["name"], "alpha": alpha,
                         **likelihood_test(errors[big["name"]], errors[small["name"]], clusters, used)}
            memo[key]["beats"] = bool(memo[key]["p_value"] is not None and memo[key]["p_value"] < alpha)
        return memo[key]

    return test, memo


def _precision_step(entries: list[dict], sound: list[dict], errors: Mapping[str, dict], used: Sequence[str],
                    clusters: np.ndarray, test, tests: dict[str, Any]) -> tuple[dict, str, dict | None]:
    """Steps (2) and (3) of the module doc: (the law kept, how, the chinchilla entry tested against or None);
    fills tests["precision_test"]."""
    chin = next((e for e in sound if e.get("law") == "chinchilla" and e["name"] == "chinchilla"), None) or \
        next((e for e in sound if e.get("law") == "chinchilla"), None)
    precise = [e for e in sound if e.get("law") and laws.get(e["law"]).precision_axis]
    top = _simplest_within_noise(precise or sound, errors, used, clusters)
    best = min(precise or sound, key=lambda e: (e["score"], e["n_params"]))
    how = ("the lowest mean held-out gap MAE" if top is best else
           f"the fewest params within noise of the best score (`{best['name']}`)")
    if not precise:
        return top, how, chin
    if chin is None:
        listed = next((e for e in entries if e.get("law") == "chinchilla"), None)
        why = ("no chinchilla candidate to test a precision term against" if listed is None else
               f"`{listed['name']}` could not be fitted" if not listed["fittable"] else
               f"`{listed['name']}` is degenerate ({listed['degenerate']})" if listed.get("degenerate") else
               f"`{listed['name']}` was not scored on the held-out splits {', '.join(used)}")
        tests["precision_test"] = {"verdict": None, "reason": why}
        return top, how, None
    pt = tests["precision_test"] = {**test(top, chin, ALPHA / len(precise)), "bonferroni": len(precise)}
    pt["verdict"] = (f"`{top['name']}` beats `{chin['name']}` (no precision term)" if pt["beats"] else
                     f"no law with a precision term beats `{chin['name']}`: it is chosen")
    if pt["beats"]:
        return top, f"the precision test, then {how}", chin
    return chin, "the precision test (no precision law beats chinchilla)", chin


def _nested_walk(chosen: dict, how: str, sound: list[dict], chin: dict | None, test) -> tuple[dict, str]:
    """Step (4): the chosen law gives way to the law it nests unless it beats it at ALPHA, and to a law
    nesting it that beats it at ALPHA (repeated; never down to chinchilla once the precision test said yes)."""
    same = [e for e in sound if e.get("law")]
    for _ in range(8):  # a chain of nested laws is short; each step is one test
        law = laws.get(chosen["law"])
        smaller = next((e for e in same if law.nests and e["law"] == law.nests and e["fixed"] == chosen["fixed"]
                        and (e is not chin or chin is None)), None)
        bigger = next((e for e in same if laws.get(e["law"]).nests == chosen["law"] and e["fixed"] == chosen["fixed"]), None)
        if smaller is not None and not test(chosen, smaller)["beats"]:
            chosen, how = smaller, f"the nested test (`{chosen['name']}` does not beat `{smaller['name']}`)"
        elif bigger is not None and test(bigger, chosen)["beats"]:
            chosen, how = bigger, f"the nested test (`{bigger['name']}` beats `{chosen['name']}`)"
        else:
            break
    return chosen, how


def _choose(entries: list[dict[str, Any]], errors: Mapping[str, Any], clusters: np.ndarray,
            test_clusters: np.ndarray | None = None, tests: dict[str, Any] | None = None) -> tuple[str | None, str]:
    """Choose a law (the module doc's steps) and mark every law within noise of it; returns (chosen,
    criterion) and fills `tests` (precision_test, nested_tests, choice_rule, splits: those ranked on).

    errors: name -> {split: (positions, held-out gap errors)} (or one (positions, errors) pair);
    `clusters` (recipes) cluster the MAE comparisons, `test_clusters` ((N, seed) cells; default
    `clusters`) the likelihood tests. Without a chinchilla candidate there is no precision test; where no
    law has a precision term the tie rule runs over every sound law. A degenerate full-data fit
    (fit.degenerate_reason) is scored but chosen only when every law is. Without held-out gaps: the sound
    fit with the lowest AIC. within_noise: the chosen law and every scored law whose score is within noise
    of the best sound score (_band; a single cluster: every law is). gap_mae_diff: each scored law's
    excess over the chosen one, paired by row, its SE clustered by recipe (_excess).
    """
    tests = {} if tests is None else tests
    tests.update({"precision_test": None, "nested_tests": [], "choice_rule": CHOICE_RULE, "splits": []})
    fitted = [e for e in entries if e["fittable"]]
    errors = {k: _as_splits(v) for k, v in errors.items()}
    for e in entries:
        e["within_noise"], e["score"], e["gap_mae_diff"] = False, None, None
    used, ranked = _ranked_splits(fitted, errors)
    tests["splits"] = used
    if not ranked:
        if not fitted:
            return None, "none: no candidate could be fitted"
        best = min([e for e in fitted if not e.get("degenerate")] or fitted, key=lambda e: (e["aic"], e["n_params"]))
        best["within_noise"] = True
        return best["name"], ("aic (no held-out precision gap could be measured; the sound fit with the lowest AIC, "
                              "degenerate fits only where every fit is)")
    for e in ranked:
        e["score"] = float(np.mean([np.mean(np.abs(errors[e["name"]][by][1])) for by in used]))
    sound = [e for e in ranked if not e.get("degenerate")] or ranked
    test, memo = _tester(errors, clusters if test_clusters is None else test_clusters, used)
    chosen, how, chin = _precision_step(entries, sound, errors, used, clusters, test, tests)
    if chosen.get("law") and (chosen is not chin or chin is None):
        chosen, how = _nested_walk(chosen, how, sound, chin, test)
    pt = tests["precision_test"] or {}
    tests["nested_tests"] = [t for t in memo.values() if (t["big"], t["small"], t["alpha"]) != (pt.get("big"), pt.get("small"), pt.get("alpha"))]
    _, top = _band(sound, errors, used, clusters)
    for e in ranked:
        delta, se = _excess(e, chosen, errors, used, clusters)
        e["gap_mae_diff"] = {"value": delta, "se": _finite(se)}
        e["within_noise"] = e is chosen or e["score"] <= top
    return chosen["name"], f"heldout_gap_mae (mean over the held-out splits {', '.join(used)}; chosen by {how})"


CHOICE_RULE = ("score = mean over the held-out splits (largest compute budget, largest N, largest D/N; every row at "
               "or beyond each threshold left out) of the held-out precision-gap MAE; " + TIE_RULE + "; precision "
               "test: that law vs chinchilla, a held-out likelihood ratio clustered by (N, seed), one-sided at "
               f"{ALPHA:g}/K over the K sound precision laws it was picked among (Bonferroni): if it does not beat "
               "chinchilla, chinchilla is chosen; nested laws (kumar within kumar_data) by the same test at "
               f"{ALPHA:g}; within noise: a score at most the best plus {NOISE_SE:g} SE of the best law's score; "
               "degenerate fits scored, never chosen while a sound one exists")


def stability(entries: list[dict[str, Any]], errors: Mapping[str, dict], clusters: np.ndarray, cells: np.ndarray,
              resamples: int = STABILITY_RESAMPLES, seed: int = 0) -> dict[str, float] | None:
    """How often each scored law is chosen when the (N, seed) cells (`cells`, one per row of the table) of
    the held-out rows are resampled with replacement `resamples` times, the whole choice (_choose) repeated
    on each resample's errors (no refit): {name: share}, every scored law listed; None without held-out
    errors or resamples."""
    errors = {k: _as_splits(v) for k, v in errors.items()}
    if not resamples or not errors:
        return None
    n = len(cells)
    _, cells = np.unique(cells, return_inverse=True)
    present = np.unique(np.concatenate([pos for errs in errors.values() for pos, _ in errs.values()]))
    pool = np.unique(cells[present])
    wide_clusters, wide_cells = np.tile(clusters, len(pool)), np.repeat(np.arange(len(pool)), n)
    rng = np.random.default_rng(seed)
    wins = {e["name"]: 0 for e in entries if e["name"] in errors}
    for _ in range(resamples):
        resampled = _resample(errors, cells, rng.choice(pool, size=len(pool), replace=True), n)
        chosen, _ = _choose([dict(e) for e in entries], resampled, wide_clusters, wide_cells)
        if chosen is not None:
            wins[chosen] = wins.get(chosen, 0) + 1
    return {name: count / resamples for name, count in sorted(wins.items(), key=lambda kv: -kv[1])}


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
               reference: str | None = None, *, resamples: int = STABILITY_RESAMPLES, **fit_kwargs: Any) -> dict[str, Any]:
    """Fit every candidate law and rank them by how well they predict held-out *precision gaps*.

    candidates: names or variants ('kumar', 'kumar[kappa free]', 'kumar[kappa=2]'); default: every
        registered law plus each with its default-fixed params freed (default_candidates()).
    reference: the high-precision recipe (a `recipe` value); default: the rows with the largest P.
    resamples: cluster resamples for `stability` (0: none).
    fit_kwargs: passed to fit_law (init, iters, polish, ...); an `init` grid applies to every law that
        has those params.

    A gap is a row's loss minus the loss of the reference run with the same (N, D, seed if present);
    the law's predicted gap is law(x) - law(x_ref). On each strict split (heldout_splits) a law is fitted
    on the rows below the threshold and predicts the held-out gaps (rows without a matching reference are
    not scored; the count is n_heldout; gaps from fewer than two runs are not used). The choice is the
    module doc's; `within_noise` lists the chosen law and every law whose score is within NOISE_SE of the
    best law's standard errors (clustered by recipe) of the best score: the data do not rank those. Also per law: AIC with n =
    number of runs, in-sample MARE of the loss, params; and the chosen law's held-out gap errors per
    recipe (heldout_errors_by_recipe). Laws that cannot be fitted are listed with the reason.

    Returns {"chosen": name or None, "criterion", "choice_rule", "rule" (TIE_RULE), "loss_column",
    "reference", "splits": [by] or [], "split" (the first) and "split_details": [{by, key, value (the
    threshold), label, held_rows, held_runs, scored_rows, train_rows, train_runs, note}], "split_notes",
    "precision_test", "nested_tests", "noise_se", "clustered_by", "stability": {name: share} or None,
    "stability_resamples", "stability_unit", "within_noise": [names], "chosen_residuals": [{recipe, n,
    runs, mean, ci}, ...], "candidates": [{name, law, fixed, fittable, reason, n_params, aic, mare,
    objective, heldout_gap_mae: {by}, n_heldout: {by}, heldout_notes, score, gap_mae_diff: {value, se},
    within_noise, params, degenerate (why the full-data fit is degenerate, or None)}, ...]} (unfittable
    entries: name, law, fixed, fittable False, reason, within_noise False, score None, gap_mae_diff None).
    """
    return select(df, candidates, loss_column, reference, fit_kwargs, resamples=resamples)[0]
