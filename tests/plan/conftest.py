"""Helpers several planner test files share, as fixtures (the test directories have no packages to import from)."""

import pytest

from scaling.plan import cluster, efficiency, runplan, shapes, stepmodel
from scaling.plan.layout import parse_step_layout

KEPT_BF16 = ("gemm output", "gemm router")  # GEMMs every recipe runs in BF16 (layerops: rate="bf16")
# a small MoE with every feature: MLA, a dense first layer, shared and routed experts
TINY_MOE = shapes.ModelShape("tiny-moe", layers=4, hidden=1024, heads=8, kv_heads=8, ffn=4096, vocab=1000,
                             head_size=128, q_rank=256, kv_rank=128, rope_dim=32, v_head=64, experts=16, top_k=4,
                             shared_experts=1, expert_ffn=512, dense_layers=1)


def _talk_days(name, precision="bf16", gpus=(1024, 5000, 10000)):
    """{K: (days, step)} of a talk-table run under its written-down layout."""
    model_name, flops, _ = cluster.TALK_TABLE[name]
    model, recipe = shapes.load_model(model_name), cluster.CLUSTER_RECIPES[model_name]
    out = {}
    for k in gpus:
        step = cluster.cluster_step(model, "h100", k, precision, recipe)
        out[k] = (runplan.plan_run(flops, k, "h100", step=step).days, step)
    return out


def _fp8_step_from_bf16(bf16_step, fp8_step) -> float:
    """The FP8 step its BF16 step predicts: every GEMM but KEPT_BF16 at the FP8 rate (twice the peak at
    the FP8 runs' efficiency, not BF16's: H100 0.493 of 1,979 against 0.595 of 989, so 1.66x, not 2x);
    attention, memory-bound ops and the optimizer unchanged; plus what the FP8 step reports for its
    quantise ops, its pipeline bubble and its exposed communication (less compute hides less of it)."""
    moving = ("quantise", "communication", "pipeline bubble")
    cat = stepmodel.category
    gpu, eff = fp8_step.gpu, efficiency.efficiency_for(fp8_step.gpu)
    speedup = gpu.peak_tflops["fp8"] * eff.gemm_at("fp8") / (gpu.peak_tflops["bf16"] * eff.gemm_at("bf16"))
    gemms = sum(t if op in KEPT_BF16 else t / speedup for op, t in bf16_step.by_op.items() if cat(op) == "GEMMs")
    same = sum(t for op, t in bf16_step.by_op.items() if cat(op) not in ("GEMMs", *moving))
    return gemms + same + sum(t for op, t in fp8_step.by_op.items() if cat(op) in moving)


def _h100_step(layout_text, model="llama3-70b", **kw):
    model = shapes.load_model(model, layers=kw.pop("layers", 8))
    layout = parse_step_layout(layout_text, micro_batches=kw.pop("micro_batches", 8))
    return stepmodel.step(model, "h100", layout, kw.pop("precision", "bf16"), kw.pop("seq_len", 4096))


@pytest.fixture
def talk_days():
    return _talk_days


@pytest.fixture
def fp8_step_from_bf16():
    return _fp8_step_from_bf16


@pytest.fixture
def h100_step():
    return _h100_step


@pytest.fixture
def tiny_moe():
    return TINY_MOE
