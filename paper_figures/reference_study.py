"""The reference study's own story: its arms, its side experiments and what its REPORT says of them.

The package's report (scaling.study.report) writes what any study needs; this module adds the
sections of the study committed here (`experiments/isoflop*.toml`, `granularity.toml`, `outliers.toml`,
`gpu_pilot.toml`), as `report.Section`s that `scaling figures --sections paper_figures/reference_study.py`
and `paper_figures/make_figures.py` pass in:

- the FP4 arm: the published FP4 training recipes against the plain formats they build on, the
  reference, FP8 and MXFP6 (FP4_PAIRS are bootstrapped with every IsoFLOP profile);
- the forward-only integer arm, like for like with Kumar et al. 2024;
- runs trained again on another kind of host (`results/<sweep>_hosts.csv`), which size how far the
  host moves a loss (read by the held-out budget's prediction section);
- the GPU pilot (`results/gpu_pilot.csv`), reported on its own runs by the same rules;
- the calibrated predictor scored on every pair of the study's budgets (`results/<sweep>_backtests.json`,
  from `scaling predict --backtest --results results/isoflop.csv --law sun -o results/isoflop_backtests.json`).

A study of your own writes a module like this one: `PAIRS` (recipe contrasts to bootstrap, optional)
and `sections(results_path) -> list[report.Section]`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from scaling.errors import ConfigError
from scaling.study.analysis import findings as findings_lib
from scaling.study.report import law_prose, plots, prose, writer as report
from scaling.study.sweeps import results as results_lib
from scaling.study.analysis.isoflop import LEVEL, analyse, high_precision_recipe, pair_verdict, replicate_noise
from scaling.study.analysis.findings import PUBLISHED, against_range, measured_choice
from scaling.train import compute as compute_lib

# The published FP4 training recipes (scaling.numerics.precision presets) and the plain format each
# builds on: NVIDIA's NVFP4 recipe on NVFP4, Quartet's QuEST-style MXFP4 (simplified and as its code
# trains) and Tseng et al.'s MXFP4 backward on MXFP4. FP4_PAIRS adds Quartet in full against its
# simplification, and every published recipe against the 8- and 6-bit formats (FP4_ABOVE): does FP4
# trained this way close the gap to them?
FP4_PUBLISHED = {"nvfp4-nvidia": "nvfp4", "quartet": "mxfp4", "quartet-full": "mxfp4", "mxfp4-rht": "mxfp4"}
FP4_ABOVE = ("fp8", "mxfp6")
FP4_PAIRS = (tuple(FP4_PUBLISHED.items()) + (("quartet-full", "quartet"),)
             + tuple((p, above) for p in FP4_PUBLISHED for above in FP4_ABOVE))
PAIRS = FP4_PAIRS  # the contrasts every IsoFLOP profile of this study bootstraps


def findings(df: pd.DataFrame, fit: Any | None, **kwargs: Any) -> dict[str, Any]:
    """findings_lib.findings with this study's contrasts, plus its FP4 and integer arms (as REPORT's
    findings.json holds them)."""
    out = findings_lib.findings(df, fit, pairs=PAIRS, **kwargs)
    main = main_rows(df)
    noise_rows = kwargs.get("noise_rows")
    out["fp4_arm"] = fp4_arm(out["budgets"], main)
    out["integer_arm"] = integer_arm_findings(main, df if noise_rows is None else noise_rows, out,
                                              kwargs.get("n_boot", 2000), kwargs.get("level", LEVEL), kwargs.get("cost", "bits"))
    return out


def main_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows the arms read, as findings reads them: ok, with FLOPs by part derived where missing."""
    return compute_lib.backfill(findings_lib.ok_rows(rows))


def sections(results_path: str | Path | None = None) -> list[report.Section]:
    """This study's sections; its side experiments' files are found beside `results_path`
    (results/gpu_pilot.csv, results/<sweep>_hosts.csv) where they exist."""
    results_path = Path(results_path) if results_path is not None else None
    folder = results_path.parent if results_path is not None else None
    hosts = folder / f"{results_path.stem}_hosts.csv" if folder is not None else None
    pilot = folder / "gpu_pilot.csv" if folder is not None else None
    backtests = folder / f"{results_path.stem}_backtests.json" if folder is not None else None
    hosts_rows = results_lib.load(hosts) if hosts is not None and hosts.is_file() else None
    pilot_rows = results_lib.load(pilot) if pilot is not None and pilot.is_file() else None
    out = [
        report.Section("integer_arm", lambda c: integer_arm_findings(c.main, c.noise, c.facts),
                       "Like for like with Kumar et al.: the forward-only integer arm", integer_arm_section),
        report.Section("fp4_arm", lambda c: fp4_arm(c.facts["budgets"], main_rows(c.main)),
                       "The FP4 arm: plain and as published", fp4_arm_section),
    ]
    if hosts_rows is not None:  # facts only: the prediction's section reads them
        out.append(report.Section("host_shift", lambda c: host_shift(c.ok, hosts_rows)))
    if backtests is not None and backtests.is_file():
        found = load_backtests(backtests)
        out.append(report.Section("backtests", lambda c: found, "The calibrated predictor, backtested on the study's budgets",
                                  law_prose.backtests_section, before="pstar"))
    if pilot_rows is not None:
        out.append(report.Section("gpu_pilot", lambda c: gpu_pilot_facts(pilot_rows), "The GPU pilot",
                                  lambda f: gpu_pilot_section(f["gpu_pilot"]), before="what_was_run"))
    return out


def load_backtests(path: Path) -> dict[str, Any]:
    """`scaling predict --backtest`'s JSON, checked to be one."""
    try:
        found = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError("backtests", str(path), f"a JSON from `scaling predict --backtest` ({e})") from None
    if not isinstance(found, dict) or not {"pairs", "law", "level", "reference"} <= set(found):
        raise ConfigError("backtests", str(path), "a JSON from `scaling predict --backtest`")
    return found


# ----------------------------------------------------------------------------- the arms' numbers

def kept_share(df: pd.DataFrame) -> dict[str, list[float]]:
    """Per recipe that keeps blocks in high precision, the range over its runs of the share of linear-layer
    GEMM FLOPs so kept (flops_kept_* over kept plus quantised); {} without those columns."""
    kept = [f"flops_kept_{g}" for g in ("fprop", "dgrad", "wgrad")]
    quantised = [f"flops_{g}" for g in ("fprop", "dgrad", "wgrad")]
    if not set(kept + quantised) <= set(df.columns):
        return {}
    k = df[kept].apply(pd.to_numeric, errors="coerce").sum(axis=1)
    share = k / (k + df[quantised].apply(pd.to_numeric, errors="coerce").sum(axis=1))
    by = share[k > 0].groupby(df.loc[k > 0, "recipe"])
    return {str(r): [float(v.min()), float(v.max())] for r, v in by}


def fp4_arm(budgets: list[dict], df: pd.DataFrame | None = None) -> list[dict[str, Any]]:
    """The FP4 arm at each budget where a published FP4 recipe was fitted: every FP4 recipe's minimum
    against the reference's (the paired gap and its CI, with the published recipes and without), and
    each published recipe against the plain format it builds on (`pairs`) and against FP8 and MXFP6
    (`above`); [] without one. With the runs (`df`), each entry also gives `kept` (kept_share of the
    FP4 recipes' runs at that budget)."""
    fp4 = set(FP4_PUBLISHED) | set(FP4_PUBLISHED.values())
    out = []
    for b in budgets:
        fitted = {e["recipe"]: e for e in b["recipes"] if e["loss"] is not None}
        if not set(FP4_PUBLISHED) & set(fitted):
            continue
        reference = next((r for r, e in fitted.items() if e["gap"] is None), None)
        gaps = [{"recipe": r, "published": r in FP4_PUBLISHED, "gap": e["gap"], "ci": e["gap_ci"],
                 "inside": e["inside"]} for r, e in sorted(fitted.items()) if r in fp4 and e["gap"] is not None]
        kept = {}
        if df is not None and "budget" in df.columns:
            at = df[np.isclose(pd.to_numeric(df["budget"], errors="coerce"), b["budget"], rtol=1e-6)]
            kept = kept_share(at[at["recipe"].isin(fp4)])
        pairs = [dict(p) for p in b.get("pairs", [])]
        out.append({"budget": b["budget"], "reference": reference, "gaps": gaps,
                    "pairs": [p for p in pairs if p["b"] not in FP4_ABOVE],
                    "above": [p for p in pairs if p["b"] in FP4_ABOVE],
                    "kept": kept})
    return familywise(out)


def familywise(arm: list[dict], level: float = LEVEL) -> list[dict]:
    """Bonferroni over every claim the arm makes (each gap to the reference and each pair, at every
    budget): with m claims, each gets `familywise_ci`, its own 95% bootstrap interval widened on either
    side of the estimate by z(1 − (1 − level)/2m) / z(1 − (1 − level)/2) (a normal approximation to the
    bootstrap's tails: the resamples are too few for a percentile that far out), and a pair's `verdict`
    is read from it. Every entry of the arm says so (`familywise`: rule, m, level)."""
    claims = [e for b in arm for e in (*b["gaps"], *b["pairs"], *b["above"]) if e.get("ci")]
    m = len(claims)
    if not m:
        return arm
    widen = float(stats.norm.ppf(1 - (1 - level) / (2 * m)) / stats.norm.ppf(1 - (1 - level) / 2))
    for e in claims:
        centre = e["gap"] if "gap" in e else e["diff"]
        e["familywise_ci"] = [centre - widen * (centre - e["ci"][0]), centre + widen * (e["ci"][1] - centre)]
    for b in arm:
        b["familywise"] = {"rule": "Bonferroni", "m": m, "level": level, "widening": widen}
        for p in (*b["pairs"], *b["above"]):
            if p.get("familywise_ci"):
                p["verdict"] = pair_verdict(p["a"], p["b"], p["diff"], p["familywise_ci"], p.get("inside", True), level,
                                            "family-wise CI")
    return arm


def integer_arm(df: pd.DataFrame) -> pd.DataFrame:
    """The like-for-like arm for Kumar et al. 2024, who trained integer weights and activations in the
    forward pass only: the rows of recipes whose forward GEMMs are integer and whose backward GEMMs
    are unquantised (format int*, P_bwd >= 16), plus the high-precision reference recipe's rows.
    Empty unless at least two such integer recipes are present."""
    if not {"format", "P_bwd", "recipe"} <= set(df.columns):
        return df.iloc[0:0]
    integer = df["format"].astype(str).str.startswith("int") & (df["P_bwd"].astype(float) >= 16)
    if df.loc[integer, "recipe"].nunique() < 2:
        return df.iloc[0:0]
    reference = high_precision_recipe(df)
    return df[integer | (df["recipe"] == reference)]


def integer_arm_findings(main: pd.DataFrame, noise_rows: pd.DataFrame, facts: dict, n_boot: int = 2000,
                         level: float = LEVEL, cost: str = "bits") -> list[dict[str, Any]]:
    """The IsoFLOP analysis of the forward-only integer arm at each budget where two or more of its
    integer recipes trained (a study may train the arm at some budgets only), compared with the
    published ranges on the forward precision P (Kumar et al.'s), not effective bits; [] without the arm."""
    if not facts["budgets"]:  # the results cannot be placed at a budget (findings' `note`)
        return []
    budgets, cost_model = [b["budget"] for b in facts["budgets"]], compute_lib.get(cost)
    main = main_rows(main)
    arm = integer_arm(main)
    if arm.empty:
        return []
    reference = high_precision_recipe(main)
    out = analyse(arm, budgets, cost_model, n_boot=n_boot, level=level, noise=replicate_noise(integer_arm(noise_rows)))
    out = [b for b in out if sum(e["recipe"] != reference for e in b["recipes"]) >= 2]
    for b in out:
        b["measured"] = measured_choice(b, level)
        forward = [m["P"] for m in b["measured"]]
        b["P_interval"] = [min(forward), max(forward)] if forward else None
        b["published"] = {name: against_range(b["P_interval"], lo, hi) for name, (lo, hi) in PUBLISHED.items()}
    return out


def host_shift(rows: pd.DataFrame, again: pd.DataFrame | None, level: float = LEVEL) -> list[dict[str, Any]]:
    """How far the kind of host moves a run's loss: runs of `rows` trained again, same config and seed
    (so the same run id), on another kind of host (`again`), paired at the same IsoFLOP points (run
    id, tokens; the points serving a budget where the rows say so). One entry per pair of host kinds:
    the loss on the first minus on the second, its mean over runs (each run's points averaged: a run's
    points share one trajectory) with a t interval over runs, and the points' RMS; [] without pairs."""
    if again is None or again.empty or not {"hardware", "run_id", "D", "val_loss"} <= set(rows.columns) & set(again.columns):
        return []
    def points(d: pd.DataFrame) -> pd.DataFrame:
        d = d[np.isfinite(pd.to_numeric(d["val_loss"], errors="coerce")) & d["hardware"].notna()]
        if "budget" in d.columns:
            d = d[d["budget"].notna()]
        return d[["run_id", "D", "recipe", "hardware", "val_loss"]].drop_duplicates(["run_id", "D"])
    pairs = points(rows).merge(points(again), on=["run_id", "D"], suffixes=("_a", "_b"))
    pairs = pairs[pairs["hardware_a"] != pairs["hardware_b"]]
    flip = pairs["hardware_a"] > pairs["hardware_b"]  # orient every pair the same way: first host by name
    pairs = pairs.assign(first=pairs["hardware_a"].where(~flip, pairs["hardware_b"]),
                         second=pairs["hardware_b"].where(~flip, pairs["hardware_a"]),
                         diff=(pairs["val_loss_a"] - pairs["val_loss_b"]).where(~flip, pairs["val_loss_b"] - pairs["val_loss_a"]))
    out = []
    for (first, second), both in pairs.groupby(["first", "second"]):
        per_run = both.groupby("run_id")["diff"].mean()
        entry = {"hosts": [first, second], "runs": int(len(per_run)), "points": int(len(both)),
                 "recipes": sorted(both["recipe_a"].astype(str).unique()), "mean": float(per_run.mean()),
                 "rms": float(np.sqrt((both["diff"] ** 2).mean())), "ci": None}
        if len(per_run) >= 2:
            half = stats.t.ppf(0.5 + level / 2, len(per_run) - 1) * per_run.std(ddof=1) / math.sqrt(len(per_run))
            entry["ci"] = [entry["mean"] - half, entry["mean"] + half]
        out.append(entry)
    return out


# ----------------------------------------------------------------------------- the arms' sections


def integer_arm_section(f: dict) -> str:
    """The forward-only integer arm (like for like with Kumar et al. 2024) per budget; '' without it."""
    arm = f.get("integer_arm") or []
    if not arm:
        return ""
    lo, hi = findings_lib.PUBLISHED["Kumar et al. 2024"]
    lines = [f"Kumar et al. 2024 quantised integer weights and activations in the forward pass only and put the "
             f"compute-optimal precision at {lo:g}-{hi:g} bits. The same comparison here: the forward-only integer "
             "recipes (backward GEMMs unquantised, costed at 16 bits) against the high-precision reference alone."]
    for b in arm:
        head = f"**C = {prose.fmt(b['budget'])}.** " + prose.verdict_sentence(b, f["loss_unit"])
        if b.get("P_interval"):
            lo_p, hi_p = b["P_interval"]
            span = f"{lo_p:g}" if lo_p == hi_p else f"{lo_p:g}-{hi_p:g}"
            name = "Kumar et al. 2024"
            v = b["published"][name]
            head += (" Not ruled out as best (P(best) ≥ 0.025): " +
                     ", ".join(f"{m['recipe']} ({m['P']:g} forward bits, P(best) {m['p_best']:.2f})" for m in b["measured"]) +
                     f": forward precision {span} bits; against {name}'s {lo:g}-{hi:g} bits, "
                     + ("cannot tell." if v == "cannot tell" else f"{v}."))
        lines += ["", head, "",
                  "| recipe | bits P | charged per FLOP | runs (sizes) | IsoFLOP minimum | 95% CI | P(best) |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for e in sorted(b["recipes"], key=lambda e: (e["loss"] is None, e["loss"] or 0)):
            if e["loss"] is None:
                lines.append(f"| {e['recipe']} | {prose.bits_cell(e)} | {e['bits_eff'] / 16:.3g} | {e['runs']} ({e['sizes']}) | too few sizes | – | – |")
                continue
            ci = f"{e['ci'][0]:.4g}–{e['ci'][1]:.4g}" if e["ci"] else "–"
            p_best = f"{e['p_best']:.2f}" if e["p_best"] is not None else "–"
            lines.append(f"| {e['recipe']} | {prose.bits_cell(e)} | {e['bits_eff'] / 16:.3g} | {e['runs']} ({e['sizes']}) | {e['loss']:.4g} | {ci} | {p_best} |")
    return "\n".join(lines)


def fp4_arm_section(f: dict) -> str:
    """The FP4 arm per budget: each FP4 recipe's IsoFLOP minimum against the reference's, plain and as
    published, and each published recipe against the plain format it builds on; '' without one."""
    arm, unit = f.get("fp4_arm") or [], f["loss_unit"]
    if not arm:
        return ""
    present = {g["recipe"] for b in arm for g in b["gaps"]}
    plain = ", ".join(f"`{p}` on `{b}`" for p, b in FP4_PUBLISHED.items() if p in present)
    lines = ["The FP4 recipes as they are trained today (" + plain + ": Hadamard rotations, square weight tiles, "
             "stochastic rounding of gradients, blocks kept in BF16 where the recipe says) against plain MXFP4 and "
             "NVFP4, each at its IsoFLOP minimum on the same shapes at the same budget. A gap is the recipe's "
             f"minimum minus the reference's ({unit}, shape-adjusted, paired over the same resamples); a minimum "
             "at the edge of its sizes is an upper bound on the recipe's best, so a gap there is no verdict."]
    fw = arm[0].get("familywise")
    if fw:
        lines[0] += (f" The arm makes {fw['m']} claims (every gap and pair at every budget); each is read from its "
                     f"family-wise interval ({fw['rule']} over the {fw['m']}, {fw['level']:.0%} for all together: each "
                     f"95% bootstrap interval widened {fw['widening']:.2f}x about its estimate, a normal approximation to "
                     "tails the resamples are too few to reach).")
    if "quartet" in present:
        lines[0] += (" `quartet` simplifies the paper: its backward GEMMs quantise W and X afresh with QuEST's "
                     "clipping scale, rounded to nearest (a biased gradient), and apply no trust mask "
                     "(docs/precision.md); its gaps are this implementation's" +
                     (", and `quartet-full` adds both parts." if "quartet-full" in present else
                      "; `quartet-full`, which adds both parts, is not in these results."))
    for b in arm:
        lines += ["", f"**C = {prose.fmt(b['budget'])}**, reference {b['reference']}:", "",
                  "| recipe | published recipe | gap to the reference | 95% CI | family-wise CI | minimum inside its sizes |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for g in sorted(b["gaps"], key=lambda g: g["gap"]):
            fw = g.get("familywise_ci")
            lines.append(f"| {g['recipe']} | {'yes' if g['published'] else 'no'} | {g['gap']:+.3f} | "
                         f"{g['ci'][0]:+.3f} to {g['ci'][1]:+.3f} | {f'{fw[0]:+.3f} to {fw[1]:+.3f}' if fw else '–'} | "
                         f"{'yes' if g['inside'] else 'no (edge)'} |")
        for pr in b["pairs"]:
            lines += ["", f"- {pr['a']} against {pr['b']}: {pr['verdict']}."]
        if b.get("above"):
            lines += ["", "Does FP4 trained this way close the gap to the 8- and 6-bit formats (paired, same shapes)?", ""]
            lines += [f"- {pr['a']} against {pr['b']}: {pr['verdict']}." for pr in b["above"]]
        for recipe, (lo, hi) in sorted((b.get("kept") or {}).items()):
            span = f"{lo:.0%}" if round(lo, 2) == round(hi, 2) else f"{lo:.0%}–{hi:.0%}"
            lines += ["", f"- {recipe} keeps {span} of its linear-layer GEMM FLOPs in high precision at these shapes "
                          "(the blocks it keeps are a large part of models this small; at the published scale they are a small share), and "
                          "pays for them in tokens at the same budget."]
    return "\n".join(lines)


def gpu_pilot_facts(rows: pd.DataFrame) -> dict[str, Any]:
    """findings.json's `gpu_pilot`: a GPU pilot's IsoFLOP findings by the main study's rules, on its own
    runs alone (its corpus is the GPU machine's, so no comparison with the main study is made)."""
    return {**findings(plots.validate_results(rows), None), "corpus": prose.corpus_of(rows)}


def gpu_pilot_section(g: dict) -> str:
    """The GPU pilot beside the CPU study: its own IsoFLOP profiles and verdicts, or why it has none."""
    corpus = f" ({g['corpus']})" if g.get("corpus") else ""
    return "\n".join([f"The runs of `experiments/gpu_pilot.toml` on a GPU (docs/gpu.md names it and its speeds), on that "
                      f"machine's corpus{corpus}. Its corpus is not the one above, so its losses are compared only with "
                      "each other, by the same rules.", "", prose.findings_section(g)])

