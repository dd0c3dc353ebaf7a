"""bf16 / fp16 nearest rounding by XLA's ReducePrecision (`formats.round_native`) is bit-identical to
the integer emulation (`formats.round_to_grid` on the format's FormatParams) on every value class,
and agrees with ml_dtypes' / numpy's own cast wherever the result is finite."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.extend import core as jcore

from scaling.numerics import formats, precision, quant

DTYPES = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16}


def _f32(bits) -> np.ndarray:
    return np.asarray(bits, np.uint32).view(np.float32)


def _bits(x) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


def _signed(mags: np.ndarray) -> np.ndarray:
    mags = np.asarray(mags, np.float32)
    return np.concatenate([mags, -mags])


def _random_normals(rng) -> np.ndarray:
    """float32 normals over the whole exponent range: every biased exponent 1..254, random mantissas."""
    e = np.repeat(np.arange(1, 255, dtype=np.uint32), 64)
    m = rng.integers(0, 1 << 23, e.size, dtype=np.uint32)
    s = rng.integers(0, 2, e.size, dtype=np.uint32)
    return _f32((s << 31) | (e << 23) | m)


def _grid_neighbourhood(name: str) -> np.ndarray:
    """Every finite value of the format, the midpoints between neighbours (ties: to even) and the
    float32 values just either side of each midpoint; subnormals and the top of the range included."""
    dt = DTYPES[name]
    codes = np.arange(0, 1 << 16, dtype=np.uint16).view(dt).astype(np.float32)
    grid = np.unique(codes[np.isfinite(codes) & (codes >= 0)]).astype(np.float64)
    mids = ((grid[:-1] + grid[1:]) / 2).astype(np.float32)  # exact: one more significant bit
    vals = np.concatenate([grid.astype(np.float32), mids,
                           np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(0))])
    return _signed(vals)


def _subnormal_range(name: str, rng) -> np.ndarray:
    """Values in and around the format's subnormal range (and float32's own subnormals)."""
    f = formats.get(name)
    lo, hi = np.log2(f.min_subnormal) - 3, np.log2(f.min_normal) + 1
    vals = [np.exp2(rng.uniform(lo, hi, 20000)).astype(np.float32),
            _f32(rng.integers(1, 1 << 23, 20000, dtype=np.uint32)),  # float32 subnormals
            _f32(np.arange(0x00800000 - 4096, 0x00800000 + 4096, dtype=np.uint32)),  # around 2^-126
            np.float32([f.min_subnormal / 2, f.min_subnormal * 0.75, f.min_subnormal * 1.5, f.min_normal,
                        f.min_normal - f.min_subnormal / 2, f.min_normal - f.min_subnormal / 4])]
    v = np.concatenate(vals)
    return _signed(np.concatenate([v, np.nextafter(v, np.float32(0)), np.nextafter(v, np.float32(np.inf))]))


def _saturating(name: str, rng) -> np.ndarray:
    """max, values rounding up past it (the tie at max + ulp/2 included), and far above it."""
    f = formats.get(name)
    top = np.float32(f.max)
    ulp = np.float32(2.0 ** (f.emax - f.mbits))
    tie = np.float32(top + ulp / 2)
    with np.errstate(over="ignore"):  # bf16's max + ulp is 2^128: float32 inf
        near = [top, np.nextafter(top, np.float32(np.inf)), np.nextafter(tie, np.float32(0)), tie,
                np.nextafter(tie, np.float32(np.inf)), np.float32(top + ulp), np.finfo(np.float32).max]
    far = np.exp2(rng.uniform(np.log2(f.max), 128, 5000)).astype(np.float32)
    return _signed(np.concatenate([np.float32(near), far[np.isfinite(far)]]))


SPECIALS = _f32([0x00000000, 0x80000000, 0x7F800000, 0xFF800000,  # ±0, ±inf
                 0x7FC00000, 0xFFC00000, 0x7FC00001, 0x7F800001, 0xFFC12345, 0x7FFFFFFF, 0xFF80F00D])  # NaNs


def _classes(name: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"normals": _random_normals(rng), "grid": _grid_neighbourhood(name),
            "subnormal": _subnormal_range(name, rng), "saturation": _saturating(name, rng), "specials": SPECIALS}


def _emulated(x: np.ndarray, name: str) -> np.ndarray:
    return np.asarray(formats.round_to_grid(jnp.asarray(x), formats.get(name).params(), "nearest"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_native_rounding_is_the_emulation_bit_for_bit(name):
    f = formats.get(name)
    native_jit = jax.jit(lambda v: formats.round_native(v, name))
    for cls, x in _classes(name).items():
        emu = _emulated(x, name)
        fast = np.asarray(formats.round_native(jnp.asarray(x), name))
        np.testing.assert_array_equal(_bits(fast), _bits(emu), err_msg=f"{name} {cls}")
        np.testing.assert_array_equal(_bits(native_jit(jnp.asarray(x))), _bits(emu), err_msg=f"{name} {cls} (jit)")
        # the public entry points take it: round_to_format by name or Format, quant with a static format
        np.testing.assert_array_equal(_bits(formats.round_to_format(jnp.asarray(x), f)), _bits(emu))
        spec = quant.QuantSpec(format=name, granularity="none")
        np.testing.assert_array_equal(_bits(quant.fake_quant(jnp.asarray(x), spec)), _bits(emu))
        # ml_dtypes / numpy as a third reference wherever the cast is finite (outside, we saturate)
        with np.errstate(over="ignore", invalid="ignore"):
            ref = x.astype(DTYPES[name]).astype(np.float32)
        finite = np.isfinite(x) & (np.abs(x) <= f.max)
        np.testing.assert_array_equal(_bits(fast[finite]), _bits(ref[finite]), err_msg=f"{name} {cls} vs cast")
        # the value classes are what they say they are
        if cls == "saturation":
            assert (np.abs(fast) == np.float32(f.max)).sum() > x.size // 2
        if cls == "subnormal":
            sub = (fast != 0) & (np.abs(fast) < f.min_normal)
            assert sub.sum() > 1000 and (fast == 0).sum() > 1000
        if cls == "specials":
            nan = np.isnan(x)
            np.testing.assert_array_equal(_bits(fast[nan]), _bits(x[nan]))  # NaN payloads kept
            np.testing.assert_array_equal(fast[~nan], np.float32([0, -0.0, f.max, -f.max]))
            assert np.signbit(fast[1]) and not np.signbit(fast[0])


@pytest.mark.parametrize("name", ["bf16", "fp16"])
@pytest.mark.parametrize("granularity", ["none", "tensor", "channel"])
def test_static_and_runtime_formats_quantise_alike(name, granularity):
    """quant with the spec's own (static) format takes the native rounding; with the same format as
    a runtime vector (how training passes it) the emulation: the same bits."""
    rng = np.random.default_rng(1)
    x = jnp.asarray((rng.standard_normal((16, 96)) * np.exp2(rng.uniform(-30, 30, (16, 96)))).astype(np.float32))
    spec = quant.QuantSpec(format=name, granularity=granularity)
    q_static = quant.quantize(x, spec)
    q_runtime = quant.quantize(x, spec, fmt_params=precision.format_vector(name))
    np.testing.assert_array_equal(_bits(q_static.values), _bits(q_runtime.values))
    np.testing.assert_array_equal(_bits(q_static.scale), _bits(q_runtime.scale))


def test_other_formats_and_roundings_keep_the_emulation():
    assert formats.native("bf16") and formats.native("e8m7") and formats.native(formats.float_format(5, 10))
    assert formats.native("fp8_e4m3") is None and formats.native("fp8_e5m2") is None
    assert formats.native(formats.float_format(5, 10, "fn")) is None and formats.native("int8") is None
    x = jnp.linspace(-3.0, 3.0, 101)
    key = jax.random.key(0)
    np.testing.assert_array_equal(formats.round_to_format(x, "bf16", "stochastic", key),
                                  formats.round_to_grid(x, formats.get("bf16").params(), "stochastic", key))


def _primitives(fn, *args) -> int:
    """Primitives in fn's jaxpr, nested jaxprs (jit, custom rules) expanded."""
    def count(j, c):
        for e in j.eqns:
            inner = [p for p in e.params.values() if isinstance(p, (jcore.ClosedJaxpr, jcore.Jaxpr))]
            if inner:
                for s in inner:
                    count(getattr(s, "jaxpr", s), c)
            else:
                c[e.primitive.name] += 1
        return c
    return sum(count(jax.make_jaxpr(fn)(*args).jaxpr, collections.Counter()).values())


def test_fake_quant_of_a_bf16_operand_is_a_few_ops():
    """Fake-quantising an operand to bf16 / fp16 (granularity none, nearest), counted in the jaxpr
    (the amax pass and the unit scale included, which XLA drops under jit when unused):

        before (the ~55-op integer emulation): bf16 61, fp16 61 primitives
        after  (ReducePrecision + saturating select; fp16 + its subnormal grid): bf16 9, fp16 15

    The runtime-format path (fmt_params, as training passes formats) still emulates."""
    x = jnp.ones((64, 128), jnp.float32)
    counts = {name: _primitives(lambda v, s=quant.QuantSpec(format=name, granularity="none"): quant.fake_quant(v, s), x)
              for name in ("bf16", "fp16")}
    assert counts["bf16"] <= 10, counts
    assert counts["fp16"] <= 16, counts
    emulated = _primitives(lambda v: quant.fake_quant(v, quant.QuantSpec(format="bf16", granularity="none"),
                                                      fmt_params=precision.format_vector("bf16")), x)
    assert emulated >= 50, emulated


def _emulated_structure(st: precision.RecipeStructure) -> precision.RecipeStructure:
    """The same recipe with every role on the runtime-format emulation (how training ran before
    RoleStructure.native): the reference the native program must match bit for bit."""
    import dataclasses

    roles = {r: dataclasses.replace(getattr(st, r), native=False) for r in precision.ROLES if getattr(st, r) is not None}
    return dataclasses.replace(st, **roles)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["bf16", "fp16"])
def test_a_bf16_recipes_gemm_trains_natively_with_the_same_bits(recipe):
    """Training passes formats as runtime vectors; an unscaled bf16 / fp16 role rounded to nearest is
    static in its RoleStructure (`native`), so the quantised GEMM rounds with ReducePrecision: the
    forward output and both gradients bit-identical to the emulation, in a fraction of the ops."""
    from scaling.numerics import gemm

    r = precision.get(recipe)
    st = r.structure()
    # unscaled roles are native; fp16's gradients carry a per-tensor scale (loss scaling): runtime format
    assert [getattr(st, role).native for role in ("weight", "activation", "grad")] == [True, True, recipe == "bf16"]
    assert not precision.get("fp8").structure().weight.native  # scaled: the runtime format stays
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((32, 64)) * np.exp2(rng.uniform(-20, 20, (32, 64))), jnp.float32)
    w = jnp.asarray(rng.standard_normal((64, 48)) * 0.1, jnp.float32)
    state = gemm.qdot_state(r, st)

    def loss(st_):
        def f(x_, w_):
            y, _, _ = gemm.qdot_apply(x_, w_, st_, state, measure=False)
            return jnp.sum(y * jnp.cos(y)), y
        return f

    emulated = _emulated_structure(st)
    (_, y_n), g_n = jax.value_and_grad(loss(st), argnums=(0, 1), has_aux=True)(x, w)
    (_, y_e), g_e = jax.value_and_grad(loss(emulated), argnums=(0, 1), has_aux=True)(x, w)
    np.testing.assert_array_equal(_bits(y_n), _bits(y_e))
    for a, b in zip(g_n, g_e):
        np.testing.assert_array_equal(_bits(a), _bits(b))
    grad = lambda st_: jax.grad(lambda x_, w_: loss(st_)(x_, w_)[0], argnums=(0, 1))  # noqa: E731
    native_ops, emulated_ops = _primitives(grad(st), x, w), _primitives(grad(emulated), x, w)
    # measured: bf16 (three native roles) and fp16 (two, gradients scaled) as counted here
    assert native_ops < emulated_ops * (0.5 if recipe == "bf16" else 0.7), (native_ops, emulated_ops)
