"""Model shapes for the step model: a decoder-only transformer's dimensions (dense or mixture-of-experts),
the published models by name (MODELS), a shape from a JSON file or a parameter count (load_model).

Pure Python: what the step model counts (parameters, GEMM widths, vocabulary padding) follows from these.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from scaling.errors import ConfigError


@dataclass(frozen=True)
class ModelShape:
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
MODELS: dict[str, ModelShape] = {
    "llama3-8b": ModelShape("llama3-8b", 32, 4096, 32, 8, 14336, 128256),
    "llama3-70b": ModelShape("llama3-70b", 80, 8192, 64, 8, 28672, 128256),
    "llama3-405b": ModelShape("llama3-405b", 126, 16384, 128, 8, 53248, 128256),
    "gpt3-175b": ModelShape("gpt3-175b", 96, 12288, 96, 96, 49152, 50257, gated=False),
    "llama2-7b": ModelShape("llama2-7b", 32, 4096, 32, 32, 11008, 32000),
    "llama2-13b": ModelShape("llama2-13b", 40, 5120, 40, 40, 13824, 32000),
    "llama2-70b": ModelShape("llama2-70b", 80, 8192, 64, 8, 28672, 32000),
    "deepseek-v3": ModelShape("deepseek-v3", 61, 7168, 128, 128, 18432, 129280, head_size=128, q_rank=1536,
                              kv_rank=512, rope_dim=64, v_head=128, experts=256, top_k=8, shared_experts=1,
                              expert_ffn=2048, dense_layers=3, route_nodes=4, mtp=1),
    "deepseek-v2": ModelShape("deepseek-v2", 60, 5120, 128, 128, 12288, 102400, head_size=128, q_rank=1536,
                              kv_rank=512, rope_dim=64, v_head=128, experts=160, top_k=6, shared_experts=2,
                              expert_ffn=1536, dense_layers=1),
    "kimi-k2": ModelShape("kimi-k2", 61, 7168, 64, 64, 18432, 163840, head_size=128, q_rank=1536, kv_rank=512,
                          rope_dim=64, v_head=128, experts=384, top_k=8, shared_experts=1, expert_ffn=2048,
                          dense_layers=1),
    "mixtral-8x7b": ModelShape("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, experts=8, top_k=2, expert_ffn=14336),
    "qwen3-30b-a3b": ModelShape("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 151936, head_size=128, experts=128, top_k=8,
                                expert_ffn=768),
    "qwen3-235b-a22b": ModelShape("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, 151936, head_size=128, experts=128,
                                  top_k=8, expert_ffn=1536),
    "gpt4-reported": ModelShape("gpt4-reported", 120, 10752, 96, 96, 43008, 100256, gated=False, experts=16, top_k=2,
                                expert_ffn=43008),
    # Nemotron-4 15B (Parmar et al. 2024): GQA 48/8 heads, squared-ReLU FFN (two matrices), 256K vocabulary
    "nemotron4-15b": ModelShape("nemotron4-15b", 32, 6144, 48, 8, 24576, 256000, gated=False),
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


def load_model(name: str, tp: int = 1, **overrides: int | None) -> ModelShape:
    """A name in MODELS, a JSON file with SHAPE_KEYS (kv_heads defaults to heads, gated to true) and
    optionally EXTRA_SHAPE_KEYS, or a parameter count ('7e9': `gpt_for_params`, heads that `tp` divides)."""
    if name.lower() in MODELS:
        model = MODELS[name.lower()]
    elif (count := _count(name)) is not None:
        model = gpt_for_params(count, tp)
    elif name.endswith(".json") and Path(name).is_file():
        try:
            fields = json.loads(Path(name).read_text())
            model = ModelShape(
                name=Path(name).stem,
                **{k: int(fields[k]) for k in ("layers", "hidden", "heads", "ffn", "vocab")},
                kv_heads=int(fields.get("kv_heads", fields["heads"])),
                gated=bool(fields.get("gated", True)),
                **{k: int(fields[k]) for k in EXTRA_SHAPE_KEYS if k in fields},
            )
        except (KeyError, ValueError, TypeError, json.JSONDecodeError) as e:
            raise ConfigError("model", name, f"a JSON object with integer {', '.join(SHAPE_KEYS[:-1])} ({e})") from None
    else:
        raise ConfigError("model", name, f"one of {', '.join(MODELS)}, a JSON file of {', '.join(SHAPE_KEYS)}, "
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


def gpt_for_params(params: float, tp: int = 1, vocab: int = 32_000) -> ModelShape:
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
    return ModelShape(f"gpt-L{layers}-h{hidden}", layers, hidden, heads, heads, 4 * hidden, vocab, gated=False)


def padded_vocab(model: ModelShape, tp: int) -> int:
    """Megatron pads the vocabulary to a multiple of 128 * tp (--make-vocab-size-divisible-by 128)."""
    unit = 128 * tp
    return -(-model.vocab // unit) * unit


# Tokens routed to an expert, busiest GPU over the average: 1.0 (balanced). Megatron-Bridge's MoE
# benchmarks force-balance the routing ("we force-balance the token distribution among experts",
# docs/performance-summary.md) and DeepSeek-V3's auxiliary-loss-free balancing keeps experts
# near balance; raise it to price an unbalanced router (expert GEMMs, their activations).
MOE_IMBALANCE = 1.0
