"""scaling.study.analysis.costs and chips on synthetic runs built by hand in the results table's FLOPs-by-part
layout (no JAX): a token bonus under `bits` that one chip grants and another does not, and the per-recipe charges."""

import math

import numpy as np
import pandas as pd
import pytest

from scaling.plan import hardware
from scaling.study.analysis import chips, costs
from scaling.train import compute

H100 = hardware.GPUS["h100"].peak_tflops
B200 = hardware.GPUS["b200"].peak_tflops
OTHER = 0.5  # attention + head FLOPs per token, in units of N: 0.1 + 0.3 + 3 × 0.0333


def _cols(N: float, dense_bits: float, width: float) -> dict:
    """A results row's cost columns for a model of N params whose dense GEMMs (6N FLOPs per token)
    carry `dense_bits` effective bits per operand and run in a `width`-bit format; attention and head
    (0.5N FLOPs) unquantised (32 bits in the table, so 16 in a run that quantises something)."""
    flops = {"fprop": 2 * N, "dgrad": 2 * N, "wgrad": 2 * N, "head_fprop": N / 30, "head_dgrad": N / 30,
             "head_wgrad": N / 30, "attn_fwd": 0.1 * N, "attn_bwd": 0.3 * N}
    out = {}
    for part, f in flops.items():
        dense = part in ("fprop", "dgrad", "wgrad")
        out[f"flops_{part}"] = f
        out[f"bits_{part}_0"] = out[f"bits_{part}_1"] = dense_bits if dense else 32.0
        out[f"width_{part}"] = width if dense else 32.0
    out["bits_eff"] = dense_bits
    return out


# recipe -> (dense effective bits, element width, P): like mxfp6 (6 bits + E8M0 per 32), fp8 per tensor, bf16
KINDS = {"six": (6.25, 6.0, 6), "eight": (8.0, 8.0, 8), "ref": (16.0, 16.0, 16), "four": (4.25, 4.0, 4),
         "fp32": (32.0, 32.0, 32)}


def _loss(N, D):
    """The same loss for every recipe at the same (N, D): Chinchilla's form, optimum N = D."""
    return 2.0 + 20.0 * N ** -0.3 + 20.0 * D ** -0.3


def _runs(recipes=("six", "eight", "ref"), budget=6e12, noise=0.002, seeds=(0, 1), rng=0):
    """Seven sizes per recipe, each run evaluated at the same nine token counts (a WSD cooldown each),
    the reference landing on `budget` at the fifth. The noise is drawn per (N, tokens, seed), the same
    for every recipe: two recipes have identical losses at matched tokens."""
    rng = np.random.default_rng(rng)
    sizes = np.geomspace(1e5, 1e7, 7)
    shared = {(i, k, s): noise * rng.standard_normal() for i in range(len(sizes)) for k in range(9) for s in seeds}
    rows = []
    for recipe in recipes:
        bits, width, P = KINDS[recipe]
        for i, N in enumerate(sizes):
            D_ref = budget / ((6 + OTHER) * N)  # the reference's tokens at the budget
            for s in seeds:
                for k in range(9):
                    D = D_ref * 2 ** ((k - 2) / 2)
                    rows.append({**_cols(N, bits, width), "run_id": f"{recipe}-{i}-{s}", "recipe": recipe,
                                 "seed": s, "N": N, "P": P, "D": D, "status": "ok",
                                 "val_loss": _loss(N, D) + shared[(i, k, s)]})
    return pd.DataFrame(rows)


@pytest.mark.slow
def test_bits_verdict_comes_from_tokens_and_vanishes_where_both_run_at_one_rate():
    """Every recipe has the same loss at matched tokens: under `bits` MXFP6-like six buys 1.23x eight's tokens
    and wins; on the H100, B200 and B300 FP6 runs at the FP8 rate (no token bonus: cannot tell); on the
    MI355X FP6 runs at its FP4 rate, twice FP8's, and six wins again (chips.chip_verdicts on real cost models)."""
    runs = _runs()
    res = chips.chip_verdicts(runs, [6e12], ("bits", "h100", "b200", "b300", "mi355x"), draws=60)
    assert res["reference"] == "ref"
    # a BF16 reference costs the same under every model: the budget is the same number everywhere
    assert all(e["reference_factor"] == 1.0 and e["budgets"][0]["budget"] == 6e12 for e in res["chips"].values())
    for model in ("bits", "mi355x"):
        v = res["chips"][model]["budgets"][0]
        assert v["winner"] == "six" and v["runner_up"] == "eight" and v["diff_ci"][0] > 0 and v["compared"] == 3
    # ... only through tokens: six's charge under bits is eight's times (3 + other) / (6 · 6.25/16 + other)
    charge, _ = chips.charges_from_rows(runs, compute.get("bits"), np.unique(runs["N"]), ["ref", "six", "eight"])
    assert charge["eight"] / charge["six"] == pytest.approx((3 + OTHER) / (6 * 6.25 / 16 + OTHER))
    for chip in ("h100", "b200", "b300"):  # FP6 at the FP8 rate: the same tokens, the same losses
        v = res["chips"][chip]["budgets"][0]
        assert v["winner"] is None and set(v["tied"]) == {"six", "eight"}, v["verdict"]
        assert v["diff"] == pytest.approx(0, abs=1e-12) and v["diff_ci"][0] <= 0 <= v["diff_ci"][1]


def test_charges_match_the_per_part_charges_by_hand():
    N = 2e5
    rows = pd.DataFrame([{**_cols(N, *KINDS[r][:2]), "recipe": r, "N": N, "P": KINDS[r][2], "D": 1e6,
                          "val_loss": 3.0, "run_id": r} for r in ("six", "eight", "ref", "four")])
    table = costs.charges(rows).set_index("recipe")
    assert table.attrs == {"N": N, "reference": "ref"}
    other = OTHER / 6  # attention and head at 16 bits = the BF16 rate = 1 per FLOP, per 6N
    fp8 = H100["bf16"] / H100["fp8"]
    expected = {  # per 6ND: the dense GEMMs' factor + the unquantised parts
        "six": {"bits": 6.25 / 16 + other, "h100": fp8 + other, "b200": B200["bf16"] / B200["fp8"] + other},
        "eight": {"bits": 0.5 + other, "h100": fp8 + other, "b200": B200["bf16"] / B200["fp8"] + other},
        "four": {"bits": 4.25 / 16 + other, "h100": fp8 + other, "b200": B200["bf16"] / B200["fp4"] + other},
        "ref": {"bits": 1 + other, "h100": 1 + other, "b200": 1 + other},
    }
    for recipe, by_model in expected.items():
        for model, charge in by_model.items():
            assert table.loc[recipe, model] == pytest.approx(charge, rel=1e-12), (recipe, model)
            assert table.loc[recipe, f"{model}_tokens"] == pytest.approx(expected["ref"][model] / charge)
    # the token bonus: bits gives six 1.23x eight's tokens; on either chip none (FP6 at the FP8 rate)
    assert table.loc["six", "bits_tokens"] / table.loc["eight", "bits_tokens"] == pytest.approx((0.5 + other) / (6.25 / 16 + other))
    assert table.loc["six", "h100"] == table.loc["eight", "h100"] and table.loc["six", "b200"] == table.loc["eight", "b200"]
    assert table.loc["four", "b200"] < table.loc["four", "h100"]  # FP4 at 4x on B200, the FP8 rate on H100
    assert list(table.index) == ["ref", "eight", "six", "four"]  # most expensive under bits first
    assert "| six | 6.25 | 0.474 (" in costs.charges_table(costs.charges(rows))
    with pytest.raises(Exception):
        costs.charges(rows, N=123.0)


def test_budgets_convert_by_the_reference_cost():
    runs = pd.concat([_runs(("fp32",), budget=6e12 * 2 * 6.5 / 6.5), _runs(("eight",))], ignore_index=True)
    k, spread = costs.reference_factor(runs, "h100")
    assert k == pytest.approx((H100["bf16"] / H100["tf32"]) / 2) and spread < 1e-12  # 0.999: TF32 is not quite 0.5x
    assert costs.reference_factor(runs, "bits") == (1.0, 0.0)
    res = chips.chip_verdicts(runs, [1e13], ("bits", "h100"), draws=10)["chips"]
    assert res["h100"]["budgets"][0]["budget"] == pytest.approx(1e13 * k)
    assert res["h100"]["budgets"][0]["budget_reference"] == 1e13 and res["bits"]["budgets"][0]["budget"] == 1e13
    assert costs.chip_seconds(989e12, "h100") == pytest.approx(1.0) and costs.chip_seconds(1.0, "bits") is None
    assert "H100" in costs.unit("h100") and "16-bit-equivalent" in costs.unit("bits")
    assert math.isclose(costs.reference_factor(_runs(("ref",)), "b200")[0], 1.0)
