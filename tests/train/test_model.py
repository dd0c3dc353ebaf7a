"""The transformer: size ladder, parameter and FLOP counts, Smooth-SwiGLU, the train-step API."""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scaling.train import ladder, model
from scaling.errors import ConfigError
from scaling.numerics import precision

TINY = ladder.ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, vocab=64, seq_len=16)


def _tokens(cfg=TINY, batch=2, seed=0):
    return jax.random.randint(jax.random.key(seed), (batch, cfg.seq_len + 1), 0, cfg.vocab)


def test_size_ladder_formula():
    c1, c8 = ladder.config_for_size(1), ladder.config_for_size(8)
    assert (c1.d_model, c1.n_layers, c1.n_heads, c1.d_ff) == (32, 2, 2, 96)
    assert (c8.d_model, c8.n_layers, c8.n_heads, c8.d_ff) == (256, 6, 8, 704)
    ns = [ladder.param_counts(ladder.config_for_size(s))["non_embedding"] for s in range(1, 9)]
    assert all(a < b for a, b in zip(ns, ns[1:]))
    assert 20_000 <= ns[0] <= 30_000 and 4_000_000 <= ns[-1] <= 5_500_000
    # hand count, size 1: 2 layers · (4·32² + 3·32·96 + 2·32) + 32
    assert ns[0] == 2 * (4 * 1024 + 3 * 32 * 96 + 64) + 32 == 26_784


@pytest.mark.parametrize("cfg", [TINY, ladder.config_for_size(3, vocab=256, seq_len=32)])
def test_param_counts_match_the_param_leaves(cfg):
    abstract = nnx.eval_shape(lambda: model.Transformer(cfg, "fp8", rngs=nnx.Rngs(0)))
    params = nnx.state(abstract, nnx.Param)
    sizes = {jax.tree_util.keystr(path): math.prod(v.shape) for path, v in jax.tree_util.tree_leaves_with_path(params)}
    total = sum(sizes.values())
    embedding = sum(n for k, n in sizes.items() if "embed" in k or "head" in k)
    assert embedding == 2 * cfg.vocab * cfg.d_model
    counts = ladder.param_counts(cfg)
    assert counts == {"non_embedding": total - embedding, "total": total}
    kernels = [tuple(v.shape) for path, v in jax.tree_util.tree_leaves_with_path(params)
               if "blocks" in jax.tree_util.keystr(path) and "kernel" in jax.tree_util.keystr(path)]  # stacked by layer
    assert sorted(kernels) == sorted((cfg.n_layers, i, o) for i, o in ladder.projections(cfg))
    # quantisation state is not a parameter
    assert len(nnx.state(abstract, model.FormatVector)) > 0


def test_flops_per_token_hand_computed():
    cfg = ladder.ModelConfig(d_model=64, n_layers=2, n_heads=4, d_ff=192, vocab=256, seq_len=128)
    n_matmul = 2 * (4 * 64 * 64 + 3 * 64 * 192)  # 106,496
    head = 64 * 256  # 16,384
    attention = 12 * 2 * 128 * 64  # 196,608
    assert ladder.flops_per_token(cfg) == 6 * (n_matmul + head) + attention == 933_888


@nnx.jit
def _loss_and_grads(m, tokens):
    return nnx.value_and_grad(lambda mm: model.loss_fn(mm, tokens)[0])(m)


def test_smooth_swiglu_is_exact_at_full_precision():
    cfg_s = dataclasses.replace(TINY, smooth_swiglu=True)
    plain = model.Transformer(TINY, "fp32", rngs=nnx.Rngs(0))
    smooth = model.Transformer(cfg_s, "fp32", rngs=nnx.Rngs(0))
    tokens = _tokens()
    l0, g0 = _loss_and_grads(plain, tokens)
    l1, g1 = _loss_and_grads(smooth, tokens)
    # powers of two: (h·s)·(W/s) = h·W product by product
    assert float(l0) == float(l1)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)


def _plant_outlier_channel(m: model.Transformer, factor: float) -> None:
    """Scale one SwiGLU channel's up-projection column by `factor`: the down-projection input
    gets an outlier channel (as observed in long FP8 runs, Fishman et al. 2024)."""
    kernel = m.blocks.mlp.up_gate.kernel  # stacked: [layer, d_model, 2·d_ff]
    kernel[...] = kernel[...].at[:, :, 3].multiply(factor)


@nnx.jit
def _mlp_out(m, x_BxLxD):
    ctx = model.Context(m.structure, m.formats(), None, False)
    return model.layer(m.blocks, 0).mlp(x_BxLxD, ctx)[0]


# per-tensor INT8 activations; per-channel weights so the planted column keeps its own scale
INT8_ACTIVATIONS = {"name": "int8-act", "activation": "int8", "weight": {"format": "int8", "granularity": "channel"}}


def test_smooth_swiglu_tames_an_outlier_channel():
    # integers with max 127: the up-projection input is exact in per-tensor INT8, so the only
    # activation error left is the down-projection input's
    x_BxLxD = jax.random.randint(jax.random.key(2), (4, 16, TINY.d_model), -127, 128).astype(jnp.float32)
    x_BxLxD = x_BxLxD.at[0, 0, 0].set(127.0) / 64.0
    ref = model.Transformer(TINY, "fp32", rngs=nnx.Rngs(1))
    _plant_outlier_channel(ref, 300.0)
    want = _mlp_out(ref, x_BxLxD)
    errors = {}
    for smooth in (False, True):
        m = model.Transformer(dataclasses.replace(TINY, smooth_swiglu=smooth), INT8_ACTIVATIONS, rngs=nnx.Rngs(1))
        _plant_outlier_channel(m, 300.0)
        errors[smooth] = float(jnp.sqrt(jnp.mean(jnp.square(_mlp_out(m, x_BxLxD) - want))))
    # per-tensor INT8: the outlier channel's amax sets everyone's scale unless smoothed
    assert errors[True] < 0.5 * errors[False]


# Two layers (telemetry stacked by layer) and one jitted grad step for the tests below: the fp8 step of
# test_grad_step_api is the one test_the_projections_are_the_numerics_layer_... runs (~8 s of CPU to
# compile, once for both in a test process).
TWO_LAYERS = dataclasses.replace(TINY, n_layers=2)
_grad_step = nnx.jit(model.grad_step)


def test_grad_step_api():
    m = model.Transformer(TWO_LAYERS, "fp8", rngs=nnx.Rngs(0))
    tokens = _tokens()
    loss, grads, tel = _grad_step(m, tokens, jax.random.key(0))
    # grads: exactly the nnx.Param leaves, ready for nnx.Optimizer(model, tx, wrt=nnx.Param)
    params = nnx.state(m, nnx.Param)
    assert jax.tree.structure(grads) == jax.tree.structure(params)
    assert float(loss) == pytest.approx(math.log(TINY.vocab), abs=0.1)
    for role in ("weight", "activation", "grad"):
        assert set(tel[role]) == {"amax", "frac_saturated", "frac_underflow", "snr_db", "block_amax"}
        blocks = tel[role]["block_amax"]
        # per-block amaxes bracket within the per-tensor amax
        assert 0 <= float(blocks["min"]) <= float(blocks["p50"]) <= float(blocks["max"]) <= float(tel[role]["amax"]) * (1 + 1e-6)
        assert 15 < float(tel[role]["snr_db"]) < 40  # E4M3/E5M2: ~31 / ~25 dB
    assert tel["act_max"].shape == tel["swiglu_max"].shape == (TWO_LAYERS.n_layers,)
    # the fp32 recipe's grad_step is plain autodiff of loss_fn
    m32 = model.Transformer(TINY, "fp32", rngs=nnx.Rngs(0))
    loss32, grads32, tel32 = _grad_step(m32, tokens, jax.random.key(0))
    l_ref, g_ref = _loss_and_grads(m32, tokens)
    assert float(loss32) == float(l_ref)
    for a, b in zip(jax.tree.leaves(grads32), jax.tree.leaves(nnx.state(g_ref, nnx.Param))):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)
    assert set(tel32) == {"act_max", "swiglu_max"}


def test_the_projections_are_the_numerics_layer_and_report_its_telemetry():
    """One quantised dense layer: every projection of the transformer is scaling.numerics' QDense
    (the layer a model of one's own is built of), with its variable types; after a grad step
    `telemetry_by_layer` reads each field per layer, and the step's telemetry is those layers'."""
    from scaling.numerics import layers, telemetry_by_layer

    assert (model.QDense, model.FormatVector, model.AmaxHistory, model.GradSink) == (
        layers.QDense, layers.FormatVector, layers.AmaxHistory, layers.GradSink)
    cfg = TWO_LAYERS
    m = model.Transformer(cfg, "fp8", rngs=nnx.Rngs(0))
    dense = sorted("/".join(map(str, path)) for path, node in nnx.iter_graph(m) if isinstance(node, layers.QDense))
    assert dense == ["blocks/attn/out", "blocks/attn/qkv", "blocks/mlp/down", "blocks/mlp/up_gate", "head"]
    _, _, tel = _grad_step(m, _tokens(cfg), jax.random.key(0))
    by_layer = telemetry_by_layer(m)
    assert sorted(by_layer) == dense[:-1]  # the head is kept in high precision (high_precision_embed)
    for role in ("weight", "activation", "grad"):
        amax = [roles[role]["amax"] for roles in by_layer.values()]
        assert all(a.shape == (cfg.n_layers,) and bool(jnp.all(a > 0)) for a in amax), role
        assert float(jnp.max(jnp.stack(amax))) == float(tel[role]["amax"]), role


def test_recipe_switches_change_the_model():
    tokens = _tokens()
    base = float(nnx.jit(model.eval_loss)(model.Transformer(TINY, "fp8", rngs=nnx.Rngs(0)), tokens))
    variants = {
        "attention": {"base": "fp8", "attention": {"format": "fp4_e2m1"}},
        "embed": {"base": "fp8", "high_precision_embed": False},
        "sensitive": {"base": "fp8", "fp32_sensitive_ops": False},
    }
    for what, recipe in variants.items():
        m = model.Transformer(TINY, precision.get(recipe), rngs=nnx.Rngs(0))
        loss = float(nnx.jit(model.eval_loss)(m, tokens))
        assert loss != base and abs(loss - base) < 0.2, what
    head = model.Transformer(TINY, precision.get(variants["embed"]), rngs=nnx.Rngs(0)).head
    assert hasattr(head, "grad_sink")  # the output head runs the quantised matmul


@pytest.mark.slow
def test_blocks_kept_in_high_precision_run_the_kept_recipe():
    """high_precision_first / _last: those blocks compute what the bf16 recipe's blocks do (to float32 rounding),
    the others what the recipe's do (checked layer by layer), without unrolling the stack."""
    cfg = dataclasses.replace(TINY, n_layers=4)
    tokens = _tokens(cfg)[:, :-1]

    # one compile per model instead of one per operation; the telemetry only where it is read (the
    # first model's): the others' programs compile without it (their logits are the same either way)
    @functools.partial(nnx.jit, static_argnames="measure")
    def forward(m, measure=False):
        return m(tokens, update_state=False, measure=measure)

    recipe = precision.get({"base": "nvfp4", "high_precision_first": 1, "high_precision_last": 2})
    m = model.Transformer(cfg, recipe, rngs=nnx.Rngs(0))
    logits, aux = forward(m, measure=True)
    kept = precision.get("bf16")

    @jax.jit
    def layer_by_layer(blocks, embed, head, final_norm):
        x = jnp.take(embed, tokens, axis=0)
        for i in range(cfg.n_layers):
            r = kept if i in (0, 2, 3) else recipe
            x, _ = model.layer(blocks, i)(x, model.Context(r.structure(), r.formats(), None, False))
        return model.Context(precision.RecipeStructure(), {}, None, False).dense(head, final_norm(x))

    want = layer_by_layer(m.blocks, m.embed[...], m.head, m.final_norm)
    # the same function, not always the same bits: the scanned stack and this layer-by-layer loop may
    # block their dots differently (1-ulp differences seen on an AVX512-BF16 host, none on AVX2)
    np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-6)
    assert aux["telemetry"]["weight"][0].shape[0] == 1  # only the quantised block is measured
    for other in ("nvfp4", "bf16"):  # every block quantised, or none: 100x that tolerance away at least
        theirs = forward(model.Transformer(cfg, other, rngs=nnx.Rngs(0)))[0]
        assert np.abs(np.asarray(logits) - np.asarray(theirs)).max() > 1e-4, other
    # every block kept: the bf16 model
    all_kept = precision.get({"base": "nvfp4", "high_precision_last": cfg.n_layers})
    np.testing.assert_array_equal(forward(model.Transformer(cfg, all_kept, rngs=nnx.Rngs(0)))[0],
                                  forward(model.Transformer(cfg, "bf16", rngs=nnx.Rngs(0)))[0])
    with pytest.raises(ConfigError, match="high_precision_last"):
        model.Transformer(cfg, precision.get({"base": "nvfp4", "high_precision_first": 2, "high_precision_last": 3}),
                          rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="precision.high_precision"):
        precision.get({"base": "nvfp4", "high_precision_last": 1, "high_precision": "fp5"})


def test_sensitive_ops_round_to_bf16_with_an_op_a_gpu_compiler_keeps():
    """`fp32_sensitive_ops = false` rounds with lax.reduce_precision (XLA:GPU's simplifier removes a
    bf16 convert pair, not this): the same bits as a bf16 round trip on the host, on every kind of
    float32 (ties, subnormals, overflow to inf, NaN), and present in the traced step."""
    bits = np.random.default_rng(0).integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    special = np.array([0x3F808000, 0x3F818000, 0x00000001, 0x00008000, 0x80400000, 0x7F7FFFFF, 0x7F800000,
                        0xFF800000, 0x7FC00000], np.uint32)  # ties to even, subnormals, max, infs, NaN
    x = jnp.asarray(np.concatenate([bits, special]).view(np.float32))
    structure = precision.get({"base": "fp8", "fp32_sensitive_ops": False}).structure()
    got = np.asarray(jax.jit(lambda v: model._sensitive(v, structure))(x))
    with np.errstate(invalid="ignore"):  # NaN payloads cast
        want = np.asarray(x).astype(jnp.bfloat16).astype(np.float32)  # ml_dtypes on the host: nothing to simplify
    finite = ~np.isnan(want)
    np.testing.assert_array_equal(got.view(np.uint32)[finite], want.view(np.uint32)[finite])
    assert np.isnan(got[~finite]).all()
    tokens = _tokens()
    for sensitive in (True, False):
        m = model.Transformer(TINY, precision.get({"base": "fp8", "fp32_sensitive_ops": sensitive}), rngs=nnx.Rngs(0))
        graphdef, state = nnx.split(m)
        jaxpr = str(jax.make_jaxpr(lambda s: model.loss_fn(nnx.merge(graphdef, s), tokens)[0])(state))
        assert ("reduce_precision" in jaxpr) is not sensitive


def test_the_query_gradient_at_a_sequences_first_position_is_zero():
    """Why Figure 6's smallest per-block gradient amax sits at 0: the first query attends to one key,
    its softmax is 1 whatever the query, so dQ there is zero up to rounding; the other positions' are not."""
    q, k, v, w = (jax.random.normal(jax.random.key(i), (2, 96, 2, 16)) for i in range(4))
    dq = jax.grad(lambda q: jnp.sum(model._causal_attention(q, k, v) * w))(q)
    assert float(jnp.max(jnp.abs(dq[:, 0]))) <= 1e-6 * float(jnp.max(jnp.abs(dq)))
    assert float(jnp.min(jnp.max(jnp.abs(dq[:, 1:]), axis=(2, 3)))) > 1e-3 * float(jnp.max(jnp.abs(dq)))
