"""Decoder-only transformer (Flax NNX) whose every dense projection runs the recipe's quantised matmul.

Pre-norm blocks: x += Attn(RMSNorm(x)); x += MLP(RMSNorm(x)); final RMSNorm; untied output head.
The dense projections are `scaling.numerics.layers.QDense`, the layer offered for a model of one's
own, with its variables (FormatVector, AmaxHistory, GradSink, QuantTelemetry) and telemetry; the
model keeps the formats once (not per layer) and passes them, with the structure, PRNG key and
telemetry flags of the call, through a per-call context (`Context.dense`).
The n_layers blocks are one Block whose variables are stacked on a leading layer axis, run as one
`lax.scan` (XLA compiles one block, not n_layers copies); `layer(blocks, i)` gives layer i alone.
A recipe that keeps its first / last k blocks in high precision runs three scans over slices of the
same stack: the kept head and tail under the `high_precision` recipe, the middle under the recipe.
Attention: causal multi-head with RoPE, never materialising B×H×L×L scores where nothing in it is
rounded: inputs that are bf16/fp16 run `jax.nn.dot_product_attention` (cuDNN flash attention asked
for by name on a GPU, XLA's form where it cannot run: `attention_kernels` says which), FP32 ones the blocked flash-style `_causal_attention`; only quantised (scaled or sub-16-bit)
inputs or softmax outputs rounded through bf16 take the dense form. Every float32 dot runs at the
recipe's `dot_precision`. MLP: SwiGLU, optionally Smooth-SwiGLU (Fishman et al. 2024).
Tensor names carry their shapes (nanodo style): B batch, L length, D d_model, H heads, K head_dim,
F d_ff, V vocab.

Train-step API (stable; `scaling.train.loop` calls exactly these, all under the caller's nnx.jit):

    loss_fn(model, tokens_BxL, key=None) -> (loss, aux)
    grad_step(model, tokens_BxL, key, measure=True) -> (loss, grads: nnx.State of nnx.Param, telemetry)
    eval_loss(model, tokens_BxL) -> loss            (no quantisation-state update)

`tokens_BxL` holds L = seq_len + 1 tokens per row: the model reads tokens[:, :-1] and predicts
tokens[:, 1:], so the loss is next-token cross-entropy (fp32) over B·seq_len positions.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from scaling.errors import ConfigError
from scaling.numerics import formats, gemm, layers, precision
# the quantised dense layer and its variables: numerics' own (also reachable here, as model.GradSink etc.)
from scaling.numerics.layers import AmaxHistory, FormatVector, GradSink, QDense, QuantTelemetry
from scaling.train.architectures import ModelConfig
from scaling.numerics.precision import Recipe, RecipeStructure

# ---------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------


def _sensitive(x: jax.Array, structure: RecipeStructure) -> jax.Array:
    """Precision-sensitive op output: fp32, or rounded to bf16 if the recipe says so. Rounded with
    reduce_precision, not a bf16 round trip: XLA:GPU's simplifier removes a convert pair (the same
    bits where it runs)."""
    if structure.fp32_sensitive_ops:
        return x
    return jax.lax.reduce_precision(x, exponent_bits=8, mantissa_bits=7)


class RMSNorm(nnx.Module):
    def __init__(self, d: int, eps: float):
        self.scale = nnx.Param(jnp.ones((d,), jnp.float32))
        self.eps = eps

    def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
        return _rms_norm(x_BxLxD, self.scale[...], self.eps)


@functools.partial(jax.checkpoint, static_argnums=2)
def _rms_norm(x_BxLxD: jax.Array, scale_D: jax.Array, eps: float) -> jax.Array:
    """x / rms(x) · scale. Checkpointed, like `_swiglu`: the backward pass recomputes these few
    elementwise ops from x instead of keeping their intermediates (every layer's, stacked by the
    layer scan) in memory."""
    ms = jnp.mean(jnp.square(x_BxLxD), axis=-1, keepdims=True)
    return x_BxLxD * jax.lax.rsqrt(ms + eps) * scale_D


def _dense(d_in: int, d_out: int, structure: RecipeStructure, std: float, rngs: nnx.Rngs) -> QDense:
    """A projection: N(0, std²) weights, no bias, no formats of its own (the Transformer's)."""
    return QDense(d_in, d_out, structure, kernel_init=nnx.initializers.normal(std), rngs=rngs)


class Context:
    """Per-call context threaded through the layers: formats, structure, PRNG, telemetry sink and
    whether to measure telemetry (a bool, may be traced)."""

    def __init__(self, structure: RecipeStructure, fmt: dict, key: jax.Array | None, update_state: bool,
                 measure: jax.Array | bool = True):
        self.structure, self.fmt, self.update_state, self.measure = structure, fmt, update_state, measure
        self._key, self._count = key, 0
        self.telemetry: dict[str, list[jax.Array]] = {}

    def next_key(self) -> jax.Array | None:
        if self._key is None:
            return None
        self._count += 1
        return jax.random.fold_in(self._key, self._count)

    def record(self, telem: dict) -> None:
        for role, v in telem.items():
            self.telemetry.setdefault(role, []).append(v)

    def dense(self, layer: QDense, x: jax.Array, smooth_K: jax.Array | None = None) -> jax.Array:
        """layer(x) under this context (structure, formats, the next PRNG key, the measure and
        update flags); the layer's forward telemetry of the call is recorded."""
        y = layer(x, key=self.next_key(), measure=self.measure, update_state=self.update_state, smooth_K=smooth_K,
                  structure=self.structure, formats=self.fmt)
        self.record(layer.forward_telemetry())
        return y


def _abs_max(x: jax.Array) -> jax.Array:
    """max |x|, a statistic: no gradient flows through it, so autodiff keeps no residuals for it
    (a |x| sign and an argmax mask per layer otherwise)."""
    return jnp.max(jnp.abs(jax.lax.stop_gradient(x)))


def _rope(x_BxLxHxK: jax.Array, base: float) -> jax.Array:
    """Rotary position embedding (rotate-half form) over positions 0..L-1."""
    L, K = x_BxLxHxK.shape[1], x_BxLxHxK.shape[3]
    inv_freq = base ** (-jnp.arange(0, K // 2, dtype=jnp.float32) * 2.0 / K)
    angle_LxK2 = jnp.arange(L, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    cos, sin = jnp.cos(angle_LxK2)[None, :, None, :], jnp.sin(angle_LxK2)[None, :, None, :]
    x1, x2 = x_BxLxHxK[..., : K // 2], x_BxLxHxK[..., K // 2 :]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


ATTENTION_CHUNK = 64  # query rows per block of the causal attention on a CPU (`_causal_attention`)
# Query blocks per row elsewhere (a GPU): 64-row blocks were tuned on a CPU, and at L = 1024 they make
# 16 blocks x 7 small dots per layer, each far from filling a GPU. Four blocks (ATTENTION_CHUNK rows
# at least) keep the dots per layer bounded whatever L, and still skip 3/8 of the masked scores.
ATTENTION_BLOCKS_GPU = 4


def _causal_attention(q_BxLxHxK: jax.Array, k_BxLxHxK: jax.Array, v_BxLxHxK: jax.Array,
                      precision: jax.lax.Precision = jax.lax.Precision.HIGHEST) -> jax.Array:
    """softmax(mask(Q·Kᵀ/√K))·V in fp32, the same function as the dense form in `Attention`,
    computed flash-attention style, with memory O(B·H·L·K) instead of the dense form's B×H×L×L:

    - on a CPU one batch row at a time (`lax.map`): its H×L×L scores (2 MB at size 8) stay in
      cache instead of a B×H×L×L tensor streaming through memory; elsewhere all rows at once;
    - in blocks of query rows that see only the keys up to their last row: the all-masked blocks
      above the diagonal are skipped (~40% fewer FLOPs at L = 256). A CPU's blocks are
      ATTENTION_CHUNK rows; elsewhere each row is ATTENTION_BLOCKS_GPU blocks (of ATTENTION_CHUNK
      rows at least), so a layer runs a bounded number of larger dots whatever L;
    - a custom VJP keeps only O and the softmax row max and sum, and the backward pass recomputes
      the probabilities from them: no layer's probabilities are stored, and P·V is not redone.

    Masked scores contribute exact zeros, so only summation orders differ from the dense form.
    `precision`: of its float32 dots (the recipe's `RecipeStructure.f32_dots`)."""
    t = lambda x: x.transpose(0, 2, 1, 3)  # B×L×H×K <-> B×H×L×K
    B, L = q_BxLxHxK.shape[:2]
    if jax.default_backend() == "cpu":
        rows, chunk = 1, ATTENTION_CHUNK
    else:
        rows, chunk = B, max(ATTENTION_CHUNK, -(-L // ATTENTION_BLOCKS_GPU))
    return t(_flash(t(q_BxLxHxK), t(k_BxLxHxK), t(v_BxLxHxK), _FlashStatic(precision, rows, chunk)))


class _FlashStatic(tuple):
    """(dot precision, batch rows per map step, query rows per block): static, hashable, leaf-free
    through the custom VJP."""

    def __new__(cls, precision: jax.lax.Precision, rows: int, chunk: int):
        return super().__new__(cls, (precision, rows, chunk))


jax.tree_util.register_pytree_node(_FlashStatic, lambda s: ((), tuple(s)), lambda v, _: _FlashStatic(*v))


def _blocks(L: int, chunk: int) -> list[tuple[int, int]]:
    return [(start, min(start + chunk, L)) for start in range(0, L, chunk)]


def _row_scores(q_HxLxK: jax.Array, k_HxLxK: jax.Array, start: int, stop: int, precision) -> jax.Array:
    """Masked scores of query rows start:stop against keys 0:stop."""
    K, L = q_HxLxK.shape[2], q_HxLxK.shape[1]
    logits_HxCxS = jnp.einsum("hlk,hmk->hlm", q_HxLxK[:, start:stop], k_HxLxK[:, :stop], precision=precision) / math.sqrt(K)
    return jnp.where(jnp.tril(jnp.ones((L, L), bool))[start:stop, :stop], logits_HxCxS, -1e30)


def _row_forward(q_HxLxK, k_HxLxK, v_HxLxK, precision, chunk):
    """One batch row: (O, row max, row sum of exp) with max and sum as H×L×1."""
    out, maxes, sums = [], [], []
    for start, stop in _blocks(q_HxLxK.shape[1], chunk):
        logits_HxCxS = _row_scores(q_HxLxK, k_HxLxK, start, stop, precision)
        m_HxCx1 = jnp.max(logits_HxCxS, axis=-1, keepdims=True)
        e_HxCxS = jnp.exp(logits_HxCxS - m_HxCx1)
        s_HxCx1 = jnp.sum(e_HxCxS, axis=-1, keepdims=True)
        out.append(jnp.einsum("hlm,hmk->hlk", e_HxCxS / s_HxCx1, v_HxLxK[:, :stop], precision=precision))
        maxes.append(m_HxCx1)
        sums.append(s_HxCx1)
    return jnp.concatenate(out, axis=1), jnp.concatenate(maxes, axis=1), jnp.concatenate(sums, axis=1)


def _row_backward(q_HxLxK, k_HxLxK, v_HxLxK, o_HxLxK, m_HxLx1, s_HxLx1, do_HxLxK, precision, chunk):
    """dQ, dK, dV of one batch row: dS = P ⊙ (dP − rowsum(dO ⊙ O)), dP = dO·Vᵀ."""
    K = q_HxLxK.shape[2]
    d_HxLx1 = jnp.sum(do_HxLxK * o_HxLxK, axis=-1, keepdims=True)
    dq, dk_HxLxK, dv_HxLxK = [], jnp.zeros_like(k_HxLxK), jnp.zeros_like(v_HxLxK)
    for start, stop in _blocks(q_HxLxK.shape[1], chunk):
        rows = slice(start, stop)
        p_HxCxS = jnp.exp(_row_scores(q_HxLxK, k_HxLxK, start, stop, precision) - m_HxLx1[:, rows]) / s_HxLx1[:, rows]
        dp_HxCxS = jnp.einsum("hlk,hmk->hlm", do_HxLxK[:, rows], v_HxLxK[:, :stop], precision=precision)
        ds_HxCxS = p_HxCxS * (dp_HxCxS - d_HxLx1[:, rows]) / math.sqrt(K)
        dq.append(jnp.einsum("hlm,hmk->hlk", ds_HxCxS, k_HxLxK[:, :stop], precision=precision))
        dk_HxLxK = _add_to_leading_keys(dk_HxLxK, jnp.einsum("hlm,hlk->hmk", ds_HxCxS, q_HxLxK[:, rows], precision=precision))
        dv_HxLxK = _add_to_leading_keys(dv_HxLxK, jnp.einsum("hlm,hlk->hmk", p_HxCxS, do_HxLxK[:, rows], precision=precision))
    return jnp.concatenate(dq, axis=1), dk_HxLxK, dv_HxLxK


def _add_to_leading_keys(acc_HxLxK: jax.Array, part_HxSxK: jax.Array) -> jax.Array:
    """acc[:, :S] + part by static slices. `.at[:, :S].add` is a scatter-add, and a slice update
    becomes a scatter once vmapped over batch rows (as on a GPU): a GPU runs those with atomics, or
    serially under deterministic ops. The same sums, element by element."""
    S = part_HxSxK.shape[1]
    return jnp.concatenate([acc_HxLxK[:, :S] + part_HxSxK, acc_HxLxK[:, S:]], axis=1)


@jax.custom_vjp
def _flash(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, static):
    return _flash_fwd(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, static)[0]


def _flash_fwd(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, static):
    precision, rows, chunk = static
    o, m, s = jax.lax.map(lambda qkv: _row_forward(*qkv, precision, chunk), (q_BxHxLxK, k_BxHxLxK, v_BxHxLxK),
                          batch_size=rows if rows > 1 else None)
    return o, (q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, o, m, s, static)


def _flash_bwd(res, do_BxHxLxK):
    *arrays, (precision, rows, chunk) = res
    grads = jax.lax.map(lambda row: _row_backward(*row, precision, chunk), (*arrays, do_BxHxLxK),
                        batch_size=rows if rows > 1 else None)
    return (*grads, None)


_flash.defvjp(_flash_fwd, _flash_bwd)


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, structure: RecipeStructure, *, rngs: nnx.Rngs):
        d = cfg.d_model
        self.cfg = cfg
        self.qkv = _dense(d, 3 * d, structure, cfg.init_std, rngs)
        self.out = _dense(d, d, structure, cfg.init_std / math.sqrt(2 * cfg.n_layers), rngs)

    def __call__(self, x_BxLxD: jax.Array, ctx: Context) -> jax.Array:
        B, L, D = x_BxLxD.shape
        H, K = self.cfg.n_heads, self.cfg.head_dim
        qkv_BxLx3D = ctx.dense(self.qkv, x_BxLxD)
        q_BxLxHxK, k_BxLxHxK, v_BxLxHxK = (t.reshape(B, L, H, K) for t in jnp.split(qkv_BxLx3D, 3, axis=-1))
        q_BxLxHxK = _rope(q_BxLxHxK, self.cfg.rope_base)
        k_BxLxHxK = _rope(k_BxLxHxK, self.cfg.rope_base)
        st = ctx.structure
        sat = st.attention
        if st.attention_dtype is not None:  # inputs that are bf16/fp16: a fused kernel (cuDNN flash on a GPU)
            o_BxLxHxK = _fused_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, jnp.dtype(st.attention_dtype))
            return ctx.dense(self.out, o_BxLxHxK.reshape(B, L, D))
        if sat is not None:  # attention matmul inputs, quantised along each matmul's reduction axis
            fa = ctx.fmt["attention"]
            q_BxLxHxK = gemm.fake_quant_along(q_BxLxHxK, sat, fa, 3, ctx.next_key())
            k_BxLxHxK = gemm.fake_quant_along(k_BxLxHxK, sat, fa, 3, ctx.next_key())
            v_BxLxHxK = gemm.fake_quant_along(v_BxLxHxK, sat, fa, 1, ctx.next_key())
        if sat is None and st.fp32_sensitive_ops:  # nothing to round or quantise in it: never L×L in memory
            o_BxLxHxK = _causal_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, st.f32_dots)
            return ctx.dense(self.out, o_BxLxHxK.reshape(B, L, D))
        # dense: the probabilities are rounded or quantised as a whole (a per-tensor scale sees all of them)
        logits_BxHxLxL = jnp.einsum("blhk,bmhk->bhlm", q_BxLxHxK, k_BxLxHxK, precision=st.f32_dots) / math.sqrt(K)
        causal_LxL = jnp.tril(jnp.ones((L, L), bool))
        logits_BxHxLxL = jnp.where(causal_LxL, logits_BxHxLxL, -1e30)
        probs_BxHxLxL = _sensitive(jax.nn.softmax(logits_BxHxLxL, axis=-1), ctx.structure)
        if sat is not None:
            probs_BxHxLxL = gemm.fake_quant_along(probs_BxHxLxL, sat, ctx.fmt["attention"], 3, ctx.next_key())
        o_BxLxHxK = jnp.einsum("bhlm,bmhk->blhk", probs_BxHxLxL, v_BxLxHxK, precision=st.f32_dots)
        return ctx.dense(self.out, o_BxLxHxK.reshape(B, L, D))


# What each 16-bit attention traced in this process ran, by input dtype: "cudnn" or "xla ..." (with why
# on a GPU). jax.nn.dot_product_attention's implementation=None is XLA's form in the installed JAX, so a
# GPU asks for cuDNN by name and falls back to XLA, saying so; the trainer logs it (`attention_kernels`).
ATTENTION_KERNELS: dict[str, str] = {}


def attention_kernels() -> dict[str, str]:
    """Which kernel the 16-bit attention traced in this process ran, by input dtype (a copy)."""
    return dict(ATTENTION_KERNELS)


def _fused_attention(q_BxLxHxK: jax.Array, k_BxLxHxK: jax.Array, v_BxLxHxK: jax.Array, dtype) -> jax.Array:
    """Causal attention on Q, K, V cast to `dtype` (bf16/fp16): on a GPU cuDNN's flash attention, asked
    for by name (scores and softmax in fp32, probabilities rounded to `dtype` for P·V: the attention
    role's rounding), XLA's form where cuDNN cannot run it (recorded in ATTENTION_KERNELS with the
    reason); XLA's form elsewhere. Output in fp32. XLA:CPU has no fp16 dot accumulating in fp32: there
    fp16 runs the same computation written out."""
    q, k, v = (x.astype(dtype) for x in (q_BxLxHxK, k_BxLxHxK, v_BxLxHxK))
    name = jnp.dtype(dtype).name
    if dtype == jnp.float16 and jax.default_backend() == "cpu":
        ATTENTION_KERNELS[name] = "xla (written out: XLA:CPU has no fp16 dot accumulating in fp32)"
        K, L = q.shape[3], q.shape[1]
        logits = jnp.einsum("blhk,bmhk->bhlm", q, k, preferred_element_type=jnp.float32) / math.sqrt(K)
        probs = jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((L, L), bool)), logits, -1e30), axis=-1)
        o = jnp.einsum("bhlm,bmhk->blhk", probs.astype(dtype).astype(jnp.float32), v.astype(jnp.float32),
                       precision=jax.lax.Precision.HIGHEST)
        return o.astype(dtype).astype(jnp.float32)
    if jax.default_backend() == "gpu":
        try:
            out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
            ATTENTION_KERNELS[name] = "cudnn"
            return out.astype(jnp.float32)
        except Exception as e:  # noqa: BLE001 - no cuDNN, too old, or a shape it does not take: XLA's form, said
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
            ATTENTION_KERNELS[name] = f"xla (cuDNN flash attention did not run: {reason})"
    else:
        ATTENTION_KERNELS[name] = "xla"
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla").astype(jnp.float32)


@jax.checkpoint
def _swiglu(up_BxLxF: jax.Array, gate_BxLxF: jax.Array) -> jax.Array:
    """up ⊙ silu(gate). Checkpointed: the backward pass keeps up and gate (two B×L×F arrays) and
    recomputes the rest, instead of keeping five per layer."""
    return up_BxLxF * jax.nn.silu(gate_BxLxF)


class MLP(nnx.Module):
    """SwiGLU: down( up(x) ⊙ silu(gate(x)) ).

    Smooth-SwiGLU (Fishman et al. 2024): the product h_BxLxF gets a per-channel power-of-two scale
    s_F = 2^-round(log2 amax_F(h)) before it is quantised as the down-projection input, and the
    scale is undone on the quantised values: ĥ = Q(h·s)/s, y = ĥ·Q(W_down). Every channel of h·s
    has amax ≈ 1, so one outlier channel no longer sets the scale of all others; at full
    precision ĥ = h exactly (powers of two). s is a stop-gradient function of the current batch.
    """

    def __init__(self, cfg: ModelConfig, structure: RecipeStructure, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.up_gate = _dense(cfg.d_model, 2 * cfg.d_ff, structure, cfg.init_std, rngs)
        self.down = _dense(cfg.d_ff, cfg.d_model, structure, cfg.init_std / math.sqrt(2 * cfg.n_layers), rngs)

    def __call__(self, x_BxLxD: jax.Array, ctx: Context) -> tuple[jax.Array, jax.Array]:
        up_BxLxF, gate_BxLxF = jnp.split(ctx.dense(self.up_gate, x_BxLxD), 2, axis=-1)
        h_BxLxF = _swiglu(up_BxLxF, gate_BxLxF)
        h_max = _abs_max(h_BxLxF)
        if self.cfg.smooth_swiglu:
            amax_F = jax.lax.stop_gradient(jnp.max(jnp.abs(h_BxLxF), axis=(0, 1)))
            s_F = formats.pow2(-jnp.round(jnp.log2(jnp.where(amax_F > 0, amax_F, 1.0))).astype(jnp.int32))
            return ctx.dense(self.down, h_BxLxF, smooth_K=s_F), h_max
        return ctx.dense(self.down, h_BxLxF), h_max


class Block(nnx.Module):
    """x += attention(norm(x)); x += mlp(norm(x)). A variant block is a subclass naming another
    `attention_type` or `mlp_type` (built as `(cfg, structure, rngs=)`, called as `(x_BxLxD, ctx)`;
    an MLP returns (y_BxLxD, max |hidden|)); examples/own_architecture.py."""

    attention_type: type = Attention
    mlp_type: type = MLP

    def __init__(self, cfg: ModelConfig, structure: RecipeStructure, *, rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = self.attention_type(cfg, structure, rngs=rngs)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = self.mlp_type(cfg, structure, rngs=rngs)

    def __call__(self, x_BxLxD: jax.Array, ctx: Context) -> tuple[jax.Array, jax.Array]:
        st = ctx.structure
        x_BxLxD = _sensitive(x_BxLxD + self.attn(_sensitive(self.attn_norm(x_BxLxD), st), ctx), st)
        y_BxLxD, h_max = self.mlp(_sensitive(self.mlp_norm(x_BxLxD), st), ctx)
        return _sensitive(x_BxLxD + y_BxLxD, st), h_max


def _stack(blocks: list[Block]) -> Block:
    """One Block whose every variable holds all layers' values stacked on a leading axis (the
    layers are built one by one, so initialisation draws the same numbers as an unstacked list)."""
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *(nnx.state(b) for b in blocks))
    nnx.update(blocks[0], stacked)
    return blocks[0]


def layer(blocks: Block, i: int) -> Block:
    """Layer i of a stacked block (`Transformer.blocks`) as a Block of its own: a copy, for
    inspecting or calling one layer."""
    graphdef, state = nnx.split(blocks)
    return nnx.merge(graphdef, jax.tree.map(lambda x: x[i], state))


class Transformer(nnx.Module):
    """Decoder-only LM. Holds only the recipe's static structure plus its formats as Variables,
    so the compiled program depends on shapes and granularity, not on the element formats. The
    architecture `transformer` (scaling.train.architectures); a subclass naming another
    `block_type` is a variant of it."""

    block_type: type = Block

    def __init__(self, cfg: ModelConfig, recipe: Recipe | str | dict, *, rngs: nnx.Rngs):
        recipe = precision.get(recipe)
        structure = recipe.structure()
        self.cfg, self.structure = cfg, structure
        d, V = cfg.d_model, cfg.vocab
        self.embed = nnx.Param(jax.random.normal(rngs.params(), (V, d), jnp.float32))  # unit-variance rows
        self.blocks = _stack([self.block_type(cfg, structure, rngs=rngs) for _ in range(cfg.n_layers)])
        self.final_norm = RMSNorm(d, cfg.norm_eps)
        head_structure = structure if not structure.high_precision_embed else self._head_structure()
        self.head = _dense(d, V, head_structure, cfg.init_std, rngs)
        for role, vec in recipe.formats().items():
            setattr(self, f"format_{role}", FormatVector(vec))
        if recipe.keeps_layers:
            if recipe.high_precision_first + recipe.high_precision_last > cfg.n_layers:
                raise ConfigError("precision.high_precision_last", recipe.high_precision_last,
                                  f"at most {cfg.n_layers - recipe.high_precision_first} (the model has "
                                  f"{cfg.n_layers} blocks, {recipe.high_precision_first} kept first)")
            for role, vec in recipe.kept().formats().items():
                setattr(self, f"kept_format_{role}", FormatVector(vec))

    def _head_structure(self) -> RecipeStructure:
        """The unquantised head's: FP32 operands, dots at the recipe's float32 precision."""
        return RecipeStructure(dot_precision=self.structure.dot_precision)

    def formats(self, prefix: str = "format_") -> dict[str, jax.Array]:
        """The recipe's format vectors by role (prefix 'kept_format_': the kept blocks' recipe's)."""
        return {r: getattr(self, f"{prefix}{r}")[...] for r in precision.ROLES if hasattr(self, f"{prefix}{r}")}

    def quantised_layers(self) -> tuple[int, int]:
        """[start, stop) of the blocks that run the recipe (the others are kept in high precision)."""
        st = self.structure
        return st.high_precision_first, self.cfg.n_layers - st.high_precision_last

    def __call__(self, tokens_BxL: jax.Array, *, key: jax.Array | None = None, update_state: bool = True,
                 measure: jax.Array | bool = True) -> tuple[jax.Array, dict]:
        """Logits for every position (fp32) and aux = {'telemetry': forward roles' per-layer stats
        (NaN where `measure` is false), 'act_max': (n_layers,) max |residual| after each block,
        'swiglu_max': (n_layers,)}."""
        st = self.structure
        blocks_key, head_key = (None, None) if key is None else jax.random.split(key)
        ctx = Context(st, self.formats(), head_key, update_state, measure)
        emb = self.embed[...]
        if not st.high_precision_embed and st.weight is not None:
            emb = gemm.fake_quant_along(emb, st.weight, ctx.fmt["weight"], 1)
        x_BxLxD = jnp.take(emb, tokens_BxL, axis=0)
        x_BxLxD, act_max, swiglu_max = self._scan_blocks(x_BxLxD, ctx, blocks_key)
        x_BxLxD = _sensitive(self.final_norm(x_BxLxD), st)
        head_ctx = ctx if not st.high_precision_embed else Context(self._head_structure(), {}, None, False)
        logits_BxLxV = head_ctx.dense(self.head, x_BxLxD)
        aux = {"telemetry": ctx.telemetry, "act_max": act_max, "swiglu_max": swiglu_max}
        return logits_BxLxV, aux

    def _scan_blocks(self, x_BxLxD: jax.Array, ctx: Context, key: jax.Array | None):
        """The layer stack as `lax.scan`s over the stacked block parameters: XLA compiles one block
        per recipe, not n_layers copies, so compile time does not grow with depth. Each layer gets
        its own PRNG key; its telemetry rows and amax histories come out stacked by layer. Blocks
        kept in high precision are scanned apart (a slice of the stack each, under the kept
        recipe's structure and formats); only the quantised blocks' telemetry is recorded. The
        layers' QuantTelemetry variables come out stacked by layer too (every block's)."""
        graphdef, params, hist, rest = nnx.split(self.blocks, nnx.Param, AmaxHistory, ...)
        n_layers = self.cfg.n_layers
        keys = None if key is None else jax.random.split(key, n_layers)
        start, stop = self.quantised_layers()
        kept = (self.structure.kept, self.formats("kept_format_"))
        segments = [(0, start, *kept), (start, stop, ctx.structure, ctx.fmt), (stop, n_layers, *kept)]
        outs = []
        for lo, hi, structure, fmt in segments:
            if lo == hi:
                continue
            cut = lambda tree: jax.tree.map(lambda v: v[lo:hi], tree)

            def layer(x_BxLxD, per_layer, structure=structure, fmt=fmt):
                p, h, r, k = per_layer
                block = nnx.merge(graphdef, p, h, r)
                layer_ctx = Context(structure, fmt, k, ctx.update_state, ctx.measure)
                x_BxLxD, h_max = block(x_BxLxD, layer_ctx)
                telemetry = {role: jnp.stack(rows) for role, rows in layer_ctx.telemetry.items()}
                return x_BxLxD, (nnx.state(block, AmaxHistory), nnx.state(block, QuantTelemetry), telemetry,
                                 _abs_max(x_BxLxD), h_max)

            per_layer = (cut(params), cut(hist), cut(rest), None if keys is None else keys[lo:hi])
            x_BxLxD, out = jax.lax.scan(layer, x_BxLxD, per_layer)
            outs.append(out)
            if lo == start and hi == stop:
                for role, rows in out[2].items():
                    ctx.record({role: rows})
        new_hist, new_telemetry, _, act_max, swiglu_max = jax.tree.map(lambda *v: jnp.concatenate(v), *(
            (o[0], o[1], None, o[3], o[4]) for o in outs))
        if ctx.update_state:
            nnx.update(self.blocks, new_hist)
        nnx.update(self.blocks, new_telemetry)
        return x_BxLxD, act_max, swiglu_max


# ---------------------------------------------------------------------------------------------
# Loss, gradient step, evaluation
# ---------------------------------------------------------------------------------------------


def _cross_entropy(logits_BxLxV: jax.Array, targets_BxL: jax.Array) -> jax.Array:
    logz_BxL = jax.nn.logsumexp(logits_BxLxV, axis=-1)
    picked_BxL = jnp.take_along_axis(logits_BxLxV, targets_BxL[..., None], axis=-1)[..., 0]
    return jnp.mean(logz_BxL - picked_BxL)


def _aggregate(per_layer: list[jax.Array], measure: jax.Array | bool) -> dict[str, Any]:
    """Layers' quant.TELEMETRY_FIELDS vectors (each [..., TELEMETRY_SIZE]: one GEMM's, or stacked
    by layer) -> the largest amax, mean fractions and SNR, and the block amax spread over all
    layers' blocks (min of mins, median of medians, max of maxes). A step that measures nothing,
    known when traced (`measure` a Python False: a GPU's unlogged step, evaluation), gets the NaNs
    the vectors hold without reducing them (the median is a sort)."""
    def reduce(per_layer):
        t = jnp.concatenate([v.reshape(-1, gemm.TELEMETRY_SIZE) for v in per_layer])
        return {"amax": jnp.max(t[:, 0]), "frac_saturated": jnp.mean(t[:, 1]),
                "frac_underflow": jnp.mean(t[:, 2]), "snr_db": jnp.mean(t[:, 3]),
                "block_amax": {"min": jnp.min(t[:, 4]), "p50": jnp.median(t[:, 5]), "max": jnp.max(t[:, 6])}}

    if measure is False:
        return jax.tree.map(lambda s: jnp.full(s.shape, jnp.nan, s.dtype), jax.eval_shape(reduce, per_layer))
    return reduce(per_layer)


def loss_fn(model: Transformer, tokens_BxL: jax.Array, key: jax.Array | None = None, *, update_state: bool = True,
            measure: jax.Array | bool = True) -> tuple[jax.Array, dict]:
    """Next-token cross-entropy (fp32, mean over B·(L-1) positions) and aux: telemetry of the
    forward roles aggregated over layers (where `measure`), act_max and swiglu_max per layer."""
    inputs_BxL, targets_BxL = tokens_BxL[:, :-1], tokens_BxL[:, 1:]
    logits_BxLxV, aux = model(inputs_BxL, key=key, update_state=update_state, measure=measure)
    loss = _cross_entropy(_sensitive(logits_BxLxV, model.structure), targets_BxL)
    telemetry = {role: _aggregate(v, measure) for role, v in aux["telemetry"].items()}
    return loss, {"telemetry": telemetry, "act_max": aux["act_max"], "swiglu_max": aux["swiglu_max"]}


def grad_step(model: Transformer, tokens_BxL: jax.Array, key: jax.Array,
              measure: jax.Array | bool = True) -> tuple[jax.Array, nnx.State, dict]:
    """Loss, gradients of the nnx.Param leaves, telemetry. Delayed-scaling histories (forward
    roles: updated during the forward pass; grad role: returned by the backward pass through
    GradSink, `layers.value_and_grad`) and each layer's QuantTelemetry are written back into
    `model` in place. `measure` (a bool, may be traced): whether to compute the quantisation
    telemetry (NaN where not; loss, gradients and histories are the same either way).

    telemetry = {role: {amax, frac_saturated, frac_underflow, snr_db, block_amax: {min, p50, max}}} for the quantised roles
    (grad stats from the dgrad quantisation of dY), plus 'act_max' and 'swiglu_max' per layer.
    """
    def f(m: Transformer):
        return loss_fn(m, tokens_BxL, key, measure=measure)

    (loss, aux), grads = layers.value_and_grad(f, has_aux=True)(model)  # writes the GradSinks back
    telemetry = dict(aux["telemetry"])
    start, stop = model.quantised_layers()
    # the blocks' sinks are stacked by layer: only the quantised blocks' rows describe the recipe
    sink_leaves = [leaf[start:stop] if leaf.ndim == 2 else leaf for leaf in jax.tree.leaves(nnx.state(model, GradSink))]
    sink_leaves = [leaf for leaf in sink_leaves if leaf.size]
    if sink_leaves:
        telemetry["grad"] = _aggregate([leaf[..., :gemm.TELEMETRY_SIZE] for leaf in sink_leaves], measure)
    telemetry["act_max"] = aux["act_max"]
    telemetry["swiglu_max"] = aux["swiglu_max"]
    return loss, grads, telemetry


def eval_loss(model: Transformer, tokens_BxL: jax.Array) -> jax.Array:
    """Validation loss: nearest rounding, no quantisation-state update."""
    return loss_fn(model, tokens_BxL, None, update_state=False, measure=False)[0]
