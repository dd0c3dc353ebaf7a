"""One training step of a transformer, op by op: time and peak memory per GPU (`scaling plan step`).

Pure Python (no JAX, no NumPy): `scaling plan` must answer in well under a second.

The step is priced the way SimuMax (MooreThreads/SimuMax) and Calculon do it: every op of a
layer's forward and backward is listed with its shape and priced (scaling.plan.layerops), the
per-micro-batch time of the busiest pipeline stage goes through the 1F1B schedule
((m + (p - 1) / v) stage times), the data-parallel gradient reduction and the optimizer follow, and
the busiest GPU's memory comes from scaling.plan.memory. The parts: model shapes (shapes), layouts
(layout), recipes and efficiency constants (efficiency), the fastest layout that fits (search).

The efficiency constants (EFFICIENCY) are calibrated on published measurements and checked
on others that were kept apart: scaling/plan/step_cases.json, scaling/plan/stepvalidate.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from scaling.errors import ConfigError
from scaling.plan.efficiency import RECIPE_FOR_FORMAT, RECIPES, Efficiency, efficiency_for, get_recipe, recipe_for_format
from scaling.plan.hardware import GPU, GPUS, get_gpu
from scaling.plan.layerops import Ctx, Op, attention_flops_per_token, edge_ops, layer_ops
from scaling.plan.layout import StepLayout
from scaling.plan.memory import (GIB, StageMemory, layers_params, stage_kept_layers, stage_layers, stage_memory,
                                 stage_params_split)
from scaling.plan.shapes import ModelShape


@dataclass
class StepResult:
    model: ModelShape
    gpu: GPU
    layout: StepLayout
    precision: str
    seq_len: int
    step_seconds: float
    model_flops: float  # whole cluster, one step
    memory: StageMemory  # busiest GPU
    busiest_stage: int
    by_op: dict[str, float] = field(default_factory=dict)  # seconds per step on the critical path
    by_collective: dict[str, float] = field(default_factory=dict)
    # FLOPs per step (whole cluster) that are not model FLOPs, by op group: Hadamard rotations
    # ("hadamard", "hadamard weights") and RMS scales ("quantise", "quantise weights")
    overhead_flops: dict[str, float] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        lay = self.layout
        return self.seq_len * lay.micro_batch * lay.micro_batches * lay.dp

    @property
    def gpu_key(self) -> str:
        return next((k for k, v in GPUS.items() if v == self.gpu), self.gpu.name)

    @property
    def mfu(self) -> float:
        peak = self.gpu.peak_tflops[RECIPES[self.precision].rate] * 1e12
        return self.model_flops / (self.step_seconds * self.layout.gpus * peak)

    def to_json(self) -> dict[str, Any]:
        lay = self.layout
        return {
            "model": self.model.name, "gpu": self.gpu.name, "precision": self.precision, "seq_len": self.seq_len,
            "layout": {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "cp": lay.cp, "ep": lay.ep, "zero": lay.zero_stage,
                       "sequence_parallel": lay.sequence_parallel, "recompute": lay.recompute, "vpp": lay.vpp,
                       "micro_batch": lay.micro_batch, "micro_batches": lay.micro_batches,
                       "overlap_grad_reduce": lay.overlap_grad_reduce, "overlap_param_gather": lay.overlap_param_gather,
                       "tp_overlap": lay.tp_overlap, "overlap_p2p": lay.p2p_overlapped, "dualpipe": lay.dualpipe,
                       "gpus": lay.gpus}
            | ({"etp": lay.expert_tp, "shared_expert_overlap": lay.shared_expert_overlap, "a2a_overlap": lay.a2a_overlap,
                "deepep": lay.deepep} if self.model.moe else {}),
            "params": self.model.params,
            "activated_params": self.model.activated_params,
            "step_ms": self.step_seconds * 1e3,
            "tokens_per_step": self.tokens,
            "tokens_per_s": self.tokens / self.step_seconds,
            "tokens_per_s_per_gpu": self.tokens / self.step_seconds / lay.gpus,
            "model_tflops_per_gpu": self.model_flops / self.step_seconds / lay.gpus / 1e12,
            "overhead_flops": self.overhead_flops,
            "mfu": self.mfu,
            "memory_gib": self.memory.total / GIB,
            "memory_breakdown_gib": self.memory.gib(),
            "busiest_stage": self.busiest_stage,
            "fits": self.memory.total <= self.gpu.memory_bytes,
            "gpu_memory_gib": self.gpu.memory_bytes / GIB,
            "by_op_ms": {k: v * 1e3 for k, v in sorted(self.by_op.items(), key=lambda kv: -kv[1])},
            "by_collective_ms": {k: v * 1e3 for k, v in sorted(self.by_collective.items(), key=lambda kv: -kv[1])},
        }


def _group(name: str) -> str:
    """'gemm fc1 bwd' -> 'gemm fc1'; 'tp all-gather fwd' -> 'tp all-gather'."""
    for suffix in (" fwd", " bwd", " recompute"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def validate(model: ModelShape, layout: StepLayout, seq_len: int, gpus: int | None = None) -> None:
    """ConfigError for a layout the model or the cluster cannot take (Megatron's own checks)."""
    tp, pp, cp, ep, etp = layout.tp, layout.pp, layout.cp, layout.ep, layout.expert_tp
    if gpus is not None and layout.gpus != gpus:
        raise ConfigError("layout", f"tp*cp*pp*dp = {layout.gpus}", f"a product equal to --gpus {gpus}")
    if model.heads % tp or model.kv_heads % tp:
        raise ConfigError("layout.tp", tp, f"a divisor of the attention heads ({model.heads}) and KV heads ({model.kv_heads})")
    if model.layers > model.moe_layers and model.ffn % tp:
        raise ConfigError("layout.tp", tp, f"a divisor of the FFN width ({model.ffn})")
    if pp * layout.vpp > model.layers:
        raise ConfigError("layout.pp", pp, f"pp * vpp at most the layers ({model.layers}; vpp = {layout.vpp})")
    if seq_len % (2 * cp) if cp > 1 else False:
        raise ConfigError("layout.cp", cp, f"2 * cp dividing the sequence length ({seq_len}; load-balanced causal chunks)")
    if layout.sequence_parallel and (seq_len * layout.micro_batch // cp) % tp:
        raise ConfigError("layout.tp", tp, f"a divisor of the tokens per micro-batch ({seq_len * layout.micro_batch // cp})")
    if layout.micro_batches < pp and pp > 1:
        raise ConfigError("micro-batches", layout.micro_batches, f">= pp ({pp}) to fill the pipeline")
    if not model.moe:
        for key, value, on in (("ep", ep, ep > 1), ("etp", layout.etp, (layout.etp or 1) > 1),
                               ("seo", 1, layout.shared_expert_overlap), ("a2ao", 1, layout.a2a_overlap),
                               ("deepep", 1, layout.deepep)):
            if on:
                raise ConfigError(f"layout.{key}", value, f"none: {model.name} has no experts (expert parallelism needs a MoE model)")
        return
    if model.experts % ep:
        raise ConfigError("layout.ep", ep, f"a divisor of the routed experts ({model.experts})")
    if (tp * cp * layout.dp) % (ep * etp):
        raise ConfigError("layout.ep", ep, f"ep * etp (etp = {etp}) dividing tp * cp * dp = {tp * cp * layout.dp}: "
                          "the experts of a stage are split over its data-parallel ranks")
    if model.expert_ffn % etp or (model.shared_experts * model.expert_ffn) % tp:
        raise ConfigError("layout.etp", etp, f"a divisor of the expert width ({model.expert_ffn}), with tp dividing the shared experts'")
    if tp > 1 and not layout.sequence_parallel:
        raise ConfigError("sequence-parallel", False, "on when tp > 1 with experts (Megatron requires it for MoE)")
    if layout.shared_expert_overlap and not model.shared_experts:
        raise ConfigError("layout.seo", 1, f"0: {model.name} has no shared experts")


def step(model: ModelShape, gpu: str | GPU, layout: StepLayout, precision: str = "bf16", seq_len: int = 4096,
         gpus: int | None = None, eff: Efficiency | None = None) -> StepResult:
    """Time and peak memory of one optimizer step (all micro-batches), with its breakdown."""
    spec = get_gpu(gpu) if isinstance(gpu, str) else gpu
    if not spec.hbm_tbps:
        raise ConfigError("gpu", spec.name, "a GPU with bandwidths in scaling.plan.hardware.GPUS")
    if not (isinstance(seq_len, int) and seq_len >= 1):
        raise ConfigError("seq-len", seq_len, "a positive integer")
    recipe = get_recipe(precision, spec)
    validate(model, layout, seq_len, gpus)
    c = Ctx(model, spec, layout, recipe, seq_len, eff or efficiency_for(gpu))
    stage_ops, kind_of = _stage_ops(c)
    total, by_op = _pipeline(layout, stage_ops, kind_of)
    by_collective = {k: v for k, v in by_op.items() if k.startswith(("tp ", "cp ", "ep ", "etp "))}
    if layout.pp > 1:
        by_collective["pp send/recv"] = _p2p_seconds(c)
        total += by_collective["pp send/recv"]
    _, groups = _param_groups(model, layout, list(stage_ops))
    for k, seconds in _dp_seconds(c, groups, total).items():
        if seconds:
            by_collective[k] = seconds
            total += seconds
    by_op["optimizer"] = _optimizer_seconds(c, groups)
    total += by_op["optimizer"]
    # weights cast (and transposed, rotated) once per step: the stage whose GPU spends the most on it
    weights = max((_weight_work(c, s)[0] for s in stage_ops), key=lambda w: sum(w.values()))
    for k, seconds in weights.items():
        by_op[k] = seconds
        total += seconds
    by_op.update({k: v for k, v in by_collective.items() if k not in by_op})

    # the first stage holds the most in-flight micro-batches, the last the logits: one of them peaks
    memories = {s: stage_memory(model, layout, seq_len, s) for s in stage_ops}
    busiest = max(memories, key=lambda s: memories[s].total)
    tokens = seq_len * layout.micro_batch * layout.micro_batches * layout.dp
    model_flops = (6.0 * model.matmul_params + attention_flops_per_token(model, seq_len)) * tokens
    overhead = _overhead_flops(c, stage_ops, kind_of)
    return StepResult(model, spec, layout, precision.lower(), seq_len, total, model_flops, memories[busiest],
                      busiest, by_op, by_collective, overhead)


def _stage_ops(c: Ctx) -> tuple[dict[int, list[Op]], dict[int, int]]:
    """One micro-batch's ops on each kind of stage (keyed by the first stage of that kind), and each
    stage's kind. Stages differ in their dense / MoE layer counts, the recipe's layers kept in BF16
    (StepRecipe.kept_layers) and at the ends (embedding on the first, output layer on the last):
    each distinct kind is priced once."""
    model, layout, pp = c.model, c.layout, c.layout.pp
    kept_bf16 = replace(c, recipe=RECIPES["bf16"])
    body = {(False, False): layer_ops(c)}
    if model.moe:
        body[(True, False)] = layer_ops(c, moe=True)
    kinds: dict[tuple, int] = {}
    kind_of = {s: kinds.setdefault((stage_layers(model, layout, s), _stage_kept(c, s), s == 0, s == pp - 1), s)
               for s in range(pp)}
    if any(kept != (0, 0) for _, kept, _, _ in kinds):
        body[(False, True)] = layer_ops(kept_bf16)
        if model.moe:
            body[(True, True)] = layer_ops(kept_bf16, moe=True)
    stage_ops = {}
    for (counts, kept, first, last), s in kinds.items():
        layers = {(moe, False): n - k for moe, n, k in zip((False, True), counts, kept)}
        layers |= {(moe, True): k for moe, k in zip((False, True), kept)}
        ops = [replace(o, count=o.count * n) for key, n in layers.items() if n for o in body[key]]
        stage_ops[s] = ops + edge_ops(c, first, last)
    return stage_ops, kind_of


def _stage_kept(c: Ctx, stage: int) -> tuple[int, int]:
    """(dense, MoE) layers of `stage` that the recipe keeps in BF16."""
    first, last = c.recipe.kept_layers(c.model.layers)
    return stage_kept_layers(c.model, c.layout, stage, first, last) if first or last else (0, 0)


def _weight_work(c: Ctx, stage: int) -> tuple[dict[str, float], dict[str, float]]:
    """({op: seconds}, {op: overhead FLOPs}) of casting the weights of one GPU of `stage` once per step:
    read BF16 and write each copy (StepRecipe.weight_copies; the kept layers' weights are not cast),
    rotate the layers' weights for the GEMMs that rotate them (fprop along d_in, dgrad along d_out)
    and sum the squares of their RMS scales."""
    r, model, layout = c.recipe, c.model, c.layout
    if r.rate == "bf16":
        return {}, {}
    kept = _stage_kept(c, stage)
    dense, moe = stage_layers(model, layout, stage)
    # the quantised GEMMs' weights (MoE layers' router, kept in BF16, counted: < 0.1% of a layer)
    layers = layers_params(model, layout, dense - kept[0], moe - kept[1], norms=False)
    cast = sum(stage_params_split(model, layout, stage)) - layers_params(model, layout, *kept)
    seconds = {"quantise weights": c.hbm_seconds(cast * (2 + r.weight_copies(c.gpu) * r.bytes))}
    flops = {"quantise weights": 2.0 * r.weight_copies(c.gpu) * layers if r.rms_scales else 0.0,
             "hadamard weights": sum(r.rotation_flops(g) for g in ("fprop", "dgrad")) * layers}
    weight_bytes = sum(r.rotation_bytes(g) for g in ("fprop", "dgrad"))
    if r.unrotated_grads:  # dW back from the fprop's rotated domain: a BF16 read and write
        flops["hadamard weights"] += r.rotation_flops("fprop") * layers
        weight_bytes += 4.0
    if flops["hadamard weights"]:
        seconds["hadamard weights"] = c.hbm_seconds(weight_bytes * layers)
    return seconds, {k: v for k, v in flops.items() if v}


def _overhead_flops(c: Ctx, stage_ops: dict[int, list[Op]], kind_of: dict[int, int]) -> dict[str, float]:
    """FLOPs per step over the whole cluster that are not model FLOPs (Op.overhead_flops and the
    weights' casts), by op group."""
    lay = c.layout
    out: dict[str, float] = {}
    per_stage = lay.tp * lay.cp * lay.dp  # GPUs of a stage
    for s in range(lay.pp):
        work = [(_group(o.name), o.overhead_flops * o.count * lay.micro_batches) for o in stage_ops[kind_of[s]]]
        work += list(_weight_work(c, s)[1].items())
        for group, flops in work:
            if flops:
                out[group] = out.get(group, 0.0) + flops * per_stage
    return out


def _gpu_ops(layout: StepLayout, stage_ops: dict[int, list[Op]], kind_of: dict[int, int], s: int) -> list[tuple[Op, float]]:
    """(op, weight) of one micro-batch's work on a GPU of stage s: its stage's ops, or under
    DualPipe half of stage s's and half of stage pp - 1 - s's (half the micro-batches enter
    from each end)."""
    if layout.dualpipe:
        return [(o, 0.5) for mirror in (s, layout.pp - 1 - s) for o in stage_ops[kind_of[mirror]]]
    return [(o, 1.0) for o in stage_ops[kind_of[s]]]


def _pipeline(layout: StepLayout, stage_ops: dict[int, list[Op]], kind_of: dict[int, int]) -> tuple[float, dict[str, float]]:
    """(seconds of all micro-batches through the pipeline, bubble included; seconds per step by op
    group on the slowest GPU, which sets the pace)."""
    pp, m_count = layout.pp, layout.micro_batches
    gpu_time = {s: sum(o.seconds * o.count * w for o, w in _gpu_ops(layout, stage_ops, kind_of, s)) for s in range(pp)}
    slow = max(gpu_time, key=lambda s: gpu_time[s])
    by_op: dict[str, float] = {}
    slow_ops = _gpu_ops(layout, stage_ops, kind_of, slow)
    for o, w in slow_ops:
        by_op[_group(o.name)] = by_op.get(_group(o.name), 0.0) + o.seconds * o.count * w * m_count
    t_micro = gpu_time[slow]
    if pp > 1:
        by_op["pipeline bubble"] = _bubble(layout, t_micro, slow_ops)
    return t_micro * m_count + by_op.get("pipeline bubble", 0.0), by_op


def _bubble(layout: StepLayout, t_micro: float, slow_ops: list[tuple[Op, float]]) -> float:
    """Pipeline fill and drain of a GPU whose micro-batch takes `t_micro` seconds."""
    pp = layout.pp
    if layout.dualpipe:
        # DeepSeek-V3 Table 2: (pp/2 - 1)(F&B + B - 3W), F&B a forward and a backward overlapped
        # (t_micro), B the input-gradient and W the weight-gradient part of the backward (half of
        # each backward GEMM is its weight gradient)
        fwd = sum(o.seconds * o.count * w for o, w in slow_ops if o.name.endswith(" fwd"))
        wgrad = sum(o.seconds * o.count * w for o, w in slow_ops if o.kind == "gemm" and o.name.endswith(" bwd")) / 2
        return (pp / 2 - 1) * (t_micro + (t_micro - fwd - wgrad) - 3 * wgrad)
    # 1F1B: m micro-batches plus the (p - 1) / v bubble (Narayanan et al. 2021, interleaved: / v)
    return t_micro * (pp - 1) / layout.vpp


def _p2p_seconds(c: Ctx) -> float:
    """Pipeline sends: activations [s/cp, b, h] (split by tp under sequence parallel) sent forward and
    their gradients backward at every stage boundary (v boundaries per GPU when interleaved); on the
    critical path unless overlapped (interleaved default), when only the fill and drain are."""
    layout = c.layout
    pp, m_count, v = layout.pp, layout.micro_batches, layout.vpp
    act = 2.0 * c.tokens * c.model.hidden / (layout.tp if layout.sequence_parallel else 1)
    bandwidth, latency = c.group_link(layout.gpus)  # pp is the outermost dimension
    sends = 2 * (pp - 1) if layout.p2p_overlapped else 2 * (m_count * v + pp - 1)
    return sends * (act / bandwidth + latency)


def _param_groups(model: ModelShape, layout: StepLayout, stages: list[int]) -> tuple[float, list[tuple[float, int]]]:
    """(parameters on the GPU of the stage holding the most; [(parameters, ranks)] of its two
    gradient-reduction groups: the replicated ones over dp x cp, the routed experts' over their
    expert-data-parallel group)."""
    split = [stage_params_split(model, layout, s) for s in stages]
    params = max(sum(p) for p in split)
    return params, [(max(p[0] for p in split), layout.dp * layout.cp), (max(p[1] for p in split), layout.expert_dp)]


def _dp_seconds(c: Ctx, groups: list[tuple[float, int]], pipeline_seconds: float) -> dict[str, float]:
    """Exposed data-parallel communication of one step by collective.

    FP32 gradients reduce-scattered (ZeRO >= 1, Megatron's distributed optimizer) or all-reduced
    (ZeRO 0) once per step; ZeRO >= 1 then all-gathers the updated BF16 weights. Both groups span
    tp*cp*dp GPUs. With overlap_grad_reduce only the last bucket is exposed (Megatron's bucket:
    max(40M, 1M * dp) parameters).
    """
    layout = c.layout
    span = layout.tp * layout.cp * layout.dp
    zero, m_count = layout.zero_stage, layout.micro_batches
    dp_comm = dict.fromkeys(("dp reduce-scatter", "dp all-gather", "dp all-reduce", "zero-3 all-gather"), 0.0)
    for group_params, size in groups:
        if size == 1 or not group_params:
            continue
        grads = 4.0 * group_params
        exposed = grads if not layout.overlap_grad_reduce else min(grads, 4.0 * max(40e6, 1e6 * size))
        if zero >= 1:
            # ZeRO >= 2 keeps only a gradient shard, so every micro-batch's gradients are
            # reduce-scattered (DeepSpeed's ZeRO-2 under gradient accumulation), not once per step
            times = m_count if zero >= 2 else 1
            dp_comm["dp reduce-scatter"] += times * c.collective("reduce-scatter", exposed, size, span)
            # with overlap_param_gather the next step's forward hides all but the first bucket
            weights = 2.0 * group_params
            gathered = weights if not layout.overlap_param_gather else min(weights, 2.0 * max(40e6, 1e6 * size))
            dp_comm["dp all-gather"] += c.collective("all-gather", gathered, size, span)
        else:
            dp_comm["dp all-reduce"] += c.collective("all-reduce", exposed, size, span)
        if zero == 3:
            # weights re-gathered for forward and backward of every micro-batch; prefetched
            # layer by layer, so only what exceeds the layer's compute is exposed
            gather = 2 * m_count * c.collective("all-gather", 2.0 * group_params, size, span)
            dp_comm["zero-3 all-gather"] += max(0.0, gather - 0.5 * pipeline_seconds)
    return dp_comm


def _optimizer_seconds(c: Ctx, groups: list[tuple[float, int]]) -> float:
    """Adam: read grad, master, m, v (4 each), write master, m, v and the BF16 weight, plus the
    gradient-norm pass: 34 bytes per local parameter (sharded by ZeRO from stage 1)."""
    zero = c.layout.zero_stage
    return c.hbm_seconds(34.0 * sum(p / (size if zero >= 1 else 1) for p, size in groups))


# --------------------------------------------------------------------------------------------
# Where a step's time goes, and a precision recipe against BF16 (`scaling plan --fit`)
# --------------------------------------------------------------------------------------------

CATEGORIES = ("GEMMs", "attention", "quantise", "memory-bound", "communication", "MoE overhead", "pipeline bubble", "optimizer")


def category(op: str) -> str:
    if op.startswith("gemm"):
        return "GEMMs"
    if op.startswith("flash-attention"):
        return "attention"
    if op.startswith(("quantise", "hadamard")):
        return "quantise"
    if op.startswith(("tp ", "cp ", "dp ", "pp ", "ep ", "etp ", "zero-3")):
        return "communication"
    if op == "moe overhead":
        return "MoE overhead"
    if op in ("pipeline bubble", "optimizer"):
        return op
    return "memory-bound"


def breakdown(result: StepResult) -> dict[str, float]:
    """Seconds per step by category (CATEGORIES), summing to the step time."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    for op, seconds in result.by_op.items():
        out[category(op)] += seconds
    return out


def recipe_speedup(model: ModelShape, gpu: str, layout: StepLayout, hardware_format: str,
                   seq_len: int = 4096) -> tuple[StepResult, StepResult]:
    """(BF16 step, the format's recipe step) for the same model, layout and GPU."""
    if hardware_format not in RECIPE_FOR_FORMAT:
        raise ConfigError("precision", hardware_format, f"a format the step model prices: {', '.join(RECIPE_FOR_FORMAT)}")
    recipe = recipe_for_format(hardware_format, get_gpu(gpu))
    return step(model, gpu, layout, "bf16", seq_len), step(model, gpu, layout, recipe, seq_len)
