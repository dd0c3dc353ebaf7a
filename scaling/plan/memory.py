"""Peak memory on one GPU of a pipeline stage: model states under ZeRO, the activations 1F1B (or
DualPipe) keeps in flight, the logits, and the transient of one layer's backward (stage_memory)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from scaling.plan import shapes
from scaling.plan.layout import StepLayout
from scaling.plan.shapes import ModelShape, padded_vocab

GIB = 2**30
# Allocator slack, cuBLAS/NCCL workspaces and CUDA context outside max_memory_allocated's view
# are not counted; the transient of one layer's backward (gradient buffers) is.
WORKSPACE_BYTES = 0.5 * GIB


def activation_bytes_per_layer(model: ModelShape, layout: StepLayout, seq_len: int, moe: bool = False) -> float:
    """BF16 activations one layer (dense, or MoE) keeps for its backward, one micro-batch, per GPU.

    Korthikanti et al. 2022 (Sec. 4) counted for a GPT block (34 s*b*h with dropout); here the
    same walk for a Llama block with flash attention (no a*s^2 term: the scores are recomputed)
    and no dropout, in elements of tokens t = s*b/cp:
      norm-1 input h, QKV input h, Q/K/V q + 2 kv, attention output q (also the out-proj input),
      norm-2 input h, FC1 input h, FC1 output 2 ffn (SwiGLU) or ffn (GELU), FC2 input ffn.
    Sequence parallel (Korthikanti Sec. 4.2.2) splits every term by tp; without it the four h
    terms before the column-parallel GEMMs are replicated across the tp ranks.
    MLA keeps its latents instead of the QKV input (q_rank twice: norm and up-projection input;
    kv_rank + rope and kv_rank), all-gathered on every tp rank, and Q, K, V of the up-projections
    unless selective recompute redoes those.
    A MoE layer keeps, instead of the FFN terms: the MoE input h, the router's FP32 scores
    (experts per token), the shared experts like an FFN, and per routed token on the GPU
    (te * top_k * etp, te = the GPU's own tokens): the expert input h, FC1 output and FC2 input
    (2 ffn + ffn over etp for SwiGLU; Megatron applies the routing weights in the activation, so
    the expert output is not kept).
    Full recompute keeps only the layer input (t*h, split by tp under sequence parallel).
    GPT with dropout would add 2 masks; Korthikanti's 34 = 2 * 16 + 2.
    """
    m, tp = model, layout.tp
    t = seq_len * layout.micro_batch / layout.cp
    h = m.hidden
    split = tp if layout.sequence_parallel else 1
    if layout.recompute == "full":
        return 2.0 * t * h / split
    g = 3 if m.gated else 2
    if m.mla:
        replicated, latents = 2 * h, 2 * m.q_rank + 2 * m.kv_rank + m.rope_dim
        # Q, K, V of the up-projections and the attention output; selective recompute redoes the up-projections
        qkv = 0 if layout.recompute == "selective" else m.heads * (2 * m.qk_head + m.v_head_dim)
        sharded = qkv + m.heads * m.v_head_dim
    else:
        replicated, latents = 2 * h, 0
        sharded = m.heads * m.head_dim * 2 + 2 * m.kv_heads * m.head_dim
    replicated += 2 * h  # norm-2 input, FFN / MoE input
    if not moe:
        return 2.0 * t * (replicated / split + latents + (sharded + g * m.ffn) / tp)
    te = t / tp if layout.sequence_parallel or tp == 1 else t
    slots = te * m.top_k * layout.expert_tp * shapes.MOE_IMBALANCE
    shared = g * m.shared_experts * m.expert_ffn / tp
    routed = slots * (h + g * m.expert_ffn / layout.expert_tp)
    return 2.0 * (t * (replicated / split + latents + sharded / tp + shared) + routed) + 4.0 * te * m.experts


@dataclass(frozen=True)
class StageMemory:
    """Bytes on one GPU of a pipeline stage."""

    weights: float
    gradients: float
    optimizer: float  # FP32 master weights + Adam m, v
    activations: float
    logits: float
    workspace: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.logits + self.workspace

    def gib(self) -> dict[str, float]:
        parts = asdict(self) | {"total": self.total}
        return {k: v / GIB for k, v in parts.items()}


def stage_layers(model: ModelShape, layout: StepLayout, stage: int) -> tuple[int, int]:
    """(dense, MoE) layers on `stage`.

    The layers fill the pp * vpp virtual stages in order, ceil(L / (pp vpp)) each (the last ones
    may hold fewer: Megatron's uneven split, --decoder-last-pipeline-num-layers or a
    pipeline layout); stage s runs virtual stages s, s + pp, ... The first dense_layers are dense.
    The last stage also runs the MTP modules' layers (Megatron places them after the output layer).
    """
    chunks = layout.pp * layout.vpp
    per = -(-model.layers // chunks)
    dense = moe = 0
    for chunk in range(stage, chunks, layout.pp):
        first, last = chunk * per, min((chunk + 1) * per, model.layers)
        if last > first:
            n_dense = max(0, min(last, model.layers - model.moe_layers) - first)
            dense, moe = dense + n_dense, moe + (last - first - n_dense)
    if stage == layout.pp - 1 and model.mtp:
        dense, moe = (dense, moe + model.mtp) if model.moe else (dense + model.mtp, moe)
    return dense, moe


def stage_kept_layers(model: ModelShape, layout: StepLayout, stage: int, first: int, last: int) -> tuple[int, int]:
    """(dense, MoE) layers on `stage` among the model's first `first` and last `last` layers (a
    recipe's layers kept in BF16; the MTP modules' layers are not among them). Same placement as
    stage_layers."""
    chunks = layout.pp * layout.vpp
    per = -(-model.layers // chunks)
    n_dense = model.layers - model.moe_layers
    held = [i for chunk in range(stage, chunks, layout.pp)
            for i in range(chunk * per, min((chunk + 1) * per, model.layers))]
    kept = [i for i in held if i < first or i >= model.layers - last]
    dense = sum(1 for i in kept if i < n_dense)
    return dense, len(kept) - dense


def layers_params(model: ModelShape, layout: StepLayout, dense: int, moe: int, norms: bool = True) -> float:
    """Parameters on one GPU of `dense` dense and `moe` MoE layers (split as in stage_params_split);
    norms=False: only their matrices."""
    routed = (3 if model.gated else 2) * model.hidden * model.expert_ffn * model.experts
    shared = dense * model.layer_params() + moe * (model.layer_params(True) - routed)
    if not norms:
        shared -= (dense + moe) * model.norm_params
    return shared / layout.tp + moe * routed / (layout.ep * layout.expert_tp)


def stage_params_split(model: ModelShape, layout: StepLayout, stage: int) -> tuple[float, float]:
    """(parameters replicated over the data-parallel ranks, routed-expert parameters) on one GPU of `stage`.

    Everything but the routed experts is split by tp (norm weights are replicated; < 0.01%) and
    sharded by ZeRO over dp x cp; the routed experts are split over ep x etp and sharded over
    their expert-data-parallel group. Embedding on the first stage, output layer on the last, and
    with MTP the modules' projections and, under pipeline parallelism, a copy of the embedding
    (Megatron builds one on the last stage for the MTP inputs).
    """
    tp, pp = layout.tp, layout.pp
    dense, moe = stage_layers(model, layout, stage)
    vocab = padded_vocab(model, tp)
    routed = (3 if model.gated else 2) * model.hidden * model.expert_ffn * model.experts
    layers = dense * model.layer_params() + moe * (model.layer_params(True) - routed)
    edge = (vocab * model.hidden if stage == 0 else 0) + (vocab * model.hidden + model.hidden if stage == pp - 1 else 0)
    if stage == pp - 1 and model.mtp:
        edge += model.mtp * model.mtp_extra_params + (vocab * model.hidden if pp > 1 else 0)
    return (layers + edge) / tp, moe * routed / (layout.ep * layout.expert_tp)


def stage_params(model: ModelShape, layout: StepLayout, stage: int) -> float:
    """Parameters on one GPU of `stage`."""
    return sum(stage_params_split(model, layout, stage))


def stage_memory(model: ModelShape, layout: StepLayout, seq_len: int, stage: int) -> StageMemory:
    """Peak allocated bytes on one GPU of `stage`.

    Model states, Megatron-LM mixed precision: BF16 weights (2 bytes), FP32 gradient buffer (4:
    Megatron accumulates and reduces BF16 models' gradients in FP32), FP32 master weights and
    Adam m, v (12). ZeRO shards over dp: stage 1 (= the distributed optimizer) the 12, stage 2
    also the gradients, stage 3 also the weights. Low-precision recipes keep the same states
    (the FP8/FP4 casts are transient per GEMM; counted as time, not memory).
    ZeRO shards over dp x cp (Megatron's gradient/optimizer group includes context parallel);
    routed experts over their expert-data-parallel group (tp cp dp / (ep etp)).
    Activations: 1F1B keeps min(pp - stage, m) micro-batches in flight on `stage` (pp on the
    first); interleaving with v virtual stages adds (pp - 1) / v chunks of L / (pp v) layers
    (Korthikanti Sec. 4.2.3). The last stage also holds the FP32 logits and their gradient.
    DualPipe (DeepSeek-V3 Table 2): the GPU holds stages s and pp - 1 - s (twice the parameters)
    and pp + 1 micro-batches of a stage's activations (the mean of its two).
    """
    zero = layout.zero_stage
    stages = (stage, layout.pp - 1 - stage) if layout.dualpipe else (stage,)
    splits = [stage_params_split(model, layout, s) for s in stages]
    groups = ((sum(r for r, _ in splits), layout.dp * layout.cp), (sum(e for _, e in splits), layout.expert_dp))

    def sharded(nbytes: float, from_stage: int) -> float:
        return sum(p * nbytes / (size if zero >= from_stage else 1) for p, size in groups)

    layers = [stage_layers(model, layout, s) for s in stages]
    t = seq_len * layout.micro_batch / layout.cp
    logits = 6.0 * t * padded_vocab(model, layout.tp) / layout.tp if layout.pp - 1 in stages else 0.0
    return StageMemory(
        weights=sharded(2, 3),
        gradients=sharded(4, 2),
        optimizer=sharded(12, 1),
        activations=_in_flight(layout, stage) * _activations_per_micro_batch(model, layout, seq_len, layers),
        logits=logits,
        workspace=_backward_transient(model, layout, seq_len, layers) + WORKSPACE_BYTES,
    )


def _in_flight(layout: StepLayout, stage: int) -> float:
    """Micro-batches whose activations `stage` holds at its peak (1F1B, interleaved, or DualPipe)."""
    in_flight = min(layout.pp - stage, layout.micro_batches)
    if layout.vpp > 1 and stage == 0:
        in_flight = min(layout.pp * (1 + (layout.pp - 1) / (layout.pp * layout.vpp)), layout.micro_batches)
    if layout.dualpipe:
        in_flight = min(layout.pp + 1, layout.micro_batches)
    return in_flight


def _activations_per_micro_batch(model: ModelShape, layout: StepLayout, seq_len: int,
                                 layers: list[tuple[int, int]]) -> float:
    """Activation bytes of one micro-batch over the (dense, MoE) `layers` of each stage the GPU holds
    (their mean: DualPipe's two stages)."""
    return sum(d * activation_bytes_per_layer(model, layout, seq_len)
               + e * activation_bytes_per_layer(model, layout, seq_len, moe=True) for d, e in layers) / len(layers)


def _backward_transient(model: ModelShape, layout: StepLayout, seq_len: int, layers: list[tuple[int, int]]) -> float:
    """Bytes the backward of one layer materialises next to the saved activations: its activation
    gradients (twice under full recompute: the recomputed activations too) and the largest local
    weight's dummy wgrad.

    Transformer Engine fuses wgrad into the FP32 main_grad and hands autograd a dummy BF16 wgrad
    of the weight's shape: the largest local weight is allocated during its backward. A MoE
    layer's grouped GEMM asks for one per expert, but TE caches dummy wgrads by (rows, cols,
    dtype) (transformer_engine/pytorch/module/base.py get_dummy_wgrad; SimuMax models it so,
    simumax/core/base_struct.py _record_te_dummy_wgrad_shape), so all local experts share one
    expert's FC1 shape, not all local experts' FC1 at once.
    """
    dense, moe = max(n for n, _ in layers), max(n for _, n in layers)
    no_recompute = replace(layout, recompute="none")
    transient = max((activation_bytes_per_layer(model, no_recompute, seq_len, kind) for kind, n in ((False, dense), (True, moe)) if n),
                    default=0.0)
    if layout.recompute == "full":
        transient *= 2  # the recomputed layer's activations and their gradients
    m, tp, h, g = model, layout.tp, model.hidden, (2 if model.gated else 1)
    if m.mla:
        local = [h * m.q_rank, m.q_rank * m.heads * m.qk_head / tp, h * (m.kv_rank + m.rope_dim),
                 m.kv_rank * m.heads * (m.head_dim + m.v_head_dim) / tp, m.heads * m.v_head_dim * h / tp]
    else:
        local = [h * (m.heads + 2 * m.kv_heads) * m.head_dim / tp]
    if dense:
        local.append(h * g * m.ffn / tp)
    if moe:
        local.append(h * g * m.expert_ffn / layout.expert_tp)
    return transient + 2.0 * max(local)
