"""Precision recipes and the three-GEMM quantised matmul (scaling.precision)."""

from __future__ import annotations

import dataclasses
import functools
import glob
import os
import tomllib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scaling import model, precision, quant
from scaling.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _operands(m=48, k=80, n=40, seed=0):
    kx, kw, kg = jax.random.split(jax.random.key(seed), 3)
    # heavy-tailed magnitudes so blocks get different scales and small values underflow
    x = jax.random.normal(kx, (m, k)) * jnp.exp(jax.random.normal(kx, (m, k)))
    w = 0.05 * jax.random.normal(kw, (k, n))
    dy = 1e-3 * jax.random.normal(kg, (m, n)) * jnp.exp(jax.random.normal(kg, (m, n)))
    return x, w, dy


@jax.jit
def _vjp_jit(recipe_box, x, w, dy, key):
    y, pullback = jax.vjp(lambda a, b: precision.qdot(a, b, recipe_box.value, key=key), x, w)
    return (y, *pullback(dy))


def _vjp(recipe, x, w, dy, key=None):
    return _vjp_jit(precision._Static(recipe), x, w, dy, key)


@functools.partial(jax.jit, static_argnums=0)
def _reference(recipe, x, w, dy):
    """Hand-written: quant.fake_quant each operand along the reduction axis of its GEMM, then plain
    fp32 matmuls. fprop X·W (both along K); dgrad dY·Wᵀ (dY and W along N); wgrad Xᵀ·dY (along M)."""

    def fq(t, spec, axis):
        return t if spec is None else quant.fake_quant(t, dataclasses.replace(spec, axis=axis))

    hi = jax.lax.Precision.HIGHEST
    y = jnp.dot(fq(x, recipe.activation, 1), fq(w, recipe.weight, 0), precision=hi)
    dx = jnp.dot(fq(dy, recipe.grad, 1), fq(w, recipe.weight, 1).T, precision=hi)
    dw = jnp.dot(fq(x, recipe.activation, 0).T, fq(dy, recipe.grad, 0), precision=hi)
    return y, dx, dw


def _close(a, b, rel=2e-6):
    """Equal up to fp32 accumulation order: |a - b| <= rel · max|b|."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=0, atol=rel * float(np.abs(b).max()))


SMALL_BLOCKS = {  # fp8-blockwise with 16-wide tiles so that small shapes have several (partial) blocks
    "name": "blockwise16",
    "weight": {"format": "fp8_e4m3", "granularity": "block2d", "block": 16},
    "activation": {"format": "fp8_e4m3", "granularity": "block", "block": 16},
    "grad": {"format": "fp8_e4m3", "granularity": "block", "block": 16},
}
CHANNEL = {"name": "int8-channel", "weight": {"format": "int8", "granularity": "channel"},
           "activation": {"format": "int8", "granularity": "channel"}, "grad": {"format": "fp8_e5m2"}}


def _nearest_grads(recipe):
    """The fp4 presets round gradients stochastically; with nearest rounding a reference exists."""
    r = precision.get(recipe)
    return dataclasses.replace(r, grad=dataclasses.replace(r.grad, rounding="nearest"))


@pytest.mark.parametrize("recipe", ["fp8", SMALL_BLOCKS, "mxfp8", CHANNEL, "nvfp4"])
def test_three_gemms_match_hand_written_reference(recipe):
    r = _nearest_grads(recipe)
    x, w, dy = _operands()
    want = _reference(r, x, w, dy)
    # the plain fp32 path and the exact bf16 fast path (the fast one only for the costlier
    # granularities; test_fast_path_agrees_with_fp32_path compares the two paths directly)
    for fast in (False, True) if r.name in ("fp8", "blockwise16") else (True,):
        got = _vjp(dataclasses.replace(r, fast_path=fast), x, w, dy)
        for g, ref in zip(got, want):
            _close(g, ref)
    # and quantisation really happened: the plain fp32 results differ by far more than rounding
    y32 = jnp.dot(x, w, precision=jax.lax.Precision.HIGHEST)
    dw32 = jnp.dot(x.T, dy, precision=jax.lax.Precision.HIGHEST)
    assert float(jnp.abs(got[0] - y32).max()) > 1e-3 * float(jnp.abs(y32).max())
    assert float(jnp.abs(got[2] - dw32).max()) > 1e-3 * float(jnp.abs(dw32).max())


@functools.partial(jax.jit, static_argnums=(2, 3))
def _fq_dot_t(a, b, spec_a, spec_b):
    """fake_quant(a) · fake_quant(b)ᵀ."""
    return jnp.dot(quant.fake_quant(a, spec_a), quant.fake_quant(b, spec_b).T)


def test_wrong_axis_would_be_caught():
    # guard for the reference test: quantising W along K (the fprop axis) for dgrad changes dX
    # with 1×16 weight blocks, not with 16×16 tiles (the same tiles along both axes)
    x, w, dy = _operands()
    base = precision.get(SMALL_BLOCKS)
    g1 = dataclasses.replace(base.grad, axis=1)
    for granularity, same in (("block2d", True), ("block", False)):
        r = dataclasses.replace(base, weight=dataclasses.replace(base.weight, granularity=granularity))
        _, dx, _ = _vjp(r, x, w, dy)
        wrong = _fq_dot_t(dy, w, g1, dataclasses.replace(r.weight, axis=0))
        gap = float(jnp.abs(dx - wrong).max()) / float(jnp.abs(wrong).max())
        assert (gap < 1e-5) if same else (gap > 1e-3)


def test_forward_only_leaves_backward_unquantised():
    r = dataclasses.replace(precision.get("fp4"), forward_only=True)
    x, w, dy = _operands()
    y, dx, dw = _vjp(r, x, w, dy, key=jax.random.key(3))
    hi = jax.lax.Precision.HIGHEST
    _close(dx, jnp.dot(dy, w.T, precision=hi))
    _close(dw, jnp.dot(x.T, dy, precision=hi))
    fwd = dataclasses.replace(r, grad=None)
    _close(y, _reference(fwd, x, w, dy)[0])


def test_stochastic_rounding_uses_explicit_keys():
    r = precision.get("fp4")  # stochastic gradients
    x, w, dy = _operands()
    a = _vjp(r, x, w, dy, key=jax.random.key(0))
    b = _vjp(r, x, w, dy, key=jax.random.key(0))
    c = _vjp(r, x, w, dy, key=jax.random.key(1))
    np.testing.assert_array_equal(a[1], b[1])
    assert float(jnp.abs(a[1] - c[1]).max()) > 0
    np.testing.assert_array_equal(a[0], c[0])  # forward roles round to nearest
    # unbiased: the mean over keys approaches the nearest-free product better than one draw
    draws = jnp.stack([_vjp(r, x, w, dy, key=jax.random.key(i))[2] for i in range(16)])
    exact = jnp.dot(quant.fake_quant(x, dataclasses.replace(r.activation, axis=0)).T, dy)
    assert float(jnp.abs(draws.mean(0) - exact).mean()) < 0.5 * float(jnp.abs(draws[0] - exact).mean())


@pytest.mark.parametrize("name", ["bf16", "fp8-blockwise", "mxfp4"])
def test_fast_path_agrees_with_fp32_path(name):
    # model-sized blocks (128) and stochastic gradient rounding (same keys on both paths)
    x, w, dy = _operands(m=256, k=320, n=192, seed=2)
    key = jax.random.key(5)
    slow = _vjp(dataclasses.replace(precision.get(name), fast_path=False), x, w, dy, key)
    fast = _vjp(precision.get(name), x, w, dy, key)
    for s, f in zip(slow, fast):
        _close(f, s)


def test_batched_inputs_flatten():
    x, w, _ = _operands(m=48)
    y3 = precision.qdot(x.reshape(4, 12, -1), w, "fp8")
    np.testing.assert_array_equal(y3.reshape(48, -1), precision.qdot(x, w, "fp8"))


# ---------------------------------------------------------------------------------------------
# Recipes
# ---------------------------------------------------------------------------------------------


def test_preset_bits_and_roles():
    expect = {"fp32": (32, 32, 32), "bf16": (16, 16, 16), "fp16": (16, 16, 16), "fp8": (8, 8, 8),
              "fp8-delayed": (8, 8, 8), "fp8-blockwise": (8, 8, 8), "mxfp8": (8, 8, 8), "mxfp6": (6, 6, 6),
              "mxfp4": (4, 4, 4), "nvfp4": (4, 4, 4), "fp6": (6, 6, 6), "fp4": (4, 4, 4), "int4": (4, 4, 4),
              "e3m4": (8, 8, 8)}
    for name, (p, pw, pg) in expect.items():
        r = precision.get(name)
        assert (r.bits, r.bits_w, r.bits_g) == (p, pw, pg), name
    fp8 = precision.get("fp8")
    assert (fp8.weight.format, fp8.activation.format, fp8.grad.format) == ("fp8_e4m3", "fp8_e4m3", "fp8_e5m2")
    bw = precision.get("fp8-blockwise")
    assert (bw.weight.granularity, bw.weight.block, bw.activation.granularity, bw.activation.block) == ("block2d", 128, "block", 128)
    assert precision.get("fp8-delayed").grad.scaling == "delayed"
    mixed = precision.get({"weight": "fp4_e2m1", "activation": "fp8_e4m3"})
    assert (mixed.bits, mixed.bits_w, mixed.bits_a, mixed.bits_g) == (8, 4, 8, 32)


@pytest.mark.parametrize("value, key", [
    ("fp7", "precision"),
    ({"wieght": "fp8_e4m3"}, "precision.wieght"),
    ({"weight": {"format": "fp8_e4m3", "granularity": "rows"}}, "precision.weight.granularity"),
    ({"weight": {"format": "e9m2"}}, "precision.weight.format"),
    ({"grad": {"format": "fp8_e5m2", "scaling": "delayed", "granularity": "mx"}}, "precision.grad.scaling"),
    ({"activation": {"format": "fp8_e4m3", "axis": 0}}, "precision.activation.axis"),
    ({"forward_only": "yes"}, "precision.forward_only"),
    ({"base": "fp9"}, "precision.base"),
    ({"attention": {"format": "fp8_e4m3", "scaling": "delayed"}}, "precision.attention.scaling"),
])
def test_recipe_errors_name_the_key(value, key):
    with pytest.raises(ConfigError) as e:
        precision.get(value)
    assert e.value.key == key
    assert "\n" not in str(e.value) and str(e.value).startswith(key + ": got ")


def test_recipe_from_mapping_overrides_a_base():
    r = precision.get({"base": "fp8", "forward_only": True, "grad": "none"})
    assert r.forward_only and r.grad is None and r.weight == precision.get("fp8").weight
    assert r.name == "fp8-custom"


def test_example_recipe_files_load():
    paths = sorted(glob.glob(os.path.join(ROOT, "experiments", "recipes", "*.toml")))
    assert len(paths) >= 3
    for path in paths:
        with open(path, "rb") as f:
            table = tomllib.load(f)["precision"]
        r = precision.get(path)
        assert r == precision.get(table)
        assert r.name == table["name"]
        assert r.bits <= 32


# ---------------------------------------------------------------------------------------------
# One compiled step per granularity, formats as runtime values; delayed scaling state
# ---------------------------------------------------------------------------------------------

TINY = model.ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, vocab=64, seq_len=16)


@pytest.mark.slow
def test_formats_share_one_compiled_step():
    traces = []

    @nnx.jit
    def step(m, tokens, key):
        traces.append(1)
        loss, grads, _ = model.grad_step(m, tokens, key)
        return loss

    tokens = jax.random.randint(jax.random.key(0), (2, TINY.seq_len + 1), 0, TINY.vocab)
    losses = {}
    for name in ("fp8", "fp6", "int8", "e3m4"):
        m = model.Transformer(TINY, name, rngs=nnx.Rngs(0))
        losses[name] = float(step(m, tokens, jax.random.key(1)))
    assert len(traces) == 1
    # the format is really applied at run time: each recipe gives a different loss
    assert len(set(losses.values())) == 4


@pytest.mark.slow
def test_delayed_scaling_histories_evolve():
    m = model.Transformer(TINY, "fp8-delayed", rngs=nnx.Rngs(0))
    step = nnx.jit(model.grad_step)
    qkv = m.blocks[0].attn.qkv
    H = precision.get("fp8-delayed").activation.amax_history
    assert qkv.hist_activation[...].shape == (H,) and float(jnp.abs(qkv.hist_activation[...]).max()) == 0
    tokens = jax.random.randint(jax.random.key(0), (2, TINY.seq_len + 1), 0, TINY.vocab)
    _, _, tel1 = step(m, tokens, jax.random.key(1))
    h1_a, h1_w, h1_g = qkv.hist_activation[...], qkv.hist_weight[...], qkv.grad_sink[...][precision.TELEMETRY_SIZE:]
    assert float(h1_a[0]) == pytest.approx(float(tel1["activation"]["amax"]), rel=0.5)
    assert float(h1_a[0]) > 0 and float(h1_w[0]) > 0 and float(h1_g[0]) > 0
    assert float(jnp.abs(h1_a[1:]).max()) == 0
    tokens2 = jax.random.randint(jax.random.key(7), (2, TINY.seq_len + 1), 0, TINY.vocab)
    step(m, tokens2, jax.random.key(2))
    h2_a, h2_g = qkv.hist_activation[...], qkv.grad_sink[...][precision.TELEMETRY_SIZE:]
    assert float(h2_a[1]) == float(h1_a[0]) and float(h2_g[1]) == float(h1_g[0])
    assert float(h2_a[0]) != float(h1_a[0])
    # evaluation reads but never writes the histories
    nnx.jit(model.eval_loss)(m, tokens)
    np.testing.assert_array_equal(qkv.hist_activation[...], h2_a)


def test_block_amax_telemetry_sees_blocks_the_tensor_amax_hides():
    """Per-block amax statistics (32-wide blocks along the reduction axis) beside the per-tensor
    amax: a zero block gives min 0, the largest block is the tensor amax, the median is exact."""
    rows, k = 4, 96  # 3 blocks of 32 per row
    block_amax = np.array([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0], [6.0, 7.0, 8.0], [9.0, 10.0, 400.0]], np.float32)
    x = np.zeros((rows, k), np.float32)
    for r in range(rows):
        for b in range(3):
            x[r, 32 * b + (r + b) % 32] = -block_amax[r, b] if b % 2 else block_amax[r, b]
    s = precision.role_structure(quant.QuantSpec("fp8_e4m3"))
    fmt = precision.format_vector("fp8_e4m3")
    tel = dict(zip(precision.TELEMETRY_FIELDS, np.asarray(precision.quantise_operand(jnp.asarray(x), s, fmt, 1, with_telemetry=True).telemetry)))
    assert tel["amax"] == 400.0
    assert (tel["block_amax_min"], tel["block_amax_p50"], tel["block_amax_max"]) == (0.0, np.median(block_amax), 400.0)
    # along axis 0 (a weight K x N) the blocks run down the columns: the transpose gives the same stats
    tel_t = np.asarray(precision.quantise_operand(jnp.asarray(x.T), s, fmt, 0, with_telemetry=True).telemetry)
    np.testing.assert_array_equal(tel_t[4:], [tel["block_amax_min"], tel["block_amax_p50"], tel["block_amax_max"]])


def test_grad_step_reports_block_amax_per_role():
    m = model.Transformer(TINY, "fp8", rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(0), (2, TINY.seq_len + 1), 0, TINY.vocab)
    _, _, tel = nnx.jit(model.grad_step)(m, tokens, jax.random.key(1))
    for role in ("weight", "activation", "grad"):
        b = {k: float(v) for k, v in tel[role]["block_amax"].items()}
        assert 0.0 <= b["min"] <= b["p50"] <= b["max"] <= float(tel[role]["amax"]) * (1 + 1e-6), (role, b)
        assert b["min"] < b["max"]
