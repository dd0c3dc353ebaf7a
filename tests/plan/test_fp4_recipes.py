"""scaling.plan: the published FP4 recipes (nvfp4-nvidia, quartet): Hadamard rotations, 2-D weight tiles,
layers kept in BF16."""

from dataclasses import replace
from unittest import mock

import pytest

from scaling.plan import efficiency, hardware, layerops, shapes, stepmodel
from scaling.plan.layout import parse_step_layout
from scaling.plan.shapes import ModelShape

B200, H100 = hardware.GPUS["b200"], hardware.GPUS["h100"]


def _projections(m: ModelShape) -> list[tuple[int, int]]:
    """(d_in, d_out) of a dense Llama layer's four projections (QKV fused, SwiGLU's gate and up fused)."""
    q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
    return [(m.hidden, q + 2 * kv), (q, m.hidden), (m.hidden, 2 * m.ffn), (m.ffn, m.hidden)]


def test_the_presets_price_slower_than_plain_fp4_and_faster_than_bf16():
    """Same FP4 GEMMs and scale bytes as plain NVFP4 / MXFP4, plus: nvfp4-nvidia keeps 5 of Llama-3-8B's 32
    layers in BF16 (round(32 x 2/62) = 1 first, round(32 x 8/62) = 4 last), whose GEMMs run at a quarter of the
    FP4 rate (more than their quantise passes save), and a fused wgrad rotation (no time); quartet rotates the
    backward operands in passes of their own (time) and the forward ones inside the quantiser (none)."""
    model = shapes.load_model("llama3-8b")
    layout = parse_step_layout("dp=8", micro_batch=1, micro_batches=8)
    r = {p: stepmodel.step(model, "b200", layout, p) for p in ("bf16", "nvfp4", "mxfp4", "nvfp4-nvidia", "quartet")}
    assert efficiency.RECIPES["nvfp4-nvidia"].kept_layers(32) == (1, 4)
    assert r["nvfp4"].step_seconds < r["nvfp4-nvidia"].step_seconds < r["bf16"].step_seconds
    assert r["mxfp4"].step_seconds < r["quartet"].step_seconds < r["bf16"].step_seconds
    # the rotation passes are all quartet adds to MXFP4's step
    added = r["quartet"].by_op["hadamard"] + r["quartet"].by_op["hadamard weights"]
    assert added > 0
    assert r["quartet"].step_seconds - r["mxfp4"].step_seconds == pytest.approx(added, rel=1e-9)
    # nvfp4-nvidia's rotation is fused (FLOPs, no time); its kept layers add GEMM time and save quantise time
    assert r["nvfp4-nvidia"].by_op["hadamard"] == 0 and r["nvfp4-nvidia"].overhead_flops["hadamard"] > 0
    gemms = {p: sum(v for k, v in r[p].by_op.items() if k.startswith("gemm")) for p in ("nvfp4", "nvfp4-nvidia")}
    assert gemms["nvfp4-nvidia"] > gemms["nvfp4"]
    assert r["nvfp4-nvidia"].by_op["quantise"] == pytest.approx(r["nvfp4"].by_op["quantise"] * 27 / 32, rel=1e-9)


def test_rotation_flops_are_2b_per_rotated_element_by_hand():
    """Per layer and token, over the projections (d_in, d_out) with T tokens per step: fprop rotates X and W along
    d_in (d_in + d_in d_out / T elements), dgrad dY and W along d_out (d_out + d_in d_out / T), wgrad X and dY along
    the tokens (d_in + d_out); each element costs 2b FLOPs."""
    model = ModelShape("tiny", layers=8, hidden=256, heads=4, kv_heads=2, ffn=512, vocab=1000)
    layout = parse_step_layout("dp=1", micro_batch=2, micro_batches=3)
    tokens = 512 * 2 * 3
    proj = _projections(model)
    quartet = stepmodel.step(model, "b200", layout, "quartet", seq_len=512).overhead_flops
    per_token = sum(2 * 32 * ((i + i * o / tokens) + (o + i * o / tokens) + (i + o)) for i, o in proj)
    assert quartet["hadamard"] + quartet["hadamard weights"] == pytest.approx(8 * tokens * per_token, rel=1e-12)
    # RMS scales: 2 FLOPs per element of X's and W's two MXFP4 copies each
    rms = sum(2 * 2 * (i * tokens + i * o) for i, o in proj) * 8
    assert quartet["quantise"] + quartet["quantise weights"] == pytest.approx(rms, rel=1e-12)
    # quartet-full adds dX and dW back through the fprop rotation: (d_in + d_in d_out / T) more elements
    full = stepmodel.step(model, "b200", layout, "quartet-full", seq_len=512)
    unrotate = sum(2 * 32 * (i + i * o / tokens) for i, o in proj)
    added = full.overhead_flops["hadamard"] + full.overhead_flops["hadamard weights"] - quartet["hadamard"] - quartet["hadamard weights"]
    assert added == pytest.approx(8 * tokens * unrotate, rel=1e-12)
    assert full.step_seconds > stepmodel.step(model, "b200", layout, "quartet", seq_len=512).step_seconds
    # nvfp4-nvidia: wgrad only, block 16, and not in the last of 8 layers (round(8 x 8/62) = 1 kept, none first)
    nvidia = stepmodel.step(model, "b200", layout, "nvfp4-nvidia", seq_len=512).overhead_flops
    assert efficiency.RECIPES["nvfp4-nvidia"].kept_layers(8) == (0, 1)
    assert nvidia == {"hadamard": pytest.approx(7 * tokens * sum(2 * 16 * (i + o) for i, o in proj), rel=1e-12)}


def test_nvidia_12b_keeps_its_first_two_and_last_eight_blocks():
    """NVFP4 paper Sec. 4.1: of the 12B model's 62 blocks, the first two and the last eight stay in BF16; the shares
    carry to other depths, and a deep enough stage with only FP4 layers prices like plain NVFP4 layers."""
    recipe = efficiency.RECIPES["nvfp4-nvidia"]
    assert recipe.kept_layers(62) == (2, 8)
    assert recipe.kept_layers(1) == (0, 0)
    assert efficiency.RECIPES["quartet"].kept_layers(62) == (0, 0)
    # pp=4 over 32 layers: stage 0 keeps layer 0, stage 3 layers 28-31, stages 1 and 2 none
    model = shapes.load_model("llama3-8b")
    layout = parse_step_layout("pp=4,dp=2", micro_batch=1, micro_batches=8)
    c = layerops.Ctx(model, B200, layout, recipe, 4096, efficiency.EFFICIENCY["b200"])
    assert [stepmodel._stage_kept(c, s) for s in range(4)] == [(1, 0), (0, 0), (0, 0), (4, 0)]
    ops, kind_of = stepmodel._stage_ops(c)
    plain = stepmodel._stage_ops(replace(c, recipe=efficiency.RECIPES["nvfp4"]))[0]
    gemm = {name: sum(o.seconds * o.count for o in ops_[kind_of[1]] if o.kind == "gemm") for name, ops_ in
            (("nvidia", ops), ("plain", plain))}
    assert gemm["nvidia"] == pytest.approx(gemm["plain"], rel=1e-12)
    last = {name: sum(o.seconds * o.count for o in ops_[kind_of[3]] if o.kind == "gemm") for name, ops_ in
            (("nvidia", ops), ("plain", plain))}
    assert last["nvidia"] > last["plain"]


def test_square_weight_tiles_drop_the_weight_copy_where_the_gemm_takes_it_transposed():
    """Under k x k weight scales W and W^T hold the same values: one quantised weight serves both GEMMs where the
    GEMMs at that rate take a transposed operand (FP8 on Blackwell). FP4 GEMMs take only TN layouts (Transformer
    Engine's NVFP4 notes), so nvfp4-nvidia still writes W a second time, transposed; activations and gradients
    keep two copies everywhere."""
    nvidia = efficiency.RECIPES["nvfp4-nvidia"]
    assert (nvidia.copies(B200), nvidia.weight_copies(B200)) == (2, 2)
    tiled = replace(efficiency.RECIPES["mxfp8"], weight_tile=32)
    assert (tiled.copies(B200), tiled.weight_copies(B200)) == (2, 1)
    assert tiled.weight_copies(H100) == 2  # Hopper's FP8 GEMMs are TN only
    assert efficiency.RECIPES["mxfp8"].weight_copies(B200) == 2
    model = shapes.load_model("llama3-8b", layers=4)
    layout = parse_step_layout("dp=8", micro_batch=1, micro_batches=2)
    with mock.patch.dict(efficiency.RECIPES, {"mxfp8-tiled": tiled}):
        one, two = (stepmodel.step(model, "b200", layout, p) for p in ("mxfp8-tiled", "mxfp8"))
    b = tiled.bytes
    ratio = one.by_op["quantise weights"] / two.by_op["quantise weights"]
    assert ratio == pytest.approx((2 + b) / (2 + 2 * b), rel=1e-12)
    assert one.by_op["quantise"] == two.by_op["quantise"]


def test_the_presets_need_blackwell_and_run_from_the_command_line(capsys):
    from scaling import cli
    from scaling.errors import ConfigError

    model = shapes.load_model("llama3-8b", layers=2)
    for precision in ("nvfp4-nvidia", "quartet"):
        with pytest.raises(ConfigError, match=f"precision: got '{precision}'"):
            stepmodel.step(model, "h100", parse_step_layout("dp=1"), precision)
    assert cli.main(["plan", "step", "--model", "llama3-8b", "--gpu", "b200", "--precision", "nvfp4-nvidia"]) == 0
    out = capsys.readouterr().out
    assert "nvfp4-nvidia" in out and "gemm fc1" in out
