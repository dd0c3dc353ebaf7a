"""The size ladder: a model's shape from one knob (`model.size`), its parameter counts, training
FLOPs per token and tuned learning rate. Pure Python (no JAX): the config schema, the cost
models, sweep planning and `scaling plan` read sizes without loading the model.
"""

from __future__ import annotations

import math

from scaling.errors import ConfigError
from scaling.train import architectures
from scaling.train.architectures import ModelConfig  # the ladder's product; defined with the architectures


def config_for_size(size: int, *, vocab: int = 256, seq_len: int = 256, smooth_swiglu: bool = False,
                    n_layers: int | None = None, architecture: str = architectures.DEFAULT) -> ModelConfig:
    """The ladder: one knob -> width, depth, heads (OLMo-ladder style: a formula, not a table).

        d_model  = 32·size
        n_layers = 2 + size // 2
        n_heads  = max(2, d_model // 32)          (head_dim 32; 16 at size 1)
        d_ff     = 8/3·d_model rounded up to a multiple of 32 (SwiGLU keeps ~8·d² MLP params;
                   multiples of 32 tile MX blocks)

    Non-embedding N = n_layers·(4·d² + 3·d·d_ff + 2·d) + d, from ~25k (size 1) to ~4.8M (size 8);
    see the table in docs/training.md. Sizes beyond 8 follow the same formula.

    n_layers overrides the depth at the size's width (`model.n_layers`): the ladder's widths are
    multiples of 32 (MX blocks) and 6x apart in N between sizes 1 and 2, so an IsoFLOP design at
    CPU budgets fills that gap with deeper narrow models (e.g. d 32 x 4 layers, d 64 x 2).
    `architecture` (scaling.train.architectures) reads the same dimensions its own way.
    """
    if not isinstance(size, int) or size < 1:
        raise ConfigError("model.size", size, "an integer >= 1")
    if n_layers is not None and (not isinstance(n_layers, int) or n_layers < 1):
        raise ConfigError("model.n_layers", n_layers, "an integer >= 1 (or unset: the ladder's 2 + size // 2)")
    d = 32 * size
    d_ff = 32 * math.ceil(8 * d / 3 / 32)
    return ModelConfig(d_model=d, n_layers=2 + size // 2 if n_layers is None else n_layers, n_heads=max(2, d // 32), d_ff=d_ff,
                       vocab=vocab, seq_len=seq_len, smooth_swiglu=smooth_swiglu, architecture=architecture)


def depth_override(size: int, n_layers: int | None) -> int | None:
    """n_layers as an override of the size's depth: None where it is the ladder's own depth, so a
    config or design that writes that depth out names the same model (and run) as one that does not."""
    return None if n_layers == config_for_size(size).n_layers else n_layers


# The ladder's AdamW peak learning rate falls with width: lr = 1.6e-2 · (32 / d_model)^1.2.
# Fitted to the optimum of each size in experiments/lr.toml (sizes 1-5, FP32, 655k tokens, WSD;
# results/lr.csv): 1.5e-2, 7.5e-3, 4.7e-3, 2.7e-3, 2.3e-3 at d_model 32..160. With one LR for every
# width the largest sizes trained worse than smaller ones and the law saw no gain from N.
LR_AT_WIDTH_32 = 1.6e-2
LR_WIDTH_EXPONENT = 1.2


def ladder_lr(size: int) -> float:
    """The tuned peak learning rate of a ladder size (`train.lr = "auto"`)."""
    return LR_AT_WIDTH_32 * (32 / config_for_size(size).d_model) ** LR_WIDTH_EXPONENT


def projections(cfg: ModelConfig) -> list[tuple[int, int]]:
    """(d_in, d_out) of each dense projection in one layer of the config's architecture
    (`Architecture.projections`; the transformer's: fused QKV, attention out, fused up+gate, down):
    the one description of the model's GEMM weights that parameter counts, FLOPs per token and the
    FLOPs by part (scaling.train.compute) read."""
    return architectures.of(cfg).projections(cfg)


def param_counts(cfg: ModelConfig) -> dict[str, int]:
    """N (non-embedding: every parameter except the embedding table and the output head, what
    Kaplan et al. and Kumar et al. fit on) and the total.

    The transformer's, per layer: attention 4·d² (fused QKV 3d² + out d²), MLP 3·d·d_ff (up, gate,
    down), 2 RMSNorm gains d each; plus the final norm d (`Architecture.other_params`). Embedding
    V·d and untied head d·V are the rest.
    """
    d, L, V = cfg.d_model, cfg.n_layers, cfg.vocab
    non_embedding = L * sum(i * o for i, o in projections(cfg)) + architectures.of(cfg).other_params(cfg)
    return {"non_embedding": non_embedding, "total": non_embedding + 2 * V * d}


def flops_per_token(cfg: ModelConfig) -> float:
    """Training FLOPs per token (forward + backward = 3 × forward), Chinchilla's convention
    (Hoffmann et al. 2022, App. F):

        6·(N_matmul + d·V)  +  3·n_layers·(attention FLOPs per token and layer, forward)

    N_matmul = n_layers·(4·d² + 3·d·d_ff) are the transformer's dense-projection weights (each does
    2 FLOPs per token forward; `projections`), d·V the output head; the embedding lookup, norms,
    softmax and RoPE are not counted. Attention scores Q·Kᵀ and the weighted sum P·V cost 2·T·d each
    per token and layer forward, over the full T×T (no causal discount; `Architecture.attention`),
    hence 12·n_layers·T·d for the transformer.
    """
    d, L, V = cfg.d_model, cfg.n_layers, cfg.vocab
    n_matmul = L * sum(i * o for i, o in projections(cfg))
    return float(6 * (n_matmul + d * V) + 3 * L * sum(f for f, _ in architectures.of(cfg).attention(cfg)))
