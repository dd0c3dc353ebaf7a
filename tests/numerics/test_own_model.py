"""Your own model under a recipe (scaling.numerics.layers): examples/own_model.py trains a model
written outside the project under mxfp4; QDense's forward and both backward GEMMs are the recipe's
quantisation (against quant.fake_quant by hand); stochastic rounding follows the key; telemetry."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import importlib.util
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scaling.errors import ConfigError
from scaling.numerics import QDense, precision, qdot, quant, value_and_grad
from _draws import normal  # jax.random.normal's numbers, one compiled draw for every shape

pytestmark = pytest.mark.slow  # every test here compiles or trains several models


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_model.py"


def _example():
    spec = importlib.util.spec_from_file_location("own_model", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def trained():
    """(the example's Result after 8 steps, what it printed)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        result = _example().main(["--steps", "8"])
    return result, printed.getvalue()


def _fq(t, spec, axis):
    """Hand quantisation of one GEMM operand along that GEMM's reduction axis."""
    return quant.fake_quant(t, dataclasses.replace(spec, axis=axis))


def _close(a, b, rel=2e-6):
    """Equal up to fp32 accumulation order: |a - b| <= rel · max|b|."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=0, atol=rel * float(np.abs(b).max()))


def _operands(m=32, k=64, n=48, seed=0):
    kx, kg = jax.random.split(jax.random.key(seed))
    x = normal(kx, (m, k)) * jnp.exp(normal(kx, (m, k)))  # heavy tails: blocks differ
    dy = 1e-3 * normal(kg, (m, n))
    return x, dy


@nnx.jit
def _layer_grads(layer, x, dy, key):
    """(dL/dW, the layer's telemetry) for L = Σ y ⊙ dy, so that the backward pass sees dY = dy."""
    _, grads = value_and_grad(lambda m: jnp.sum(m(x, key=key) * dy))(layer)
    return grads["kernel"][...], layer.telemetry()


def test_the_example_trains_its_own_model_under_mxfp4(trained):
    result, out = trained
    losses = result.losses
    assert len(losses) == 8 and all(math.isfinite(v) for v in losses)
    assert np.mean(losses[-3:]) < 0.6 * losses[0]  # ln 64 ≈ 4.2 at the start
    assert set(result.telemetry) == {"attn/qkv", "attn/out", "head"}
    for roles in result.telemetry.values():
        assert set(roles) == {"weight", "activation", "grad"}  # the grad role measured in the backward pass
        assert all(t["amax"] > 0 and math.isfinite(t["snr_db"]) for t in roles.values())
    assert "step    7  loss" in out and "attn/qkv   grad" in out


def test_a_trained_layers_forward_is_the_recipes_quantisation(trained):
    layer = trained[0].model.head
    recipe = precision.get("mxfp4")
    x = normal(jax.random.key(3), (32, layer.in_features))
    w = layer.kernel[...]
    y = nnx.jit(lambda m, x: m(x, update_state=False))(layer, x)
    reference = jnp.dot(_fq(x, recipe.activation, 1), _fq(w, recipe.weight, 0),
                        precision=jax.lax.Precision.HIGHEST) + layer.bias[...]
    _close(y, reference)
    assert float(jnp.max(jnp.abs(reference - x @ w - layer.bias[...]))) > 100 * 2e-6 * float(jnp.max(jnp.abs(reference)))


def test_both_backward_gemms_are_quantised():
    """With nearest gradient rounding the gradients have a hand-written reference: dgrad
    Q(dY; along N)·Q(W; along N)ᵀ, wgrad Q(X; along M)ᵀ·Q(dY; along M); they differ from the
    forward-only recipe's (the same forward, FP32 backward) and from FP32's."""
    mxfp4 = precision.get("mxfp4")
    nearest = dataclasses.replace(mxfp4, grad=dataclasses.replace(mxfp4.grad, rounding="nearest"))
    x, dy = _operands()
    layer = QDense(64, 48, nearest, rngs=nnx.Rngs(0))
    w = layer.kernel[...]
    hi = jax.lax.Precision.HIGHEST
    dw, telemetry = _layer_grads(layer, x, dy, None)
    _close(dw, jnp.dot(_fq(x, nearest.activation, 0).T, _fq(dy, nearest.grad, 0), precision=hi))
    dx, dw_functional = jax.jit(lambda x, w, dy: jax.vjp(lambda a, b: qdot(a, b, nearest), x, w)[1](dy))(x, w, dy)
    _close(dx, jnp.dot(_fq(dy, nearest.grad, 1), _fq(w, nearest.weight, 1).T, precision=hi))
    np.testing.assert_array_equal(dw_functional, dw)
    # the telemetry of this step: every role's amax is its operand's
    assert {r: float(t["amax"]) for r, t in telemetry.items()} == {
        "weight": float(jnp.max(jnp.abs(w))), "activation": float(jnp.max(jnp.abs(x))), "grad": float(jnp.max(jnp.abs(dy)))}

    forward_only = dataclasses.replace(nearest, forward_only=True)
    for other in (forward_only, precision.get("fp32")):
        dw_other, _ = _layer_grads(QDense(64, 48, other, rngs=nnx.Rngs(0)), x, dy, None)
        assert float(jnp.max(jnp.abs(dw_other - dw))) > 1e-3 * float(jnp.max(jnp.abs(dw)))
    _close(_layer_grads(QDense(64, 48, forward_only, rngs=nnx.Rngs(0)), x, dy, None)[0], jnp.dot(x.T, dy, precision=hi))


def test_stochastic_rounding_follows_the_key():
    """mxfp4 rounds gradients stochastically from the key passed to the call: the same key gives
    the same gradients, another key others; without a key it rounds to nearest."""
    x, dy = _operands(seed=1)
    layer = QDense(64, 48, "mxfp4", rngs=nnx.Rngs(0))
    a, _ = _layer_grads(layer, x, dy, jax.random.key(7))
    b, _ = _layer_grads(layer, x, dy, jax.random.key(7))
    c, _ = _layer_grads(layer, x, dy, jax.random.key(8))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    mxfp4 = precision.get("mxfp4")
    nearest = dataclasses.replace(mxfp4, grad=dataclasses.replace(mxfp4.grad, rounding="nearest"))
    np.testing.assert_array_equal(_layer_grads(layer, x, dy, None)[0],
                                  _layer_grads(QDense(64, 48, nearest, rngs=nnx.Rngs(0)), x, dy, None)[0])


def test_a_layer_built_from_a_structure_takes_its_formats_with_each_call():
    """The project's transformer builds its QDense from the recipe's structure and keeps the formats
    itself: given those formats with each call, such a layer is the recipe's own, bit for bit."""
    recipe = precision.get("mxfp4")
    x, dy = _operands(seed=2)
    own = QDense(64, 48, recipe, rngs=nnx.Rngs(0))
    bare = QDense(64, 48, recipe.structure(), rngs=nnx.Rngs(0))
    assert not any(hasattr(bare, f"format_{r}") for r in ("weight", "activation", "grad"))

    @nnx.jit
    def grads(layer, formats):
        _, g = value_and_grad(lambda m: jnp.sum(m(x, key=jax.random.key(5), formats=formats) * dy))(layer)
        return g["kernel"][...], layer.telemetry()

    a, b = grads(own, None), grads(bare, recipe.formats())
    jax.tree.map(np.testing.assert_array_equal, a, b)
    with pytest.raises(ValueError, match="formats="):
        bare(x)


def test_an_unknown_recipe_is_a_one_line_error():
    with pytest.raises(ConfigError, match="precision: got 'mxfp5'"):
        QDense(4, 4, "mxfp5", rngs=nnx.Rngs(0))
