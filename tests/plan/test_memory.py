"""scaling.plan.memory: model states, activations and the busiest stage, against hand counts."""

import pytest

from scaling.plan import memory, shapes
from scaling.plan.layout import StepLayout


def test_moe_memory_terms_hand_counted(tiny_moe):
    m, s = tiny_moe, 4096
    lay = StepLayout(tp=2, dp=4, ep=4, etp=1, zero=1)
    attention, norms = 1024 * 256 + 256 * 8 * 160 + 1024 * 160 + 128 * 8 * 192 + 8 * 64 * 1024, 2 * 1024 + 256 + 128
    routed = 16 * 3 * 1024 * 512
    replicated = (4 * (attention + norms) + 3 * 1024 * 4096 + 3 * (3 * 1024 * 512 + 1024 * 16) + 2 * 1000 * 1024 + 1024)
    local_replicated, local_routed = memory.stage_params_split(m, lay, 0)
    assert local_replicated == pytest.approx(replicated / 2 + (1024 - 1000) * 1024 * 2 / 2)  # vocabulary padded to 1024
    assert local_routed == 3 * routed / 4  # 3 MoE layers, experts over ep = 4
    # ZeRO-1: the replicated parameters' optimizer states over dp x cp = 4, the experts' over
    # their expert-data-parallel group tp cp dp / (ep etp) = 2
    assert lay.expert_dp == 2
    mem = memory.stage_memory(m, lay, s, 0)
    assert mem.weights == pytest.approx(2 * (local_replicated + local_routed))
    assert mem.gradients == pytest.approx(4 * (local_replicated + local_routed))
    assert mem.optimizer == pytest.approx(12 * (local_replicated / 4 + local_routed / 2))
    # activations of a MoE layer (BF16, sequence parallel over tp = 2, 2048 own tokens per GPU):
    t, te = 4096, 2048
    per_token = (4 * 1024) / 2 + (2 * 256 + 2 * 128 + 32) + 8 * (2 * 160 + 64 + 64) / 2 + 3 * 512 / 2
    slots = te * 4  # own tokens x top-4, etp = 1
    expect = 2 * (t * per_token + slots * (1024 + 3 * 512)) + 4 * te * 16  # + FP32 router scores
    assert memory.activation_bytes_per_layer(m, lay, s, moe=True) == pytest.approx(expect)
    # selective recompute drops MLA's Q, K, V (redone from the latents)
    selective = memory.activation_bytes_per_layer(m, StepLayout(tp=2, dp=4, ep=4, etp=1, recompute="selective"), s, True)
    assert expect - selective == pytest.approx(2 * t * 8 * (2 * 160 + 64) / 2)


def test_zero_stages_shard_exactly_what_they_should():
    model = shapes.load_model("llama3-8b")
    p = memory.stage_params(model, StepLayout(dp=4), 0)  # pp = tp = 1: every parameter
    assert p == pytest.approx(model.params)
    expect = {0: (2 * p, 4 * p, 12 * p), 1: (2 * p, 4 * p, 3 * p), 2: (2 * p, p, 3 * p), 3: (p / 2, p, 3 * p)}
    for zero, (w, g, o) in expect.items():
        mem = memory.stage_memory(model, StepLayout(dp=4, zero=zero), 4096, 0)
        assert (mem.weights, mem.gradients, mem.optimizer) == pytest.approx((w, g, o))
    # Megatron's default: the distributed optimizer (ZeRO-1) as soon as dp (or cp) > 1
    assert StepLayout(dp=4).zero_stage == 1 and StepLayout(cp=2).zero_stage == 1
    assert StepLayout().zero_stage == 0


def test_activations_match_korthikanti_hand_count():
    # a GPT block (MHA, GELU, ffn = 4h): Korthikanti's 34 s*b*h bytes less the 2 bytes of dropout masks
    gpt = shapes.ModelShape("gpt", layers=4, hidden=4096, heads=32, kv_heads=32, ffn=16384, vocab=50304, gated=False)
    s, h = 2048, 4096
    none = memory.activation_bytes_per_layer(gpt, StepLayout(tp=4), s)  # sequence parallel by default
    assert none == 32 * s * h / 4
    no_sp = memory.activation_bytes_per_layer(gpt, StepLayout(tp=4, sp=False), s)
    assert no_sp == 2 * s * (4 * h + 12 * h / 4)  # the four tensors before column-parallel GEMMs are replicated
    full = memory.activation_bytes_per_layer(gpt, StepLayout(tp=4, recompute="full"), s)
    assert full == 2 * s * h / 4
    # Llama (GQA, SwiGLU): 2 bytes * t * (6 h + 2 kv + 3 ffn)
    llama = shapes.load_model("llama3-8b")
    assert memory.activation_bytes_per_layer(llama, StepLayout(), 4096) == 2 * 4096 * (6 * 4096 + 2 * 1024 + 3 * 14336)
    # 1F1B: the first stage holds pp micro-batches of L/pp layers, the last one
    lay = StepLayout(pp=4, micro_batches=8)
    per_layer = memory.activation_bytes_per_layer(llama, lay, 4096)
    assert memory.stage_memory(llama, lay, 4096, 0).activations == 8 * 4 * per_layer
    assert memory.stage_memory(llama, lay, 4096, 3).activations == 8 * 1 * per_layer
