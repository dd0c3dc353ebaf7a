"""Numerics first, cost second: what each cost model charges each recipe, and what a budget C means under it.

An IsoFLOP verdict at a fixed compute budget mixes two things: what a format does to the loss at the same
tokens (`scaling.study.analysis.matched`), and how many tokens the cost model lets it buy with C. This
module holds the second: `charges` (each recipe's cost per 6·N·D under each model, and the tokens it buys
relative to the reference), `reference_factor` (how a budget the reference spends under `bits` reads in
another model's units), `unit` and `chip_seconds`. `scaling.study.analysis.chips` combines them with the
matched gaps into each chip's verdict.

What a budget C means under each cost model (`scaling.train.compute`: every model counts "16-bit FLOP
units", one BF16 FLOP = 1, but the units differ):

    bits     16-bit-equivalent FLOPs: Σ over GEMM parts of FLOPs × (mean effective bits of the two
             operands) / 16 (scales included: MXFP6 = 6.25 bits; an unquantised operand of a run that
             quantises something at 16, the FP32 reference at 32). A machine-free idealisation.
    a chip   BF16-equivalent FLOPs on that chip (`hardware.GPUS`: H100, H200, B200, B300, MI300X, MI355X, ...):
             Σ FLOPs × (the chip's dense BF16 peak / the dense peak of the format the GEMM runs in, through
             `hardware.precision_for_bits`). Equivalently C = (seconds one chip needs at its dense peaks) × its
             BF16 peak, so C / peak_bf16 is chip-seconds at peak. A format the chip lacks runs at the next
             wider one's rate (FP4 on an H100 at FP8's). Peak rates only: no utilisation, memory-bound ops or
             quantisation kernels.
    nominal  6·N·D·P/16 (Kumar et al.; attention and head not counted).

Comparable budgets. A budget is *reference-equivalent*: the compute the reference recipe
(`isoflop.high_precision_recipe`, bf16 where a study trains it) spends under `bits`. Under each other
model it becomes C_model = C · k_model, k_model = the reference's cost per token under that model / under
`bits` (the geometric mean over the reference's rows where it varies with N: only under `nominal`). For a
BF16 reference k = 1 exactly under bits and every chip, so the budgets are numerically the same.

Pure pandas/numpy (no JAX).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from scaling.errors import ConfigError
from scaling.plan import hardware
from scaling.study.analysis import isoflop as analysis
from scaling.train import compute as compute_lib

CHIPS = ("h100", "h200", "b200", "b300", "mi300x", "mi355x")  # the chips every verdict is read on, beside `bits`


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


__all__ = ["CHIPS", "charges", "charges_table", "chip_seconds", "reference_factor", "unit"]
