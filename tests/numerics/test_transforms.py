"""transforms: the randomised Hadamard rotation, 2-D block scales, the published FP4 presets'
quantisers against a numpy reference, and fresh random draws per step, layer and GEMM."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from scaling.errors import ConfigError
from scaling.numerics import formats, gemm, layers, precision, quant, transforms
from scaling.numerics.quant import QuantSpec
from scaling.train import ladder, model
from _draws import normal  # jax.random.normal's numbers, one compiled draw for every shape

pytestmark = pytest.mark.slow  # every test here compiles or trains several models


E2M1 = ml_dtypes.float4_e2m1fn


def test_draws_are_jax_randoms_bit_for_bit():
    """The operands of the numerics tests (_draws.normal) are jax.random.normal's, whatever the shape."""
    for seed, shape in ((5, (40, 53)), (11, (8, 1)), (2, (256, 320))):
        np.testing.assert_array_equal(normal(jax.random.key(seed), shape), jax.random.normal(jax.random.key(seed), shape))


@pytest.mark.parametrize("b", [16, 32])
def test_rotation_is_orthogonal_and_its_inverse_exact_within_float32(b):
    signs = transforms.random_signs(jax.random.key(4), b)
    r = np.asarray(transforms.rotation(signs), np.float64)
    np.testing.assert_allclose(r @ r.T, np.eye(b), atol=4e-7)
    x = normal(jax.random.key(5), (40, 3 * b + 5)) * 100.0  # a ragged last block is zero-padded
    y = transforms.rotate(x, 1, signs)
    assert y.shape == (40, 4 * b)
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), np.linalg.norm(x, axis=1), rtol=2e-6)
    back = transforms.unrotate(y, 1, signs, x.shape[1])
    np.testing.assert_allclose(back, x, rtol=0, atol=8 * np.finfo(np.float32).eps * 100.0 * 4)
    # the same rotation along axis 0 of the transpose
    np.testing.assert_array_equal(transforms.rotate(x.T, 0, signs), y.T)


def test_rotating_both_operands_keeps_the_product():
    signs = transforms.random_signs(jax.random.key(6), 16)
    a = normal(jax.random.key(7), (24, 80))
    b = normal(jax.random.key(8), (80, 12))
    dot = functools.partial(jnp.dot, precision=jax.lax.Precision.HIGHEST)  # FP32, not a GPU's TF32
    got = dot(transforms.rotate(a, 1, signs), transforms.rotate(b, 0, signs))
    np.testing.assert_allclose(got, dot(a, b), rtol=1e-5, atol=2e-5)
    # a rotation of one operand alone would not
    assert not np.allclose(transforms.rotate(a, 1, signs)[:, :80] @ b, a @ b, atol=1e-2)
    # through qdot: an fp32 recipe with every GEMM rotated is the plain matmul, and so are its gradients
    recipe = precision.get({"base": "bf16", "weight": "fp32", "activation": "fp32", "grad": "fp32",
                            "hadamard": {"fprop": 16, "dgrad": 32, "wgrad": 16}})
    f = lambda a, b: jnp.sum(jnp.sin(layers.qdot(a, b, recipe, key=jax.random.key(1))))
    ref = lambda a, b: jnp.sum(jnp.sin(dot(a, b)))
    # jitted: one program each instead of an eager dispatch (and compile) per operation
    (f_ab, grads), (ref_ab, ref_grads) = (jax.jit(jax.value_and_grad(g, (0, 1)))(a, b) for g in (f, ref))
    np.testing.assert_allclose(f_ab, ref_ab, rtol=1e-5)
    for got, want in zip(grads, ref_grads):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_stochastic_rounding_after_the_rotation_stays_unbiased():
    # E[Q(A·R)]·Rᵀ = A for stochastic MXFP4: the mean of n draws of the dequantised, un-rotated
    # operand approaches A with standard error σ/√n per element; a biased rounding (nearest) misses
    signs = transforms.random_signs(jax.random.key(9), 32)
    a = normal(jax.random.key(10), (8, 64)) * jnp.exp(normal(jax.random.key(11), (8, 1)))
    rotated = transforms.rotate(a, 1, signs)
    n = 1000
    sr = QuantSpec("fp4_e2m1", "mx", rounding="stochastic", scale_rounding="ceil")
    draws = jax.jit(jax.vmap(lambda k: transforms.unrotate(quant.fake_quant(rotated, sr, key=k), 1, signs, 64)))(
        jax.random.split(jax.random.key(12), n))  # jitted: one program, not an eager compile per operation
    mean, sd = np.asarray(jnp.mean(draws, 0)), np.asarray(jnp.std(draws, 0))
    z = (mean - np.asarray(a)) / (sd / np.sqrt(n) + 1e-12)
    assert np.max(np.abs(z)) < 5.0  # 512 elements: |z| > 5 has probability ~3e-4 in all
    nearest = transforms.unrotate(quant.fake_quant(rotated, QuantSpec("fp4_e2m1", "mx", scale_rounding="ceil")), 1, signs, 64)
    z_nearest = (np.asarray(nearest) - np.asarray(a)) / (sd / np.sqrt(n) + 1e-12)
    assert np.max(np.abs(z_nearest)) > 5.0


@pytest.mark.parametrize("granularity,block", [("nvfp4", 16), ("mx", 32)])
def test_square_block_scales_quantise_w_and_its_transpose_alike(granularity, block):
    w = normal(jax.random.key(13), (72, 40)) * jnp.exp(normal(jax.random.key(14), (72, 1)))
    spec = QuantSpec("fp4_e2m1", granularity, square_blocks=True)
    assert spec.block == block
    fake_quant = jax.jit(quant.fake_quant, static_argnums=1)  # one program a call, not a compile per operation
    fprop = fake_quant(w, dict_replace(spec, axis=0))  # W along K (fprop)
    dgrad = fake_quant(w, dict_replace(spec, axis=1))  # W along N (dgrad)
    transposed = fake_quant(w.T, spec)
    np.testing.assert_array_equal(fprop, dgrad)
    np.testing.assert_array_equal(np.asarray(transposed).T, np.asarray(fprop))
    # 1-D blocks do not have that property
    one_d = QuantSpec("fp4_e2m1", granularity)
    assert not np.array_equal(fake_quant(w, dict_replace(one_d, axis=0)), fake_quant(w, dict_replace(one_d, axis=1)))
    q = quant.quantize(w, spec)
    assert q.scale.shape == (-(-72 // block), -(-40 // block))


def dict_replace(spec, **kw):
    import dataclasses

    return dataclasses.replace(spec, **kw)


# ------------------------------------------------------------------ numpy references of the presets


def _e4m3(v):
    return np.asarray(v, np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)


def _nvfp4_reference(x, tile_rows, tile_cols):
    """NVFP4 with tiles of tile_rows × tile_cols over a 2-D x (multiples of the tile)."""
    one = np.float32(1)
    amax = np.float32(np.max(np.abs(x)))
    s_t = amax * (one / np.float32(2688.0))
    out = np.zeros_like(x)
    for i in range(0, x.shape[0], tile_rows):
        for j in range(0, x.shape[1], tile_cols):
            t = x[i:i + tile_rows, j:j + tile_cols]
            s_b = _e4m3(np.float32(np.max(np.abs(t))) * (one / (np.float32(6) * s_t)))
            s = s_b * s_t
            out[i:i + tile_rows, j:j + tile_cols] = np.clip(t * (one / s), -6, 6).astype(E2M1).astype(np.float32) * s
    return out


def _quest_mx_reference(x):
    """Quartet's forward MXFP4 (QuEST): 1×32 blocks along the last axis, E8M0 exponent
    floor(log2(rms · 2.92247856 / 6)), round to nearest E2M1, saturating."""
    out = np.zeros_like(x)
    for i in range(x.shape[0]):
        for j in range(0, x.shape[1], 32):
            blk = x[i, j:j + 32].astype(np.float64)
            t = np.float32(np.float32(np.sqrt(np.mean(blk ** 2))) * np.float32(np.float32(2.92247856) / np.float32(6)))
            e = np.floor(np.log2(t))
            out[i, j:j + 32] = np.clip(x[i, j:j + 32] * np.float32(2.0 ** -e), -6, 6).astype(E2M1).astype(np.float32) * np.float32(2.0 ** e)
    return out


def _operand(seed, shape):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return np.asarray(normal(k1, shape) * jnp.exp(2 * normal(k2, (shape[0], 1))), np.float32)


@functools.partial(jax.jit, static_argnums=(1, 3))
def _dequantised(t, role, fmt, axis):
    """quant.dequantize of gemm.quantise_operand(t, role, fmt, axis): one jitted program per role, shape
    and axis (eagerly, each operation of the quantiser dispatched and compiled a program of its own)."""
    got = gemm.quantise_operand(t, role, fmt, axis)
    return quant.dequantize(got.q, got.spec)


def test_nvfp4_nvidia_quantisers_match_a_numpy_reference():
    r = precision.get("nvfp4-nvidia")
    st = r.structure()
    w, x = _operand(15, (64, 48)), _operand(16, (32, 64))
    fmt = precision.format_vector("fp4_e2m1")
    # weights: 16×16 tiles, the same along either axis
    for axis in (0, 1):
        np.testing.assert_array_equal(_dequantised(w, st.weight, fmt, axis), _nvfp4_reference(w, 16, 16))
    # activations along K: 1×16
    np.testing.assert_array_equal(_dequantised(x, st.activation, fmt, 1), _nvfp4_reference(x, 1, 16))
    # wgrad: the rotated X (16-blocks along M, the preset's fixed signs) in 16×1 blocks along M
    signs = transforms.signs_for(r.hadamard.wgrad, jax.random.key(99))  # 'fixed': the key is not used
    np.testing.assert_array_equal(signs, transforms.random_signs(jax.random.key(0), 16))
    xr = np.asarray(jax.jit(transforms.rotate, static_argnums=1)(x, 0, signs))
    np.testing.assert_allclose(xr, (x.reshape(2, 16, 64).transpose(0, 2, 1) @ np.asarray(transforms.rotation(signs))
                                    ).transpose(0, 2, 1).reshape(32, 64), rtol=1e-5, atol=1e-5 * np.abs(x).max())
    np.testing.assert_array_equal(_dequantised(xr, st.activation, fmt, 0), _nvfp4_reference(xr.T, 1, 16).T)
    # gradients: stochastic, onto one of the two neighbours of the reference's grid
    g = _operand(17, (32, 48))
    key = jax.random.key(3)
    assert gemm._spec(st.grad, 1, key).rounding == "stochastic"  # the spec quantise_operand takes with a key

    @jax.jit
    def stochastic(g, key):
        got = gemm.quantise_operand(g, st.grad, fmt, 1, key=key)
        return got.q.values, quant.expand_scale(got.q.scale, got.spec, g.shape)

    v, s = map(np.asarray, stochastic(g, key))
    near = _nvfp4_reference(g, 1, 16)
    assert np.all(np.abs(v - g / s) <= np.abs(near / s - g / s) + 2.0)  # neighbours on E2M1 (steps <= 2)
    assert not np.array_equal(v * s, near)


def test_quartet_forward_quantiser_matches_a_numpy_reference():
    st = precision.get("quartet").structure()
    fmt = precision.format_vector("fp4_e2m1")
    x = _operand(18, (16, 96))
    np.testing.assert_array_equal(_dequantised(x, st.activation, fmt, 1), _quest_mx_reference(x))
    # the weight, along K = axis 0
    w = _operand(19, (96, 8))
    np.testing.assert_array_equal(_dequantised(w, st.weight, fmt, 0), _quest_mx_reference(w.T).T)
    # QuEST clips: some elements of a heavy-tailed block saturate where the amax scale would not
    spec = dict_replace(st.activation.spec, axis=1)
    assert float(quant.telemetry(x, quant.quantize(x, spec), spec)["frac_saturated"]) > 0


# ------------------------------------------------------------------ fresh random draws


def _forget_cached_traces_that_draw():
    """Evict the traces of the package's jitted functions that call formats.random_bits (a step's
    transforms.random_signs calls are traced afresh with the step): the next trace calls the spy.
    Not jax.clear_caches(): that drops every program this process compiled (each test after it,
    and each model built here, compiled its small eager programs again: ~5 s of CPU per call). A
    jitted caller missed here keeps its unspied trace: its draws go uncounted and the counts fail."""
    for jitted in (formats.round_to_grid, quant._quantize):
        jitted.clear_cache()


@pytest.mark.parametrize("base,rounded", [("quartet", 2), ("quartet-full", 4), ("mxfp4-rht", 4)])
def test_random_draws_differ_between_steps_layers_and_gemms(monkeypatch, base, rounded):
    """Every stochastic rounding and every 'fresh' sign vector of a train step draws from its own
    key: distinct across the two steps, the layers, the projections and the three GEMMs. A constant
    key (or one not folded per layer or GEMM) repeats and fails."""
    seen = []

    def spy(kind, fn):
        def wrapped(key, *args):
            jax.debug.callback(lambda k: seen.append((kind, tuple(np.asarray(k).ravel().tolist()))),
                               jax.random.key_data(key))
            return fn(key, *args)
        return wrapped

    monkeypatch.setattr(formats, "random_bits", spy("rounding", formats.random_bits))
    monkeypatch.setattr(transforms, "random_signs", spy("signs", transforms.random_signs))
    _forget_cached_traces_that_draw()
    cfg = ladder.ModelConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, vocab=64, seq_len=16)
    recipe = precision.get({"base": base, "hadamard": {"fprop": 32, "dgrad": 32, "wgrad": 32}})
    m = model.Transformer(cfg, recipe, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(0), (2, cfg.seq_len + 1), 0, cfg.vocab)
    step = jax.jit(lambda state, key: model.grad_step(nnx.merge(graphdef, state), tokens, key)[0])
    graphdef, state = nnx.split(m)
    for i in range(2):
        jax.block_until_ready(step(state, jax.random.fold_in(jax.random.key(7), i)))
    jax.effects_barrier()
    _forget_cached_traces_that_draw()  # no spied trace outlives the test
    per_step_layer = 4  # projections: qkv, out, up_gate, down
    rounding = [k for kind, k in seen if kind == "rounding"]
    signs = [k for kind, k in seen if kind == "signs"]
    # per projection: dY stochastically rounded for dgrad and again for wgrad (quartet-full: the
    # forward's W and X too); signs for 3 GEMMs
    assert len(rounding) == 2 * cfg.n_layers * per_step_layer * rounded
    assert len(signs) == 2 * cfg.n_layers * per_step_layer * 3
    assert len(set(rounding)) == len(rounding)
    assert len(set(signs)) == len(signs)


def test_hadamard_recipe_keys_are_validated():
    with pytest.raises(ConfigError, match="precision.hadamard.wgrad"):
        precision.get({"base": "nvfp4", "hadamard": {"wgrad": 12}})
    with pytest.raises(ConfigError, match="precision.hadamard.bwd"):
        precision.get({"base": "nvfp4", "hadamard": {"bwd": 16}})
    with pytest.raises(ConfigError, match="precision.hadamard.dgrad.signs"):
        precision.get({"base": "nvfp4", "hadamard": {"dgrad": {"block": 16, "signs": "often"}}})
    with pytest.raises(ConfigError, match="precision.hadamard.dgrad"):
        precision.get({"base": "nvfp4", "forward_only": True, "hadamard": {"dgrad": 16}})
    with pytest.raises(ConfigError, match="precision.hadamard.fprop"):
        precision.get({"base": "fp32", "hadamard": {"fprop": 16}})
    with pytest.raises(ConfigError, match="square_blocks"):
        QuantSpec("fp8_e4m3", "tensor", square_blocks=True)
    with pytest.raises(ConfigError, match="scale_from"):
        QuantSpec("fp4_e2m1", "nvfp4", scale_from="rms")
    r = precision.get({"base": "nvfp4", "hadamard": {"wgrad": {"block": 32, "signs": "fixed", "seed": 3}}})
    assert r.hadamard.wgrad == transforms.Hadamard(32, "fixed", 3) and r.hadamard.fprop is None
    assert r.describe()["hadamard"] == {"wgrad": {"block": 32, "signs": "fixed", "seed": 3}}
    # recipes without the newer keys describe (and so hash into run ids) as before
    assert "hadamard" not in precision.get("nvfp4").describe()
    assert "square_blocks" not in precision.get("nvfp4").describe()["weight"]


# ------------------------------------------------------------------ quartet-full's backward


def _quest_clipped(x):
    """Where `_quest_mx_reference` clips x (|x| > 6 · 2^e of its 1×32 block)."""
    out = np.zeros(x.shape, bool)
    for i in range(x.shape[0]):
        for j in range(0, x.shape[1], 32):
            blk = x[i, j:j + 32].astype(np.float64)
            t = np.float32(np.float32(np.sqrt(np.mean(blk ** 2))) * np.float32(np.float32(2.92247856) / np.float32(6)))
            out[i, j:j + 32] = np.abs(x[i, j:j + 32]) > 6 * 2.0 ** np.floor(np.log2(t))
    return out


def test_quartet_full_backward_is_the_masked_gradient_of_the_quantised_forward():
    """With the gradients left exact (an FP32 grad role), quartet-full's backward is the straight-through
    gradient of its quantised forward in the rotated domain, QuEST's mask applied, rotated back:
    dX = (dY · Q(Rᵀ·W)ᵀ ⊙ kept(X·R)) · Rᵀ and dW = R · (Q(X·R)ᵀ · dY ⊙ kept(Rᵀ·W))."""
    recipe = precision.get({"base": "quartet-full", "grad": {"format": "fp32", "granularity": "none"}})
    x, w = _operand(20, (48, 64)), _operand(21, (64, 40)) * 0.1
    c = np.asarray(normal(jax.random.key(22), (48, 40)), np.float32)
    # jitted: one program instead of an eager dispatch (and compile) per operation
    dx, dw = jax.jit(jax.grad(lambda x, w: jnp.sum(layers.qdot(x, w, recipe, key=jax.random.key(1)) * c), (0, 1)))(x, w)
    signs = transforms.signs_for(recipe.hadamard.fprop, None)
    r = np.asarray(transforms.rotation(signs), np.float64)
    blockdiag = np.kron(np.eye(2), r)  # K = 64: two 32-blocks
    xr, wr = x @ blockdiag, blockdiag.T @ w
    xq, wq = _quest_mx_reference(xr.astype(np.float32)), _quest_mx_reference(wr.T.astype(np.float32)).T
    kept_x, kept_w = ~_quest_clipped(xr.astype(np.float32)), ~_quest_clipped(wr.T.astype(np.float32)).T
    assert 0 < (~kept_x).mean() < 0.2 and 0 < (~kept_w).mean() < 0.2  # the mask is doing something
    want_dx = ((c @ wq.T) * kept_x) @ blockdiag.T
    want_dw = blockdiag @ ((xq.T @ c) * kept_w)
    np.testing.assert_allclose(dx, want_dx, rtol=2e-5, atol=2e-5 * np.abs(want_dx).max())
    np.testing.assert_allclose(dw, want_dw, rtol=2e-5, atol=2e-5 * np.abs(want_dw).max())
    # without the mask it is the plain straight-through gradient (and differs)
    plain = precision.get({"base": "quartet-full", "clip_mask": False, "grad": {"format": "fp32", "granularity": "none"}})
    dx_plain = jax.jit(jax.grad(lambda x: jnp.sum(layers.qdot(x, w, plain, key=jax.random.key(1)) * c)))(x)
    np.testing.assert_allclose(dx_plain, (c @ wq.T) @ blockdiag.T, rtol=2e-5, atol=2e-5 * np.abs(want_dx).max())
    assert not np.allclose(dx_plain, want_dx, atol=1e-3 * np.abs(want_dx).max())


def test_quartet_full_stochastic_backward_is_unbiased_for_the_masked_gradient():
    """Re-rounding dY, the forward's W and X stochastically after fresh rotations leaves the mean of
    many draws on the exact straight-through gradient of the quantised forward, masked (|z| < 5 over
    every element); `quartet`, whose backward quantises W and X afresh with QuEST's clipping scale
    and rounds them to nearest, is off its own target (the same, unmasked)."""
    x, w = _operand(23, (32, 64)), _operand(24, (64, 32)) * 0.1
    c = np.asarray(normal(jax.random.key(25), (32, 32)), np.float32)
    fp32_grads = {"grad": {"format": "fp32", "granularity": "none"}}
    loss = lambda recipe: (lambda x, w, k: jnp.sum(layers.qdot(x, w, recipe, key=k) * c))
    n = 400
    keys = jax.random.split(jax.random.key(26), n)
    for name, mask, unbiased in (("quartet-full", True, True), ("quartet", False, False)):
        exact = precision.get({"base": "quartet-full", "clip_mask": mask, **fp32_grads})
        # jitted: one program each instead of an eager dispatch (and compile) per operation
        want = jax.jit(jax.grad(loss(exact), (0, 1)))(x, w, jax.random.key(0))
        draws = jax.jit(jax.vmap(lambda k: jax.grad(loss(precision.get(name)), (0, 1))(x, w, k)))(keys)
        for d, t in zip(draws, want):
            mean, se = np.asarray(jnp.mean(d, 0)), np.asarray(jnp.std(d, 0)) / np.sqrt(n) + 1e-12
            z = np.abs(mean - np.asarray(t)) / se
            assert (np.max(z) < 5.0) == unbiased, (name, np.max(z))


def test_backward_operand_keys_are_validated():
    with pytest.raises(ConfigError, match="precision.backward_operands"):
        precision.get({"base": "quartet", "backward_operands": "saved"})
    with pytest.raises(ConfigError, match="precision.backward_operands"):
        precision.get({"base": "mxfp4", "grad": "none", "backward_operands": "forward"})
    with pytest.raises(ConfigError, match="precision.clip_mask"):
        precision.get({"base": "quartet", "clip_mask": True})  # rotated fprop, backward from the inputs
    with pytest.raises(ConfigError, match="precision.clip_mask"):
        precision.get({"base": "mxfp4", "clip_mask": 1})
    r = precision.get({"base": "mxfp4", "clip_mask": True})
    assert r.describe()["clip_mask"] is True and "backward_operands" not in r.describe()
    assert "clip_mask" not in precision.get("quartet").describe()  # older recipes hash as before


def test_mxfp4_rht_is_a_bf16_forward_with_an_unbiased_mxfp4_backward():
    """Tseng et al.'s recipe: the forward is the BF16 product exactly; the backward's mean over many
    draws is the gradient of that BF16 forward (|z| < 5 everywhere), and one draw is not it."""
    r = precision.get("mxfp4-rht")
    assert (r.bits, r.bits_g) == (16, 4)
    x, w = _operand(27, (32, 64)), _operand(28, (64, 32)) * 0.1
    c = np.asarray(normal(jax.random.key(29), (32, 32)), np.float32)
    bf = lambda v: np.asarray(v, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    # jitted: one program each instead of an eager dispatch (and compile) per operation
    y = jax.jit(lambda x, w: layers.qdot(x, w, r, key=jax.random.key(0)))(x, w)
    np.testing.assert_allclose(y, bf(x) @ bf(w), rtol=1e-5, atol=1e-5)
    want = (c @ bf(w).T, bf(x).T @ c)
    loss = lambda x, w, k: jnp.sum(layers.qdot(x, w, r, key=k) * c)
    n = 400
    draws = jax.jit(jax.vmap(lambda k: jax.grad(loss, (0, 1))(x, w, k)))(jax.random.split(jax.random.key(30), n))
    for d, t in zip(draws, want):
        mean, se = np.asarray(jnp.mean(d, 0)), np.asarray(jnp.std(d, 0)) / np.sqrt(n) + 1e-12
        assert np.max(np.abs(mean - t) / se) < 5.0
        assert not np.allclose(d[0], t, rtol=0.05)
