"""scaling.plan.stepmodel: one step's FLOPs, pipeline schedule, precision recipes and breakdown."""

from dataclasses import replace

import pytest

from scaling.errors import ConfigError
from scaling.plan import efficiency, hardware, layerops, memory, shapes, stepmodel
from scaling.plan.layout import StepLayout, parse_step_layout


def _inventory_flops(model, layout, seq_len=4096, precision="bf16"):
    """Model FLOPs of one step summed over the op inventory of every GPU."""
    c = layerops.Ctx(model, hardware.get_gpu("h100"), layout, efficiency.RECIPES[precision], seq_len, efficiency.EFFICIENCY["h100"])
    total = 0.0
    for s in range(layout.pp):
        dense, moe = memory.stage_layers(model, layout, s)
        stage = dense * sum(o.flops * o.count for o in layerops.layer_ops(c))
        if moe:
            stage += moe * sum(o.flops * o.count for o in layerops.layer_ops(c, moe=True))
        stage += sum(o.flops * o.count for o in layerops.edge_ops(c, s == 0, s == layout.pp - 1))
        total += stage * layout.tp * layout.cp * layout.dp * layout.micro_batches  # every GPU of the stage
    return total


@pytest.mark.parametrize("layout", [
    StepLayout(),
    StepLayout(tp=4, pp=2, dp=2, micro_batches=4),
    StepLayout(tp=2, cp=2, dp=2, micro_batches=2, recompute="full"),
])
def test_op_inventory_flops_are_6nd_plus_attention(layout):
    model = shapes.load_model("llama3-8b")
    tokens = 4096 * layout.micro_batches * layout.dp
    # hand count: N = 32 layers of (4096 * (4096 + 2 * 1024) + 4096^2 + 3 * 4096 * 14336) + 128256 * 4096
    n = 32 * (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336) + 128256 * 4096
    attention = 6 * 32 * 4096 * 4096 * tokens  # causal: 6 * L * s * h per token (QK^T and PV halved)
    assert _inventory_flops(model, layout) == pytest.approx(6 * n * tokens + attention, rel=1e-12)
    r = stepmodel.step(model, "h100", layout)
    assert r.model_flops == pytest.approx(6 * n * tokens + attention, rel=1e-12)  # recompute adds no model FLOPs


@pytest.mark.parametrize("layout", [
    StepLayout(dp=4, ep=4),
    StepLayout(tp=2, pp=2, dp=2, ep=2, etp=1, micro_batches=2),
    StepLayout(tp=2, dp=4, ep=8, etp=1, recompute="full"),
    StepLayout(tp=2, dp=4, ep=4, micro_batches=2, recompute="selective", a2a_overlap=True),  # etp = tp
    StepLayout(pp=3, dp=2, ep=2, micro_batches=3),  # 4 layers on 3 stages: 2, 2, 0... uneven
])
def test_moe_op_inventory_flops_are_6_activated_nd_plus_attention(layout, tiny_moe):
    m, s = tiny_moe, 4096
    tokens = s * layout.micro_batches * layout.dp
    attention = 1024 * 256 + 256 * 8 * 160 + 1024 * 160 + 128 * 8 * 192 + 8 * 64 * 1024
    dense_mlp = 3 * 1024 * 4096
    moe_mlp = 3 * 1024 * 512 * (4 + 1) + 1024 * 16  # top-4 routed + 1 shared + the router
    n = 4 * attention + dense_mlp + 3 * moe_mlp + 1000 * 1024
    assert m.matmul_params == n
    attention_flops = 3 * 4 * s * 8 * (160 + 64) * tokens  # causal QK^T (160 per head) and PV (64)
    assert _inventory_flops(m, layout, s) == pytest.approx(6 * n * tokens + attention_flops, rel=1e-12)
    r = stepmodel.step(m, "h100", layout, "bf16", s)
    assert r.model_flops == pytest.approx(6 * n * tokens + attention_flops, rel=1e-12)


@pytest.mark.parametrize("layout", [StepLayout(dp=4, ep=4), StepLayout(tp=2, pp=2, dp=2, ep=2, etp=1, micro_batches=2)])
def test_mtp_module_is_one_more_layer_a_projection_and_an_output_layer_on_the_last_stage(layout, tiny_moe):
    m, s = replace(tiny_moe, mtp=1), 4096
    tokens = s * layout.micro_batches * layout.dp
    attention = 1024 * 256 + 256 * 8 * 160 + 1024 * 160 + 128 * 8 * 192 + 8 * 64 * 1024
    moe_mlp = 3 * 1024 * 512 * (4 + 1) + 1024 * 16
    # DeepSeek-V3 Sec. 2.2: its own (MoE) layer, the 2h -> h projection and the shared output layer run per token
    n = tiny_moe.matmul_params + attention + moe_mlp + 2 * 1024 * 1024 + 1000 * 1024
    assert m.matmul_params == n
    assert (m.params, m.activated_params) == (tiny_moe.params, tiny_moe.activated_params)  # as DeepSeek counts them
    assert m.mtp_params == tiny_moe.layer_params(True) + 2 * 1024 * 1024 + 2 * 1024
    attention_flops = 3 * 5 * s * 8 * (160 + 64) * tokens  # 4 layers + the MTP layer
    assert _inventory_flops(m, layout, s) == pytest.approx(6 * n * tokens + attention_flops, rel=1e-12)
    assert stepmodel.step(m, "h100", layout, "bf16", s).model_flops == pytest.approx(6 * n * tokens + attention_flops, rel=1e-12)
    last = layout.pp - 1
    assert memory.stage_layers(m, layout, last)[1] == memory.stage_layers(tiny_moe, layout, last)[1] + 1
    if layout.pp > 1:  # the first stage is unchanged; the last also holds a copy of the embedding
        assert memory.stage_layers(m, layout, 0) == memory.stage_layers(tiny_moe, layout, 0)
        extra = memory.stage_params(m, layout, last) - memory.stage_params(tiny_moe, layout, last)
        routed = 3 * 1024 * 512 * 16
        embedding = shapes.padded_vocab(m, 2) * 1024
        assert extra == pytest.approx((m.mtp_params - routed + embedding) / 2 + routed / 2)  # tp 2; ep 2 x etp 1


@pytest.mark.parametrize("layout, key", [
    ("dp=4,ep=3", "layout.ep"),  # 16 experts
    ("dp=2,ep=4", "layout.ep"),  # ep does not divide tp * cp * dp
    ("tp=2,dp=2,ep=4", "layout.ep"),  # etp defaults to tp: ep * etp = 8 > 4
    ("tp=2,sp=0,dp=2,ep=2,etp=1", "sequence-parallel"),
])
def test_moe_bad_layouts_are_config_errors(layout, key, tiny_moe):
    with pytest.raises(ConfigError) as e:
        stepmodel.step(tiny_moe, "h100", parse_step_layout(layout), "bf16", 4096)
    assert e.value.key == key, str(e.value)
    with pytest.raises(ConfigError) as e:  # a dense model has no experts to split
        stepmodel.step(shapes.load_model("llama3-8b", layers=2), "h100", parse_step_layout("dp=2,ep=2"))
    assert e.value.key == "layout.ep" and "no experts" in str(e.value)
    with pytest.raises(ConfigError) as e:
        stepmodel.step(shapes.load_model("qwen3-30b-a3b", layers=2), "h100", parse_step_layout("dp=2,ep=2,seo=1"))
    assert e.value.key == "layout.seo"


def test_low_precision_recipes_need_the_hardware(fp8_step_from_bf16):
    model = shapes.load_model("llama3-70b", layers=8)
    lay = StepLayout(tp=8, micro_batches=4)
    base = stepmodel.step(model, "h100", lay, "bf16")
    fp8 = stepmodel.step(model, "h100", lay, "fp8")
    assert fp8.step_seconds == pytest.approx(fp8_step_from_bf16(base, fp8), rel=1e-3)  # GEMMs 2x, quantise added
    nvfp4 = stepmodel.step(model, "b200", lay, "nvfp4").step_seconds
    assert nvfp4 < stepmodel.step(model, "b200", lay, "mxfp8").step_seconds
    with pytest.raises(ConfigError, match="precision: got 'nvfp4'"):
        stepmodel.step(model, "h100", lay, "nvfp4")


def test_dp_and_p2p_overlap_expose_only_a_bucket_and_the_fill(h100_step):
    base = h100_step("tp=8,pp=2,dp=4", micro_batches=8)
    ogr = h100_step("tp=8,pp=2,dp=4,ogr=1,opg=1", micro_batches=8)
    bucket = 40e6  # Megatron's bucket (max(40M, 1M x dp) parameters)
    params = memory.stage_params(base.model, base.layout, 1)
    assert params > 5 * bucket
    ratio = ogr.by_collective["dp all-gather"] / base.by_collective["dp all-gather"]
    assert ratio == pytest.approx(bucket / params, rel=0.05)  # latency terms aside
    p2p = h100_step("tp=8,pp=2,dp=4,p2p=1", micro_batches=8)
    assert p2p.by_collective["pp send/recv"] == pytest.approx(base.by_collective["pp send/recv"] * 2 / (2 * (8 + 1)))


def test_dualpipe_bubble_memory_and_bad_layouts():
    """DeepSeek-V3 Table 2: bubble (pp/2 - 1)(F&B + B - 3W), twice the parameters, pp + 1 micro-batches of activations."""
    model = shapes.load_model("llama3-8b", layers=8)
    one_f_one_b = parse_step_layout("pp=4,dp=2", micro_batches=8)
    dual = replace(one_f_one_b, dualpipe=True)
    r1, r2 = stepmodel.step(model, "h100", one_f_one_b), stepmodel.step(model, "h100", dual)
    # GPU s runs half the micro-batches of stage s and half of stage 3 - s: GPU 0 has the embedding and the output layer
    c = layerops.Ctx(model, hardware.get_gpu("h100"), dual, efficiency.RECIPES["bf16"], 4096, efficiency.EFFICIENCY["h100"])
    ops = 4 * layerops.layer_ops(c) + [o for first, last in ((True, False), (False, True)) for o in layerops.edge_ops(c, first, last)]
    half = [(o, 0.5) for o in ops]  # 2 layers on each of its stages, each stage at half the micro-batches
    t = sum(o.seconds * o.count * w for o, w in half)
    fwd = sum(o.seconds * o.count * w for o, w in half if o.name.endswith(" fwd"))
    wgrad = sum(o.seconds * o.count * w for o, w in half if o.kind == "gemm" and o.name.endswith(" bwd")) / 2
    assert r2.by_op["pipeline bubble"] == pytest.approx((4 / 2 - 1) * (t + (t - fwd - wgrad) - 3 * wgrad), rel=1e-9)
    assert r2.by_op["pipeline bubble"] < r1.by_op["pipeline bubble"]
    # twice the parameters of a 1F1B stage (stages 0 and 3 on GPU 0), pp + 1 = 5 micro-batches in flight
    m0 = memory.stage_memory(model, dual, 4096, 0)
    both = memory.stage_params(model, one_f_one_b, 0) + memory.stage_params(model, one_f_one_b, 3)
    assert m0.weights == pytest.approx(2 * both)
    per_layer = memory.activation_bytes_per_layer(model, dual, 4096)
    assert m0.activations == pytest.approx(5 * 2 * per_layer)
    assert memory.stage_memory(model, one_f_one_b, 4096, 0).activations == pytest.approx(4 * 2 * per_layer)
    for text in ("pp=3,dualpipe=1", "pp=4,vpp=2,dualpipe=1", "dualpipe=1"):
        with pytest.raises(ConfigError, match="layout.dualpipe"):
            parse_step_layout(text)


def test_recipe_speedup_breakdown_adds_up_and_only_gemms_and_casts_change(fp8_step_from_bf16):
    model = shapes.load_model("llama3-70b", layers=8)
    layout = parse_step_layout("tp=8", micro_batches=4)
    base, fp8 = stepmodel.recipe_speedup(model, "h100", layout, "fp8")
    b, q = stepmodel.breakdown(base), stepmodel.breakdown(fp8)
    assert sum(b.values()) == pytest.approx(base.step_seconds) and sum(q.values()) == pytest.approx(fp8.step_seconds)
    assert b["quantise"] == 0 < q["quantise"]
    assert q["GEMMs"] < b["GEMMs"] and q["GEMMs"] > b["GEMMs"] / 2  # 2x peak, but the output layer stays BF16
    for k in ("attention", "memory-bound", "communication"):
        assert q[k] == pytest.approx(b[k]), k
    assert fp8.step_seconds == pytest.approx(fp8_step_from_bf16(base, fp8), rel=1e-3)
    with pytest.raises(ConfigError):
        stepmodel.recipe_speedup(model, "h100", layout, "fp4")  # no FP4 tensor cores on H100
