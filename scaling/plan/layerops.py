"""The ops of one micro-batch on one GPU, each with its time: a transformer layer's GEMMs, flash
attention, memory-bound ops, low-precision casts and collectives (layer_ops), and the embedding and
output layer at the pipeline's ends (edge_ops).

GEMMs are priced by FLOPs / (peak x efficiency(size)), flash attention by its FLOPs at its own
efficiency, memory-bound ops by bytes / HBM bandwidth, collectives with the ring formulas on NVLink
inside a node or the NIC across nodes (Efficiency: scaling.plan.efficiency).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scaling.plan import shapes
from scaling.plan.efficiency import Efficiency, StepRecipe
from scaling.plan.hardware import GPU
from scaling.plan.layout import StepLayout
from scaling.plan.shapes import ModelShape, padded_vocab

@dataclass
class Op:
    """One op of one micro-batch on one GPU of a stage (`count` times per micro-batch)."""

    name: str
    kind: str  # gemm, attention, memory, comm
    seconds: float
    flops: float = 0.0  # model FLOPs (6ND accounting: no recompute, causal attention halved)
    count: int = 1
    overhead_flops: float = 0.0  # FLOPs that are not model FLOPs: Hadamard rotations, RMS scales


@dataclass
class Ctx:
    model: ModelShape
    gpu: GPU
    layout: StepLayout
    recipe: StepRecipe
    seq_len: int
    eff: Efficiency

    @property
    def tokens(self) -> int:  # tokens of one micro-batch on one GPU (after context parallel)
        return self.seq_len * self.layout.micro_batch // self.layout.cp

    def gemm_seconds(self, flops: float, rate: str | None = None) -> float:
        rate = rate or self.recipe.rate
        peak = self.gpu.peak_tflops[rate] * 1e12
        return flops / (peak * self.eff.gemm_at(rate) * flops / (flops + self.eff.gemm_half_flops))

    def hbm_seconds(self, nbytes: float) -> float:
        return nbytes / (self.gpu.hbm_tbps * 1e12 * self.eff.bandwidth)

    def group_link(self, span: int) -> tuple[float, float]:
        """(bytes/s, latency s) of a group whose ranks span `span` consecutive GPUs."""
        if span <= self.gpu.gpus_per_node:
            return self.gpu.nvlink_gbps * 1e9 * self.eff.bandwidth, self.gpu.nvlink_latency_us * 1e-6
        return self.gpu.net_gbps * 1e9 * self.eff.bandwidth, self.gpu.net_latency_us * 1e-6

    def collective(self, kind: str, nbytes: float, size: int, span: int) -> float:
        """Ring all-reduce / reduce-scatter / all-gather of a `nbytes` buffer over `size` ranks."""
        if size == 1:
            return 0.0
        bandwidth, latency = self.group_link(span)
        steps = (size - 1) * (2 if kind == "all-reduce" else 1)
        return steps / size * nbytes / bandwidth + steps * latency

    @property
    def own_tokens(self) -> float:  # tokens a GPU holds between the tensor-parallel blocks (sequence parallel splits them)
        tp = self.layout.tp
        return self.tokens / tp if self.layout.sequence_parallel or tp == 1 else self.tokens


# SMs DeepEP's dispatch/combine kernels take while compute overlaps them: DeepSeek-V3 (Sec. 3.2.2)
# uses 20 of an H800's 132; Megatron-Bridge's DeepSeek-V3 recipe leaves the same 20 free of TE's
# kernels (NVTE_*_SM_MARGIN=20).
DEEPEP_SMS = 20


def _gemm(c: Ctx, ops: list[Op], name: str, tokens: float, k: float, n: float, groups: int = 1,
          model_share: float = 1.0, rate: str | None = None) -> tuple[float, float]:
    """A GEMM (tokens x k) @ (k x n) forward and its two backward GEMMs (input and weight grads).

    `groups` equal GEMMs run as one grouped GEMM (a GPU's local experts: TE's --moe-grouped-gemm, one
    kernel), priced at their total size: a grouped kernel's launch and tail cost is paid once, not
    per expert (per expert, SimuMax's B200 DeepSeek runs came out +31% to +97%); `model_share`
    scales the model FLOPs (a routing imbalance adds time, not model FLOPs).
    Returns the elements a low-precision recipe quantises: the input (forward), the output grad (backward).
    """
    flops = 2.0 * tokens * k * n
    seconds = c.gemm_seconds(flops, rate)
    ops.append(Op(f"gemm {name} fwd", "gemm", seconds, flops * model_share))
    ops.append(Op(f"gemm {name} bwd", "gemm", 2 * seconds, 2 * flops * model_share))
    return tokens * k, tokens * n


def _tp_ops(c: Ctx, ops: list[Op], gathered: list[float]) -> None:
    """Tensor-parallel collectives of a layer whose blocks gather inputs of `gathered` elements per token.

    Sequence parallel (Korthikanti et al. 2022): each block all-gathers its input before the
    column-parallel GEMMs and reduce-scatters the row-parallel output (h); the backward
    reduce-scatters the input grad, all-gathers the output grad and re-gathers the saved sharded
    input for the weight grad. Without it, one all-reduce per block each way.
    """
    lay, t, h, tp = c.layout, c.tokens, c.model.hidden, c.layout.tp
    if tp == 1:
        return
    ag = [c.collective("all-gather", 2.0 * t * g, tp, tp) for g in gathered]
    rs_out = c.collective("reduce-scatter", 2.0 * t * h, tp, tp)
    if not lay.sequence_parallel:
        ar = c.collective("all-reduce", 2.0 * t * h, tp, tp)
        ops.append(Op("tp all-reduce fwd", "comm", ar, count=len(gathered)))
        ops.append(Op("tp all-reduce bwd", "comm", ar, count=len(gathered)))
        return
    rs_in = [c.collective("reduce-scatter", 2.0 * t * g, tp, tp) for g in gathered]
    ag_out = c.collective("all-gather", 2.0 * t * h, tp, tp)
    fwd = {"tp all-gather fwd": sum(ag), "tp reduce-scatter fwd": rs_out * len(gathered)}
    bwd = {"tp reduce-scatter bwd": sum(rs_in), "tp all-gather bwd": ag_out * len(gathered) + sum(ag)}
    if lay.tp_overlap:
        # Transformer Engine's userbuffers split each all-gather / reduce-scatter into tp chunks
        # pipelined with the GEMM that consumes / produces them (NeMo's --tp-comm-overlap): what
        # the GEMMs of a direction cannot cover is exposed.
        gemm_fwd = sum(o.seconds for o in ops if o.kind == "gemm" and o.name.endswith(" fwd"))
        gemm_bwd = sum(o.seconds for o in ops if o.kind == "gemm" and o.name.endswith(" bwd"))
        ops.append(Op("tp exposed fwd", "comm", max(0.0, sum(fwd.values()) - gemm_fwd)))
        ops.append(Op("tp exposed bwd", "comm", max(0.0, sum(bwd.values()) - gemm_bwd)))
        return
    ops.extend(Op(name, "comm", seconds) for name, seconds in (fwd | bwd).items())


def all_to_all(c: Ctx, tokens: float, size: int, stride: int) -> float:
    """Dispatch (or combine) of a GPU's `tokens` routed tokens to top_k experts over `size` ranks `stride` GPUs apart.

    NCCL all-to-all: each of the top_k copies of a token (hidden x 2 bytes) goes to its expert's
    rank; the ranks inside this node are reached over NVLink, the others through this GPU's NIC,
    both at once (the slower sets the time). With deepep, a token crosses the network once per
    remote node holding one of its experts (the expected number of distinct nodes among top_k
    experts drawn uniformly, at most the model's route_nodes) and fans out over NVLink there.
    """
    m = c.model
    if size == 1:
        return 0.0
    copy = 2.0 * m.hidden
    local_peers = max(1, min(size, c.gpu.gpus_per_node // stride))  # group members inside this node, itself included
    nvlink, nvlink_latency = c.group_link(1)
    net, net_latency = c.group_link(c.gpu.gpus_per_node + 1)
    if size == local_peers:
        return tokens * m.top_k * copy * (size - 1) / size / nvlink + nvlink_latency
    if c.layout.deepep:
        nodes = size // local_peers
        per_node = m.experts // nodes
        miss = math.comb(m.experts - per_node, m.top_k) / math.comb(m.experts, m.top_k)
        hit = nodes * (1 - miss)
        if m.route_nodes:
            hit = min(hit, m.route_nodes)
        network = tokens * hit * (nodes - 1) / nodes * copy
        fan_out = tokens * m.top_k * copy * (local_peers - 1) / local_peers
    else:
        network = tokens * m.top_k * copy * (size - local_peers) / size
        fan_out = tokens * m.top_k * copy * (local_peers - 1) / size
    return max(network / net, fan_out / nvlink) + net_latency


def layer_ops(c: Ctx, moe: bool = False) -> list[Op]:
    """Forward and backward ops of one transformer layer (dense, or MoE) for one micro-batch on one GPU.

    Listed in this order, since later steps price what earlier ones listed (TP communication hides
    behind the GEMMs, the expert all-to-all behind the compute, recompute repeats the forward): the
    GEMMs and flash attention, the memory-bound ops, a low-precision recipe's casts, the TP
    collectives, the expert all-to-all, MoE's host overhead, the CP exchange, then recompute.
    """
    ops: list[Op] = []
    quantised: list[tuple[float, float]] = []  # (forward, backward) elements of each low-precision GEMM
    attention_gather, elementwise = _attention_ops(c, ops, quantised)
    if moe:
        ffn_gathered, a2a, shared = _moe_ops(c, ops, quantised, elementwise)
    else:
        ffn_gathered, a2a, shared = _mlp_ops(c, ops, quantised, elementwise), 0.0, (0.0, 0.0)
    ops.extend(_elementwise_ops(c, elementwise))
    if c.recipe.rate != "bf16":
        ops.extend(_quantise_ops(c, quantised))
    if c.recipe.rotated:
        ops.extend(_rotation_ops(c, quantised))
    _tp_ops(c, ops, [attention_gather, *ffn_gathered])
    if a2a:
        ops.extend(_all_to_all_ops(c, ops, a2a, shared))
    if moe and c.eff.moe_layer_seconds:
        # the GPU idles on the host (Efficiency.moe_layer_seconds): no other micro-batch's
        # all-to-all hides under it, and recompute does not repeat it (no suffix)
        ops.append(Op("moe overhead", "host", c.eff.moe_layer_seconds))
    if c.layout.cp > 1:
        ops.extend(_cp_exchange_ops(c))
    if c.layout.recompute != "none":
        ops.extend(_recompute_ops(c, ops))
    return ops


def _attention_ops(c: Ctx, ops: list[Op], quantised: list[tuple[float, float]]) -> tuple[float, dict[str, float]]:
    """The attention block's GEMMs and flash attention; returns the elements per token its TP block
    gathers and the bytes of its memory-bound ops (norms, residual adds, rotary)."""
    m, tp, t, te, h = c.model, c.layout.tp, c.tokens, c.own_tokens, c.model.hidden
    # Megatron rank order tp, cp, dp, pp (tp innermost): a tp group spans tp GPUs
    if m.mla:
        gather, rotary, latent_norms = _mla_projections(c, ops, quantised)
    else:
        q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
        quantised.append(_gemm(c, ops, "qkv", t, h, (q + 2 * kv) / tp))
        gather, rotary, latent_norms = h, 4 * t * (q + kv) / tp, 0.0
    quantised.append(_gemm(c, ops, "attn-out", t, m.heads * m.v_head_dim / tp, h))
    attn, attn_peak = _flash_attention(c)
    ops.append(Op("flash-attention fwd", "attention", attn / attn_peak, attn))
    ops.append(Op("flash-attention bwd", "attention", 2.5 * attn / attn_peak, 2 * attn))
    elementwise = {
        "rmsnorm": 2 * 4 * te * h + latent_norms,  # two norms: read x, write y
        "residual-add": 2 * 6 * te * h,  # two adds: read 2, write 1
        "rotary": rotary,  # q and k, read + write
    }
    return gather, elementwise


def _mla_projections(c: Ctx, ops: list[Op], quantised: list[tuple[float, float]]) -> tuple[float, float, float]:
    """MLA (Megatron-Core): the down-projections run on the sequence-parallel shard and their latents
    are all-gathered (not the hidden state); the up-projections are column-parallel. Returns the
    gathered elements per token, the rotary bytes and the latent norms' bytes."""
    m, tp, t, te, h = c.model, c.layout.tp, c.tokens, c.own_tokens, c.model.hidden
    q_in = m.q_rank or h
    if m.q_rank:
        quantised.append(_gemm(c, ops, "q-down", te, h, m.q_rank))
    quantised.append(_gemm(c, ops, "q-up", t, q_in, m.heads * m.qk_head / tp))
    quantised.append(_gemm(c, ops, "kv-down", te, h, m.kv_rank + m.rope_dim))
    quantised.append(_gemm(c, ops, "kv-up", t, m.kv_rank, m.heads * (m.head_dim + m.v_head_dim) / tp))
    gather = (m.q_rank or h) + m.kv_rank + m.rope_dim
    rotary = 4 * t * (m.heads * m.rope_dim / tp + m.rope_dim)
    latent_norms = 4 * t * (m.q_rank + m.kv_rank)
    return gather, rotary, latent_norms


def _flash_attention(c: Ctx) -> tuple[float, float]:
    """(forward FLOPs, FLOP/s) of flash attention on one GPU: QK^T and PV, causal halves both; each
    of the t local queries sees s/2 keys on average (cp balances causal chunks). The backward is 5
    matmuls to the forward's 2 (S = QK^T is recomputed): 2.5x the forward's hardware FLOPs for 2x
    its model FLOPs."""
    m = c.model
    attn = 2.0 * c.tokens * (c.seq_len / 2) * m.heads * (m.qk_head + m.v_head_dim) / c.layout.tp
    return attn, c.gpu.peak_tflops["bf16"] * 1e12 * c.eff.attention_at(attn, m.mla)


def _activation(model: ModelShape) -> tuple[str, int]:
    """The FFN activation's name and bytes moved per element of its output width."""
    return ("swiglu", 6) if model.gated else ("gelu", 4)


def _mlp_ops(c: Ctx, ops: list[Op], quantised: list[tuple[float, float]], elementwise: dict[str, float]) -> list[float]:
    """A dense MLP's two GEMMs and activation; returns the elements per token its TP block gathers."""
    m, tp, t, h = c.model, c.layout.tp, c.tokens, c.model.hidden
    g = 2 if m.gated else 1
    quantised.append(_gemm(c, ops, "fc1", t, h, g * m.ffn / tp))
    quantised.append(_gemm(c, ops, "fc2", t, m.ffn / tp, h))
    act, act_bytes = _activation(m)
    elementwise[act] = act_bytes * t * m.ffn / tp
    return [h]


def _moe_ops(c: Ctx, ops: list[Op], quantised: list[tuple[float, float]],
             elementwise: dict[str, float]) -> tuple[list[float], float, tuple[float, float]]:
    """A MoE layer's router, shared experts and routed experts. Returns the elements per token its TP
    blocks gather, the all-to-all time of each direction (dispatch and combine forward, their
    gradients backward) and the shared experts' (forward, backward) GEMM time."""
    m, lay, h, te = c.model, c.layout, c.model.hidden, c.own_tokens
    g = 2 if m.gated else 1
    act, act_bytes = _activation(m)
    etp, local = lay.expert_tp, m.experts // lay.ep
    _gemm(c, ops, "router", te, h, m.experts, rate="bf16")  # FP32 logits in DeepSeek-V3: tiny either way
    elementwise["router"] = 3 * 4 * te * m.experts  # FP32 logits written, softmax/top-k read and write
    gathered: list[float] = []
    shared = (0.0, 0.0)
    if m.shared_experts:
        shared = _shared_expert_ops(c, ops, quantised, elementwise)
        gathered.append(h)
    # each GPU routes its te tokens to top_k experts; the expert-tensor-parallel group gathers them
    sent = te * m.top_k
    slots = sent * etp * shapes.MOE_IMBALANCE
    quantised.append(_gemm(c, ops, "expert-fc1", slots, h, g * m.expert_ffn / etp, local, 1 / shapes.MOE_IMBALANCE))
    quantised.append(_gemm(c, ops, "expert-fc2", slots, m.expert_ffn / etp, h, local, 1 / shapes.MOE_IMBALANCE))
    elementwise[f"expert-{act}"] = act_bytes * slots * m.expert_ffn / etp
    elementwise["moe permute"] = 2 * 2 * 2.0 * sent * h  # permute and unpermute: read + write BF16
    if etp > 1:
        gather = c.collective("all-gather", 2.0 * slots * h, etp, etp)
        ops.append(Op("etp all-gather fwd", "comm", gather))
        ops.append(Op("etp reduce-scatter fwd", "comm", c.collective("reduce-scatter", 2.0 * slots * h, etp, etp)))
        ops.append(Op("etp all-gather bwd", "comm", gather))
        ops.append(Op("etp reduce-scatter bwd", "comm", c.collective("reduce-scatter", 2.0 * slots * h, etp, etp)))
    return gathered, 2 * all_to_all(c, te, lay.ep, etp), shared


def _shared_expert_ops(c: Ctx, ops: list[Op], quantised: list[tuple[float, float]],
                       elementwise: dict[str, float]) -> tuple[float, float]:
    """The always-on experts' GEMMs and activation; returns their (forward, backward) GEMM seconds."""
    m, tp, t, h = c.model, c.layout.tp, c.tokens, c.model.hidden
    g = 2 if m.gated else 1
    shared = m.shared_experts * m.expert_ffn
    before = len(ops)
    quantised.append(_gemm(c, ops, "shared-fc1", t, h, g * shared / tp))
    quantised.append(_gemm(c, ops, "shared-fc2", t, shared / tp, h))
    act, act_bytes = _activation(m)
    elementwise[act] = act_bytes * t * shared / tp
    return (sum(o.seconds for o in ops[before:] if o.name.endswith(" fwd")),
            sum(o.seconds for o in ops[before:] if o.name.endswith(" bwd")))


def _elementwise_ops(c: Ctx, elementwise: dict[str, float]) -> list[Op]:
    """Memory-bound ops of `elementwise` (name -> forward bytes); the backward moves twice the bytes."""
    ops = []
    for name, nbytes in elementwise.items():
        ops.append(Op(f"{name} fwd", "memory", c.hbm_seconds(nbytes)))
        ops.append(Op(f"{name} bwd", "memory", c.hbm_seconds(2 * nbytes)))
    return ops


def _quantise_ops(c: Ctx, quantised: list[tuple[float, float]]) -> list[Op]:
    """Quantise each GEMM input: read BF16, write the low-precision copy and, where the backward needs
    one (StepRecipe.copies), a second one; the backward quantises each output gradient the same way.
    Weights: once per step (stepmodel.step). RMS scales (StepRecipe.rms_scales) add 2 FLOPs per
    element of each forward copy, inside the same memory-bound pass."""
    copies = c.recipe.copies(c.gpu)
    per_elem = 2 + copies * c.recipe.bytes
    inputs, grads = sum(f for f, _ in quantised), sum(b for _, b in quantised)
    rms = 2.0 * copies * inputs if c.recipe.rms_scales else 0.0
    return [Op("quantise fwd", "memory", c.hbm_seconds(per_elem * inputs), overhead_flops=rms),
            Op("quantise bwd", "memory", c.hbm_seconds(per_elem * grads))]


def rotated_elements(quantised: list[tuple[float, float]]) -> dict[str, float]:
    """Operand elements each GEMM rotates along its reduction axis, from the (input, output-gradient)
    elements of each low-precision GEMM: fprop the input X, dgrad the output gradient dY, wgrad both
    (reduced over the tokens). The weight's share (fprop and dgrad) is once per step (stepmodel.step)."""
    x, dy = sum(f for f, _ in quantised), sum(b for _, b in quantised)
    return {"fprop": x, "dgrad": dy, "wgrad": x + dy}


def _rotation_ops(c: Ctx, quantised: list[tuple[float, float]]) -> list[Op]:
    """Hadamard rotations of the rotated GEMMs' activation and gradient operands: 2b FLOPs per element
    and, unless fused into the quantiser, a BF16 read and write. Memory-bound either way: 2b = 32 or 64
    FLOPs per 4 bytes sits far below the BF16 tensor-core peak over HBM bandwidth (~280 FLOP/byte on
    B200), so the time is the bytes' and a fused rotation adds none."""
    r, elements = c.recipe, rotated_elements(quantised)
    out = []
    for suffix, gemms in ((" fwd", ("fprop",)), (" bwd", ("dgrad", "wgrad"))):
        flops = sum(r.rotation_flops(g) * elements[g] for g in gemms)
        nbytes = sum(r.rotation_bytes(g) * elements[g] for g in gemms)
        if suffix == " bwd" and r.unrotated_grads:  # dX back from the fprop's rotated domain, a pass of its own
            flops += r.rotation_flops("fprop") * elements["fprop"]
            nbytes += 4.0 * elements["fprop"]
        if flops:
            out.append(Op("hadamard" + suffix, "memory", c.hbm_seconds(nbytes), overhead_flops=flops))
    return out


def _all_to_all_ops(c: Ctx, ops: list[Op], a2a: float, shared: tuple[float, float]) -> list[Op]:
    """The expert all-to-all of each direction (`a2a` seconds), less what overlaps hide of it: another
    micro-batch's compute of the ops listed so far (a2ao, DualPipe), or the shared experts' GEMMs (seo)."""
    lay = c.layout
    a2a_fwd = a2a_bwd = a2a
    out = []
    if lay.a2a_overlap:  # another micro-batch's compute runs under the all-to-all (DualPipe)
        compute_fwd = sum(o.seconds for o in ops if o.kind != "comm" and o.name.endswith(" fwd"))
        compute_bwd = sum(o.seconds for o in ops if o.kind != "comm" and o.name.endswith(" bwd"))
        hidden = min(a2a_fwd, compute_bwd) + min(a2a_bwd, compute_fwd)
        a2a_fwd, a2a_bwd = max(0.0, a2a_fwd - compute_bwd), max(0.0, a2a_bwd - compute_fwd)
        if lay.deepep:  # DeepEP's kernels hold DEEPEP_SMS SMs while the compute runs beside them
            out.append(Op("ep all-to-all SM share", "comm", hidden * DEEPEP_SMS / (c.gpu.sms - DEEPEP_SMS)))
    elif lay.shared_expert_overlap:  # the shared experts' GEMMs run under the all-to-all
        a2a_fwd, a2a_bwd = max(0.0, a2a_fwd - shared[0]), max(0.0, a2a_bwd - shared[1])
    return out + [Op("ep all-to-all fwd", "comm", a2a_fwd), Op("ep all-to-all bwd", "comm", a2a_bwd)]


def _cp_exchange_ops(c: Ctx) -> list[Op]:
    """Ring attention: every rank gathers the other ranks' K, V (forward) and reduce-scatters dK, dV
    (backward); the exchange overlaps the attention blocks it feeds."""
    m, lay, tp = c.model, c.layout, c.layout.tp
    kv = m.heads * (m.qk_head + m.v_head_dim) if m.mla else 2 * m.kv_heads * m.head_dim
    kv_buf = 2.0 * c.tokens * lay.cp * kv / tp
    span = tp * lay.cp
    attn, attn_peak = _flash_attention(c)
    fwd = max(0.0, c.collective("all-gather", kv_buf, lay.cp, span) - attn / attn_peak)
    bwd = max(0.0, 2 * c.collective("all-gather", kv_buf, lay.cp, span) - 2.5 * attn / attn_peak)
    return [Op("cp kv exchange fwd", "comm", fwd), Op("cp kv exchange bwd", "comm", bwd)]


def _recompute_ops(c: Ctx, ops: list[Op]) -> list[Op]:
    """What recompute runs again, no model FLOPs: full, the whole forward (its collectives too);
    selective (Megatron's --recompute-granularity selective), the attention core and MLA's
    up-projections (DeepSeek-V3 Sec. 3.3.1; the mla_up_proj module of Megatron-Bridge's DeepSeek-V3 recipes)."""
    selective = ("gemm q-up fwd", "gemm kv-up fwd")
    again = [o for o in ops if o.name.endswith(" fwd")
             and (c.layout.recompute == "full" or o.kind == "attention" or o.name in selective)]
    return [Op(o.name.replace(" fwd", " recompute"), o.kind, o.seconds, 0.0, o.count, o.overhead_flops) for o in again]


def edge_ops(c: Ctx, first: bool, last: bool) -> list[Op]:
    """The embedding (first stage) and output layer + cross-entropy (last stage) for one micro-batch.

    Each MTP module (last stage; its transformer layer is counted by `stage_layers`) adds an
    embedding lookup, two RMSNorms and the 2h -> h projection before its layer, and a final norm,
    the shared output layer and a cross-entropy after it (DeepSeek-V3 Sec. 2.2)."""
    m, tp, t = c.model, c.layout.tp, c.tokens
    norm_split = tp if c.layout.sequence_parallel else 1
    ops: list[Op] = []
    if first:
        ops.append(Op("embedding fwd+bwd", "memory", c.hbm_seconds(t * m.hidden * (2 + 4))))
    if last:
        heads = 1 + m.mtp  # output layers run per micro-batch: the model's and one per MTP module
        vocab = padded_vocab(m, tp)
        run = 2.0 * t * m.hidden * vocab / tp  # the padded rows cost time but are not model FLOPs
        flops = 2.0 * t * m.hidden * m.vocab / tp
        ops.append(Op("gemm output fwd", "gemm", c.gemm_seconds(run, "bf16"), flops, heads))  # kept in BF16
        ops.append(Op("gemm output bwd", "gemm", 2 * c.gemm_seconds(run, "bf16"), 2 * flops, heads))
        # fused cross-entropy: FP32 logits read/written about three times over forward and backward
        ops.append(Op("cross-entropy", "memory", c.hbm_seconds(3 * 4.0 * t * vocab / tp), count=heads))
        ops.append(Op("final rmsnorm", "memory", c.hbm_seconds(12.0 * t * m.hidden / norm_split), count=heads))
        if tp > 1:
            buf = 2.0 * t * m.hidden
            ops.append(Op("tp all-gather fwd", "comm", c.collective("all-gather", buf, tp, tp), count=heads))
            ops.append(Op("tp reduce-scatter bwd", "comm", c.collective("reduce-scatter", buf, tp, tp), count=heads))
        if m.mtp:
            proj = 2.0 * t * 2 * m.hidden * m.hidden / tp
            ops.append(Op("gemm mtp-proj fwd", "gemm", c.gemm_seconds(proj), proj, m.mtp))
            ops.append(Op("gemm mtp-proj bwd", "gemm", 2 * c.gemm_seconds(proj), 2 * proj, m.mtp))
            ops.append(Op("mtp embedding+norms", "memory", c.hbm_seconds(t * m.hidden * (2 + 4) + 2 * 12.0 * t * m.hidden / norm_split),
                          count=m.mtp))
    return ops



def attention_flops_per_token(model: ModelShape, seq_len: int) -> float:
    """Model FLOPs of causal attention per token, forward and backward: 3 * L * s * heads * (d_qk + d_v)
    (QK^T and PV, halved by the causal mask; 6 L s h for multi-head attention), L counting the MTP modules' layers."""
    return 3.0 * (model.layers + model.mtp) * seq_len * model.heads * (model.qk_head + model.v_head_dim)
