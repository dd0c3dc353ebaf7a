"""What a study's results support, as numbers (findings.json): the IsoFLOP analysis at every budget
(scaling.study.analysis), P* with its bootstrap CI and specification range
against the published ranges, a law's residuals by recipe, learning-rate optima, and the purpose sweeps'
own tests (scaling schemes against per-tensor scaling, Smooth-SwiGLU on against off)."""

from __future__ import annotations

import copy
import math
from typing import Any, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from scaling.train import compute as compute_lib
from scaling.study.analysis import laws
from scaling.study.analysis.pstar import optimal
from scaling.study.analysis import fit as fit_lib
from scaling.study.analysis.pstar import profile as profile_lib
from scaling.study.analysis.fit import FitResult
from scaling.study.analysis.pstar.optimum_check import too_few_runs
from scaling.study.analysis.isoflop import (LEVEL, analyse, default_budgets, high_precision_recipe, ok_rows,
    replicate_noise, sweep_family, with_cost)
from scaling.errors import ConfigError

# ----------------------------------------------------------------------------- findings

def lr_optima(df: pd.DataFrame, loss_column: str = "val_loss") -> pd.DataFrame:
    """The best AdamW peak rate per (recipe, N) of a learning-rate probe (experiments/lr_precision.toml):
    at each run's last evaluation, the vertex of a parabola in log lr through the three best rates
    (the grid's best rate if that vertex falls outside them; `edge` when the best rate is the grid's
    smallest or largest, so the optimum may lie beyond it). `shift` is log2(best / the high-precision
    recipe's best at the same N); `resolution` the grid's step in log2; `differs` is |shift| above
    one step, the probe's resolution. Columns: recipe, N, lr, edge, shift, resolution, differs."""
    rows = ok_rows(df)
    last = rows.loc[rows.groupby("run_id")["D"].idxmax()]
    out = []
    for (recipe, n), g in last.groupby(["recipe", "N"], sort=True):
        g = g.sort_values("lr")
        x, y = np.log2(g["lr"].to_numpy(float)), g[loss_column].to_numpy(float)
        i = int(np.argmin(y))
        best = x[i]
        if 0 < i < len(x) - 1:
            a, b, c = np.polyfit(x[i - 1:i + 2], y[i - 1:i + 2], 2)
            if a > 0 and x[i - 1] <= -b / (2 * a) <= x[i + 1]:
                best = -b / (2 * a)
        step = float(np.median(np.diff(x))) if len(x) > 1 else math.nan
        out.append({"recipe": recipe, "N": float(n), "lr": float(2 ** best), "edge": i in (0, len(x) - 1),
                    "resolution": step})
    table = pd.DataFrame(out, columns=["recipe", "N", "lr", "edge", "resolution"])
    reference = high_precision_recipe(last)
    ref = table[table["recipe"] == reference].set_index("N")["lr"]
    table["shift"] = np.log2(table["lr"] / table["N"].map(ref))
    table["differs"] = table["shift"].abs() > table["resolution"]
    return table[["recipe", "N", "lr", "edge", "shift", "resolution", "differs"]]


def residuals_by_recipe(df: pd.DataFrame, fit: FitResult, level: float = LEVEL,
                        loss_column: str = "val_loss") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Where a fitted law is biased: (rows with `residual` = observed - fitted loss, per recipe the
    mean residual over runs with a t confidence interval: recipe, mean, lo, hi, runs). A run's
    evaluations share its noise, so the interval treats runs, not rows, as independent."""
    rows = ok_rows(df)
    rows = rows.assign(residual=rows[loss_column].to_numpy(float) - np.asarray(fit.predict(rows), float))
    per_run = rows.groupby(["recipe", "run_id"], sort=True)["residual"].mean()
    out = []
    for recipe, r in per_run.groupby(level=0):
        n, mean = len(r), float(r.mean())
        half = float(stats.t.ppf(0.5 + level / 2, n - 1) * r.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
        out.append({"recipe": recipe, "mean": mean, "lo": mean - half, "hi": mean + half, "runs": n})
    return rows, pd.DataFrame(out, columns=["recipe", "mean", "lo", "hi", "runs"])


PUBLISHED = {"Kumar et al. 2024": (7.0, 8.0), "Sun et al. 2025": (4.0, 8.0)}
KAPPAS = (2.0, 4.0)  # fixed-kappa alternatives to a kumar-family fit's kappa = 3 (plus kappa fitted)


def loss_unit(df: pd.DataFrame) -> str:
    """'nats/byte' for byte-tokenised corpora (every corpus the toolkit trains on today), else 'nats/token'."""
    if "tokenizer" in df.columns and df["tokenizer"].dropna().astype(str).ne("bytes").any():
        return "nats/token"
    return "nats/byte"


def against_range(interval: Sequence[float] | None, lo: float, hi: float) -> str:
    """A published range against our P* interval (CI and specification range together): 'inside' if
    the whole interval lies in [lo, hi], 'outside' if none of it does, else 'cannot tell'."""
    if interval is None:
        return "cannot tell"
    a, b = interval
    if lo <= a and b <= hi:
        return "inside"
    if b < lo or a > hi:
        return "outside"
    return "cannot tell"


def against_published(interval: Sequence[float] | None) -> dict[str, str]:
    """`interval` against each PUBLISHED range (against_range: inside, outside or cannot tell), by name."""
    return {name: against_range(interval, a, b) for name, (a, b) in PUBLISHED.items()}


def specification_fits(df: pd.DataFrame, fit: FitResult, loss_column: str = "val_loss") -> list[tuple[str, Any]]:
    """The fits P* is reported across: the chosen law; for a law with kappa, kappa at each of KAPPAS
    and fitted; every candidate the selection found within noise of the best (fit.selection) whose
    precision axis is bits (`_has_bits`)."""
    out = [(f"{fit.law} (chosen{', kappa ' + format(fit.params['kappa'], 'g') if 'kappa' in fit.params else ''})", fit)]
    rows = ok_rows(df)
    if "kappa" in fit.params:
        for kappa in (*KAPPAS, None):
            fixed = {**(fit.fixed or {}), "kappa": kappa} if kappa is not None else \
                {k: v for k, v in (fit.fixed or {}).items() if k != "kappa"}
            try:
                alt = fit_lib.fit_law(rows, fit.law, fixed=fixed, loss_column=loss_column)
            except ConfigError:
                continue
            alt.data = {**alt.data, fit_lib.SHARE_KEY: fit_lib.stored_share(fit.data)}
            out.append((f"{fit.law}, kappa {'fitted' if kappa is None else format(kappa, 'g')}", alt))
    chosen = (getattr(fit, "selection", None) or {}).get("chosen")
    for cand in (getattr(fit, "selection", None) or {}).get("candidates", []):
        if cand.get("within_noise") and cand.get("params") and cand.get("name") != chosen and _has_bits(cand["law"]):
            # its own data's ranges (sun reads a hypothetical format at their median block), the chosen fit's
            # unquantised share
            try:
                data = fit_lib.data_summary(rows, cand["law"], cand.get("fixed"), loss_column)
            except ConfigError:  # rows without the law's columns: its optimum then says what it lacks
                data = {}
            if fit_lib.stored_share(fit.data):
                data[fit_lib.SHARE_KEY] = fit_lib.stored_share(fit.data)
            alt = fit_lib.FitResult(law=cand["law"], params=dict(cand["params"]), objective=0.0,
                                    residuals=np.zeros(0), fixed=cand.get("fixed") or {}, data=data)
            out.append((f"{cand['name']} (within noise)", alt))
    return out


def _has_bits(law: str) -> bool:
    """Whether a law's precision axis is bits, which P* optimises over: not chinchilla (no precision
    term: the cost alone would pick the fewest bits) nor capacity (precision as each role's
    quantisation error, with no map from a hypothetical P to that error)."""
    return laws.has_bits_axis(law)


def findings(df: pd.DataFrame, fit: FitResult | None, *, cost: str = "bits", budgets: Sequence[float] | None = None,
             n_boot: int = 2000, ci_samples: int = 100, loss_column: str = "val_loss",
             noise_rows: pd.DataFrame | None = None, level: float = LEVEL,
             pairs: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """Everything REPORT.md may claim, as numbers: per budget the IsoFLOP analysis (each recipe's
    effective bits, minimum loss, CI, runs, probability of being best; winner or None), and P* at
    each budget with its bootstrap CI (chosen law, chosen cost model), its specification range
    (across specification_fits x optimal.cost_models) and whether each published range holds it.
    noise_rows: the table whose seed replicates measure run-to-run noise (default df); level: the
    confidence level of every IsoFLOP verdict and interval; pairs: (a, b) recipe contrasts a study
    wants at every budget besides each recipe's gap to the reference (analysis.isoflop's `pairs`).

    Each P_star entry (one per budget) also holds `profile` (profile.precision_profile: the chosen law's
    loss at each format real chips run, with bootstrap CIs, family-wise neighbour differences, untrained
    formats flagged and a continuous P* only where the law and data support one; {"error": ...} where
    it cannot be made), `law_interval` (the law's P* span: P, P_ci, the specification range, or for a law
    without a bits axis its best recipes' bits and the within-noise laws' P*) with `published_law` (inside,
    outside or cannot tell against each published range, apart from the measured recipes') and `measured_bits` (the
    effective bits, bits_eff, of the recipes the IsoFLOP measurement cannot rule out: measured recipes, not
    the law). `interval` spans both, a law's bits and measured recipes' bits_eff together, as before;
    `P_grid` says when P and P_ci are whole-bit grid points (a law on integer E, M bits)."""
    cost_model = compute_lib.get(cost)
    main = compute_lib.backfill(ok_rows(df))
    noise_rows = df if noise_rows is None else noise_rows
    costable = "flops_fprop" in main.columns and main["flops_fprop"].notna().all()
    if not budgets:
        budgets = default_budgets(main, cost_model) if costable else []
    out = _measured_findings(df, main, budgets, cost_model, n_boot, noise_rows, costable, level, pairs)
    if fit is None:
        return out
    out["law"] = {"name": fit.law, "params": fit.params, "fixed": fit.fixed,
                  "heldout": fit.heldout, "selection": getattr(fit, "selection", None)}
    if laws.get(fit.law).precision_axis is None:  # chinchilla: the cost alone would pick the fewest bits
        return out
    # no IsoFLOP budget: the law is still read at the largest compute a run reached
    at = budgets or ([float(with_cost(main, cost_model)["C"].max())] if costable else [])
    # what the IsoFLOP measurement itself cannot rule out at each budget: part of every P* interval, so a
    # law that disagrees with the measurement widens the interval instead of overruling it
    measured = {float(b["budget"]): measured_choice(b, level) for b in out["budgets"]}
    few = too_few_runs(main, fit)
    if few:
        out["P_star"] = [{"compute": float(c), "measured": measured.get(float(c), []), "error": few,
                          "measured_bits": [m["bits"] for m in measured.get(float(c), [])],
                          "profile": {"error": few}} for c in at]
        return out
    fit = _with_share(fit, main)
    specs = specification_fits(main, fit, loss_column)
    chosen_cost = optimal.Cost(model=cost_model, share=optimal.share_of(fit))
    for c in at:
        if _has_bits(fit.law):
            entry = _pstar_over_bits(fit, c, specs, chosen_cost, ci_samples, measured.get(float(c), []))
        else:
            entry = _pstar_over_recipes(main, fit, c, specs, chosen_cost, cost_model,
                                        measured.get(float(c), []))
        entry["measured_bits"] = [m["bits"] for m in entry["measured"]]
        try:
            entry["profile"] = profile_lib.precision_profile(fit, c, cost=chosen_cost, trained=main,
                                                             max_samples=ci_samples)
        except (ConfigError, ValueError) as e:
            entry["profile"] = {"error": str(e)}
        out["P_star"].append(entry)
    return out


def _measured_findings(df: pd.DataFrame, main: pd.DataFrame, budgets: Sequence[float],
                       cost_model: compute_lib.CostModel, n_boot: int, noise_rows: pd.DataFrame,
                       costable: bool, level: float = LEVEL, pairs: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """findings' measured part: units, runs, seeds, and the IsoFLOP analysis at every budget (none
    when the results cannot be placed at a budget, with the reason as `note`); law parts empty."""
    return {
        "loss_unit": loss_unit(df), "cost_model": cost_model.describe(),
        "runs": int(main["run_id"].nunique()) if "run_id" in main.columns else len(main),
        "seeds_per_cell": _seeds_per_cell(main),
        "budgets": analyse(main, budgets, cost_model, n_boot=n_boot, level=level, noise=replicate_noise(noise_rows),
                           pairs=pairs) if costable else [],
        "note": None if costable else "the results do not record FLOPs by part (nor size, recipe and "
                                      "flops_per_token to derive them), so no run can be placed at a budget",
        "law": None, "P_star": [],
    }


def _with_share(fit: FitResult, main: pd.DataFrame) -> FitResult:
    """The fit, carrying its runs' unquantised share (for the cost of a hypothetical model) if it lacks one."""
    if fit_lib.stored_share(fit.data):
        return fit
    fit = copy.copy(fit)
    share = compute_lib.UnquantisedShare.from_results(compute_lib.backfill(main))
    fit.data = {**(fit.data or {}), fit_lib.SHARE_KEY: share.to_dict()}
    return fit


def _pstar_over_bits(fit: FitResult, compute: float, specs: list[tuple[str, Any]], chosen_cost: optimal.Cost,
                     ci_samples: int, measured: list[dict]) -> dict[str, Any]:
    """P* at `compute` for a law whose precision axis is bits: the optimum with its bootstrap CI, the
    specification range across laws and cost models, `law_interval` spanning them, and `interval`
    spanning those and the measured choice (the measured recipes' effective bits: two kinds of number in
    one span), with inside, outside or cannot tell against each published range (or `error` if the
    optimum cannot be found). P_grid: why P and P_ci are whole bits, for a law on integer E, M bits (None otherwise)."""
    entry: dict[str, Any] = {"compute": float(compute), "measured": measured}
    entry["P_grid"] = (f"the {fit.law} law reads integer exponent and mantissa bits: P* is searched over whole "
                       "bits (each split 1 + E + M at the fitted data's median block), so it has no bootstrap CI "
                       "(one over a grid of whole bits is the grid's, not the data's); see `profile`"
                       if {"ebits", "mbits"} <= set(_law_columns(fit)) else None)
    try:
        best = optimal.optimal_precision(fit, compute, cost=chosen_cost, p_range=(2.0, 32.0))
        entry.update(P=best["P"], N=best["N"], D=best["D"])
        if entry["P_grid"]:
            entry["P_ci"] = None  # the profile's paired, family-wise intervals are this law's uncertainty
        elif len(getattr(fit, "samples", [])) >= 2:
            entry["P_ci"] = list(optimal.optimal_precision_ci(fit, compute, cost=chosen_cost, p_range=(2.0, 32.0),
                                                              max_samples=ci_samples)["P"])
        else:
            entry["P_ci"] = None
    except ConfigError as e:
        entry["error"] = str(e)
        return entry
    spec = optimal.specification_range(specs, compute, optimal.cost_models(fit))
    entry.update(P_range=spec["P_range"], specifications=spec["table"])
    law_span = [entry["P"], *(entry["P_ci"] or []), *(spec["P_range"] or [])]
    entry["law_interval"] = [min(law_span), max(law_span)]
    entry["published_law"] = against_published(entry["law_interval"])
    span = [*law_span, *(m["bits"] for m in entry["measured"])]
    lo, hi = min(span), max(span)
    entry["interval"] = [lo, hi]
    entry["published"] = against_published([lo, hi])
    return entry


def _pstar_over_recipes(main: pd.DataFrame, fit: FitResult, compute: float, specs: list[tuple[str, Any]],
                        chosen_cost: optimal.Cost, cost_model: compute_lib.CostModel, measured: list[dict]) -> dict[str, Any]:
    """P* at `compute` for a law without a bits axis (e.g. capacity: precision as measured quantisation
    error, with no map from a hypothetical P to it). The law still ranks the measured recipes (each at
    its own quantisation errors and cost) under every cost model; a continuous P* comes only from the
    within-noise laws whose axis is bits, if any. `error` when nothing gives a P*."""
    costs = optimal.cost_models(fit)
    bits_specs = [(label, alt) for label, alt in specs[1:] if _has_bits(alt.law)]
    entry = {"compute": float(compute), "P": None, "P_ci": None, "no_bits_axis": fit.law,
             "recipes": recipe_optima(main, fit, compute, chosen_cost, cost_model),
             "measured": measured}
    table = []
    for cst in costs:
        top = (recipe_optima(main, fit, compute, cst, cost_model) or [None])[0]
        if top:
            table.append({"spec": f"{fit.law} (chosen; best recipe {top['recipe']})", "cost_model": cst.name,
                          "P": top["bits"], "N": top["N"], "D": top["D"], "loss": top["loss"]})
    if bits_specs:
        table += optimal.specification_range(bits_specs, compute, costs)["table"]
    ps = [r["P"] for r in table if "P" in r]
    if ps:
        entry.update(P_range=[float(min(ps)), float(max(ps))], specifications=table)
    bits = [e["bits"] for e in entry["recipes"] if e["best"] or e.get("within_law_error_of_best")]
    entry["law_interval"] = [min([*bits, *ps]), max([*bits, *ps])] if bits or ps else None
    if entry["law_interval"]:
        entry["published_law"] = against_published(entry["law_interval"])
    span = [*bits, *ps, *(m["bits"] for m in entry["measured"])]
    if not span:
        entry["error"] = (f"{laws.get(fit.law).no_bits_reason}, and no law with a bits axis is within noise of the "
                          "chosen one: these data give no P*")
    else:
        entry["interval"] = [min(span), max(span)]
        entry["published"] = against_published(entry["interval"])
    return entry


def measured_choice(analysis: dict, level: float = LEVEL) -> list[dict]:
    """The recipes an IsoFLOP analysis at one budget (`isoflop`) cannot rule out as best: P(best) at
    least (1 - level) / 2 in the bootstrap, best first, with their effective bits."""
    keep = [e for e in analysis["recipes"] if e.get("p_best") is not None and e["p_best"] >= (1 - level) / 2]
    return [{"recipe": e["recipe"], "bits": float(e["bits_eff"]), "P": float(e["P"]), "p_best": float(e["p_best"])}
            for e in sorted(keep, key=lambda e: -e["p_best"])]


def recipe_optima(df: pd.DataFrame, fit: FitResult, compute: float, cost: optimal.Cost,
                  cost_model: compute_lib.CostModel) -> list[dict]:
    """A law without a bits axis read at `compute` for each measured recipe: a law on quantisation
    errors (capacity) at the recipe's median qerr_w/a/g over the runs, a law with a fitted efficiency or
    gap per recipe (kumar_eff, recipe_gap) at the recipe's own; the recipe's mean effective bits as the
    cost's P (every quantised FLOP at that width: an approximation for recipes that quantise only some
    roles); the compute-optimal N, D and loss under the law, sorted best first. Each row says whether its
    loss is within the law's error of the lowest (within_law_error_of_best: above it by less than the
    law's held-out error, a fraction of the loss, times the lowest loss; None where the fit has no
    held-out error): the law's own resamples hold its parameter noise only, far below its error, so a
    share of resamples in which a recipe is best would claim what the law cannot tell. Recipes with no
    quantisation error recorded, or that a per-recipe law was not fitted on, are left out."""
    law = fit.law_form
    df = laws.with_derived_columns(df, law.error_columns)
    cols = [c for c in law.error_columns if c in df.columns]
    if not (cols or law.per_recipe) or "recipe" not in df.columns:
        return []
    runs = with_cost(df, cost_model).dropna(subset=cols)
    if law.per_recipe:
        runs = runs[runs["recipe"].astype(str).isin(law.recipes)]
    per = runs.groupby("recipe").agg(**{c: (c, "median") for c in cols}, bits=("bits_eff", "mean"))
    table = []
    for recipe, r in per.iterrows():
        context = {c: float(r[c]) for c in cols} | ({"recipe": str(recipe)} if law.per_recipe else {})
        best = optimal.optimal_precision(fit, compute, [float(r["bits"])], cost=cost, context=context)
        table.append({"recipe": str(recipe), "bits": float(r["bits"]), "N": best["N"], "D": best["D"],
                      "loss": best["loss"]})
    table.sort(key=lambda e: e["loss"])
    error = (fit.heldout or {}).get("mare")
    for i, e in enumerate(table):
        e["best"] = i == 0
        e["within_law_error_of_best"] = (None if error is None else
                                         bool(e["loss"] - table[0]["loss"] < float(error) * table[0]["loss"]))
    return table


def _law_columns(fit: FitResult) -> tuple[str, ...]:
    return laws.get(fit.law).columns


def corpora(df: pd.DataFrame, budget: float | None = None) -> dict[str, dict[str, int]]:
    """{corpus: {recipe: runs}} of the rows (at `budget` where given), most runs first: which data each
    recipe trained on (`pysrc` is what the training venv holds, so runs from two venvs differ in data)."""
    return _runs_by(df, "corpus", budget)


def hosts(df: pd.DataFrame, budget: float | None = None) -> dict[str, dict[str, int]]:
    """{host: {recipe: runs}}, as `corpora`: which kind of machine each recipe's runs trained on
    (`hardware`: the CPU's GEMM-relevant flags, or the GPU). One config on two kinds gives two runs
    whose losses differ: the GEMM paths round differently and training carries it on."""
    return _runs_by(df, "hardware", budget)


def other_hosts(p: dict) -> bool:
    """Whether the fit's data are the budget's (its corpora recorded and equal, so the lower budgets in
    these results are the rows it fitted) while its runs trained on other kinds of host."""
    corpora, hosts = p.get("corpora") or {}, p.get("hosts") or {}
    if not corpora.get("fitted") or sorted(corpora["fitted"]) != sorted(corpora.get("measured") or []):
        return False
    lower = _lower_hosts(hosts)
    return bool(hosts.get("measured")) and bool(lower) and set(hosts["measured"]) != lower


def _lower_hosts(hosts: dict) -> set[str]:
    """The kinds of host a scored prediction's lower budgets trained on (report.prediction_facts' `hosts`)."""
    return {h for by in (hosts.get("lower") or {}).values() for h in by}


def host_shift_between(p: dict) -> dict | None:
    """The paired host measurement (findings.host_shift) between the kinds of host a scored prediction
    spans, if one was made."""
    hosts = p.get("hosts") or {}
    spanned = set(hosts.get("measured") or {}) | _lower_hosts(hosts)
    return next((s for s in p.get("host_shift") or [] if set(s["hosts"]) <= spanned and s.get("ci")), None)


def _runs_by(df: pd.DataFrame, column: str, budget: float | None) -> dict[str, dict[str, int]]:
    if column not in df.columns or df.empty:
        return {}
    if budget is not None and "budget" in df.columns:
        df = df[np.isclose(pd.to_numeric(df["budget"], errors="coerce"), budget, rtol=1e-6)]
    runs = df.drop_duplicates("run_id").assign(**{column: lambda d: d[column].fillna("not recorded").astype(str)})
    counts = runs.groupby([column, "recipe"]).size()
    order = runs[column].value_counts().index
    return {c: {str(r): int(n) for r, n in counts[c].items()} for c in order}


def _seeds_per_cell(df: pd.DataFrame) -> list[int]:
    """[min, max] number of seeds per (sweep, recipe, N, D) cell."""
    if df.empty or "seed" not in df.columns:
        return [1, 1]
    keys = [k for k in ("sweep", "recipe", "N", "D") if k in df.columns]
    n = df.groupby(keys)["seed"].nunique()
    return [int(n.min()), int(n.max())]


# ----------------------------------------------------------------------------- the purpose sweeps

def final_rows(results: pd.DataFrame) -> pd.DataFrame:
    """Each run's row at the largest token budget it evaluated."""
    return results.sort_values("D").groupby("run_id", as_index=False).tail(1)


def purpose_rows(df: pd.DataFrame | None, name: str) -> pd.DataFrame | None:
    """The rows of one purpose sweep (PURPOSE_SWEEPS), each run's last evaluation; None if it has none."""
    if df is None or "sweep" not in df.columns:
        return None
    part = df[sweep_family(df["sweep"]) == name]
    return None if part.empty else final_rows(part).reset_index(drop=True)


def _direction(ci: Sequence[float] | None) -> str:
    """'lower' or 'higher' where an interval of a difference excludes zero, else 'cannot tell'."""
    if ci is None or ci[0] <= 0 <= ci[1]:
        return "cannot tell"
    return "lower" if ci[1] < 0 else "higher"


def _status_counts(df: pd.DataFrame, by: str) -> dict[str, dict[str, int]]:
    """{value of `by`: {status: runs}} for the runs that did not finish ok (diverged, failed, ...)."""
    bad = df[df["status"].astype(str) != "ok"] if "status" in df.columns else df.iloc[0:0]
    return {str(k): {str(s): int(n) for s, n in g["status"].value_counts().items()} for k, g in bad.groupby(by)}


def scheme_effects(df: pd.DataFrame, level: float = LEVEL) -> dict[str, Any] | None:
    """The granularity sweep: each scaling scheme (granularity x scale timing) against per-tensor,
    current scaling in the same format, paired by seed (same initialisation and data order).

    The paired differences' scatter about their means, pooled over the comparisons (sigma, dof = sum
    of (pairs - 1)), gives each mean difference a t interval; a comparison whose scatter is far above
    the others' (F test of the largest against the rest, repeated) keeps its own (`own_noise`). The
    intervals are simultaneous at `level` over all m comparisons (Bonferroni: each at 1 - (1 - level)
    / m), so "lower" or "higher" is a claim about the whole table, and "cannot tell" where an
    interval includes zero.
    Runs that did not finish ok are counted, not compared. None without the sweep's columns."""
    need = {"recipe", "format", "granularity", "scaling", "seed", "val_loss"}
    if df is None or not need <= set(df.columns):
        return None
    ok = ok_rows(df)
    cells = ok.groupby(["format", "granularity", "scaling", "seed"], as_index=False)["val_loss"].mean()
    recipes = ok.groupby(["format", "granularity", "scaling"])["recipe"].first()
    pairs = []
    for (fmt, gran, timing), recipe in recipes.items():
        if (gran, timing) == ("tensor", "current") or (fmt, "tensor", "current") not in recipes.index:
            continue
        mine = cells[(cells["format"] == fmt) & (cells["granularity"] == gran) & (cells["scaling"] == timing)]
        ref = cells[(cells["format"] == fmt) & (cells["granularity"] == "tensor") & (cells["scaling"] == "current")]
        both = mine.merge(ref, on="seed", suffixes=("", "_ref"))
        if len(both):
            pairs.append({"format": str(fmt), "recipe": str(recipe), "granularity": str(gran), "scaling": str(timing),
                          "reference": str(recipes[(fmt, "tensor", "current")]),
                          "d": (both["val_loss"] - both["val_loss_ref"]).to_numpy(),
                          "loss": float(both["val_loss"].mean()), "loss_ref": float(both["val_loss_ref"].mean())})
    m = len(pairs)
    for p in pairs:
        p["dof"] = len(p["d"]) - 1
        p["ss"] = float(np.sum((p["d"] - p["d"].mean()) ** 2))
    # One noise level for every comparison, unless one's scatter is far above the rest's (a scheme that
    # trains chaotically, e.g. delayed per-tensor scales at 6 bits): the largest is F-tested against the
    # others' pooled scatter at (1 - level) / k and, while it fails, keeps its own scatter.
    pooled = [p for p in pairs if p["dof"] >= 1]
    while len(pooled) >= 2:
        worst = max(pooled, key=lambda p: p["ss"] / p["dof"])
        rest = [p for p in pooled if p is not worst]
        rest_dof = sum(p["dof"] for p in rest)
        rest_var = sum(p["ss"] for p in rest) / rest_dof
        if rest_var > 0 and stats.f.sf(worst["ss"] / worst["dof"] / rest_var, worst["dof"], rest_dof) >= (1 - level) / len(pooled):
            break
        worst["own"] = True
        pooled = rest
    dof = sum(p["dof"] for p in pooled)
    sigma = math.sqrt(sum(p["ss"] for p in pooled) / dof) if dof else None
    rows = []
    for p in pairs:
        own = p.pop("own", False)
        mine = (math.sqrt(p["ss"] / p["dof"]), p["dof"]) if own else (sigma, dof)
        diff = float(p["d"].mean())
        ci = None
        if mine[0] is not None and mine[1] >= 1:
            half = float(stats.t.ppf(1 - (1 - level) / (2 * m), mine[1])) * mine[0] / math.sqrt(len(p["d"]))
            ci = [diff - half, diff + half]
        rows.append({k: v for k, v in p.items() if k not in ("d", "ss", "dof")} |
                    {"n": len(p["d"]), "diff": diff, "ci": ci, "own_noise": own, "verdict": _direction(ci)})
    return {"runs": int(df["run_id"].nunique()) if "run_id" in df.columns else len(df),
            "comparisons": m, "sigma": sigma, "dof": dof, "level": level, "rows": rows,
            "not_ok": _status_counts(df, "recipe")}


def smooth_swiglu_effect(df: pd.DataFrame, level: float = LEVEL) -> dict[str, Any] | None:
    """The outlier sweep: final validation loss with Smooth-SwiGLU on minus off, paired by everything
    else (recipe, learning rate, seed); the mean difference with a t interval on the pairs' own
    scatter (n - 1 dof), "cannot tell" where it includes zero. Runs that did not finish ok are
    counted by Smooth-SwiGLU on/off. None without the sweep's columns."""
    need = {"smooth_swiglu", "recipe", "lr", "seed", "val_loss"}
    if df is None or not need <= set(df.columns):
        return None
    keys = ["recipe", "lr", "seed"]
    ok = ok_rows(df).assign(smooth_swiglu=lambda d: d["smooth_swiglu"].astype(bool))
    on, off = (ok[ok["smooth_swiglu"] == flag].groupby(keys, as_index=False)["val_loss"].mean() for flag in (True, False))
    both = on.merge(off, on=keys, suffixes=("_on", "_off"))
    d = (both["val_loss_on"] - both["val_loss_off"]).to_numpy()
    n = len(d)
    diff = float(d.mean()) if n else None
    ci = None
    if n >= 2:
        half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * float(d.std(ddof=1)) / math.sqrt(n)
        ci = [diff - half, diff + half]
    status = df.assign(smooth_swiglu=df["smooth_swiglu"].astype(bool).map({True: "on", False: "off"}))
    return {"runs": int(df["run_id"].nunique()) if "run_id" in df.columns else len(df), "n": n, "diff": diff,
            "ci": ci, "level": level,
            "verdict": _direction(ci),
            "pairs": [{"recipe": str(r.recipe), "lr": float(r.lr), "seed": int(r.seed), "on": float(r.val_loss_on),
                       "off": float(r.val_loss_off)} for r in both.itertuples()],
            "not_ok": _status_counts(status, "smooth_swiglu")}
