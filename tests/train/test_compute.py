"""compute: what the FP4 recipes' extras cost (blocks kept in high precision, Hadamard rotations)."""

from __future__ import annotations

import pandas as pd
import pytest

from scaling.train import compute, ladder

CFG = ladder.config_for_size(4, vocab=256, seq_len=64)
TOKENS = 16 * 64


def _by_name(recipe):
    return {p.name: p for p in compute.parts(CFG, recipe, TOKENS)}


def test_kept_blocks_and_rotations_are_parts_of_their_own():
    proj = [(CFG.d_model, 3 * CFG.d_model), (CFG.d_model, CFG.d_model), (CFG.d_model, 2 * CFG.d_ff), (CFG.d_ff, CFG.d_model)]
    per_layer = sum(i * o for i, o in proj)
    plain, nvidia = _by_name("nvfp4"), _by_name("nvfp4-nvidia")
    assert set(plain) == set(compute.PARTS)
    L, kept = CFG.n_layers, 1
    # the projections' FLOPs are the same in all; the kept block's run at BF16's 16 bits
    for g in ("fprop", "dgrad", "wgrad"):
        assert plain[g].flops == 2.0 * L * per_layer
        assert nvidia[g].flops == 2.0 * (L - kept) * per_layer
        assert nvidia[f"kept_{g}"].flops == 2.0 * kept * per_layer
        assert nvidia[f"kept_{g}"].bits == (16.0, 16.0) and nvidia[f"kept_{g}"].width == 16.0
    # RHT of size 16 on the wgrad GEMM's inputs: X (d_in) and dY (d_out) per token, 2·16 FLOPs each
    assert nvidia["rotations"].flops == pytest.approx((L - kept) * sum(i + o for i, o in proj) * 32.0)
    # quartet rotates all three GEMMs with b = 32: per token X, dY twice each, and W twice per step
    q = _by_name("quartet")
    want = L * sum(2 * (i + o) + 2 * i * o / TOKENS for i, o in proj) * 64.0
    assert q["rotations"].flops == pytest.approx(want)
    # 2-D weight scales: 8 bits per 16×16 tile
    assert nvidia["fprop"].bits[1] == pytest.approx(4 + 8 / 256)


def test_cost_models_count_the_extras_and_older_tables_still_cost():
    rows = pd.DataFrame([compute.columns(CFG, r, TOKENS) for r in ("nvfp4", "nvfp4-nvidia", "quartet", "mxfp4")])
    for kind in ("bits", "b200"):
        cost = compute.get(kind).per_token(rows)
        assert cost[1] > cost[0] and cost[2] > cost[3]  # the kept block and the rotations are not free
    # a table written before the extra parts existed: costed from the base parts alone
    old = rows[[c for c in rows.columns if not any(p in c for p in compute.EXTRA_PARTS)]]
    base = compute.get("bits").per_token(old)
    assert base[0] == compute.get("bits").per_token(rows)[0]
    assert base[1] < compute.get("bits").per_token(rows)[1]
    # effective bits average the kept projections in
    eff = compute.get("bits").effective_bits(rows)
    assert eff[1] > eff[0]


def test_the_unquantised_share_is_one_smooth_power_law_in_N():
    """UnquantisedShare.ratio: a least-squares power law through the trained sizes' ratios (exact through two),
    so the cost has no kink at a trained N for a law's optimum to snap to; a knot with no finite
    ratio is dropped, and kept blocks count as projections (a recipe keeping every block is finite)."""
    import numpy as np

    two = compute.UnquantisedShare(knots_N=(1e6, 1e9), knots_ratio=(1.0, 0.25))
    assert two.ratio(np.array([1e6, 1e9])) == pytest.approx([1.0, 0.25])
    assert two.ratio(1e12) == pytest.approx(0.0625)  # the power law carried on: -0.2 per decade in log10
    jagged = compute.UnquantisedShare(knots_N=(1e4, 2e4, 4e4, 8e4), knots_ratio=(1.2, 0.7, 0.8, 0.3))
    n = np.exp(np.linspace(np.log(1e4), np.log(8e4), 400))
    slope = np.diff(np.log(jagged.ratio(n))) / np.diff(np.log(n))
    assert np.ptp(slope) < 1e-9 and slope[0] < 0  # one exponent everywhere: no kink at 2e4 or 4e4
    with_inf = compute.UnquantisedShare(knots_N=(1e4, 2e4, 4e4), knots_ratio=(float("inf"), 0.8, 0.4))
    assert with_inf.ratio(np.array([2e4, 4e4])) == pytest.approx([0.8, 0.4])
    rows = pd.DataFrame({"N": [1e4, 1e4], "flops_fprop": [4.0, 0.0], "flops_dgrad": [4.0, 0.0], "flops_wgrad": [4.0, 0.0],
                         "flops_kept_fprop": [0.0, 4.0], "flops_kept_dgrad": [0.0, 4.0], "flops_kept_wgrad": [0.0, 4.0],
                         "flops_head_fprop": 1.0, "flops_head_dgrad": 1.0, "flops_head_wgrad": 1.0,
                         "flops_attn_fwd": 1.0, "flops_attn_bwd": 2.0})
    assert compute.UnquantisedShare.from_results(rows).knots_ratio == pytest.approx((0.5,))  # 6 / 12 for both recipes
