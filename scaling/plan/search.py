"""The fastest layout that fits (`scaling plan step --search`): every layout a model and a cluster
can take, each priced by the step model."""

from __future__ import annotations

from scaling.errors import ConfigError
from scaling.plan.hardware import GPU, get_gpu
from scaling.plan.layout import RECOMPUTE, StepLayout
from scaling.plan.shapes import ModelShape
from scaling.plan.stepmodel import StepResult, step

SEARCH_MICRO_BATCH = (1, 2, 4, 8)
SEARCH_CP = (1, 2, 4, 8, 16)
SEARCH_VPP = (1, 2, 4, 8)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_layouts(model: ModelShape, gpu: GPU, gpus: int, global_batch: int, seq_len: int,
                      overlap: bool = True) -> list[StepLayout]:
    """Every layout `scaling plan step --search` considers (all pass `validate`).

    tp: divisors of the heads, KV heads and FFN width up to the GPUs of a node; pp: divisors of
    the layers; cp in SEARCH_CP (2 cp dividing the sequence); dp = gpus / (tp cp pp) dividing the
    global batch; micro-batch in SEARCH_MICRO_BATCH dividing the batch per replica; vpp in
    SEARCH_VPP when pp > 1; ZeRO 1-3 when dp cp > 1 (else 0); recompute none/selective/full.
    With `overlap`, Megatron's opt-in overlaps (tpo when tp > 1, ogr, opg) are on.
    MoE models, whose layouts multiply by the expert splits, search what their published recipes
    vary: ep over the divisors of the experts from min(8, experts) up (etp = 1), pp also over the
    powers of two (uneven splits: DeepSeek-V3's 61 layers), vpp with pp vpp <= layers, micro-batch
    1, ZeRO-1, selective or full recompute; with `overlap` also the all-to-all overlap and
    node-deduplicated dispatch.
    """
    out: list[StepLayout] = []
    moe = model.moe
    pps = sorted(set(_divisors(model.layers)) | ({2**i for i in range(8) if 2**i <= model.layers} if moe else set()))
    for tp in _divisors(min(gpu.gpus_per_node, gpus)):
        if model.heads % tp or model.kv_heads % tp or (model.layers > model.moe_layers and model.ffn % tp):
            continue
        for cp in SEARCH_CP:
            if cp > 1 and seq_len % (2 * cp):
                continue
            for pp in pps:
                if gpus % (tp * cp * pp):
                    continue
                dp = gpus // (tp * cp * pp)
                if global_batch % dp:
                    continue
                per_replica = global_batch // dp
                for mb in (1,) if moe else SEARCH_MICRO_BATCH:
                    if per_replica % mb or (tp > 1 and (seq_len * mb // cp) % tp):
                        continue
                    m = per_replica // mb
                    if pp > 1 and m < pp:
                        continue
                    for vpp in SEARCH_VPP if pp > 1 else (1,):
                        if (model.layers % (pp * vpp)) if not moe else pp * vpp > model.layers:
                            continue
                        for zero in ((1,) if moe else (1, 2, 3)) if dp * cp > 1 else (0,):
                            for recompute in RECOMPUTE[1:] if moe else RECOMPUTE:
                                for ep in _expert_splits(model, tp * cp * dp):
                                    out.append(StepLayout(tp=tp, pp=pp, dp=dp, cp=cp, zero=zero, recompute=recompute,
                                                          micro_batch=mb, micro_batches=m, vpp=vpp,
                                                          overlap_grad_reduce=overlap and dp * cp > 1,
                                                          overlap_param_gather=overlap and dp * cp > 1,
                                                          tp_overlap=overlap and tp > 1,
                                                          ep=ep, etp=1 if moe else None,
                                                          a2a_overlap=overlap and ep > 1, deepep=overlap and ep > 1))
    return out


def _expert_splits(model: ModelShape, ranks: int) -> list[int]:
    """ep values a search tries: 1 for a dense model; else divisors of the experts (from min(8, E)) dividing `ranks`."""
    if not model.moe:
        return [1]
    return [ep for ep in _divisors(model.experts) if ep >= min(8, model.experts) and ranks % ep == 0]


def search(model: ModelShape, gpu: str | GPU, gpus: int, global_batch: int, seq_len: int = 4096,
           precision: str = "bf16", overlap: bool = True) -> tuple[StepResult, int]:
    """The fastest candidate layout that fits the GPU's memory, and how many candidates fit."""
    spec = get_gpu(gpu) if isinstance(gpu, str) else gpu
    candidates = candidate_layouts(model, spec, gpus, global_batch, seq_len, overlap)
    if not candidates:
        raise ConfigError("global-batch", global_batch,
                          f"a batch that {gpus} GPUs can split (dp dividing it) for {model.name} at seq {seq_len}")
    best, fitting = None, 0
    for layout in candidates:
        r = step(model, spec, layout, precision, seq_len, gpus)
        if r.memory.total > spec.memory_bytes:
            continue
        fitting += 1
        if best is None or r.step_seconds < best.step_seconds:
            best = r
    if best is None:
        raise ConfigError("memory", f"{model.name} on {gpus} x {spec.name}",
                          f"a cluster where some layout fits ({len(candidates)} tried, none fits): more GPUs or a larger GPU")
    return best, fitting
