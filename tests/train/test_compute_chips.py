"""compute: every chip of the hardware table as a cost model, FP6 at each chip's own rate, a chip that
lacks a format saying so, and a user's own throughput table as a cost model (issue 70)."""

from __future__ import annotations

import pandas as pd
import pytest

from scaling.errors import ConfigError
from scaling.plan import hardware
from scaling.train import compute, ladder

CFG = ladder.config_for_size(4, vocab=256, seq_len=64)
TOKENS = 16 * 64
DENSE = ("fprop", "dgrad", "wgrad")


def _rows(*recipes):
    return pd.DataFrame([{**compute.columns(CFG, r, TOKENS), "recipe": r} for r in recipes])


def test_every_chip_of_the_table_is_a_cost_model():
    assert compute.COST_MODELS == ("bits", "nominal", *hardware.GPUS)
    assert {"b300", "mi300x", "mi355x"} <= set(compute.COST_MODELS)
    for chip in hardware.GPUS:
        cost = compute.get(chip)
        assert cost.gpu is hardware.GPUS[chip] and cost.gemm_factor(16, 16, 16) == 1.0
    assert "no FP4/FP6 path" in compute.get("h100").describe()
    assert "no TF32 path" in compute.get("mi355x").describe() and "path" not in compute.get("b300").describe()
    with pytest.raises(ConfigError, match="cost_model: got 'tpu'"):
        compute.get("tpu")


def test_an_mxfp6_gemm_costs_half_of_fp8_on_the_mi355x_and_the_same_on_h100_and_b200():
    mxfp6, fp8 = (6 + 8 / 32, 6 + 8 / 32, 6), (8, 8, 8)
    for chip, ratio in (("mi355x", 0.5), ("h100", 1.0), ("b200", 1.0), ("b300", 1.0), ("mi300x", 1.0)):
        cost = compute.get(chip)
        assert cost.gemm_factor(*mxfp6) == pytest.approx(ratio * cost.gemm_factor(*fp8), rel=1e-4), chip
    assert compute.get("mi355x").gemm_factor(*fp8) == pytest.approx(0.5, rel=1e-4)  # FP8 at 2x BF16
    # on whole rows: mxfp6's projections cost half of fp8's on the MI355X, its other parts the same
    rows = _rows("mxfp6", "fp8")
    for chip, ratio in (("mi355x", 0.5), ("h100", 1.0), ("b200", 1.0)):
        cost = compute.get(chip)
        dense = [sum(row[f"flops_{p}"] * cost.gemm_factor(16, 16, row[f"width_{p}"]) for p in DENSE)
                 for _, row in rows.iterrows()]
        assert dense[0] == pytest.approx(ratio * dense[1], rel=1e-4), chip
        per_token = cost.per_token(rows)
        assert per_token[1] - per_token[0] == pytest.approx(dense[1] - dense[0], rel=1e-6), chip


def test_a_chip_without_a_format_charges_the_next_wider_one_and_says_so():
    h100 = compute.get("h100")
    assert h100.fallback_note(4) == "FP4 GEMMs on the H100 SXM5 80GB charged at the FP8 rate: no FP4 path"
    assert h100.fallback_note(6) == "FP6 GEMMs on the H100 SXM5 80GB charged at the FP8 rate: no FP6 path"
    assert h100.fallback_note(8) is None and compute.get("b200").fallback_note(6) is None
    assert compute.get("bits").fallback_note(4) is None
    assert h100.gemm_factor(4, 4, 4) == h100.gemm_factor(8, 8, 8) == pytest.approx(989 / 1979)
    rows = _rows("nvfp4", "bf16", "mxfp6", "fp8")
    notes = h100.fallbacks(rows)
    assert [(f.recipe, f.parts, f.wanted, f.charged) for f in notes] == [
        ("nvfp4", DENSE, "fp4", "fp8"), ("mxfp6", DENSE, "fp6", "fp8")]
    assert str(notes[0]) == ("nvfp4 on the H100 SXM5 80GB: its FP4 GEMMs (fprop, dgrad, wgrad) charged at the FP8 rate: "
                             "no FP4 path")
    assert compute.get("b200").fallbacks(rows) == [] and compute.get("mi355x").fallbacks(rows) == []
    assert [(f.recipe, f.wanted) for f in compute.get("mi300x").fallbacks(rows)] == [("nvfp4", "fp4"), ("mxfp6", "fp6")]
    # MI355X has no TF32: the FP32 reference's GEMMs run at its FP32 rate, and it says so
    fp32 = compute.get("mi355x").fallbacks(_rows("fp32"))
    assert [(f.wanted, f.charged) for f in fp32] == [("tf32", "fp32")] and "attn_fwd" in fp32[0].parts
    assert compute.get("bits").fallbacks(rows) == []


TABLE = '''name = "my-h100-bench"
# measured step throughput relative to bf16
[recipes]
fp8 = 1.45
nvfp4-nvidia = 1.9
[formats]
fp8 = 1.8
'''


@pytest.fixture
def table_file(tmp_path):
    path = tmp_path / "bench.toml"
    path.write_text(TABLE)
    return path


def test_a_throughput_table_is_a_cost_model(table_file):
    cost = compute.get(str(table_file))
    assert cost.kind == "table" and cost.name == "my-h100-bench" and cost.gpu is None
    assert "fp8 1.45x" in cost.describe() and str(table_file) in cost.describe()
    rows = _rows("bf16", "fp8", "nvfp4-nvidia", "mxfp8")
    bf16_charge = compute.get("bits").per_token(rows)[0]  # a BF16 run: every FLOP at 16 bits, one unit each
    per_token = cost.per_token(rows)
    # a listed recipe: the BF16 charge of the same model / its measured throughput (nvfp4-nvidia's
    # rotations and kept blocks are inside what was measured, not charged on top)
    assert per_token[1] == pytest.approx(bf16_charge / 1.45)
    assert per_token[2] == pytest.approx(bf16_charge / 1.9)
    # BF16 runs at the BF16 rate, 1
    assert per_token[0] == pytest.approx(bf16_charge)
    # an unlisted recipe: each GEMM at the format rate (mxfp8's projections at 1/1.8, the rest BF16)
    mx = rows.iloc[3]
    dense = sum(mx[f"flops_{p}"] for p in DENSE)
    assert per_token[3] == pytest.approx(dense / 1.8 + (bf16_charge - dense))
    assert cost.compute(rows.assign(D=1e6))[1] == pytest.approx(1e6 * bf16_charge / 1.45)
    # the law optimiser's hypothetical models price through the format rates too
    assert float(cost.factor(8)) == pytest.approx(1 / 1.8) and float(cost.high_factor(8)) == 1.0
    assert cost.fallbacks(rows) == [] and cost.fallback_note(4) is None


def test_a_recipe_the_table_does_not_cover_is_one_line_naming_it_and_the_table(table_file):
    cost = compute.get(str(table_file))
    with pytest.raises(ConfigError, match=r"my-h100-bench .*bench\.toml.*got 'mxfp4'.*\[formats\] rate for fp4") as e:
        cost.per_token(_rows("fp8", "mxfp4"))
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="rate for fp4"):
        cost.factor(4)


@pytest.mark.parametrize("text, match", [
    ('name = "x"\nrecipe = 1\n', r"bench\.toml: key: got 'recipe'; allowed: one of name, description, recipes, formats"),
    ('[recipes]\nfp8 = -1\n', r"bench\.toml: recipes\.fp8: got -1; allowed: a positive number"),
    ('[recipes]\nfp8 = "fast"\n', r"recipes\.fp8: got 'fast'"),
    ('[formats]\nfp5 = 2\n', r"formats\.fp5: got 2; allowed: a rate for one of fp32, tf32, bf16, fp8, fp6, fp4"),
    ('[formats]\nbf16 = 2\n', r"formats\.bf16: got 2; allowed: 1"),
    ('name = "x"\n', r"rates: got 'none'"),
    ('[recipes\n', r"cost_model: got .*bench\.toml'; allowed: valid TOML"),
])
def test_a_bad_table_is_one_line_naming_the_key_the_value_and_what_is_allowed(tmp_path, text, match):
    path = tmp_path / "bench.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match) as e:
        compute.get(str(path))
    assert "\n" not in str(e.value)


def test_a_missing_table_file_says_so(tmp_path):
    with pytest.raises(ConfigError, match="a throughput table .* that exists"):
        compute.get(str(tmp_path / "none.toml"))
