"""P* as a profile: a fitted law's loss at each number format real chips run, at one compute budget.

A single P* hides how flat the law is around it and, for laws on exponent/mantissa bits, is a grid
point (sun's "5 bits, CI 5-5": E1M3 at the fitted data's median block, a format nobody trained and no
chip has). `precision_profile` answers the question instead over a list of formats (default
CHIP_FORMATS: NVFP4, MXFP4, MXFP6 E2M3/E3M2, FP8 E4M3/E5M2 per tensor, MXFP8 E4M3, BF16, FP32; or a
user's list, `parse_formats`): for each the law's loss at its compute-optimal N under the cost model
(the format's element bits, plus its scale bits per element as the cost's overhead), with a bootstrap
CI of that loss (fit.samples), and for each pair of neighbours (ordered by bits per element, scales
included) a paired CI of their difference (same resample), family-wise over the pairs (Bonferroni),
and its direction: "lower" / "higher" (the next format's loss below / above this one's) or "cannot tell".
The bootstrap draws hold the law's parameter noise only, not its error off the data, so no format is
called "best" with a probability from them: `judge_within_error` reads each difference, and each
format's distance from the lowest loss, against the law's measured error instead.

Each format is flagged `untrained` where the fit never saw it trained: its bits (or E, M, block for a
law that reads them) outside the ranges fit.data["columns"] records, or, given the fitted runs
(`trained`), its (E, M, granularity) not among theirs. Element format, bits, E and M come from
scaling.numerics.formats, blocks from scaling.numerics.quant.DEFAULT_BLOCK, scale bits from
scaling.train.compute.SCALE_BITS (so nothing here re-types a format). A per-tensor or unscaled format
takes the largest block the fit trained on (a scale shared by a whole tensor).

A continuous P* (`pstar`) is given only where the law and the data support one: a law whose precision
columns are bits (kumar, quartet, ...), searched over continuous P (never a grid of whole bits), with
the optimum strictly inside the trained bits, and the CI from each resample's own continuous optimum
(the share of resamples whose optimum is interior said). A law on integer exponent/mantissa bits
(sun) has none: it says so and the profile is its answer. A law without a bits axis (chinchilla,
capacity) has no loss at an untrained format; `profile_source` then draws the profile from the law with
a bits axis that law selection could not tell from it (selection.chosen_fit), said as `drawn_from`, or
gives none and says why.

The module is apart from optimal.py (which it uses: the same per-format N search) because it is the
only place that knows the chips' formats (and so imports scaling.numerics, lazily: JAX loads only when a
profile is asked for) and the paired, family-wise bootstrap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from scaling.errors import ConfigError
from scaling.study.analysis import laws
from scaling.study.analysis.pstar import optimal
from scaling.study.analysis.fit import SHARE_KEY, FitResult, stored_share


@dataclass(frozen=True)
class ChipFormat:
    """A format a chip runs: a scaling.numerics.formats element format at a quant granularity
    ("nvfp4", "mx", "block": a block scale; "tensor": one scale per tensor; "none": cast, no scale)."""

    name: str
    format: str
    granularity: str
    chips: str = ""


CHIP_FORMATS = (
    ChipFormat("nvfp4", "fp4_e2m1", "nvfp4"),
    ChipFormat("mxfp4", "fp4_e2m1", "mx"),
    ChipFormat("mxfp6 e2m3", "fp6_e2m3", "mx"),
    ChipFormat("mxfp6 e3m2", "fp6_e3m2", "mx"),
    ChipFormat("fp8 e4m3", "fp8_e4m3", "tensor"),
    ChipFormat("fp8 e5m2", "fp8_e5m2", "tensor"),
    ChipFormat("mxfp8 e4m3", "fp8_e4m3", "mx"),
    ChipFormat("bf16", "bf16", "none"),
    ChipFormat("fp32", "fp32", "none"),
)


def chips_running(f: ChipFormat) -> str:
    """The chips of the planner's table (scaling.plan.hardware.GPUS, the one source of chip rates) whose tensor
    cores run a format natively: a block-scaled one where the chip lists it, a per-tensor FP8 where it has
    an FP8 rate; BF16 and FP32 on every GPU. A ChipFormat's own `chips` (a user's) wins."""
    from scaling.plan import hardware

    if f.chips:
        return f.chips
    if f.granularity == "none":
        return "every GPU"
    family = f.name.split()[0]
    run = [key for key, gpu in hardware.GPUS.items()
           if (family in gpu.block_scaled if f.granularity in ("mx", "nvfp4") else "fp8" in gpu.peak_tflops)]
    return ", ".join(key.upper() for key in run) or "none in the table"


_BLOCK_SCALED = ("block", "mx", "nvfp4")
_GRANULARITIES = ("none", "tensor", *_BLOCK_SCALED)


def parse_formats(items: Sequence[str | ChipFormat] | None) -> tuple[ChipFormat, ...]:
    """A user's list: a CHIP_FORMATS name ("nvfp4", "mxfp6 e2m3", "bf16") or FORMAT[:GRANULARITY]
    (a scaling.numerics.formats name, e.g. "e3m4:mx", "fp8_e4m3:tensor"; default granularity: none for
    16+ bits, else tensor). None: CHIP_FORMATS."""
    if items is None:
        return CHIP_FORMATS
    named = {f.name: f for f in CHIP_FORMATS}
    out = []
    for item in items:
        if isinstance(item, ChipFormat):
            out.append(item)
            continue
        key = str(item).strip().lower()
        if key in named:
            out.append(named[key])
            continue
        fmt, _, gran = key.partition(":")
        from scaling.numerics import formats  # JAX only when a profile is asked for

        bits = formats.get(fmt).bits  # ConfigError for an unknown format
        gran = gran or ("none" if bits >= 16 else "tensor")
        if gran not in _GRANULARITIES:
            raise ConfigError("formats", item, f"FORMAT[:GRANULARITY] with granularity one of {', '.join(_GRANULARITIES)}")
        out.append(ChipFormat(key, fmt, gran))
    if not out:
        raise ConfigError("formats", list(items), "at least one format")
    return tuple(out)


def format_row(f: ChipFormat, fit: FitResult) -> dict[str, Any]:
    """A format's numbers as the package defines them: bits, E, M, block (the fit's largest trained
    block for a per-tensor or unscaled format), scale bits per element."""
    from scaling.numerics import formats, quant  # JAX only when a profile is asked for
    from scaling.train import compute as compute_lib

    fmt = formats.get(f.format)
    if f.granularity in _BLOCK_SCALED:
        block = float(quant.DEFAULT_BLOCK[f.granularity])
        overhead = compute_lib.SCALE_BITS[f.granularity] / block
        block_from = f"{f.granularity} block"
    else:
        span = ((fit.data or {}).get("columns") or {}).get("block") or {}
        block = float(span["max"]) if "max" in span else None
        overhead = 0.0
        block_from = "largest trained block (one scale per tensor)"
    return {"name": f.name, "format": fmt.name, "granularity": f.granularity, "chips": chips_running(f),
            "bits": float(fmt.bits), "ebits": float(fmt.ebits), "mbits": float(fmt.mbits),
            "block": block, "block_from": block_from, "overhead": float(overhead),
            "bits_per_element": float(fmt.bits + overhead)}


def _law_columns(law: laws.Law, row: Mapping[str, Any], context: Mapping[str, float]) -> dict[str, float]:
    """The law's precision columns at a format: E, M (and block) for a law on them, else every bits column = bits."""
    cols = dict(context)
    if {"ebits", "mbits"} <= set(law.columns):
        cols.update(ebits=row["ebits"], mbits=row["mbits"])
    for c in ("P", "P_w", "P_a", "P_g", "P_fwd", "P_bwd"):
        if c in law.columns:
            cols[c] = row["bits"]
    if "block" in law.columns and "block" not in cols:
        if row["block"] is None:
            raise ConfigError("fit.data.columns.block", None, f"the trained block range, for {row['name']}'s block under {law.name}")
        cols["block"] = row["block"]
    missing = [c for c in law.columns if c not in ("N", "D") and c not in cols]
    if missing:
        raise ConfigError("context", sorted(context), f"values for columns {missing} of law {law.name}")
    return cols


def untrained_reasons(fit: FitResult, row: Mapping[str, Any], trained: pd.DataFrame | None) -> list[str]:
    """Why the fit never saw this format trained ([] if it did): a value the law reads outside the range
    fit.data["columns"] records, or (given the fitted runs) its (E, M, granularity) not among theirs."""
    law = laws.get(fit.law)
    spans = (fit.data or {}).get("columns") or {}
    reasons = []
    checks = [("E", "ebits"), ("M", "mbits"), ("block", "block")] if "ebits" in law.columns else []
    checks += [("bits", c) for c in ("P", "P_w", "P_a", "P_g", "P_fwd", "P_bwd") if c in law.columns]
    for label, col in checks:
        value = row["bits"] if label == "bits" else row[col]
        span = spans.get(col) or {}
        if value is None or "min" not in span:
            continue
        lo, hi = float(span["min"]), float(span["max"])
        if not lo * (1 - 1e-9) <= value <= hi * (1 + 1e-9):
            reasons.append(f"{label} {value:.4g} outside the trained {lo:.4g}-{hi:.4g}")
    if trained is not None and {"ebits", "mbits"} <= set(trained.columns):
        keys = ["ebits", "mbits"] + (["granularity"] if "granularity" in trained.columns else [])
        have = {tuple(_key(v) for v in r) for r in trained[keys].dropna().itertuples(index=False)}
        mine = (_key(row["ebits"]), _key(row["mbits"]), row["granularity"])[:len(keys)]
        if mine not in have:
            scale = "unscaled" if row["granularity"] == "none" else f"with {row['granularity']} scaling"
            what = f"E{row['ebits']:g}M{row['mbits']:g}" + (f" {scale}" if len(keys) == 3 else "")
            reasons.append(f"{what} not among the fitted runs' formats")
    return reasons


def _key(v: Any) -> Any:
    return v if isinstance(v, str) else float(v)


def _losses(law, params, compute, rows, cols, costs, n_range) -> list[dict]:
    return [optimal._best_n(law, params, compute, r["bits"], c, cost, n_range) for r, c, cost in zip(rows, cols, costs)]


def profile_source(fit: FitResult) -> tuple[FitResult, str | None]:
    """The fit a P* profile is drawn from, and why it is not `fit` itself (None when it is): `fit` when its
    law has a bits axis or its selection stored no other (selection.chosen_fit's `profile`), otherwise that
    stored fit, carrying `fit`'s runs' unquantised share for the cost of a hypothetical model."""
    stored = (fit.selection or {}).get("profile") if not laws.get(fit.law).bits_axis else None
    if not stored:
        return fit, None
    alt = FitResult.from_dict(stored["fit"])
    alt.data = {**(alt.data or {}), SHARE_KEY: stored_share(fit.data) or stored_share(alt.data)}
    why = (f"{laws.get(fit.law).no_bits_reason}; the profile is the `{stored['name']}` law's, the law with a bits axis "
           f"that law selection could not tell from the chosen `{fit.law}` (within noise) with the lowest held-out "
           f"gap error, fitted on the same runs and resampled the same way")
    return alt, why


def precision_profile(fit: FitResult | Mapping[str, Any], compute: float,
                      formats: Sequence[str | ChipFormat] | None = None, cost: optimal.Cost | None = None, *,
                      trained: pd.DataFrame | None = None, level: float | None = None,
                      max_samples: int | None = 200, context: Mapping[str, float] | None = None,
                      n_range: tuple[float, float] = (1.0, np.inf),
                      p_range: tuple[float, float] = (2.0, 32.0)) -> dict[str, Any]:
    """The law's loss at each format at `compute` (see the module doc). cost: the cost model (its
    overhead is replaced by each format's scale bits; default: `bits` with the fit's runs' unquantised
    share); trained: the fitted runs (columns ebits, mbits, granularity) for the untrained flags (None:
    ranges only, said as `trained_formats_known` False); level: of every CI (default the bootstrap's);
    max_samples: resamples used (None: all).

    Returns {compute, law, cost_model, level, family_level, resamples, law_error, trained_formats_known,
    rows: [{name, format, granularity, chips, bits, ebits, mbits, block, block_from, overhead,
    bits_per_element, N, D, loss, loss_ci, untrained, untrained_reasons, within_law_error_of_best}] in
    bits-per-element order, pairs: [{from, to, diff (to - from), ci (family-wise), direction, within_law_error}],
    best (the lowest-loss row's name), pstar: {P, N, D, loss, ci, interior_share, reason},
    no_bits_axis: None or why the law has no profile, drawn_from: None or why the profile is another law's
    (profile_source)}."""
    fit, drawn_from = profile_source(optimal._fit(fit))
    law = laws.get(fit.law)
    cost = cost or optimal.Cost(share=optimal.share_of(fit))
    if not compute > 0:
        raise ConfigError("compute", compute, "a positive number of 16-bit FLOP units")
    level = float(level if level is not None else (fit.bootstrap or {}).get("level", 0.95))
    mare = (fit.heldout or {}).get("mare")
    out: dict[str, Any] = {"compute": float(compute), "law": fit.law, "cost_model": cost.name, "level": level,
                           "family_level": None, "resamples": 0, "law_error": None,
                           "trained_formats_known": trained is not None, "rows": [], "pairs": [], "best": None,
                           "pstar": {"P": None, "reason": None}, "no_bits_axis": None,
                           "drawn_from": drawn_from}
    if not law.bits_axis:
        why = law.no_bits_reason
        out["no_bits_axis"] = why
        out["pstar"]["reason"] = why
        return out
    context = dict(context or {})
    rows = [format_row(f, fit) for f in parse_formats(formats)]
    rows.sort(key=lambda r: (r["bits_per_element"], r["ebits"]))
    cols = [_law_columns(law, r, context) for r in rows]
    costs = [optimal.Cost(model=cost.model, share=cost.share, overhead=r["overhead"],
                          flops_per_param_token=cost.flops_per_param_token) for r in rows]
    point = _losses(law, fit.params, compute, rows, cols, costs, n_range)
    samples = fit.samples
    if max_samples is not None:
        samples = samples.iloc[:max_samples]
    boot = np.array([[b["loss"] for b in _losses(law, {**fit.params, **s}, compute, rows, cols, costs, n_range)]
                     for s in samples.to_dict("records")]) if len(samples) >= 2 else None
    tail = 100 * (1 - level) / 2
    m = len(rows) - 1
    family = 1 - (1 - level) / m if m else level
    ftail = 100 * (1 - family) / 2
    out.update(resamples=0 if boot is None else len(boot), family_level=family if m else None)
    for i, (r, p) in enumerate(zip(rows, point)):
        reasons = untrained_reasons(fit, r, trained)
        r.update(N=p["N"], D=p["D"], loss=p["loss"],
                 loss_ci=None if boot is None else [float(np.percentile(boot[:, i], tail)),
                                                    float(np.percentile(boot[:, i], 100 - tail))],
                 untrained=bool(reasons), untrained_reasons=reasons)
    for k in range(m):
        a, b = rows[k], rows[k + 1]
        diff = b["loss"] - a["loss"]
        ci = None
        if boot is not None:
            d = boot[:, k + 1] - boot[:, k]
            ci = [float(np.percentile(d, ftail)), float(np.percentile(d, 100 - ftail))]
        sign = "cannot tell" if ci is None or ci[0] <= 0 <= ci[1] else ("lower" if ci[1] < 0 else "higher")
        out["pairs"].append({"from": a["name"], "to": b["name"], "diff": float(diff), "ci": ci, "direction": sign})
    out["rows"] = rows
    out["best"] = min(rows, key=lambda r: r["loss"])["name"]
    judge_within_error(out, mare)
    out["pstar"] = continuous_pstar(fit, compute, cost, samples, level, n_range, p_range, context)
    return out


def judge_within_error(profile: dict[str, Any], law_error: float | None) -> dict[str, Any]:
    """Set the profile's `law_error` (the law's error as a fraction of the loss: its held-out error by
    default, or the larger error a study measured, e.g. a budget predicted before it was trained) and
    each neighbour pair's `within_law_error`: |difference| below that error times the lower-bits
    format's loss, whatever the bootstrap CI says; and each row's `within_law_error_of_best`: its loss
    above the lowest by less than that error times the lowest loss (the lowest itself: True). None
    without an error. Returns the profile."""
    profile["law_error"] = None if law_error is None else float(law_error)
    rows = profile.get("rows", [])
    loss = {r["name"]: r["loss"] for r in rows}
    for q in profile.get("pairs", []):
        q["within_law_error"] = None if law_error is None else bool(abs(q["diff"]) < law_error * loss[q["from"]])
    close = {r["name"] for r in within_error_of_best(profile)}
    for r in rows:
        r.pop("p_best", None)  # a profile written before: P(best) from parameter noise is not kept
        r["within_law_error_of_best"] = None if law_error is None else r["name"] in close
    return profile


def direction(pair: Mapping[str, Any]) -> str:
    """A neighbour pair's direction ("lower", "higher", "cannot tell"); a profile written before the key
    was named so (findings.json, fits) calls it `verdict`."""
    return pair.get("direction", pair.get("verdict"))


def within_error_of_best(profile: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The rows the law's error (`law_error`, a fraction of the loss) cannot tell from the lowest-loss one:
    loss above the lowest by less than that error times the lowest loss; lowest first, the lowest
    included; [] without a law error."""
    rows, error = profile.get("rows") or [], profile.get("law_error")
    if error is None or not rows:
        return []
    lowest = min(r["loss"] for r in rows)
    return sorted((r for r in rows if r["loss"] - lowest < error * lowest), key=lambda r: r["loss"])


def continuous_pstar(fit: FitResult, compute: float, cost: optimal.Cost, samples: pd.DataFrame, level: float,
                     n_range: tuple[float, float], p_range: tuple[float, float],
                     context: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The law's continuous P* where it and the data support one: {P, N, D, loss, ci, interior_share,
    trained, reason}; P None with the reason where not (integer E/M bits; no trained bits range; the
    optimum on or outside the trained bits)."""
    law = laws.get(fit.law)
    if {"ebits", "mbits"} <= set(law.columns):
        return {"P": None, "reason": f"the {law.name} law reads integer exponent and mantissa bits (E, M): between "
                                     "two formats there is no format, so it has no continuous P*; the profile over "
                                     "formats is its answer"}
    bits_cols = [c for c in ("P", "P_w", "P_a", "P_g", "P_fwd", "P_bwd") if c in law.columns]
    spans = [((fit.data or {}).get("columns") or {}).get(c) or {} for c in bits_cols]
    spans = [s for s in spans if "min" in s and "max" in s]
    if not spans:
        return {"P": None, "reason": "the fit records no trained bits range (data.columns; a fit from an older "
                                     "`scaling fit`), so whether a P* is inside it cannot be checked"}
    lo, hi = max(float(s["min"]) for s in spans), min(float(s["max"]) for s in spans)
    if not hi > lo:
        return {"P": None, "reason": f"the fit trained one bit width ({lo:g}): no minimum over bits can be located"}
    kw = dict(cost=cost, p_range=p_range, n_range=n_range, context=context, per_precision=False)
    best = optimal.optimal_precision(fit, compute, **kw)
    out = {"P": None, "N": best["N"], "D": best["D"], "loss": best["loss"], "trained": [lo, hi], "ci": None,
           "interior_share": None, "reason": None, "optimum": best["P"]}
    inside = lambda p: lo * (1 + 1e-6) < p < hi * (1 - 1e-6)  # noqa: E731
    if len(samples) >= 2:
        ps = np.array([optimal.optimal_precision(fit, compute, params={**fit.params, **s}, **kw)["P"]
                       for s in samples.to_dict("records")])
        tail = 100 * (1 - level) / 2
        out["ci"] = [float(np.percentile(ps, tail)), float(np.percentile(ps, 100 - tail))]
        out["interior_share"] = float(np.mean([inside(p) for p in ps]))
    if not inside(best["P"]):
        out["reason"] = (f"the law's optimum over continuous bits, {best['P']:.3g}, is not inside the trained bits "
                         f"{lo:g}-{hi:g}: an edge or an extrapolation, not a located minimum")
        return out
    out["P"] = float(best["P"])
    return out
