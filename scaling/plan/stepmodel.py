"""One training step of a dense transformer, op by op: time and peak memory per GPU (`scaling plan step`).

Pure Python (no JAX, no NumPy): `scaling plan` must answer in well under a second.

The step is priced the way SimuMax (MooreThreads/SimuMax) and Calculon do it: every op of a
layer's forward and backward is listed with its shape, GEMMs are priced by FLOPs / (peak x
efficiency(shape)), flash attention by its FLOPs at its own efficiency, memory-bound ops (norms,
activations, residuals, rotary, quantise/transpose for low precision, the optimizer) by bytes /
HBM bandwidth, and collectives with the ring formulas on NVLink inside a node or the NIC across
nodes. The per-micro-batch time of the busiest pipeline stage goes through the 1F1B schedule
((m + (p - 1) / v) stage times); the data-parallel gradient reduction and the optimizer follow.

The four efficiency constants (EFFICIENCY) are calibrated on published measurements and checked
on others that were kept apart: scaling/plan/step_cases.json, scaling/plan/stepvalidate.py.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from scaling.errors import ConfigError
from scaling.plan.hardware import GPU, GPUS, get_gpu

GIB = 2**30

# --------------------------------------------------------------------------------------------
# Model shape
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Transformer:
    """A decoder-only transformer, dense or mixture-of-experts. Biases are not modelled (Llama has
    none; GPT-3's are <0.1%).

    Attention is grouped-query (kv_heads = heads: multi-head), or DeepSeek's multi-head latent
    attention (MLA) when kv_rank > 0: queries through a q_rank bottleneck (none when q_rank = 0),
    keys and values from a kv_rank latent plus a shared rope_dim rotary key; heads of head_size
    (no-position part) + rope_dim for Q and K, v_head for V.
    MoE (experts > 0): every layer after the first dense_layers replaces the FFN by `experts`
    routed experts of width expert_ffn (top_k per token), `shared_experts` always-on experts of
    the same width, and a router (hidden x experts); route_nodes > 0 limits each token's experts
    to that many nodes (DeepSeek-V3's node-limited routing).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int  # grouped-query attention: heads sharing K/V; = heads for multi-head attention
    ffn: int  # dense layers' FFN width
    vocab: int
    gated: bool = True  # SwiGLU (three FFN matrices) or GELU (two)
    head_size: int = 0  # 0: hidden / heads
    q_rank: int = 0  # MLA query bottleneck
    kv_rank: int = 0  # MLA key/value latent (> 0 turns MLA on)
    rope_dim: int = 0  # MLA rotary part of each Q/K head
    v_head: int = 0  # MLA value head size (0: head_size)
    experts: int = 0
    top_k: int = 0
    shared_experts: int = 0
    expert_ffn: int = 0
    dense_layers: int = 0  # the first layers keep a dense FFN
    route_nodes: int = 0  # node-limited routing: a token's experts lie on at most this many nodes (0: any)
    mtp: int = 0  # multi-token prediction modules (DeepSeek-V3: 1), on the last pipeline stage

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    @property
    def mla(self) -> bool:
        return self.kv_rank > 0

    @property
    def qk_head(self) -> int:
        return self.head_dim + (self.rope_dim if self.mla else 0)

    @property
    def v_head_dim(self) -> int:
        return (self.v_head or self.head_dim) if self.mla else self.head_dim

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.moe else 0

    @property
    def attention_params(self) -> int:
        """Attention matrices of one layer (no norms)."""
        h, a = self.hidden, self.heads
        if not self.mla:
            kv = self.kv_heads * self.head_dim
            return h * (a * self.head_dim + 2 * kv) + a * self.head_dim * h
        q = h * self.q_rank + self.q_rank * a * self.qk_head if self.q_rank else h * a * self.qk_head
        kv = h * (self.kv_rank + self.rope_dim) + self.kv_rank * a * (self.head_dim + self.v_head_dim)
        return q + kv + a * self.v_head_dim * h

    @property
    def norm_params(self) -> int:
        """Norm weights of one layer: two RMSNorms, plus MLA's norms of the q and kv latents."""
        return 2 * self.hidden + (self.q_rank + self.kv_rank if self.mla else 0)

    def mlp_params(self, moe: bool, activated: bool = False) -> int:
        """FFN matrices of one dense or MoE layer; `activated`: those one token multiplies."""
        per = (3 if self.gated else 2) * self.hidden
        if not moe:
            return per * self.ffn
        routed = self.top_k if activated else self.experts
        return per * self.expert_ffn * (routed + self.shared_experts) + self.hidden * self.experts  # + router

    def layer_params(self, moe: bool = False) -> int:
        return self.attention_params + self.mlp_params(moe) + self.norm_params

    @property
    def mtp_extra_params(self) -> int:
        """What each MTP module adds besides its transformer layer (DeepSeek-V3 Sec. 2.2): the
        projection of [norm(h); norm(embedding)] (2h x h) and those two RMSNorms. The module's
        layer is of the model's last kind (MoE for DeepSeek-V3); embedding and output layer are shared."""
        return 2 * self.hidden * self.hidden + 2 * self.hidden

    @property
    def mtp_params(self) -> int:
        """Parameters of the MTP modules (not in `params`: DeepSeek-V3's 671B leaves them out)."""
        return self.mtp * (self.layer_params(self.moe) + self.mtp_extra_params)

    @property
    def params(self) -> int:
        """All parameters, untied input embedding and output layer (Megatron's default for Llama)."""
        dense = self.layers - self.moe_layers
        return (dense * self.layer_params() + self.moe_layers * self.layer_params(True)
                + 2 * self.vocab * self.hidden + self.hidden)

    @property
    def matmul_params(self) -> int:
        """Parameters that multiply every token (the N of 6 N D; MoE: the activated ones): layers'
        GEMMs and the output layer, and each MTP module's layer, projection and (shared) output layer."""
        dense = self.layers - self.moe_layers
        mtp = self.mtp * (self.attention_params + self.mlp_params(self.moe, activated=True) + 2 * self.hidden**2
                          + self.vocab * self.hidden)
        return (self.layers * self.attention_params + dense * self.mlp_params(False)
                + self.moe_layers * self.mlp_params(True, activated=True) + self.vocab * self.hidden + mtp)

    @property
    def activated_params(self) -> int:
        """Parameters one token touches, embedding included, MTP modules not (how MoE reports quote
        'activated': DeepSeek-V3's 37B)."""
        main = replace(self, mtp=0)
        return main.matmul_params + self.vocab * self.hidden + self.layers * self.norm_params + self.hidden


# Published shapes:
# - Llama 3 8B / 70B / 405B: Dubey et al. 2024 ("The Llama 3 Herd of Models", Table 3), 8 KV
#   heads, SwiGLU, vocabulary 128,256 (the released config.json files).
# - GPT-3 175B: Brown et al. 2020 Table 2.1 (96 layers, d_model 12,288, 96 heads of 128,
#   d_ff = 4 d_model, GELU), vocabulary 50,257 (GPT-2 BPE).
# - Llama 2 7B / 13B / 70B: Touvron et al. 2023 ("Llama 2", Table 1 and the released config.json
#   files): 32/40/80 layers, hidden 4096/5120/8192, 32/40/64 heads (70B: 8 KV heads), SwiGLU
#   width 11008/13824/28672, vocabulary 32,000.
# Mixture-of-experts (the released config.json files on Hugging Face):
# - DeepSeek-V3 (deepseek-ai/DeepSeek-V3; DeepSeek-AI 2024, arXiv 2412.19437 Sec. 4.2): 61 layers,
#   hidden 7168, MLA with 128 heads (q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128,
#   qk_rope_head_dim 64, v_head_dim 128), first 3 layers dense (intermediate 18432), then 256
#   routed experts top-8 + 1 shared, expert width 2048; vocabulary 129,280. 671B total, 37B
#   activated (the paper's numbers; the multi-token-prediction module is not counted). Each token's
#   experts lie on at most 4 nodes (Sec. 2.1.2, node-limited routing M = 4). Trained with one MTP
#   module (Sec. 2.2, 4.2: D = 1; num_nextn_predict_layers = 1 in config.json).
# - DeepSeek-V2 (deepseek-ai/DeepSeek-V2 config.json; DeepSeek-AI 2024, arXiv 2405.04434 Sec. 3.1;
#   the same shape in SimuMax's configs/models/deepseekv2.json): 60 layers, hidden 5120, MLA with
#   128 heads (q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64,
#   v_head_dim 128), first layer dense (intermediate 12288), then 160 routed experts top-6 + 2
#   shared (n_shared_experts 2: SimuMax's shared width 3072 = 2 x 1536), expert width 1536;
#   vocabulary 102,400. 236B total, 21B activated. Its device-limited routing (topk_group 3 of
#   n_group 8) limits devices, not nodes: route_nodes is left 0. No MTP module.
# - Kimi K2 (moonshotai/Kimi-K2-Base; Kimi Team 2025, arXiv 2507.20534): the DeepSeek-V3 shape
#   with 64 heads, 384 routed experts, 1 dense layer, vocabulary 163,840: 1.04T total, 32B activated.
# - Mixtral 8x7B (mistralai/Mixtral-8x7B-v0.1): 32 layers, hidden 4096, 32 heads / 8 KV, 8 experts
#   top-2 of width 14336, vocabulary 32,000: 46.7B total, 12.9B activated.
# - Qwen3-30B-A3B / Qwen3-235B-A22B (Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B): 48 / 94 layers,
#   hidden 2048 / 4096, 32 / 64 heads of 128 with 4 KV heads, 128 experts top-8 of width
#   768 / 1536, no shared expert, vocabulary 151,936 (QK-norm weights not modelled).
# Not published, for the talk's table only:
# - GPT-4 as reported by SemiAnalysis ("GPT-4 Architecture, Infrastructure, Training Dataset,
#   Costs, Vision, MoE", 10 July 2023; OpenAI has confirmed none of it): ~1.8T parameters in
#   120 layers, 16 experts of ~111B (MLP) with 2 routed per token, ~55B of shared attention.
#   As a shape: MHA and a GELU MLP of 4 h give 8 h^2 per expert-layer = 111B / 120 and 4 h^2 of
#   attention = 55B / 120 for h ~ 10,750: hidden 10,752 (96 heads of 112), expert width 43,008,
#   vocabulary 100,256 (cl100k). 1.8T total, 0.28T activated: 6 x 0.28T x 13T tokens = 2.2e25,
#   the talk's 2.1e25 FLOPs.
PRESETS: dict[str, Transformer] = {
    "llama3-8b": Transformer("llama3-8b", 32, 4096, 32, 8, 14336, 128256),
    "llama3-70b": Transformer("llama3-70b", 80, 8192, 64, 8, 28672, 128256),
    "llama3-405b": Transformer("llama3-405b", 126, 16384, 128, 8, 53248, 128256),
    "gpt3-175b": Transformer("gpt3-175b", 96, 12288, 96, 96, 49152, 50257, gated=False),
    "llama2-7b": Transformer("llama2-7b", 32, 4096, 32, 32, 11008, 32000),
    "llama2-13b": Transformer("llama2-13b", 40, 5120, 40, 40, 13824, 32000),
    "llama2-70b": Transformer("llama2-70b", 80, 8192, 64, 8, 28672, 32000),
    "deepseek-v3": Transformer("deepseek-v3", 61, 7168, 128, 128, 18432, 129280, head_size=128, q_rank=1536,
                               kv_rank=512, rope_dim=64, v_head=128, experts=256, top_k=8, shared_experts=1,
                               expert_ffn=2048, dense_layers=3, route_nodes=4, mtp=1),
    "deepseek-v2": Transformer("deepseek-v2", 60, 5120, 128, 128, 12288, 102400, head_size=128, q_rank=1536,
                               kv_rank=512, rope_dim=64, v_head=128, experts=160, top_k=6, shared_experts=2,
                               expert_ffn=1536, dense_layers=1),
    "kimi-k2": Transformer("kimi-k2", 61, 7168, 64, 64, 18432, 163840, head_size=128, q_rank=1536, kv_rank=512,
                           rope_dim=64, v_head=128, experts=384, top_k=8, shared_experts=1, expert_ffn=2048,
                           dense_layers=1),
    "mixtral-8x7b": Transformer("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, experts=8, top_k=2, expert_ffn=14336),
    "qwen3-30b-a3b": Transformer("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 151936, head_size=128, experts=128, top_k=8,
                                 expert_ffn=768),
    "qwen3-235b-a22b": Transformer("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, 151936, head_size=128, experts=128,
                                   top_k=8, expert_ffn=1536),
    "gpt4-reported": Transformer("gpt4-reported", 120, 10752, 96, 96, 43008, 100256, gated=False, experts=16, top_k=2,
                                 expert_ffn=43008),
    # Nemotron-4 15B (Parmar et al. 2024): GQA 48/8 heads, squared-ReLU FFN (two matrices), 256K vocabulary
    "nemotron4-15b": Transformer("nemotron4-15b", 32, 6144, 48, 8, 24576, 256000, gated=False),
}
SHAPE_KEYS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "gated")
# optional integer keys of a JSON shape (MLA and MoE); 0 or absent: off
EXTRA_SHAPE_KEYS = ("head_size", "q_rank", "kv_rank", "rope_dim", "v_head", "experts", "top_k", "shared_experts",
                    "expert_ffn", "dense_layers", "route_nodes", "mtp")


def _count(text: str) -> float | None:
    """A positive finite parameter count written as a number, else None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def load_model(name: str, tp: int = 1, **overrides: Any) -> Transformer:
    """A preset name, a JSON file with SHAPE_KEYS (kv_heads defaults to heads, gated to true) and
    optionally EXTRA_SHAPE_KEYS, or a parameter count ('7e9': `gpt_for_params`, heads that `tp` divides)."""
    if name.lower() in PRESETS:
        model = PRESETS[name.lower()]
    elif (count := _count(name)) is not None:
        model = gpt_for_params(count, tp)
    elif name.endswith(".json") and Path(name).is_file():
        try:
            fields = json.loads(Path(name).read_text())
            model = Transformer(
                name=Path(name).stem,
                **{k: int(fields[k]) for k in ("layers", "hidden", "heads", "ffn", "vocab")},
                kv_heads=int(fields.get("kv_heads", fields["heads"])),
                gated=bool(fields.get("gated", True)),
                **{k: int(fields[k]) for k in EXTRA_SHAPE_KEYS if k in fields},
            )
        except (KeyError, ValueError, TypeError, json.JSONDecodeError) as e:
            raise ConfigError("model", name, f"a JSON object with integer {', '.join(SHAPE_KEYS[:-1])} ({e})") from None
    else:
        raise ConfigError("model", name, f"one of {', '.join(PRESETS)}, a JSON file of {', '.join(SHAPE_KEYS)}, "
                          "or a parameter count (e.g. 7e9: a GPT shape, h = 128 L)")
    model = replace(model, **{k: v for k, v in overrides.items() if v is not None})
    for key in SHAPE_KEYS[:-1]:
        if getattr(model, key) < 1:
            raise ConfigError(f"model.{key}", getattr(model, key), "a positive integer")
    for key in EXTRA_SHAPE_KEYS:
        if getattr(model, key) < 0:
            raise ConfigError(f"model.{key}", getattr(model, key), "a non-negative integer")
    if (not model.head_size and model.hidden % model.heads) or model.heads % model.kv_heads:
        raise ConfigError("model.heads", (model.hidden, model.heads, model.kv_heads),
                          "heads dividing hidden (or a head_size), and kv_heads dividing heads")
    if model.moe and not (1 <= model.top_k <= model.experts and model.expert_ffn >= 1):
        raise ConfigError("model.top_k", model.top_k, f"1..experts ({model.experts}), with expert_ffn >= 1")
    if model.dense_layers > model.layers:
        raise ConfigError("model.dense_layers", model.dense_layers, f"at most the layers ({model.layers})")
    return model


# --------------------------------------------------------------------------------------------
# Layout and precision
# --------------------------------------------------------------------------------------------

RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class StepLayout:
    """Parallel layout and batch of one optimizer step. GPUs = tp * cp * pp * dp.

    Megatron-LM defaults: the distributed optimizer (ZeRO-1) when dp > 1, sequence parallel when
    tp > 1, no recompute, 1F1B without interleaving (vpp = 1), gradient reduction and parameter
    all-gather not overlapped (Megatron's --overlap-grad-reduce / --overlap-param-gather are opt-in),
    TP communication not overlapped (--tp-comm-overlap is opt-in), pipeline send/recv overlapped
    with compute under interleaving (--overlap-p2p-communication, Megatron's default, applies to
    vpp > 1 only). NeMo's performance recipes turn all of them on (see scaling/plan/step_cases.json).
    MoE: experts split over ep ranks, each expert's matrices over etp ranks (Megatron's
    --expert-tensor-parallel-size, which defaults to tp); tp * cp * dp must be a multiple of
    ep * etp (the experts fold into the data-parallel ranks of a stage). seo: the shared experts'
    GEMMs overlap the token all-to-all (--moe-shared-expert-overlap); a2ao: the all-to-all
    overlaps another micro-batch's compute (DeepSeek's DualPipe, Megatron's
    --overlap-moe-expert-parallel-comm); deepep: tokens cross the network once per remote node
    holding one of their experts, then fan out over NVLink (DeepEP, Megatron's flex dispatcher;
    DeepSeek-V3's own kernels), instead of once per expert (NCCL all-to-all). All off by default,
    as in Megatron-LM. dualpipe: DeepSeek-V3's bidirectional schedule (Sec. 3.2.1) instead of 1F1B:
    GPU i holds pipeline stages i and pp - 1 - i and feeds half the micro-batches from each end.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None  # None: tp (Megatron's default)
    zero: int | None = None  # None: 1 if dp * cp > 1 else 0
    sp: bool | None = None  # None: tp > 1
    recompute: str = "none"
    micro_batch: int = 1
    micro_batches: int = 1
    vpp: int = 1
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    tp_overlap: bool = False
    overlap_p2p: bool | None = None  # None: vpp > 1
    shared_expert_overlap: bool = False
    a2a_overlap: bool = False
    deepep: bool = False
    dualpipe: bool = False

    def __post_init__(self):
        for key in ("tp", "pp", "dp", "cp", "ep", "etp", "micro_batch", "micro_batches", "vpp"):
            value = getattr(self, key)
            if not (isinstance(value, int) and value >= 1) and not (key == "etp" and value is None):
                raise ConfigError(f"layout.{key}", value, "an integer >= 1")
        if self.zero not in (None, 0, 1, 2, 3):
            raise ConfigError("layout.zero", self.zero, (0, 1, 2, 3))
        if self.recompute not in RECOMPUTE:
            raise ConfigError("recompute", self.recompute, RECOMPUTE)
        if self.sp and self.tp == 1:
            raise ConfigError("sequence-parallel", self.sp, "only with tp > 1")
        if self.tp_overlap and not (self.tp > 1 and self.sequence_parallel):
            raise ConfigError("layout.tpo", 1, "only with tp > 1 and sequence parallel (TE's userbuffer overlap)")
        if self.dualpipe and (self.pp < 2 or self.pp % 2 or self.vpp > 1):
            raise ConfigError("layout.dualpipe", 1, "only with an even pp >= 2 and vpp = 1 (DualPipe is its own schedule)")
        if self.vpp > 1 and self.pp == 1:
            raise ConfigError("layout.vpp", self.vpp, "1 unless pp > 1 (virtual stages interleave a pipeline)")

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def zero_stage(self) -> int:
        # the distributed optimizer shards over the dp x cp group, so cp alone turns it on too
        return (1 if self.dp * self.cp > 1 else 0) if self.zero is None else self.zero

    @property
    def sequence_parallel(self) -> bool:
        return self.tp > 1 if self.sp is None else self.sp

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def expert_dp(self) -> int:
        """Ranks holding the same experts of a stage (their ZeRO / gradient-reduction group)."""
        return max(1, self.tp * self.cp * self.dp // (self.ep * self.expert_tp))

    @property
    def p2p_overlapped(self) -> bool:
        return (self.vpp > 1 or self.dualpipe) if self.overlap_p2p is None else self.overlap_p2p


LAYOUT_KEYS = {"tp": int, "pp": int, "dp": int, "cp": int, "ep": int, "etp": int, "zero": int, "vpp": int, "sp": int,
               "ogr": int, "opg": int, "tpo": int, "p2p": int, "seo": int, "a2ao": int,
               "deepep": int, "dualpipe": int}
# boolean layout keys -> StepLayout fields
FLAG_KEYS = {"sp": "sp", "ogr": "overlap_grad_reduce", "opg": "overlap_param_gather", "tpo": "tp_overlap",
             "p2p": "overlap_p2p", "seo": "shared_expert_overlap", "a2ao": "a2a_overlap", "deepep": "deepep",
             "dualpipe": "dualpipe"}


def parse_step_layout(text: str, **extra: Any) -> StepLayout:
    """'tp=4,pp=1,dp=2,zero=1' (keys: tp pp dp cp ep etp zero vpp, flags sp ogr opg tpo p2p seo a2ao deepep = 0|1) -> StepLayout (plus `extra` fields)."""
    allowed = "comma-separated key=integer with keys " + ", ".join(LAYOUT_KEYS) + ", e.g. tp=4,pp=1,dp=2,zero=1"
    fields: dict[str, Any] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or key not in LAYOUT_KEYS or key in fields:
            raise ConfigError("layout", text, allowed)
        try:
            fields[key] = int(value)
        except ValueError:
            raise ConfigError("layout", text, allowed) from None
    for key, name in FLAG_KEYS.items():
        if key in fields:
            if fields[key] not in (0, 1):
                raise ConfigError(f"layout.{key}", fields[key], (0, 1))
            fields[name] = bool(fields.pop(key))
    for key, value in extra.items():
        if value is not None:
            if key in fields and fields[key] != value:
                raise ConfigError(key, value, f"the same as layout {key}={fields[key]}, or only one of them")
            fields[key] = value
    return StepLayout(**fields)


@dataclass(frozen=True)
class Recipe:
    """How a precision recipe runs the linear layers' GEMMs.

    rate: the tensor-core peak it runs at; bytes: bytes per quantised element including its
    scales; native: a block-scaled format the GPU must run natively (Blackwell MX/NVFP4);
    blocks: scales run in blocks along the reduction axis, so the backward GEMMs, which reduce
    along the other axis, need a second copy quantised along it (TE's row- and column-wise data).
    Attention, norms and communication stay in BF16 in every recipe (Transformer Engine's default).
    """

    rate: str
    bytes: float
    native: str | None = None
    blocks: bool = False

    def copies(self, gpu: GPU) -> int:
        """Quantised copies of each GEMM input: two where the backward needs its own (blocks, or
        per-tensor FP8 on GPUs whose FP8 GEMMs take only TN layouts: a transposed copy), else one."""
        return 2 if self.blocks or (self.rate == "fp8" and not gpu.fp8_any_layout) else 1


# Scale overhead per element: MX formats carry one E8M0 byte per 32 elements (OCP MX spec v1.0);
# NVFP4 one E4M3 byte per 16 (NVIDIA); DeepSeek-V3's blockwise FP8 one FP32 per 128 (1x128 tiles).
RECIPES: dict[str, Recipe] = {
    "bf16": Recipe("bf16", 2.0),
    "fp8": Recipe("fp8", 1.0),  # per-tensor scaling (Transformer Engine delayed/current scaling)
    "fp8-block": Recipe("fp8", 1.0 + 4 / 128, blocks=True),
    "mxfp8": Recipe("fp8", 1.0 + 1 / 32, "mxfp8", blocks=True),
    "mxfp6": Recipe("fp8", 0.75 + 1 / 32, "mxfp6", blocks=True),  # FP6 runs at the FP8 rate on Blackwell
    "mxfp4": Recipe("fp4", 0.5 + 1 / 32, "mxfp4", blocks=True),
    "nvfp4": Recipe("fp4", 0.5 + 1 / 16, "nvfp4", blocks=True),
    # FP32 GEMMs on TF32 tensor cores (what cuBLAS and XLA do by default): priced as BF16 inputs
    # cast to FP32 per GEMM; the activations, norms and collectives stay priced in BF16
    "tf32": Recipe("tf32", 4.0),
}


def get_recipe(precision: str, gpu: GPU) -> Recipe:
    recipe = RECIPES.get(precision.lower())
    if recipe is None:
        raise ConfigError("precision", precision, RECIPES)
    if recipe.rate not in gpu.peak_tflops or (recipe.native and recipe.native not in gpu.block_scaled):
        runs = [p for p, r in RECIPES.items() if r.rate in gpu.peak_tflops and (not r.native or r.native in gpu.block_scaled)]
        raise ConfigError("precision", precision, f"one of {', '.join(runs)} on {gpu.name}")
    return recipe


# --------------------------------------------------------------------------------------------
# Efficiency constants (calibrated: `python -m scaling.plan.stepvalidate --calibrate`)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Efficiency:
    """Fractions of the spec sheet a real kernel reaches.

    gemm: best GEMM efficiency; a GEMM of F FLOPs reaches gemm * F / (F + gemm_half_flops)
      (small GEMMs are launch/tail bound: the knee is where half the best is lost).
    attention: flash attention's fraction of the BF16 peak on its hardware FLOPs (forward and
      backward together); with attention_half_flops, its best fraction: a call of F forward FLOPs
      (one micro-batch's causal attention on one GPU) reaches attention * F / (F + attention_half_flops)
      (few heads or short sequences leave SMs idle); mla_attention is the best fraction of MLA's
      kernels (d_qk != d_v; 0: attention). The three come from kernel measurements where a generation
      has them (stepvalidate.kernel_attention), else attention is fitted and the others stay 0.
    bandwidth: fraction of HBM, NVLink and NIC bandwidth that memory-bound kernels and NCCL reach.
    moe_layer_seconds: time per MoE layer per micro-batch (forward + backward) that the listed
      ops do not account for: dropless routing synchronises host and device in every layer
      (the dispatcher needs the token counts per expert on the host), after which the GPU waits
      on the host to launch the layer's many small router, permute and per-expert kernels; such
      layers cannot be captured in CUDA graphs (Megatron-LM's MoE README). Fitted on MoE runs
      only, after the other four (0: none).
    gemm_rates: (rate, gemm) pairs for the tensor-core rates whose GEMMs reach another share of
      their peak than the rate the four constants were fitted on (FP8 kernels reach a smaller share
      of their 2x peak than BF16's); fitted on that rate's runs with the rest held.
    """

    gemm: float
    gemm_half_flops: float
    attention: float
    bandwidth: float
    moe_layer_seconds: float = 0.0
    gemm_rates: tuple[tuple[str, float], ...] = ()
    attention_half_flops: float = 0.0
    mla_attention: float = 0.0

    def attention_at(self, flops: float, mla: bool = False) -> float:
        """Flash attention's fraction of the BF16 peak for a call of `flops` forward FLOPs."""
        best = self.mla_attention if mla and self.mla_attention else self.attention
        h = self.attention_half_flops
        return best * flops / (flops + h) if h else best

    def gemm_at(self, rate: str) -> float:
        """Best GEMM efficiency at a tensor-core rate ('bf16', 'fp8', ...): `gemm` unless `gemm_rates`
        has its own, fitted on runs at that rate (a format's kernels reach another share of its peak)."""
        return dict(self.gemm_rates).get(rate, self.gemm)


# Least squares of log step time over the calibration runs of scaling/plan/step_cases.json, one fit per
# GPU generation (`python -m scaling.plan.stepvalidate --calibrate`):
# - b200: 8 of SimuMax's real Megatron-LM runs on 8x B200 (BF16, micro-batches = 8, no TP/DP overlap).
#   Low next to B200 GEMM microbenchmarks (~65-70% of peak on large shapes) because they also absorb
#   what the model does not list (kernel launch gaps, CPU-side overhead, TE's casts and copies).
#   Flash attention's three constants are not fitted on those steps (attention is ~10% of each, so any
#   fraction from 0.26 to 0.6 fits them alike; the fit had settled at 0.263, which priced 128K-token CP
#   runs 17-29% slow) but on SimuMax's TE kernel timings from the same node (19 shapes, 4K-128K tokens,
#   4-128 heads; each within 25% of the curve): 0.462 of the BF16 peak at best, half of it lost at
#   3.2e10 FLOPs per call (few heads or short sequences leave SMs idle), 0.366 for MLA's kernels.
# - h100: 5 of NeMo's published DGX-H100 runs (FP8 per-tensor; Llama 2 7B/13B, Llama 3 8B with CP,
#   GPT-3 175B on 128 GPUs, Llama 3 70B on 64 GPUs), with the overlaps those recipes turn on. The
#   GEMM fraction is of the FP8 peak; BF16 runs on H100 came out 11-32% slow with it, so BF16 GEMMs
#   get their own (gemm_rates), fitted with the four held on 4 BF16 runs of NVIDIA's DGX Cloud
#   Benchmarking recipes (NeMo 24.12: Llama 3.1 8B/70B/405B, GPT-3 175B), whose tables also ran
#   every model in FP8: BF16/FP8 step ratios 1.31-1.60 measured, 1.35-1.52 priced.
#   moe_layer_seconds, fitted afterwards with those held: 5 of Megatron-Bridge's DGX-H100 MoE
#   runs from its newest containers (Qwen3-235B-A22B on 256 GPUs, Qwen3-30B-A3B on 16; FP8, dropless).
#   Without it the model is 17-36% fast on them; fitted on each model alone it comes to 2.3 ms
#   (Qwen3-235B) and 3.4 ms (Qwen3-30B) per MoE layer per micro-batch, although their expert GEMMs
#   and all-to-alls differ 1.2-2.5x: mostly a fixed host-side cost, not a GEMM or all-to-all efficiency. Older Bridge containers, DeepSeek-V3 (H100, H800) are held out.
# - b200 moe_layer_seconds: the same rule, Megatron-Bridge's DGX-B200 MXFP8 Qwen3 runs of 26.04 and
#   later (3). One constant leaves Qwen3-235B 16% fast and Qwen3-30B (CUDA-graphed router and
#   attention) 15% slow; SimuMax's BF16 DeepSeek-V2/V3 runs, held out, come within 10%.
# B200's constants priced the H100 runs 20-37% (FP8) and 47-71% (Llama 3 BF16) too slow: the
# constants are per generation and software stack, not portable.
# One set per GPU generation: `python -m scaling.plan.stepvalidate --calibrate` fits each generation
# on its own calibration cases. Hopper (H100/H200): NeMo's published Megatron-Core runs on DGX H100
# (FP8, TP/DP/PP communication overlapped). A100 has no calibration runs yet and borrows Hopper's.
EFFICIENCY: dict[str, Efficiency] = {
    "b200": Efficiency(gemm=0.478, gemm_half_flops=9.25e10, attention=0.462, bandwidth=0.545,
                       moe_layer_seconds=0.97e-3, attention_half_flops=3.18e10, mla_attention=0.366),
    "h100": Efficiency(gemm=0.493, gemm_half_flops=2.13e10, attention=0.558, bandwidth=0.806,
                       moe_layer_seconds=3.13e-3, gemm_rates=(("bf16", 0.595),)),
}
GENERATION = {"a100": "h100", "h100": "h100", "h800": "h100", "h200": "h100", "b200": "b200"}


def efficiency_for(gpu: str | GPU) -> Efficiency:
    """The calibrated constants of this GPU's generation (`gpu` a GPUS key or a GPUS value)."""
    key = gpu if isinstance(gpu, str) else next((k for k, v in GPUS.items() if v == gpu), "h100")
    return EFFICIENCY[GENERATION.get(key.lower(), "h100")]

# Allocator slack, cuBLAS/NCCL workspaces and CUDA context outside max_memory_allocated's view
# are not counted; the transient of one layer's backward (gradient buffers) is.
WORKSPACE_BYTES = 0.5 * GIB


# --------------------------------------------------------------------------------------------
# Op inventory
# --------------------------------------------------------------------------------------------


@dataclass
class Op:
    """One op of one micro-batch on one GPU of a stage (`count` times per micro-batch)."""

    name: str
    kind: str  # gemm, attention, memory, comm
    seconds: float
    flops: float = 0.0  # model FLOPs (6ND accounting: no recompute, causal attention halved)
    count: int = 1


@dataclass
class Ctx:
    model: Transformer
    gpu: GPU
    layout: StepLayout
    recipe: Recipe
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


# Tokens routed to an expert, busiest GPU over the average: 1.0 (balanced). Megatron-Bridge's MoE
# benchmarks force-balance the routing ("we force-balance the token distribution among experts",
# docs/performance-summary.md) and DeepSeek-V3's auxiliary-loss-free balancing keeps experts
# near balance; raise it to price an unbalanced router (expert GEMMs, their activations).
MOE_IMBALANCE = 1.0


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
    """Forward and backward ops of one transformer layer (dense, or MoE) for one micro-batch on one GPU."""
    m, lay = c.model, c.layout
    tp, t, h = lay.tp, c.tokens, m.hidden
    g = 2 if m.gated else 1
    sp = lay.sequence_parallel or tp == 1
    te = t / tp if sp else t  # tokens a GPU holds between the tensor-parallel blocks
    ops: list[Op] = []
    quantised: list[tuple[float, float]] = []  # (forward, backward) elements of each low-precision GEMM

    # attention. Megatron rank order tp, cp, dp, pp (tp innermost): a tp group spans tp GPUs
    if m.mla:
        # MLA (Megatron-Core): the down-projections run on the sequence-parallel shard and their
        # latents are all-gathered (not the hidden state); the up-projections are column-parallel
        q_in = m.q_rank or h
        if m.q_rank:
            quantised.append(_gemm(c, ops, "q-down", te, h, m.q_rank))
        quantised.append(_gemm(c, ops, "q-up", t, q_in, m.heads * m.qk_head / tp))
        quantised.append(_gemm(c, ops, "kv-down", te, h, m.kv_rank + m.rope_dim))
        quantised.append(_gemm(c, ops, "kv-up", t, m.kv_rank, m.heads * (m.head_dim + m.v_head_dim) / tp))
        attention_gather = (m.q_rank or h) + m.kv_rank + m.rope_dim
        rotary = 4 * t * (m.heads * m.rope_dim / tp + m.rope_dim)
        latent_norms = 4 * t * (m.q_rank + m.kv_rank)
    else:
        q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
        quantised.append(_gemm(c, ops, "qkv", t, h, (q + 2 * kv) / tp))
        attention_gather, rotary, latent_norms = h, 4 * t * (q + kv) / tp, 0.0
    quantised.append(_gemm(c, ops, "attn-out", t, m.heads * m.v_head_dim / tp, h))
    # flash attention: QK^T and PV, causal halves both; backward is 5 matmuls to the forward's 2
    # (S = QK^T is recomputed), so 2.5x the forward's hardware FLOPs for 2x its model FLOPs.
    # each of the t local queries sees s/2 keys on average (cp balances causal chunks)
    attn = 2.0 * t * (c.seq_len / 2) * m.heads * (m.qk_head + m.v_head_dim) / tp
    attn_peak = c.gpu.peak_tflops["bf16"] * 1e12 * c.eff.attention_at(attn, m.mla)
    ops.append(Op("flash-attention fwd", "attention", attn / attn_peak, attn))
    ops.append(Op("flash-attention bwd", "attention", 2.5 * attn / attn_peak, 2 * attn))

    # feed-forward: a dense MLP, or the router, shared experts and routed experts
    gathered = [attention_gather]
    elementwise = {
        "rmsnorm": 2 * 4 * te * h + latent_norms,  # two norms: read x, write y
        "residual-add": 2 * 6 * te * h,  # two adds: read 2, write 1
        "rotary": rotary,  # q and k, read + write
    }
    act = "swiglu" if m.gated else "gelu"
    act_bytes = 6 if m.gated else 4
    a2a_fwd = a2a_bwd = shared_fwd = shared_bwd = 0.0
    if not moe:
        quantised.append(_gemm(c, ops, "fc1", t, h, g * m.ffn / tp))
        quantised.append(_gemm(c, ops, "fc2", t, m.ffn / tp, h))
        gathered.append(h)
        elementwise[act] = act_bytes * t * m.ffn / tp
    else:
        etp, local = lay.expert_tp, m.experts // lay.ep
        _gemm(c, ops, "router", te, h, m.experts, rate="bf16")  # FP32 logits in DeepSeek-V3: tiny either way
        elementwise["router"] = 3 * 4 * te * m.experts  # FP32 logits written, softmax/top-k read and write
        if m.shared_experts:
            shared = m.shared_experts * m.expert_ffn
            before = len(ops)
            quantised.append(_gemm(c, ops, "shared-fc1", t, h, g * shared / tp))
            quantised.append(_gemm(c, ops, "shared-fc2", t, shared / tp, h))
            shared_fwd = sum(o.seconds for o in ops[before:] if o.name.endswith(" fwd"))
            shared_bwd = sum(o.seconds for o in ops[before:] if o.name.endswith(" bwd"))
            gathered.append(h)
            elementwise[act] = act_bytes * t * shared / tp
        # each GPU routes its te tokens to top_k experts; the expert-tensor-parallel group gathers them
        sent = te * m.top_k
        slots = sent * etp * MOE_IMBALANCE
        quantised.append(_gemm(c, ops, "expert-fc1", slots, h, g * m.expert_ffn / etp, local, 1 / MOE_IMBALANCE))
        quantised.append(_gemm(c, ops, "expert-fc2", slots, m.expert_ffn / etp, h, local, 1 / MOE_IMBALANCE))
        elementwise[f"expert-{act}"] = act_bytes * slots * m.expert_ffn / etp
        elementwise["moe permute"] = 2 * 2 * 2.0 * sent * h  # permute and unpermute: read + write BF16
        # dispatch and combine forward, their gradients backward
        a2a = all_to_all(c, te, lay.ep, etp)
        a2a_fwd = a2a_bwd = 2 * a2a
        if etp > 1:
            gather = c.collective("all-gather", 2.0 * slots * h, etp, etp)
            ops.append(Op("etp all-gather fwd", "comm", gather))
            ops.append(Op("etp reduce-scatter fwd", "comm", c.collective("reduce-scatter", 2.0 * slots * h, etp, etp)))
            ops.append(Op("etp all-gather bwd", "comm", gather))
            ops.append(Op("etp reduce-scatter bwd", "comm", c.collective("reduce-scatter", 2.0 * slots * h, etp, etp)))
    for name, nbytes in elementwise.items():
        ops.append(Op(f"{name} fwd", "memory", c.hbm_seconds(nbytes)))
        ops.append(Op(f"{name} bwd", "memory", c.hbm_seconds(2 * nbytes)))
    if c.recipe.rate != "bf16":
        # quantise each GEMM input: read BF16, write the low-precision copy and, where the backward
        # needs one (Recipe.copies), a second one; the backward quantises each output gradient the
        # same way. Weights: once per step, below.
        per_elem = 2 + c.recipe.copies(c.gpu) * c.recipe.bytes
        ops.append(Op("quantise fwd", "memory", c.hbm_seconds(per_elem * sum(f for f, _ in quantised))))
        ops.append(Op("quantise bwd", "memory", c.hbm_seconds(per_elem * sum(b for _, b in quantised))))
    _tp_ops(c, ops, gathered)
    if a2a_fwd:
        if lay.a2a_overlap:  # another micro-batch's compute runs under the all-to-all (DualPipe)
            compute_fwd = sum(o.seconds for o in ops if o.kind != "comm" and o.name.endswith(" fwd"))
            compute_bwd = sum(o.seconds for o in ops if o.kind != "comm" and o.name.endswith(" bwd"))
            hidden = min(a2a_fwd, compute_bwd) + min(a2a_bwd, compute_fwd)
            a2a_fwd, a2a_bwd = max(0.0, a2a_fwd - compute_bwd), max(0.0, a2a_bwd - compute_fwd)
            if lay.deepep:  # DeepEP's kernels hold DEEPEP_SMS SMs while the compute runs beside them
                ops.append(Op("ep all-to-all SM share", "comm", hidden * DEEPEP_SMS / (c.gpu.sms - DEEPEP_SMS)))
        elif lay.shared_expert_overlap:  # the shared experts' GEMMs run under the all-to-all
            a2a_fwd, a2a_bwd = max(0.0, a2a_fwd - shared_fwd), max(0.0, a2a_bwd - shared_bwd)
        ops.append(Op("ep all-to-all fwd", "comm", a2a_fwd))
        ops.append(Op("ep all-to-all bwd", "comm", a2a_bwd))
    if moe and c.eff.moe_layer_seconds:
        # the GPU idles on the host (Efficiency.moe_layer_seconds): no other micro-batch's
        # all-to-all hides under it, and recompute does not repeat it (no suffix)
        ops.append(Op("moe overhead", "host", c.eff.moe_layer_seconds))
    if lay.cp > 1:
        # ring attention: every rank gathers the other ranks' K, V (forward) and reduce-scatters
        # dK, dV (backward); the exchange overlaps the attention blocks it feeds
        kv = m.heads * (m.qk_head + m.v_head_dim) if m.mla else 2 * m.kv_heads * m.head_dim
        kv_buf = 2.0 * t * lay.cp * kv / tp
        span = tp * lay.cp
        fwd = max(0.0, c.collective("all-gather", kv_buf, lay.cp, span) - attn / attn_peak)
        bwd = max(0.0, 2 * c.collective("all-gather", kv_buf, lay.cp, span) - 2.5 * attn / attn_peak)
        ops.append(Op("cp kv exchange fwd", "comm", fwd))
        ops.append(Op("cp kv exchange bwd", "comm", bwd))
    if lay.recompute != "none":
        # full: the whole forward again (its collectives too); selective (Megatron's
        # --recompute-granularity selective): the attention core, and MLA's up-projections
        # (DeepSeek-V3 Sec. 3.3.1; the mla_up_proj module of Megatron-Bridge's DeepSeek-V3 recipes)
        selective = ("gemm q-up fwd", "gemm kv-up fwd")
        again = [o for o in ops if o.name.endswith(" fwd")
                 and (lay.recompute == "full" or o.kind == "attention" or o.name in selective)]
        ops.extend(Op(o.name.replace(" fwd", " recompute"), o.kind, o.seconds, 0.0, o.count) for o in again)
    return ops


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


def padded_vocab(model: Transformer, tp: int) -> int:
    """Megatron pads the vocabulary to a multiple of 128 * tp (--make-vocab-size-divisible-by 128)."""
    unit = 128 * tp
    return -(-model.vocab // unit) * unit


# --------------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------------


def activation_bytes_per_layer(model: Transformer, layout: StepLayout, seq_len: int, moe: bool = False) -> float:
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
    slots = te * m.top_k * layout.expert_tp * MOE_IMBALANCE
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


def stage_layers(model: Transformer, layout: StepLayout, stage: int) -> tuple[int, int]:
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


def stage_params_split(model: Transformer, layout: StepLayout, stage: int) -> tuple[float, float]:
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


def stage_params(model: Transformer, layout: StepLayout, stage: int) -> float:
    """Parameters on one GPU of `stage`."""
    return sum(stage_params_split(model, layout, stage))


def stage_memory(model: Transformer, layout: StepLayout, seq_len: int, stage: int) -> StageMemory:
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
    dense, moe = max(n for n, _ in layers), max(n for _, n in layers)  # for the largest local weight below
    in_flight = min(layout.pp - stage, layout.micro_batches)
    if layout.vpp > 1 and stage == 0:
        in_flight = min(layout.pp * (1 + (layout.pp - 1) / (layout.pp * layout.vpp)), layout.micro_batches)
    if layout.dualpipe:
        in_flight = min(layout.pp + 1, layout.micro_batches)
    per_micro_batch = sum(d * activation_bytes_per_layer(model, layout, seq_len)
                          + e * activation_bytes_per_layer(model, layout, seq_len, moe=True) for d, e in layers) / len(layers)
    t = seq_len * layout.micro_batch / layout.cp
    logits = 6.0 * t * padded_vocab(model, layout.tp) / layout.tp if layout.pp - 1 in stages else 0.0
    # the backward of one layer materialises its gradients next to the saved activations
    no_recompute = replace(layout, recompute="none")
    transient = max((activation_bytes_per_layer(model, no_recompute, seq_len, kind) for kind, n in ((False, dense), (True, moe)) if n),
                    default=0.0)
    if layout.recompute == "full":
        transient *= 2  # the recomputed layer's activations and their gradients
    # Transformer Engine fuses wgrad into the FP32 main_grad and hands autograd a dummy BF16 wgrad
    # of the weight's shape: the largest local weight is allocated during its backward. A MoE
    # layer's grouped GEMM asks for one per expert, but TE caches dummy wgrads by (rows, cols,
    # dtype) (transformer_engine/pytorch/module/base.py get_dummy_wgrad; SimuMax models it so,
    # simumax/core/base_struct.py _record_te_dummy_wgrad_shape), so all local experts share one
    # expert's FC1 shape, not all local experts' FC1 at once
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
    transient += 2.0 * max(local)
    return StageMemory(
        weights=sharded(2, 3),
        gradients=sharded(4, 2),
        optimizer=sharded(12, 1),
        activations=in_flight * per_micro_batch,
        logits=logits,
        workspace=transient + WORKSPACE_BYTES,
    )


# --------------------------------------------------------------------------------------------
# The step
# --------------------------------------------------------------------------------------------


@dataclass
class StepResult:
    model: Transformer
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


def validate(model: Transformer, layout: StepLayout, seq_len: int, gpus: int | None = None) -> None:
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


def step(model: Transformer, gpu: str | GPU, layout: StepLayout, precision: str = "bf16", seq_len: int = 4096,
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
    pp, m_count, v = layout.pp, layout.micro_batches, layout.vpp
    body = {False: layer_ops(c)}
    if model.moe:
        body[True] = layer_ops(c, moe=True)

    # per-micro-batch time of every stage; the slowest sets the 1F1B pace. Stages differ in their
    # dense / MoE layer counts and at the ends (embedding on the first, output layer on the last):
    # each distinct kind is priced once.
    kinds: dict[tuple, int] = {}
    kind_of = {s: kinds.setdefault((stage_layers(model, layout, s), s == 0, s == pp - 1), s) for s in range(pp)}
    stage_ops = {}
    for (counts, first, last), s in kinds.items():
        ops = [replace(o, count=o.count * n) for moe, n in zip((False, True), counts) if n for o in body[moe]]
        stage_ops[s] = ops + edge_ops(c, first, last)

    def gpu_ops(s: int) -> list[tuple[Op, float]]:
        """(op, weight) of one micro-batch's work on a GPU of stage s: its stage's ops, or under
        DualPipe half of stage s's and half of stage pp - 1 - s's (half the micro-batches enter
        from each end)."""
        if layout.dualpipe:
            return [(o, 0.5) for mirror in (s, pp - 1 - s) for o in stage_ops[kind_of[mirror]]]
        return [(o, 1.0) for o in stage_ops[kind_of[s]]]

    gpu_time = {s: sum(o.seconds * o.count * w for o, w in gpu_ops(s)) for s in range(pp)}
    slow = max(gpu_time, key=lambda s: gpu_time[s])
    by_op: dict[str, float] = {}
    slow_ops = gpu_ops(slow)
    for o, w in slow_ops:
        by_op[_group(o.name)] = by_op.get(_group(o.name), 0.0) + o.seconds * o.count * w * m_count
    by_collective = {k: v for k, v in by_op.items() if k.startswith(("tp ", "cp ", "ep ", "etp "))}
    t_micro = gpu_time[slow]
    if pp > 1 and layout.dualpipe:
        # DeepSeek-V3 Table 2: (pp/2 - 1)(F&B + B - 3W), F&B a forward and a backward overlapped
        # (t_micro), B the input-gradient and W the weight-gradient part of the backward (half of
        # each backward GEMM is its weight gradient)
        fwd = sum(o.seconds * o.count * w for o, w in slow_ops if o.name.endswith(" fwd"))
        wgrad = sum(o.seconds * o.count * w for o, w in slow_ops if o.kind == "gemm" and o.name.endswith(" bwd")) / 2
        by_op["pipeline bubble"] = (pp / 2 - 1) * (t_micro + (t_micro - fwd - wgrad) - 3 * wgrad)
    elif pp > 1:
        # 1F1B: m micro-batches plus the (p - 1) / v bubble (Narayanan et al. 2021, interleaved: / v)
        by_op["pipeline bubble"] = t_micro * (pp - 1) / v
    total = t_micro * m_count + by_op.get("pipeline bubble", 0.0)

    tp, cp, dp = layout.tp, layout.cp, layout.dp
    if pp > 1:
        # activations [s/cp, b, h] (split by tp under sequence parallel) sent forward and their
        # gradients backward at every stage boundary (v boundaries per GPU when interleaved); on the
        # critical path unless overlapped (interleaved default), when only the fill and drain are
        act = 2.0 * c.tokens * model.hidden / (tp if layout.sequence_parallel else 1)
        bandwidth, latency = c.group_link(layout.gpus)  # pp is the outermost dimension
        sends = 2 * (pp - 1) if layout.p2p_overlapped else 2 * (m_count * v + pp - 1)
        p2p = sends * (act / bandwidth + latency)
        by_collective["pp send/recv"] = p2p
        total += p2p

    # data parallel: FP32 gradients reduce-scattered (ZeRO >= 1, Megatron's distributed optimizer)
    # or all-reduced (ZeRO 0) once per step; ZeRO >= 1 then all-gathers the updated BF16 weights.
    # Gradients reduce over dp x cp, the routed experts' over their expert-data-parallel group;
    # both groups span tp*cp*dp GPUs. With overlap_grad_reduce only the last bucket is exposed
    # (Megatron's bucket: max(40M, 1M * dp) parameters).
    split = [stage_params_split(model, layout, s) for s in stage_ops]
    params = max(sum(p) for p in split)
    groups = [(max(p[0] for p in split), dp * cp), (max(p[1] for p in split), layout.expert_dp)]
    span = tp * cp * dp
    zero = layout.zero_stage
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
            dp_comm["zero-3 all-gather"] += max(0.0, gather - 0.5 * total)
    for k, seconds in dp_comm.items():
        if seconds:
            by_collective[k] = seconds
            total += seconds
    # optimizer: read grad, master, m, v (4 each), write master, m, v and the BF16 weight, plus the
    # gradient-norm pass: 34 bytes per local parameter (sharded by ZeRO from stage 1)
    local = sum(p / (size if zero >= 1 else 1) for p, size in groups)
    by_op["optimizer"] = c.hbm_seconds(34.0 * local)
    total += by_op["optimizer"]
    if recipe.rate != "bf16":  # weights cast (and transposed) once per step
        by_op["quantise weights"] = c.hbm_seconds(params * (2 + recipe.copies(c.gpu) * recipe.bytes))
        total += by_op["quantise weights"]
    by_op.update({k: v for k, v in by_collective.items() if k not in by_op})

    # the first stage holds the most in-flight micro-batches, the last the logits: one of them peaks
    memories = {s: stage_memory(model, layout, seq_len, s) for s in stage_ops}
    busiest = max(memories, key=lambda s: memories[s].total)
    tokens = seq_len * layout.micro_batch * m_count * dp
    model_flops = (6.0 * model.matmul_params + attention_flops_per_token(model, seq_len)) * tokens
    return StepResult(model, spec, layout, precision.lower(), seq_len, total, model_flops, memories[busiest],
                      busiest, by_op, by_collective)


def attention_flops_per_token(model: Transformer, seq_len: int) -> float:
    """Model FLOPs of causal attention per token, forward and backward: 3 * L * s * heads * (d_qk + d_v)
    (QK^T and PV, halved by the causal mask; 6 L s h for multi-head attention), L counting the MTP modules' layers."""
    return 3.0 * (model.layers + model.mtp) * seq_len * model.heads * (model.qk_head + model.v_head_dim)


# --------------------------------------------------------------------------------------------
# Layout search
# --------------------------------------------------------------------------------------------

SEARCH_MICRO_BATCH = (1, 2, 4, 8)
SEARCH_CP = (1, 2, 4, 8, 16)
SEARCH_VPP = (1, 2, 4, 8)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_layouts(model: Transformer, gpu: GPU, gpus: int, global_batch: int, seq_len: int,
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


def _expert_splits(model: Transformer, ranks: int) -> list[int]:
    """ep values a search tries: 1 for a dense model; else divisors of the experts (from min(8, E)) dividing `ranks`."""
    if not model.moe:
        return [1]
    return [ep for ep in _divisors(model.experts) if ep >= min(8, model.experts) and ranks % ep == 0]


def search(model: Transformer, gpu: str | GPU, gpus: int, global_batch: int, seq_len: int = 4096,
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


# --------------------------------------------------------------------------------------------
# Days, cost and goodput of a whole run from the step
# --------------------------------------------------------------------------------------------


def run_days(result: StepResult, tokens: float, **failure_options: Any):
    """scaling.plan.cluster.RunPlan for training on `tokens` tokens at this step's speed: the failure-free
    days are tokens / (tokens/s of the step); the failure model (checkpoint-and-restart at Daly's
    interval, or dropping a failed replica: tp*cp*pp GPUs, for MoE lcm(tp*cp, ep*etp)*pp) is scaling.plan.cluster's."""
    from scaling.plan import cluster as plan  # pure Python; imported here to keep the modules' import graph acyclic

    return plan.plan_run(result.model_flops / result.tokens * tokens, result.layout.gpus, result.gpu_key,
                         step=result, **failure_options)


# --------------------------------------------------------------------------------------------
# A precision recipe against BF16: `scaling plan --fit` prices the fitted law's P-bit recipe
# --------------------------------------------------------------------------------------------

# hardware format (scaling.plan.hardware.precision_for_bits) -> the recipe that runs it
RECIPE_FOR_FORMAT = {"bf16": "bf16", "fp8": "fp8", "fp4": "nvfp4", "tf32": "tf32"}
CATEGORIES = ("GEMMs", "attention", "quantise", "memory-bound", "communication", "MoE overhead", "pipeline bubble", "optimizer")


def category(op: str) -> str:
    if op.startswith("gemm"):
        return "GEMMs"
    if op.startswith("flash-attention"):
        return "attention"
    if op.startswith("quantise"):
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


def gpt_for_params(params: float, tp: int = 1, vocab: int = 32_000) -> Transformer:
    """A GPT shape with ~`params` parameters in its layers (N = 12 L h^2: MHA, GELU MLP of 4h):
    h = 128 L, head dim 128, hidden rounded to a multiple of 128.

    h/L = 128 is the aspect ratio of Llama 2 7B (4096/32); Kaplan et al. 2020 find loss flat for
    h/L in ~50-200. The vocabulary is Llama 2's 32,000 (the fitted laws count non-embedding
    parameters). The head count moves to the nearest one that tp divides and that divides hidden:
    the step's FLOPs, bytes and memory depend on heads x head_dim = hidden only.
    """
    if not (isinstance(params, (int, float)) and math.isfinite(params) and params > 0):
        raise ConfigError("params", params, "a positive parameter count")
    layers = max(1, round((params / (12 * 128**2)) ** (1 / 3)))
    hidden = max(128, 128 * round(math.sqrt(params / (12 * layers)) / 128))
    heads = hidden // 128
    options = [a for a in range(tp, hidden + 1, tp) if hidden % a == 0]
    if options:
        heads = min(options, key=lambda a: (abs(a - heads), a))
    return Transformer(f"gpt-L{layers}-h{hidden}", layers, hidden, heads, heads, 4 * hidden, vocab, gated=False)


def recipe_speedup(model: Transformer, gpu: str, layout: StepLayout, hardware_format: str,
                   seq_len: int = 4096) -> tuple[StepResult, StepResult]:
    """(BF16 step, the format's recipe step) for the same model, layout and GPU."""
    recipe = RECIPE_FOR_FORMAT.get(hardware_format)
    if recipe is None:
        raise ConfigError("precision", hardware_format, f"a format the step model prices: {', '.join(RECIPE_FOR_FORMAT)}")
    return step(model, gpu, layout, "bf16", seq_len), step(model, gpu, layout, recipe, seq_len)


def format_speedup(base: StepResult, low: StepResult) -> str:
    b, q = breakdown(base), breakdown(low)
    lay = low.layout
    overlaps = ",".join(k for k, on in (("tpo", lay.tp_overlap), ("ogr", lay.overlap_grad_reduce),
                                        ("opg", lay.overlap_param_gather)) if on)
    lines = [f"step model ({lay.gpus} x {low.gpu.name}, {base.model.name}, seq {base.seq_len}, "
             f"tp={lay.tp} pp={lay.pp} dp={lay.dp}, {lay.micro_batches} micro-batches, recompute {lay.recompute}"
             + (f", overlaps {overlaps}" if overlaps else "") + "): "
             f"{low.precision} step {low.step_seconds * 1e3:,.1f} ms vs bf16 {base.step_seconds * 1e3:,.1f} ms: "
             f"{base.step_seconds / low.step_seconds:.2f}x faster",
             f"  {'ms per step':<16} {'bf16':>10} {low.precision:>10}"]
    lines += [f"  {k:<16} {b[k] * 1e3:>10.1f} {q[k] * 1e3:>10.1f}" for k in CATEGORIES if b[k] or q[k]]
    return "\n".join(lines)


def breakdown_figure(results: list[StepResult], labels: list[str], path: str | Path) -> Path:
    """A stacked bar per step (ms per step by CATEGORIES). matplotlib is imported only here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(results) + 2.5), 4.5))
    bottoms = [0.0] * len(results)
    for cat in CATEGORIES:
        heights = [breakdown(r)[cat] * 1e3 for r in results]
        if any(heights):
            ax.bar(labels, heights, bottom=bottoms, label=cat)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_ylabel("ms per optimizer step")
    r = results[0]
    ax.set_title(f"{r.model.name} on {r.layout.gpus} x {r.gpu.name}, seq {r.seq_len}", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------
# CLI: `scaling plan step`
# --------------------------------------------------------------------------------------------


def _positive_int(key: str, text: str) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        value = 0
    if value < 1 or str(value) != str(text).strip():
        raise ConfigError(key, text, "a positive integer")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Time and peak memory of one training step, op by op, for a model shape, a GPU, a parallel "
        "layout and a precision recipe. Example: `scaling plan step --model llama3-70b --layers 12 "
        "--gpu b200 --layout tp=4,pp=1,dp=2,zero=1 --seq-len 4096 --micro-batch 1 --micro-batches 8 --json`."
    )
    parser.add_argument("--model", default="llama3-8b", help=f"{', '.join(PRESETS)}, a JSON file of {', '.join(SHAPE_KEYS)}, "
                        "or a parameter count (e.g. 7e9: a GPT shape with h = 128 L, 32K vocabulary)")
    parser.add_argument("--layers", help="override the model's layer count (e.g. a cut-down model for a benchmark)")
    parser.add_argument("--gpu", default="h100", help=f"one of {', '.join(GPUS)} (default h100)")
    parser.add_argument("--gpus", help="cluster size: the layout's tp*cp*pp*dp must equal it")
    parser.add_argument("--layout", default="tp=1", help="tp=,pp=,dp=,cp=,ep=,etp=,zero=,vpp=, flags 0|1: sp (sequence parallel), "
                        "ogr (overlap grad reduce), opg (overlap param gather), tpo (TP comm overlap), p2p (overlap pipeline "
                        "send/recv), seo (shared experts overlap the all-to-all), a2ao (all-to-all overlapped by another "
                        "micro-batch), deepep (node-deduplicated token dispatch)")
    parser.add_argument("--seq-len", default="4096", help="sequence length (default 4096)")
    parser.add_argument("--micro-batch", default="1", help="micro-batch size (default 1)")
    parser.add_argument("--micro-batches", default="1", help="micro-batches per step per data-parallel rank (default 1)")
    parser.add_argument("--precision", default="bf16", help=f"GEMM recipe: {', '.join(RECIPES)} (default bf16)")
    parser.add_argument("--recompute", default="none", help=f"activation recompute: {', '.join(RECOMPUTE)} (default none)")
    sp = parser.add_mutually_exclusive_group()
    sp.add_argument("--sequence-parallel", dest="sp", action="store_true", default=None, help="(default when tp > 1)")
    sp.add_argument("--no-sequence-parallel", dest="sp", action="store_false")
    parser.add_argument("--cp", help="context parallel size (or cp= in --layout)")
    parser.add_argument("--ep", help="expert parallel size (MoE models; or ep= in --layout)")
    parser.add_argument("--allow-oom", action="store_true", help="report a layout even if it does not fit in memory")
    parser.add_argument("--search", action="store_true",
                        help="find the fastest layout that fits (needs --gpus and --global-batch; ignores --layout)")
    parser.add_argument("--global-batch", help="sequences per optimizer step (with --search)")
    parser.add_argument("--no-overlap", action="store_true",
                        help="with --search: leave Megatron's opt-in overlaps (tpo, ogr, opg) off")
    parser.add_argument("--tokens", help="training tokens: add days, goodput and failures of the whole run")
    parser.add_argument("--figure", help="write a stacked bar of the step's breakdown (BF16 next to --precision) to this PNG")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def format_result(r: StepResult) -> str:
    d = r.to_json()
    lines = [
        f"{d['model']} ({d['params'] / 1e9:.3g}B params" + (f", {d['activated_params'] / 1e9:.3g}B activated" if r.model.moe else "")
        + f", {r.model.layers} layers) on {d['layout']['gpus']} x {d['gpu']}, "
        f"{d['precision']}, seq {d['seq_len']}, layout {d['layout']}",
        f"step {d['step_ms']:,.1f} ms   {d['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU   "
        f"{d['model_tflops_per_gpu']:,.0f} model TFLOP/s/GPU   MFU {d['mfu']:.3f}",
        f"memory on the busiest GPU (stage {d['busiest_stage']}): {d['memory_gib']:.2f} GiB of {d['gpu_memory_gib']:.1f}",
    ]
    lines += [f"  {k:<14} {v:>9.2f} GiB" for k, v in d["memory_breakdown_gib"].items() if k != "total"]
    lines.append("time per step on the critical path (ms):")
    lines += [f"  {k:<26} {v:>10.2f} ms" for k, v in d["by_op_ms"].items() if v > 0]
    return "\n".join(lines)


def _positive_float(key: str, text: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise ConfigError(key, text, "a positive number")
    return value


def main(args: argparse.Namespace) -> int:
    layers = _positive_int("layers", args.layers) if args.layers else None
    tokens = _positive_float("tokens", args.tokens) if args.tokens else None
    if args.search:
        if not args.gpus or not args.global_batch:
            raise ConfigError("search", "--gpus/--global-batch missing", "both --gpus K and --global-batch B with --search")
        model = load_model(args.model, tp=8, layers=layers)  # a parameter count gets heads that tp <= 8 divides
        result, fitting = search(model, args.gpu, _positive_int("gpus", args.gpus), _positive_int("global-batch", args.global_batch),
                                 _positive_int("seq-len", args.seq_len), args.precision, overlap=not args.no_overlap)
        return _print(args, result, tokens, {"fitting_layouts": fitting})
    if args.global_batch:
        raise ConfigError("global-batch", args.global_batch, "only with --search (otherwise give --micro-batches)")
    layout = parse_step_layout(
        args.layout,
        sp=args.sp,
        recompute=args.recompute,
        micro_batch=_positive_int("micro-batch", args.micro_batch),
        micro_batches=_positive_int("micro-batches", args.micro_batches),
        cp=_positive_int("cp", args.cp) if args.cp else None,
        ep=_positive_int("ep", args.ep) if args.ep else None,
    )
    model = load_model(args.model, tp=layout.tp, layers=layers)
    gpus = _positive_int("gpus", args.gpus) if args.gpus else None
    result = step(model, args.gpu, layout, args.precision, _positive_int("seq-len", args.seq_len), gpus)
    if not args.allow_oom and result.memory.total > result.gpu.memory_bytes:
        raise ConfigError("memory", f"{result.memory.total / GIB:.1f} GiB on stage {result.busiest_stage}",
                          f"at most {result.gpu.memory_bytes / GIB:.1f} GiB on {result.gpu.name}: raise tp, pp or zero, "
                          "use --recompute full, or pass --allow-oom")
    return _print(args, result, tokens)


def _print(args: argparse.Namespace, result: StepResult, tokens: float | None, extra: dict | None = None) -> int:
    d = result.to_json() | (extra or {})
    text = format_result(result)
    if args.figure:
        results, labels = [result], [result.precision]
        if result.precision != "bf16":
            results.insert(0, step(result.model, result.gpu, result.layout, "bf16", result.seq_len))
            labels.insert(0, "bf16")
        d["figure"] = str(breakdown_figure(results, labels, args.figure))
        text += f"\nfigure: {d['figure']}"
    if extra:
        text = f"fastest of {extra['fitting_layouts']:,} fitting layouts:\n" + text
    if tokens:
        from scaling.plan import cluster as plan

        run = run_days(result, tokens)
        failures = plan.expected_interruptions(run.checkpoint_days, run.gpus)
        d["run"] = {"tokens": tokens, "days": run.days, "checkpoint_interval_minutes": run.checkpoint_interval_hours * 60,
                    "checkpoint_goodput": run.checkpoint_goodput, "checkpoint_days": run.checkpoint_days,
                    "expected_interruptions": failures, "drop_replica_goodput": run.drop_replica_goodput,
                    "drop_replica_days": run.drop_replica_days, "gpu_hours": run.days * 24 * run.gpus}
        text += (f"\n{tokens:.3g} tokens: {run.days:,.2f} days without failures ({run.days * 24 * run.gpus:,.0f} GPU-hours); "
                 f"checkpoint-and-restart every {run.checkpoint_interval_hours * 60:.0f} min: goodput {run.checkpoint_goodput:.3f}, "
                 f"{run.checkpoint_days:,.2f} days, ~{failures:,.0f} interruptions; dropping a failed replica: goodput "
                 f"{run.drop_replica_goodput:.3f}, {run.drop_replica_days:,.2f} days")
    print(json.dumps(d) if args.json else text)
    return 0
