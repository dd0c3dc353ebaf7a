"""Block-diagonal randomised Hadamard transforms (RHT) of a GEMM's operands along its reduction axis.

A GEMM C = A·B sums over K. With R = diag(s) · blockdiag(H_b, ..., H_b) / √b (s a random ±1 vector
of length b, H_b the b×b Sylvester Hadamard matrix, b a power of two) R is orthogonal, so

    C = (A·R) · (Rᵀ·B)

exactly: rotating both operands along K (each length-K vector v -> Rᵀv, in blocks of b) changes
what is quantised but not the product. Rotation spreads an outlier over its block, so a block scale
is set by the block's energy rather than its largest element, and it makes the quantisation error
of different elements less correlated (Tseng et al. 2025, NVIDIA's NVFP4 recipe 2025, Quartet).

A recipe picks the GEMMs (`GemmHadamard`: fprop / dgrad / wgrad, each a `Hadamard` or None); both
operands of a chosen GEMM are rotated before they are quantised (a rotation of one operand alone
would change the product). Signs are drawn from an explicit key: 'fresh' from the GEMM's own key
(a new vector every step, layer and GEMM), or 'fixed' from the recipe's seed (one vector for the
whole run, as TransformerEngine's NVFP4 recipe). A length K that b does not divide is zero-padded
to a multiple of b (in both operands alike, so the product is still exact).

Cost: the rotation of a block is a b×b matrix product, 2·b FLOPs per element (how GPUs run it, on
tensor cores; `flops_per_element`).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from scaling.errors import ConfigError

GEMMS = ("fprop", "dgrad", "wgrad")
SIGNS = ("fresh", "fixed")


@dataclass(frozen=True)
class Hadamard:
    """One GEMM's rotation: block size b (a power of two >= 2) and where its signs come from."""

    block: int = 16
    signs: str = "fresh"  # 'fresh': from the GEMM's key each call; 'fixed': from `seed`, one vector
    seed: int = 0

    def __post_init__(self) -> None:
        b = self.block
        if isinstance(b, bool) or not isinstance(b, int) or b < 2 or b & (b - 1):
            raise ConfigError("hadamard.block", b, "a power of two >= 2 (16, 32, ...)")
        if self.signs not in SIGNS:
            raise ConfigError("hadamard.signs", self.signs, SIGNS)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError("hadamard.seed", self.seed, "an integer >= 0")


@dataclass(frozen=True)
class GemmHadamard:
    """Which of a dense layer's three GEMMs rotate their operands (None: not rotated)."""

    fprop: Hadamard | None = None
    dgrad: Hadamard | None = None
    wgrad: Hadamard | None = None

    def __bool__(self) -> bool:
        return any(getattr(self, g) is not None for g in GEMMS)

    def describe(self) -> dict:
        return {g: {"block": h.block, "signs": h.signs, "seed": h.seed}
                for g in GEMMS if (h := getattr(self, g)) is not None}


def parse(value, key: str = "hadamard") -> GemmHadamard:
    """A GemmHadamard from a table {fprop|dgrad|wgrad: block | {block=, signs=, seed=} | "none"}."""
    if isinstance(value, GemmHadamard):
        return value
    if not isinstance(value, dict):
        raise ConfigError(key, value, "a table such as {wgrad = 16} or {wgrad = {block = 16, signs = 'fixed'}}")
    out = {}
    for gemm, v in value.items():
        if gemm not in GEMMS:
            raise ConfigError(f"{key}.{gemm}", v, GEMMS)
        if v is None or v == "none":
            continue
        if isinstance(v, int) and not isinstance(v, bool):
            v = {"block": v}
        if not isinstance(v, dict):
            raise ConfigError(f"{key}.{gemm}", v, "a block size, 'none' or a table {block=, signs=, seed=}")
        for k in v:
            if k not in ("block", "signs", "seed"):
                raise ConfigError(f"{key}.{gemm}.{k}", v[k], ("block", "signs", "seed"))
        try:
            out[gemm] = Hadamard(**v)
        except ConfigError as e:
            raise ConfigError(f"{key}.{gemm}.{e.key.split('.')[-1]}", e.value, e.allowed) from None
    return GemmHadamard(**out)


def hadamard_matrix(b: int) -> np.ndarray:
    """The b×b Sylvester Hadamard matrix (entries ±1, H·Hᵀ = b·I, symmetric)."""
    h = np.ones((1, 1), np.float32)
    while h.shape[0] < b:
        h = np.block([[h, h], [h, -h]])
    return h


def random_signs(key: jax.Array, b: int) -> jax.Array:
    """b independent ±1 signs (float32) from `key`."""
    return jnp.where(jax.random.bernoulli(key, 0.5, (b,)), 1.0, -1.0).astype(jnp.float32)


def signs_for(h: Hadamard, key: jax.Array | None) -> jax.Array:
    """The sign vector of one call: from `key` when the recipe redraws them ('fresh') and a key is
    given; otherwise from the recipe's seed (also what evaluation, which has no key, uses)."""
    if h.signs == "fresh" and key is not None:
        return random_signs(key, h.block)
    return random_signs(jax.random.key(h.seed), h.block)


def rotation(signs: jax.Array) -> jax.Array:
    """R = diag(s) · H_b / √b (b = len(signs)): orthogonal; v -> v·R rotates a row vector's block."""
    b = signs.shape[0]
    return signs[:, None] * jnp.asarray(hadamard_matrix(b)) * jnp.float32(1.0 / np.sqrt(b))


def _apply(x: jax.Array, axis: int, m: jax.Array) -> jax.Array:
    b = m.shape[0]
    x = jnp.moveaxis(jnp.asarray(x, jnp.float32), axis, -1)
    n = x.shape[-1]
    pad = (-n) % b
    if pad:
        x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)])
    xb = x.reshape(x.shape[:-1] + (-1, b))
    y = jnp.einsum("...j,jk->...k", xb, m, precision=jax.lax.Precision.HIGHEST)
    return jnp.moveaxis(y.reshape(x.shape), -1, axis)


def rotate(x: jax.Array, axis: int, signs: jax.Array) -> jax.Array:
    """x with every length-b block along `axis` rotated (v -> Rᵀ·v, as a row: v·R), `axis` zero-padded
    to a multiple of b. Rotating both operands of a GEMM along its reduction axis keeps the product."""
    return _apply(x, axis, rotation(signs))


def unrotate(y: jax.Array, axis: int, signs: jax.Array, n: int) -> jax.Array:
    """The inverse of `rotate` (v -> R·v per block), cut back to length n along `axis`."""
    x = _apply(y, axis, rotation(signs).T)
    return jax.lax.slice_in_dim(x, 0, n, axis=axis % x.ndim)


def flops_per_element(h: Hadamard | None) -> float:
    """FLOPs to rotate one element: a b×b matrix product per block of b, 2·b per element."""
    return 0.0 if h is None else 2.0 * h.block


__all__ = ["GEMMS", "SIGNS", "Hadamard", "GemmHadamard", "parse", "hadamard_matrix", "random_signs",
           "signs_for", "rotation", "rotate", "unrotate", "flops_per_element"]
