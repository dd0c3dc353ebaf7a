"""The quantised GEMMs (scaling.numerics.gemm): the three-GEMM matmul against a hand-written reference, the
fast path against the FP32 path, stochastic rounding and telemetry as quant defines them, one
compiled step per granularity, delayed-scaling state."""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scaling.numerics import gemm, layers, precision, quant
from scaling.train import ladder, model
from _draws import normal  # jax.random.normal's numbers, one compiled draw for every shape


def _operands(m=48, k=80, n=40, seed=0):
    kx, kw, kg = jax.random.split(jax.random.key(seed), 3)
    # heavy-tailed magnitudes so blocks get different scales and small values underflow
    x = normal(kx, (m, k)) * jnp.exp(normal(kx, (m, k)))
    w = 0.05 * normal(kw, (k, n))
    dy = 1e-3 * normal(kg, (m, n)) * jnp.exp(normal(kg, (m, n)))
    return x, w, dy


@jax.jit
def _vjp_jit(recipe_box, x, w, dy, key):
    y, pullback = jax.vjp(lambda a, b: layers.qdot(a, b, recipe_box.value, key=key), x, w)
    return (y, *pullback(dy))


def _vjp(recipe, x, w, dy, key=None):
    return _vjp_jit(gemm._Static(recipe), x, w, dy, key)


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


# fp8 alone in the fast subset (-m "not slow"): its one check that the three GEMMs are the reference's
@pytest.mark.parametrize("recipe", ["fp8", *(pytest.param(r, marks=pytest.mark.slow)
                                             for r in (SMALL_BLOCKS, "mxfp8", CHANNEL, "nvfp4"))])
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
    return jnp.dot(quant.fake_quant(a, spec_a), quant.fake_quant(b, spec_b).T, precision=jax.lax.Precision.HIGHEST)


@pytest.mark.slow
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
    exact = jnp.dot(quant.fake_quant(x, dataclasses.replace(r.activation, axis=0)).T, dy, precision=jax.lax.Precision.HIGHEST)
    assert float(jnp.abs(draws.mean(0) - exact).mean()) < 0.5 * float(jnp.abs(draws[0] - exact).mean())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bf16", "fp8-blockwise", "mxfp4"])
def test_fast_path_agrees_with_fp32_path(name):
    # model-sized blocks (128) and stochastic gradient rounding (same keys on both paths)
    x, w, dy = _operands(m=256, k=320, n=192, seed=2)
    key = jax.random.key(5)
    slow = _vjp(dataclasses.replace(precision.get(name), fast_path=False), x, w, dy, key)
    fast = _vjp(dataclasses.replace(precision.get(name), fast_path=True), x, w, dy, key)
    for s, f in zip(slow, fast):
        _close(f, s)


def test_batched_inputs_flatten():
    x, w, _ = _operands(m=48)
    y3 = layers.qdot(x.reshape(4, 12, -1), w, "fp8")
    np.testing.assert_array_equal(y3.reshape(48, -1), layers.qdot(x, w, "fp8"))


# ---------------------------------------------------------------------------------------------
# Operands are quant's: stochastic rounding and telemetry as scaling.numerics.quant defines them
# ---------------------------------------------------------------------------------------------

OPERAND_SPECS = [
    quant.QuantSpec("fp8_e4m3"),
    quant.QuantSpec("int8", "channel"),
    quant.QuantSpec("fp8_e4m3", "block", block=16),
    quant.QuantSpec("fp8_e4m3", "block2d", block=16),
    quant.QuantSpec("fp4_e2m1", rounding="stochastic"),
    quant.QuantSpec("fp4_e2m1", "mx", rounding="stochastic"),
    quant.QuantSpec("fp4_e2m1", "nvfp4", rounding="stochastic"),
]


@pytest.mark.slow
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("spec", OPERAND_SPECS, ids=lambda s: f"{s.granularity}-{s.rounding}")
def test_operands_and_their_telemetry_are_quants(spec, axis):
    """What a training step multiplies and reports for an operand is quant.quantize and
    quant.telemetry of it along the GEMM's reduction axis, stochastic rounding included (the same
    key draws the same numbers)."""
    x, _, _ = _operands(m=200, k=80)  # <= 256 rows: nothing sampled; 80 = 2.5 blocks of 32
    s = precision.role_structure(spec)
    fmt = precision.format_vector(spec.format)
    key = jax.random.key(4)
    @jax.jit
    def operand(x, key):
        op = gemm.quantise_operand(x, s, fmt, axis, key=key, measure=True)
        return op.q.values, op.q.scale, op.telemetry

    values, scale, telemetry = operand(x, key)
    along = dataclasses.replace(spec, axis=axis)
    q = quant.quantize(x, along, key=key if spec.rounding == "stochastic" else None)
    np.testing.assert_array_equal(values, q.values)
    np.testing.assert_array_equal(scale, q.scale)
    want = quant.telemetry(x, q, along)
    got = dict(zip(quant.TELEMETRY_FIELDS, np.asarray(telemetry)))
    for field in quant.TELEMETRY_FIELDS:  # the SNR sums may be reduced in another order
        np.testing.assert_allclose(got[field], want[field], rtol=1e-6 if field == "snr_db" else 0, err_msg=field)
    if spec.rounding == "stochastic":  # and without a key (evaluation) the role rounds to nearest
        nearest = gemm.quantise_operand(x, s, fmt, axis)
        np.testing.assert_array_equal(nearest.q.values, quant.quantize(x, dataclasses.replace(along, rounding="nearest")).values)


@pytest.mark.slow
def test_training_telemetry_samples_the_rows_of_long_operands():
    """Operands quantised along their columns (activations, gradients) are measured on every
    (M // 256)-th row, with the whole tensor's amax; weights (along rows) on all of them."""
    x, _, _ = _operands(m=1024, k=64)
    spec = quant.QuantSpec("fp8_e4m3", "block", block=32, axis=1)
    s, fmt = precision.role_structure(spec), precision.format_vector("fp8_e4m3")
    # each side jitted (one program, not an eager dispatch and compile per operation), apart
    measured = jax.jit(lambda t, axis: gemm.quantise_operand(t, s, fmt, axis, measure=True).telemetry, static_argnums=1)
    got = np.asarray(measured(x, 1))

    @jax.jit
    def sampled_reference(x):
        q = quant.quantize(x, spec)
        scale = quant.expand_scale(q.scale, spec, x.shape)
        return quant.telemetry_vector(x[::4], q.values[::4] * scale[::4], scale[::4], q.amax, 448.0, 1)

    np.testing.assert_allclose(got, np.asarray(sampled_reference(x)), rtol=1e-6)
    assert got[0] == float(jnp.abs(x).max())
    w = x.T  # K x M along axis 0: every row
    spec0 = dataclasses.replace(spec, axis=0)
    got_w = np.asarray(measured(w, 0))
    want_w = jax.jit(lambda w: quant.telemetry(w, quant.quantize(w, spec0), spec0))(w)
    np.testing.assert_allclose(got_w, [want_w[f] for f in quant.TELEMETRY_FIELDS], rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# One compiled step per granularity, formats as runtime values; delayed scaling state
# ---------------------------------------------------------------------------------------------

TINY = ladder.ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, vocab=64, seq_len=16)

# One jitted grad step per traced backend, shared by the tests below: `measure` a traced bool (the
# trainer's CPU step), so the fp8 step of test_formats_share_one_compiled_step is the one
# test_grad_step_reports_block_amax_per_role reads, and the fp8-delayed step of
# test_delayed_scaling_histories_evolve the one test_telemetry_is_skipped_at_run_time_... runs (a
# TINY step compiles for ~9 s of CPU: each shared one is compiled once per test process, not per test).
# _TRACES[backend] lists the recipe structure of each trace of that backend's step.
_STEPS: dict = {}
_TRACES: dict = {}


def _step(backend=None):
    """The shared jitted `model.grad_step(m, tokens, key, measure)` for programs traced as on `backend`
    (None: the backend the tests run on); the caller patches jax.default_backend for another."""
    backend = backend or jax.default_backend()
    if backend not in _STEPS:
        traces = _TRACES[backend] = []

        @nnx.jit
        def step(m, tokens, key, measure):
            traces.append(m.structure)
            return model.grad_step(m, tokens, key, measure)

        _STEPS[backend] = step
    return _STEPS[backend]


@pytest.mark.slow
def test_formats_share_one_compiled_step():
    step, traces = _step(), _TRACES[jax.default_backend()]
    tokens = jax.random.randint(jax.random.key(0), (2, TINY.seq_len + 1), 0, TINY.vocab)
    losses, structures = {}, set()
    for name in ("fp8", "fp6", "int8", "e3m4"):
        m = model.Transformer(TINY, name, rngs=nnx.Rngs(0))
        structures.add(m.structure)
        losses[name] = float(step(m, tokens, jax.random.key(1), jnp.asarray(True))[0])
    # one trace for the four: one structure, traced once (here, or where an earlier test ran fp8's step)
    assert len(structures) == 1 and traces.count(m.structure) == 1
    # the format is really applied at run time: each recipe gives a different loss
    assert len(set(losses.values())) == 4


@pytest.mark.slow
def test_delayed_scaling_histories_evolve():
    m = model.Transformer(TINY, "fp8-delayed", rngs=nnx.Rngs(0))
    step = lambda m, tokens, key: _step()(m, tokens, key, jnp.asarray(True))  # noqa: E731
    qkv = m.blocks.attn.qkv  # every layer's, stacked; [0] is the first layer's
    H = precision.get("fp8-delayed").activation.amax_history
    assert qkv.hist_activation[...].shape == (TINY.n_layers, H) and float(jnp.abs(qkv.hist_activation[...]).max()) == 0
    tokens = jax.random.randint(jax.random.key(0), (2, TINY.seq_len + 1), 0, TINY.vocab)
    _, _, tel1 = step(m, tokens, jax.random.key(1))
    h1_a, h1_w, h1_g = qkv.hist_activation[...][0], qkv.hist_weight[...][0], qkv.grad_sink[...][0, gemm.TELEMETRY_SIZE:]
    assert float(h1_a[0]) == pytest.approx(float(tel1["activation"]["amax"]), rel=0.5)
    assert float(h1_a[0]) > 0 and float(h1_w[0]) > 0 and float(h1_g[0]) > 0
    assert float(jnp.abs(h1_a[1:]).max()) == 0
    tokens2 = jax.random.randint(jax.random.key(7), (2, TINY.seq_len + 1), 0, TINY.vocab)
    step(m, tokens2, jax.random.key(2))
    h2_a, h2_g = qkv.hist_activation[...][0], qkv.grad_sink[...][0, gemm.TELEMETRY_SIZE:]
    assert float(h2_a[1]) == float(h1_a[0]) and float(h2_g[1]) == float(h1_g[0])
    assert float(h2_a[0]) != float(h1_a[0])
    # evaluation reads but never writes the histories
    nnx.jit(model.eval_loss)(m, tokens)
    np.testing.assert_array_equal(qkv.hist_activation[...][0], h2_a)


@pytest.mark.slow
def test_grad_step_reports_block_amax_per_role():
    m = model.Transformer(TINY, "fp8", rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(0), (2, TINY.seq_len + 1), 0, TINY.vocab)
    _, _, tel = _step()(m, tokens, jax.random.key(1), jnp.asarray(True))
    for role in ("weight", "activation", "grad"):
        b = {k: float(v) for k, v in tel[role]["block_amax"].items()}
        assert 0.0 <= b["min"] <= b["p50"] <= b["max"] <= float(tel[role]["amax"]) * (1 + 1e-6), (role, b)
        assert b["min"] < b["max"]

@pytest.mark.slow
@pytest.mark.parametrize("backend", ["cpu", "gpu"])
@pytest.mark.parametrize("name", ["fp8-delayed", "mxfp4"])
def test_telemetry_is_skipped_at_run_time_without_changing_the_step(name, backend, monkeypatch):
    """`measure` is a runtime bool of one compiled step: false gives NaN telemetry and the very
    same loss, gradients and amax histories (delayed scaling, stochastic rounding) as true. On a
    CPU the telemetry is a skipped branch, on an accelerator a masked one (traced here as if)."""
    real = jax.default_backend()  # "cpu": the backend the test runs on, which is a GPU on a GPU machine
    backend = real if backend == "cpu" else backend
    monkeypatch.setattr(gemm.jax, "default_backend", lambda: backend)
    recipe = precision.get(name)
    x, w, _ = _operands()
    jaxpr = str(jax.make_jaxpr(lambda m: gemm.qdot_apply(x, w, recipe.structure(), gemm.qdot_state(recipe), None,
                                                         None, m)[1])(jnp.asarray(True)))
    assert ("cond[" in jaxpr) == (backend == "cpu")
    tokens = jax.random.randint(jax.random.key(0), (2, TINY.seq_len + 1), 0, TINY.vocab)
    step = _step(backend)  # traced while jax.default_backend() says `backend`
    out = {}
    for measure in (True, False):
        m = model.Transformer(TINY, name, rngs=nnx.Rngs(0))
        loss, grads, tel = step(m, tokens, jax.random.key(1), jnp.asarray(measure))
        sink_history = jax.tree.map(lambda v: v[..., gemm.TELEMETRY_SIZE:], nnx.state(m, model.GradSink))
        out[measure] = (loss, grads, nnx.state(m, model.AmaxHistory), sink_history, tel)
    assert _TRACES[backend].count(m.structure) == 1  # both calls ran one program (traced here or earlier)
    on, off = out[True], out[False]
    np.testing.assert_array_equal(on[0], off[0])
    for a, b in zip(on[1:4], off[1:4]):
        jax.tree.map(np.testing.assert_array_equal, a, b)
    if name == "fp8-delayed":
        assert float(jnp.max(jax.tree.leaves(on[2])[0])) > 0 and float(jnp.max(jax.tree.leaves(on[3])[0])) > 0
    for role in ("weight", "activation", "grad"):
        assert np.isfinite(float(on[4][role]["amax"])) and np.isfinite(float(on[4][role]["snr_db"]))
        assert all(np.isnan(float(v)) for v in jax.tree.leaves(off[4][role])), role


def test_the_gemm_path_follows_the_hardware_unless_the_recipe_says(monkeypatch):
    from scaling import host
    from scaling.numerics import gemm

    recipe = precision.get("fp8")
    assert recipe.fast_path is None  # auto
    for native in (True, False):
        monkeypatch.setattr(host, "native_bf16", lambda native=native: native)
        assert gemm.uses_bf16_dots(recipe) is native
        assert gemm.uses_bf16_dots(dataclasses.replace(recipe, fast_path=False)) is False
        assert gemm.uses_bf16_dots(dataclasses.replace(recipe, fast_path=True)) is True


def _dot_precisions(jaxpr) -> list[tuple[str, object]]:
    """(operand dtype, precision) of every dot_general in a jaxpr, nested ones included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append((str(eqn.invars[0].aval.dtype), eqn.params["precision"]))
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's Jaxpr
                if hasattr(sub, "eqns"):
                    found += _dot_precisions(sub)
    return found


@pytest.mark.parametrize("fast", [True, False])
def test_f32_dots_carry_the_recipes_precision_and_bf16_dots_none(fast):
    """All three GEMMs: float32 operands at the recipe's precision (HIGHEST, or DEFAULT for tf32),
    the fast path's bf16 operands without one (their products are exact either way)."""
    x, w, g = _operands()
    for dots, want in (("fp32", jax.lax.Precision.HIGHEST), ("tf32", jax.lax.Precision.DEFAULT)):
        recipe = precision.get({"base": "mxfp8", "fast_path": fast, "dot_precision": dots})
        jaxpr = jax.make_jaxpr(lambda x, w: jax.vjp(lambda x, w: layers.qdot(x, w, recipe), x, w)[1](g))(x, w)
        found = _dot_precisions(jaxpr.jaxpr)
        assert len(found) == 3, found
        for dtype, p in found:
            assert p == ((None if dtype == "bfloat16" else (want, want))), (dots, dtype, p)
        assert {d for d, _ in found} == ({"bfloat16"} if fast else {"float32"})


def test_a_host_side_measure_traces_no_telemetry_where_false():
    """`measure` as a Python bool (the trainer's choice off a CPU): false leaves the telemetry out of
    the program, not masked or branched, with the same product and histories."""
    recipe = precision.get("fp8-delayed")
    x, w, _ = _operands()
    run = lambda m: gemm.qdot_apply(x, w, recipe.structure(), gemm.qdot_state(recipe), None, None, m)
    size = lambda m: len(str(jax.make_jaxpr(lambda: run(m))()).splitlines())
    assert size(False) < size(True) and "cond[" not in str(jax.make_jaxpr(lambda: run(False))())
    (y_off, tel_off, hist_off), (y_on, tel_on, hist_on) = run(False), run(jnp.asarray(True))
    np.testing.assert_array_equal(y_off, y_on)
    jax.tree.map(np.testing.assert_array_equal, hist_off, hist_on)
    assert all(np.isnan(np.asarray(v)).all() for v in tel_off.values())
    assert all(np.isfinite(np.asarray(v)).all() for v in tel_on.values())


@pytest.mark.slow
@pytest.mark.parametrize("name, kept_bytes", [("bf16", 2), ("fp8", 2), ("fp16", 4), ("mxfp8", 4)])
def test_the_backward_keeps_one_copy_of_each_operand_in_bfloat16_where_exact(name, kept_bytes):
    """What autodiff keeps of X (M×K) and W (K×N) for the backward, in bytes per element: a
    quantisation the backward reuses (no scale, or one per tensor) is kept once, as its grid values,
    in bfloat16 where the grid is exact there (bf16, fp8: 2 bytes), else in float32 (fp16: 4);
    operands quantised again along the other axis (mxfp8) keep X and W themselves (float32). Before:
    X and W were kept beside their quantised copies, all in float32 (8 bytes for bf16 and fp8)."""
    recipe = precision.get(name)
    structure = recipe.structure()
    state = gemm.qdot_state(recipe, structure)
    m, k, n = 96, 64, 80
    x, w, _ = _operands(m, k, n)
    # the pullback's residuals as the jitted step keeps them, abstract (shapes and dtypes, nothing computed)
    pullback = jax.eval_shape(lambda x, w: jax.vjp(lambda a, b: gemm.qdot_apply(a, b, structure, state), x, w)[1], x, w)
    big = [leaf for leaf in jax.tree.leaves(pullback) if math.prod(leaf.shape) >= min(m, n) * k]
    assert sorted(leaf.shape for leaf in big) == [(k, n), (m, k)]
    assert sum(math.prod(leaf.shape) * leaf.dtype.itemsize for leaf in big) == kept_bytes * (m * k + k * n)
