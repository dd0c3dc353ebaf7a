"""formats: registry values, and bit-exact rounding against ml_dtypes and an independent reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from scaling.numerics import formats
from scaling.errors import ConfigError

# (name, ml_dtypes dtype, Format): every format ml_dtypes can cast to
ML_DTYPES = [
    ("fp8_e4m3", ml_dtypes.float8_e4m3fn, formats.get("fp8_e4m3")),
    ("fp8_e5m2", ml_dtypes.float8_e5m2, formats.get("fp8_e5m2")),
    ("fp6_e2m3", ml_dtypes.float6_e2m3fn, formats.get("fp6_e2m3")),
    ("fp6_e3m2", ml_dtypes.float6_e3m2fn, formats.get("fp6_e3m2")),
    ("fp4_e2m1", ml_dtypes.float4_e2m1fn, formats.get("fp4_e2m1")),
    ("bf16", ml_dtypes.bfloat16, formats.get("bf16")),
    ("fp16", np.float16, formats.get("fp16")),
    # ml_dtypes' E3M4 is IEEE-like (max 15.5); our default 'e3m4' is 'fn' (max 30), see formats doc
    ("e3m4_ieee", ml_dtypes.float8_e3m4, formats.float_format(3, 4, "ieee")),
]

# params traced (one compile per input shape); the division by a traced 1.0 puts the rounding
# inside a fusion with other arithmetic, where XLA's simplifier could otherwise break tricks
_round_jit = jax.jit(lambda x, params, one=1.0: formats.round_to_grid(x / one, params))


def _as_bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.int32)


def _all_values(dtype) -> np.ndarray:
    """Every finite value of a <= 16-bit ml_dtypes type, as float32, sorted and unique."""
    nbits = np.dtype(dtype).itemsize * 8
    codes = np.arange(2**nbits, dtype=np.uint16 if nbits == 16 else np.uint8).view(dtype)
    if dtype in (ml_dtypes.float6_e2m3fn, ml_dtypes.float6_e3m2fn, ml_dtypes.float4_e2m1fn):
        codes = codes[: 2 ** (1 + {ml_dtypes.float4_e2m1fn: 3}.get(dtype, 5))]  # sub-byte: low codes only
    v = codes.astype(np.float32)
    return np.unique(v[np.isfinite(v)])


def _inputs(fmt: formats.Format, dtype, rng: np.random.Generator) -> np.ndarray:
    grid = _all_values(dtype)
    mids = ((grid[1:].astype(np.float64) + grid[:-1]) / 2).astype(np.float32)  # exact in float32
    near = np.concatenate([np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))])
    # every binade of float32 (subnormals to inf), a dense log sweep: bit patterns with a prime stride
    sweep = np.arange(0, 0x7F800001, 4099, dtype=np.int64).astype(np.int32).view(np.float32)
    top = min(1.5 * fmt.max, float(np.finfo(np.float32).max))
    lin = np.linspace(-top, top, 20001, dtype=np.float64).astype(np.float32)
    # >= 1e6 random values: normal samples at scales across and beyond the format's range
    lo, hi = fmt.emin - fmt.mbits - 4, min(fmt.emax + 4, 126)
    rand = (rng.standard_normal(1_000_000) * np.exp2(rng.uniform(lo, hi, 1_000_000))).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, fmt.max, np.float32(fmt.max) * 1.0001, 1e-45, 1e-40], np.float32)
    pos = np.concatenate([grid, mids, near, sweep, special])
    return np.concatenate([pos, -pos, lin, rand]).astype(np.float32)


@pytest.mark.parametrize("name,dtype,fmt", ML_DTYPES, ids=[m[0] for m in ML_DTYPES])
def test_bit_exact_vs_ml_dtypes(name, dtype, fmt):
    rng = np.random.default_rng(0)
    x = _inputs(fmt, dtype, rng)
    assert x.size > 1_000_000
    ours = np.asarray(_round_jit(x, fmt.params()))
    ref = np.clip(x, -fmt.max, fmt.max).astype(dtype).astype(np.float32)
    bad = _as_bits(ours) != _as_bits(ref)  # compares the sign of zero too
    assert not bad.any(), f"{name}: {bad.sum()} mismatches, e.g. x={x[bad][:5]} ours={ours[bad][:5]} ref={ref[bad][:5]}"
    # the non-jitted, static-format path agrees
    np.testing.assert_array_equal(_as_bits(formats.round_to_format(x[:5000], fmt)), _as_bits(ours[:5000]))


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2", "fp6_e2m3", "fp4_e2m1", "bf16", "fp16", "fp32", "int8"])
def test_nan_signed_zero_and_infinity(name):
    fmt = formats.get(name)
    x = np.array([np.nan, -np.nan, 0.0, -0.0, np.inf, -np.inf, -1e-30], np.float32)
    y = np.asarray(formats.round_to_format(x, fmt))
    assert np.isnan(y[:2]).all()
    assert y[2] == 0 and not np.signbit(y[2])
    assert y[3] == 0 and np.signbit(y[3])
    assert y[4] == fmt.max and y[5] == -fmt.max  # saturating, never inf
    assert np.signbit(y[6])  # a negative value flushed to zero stays -0 (or a tiny negative)


def _reference_round(x: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Nearest value of the non-negative code-ordered grid (ties to the even code), saturating."""
    g = np.asarray(grid, np.float64)
    mag = np.minimum(np.abs(x.astype(np.float64)), g[-1])
    i = np.clip(np.searchsorted(g, mag), 1, len(g) - 1)
    lo, hi = g[i - 1], g[i]
    up = (mag - lo > hi - mag) | ((mag - lo == hi - mag) & ((i % 2) == 0))
    out = np.where(up, hi, lo)
    out = np.where(mag <= g[0], g[0], out)
    return (np.sign(x) * out).astype(np.float32)


@pytest.mark.parametrize("name", ["e3m4", "e2m5", "e3m3", "e1m2", "e4m2", "e5m6", "e6m5", "e3m0", "int8", "int4", "int2"])
def test_generic_formats_vs_reference(name):
    """Formats ml_dtypes lacks, against a float64 nearest-neighbour search over the enumerated grid."""
    fmt = formats.get(name)
    grid = np.array(formats.representable(fmt))
    rng = np.random.default_rng(1)
    mids = (grid[1:] + grid[:-1]) / 2
    rand = rng.standard_normal(200_000) * np.exp2(rng.uniform(-fmt.mbits - 3 + min(fmt.emin, 0), fmt.emax + 3, 200_000))
    x = np.concatenate([grid, mids, -mids, rand]).astype(np.float32)
    ours = np.asarray(_round_jit(x, fmt.params()))
    np.testing.assert_array_equal(ours, _reference_round(x, grid))


def test_registry_values():
    table = {  # name: (kind, ebits, mbits, bits, max, min_normal, min_subnormal, has_inf, emax, emin)
        "fp32": ("float", 8, 23, 32, float(np.finfo(np.float32).max), 2.0**-126, 2.0**-149, True, 127, -126),
        "bf16": ("float", 8, 7, 16, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max), 2.0**-126, 2.0**-133, True, 127, -126),
        "fp16": ("float", 5, 10, 16, 65504.0, 2.0**-14, 2.0**-24, True, 15, -14),
        "fp8_e4m3": ("float", 4, 3, 8, 448.0, 2.0**-6, 2.0**-9, False, 8, -6),
        "fp8_e5m2": ("float", 5, 2, 8, 57344.0, 2.0**-14, 2.0**-16, True, 15, -14),
        "fp6_e2m3": ("float", 2, 3, 6, 7.5, 1.0, 0.125, False, 2, 0),
        "fp6_e3m2": ("float", 3, 2, 6, 28.0, 0.25, 0.0625, False, 4, -2),
        "fp4_e2m1": ("float", 2, 1, 4, 6.0, 1.0, 0.5, False, 2, 0),
        "e3m4": ("float", 3, 4, 8, 30.0, 0.25, 2.0**-6, False, 4, -2),
        "e5m6": ("float", 5, 6, 12, (2 - 2**-6) * 2.0**15, 2.0**-14, 2.0**-20, True, 15, -14),
        "int8": ("int", 0, 7, 8, 127.0, 1.0, 1.0, False, 6, 0),
        "int4": ("int", 0, 3, 4, 7.0, 1.0, 1.0, False, 2, 0),
    }
    for name, want in table.items():
        f = formats.get(name)
        got = (f.kind, f.ebits, f.mbits, f.bits, f.max, f.min_normal, f.min_subnormal, f.has_inf, f.emax, f.emin)
        assert got == want, name
    for dtype_name, dtype, fmt in ML_DTYPES:
        fi = ml_dtypes.finfo(dtype)
        assert (fmt.max, fmt.min_normal, fmt.min_subnormal) == (float(fi.max), float(fi.smallest_normal),
                                                               float(fi.smallest_subnormal)), dtype_name
        if fmt.bits <= 16:
            assert formats.representable(fmt) == [float(v) for v in _all_values(dtype) if v >= 0], dtype_name


def test_aliases_and_errors():
    assert formats.get("e4m3") == formats.get("fp8_e4m3") == formats.get("float8_e4m3fn")
    assert formats.get("E5M2") == formats.get("fp8_e5m2")
    assert formats.get("e2m1") == formats.get("fp4_e2m1")
    assert formats.get("e8m7") == formats.get("bfloat16") == formats.get("bf16")
    assert formats.get("e5m10").name == "fp16"
    f = formats.get("int4")
    assert formats.get(f) is f
    for bad in ["fp7", "e9m2", "e0m3", "int1", "int64", "e4m3x", ""]:
        with pytest.raises(ConfigError) as err:
            formats.get(bad)
        msg = str(err.value)
        assert msg.startswith("format: got") and "fp8_e4m3" in msg and "eXmY" in msg and "intK" in msg
        assert "\n" not in msg


def test_traced_params_do_not_retrace():
    traces = []

    def f(x, params):
        traces.append(1)
        return formats.round_to_grid(x, params)

    jf = jax.jit(f)
    x = np.random.default_rng(2).standard_normal(4096).astype(np.float32) * 20
    for name in ["fp8_e4m3", "fp8_e5m2", "fp6_e2m3", "fp4_e2m1", "int8", "e3m4", "bf16", "fp32"]:
        got = np.asarray(jf(x, formats.get(name).params()))
        np.testing.assert_array_equal(_as_bits(got), _as_bits(formats.round_to_format(x, name)))
    assert len(traces) == 1
    # a float32 vector [mbits, emin, emax, max] works the same way
    vec = jnp.array(formats.get("fp6_e3m2").params())
    np.testing.assert_array_equal(np.asarray(formats.round_to_format(x, vec)),
                                  np.asarray(formats.round_to_format(x, "fp6_e3m2")))


def test_vmap_over_formats_and_values():
    names = ["fp8_e4m3", "fp4_e2m1", "int4"]
    params = jax.tree.map(lambda *a: jnp.stack(a), *[formats.get(n).params() for n in names])
    x = jnp.linspace(-10, 10, 257, dtype=jnp.float32)
    out = jax.vmap(lambda p: formats.round_to_grid(x, p))(params)
    for i, n in enumerate(names):
        np.testing.assert_array_equal(np.asarray(out[i]), np.asarray(formats.round_to_format(x, n)))
    rows = jax.vmap(lambda r: formats.round_to_format(r, "fp6_e2m3"))(x.reshape(1, -1).repeat(3, 0))
    np.testing.assert_array_equal(np.asarray(rows[2]), np.asarray(formats.round_to_format(x, "fp6_e2m3")))


@pytest.mark.parametrize("name", ["fp4_e2m1", "fp8_e4m3", "fp6_e3m2", "bf16", "int4"])
def test_stochastic_rounding_neighbours_and_unbiased(name):
    fmt = formats.get(name)
    grid = np.array(formats.representable(fmt))
    rng = np.random.default_rng(3)
    # values over the whole range, subnormals included, one draw each
    x = (rng.uniform(-1, 1, 50_000) * fmt.max * rng.choice([1.0, 1e-2, 1e-4], 50_000)).astype(np.float32)
    if name == "bf16":
        x = (rng.standard_normal(50_000) * np.exp2(rng.uniform(-135, 20, 50_000))).astype(np.float32)
    y = np.asarray(formats.round_to_format(x, fmt, "stochastic", jax.random.key(0)))
    if fmt.bits <= 8:
        mag = np.abs(x.astype(np.float64))
        i = np.clip(np.searchsorted(grid, mag, side="right"), 1, len(grid) - 1)
        lo, hi = grid[i - 1], np.where(mag >= grid[-1], grid[-1], grid[i])
        assert np.all((np.abs(y) == lo) | (np.abs(y) == hi))
    else:  # bf16: the two neighbours are the truncation of the float32 bits and the next code
        trunc = (np.abs(x).view(np.int32) & ~0xFFFF).view(np.float32)
        up = (trunc.view(np.int32) + 0x10000).view(np.float32)
        assert np.all((np.abs(y) == trunc) | (np.abs(y) == up))
    assert np.all((np.signbit(y) == np.signbit(x)) | (y == 0))
    # unbiased: the mean of many draws of fixed values equals the values (5 standard errors)
    probes = {"fp4_e2m1": [1.3, -2.2, 0.1, 5.9], "fp8_e4m3": [1.06, 0.0007, -300.0, 0.017],
              "fp6_e3m2": [0.07, 3.3, 27.0, -0.01], "bf16": [1.001, 3e-39, -7.77e10, 1e-40],
              "int4": [2.3, -0.4, 6.5, 0.05]}[name]
    n = 100_000
    xs = np.repeat(np.array(probes, np.float32)[:, None], n, 1)
    ys = np.asarray(formats.round_to_format(xs, fmt, "stochastic", jax.random.key(1)), np.float64)
    for p, row in zip(probes, ys):
        vals = np.unique(row)
        assert len(vals) <= 2
        spread = vals.max() - vals.min()
        se = spread / 2 / np.sqrt(n) if spread > 0 else 0.0
        assert abs(row.mean() - np.float32(p)) <= 5 * se + 1e-12 * abs(p), (name, p, row.mean())


def test_stochastic_rounding_exact_values_saturation_and_key():
    grid = np.array(formats.representable("fp6_e2m3"), np.float32)
    x = np.concatenate([grid, -grid, [8.0, 100.0, -1e9, np.nan]]).astype(np.float32)
    y = np.asarray(formats.round_to_format(x, "fp6_e2m3", "stochastic", jax.random.key(5)))
    np.testing.assert_array_equal(y[: 2 * len(grid)], x[: 2 * len(grid)])  # representable: unchanged
    np.testing.assert_array_equal(y[-4:-1], [7.5, 7.5, -7.5])
    assert np.isnan(y[-1])
    with pytest.raises(ConfigError, match="key"):
        formats.round_to_format(x, "fp6_e2m3", "stochastic")
    with pytest.raises(ConfigError, match="rounding"):
        formats.round_to_format(x, "fp6_e2m3", "truncate")


def test_random_bits_for_stochastic_rounding():
    """formats.random_bits (the one RNG of stochastic rounding): deterministic per key, different
    across keys, uniform in the top bits that rounding uses, and uncorrelated between neighbours."""
    n = 1 << 16
    a = np.asarray(formats.random_bits(jax.random.key(0), (n,)))
    assert a.dtype == np.uint32
    np.testing.assert_array_equal(a, np.asarray(formats.random_bits(jax.random.key(0), (n,))))
    b = np.asarray(formats.random_bits(jax.random.key(1), (n,)))
    assert (a == b).mean() < 1e-3
    counts = np.bincount(a >> 24, minlength=256)  # chi-square with 255 degrees of freedom
    assert ((counts - n / 256) ** 2 / (n / 256)).sum() < 350
    u = (a >> 8).astype(np.float64) / 2**24
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.02
    assert abs(np.corrcoef(u, (b >> 8).astype(np.float64) / 2**24)[0, 1]) < 0.02
    # round_to_grid draws exactly these words: given explicitly, the result is the same
    x = np.random.default_rng(4).standard_normal((8, 32)).astype(np.float32)
    key = jax.random.key(2)
    np.testing.assert_array_equal(
        np.asarray(formats.round_to_grid(x, formats.get("fp4_e2m1").params(), "stochastic", key)),
        np.asarray(formats.round_to_grid(x, formats.get("fp4_e2m1").params(), "stochastic",
                                         bits=formats.random_bits(key, x.shape))))
