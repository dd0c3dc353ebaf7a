"""Numerics first, cost second: the IsoFLOP verdicts of one study under several cost models, and what
each model charges each recipe.

An IsoFLOP verdict compares recipes at a fixed compute budget C, so it mixes two things: what a format
does to the loss at the same tokens (`scaling.study.analysis.matched`), and how many tokens the cost model lets
it buy with C. Under `bits` (each FLOP at its operands' mean effective bits / 16: "half the bits, twice
the throughput") MXFP6 is charged 6.25/16 per dense-GEMM FLOP against FP8's 8/16, and gets about 1.1-1.2x
FP8's tokens at every budget. On the chips the study's `h100` and `b200` models describe, FP6 runs at the
FP8 rate, and that token bonus is gone. `verdicts_by_cost` re-runs the IsoFLOP analysis
(`analysis.analyse`) under each cost model so a reader sees which verdicts survive; `charges` shows the
per-recipe charge behind them.

What a budget C means under each cost model (`scaling.train.compute`: every model counts "16-bit FLOP
units", one BF16 FLOP = 1, but the units differ):

    bits     16-bit-equivalent FLOPs: Σ over GEMM parts of FLOPs × (mean effective bits of the two
             operands) / 16 (scales included: MXFP6 = 6.25 bits; an unquantised operand of a run that
             quantises something at 16, the FP32 reference at 32). A machine-free idealisation.
    h100, b200  BF16-equivalent FLOPs on that chip: Σ FLOPs × (the chip's dense BF16 peak / the dense
             peak of the format the GEMM runs in, the wider operand's element width through
             `hardware.precision_for_bits`). Equivalently C = (seconds one chip needs at its dense
             peaks) × its BF16 peak, so C / peak_bf16 is chip-seconds at peak (H100 989, B200 2250
             TFLOP/s BF16; `hardware.GPUS`). FP8 and FP6 at 2x BF16 on both, FP4 at 2x on H100 (no FP4
             path: it falls back to FP8) and 4x on B200, FP32 at the TF32 rate (0.5x), Hadamard
             rotations at BF16. Peak rates only: no utilisation, memory-bound ops or quantisation kernels.
    nominal  6·N·D·P/16 (Kumar et al.; attention and head not counted).

Comparable budgets. A budget passed to `verdicts_by_cost` is *reference-equivalent*: the compute the
reference recipe (`analysis.high_precision_recipe`, bf16 in the committed study) spends under `bits`.
Under each other model it becomes C_model = C · k_model, k_model = the reference's cost per token under
that model / under `bits` (the geometric mean over the reference's rows where it varies with N: only
under `nominal`, which leaves attention and the head out). So "C = 3e12" buys the reference the same
tokens under every model, and the models differ only in what they charge the other recipes. For a BF16
reference k = 1 exactly under bits, h100 and b200 (BF16 is 16 bits and runs at the BF16 rate), so the
budgets are numerically the same; an FP32 reference has k = (989/495)/2 = 0.999 on an H100.

Where a verdict comes from. A design's runs land on its budgets under the cost model it was designed
with (`budget_cost`, `bits` for the committed study); under any other model a run's loss at C is an
evaluation within one part in a thousand of C, else interpolated between two of its evaluations (log loss
linear in log D, `analysis.points_at`), else the run drops out (nothing is extrapolated). Interpolated
points are indicative: `interpolated_share` says how much of a verdict rests on them, and a recipe left
with fewer than three sizes is not fitted at all (`short`).

Pure pandas/numpy (no JAX).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from scaling.errors import ConfigError
from scaling.plan import hardware
from scaling.study.analysis import isoflop as analysis
from scaling.train import compute as compute_lib

CHIPS = ("h100", "b200")  # the real chips every verdict is also read on, beside the idealised `bits`


# ----------------------------------------------------------------------------- units

def unit(cost: compute_lib.CostModel | str) -> str:
    """What one unit of compute C means under `cost` (see the module doc)."""
    cost = compute_lib.get(cost)
    if cost.kind == "bits":
        return "16-bit-equivalent FLOPs (each FLOP × its operands' mean effective bits / 16)"
    if cost.kind == "nominal":
        return "nominal FLOPs 6·N·D·P/16 (attention and head not counted)"
    gpu = hardware.get_gpu(cost.kind)
    return (f"BF16-equivalent FLOPs on the {gpu.name} (chip-seconds at its dense peaks × its BF16 peak, "
            f"{gpu.peak_tflops['bf16']:g} TFLOP/s)")


def chip_seconds(budget: float, cost: compute_lib.CostModel | str) -> float | None:
    """Seconds of one chip at its dense peaks that compute `budget` stands for under a GPU cost model
    (budget / the chip's BF16 peak); None under bits and nominal, which name no chip."""
    cost = compute_lib.get(cost)
    if cost.kind in ("bits", "nominal"):
        return None
    return float(budget) / hardware.get_gpu(cost.kind).peak("bf16")


def reference_factor(df: pd.DataFrame, cost: compute_lib.CostModel | str, reference: str | None = None,
                     base: compute_lib.CostModel | str = "bits") -> tuple[float, float]:
    """(k, spread): the reference recipe's cost per token under `cost` over its cost under `base`, the
    factor that converts a `base` budget into `cost`'s units (geometric mean over the reference's rows),
    and the largest relative deviation of a row's ratio from k (0 where the ratio is the same at every
    N, as for bits/h100/b200). reference: default `analysis.high_precision_recipe`."""
    cost, base = compute_lib.get(cost), compute_lib.get(base)
    df = compute_lib.backfill(analysis.ok_rows(df))
    reference = reference or analysis.high_precision_recipe(df)
    ref = df[df["recipe"] == reference]
    if ref.empty:
        raise ConfigError("reference recipe", reference, sorted(set(df["recipe"])))
    ratio = cost.per_token(ref) / base.per_token(ref)
    k = float(np.exp(np.mean(np.log(ratio))))
    return k, float(np.max(np.abs(ratio / k - 1)))


# ----------------------------------------------------------------------------- verdicts

def _summary(res: dict[str, Any], budget_ref: float, cost: compute_lib.CostModel,
             recipes: Sequence[str]) -> dict[str, Any]:
    fitted = [e for e in res["recipes"] if e["sizes"] >= analysis.MIN_SIZES]
    counted = fitted or res["recipes"]
    points = sum(e["runs"] for e in counted)
    return {
        "budget": res["budget"], "budget_reference": float(budget_ref), "chip_seconds": chip_seconds(res["budget"], cost),
        "winner": res["winner"], "reason": res["reason"], "best": res["best"], "runner_up": res["runner_up"],
        "diff": res["diff"], "diff_ci": res["diff_ci"],
        # share of the points the verdict rests on (the fitted recipes') read between two evaluations
        "interpolated_share": (sum(e["interpolated"] for e in counted) / points) if points else None,
        "points": points, "fitted": [e["recipe"] for e in fitted],
        "short": [e["recipe"] for e in res["recipes"] if e["sizes"] < analysis.MIN_SIZES],
        "absent": sorted(set(recipes) - {e["recipe"] for e in res["recipes"]}),
        "recipes": [{k: e[k] for k in ("recipe", "runs", "sizes", "interpolated", "loss", "ci", "inside", "p_best",
                                       "D_opt", "N_opt")} for e in res["recipes"]],
        "pairs": res["pairs"],
    }


def verdicts_by_cost(df: pd.DataFrame, budgets: Sequence[float], cost_models: Sequence[str] = ("bits", *CHIPS), *,
                     reference: str | None = None, **isoflop_kwargs: Any) -> dict[str, dict[str, Any]]:
    """The IsoFLOP analysis of `df` (`analysis.analyse`) at each budget under each cost model.

    budgets are reference-equivalent (module doc): each becomes budget · k_model in the model's own units
    (`reference_factor`; k = 1 for a BF16 reference under bits, h100, b200). isoflop_kwargs go to
    `analysis.isoflop` (n_boot, seed, level, pairs=[("mxfp6", "fp8")], ...; `noise` defaults to the
    table's seed replicates).

    Returns {cost_model: {"description", "unit", "reference", "reference_factor", "reference_spread",
    "budgets": [{"budget" (model units), "budget_reference" (as given), "chip_seconds" (GPU models),
    "winner" (or None), "reason", "best", "runner_up", "diff" (runner-up minus best, nats), "diff_ci",
    "interpolated_share" (of the fitted recipes' points, the share interpolated between two evaluations
    rather than landed on the budget: indicative), "points", "fitted", "short" (recipes with under
    three sizes reaching the budget: not compared), "absent" (recipes of the table none of whose runs
    reaches the budget: a design's single evaluation that this model costs past it, say), "recipes"
    (per recipe: runs, sizes, interpolated, loss, ci, inside, p_best, D_opt, N_opt), "pairs"}]}}."""
    df = analysis.ok_rows(df)
    if not len(budgets):
        raise ConfigError("budgets", budgets, "at least one compute budget")
    reference = reference or analysis.high_precision_recipe(df)
    recipes = sorted(set(df["recipe"].astype(str)))
    isoflop_kwargs.setdefault("noise", analysis.replicate_noise(df))
    out: dict[str, dict[str, Any]] = {}
    for name in cost_models:
        cost = compute_lib.get(name)
        k, spread = reference_factor(df, cost, reference)
        results = analysis.analyse(df, [b * k for b in budgets], cost, **isoflop_kwargs)
        out[cost.name] = {"description": cost.describe(), "unit": unit(cost), "reference": reference,
                          "reference_factor": k, "reference_spread": spread,
                          "budgets": [_summary(r, b, cost, recipes) for r, b in zip(results, budgets)]}
    return out


# ----------------------------------------------------------------------------- charges

def charges(df: pd.DataFrame, N: float | None = None, cost_models: Sequence[str] = ("bits", *CHIPS),
            reference: str | None = None) -> pd.DataFrame:
    """Each recipe's charge per 6·N·D under each cost model at one model size N: cost per token / 6N
    (1 = every FLOP of a 6N-per-token model at BF16; attention, the head and rotations make it more),
    and `<model>_tokens`, the tokens it buys at a budget relative to the reference (reference charge /
    its charge: the token bonus a cost model grants). One row per recipe with a row at N (the median
    over its rows there); N defaults to the largest size at which the most recipes have rows. Columns:
    recipe, N, bits_eff (as `bits` counts it), then <model> and <model>_tokens per model. The frame's
    attrs hold N and the reference."""
    df = compute_lib.backfill(analysis.ok_rows(df))
    reference = reference or analysis.high_precision_recipe(df)
    if N is None:
        counts = df.groupby("N")["recipe"].nunique()
        N = float(counts[counts == counts.max()].index.max())
    at = df[np.isclose(df["N"].to_numpy(float), float(N), rtol=1e-9)]
    if at.empty:
        raise ConfigError("N", N, sorted(set(df["N"].astype(float))))
    table = pd.DataFrame({"recipe": at["recipe"].astype(str).to_numpy(), "N": float(N),
                          "bits_eff": compute_lib.get("bits").effective_bits(at)})
    for name in cost_models:
        cost = compute_lib.get(name)
        table[cost.name] = cost.per_token(at) / (6.0 * float(N))
    table = table.groupby("recipe", as_index=False).median()
    for name in cost_models:
        col = compute_lib.get(name).name
        ref = table.loc[table["recipe"] == reference, col]
        table[f"{col}_tokens"] = float(ref.iloc[0]) / table[col] if len(ref) else np.nan
    table = table.sort_values(compute_lib.get(cost_models[0]).name, ascending=False, ignore_index=True)
    table.attrs.update(N=float(N), reference=reference)
    return table


# ----------------------------------------------------------------------------- text

def charges_table(table: pd.DataFrame) -> str:
    """Markdown: per recipe, its charge per 6ND under each model and the tokens it buys relative to the
    reference (in parentheses)."""
    models = [c for c in table.columns if c not in ("recipe", "N", "bits_eff") and not c.endswith("_tokens")]
    lines = ["| recipe | bits_eff | " + " | ".join(f"{m}: per 6ND (tokens vs {table.attrs.get('reference')})"
                                                  for m in models) + " |",
             "| --- | --- | " + " | ".join("---" for _ in models) + " |"]
    for _, r in table.iterrows():
        cells = [f"{r[m]:.3f} ({r[f'{m}_tokens']:.2f}x)" for m in models]
        lines.append(f"| {r['recipe']} | {r['bits_eff']:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fmt(x: float | None, spec: str = "+.3f") -> str:
    return "–" if x is None else format(x, spec)


__all__ = ["CHIPS", "charges", "charges_table", "chip_seconds", "reference_factor", "unit", "verdicts_by_cost"]
