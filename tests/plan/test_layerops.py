"""scaling.plan.layerops: the ops of a layer: collectives, overlaps, grouped GEMMs, quantise copies."""

import pytest

from scaling.plan import efficiency, hardware, layerops, shapes, stepmodel
from scaling.plan.layout import parse_step_layout


def test_moe_all_to_all_on_nvlink_inside_a_node_and_the_network_across():
    model = shapes.load_model("deepseek-v3", layers=8, mtp=0)  # 5 MoE layers (3 dense first)

    def a2a(text):
        r = stepmodel.step(model, "h100", parse_step_layout(text, micro_batches=8, recompute="selective"))
        return r.by_collective.get("ep all-to-all", 0.0), r

    inside, _ = a2a("dp=8,ep=8")  # one node
    across, base = a2a("dp=64,ep=64")  # eight nodes: 7/8 of the copies through the NIC
    assert 0 < inside < across
    # each of 8 copies of a token (7168 x 2 bytes), 7 of 8 off the node, at the NIC's 50 GB/s x efficiency
    eff = efficiency.EFFICIENCY["h100"].bandwidth
    one = 4096 * 8 * 7168 * 2 * (56 / 64) / (50e9 * eff) + 6e-6
    assert across == pytest.approx(4 * 5 * 8 * one, rel=1e-9)  # 4 per layer, 5 MoE layers, 8 micro-batches
    deepep, _ = a2a("dp=64,ep=64,deepep=1")  # once per remote node: at most 4 nodes (node-limited routing)
    assert deepep == pytest.approx(across * (4 * 7 / 8) / (8 * 7 / 8), rel=1e-3)
    hidden, overlapped = a2a("dp=64,ep=64,a2ao=1")
    assert hidden < across and overlapped.step_seconds < base.step_seconds
    # DeepEP overlapped: what compute hides costs compute 20 of the 132 SMs for as long (20 / 112 more time)
    exposed, both = a2a("dp=64,ep=64,deepep=1,a2ao=1")
    assert 0 <= exposed < deepep
    assert both.by_op["ep all-to-all SM share"] == pytest.approx((deepep - exposed) * 20 / 112, rel=1e-9)
    assert "ep all-to-all SM share" not in overlapped.by_op  # NCCL's all-to-all: not priced
    # a routing imbalance adds expert time, not model FLOPs
    from unittest import mock
    with mock.patch.object(shapes, "MOE_IMBALANCE", 1.5):
        _, skewed = a2a("dp=64,ep=64")
    assert skewed.model_flops == base.model_flops
    assert skewed.by_op["gemm expert-fc1"] == pytest.approx(1.5 * base.by_op["gemm expert-fc1"], rel=0.05)


def test_tp_overlap_hides_tp_communication_behind_gemms(h100_step):
    plain = h100_step("tp=8")
    overlapped = h100_step("tp=8,tpo=1")
    tp_comm = sum(v for k, v in plain.by_collective.items() if k.startswith("tp "))
    assert tp_comm > 0.05 * plain.step_seconds  # the overlap has something to hide
    assert overlapped.step_seconds < plain.step_seconds
    # never hides more than the TP collectives themselves
    assert overlapped.step_seconds >= plain.step_seconds - tp_comm - 1e-12
    # GEMMs at tp=8 on H100 outlast the layers' collectives, so all of those hide; the output
    # layer's all-gather / reduce-scatter (edge ops) stay exposed
    c = layerops.Ctx(plain.model, plain.gpu, plain.layout, efficiency.RECIPES["bf16"], 4096, efficiency.EFFICIENCY["h100"])
    edge = sum(o.seconds for o in layerops.edge_ops(c, True, True) if o.kind == "comm") * 8  # 8 micro-batches
    assert 0 < edge < 0.1 * tp_comm
    assert overlapped.step_seconds == pytest.approx(plain.step_seconds - tp_comm + edge, rel=1e-9)


def test_grouped_expert_gemm_is_priced_at_its_total_size():
    """A GPU's local experts run as one grouped GEMM (TE's --moe-grouped-gemm): 16 experts of a tokens x k x n GEMM
    cost what one GEMM of 16x the tokens costs, less than 16 separate GEMMs at the size knee."""
    model = shapes.load_model("qwen3-30b-a3b", layers=2)
    layout = parse_step_layout("ep=8,dp=8", micro_batch=1, micro_batches=1)
    c = layerops.Ctx(model, hardware.GPUS["h100"], layout, efficiency.RECIPES["fp8"], 4096, efficiency.EFFICIENCY["h100"])
    ops: list[layerops.Op] = []
    layerops._gemm(c, ops, "experts", 4096 * 8, 2048, 768, groups=16)
    one = c.gemm_seconds(2.0 * 4096 * 8 * 2048 * 768)
    assert ops[0].seconds == pytest.approx(one, rel=1e-12) and ops[1].seconds == pytest.approx(2 * one, rel=1e-12)
    assert ops[0].seconds < 16 * c.gemm_seconds(2.0 * 4096 * 8 * 2048 * 768 / 16)


def test_quantised_copies_follow_the_gemm_layouts_the_gpu_takes():
    """Per-tensor FP8 needs a transposed copy for the backward on Hopper (TN-only FP8 GEMMs), none on Blackwell;
    block-scaled recipes (MX, NVFP4, blockwise FP8) quantise each operand along both axes on every GPU. On B200,
    per-tensor FP8's quantise ops move (2 + 1) bytes per element against MXFP8's (2 + 2 x 33/32)."""
    h100, b200 = hardware.GPUS["h100"], hardware.GPUS["b200"]
    r = efficiency.RECIPES
    assert (r["fp8"].copies(h100), r["fp8"].copies(b200)) == (2, 1)
    assert all(r[k].copies(b200) == 2 for k in ("fp8-blockwise", "mxfp8", "mxfp6", "mxfp4", "nvfp4"))
    assert r["fp8-blockwise"].copies(h100) == 2
    assert r["tf32"].copies(h100) == 1
    model = shapes.load_model("llama3-8b", layers=2)
    layout = parse_step_layout("dp=8", micro_batch=1, micro_batches=1)
    fp8, mx = (stepmodel.step(model, "b200", layout, p, 4096).by_op["quantise"] for p in ("fp8", "mxfp8"))
    assert mx / fp8 == pytest.approx((2 + 2 * 33 / 32) / 3, rel=1e-9)
