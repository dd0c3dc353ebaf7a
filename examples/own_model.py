"""Your own model under a precision recipe: a tiny language model written here (grouped-query
attention with a fused QKV projection, LayerNorm; nothing from scaling.train.model), every dense projection a
`scaling.numerics.QDense`, trained a few steps with optax under the `mxfp4` preset on a synthetic
next-token task. Prints the loss and each layer's quantisation telemetry.

    python examples/own_model.py                      # mxfp4, 60 steps, a few seconds on a CPU
    python examples/own_model.py --recipe nvfp4 --steps 100
    python examples/own_model.py --recipe my_recipe.toml

The recipe quantises the forward GEMM (X·W) and both backward GEMMs (dY·Wᵀ, Xᵀ·dY) of every
QDense; the embedding, norms, attention matmuls and softmax stay FP32 (as the project's own
transformer keeps them under `high_precision_embed` and `fp32_sensitive_ops`).
"""

from __future__ import annotations

import argparse
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from scaling.numerics import QDense, precision, telemetry_by_layer, value_and_grad

VOCAB = 64
SEQ_LEN = 16
BATCH = 16


def _split(key: jax.Array | None, n: int) -> list[jax.Array | None]:
    """n independent keys for n quantised layers (None stays None: nearest rounding)."""
    return [None] * n if key is None else list(jax.random.split(key, n))


class GroupedQueryAttention(nnx.Module):
    """Causal attention with n_heads query heads sharing n_kv_heads key/value heads."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, recipe: precision.Recipe, *, rngs: nnx.Rngs):
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        # one projection for the queries (n_heads) and the shared keys and values (n_kv_heads each)
        self.qkv = QDense(d_model, (n_heads + 2 * n_kv_heads) * self.head_dim, recipe, rngs=rngs)
        self.out = QDense(n_heads * self.head_dim, d_model, recipe, rngs=rngs)

    def __call__(self, x_BxLxD: jax.Array, key: jax.Array | None) -> jax.Array:
        B, L, _ = x_BxLxD.shape
        H, G, K = self.n_heads, self.n_kv_heads, self.head_dim
        k_qkv, k_out = _split(key, 2)
        qkv_BxLxGxRK = self.qkv(x_BxLxD, key=k_qkv).reshape(B, L, G, (H // G + 2) * K)
        q_BxLxGxRK, k_BxLxGxK, v_BxLxGxK = jnp.split(qkv_BxLxGxRK, [H // G * K, (H // G + 1) * K], axis=-1)
        q_BxLxGxRxK = q_BxLxGxRK.reshape(B, L, G, H // G, K)
        logits_BxGxRxLxL = jnp.einsum("blgrk,bmgk->bgrlm", q_BxLxGxRxK, k_BxLxGxK) / math.sqrt(K)
        logits_BxGxRxLxL = jnp.where(jnp.tril(jnp.ones((L, L), bool)), logits_BxGxRxLxL, -1e30)
        probs_BxGxRxLxL = jax.nn.softmax(logits_BxGxRxLxL, axis=-1)
        o_BxLxGxRxK = jnp.einsum("bgrlm,bmgk->blgrk", probs_BxGxRxLxL, v_BxLxGxK)
        return self.out(o_BxLxGxRxK.reshape(B, L, H * K), key=k_out)


class TinyLM(nnx.Module):
    """Embedding -> x + GQA(LayerNorm x) -> LayerNorm -> head (with a bias)."""

    def __init__(self, recipe: precision.Recipe, *, d_model: int = 64, n_heads: int = 4, n_kv_heads: int = 2,
                 rngs: nnx.Rngs):
        self.embed = nnx.Embed(VOCAB, d_model, rngs=rngs)
        self.attn_norm = nnx.LayerNorm(d_model, rngs=rngs)
        self.attn = GroupedQueryAttention(d_model, n_heads, n_kv_heads, recipe, rngs=rngs)
        self.final_norm = nnx.LayerNorm(d_model, rngs=rngs)
        self.head = QDense(d_model, VOCAB, recipe, use_bias=True, rngs=rngs)

    def __call__(self, tokens_BxL: jax.Array, key: jax.Array | None = None) -> jax.Array:
        k_attn, k_head = _split(key, 2)
        x_BxLxD = self.embed(tokens_BxL)
        x_BxLxD = x_BxLxD + self.attn(self.attn_norm(x_BxLxD), k_attn)
        return self.head(self.final_norm(x_BxLxD), key=k_head)


def batch(key: jax.Array) -> jax.Array:
    """B rows of SEQ_LEN + 1 tokens following t' = (5t + 3) mod VOCAB from random starts: the
    next token is a function of the current one, so the loss can fall from ln VOCAB towards 0."""
    t = jax.random.randint(key, (BATCH,), 0, VOCAB)
    rows = [t]
    for _ in range(SEQ_LEN):
        t = (5 * t + 3) % VOCAB
        rows.append(t)
    return jnp.stack(rows, axis=1)


def loss_fn(model: TinyLM, tokens_BxL: jax.Array, key: jax.Array | None) -> jax.Array:
    logits_BxLxV = model(tokens_BxL[:, :-1], key)
    return optax.softmax_cross_entropy_with_integer_labels(logits_BxLxV, tokens_BxL[:, 1:]).mean()


@nnx.jit
def train_step(model: TinyLM, optimizer: nnx.Optimizer, tokens_BxL: jax.Array, key: jax.Array) -> jax.Array:
    # value_and_grad, not nnx.value_and_grad: it also keeps the grad role's telemetry and state
    loss, grads = value_and_grad(loss_fn)(model, tokens_BxL, key)
    optimizer.update(model, grads)
    return loss


class Result(NamedTuple):
    losses: list[float]
    telemetry: dict  # telemetry_by_layer after the last step
    model: TinyLM


def train(recipe: str = "mxfp4", steps: int = 60, seed: int = 0, learning_rate: float = 1e-2) -> Result:
    """Train TinyLM under `recipe` for `steps` steps; every key derives from `seed`."""
    recipe = precision.get(recipe)
    init_key, data_key, round_key = jax.random.split(jax.random.key(seed), 3)
    model = TinyLM(recipe, rngs=nnx.Rngs(init_key))
    optimizer = nnx.Optimizer(model, optax.adam(learning_rate), wrt=nnx.Param)
    losses = []
    for step in range(steps):
        tokens_BxL = batch(jax.random.fold_in(data_key, step))
        losses.append(float(train_step(model, optimizer, tokens_BxL, jax.random.fold_in(round_key, step))))
    telemetry = {layer: {role: {field: float(v) for field, v in t.items()} for role, t in roles.items()}
                 for layer, roles in telemetry_by_layer(model).items()}
    return Result(losses, telemetry, model)


def main(argv: list[str] | None = None) -> Result:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="mxfp4", help="preset, format name or recipe .toml (default mxfp4)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    result = train(args.recipe, args.steps, args.seed)
    every = max(1, args.steps // 6)
    for step, loss in enumerate(result.losses):
        if step % every == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss:.4f}")
    print(f"\n{'layer':10s} {'role':10s} {'amax':>9s} {'saturated':>9s} {'underflow':>9s} {'SNR dB':>7s}")
    for layer, roles in result.telemetry.items():
        for role, t in roles.items():
            print(f"{layer:10s} {role:10s} {t['amax']:9.3g} {t['frac_saturated']:9.4f} "
                  f"{t['frac_underflow']:9.4f} {t['snr_db']:7.1f}")
    return result


if __name__ == "__main__":
    main()
