"""Test operands drawn as jax.random.normal draws them, without compiling a program per shape.

With partitionable threefry (JAX's default) element i of a draw depends only on the key and i: the
draw of any shape is the first prod(shape) numbers of one draw of fixed size, reshaped. Eager
jax.random.normal compiles its program once per shape, and the numerics tests draw many shapes."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

SIZE = 1 << 17  # numbers per draw: the largest operand drawn (256 x 320) fits


@jax.jit
def _normals(key: jax.Array) -> jax.Array:
    return jax.random.normal(key, (SIZE,))


def normal(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """jax.random.normal(key, shape) (float32), bit for bit (test_draws_are_jax_randoms_bit_for_bit)."""
    n = math.prod(shape)
    assert n <= SIZE and jax.config.jax_threefry_partitionable, (shape, "draw it with jax.random.normal")
    return jnp.asarray(np.asarray(_normals(key))[:n].reshape(shape))
