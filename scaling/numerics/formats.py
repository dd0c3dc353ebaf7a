"""Number formats and element rounding, simulated bit-exactly in float32 arithmetic.

A floating-point format ExMy has 1 sign bit, E exponent bits (bias 2^(E-1) - 1) and M mantissa
bits; P = 1 + E + M. Its grid is

    v = ±2^e · (1 + m / 2^M)   e in [emin, emax]         (normals, emin = 1 - bias)
    v = ±2^emin · (m / 2^M)                               (subnormals, down to min_subnormal)

Max / infinity convention (one rule for every ExMy, named or not; it reproduces OCP FP8/MX,
IEEE half and bfloat16):

    'ieee'    E >= 5: the top exponent code is reserved for inf/NaN (IEEE 754, FP8 E5M2, FP16,
              BF16): emax = bias, max = (2 - 2^-M) · 2^emax, has_inf.
    'fn'      E <= 4 and P >= 8: every exponent code is finite, only S.1111.111 is NaN (OCP FP8
              E4M3FN): emax = bias + 1, max = (2 - 2^(1-M)) · 2^emax, no inf.
    'finite'  E <= 4 and P <= 7: no inf, no NaN codes (OCP MX FP6 E2M3/E3M2, FP4 E2M1):
              emax = bias + 1, max = (2 - 2^-M) · 2^emax.

So 'e3m4' is E3M4 'fn' (max 30), whereas ml_dtypes.float8_e3m4 is IEEE-like (max 15.5);
`float_format(3, 4, "ieee")` builds the latter.

INT-k is symmetric: the integers in [-(2^(k-1) - 1), 2^(k-1) - 1] (no -2^(k-1), so 0 is centred).

Rounding runs on the numbers that define the grid, `FormatParams` (mbits, emin, emax, max as
float32 scalars), so a format can be a traced value and one compiled program serves a whole
precision sweep:

    e   = clip(floor(log2 |x|), emin, emax)       (read from the float32 exponent bits)
    ulp = 2^(e - mbits)
    q   = round(|x| / ulp) · ulp,  saturated at max,  with the sign of x

INT-k is the same rule with mbits = emin = emax = k - 2 (ulp = 1). See `round_to_grid` for how
this is computed exactly although XLA's CPU backend flushes float32 subnormals.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from scaling.errors import ConfigError

ROUNDINGS = ("nearest", "stochastic")


class FormatParams(NamedTuple):
    """The runtime description of a grid (float32 scalars; a pytree, so it may be traced).

    mbits: fraction bits of the grid; emin / emax: clamp of the exponent e in ulp = 2^(e - mbits);
    max: saturation value. INT-k: mbits = emin = emax = k - 2 (ulp 1 everywhere; emax is the exponent
    of the largest integer, used by MX scales), max = 2^(k-1) - 1. A float32 vector
    [mbits, emin, emax, max] unpacks the same way and is accepted wherever FormatParams is.
    """

    mbits: jax.Array
    emin: jax.Array
    emax: jax.Array
    max: jax.Array


@dataclass(frozen=True)
class Format:
    """A number format. For ints, ebits = 0, mbits = k - 1 magnitude bits, emin = 0 and emax = k - 2
    (the exponents of the smallest and largest non-zero magnitudes 1 and 2^(k-1) - 1)."""

    name: str
    kind: str  # 'float' | 'int'
    ebits: int
    mbits: int
    bits: int  # P: 1 + E + M for floats, k for ints
    max: float
    min_normal: float
    min_subnormal: float
    has_inf: bool
    emax: int
    emin: int
    encoding: str  # 'ieee' | 'fn' | 'finite' | 'int' (see module docstring)

    def params(self) -> FormatParams:
        """The grid as runtime float32 scalars (see `round_to_grid`)."""
        if self.kind == "int":  # ulp 2^(e - mbits) = 1 for every e; emax = k - 2 as MX scales need
            vals = (self.emax, self.emax, self.emax, self.max)
        else:
            vals = (self.mbits, self.emin, self.emax, self.max)
        return FormatParams(*(jnp.float32(v) for v in vals))


def float_format(ebits: int, mbits: int, encoding: str | None = None, name: str | None = None) -> Format:
    """ExMy with the module's max/inf convention, or an explicit `encoding` ('ieee'|'fn'|'finite')."""
    if not (isinstance(ebits, int) and 1 <= ebits <= 8):
        raise ConfigError("format.ebits", ebits, "an integer in 1..8 (exponents must fit float32)")
    if not (isinstance(mbits, int) and 0 <= mbits <= 23):
        raise ConfigError("format.mbits", mbits, "an integer in 0..23")
    bits = 1 + ebits + mbits
    if encoding is None:
        encoding = "ieee" if ebits >= 5 else ("fn" if bits >= 8 else "finite")
    if encoding not in ("ieee", "fn", "finite"):
        raise ConfigError("format.encoding", encoding, ("ieee", "fn", "finite"))
    bias = 2 ** (ebits - 1) - 1
    emin = 1 - bias
    if encoding == "ieee":
        emax, top = bias, 2.0 - 2.0**-mbits
    elif encoding == "fn":
        if mbits == 0:  # the only top-exponent code is NaN
            emax, top = bias, 1.0
        else:
            emax, top = bias + 1, 2.0 - 2.0 ** (1 - mbits)
    else:
        emax, top = bias + 1, 2.0 - 2.0**-mbits
    if emax > 127:  # E=8 'fn'/'finite' would exceed float32's range
        raise ConfigError("format.encoding", encoding, "'ieee' for 8 exponent bits")
    return Format(
        name=name or f"e{ebits}m{mbits}",
        kind="float",
        ebits=ebits,
        mbits=mbits,
        bits=bits,
        max=float(top * 2.0**emax),
        min_normal=float(2.0**emin),
        min_subnormal=float(2.0 ** (emin - mbits)),
        has_inf=encoding == "ieee",
        emax=emax,
        emin=emin,
        encoding=encoding,
    )


def int_format(k: int) -> Format:
    """Symmetric INT-k: integers in [-(2^(k-1) - 1), 2^(k-1) - 1]."""
    if not (isinstance(k, int) and 2 <= k <= 24):
        raise ConfigError("format", f"int{k}", "intK with 2 <= K <= 24 (exact in float32)")
    return Format(name=f"int{k}", kind="int", ebits=0, mbits=k - 1, bits=k, max=float(2 ** (k - 1) - 1),
                  min_normal=1.0, min_subnormal=1.0, has_inf=False, emax=max(k - 2, 0), emin=0, encoding="int")


# canonical name -> (ebits, mbits); every other ExMy is built on demand by the same rule
_NAMED = {
    "fp32": (8, 23),
    "bf16": (8, 7),
    "fp16": (5, 10),
    "fp8_e4m3": (4, 3),
    "fp8_e5m2": (5, 2),
    "fp6_e2m3": (2, 3),
    "fp6_e3m2": (3, 2),
    "fp4_e2m1": (2, 1),
}
_ALIASES = {
    "float32": "fp32", "f32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16", "half": "fp16",
    "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2",
    "float6_e2m3fn": "fp6_e2m3", "float6_e3m2fn": "fp6_e3m2", "float4_e2m1fn": "fp4_e2m1",
}
_BY_BITS = {v: k for k, v in _NAMED.items()}
_EXMY = re.compile(r"e(\d+)m(\d+)")
_INTK = re.compile(r"int(\d+)")
KNOWN = tuple(_NAMED) + ("eXmY (1<=X<=8, 0<=Y<=23, e.g. e3m4)", "intK (2<=K<=24, e.g. int8, int4)")


def get(name: str | Format) -> Format:
    """A Format by name: fp32, bf16, fp16, fp8_e4m3, fp8_e5m2, fp6_e2m3, fp6_e3m2, fp4_e2m1, any
    'eXmY' (same object as the named format with those bits, e.g. 'e4m3' is fp8_e4m3), 'intK'.
    A Format is returned as is."""
    if isinstance(name, Format):
        return name
    if not isinstance(name, str):
        raise ConfigError("format", name, KNOWN)
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key in _NAMED:
        return _named(key)
    m = _EXMY.fullmatch(key)
    if m:
        e, mb = int(m.group(1)), int(m.group(2))
        if (e, mb) in _BY_BITS:
            return _named(_BY_BITS[(e, mb)])
        if 1 <= e <= 8 and 0 <= mb <= 23:
            return float_format(e, mb)
    m = _INTK.fullmatch(key)
    if m and 2 <= int(m.group(1)) <= 24:
        return int_format(int(m.group(1)))
    raise ConfigError("format", name, KNOWN)


def _named(key: str) -> Format:
    e, m = _NAMED[key]
    return float_format(e, m, name=key)


def params_of(fmt: str | Format | FormatParams | jax.Array) -> FormatParams:
    """FormatParams from a name, a Format, FormatParams or a float32 vector [mbits, emin, emax, max]."""
    if isinstance(fmt, (str, Format)):
        return get(fmt).params()
    if isinstance(fmt, FormatParams):
        return fmt
    mbits, emin, emax, fmax = fmt
    return FormatParams(mbits, emin, emax, fmax)


# ---------------------------------------------------------------------------------------------
# Exact powers of two and exponents, by bit manipulation (exp2/log2 are neither exact nor cheap)
# ---------------------------------------------------------------------------------------------


def pow2(k: jax.Array) -> jax.Array:
    """Exactly 2^k as float32 for integer-valued k in [-149, 127] (subnormal results included)."""
    k = jnp.clip(jnp.asarray(k).astype(jnp.int32), -149, 127)
    normal = jax.lax.bitcast_convert_type((jnp.maximum(k, -126) + 127) << 23, jnp.float32)
    sub = jax.lax.bitcast_convert_type(jnp.left_shift(jnp.int32(1), jnp.clip(k + 149, 0, 22)), jnp.float32)
    return jnp.where(k >= -126, normal, sub)


def _pow2_normal(k: jax.Array) -> jax.Array:
    """2^k for int32 k in [-126, 127] (one shift and a bitcast)."""
    return jax.lax.bitcast_convert_type((k + 127) << 23, jnp.float32)


def floor_log2(a: jax.Array) -> jax.Array:
    """floor(log2 |a|) as int32 for finite non-zero a, subnormals included (frexp is exact)."""
    _, e = jnp.frexp(a)
    return e.astype(jnp.int32) - 1


def ceil_log2(a: jax.Array) -> jax.Array:
    """ceil(log2 |a|) as int32 for finite non-zero a."""
    m, e = jnp.frexp(jnp.abs(a))
    return e.astype(jnp.int32) - (m == 0.5).astype(jnp.int32)


# ---------------------------------------------------------------------------------------------
# Random bits for stochastic rounding
# ---------------------------------------------------------------------------------------------


def _lowbias32(h: jax.Array) -> jax.Array:
    """A 32-bit integer hash with low bias (C. Wellons' lowbias32): a bijection with full avalanche."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x7FEB352D)
    h = h ^ (h >> 15)
    h = h * jnp.uint32(0x846CA68B)
    return h ^ (h >> 16)


def random_bits(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """uint32 random bits of `shape` for stochastic rounding: a counter-based hash of (row-major
    element index XOR one 32-bit seed drawn from `key`). Distinct indices give distinct,
    independent-looking words; ~20x cheaper on CPU than `jax.random.bits` (threefry) of the full
    shape, which would otherwise dominate a low-precision train step. The price: two keys whose
    seeds coincide (2^-32 per pair) draw the same words, and the words of one key are largely a
    permutation of another's (index XOR seed), which stochastic rounding does not care about."""
    seed = jax.random.bits(key, (), jnp.uint32)
    idx = jax.lax.iota(jnp.uint32, math.prod(shape)).reshape(shape)
    return _lowbias32(idx ^ seed)


# ---------------------------------------------------------------------------------------------
# Rounding
# ---------------------------------------------------------------------------------------------


@partial(jax.jit, static_argnames=("rounding",))
def round_to_grid(
    x: jax.Array,
    params: FormatParams | jax.Array,
    rounding: str = "nearest",
    key: jax.Array | None = None,
    *,
    bits: jax.Array | None = None,
) -> jax.Array:
    """Round x (float32) to the grid described by `params` (see module docstring), saturating at
    ±max; NaN stays NaN, -0 stays -0, subnormals of the format are kept.

    nearest:    round-half-to-even.
    stochastic: down to the lower neighbour a, up to the upper b with probability (|x| - a)/(b - a)
                (unbiased: exactly where the step is a multiple of float32's ulp, to 2^-24 of a
                step below 2^emin; only a or b are ever returned). Needs `key`: the random words
                are `random_bits(key, x.shape)`, or `bits` (uint32, x's shape) when the caller
                drew them (`quant` draws them for the tensor before laying it out in blocks, so
                an element's draw never depends on the granularity).

    `params` may be traced: changing the format does not recompile.

    How. XLA's CPU backend flushes float32 subnormals in arithmetic (DAZ/FTZ), so everything that
    can touch them is integer work on the float32 bits b = bits(|x|):
      |x| >= 2^emin (or emin = -126, where the format's subnormals are float32's own): the grid
        step is 2^d float32 ulps with d = 23 - mbits - max(0, e - emax), so rounding drops the low
        d bits of b (carries run into the exponent field, which is exactly the next binade);
      |x| < 2^emin: the grid is the multiples of u = 2^(emin - mbits) (>= 2^-85, normal), so
        q = round_half_even(|x| / u) · u, both products exact (powers of two).
    Saturation compares bit patterns (monotone in |x| for non-NaN values).
    """
    if rounding not in ROUNDINGS:
        raise ConfigError("rounding", rounding, ROUNDINGS)
    if rounding == "stochastic" and key is None and bits is None:
        raise ConfigError("key", None, "a jax.random key when rounding='stochastic'")
    mbits, emin, emax, fmax = params
    x = jnp.asarray(x, jnp.float32)
    mb = jnp.asarray(mbits).astype(jnp.int32)
    lo_e = jnp.asarray(emin).astype(jnp.int32)
    hi_e = jnp.asarray(emax).astype(jnp.int32)
    max_bits = jax.lax.bitcast_convert_type(jnp.asarray(fmax, jnp.float32), jnp.int32)

    x_bits = jax.lax.bitcast_convert_type(x, jnp.int32)
    a = x_bits & 0x7FFFFFFF
    e = jnp.maximum(a >> 23, 1) - 127  # float32 subnormals share the exponent -126
    d = jnp.clip(23 - mb - jnp.maximum(e - hi_e, 0), 0, 23)
    mask = (1 << d) - 1
    # |x| < 2^emin: float path on the multiples of u (both regions use integer-only saturation)
    small = (a < ((lo_e + 127) << 23)) & (lo_e > -126)
    mag = jax.lax.bitcast_convert_type(a, jnp.float32)
    inv_u_exp = jnp.clip(mb - lo_e, -126, 126)  # u = 2^-inv_u_exp; only used where `small`
    if rounding == "nearest":
        incr = (((1 << d) >> 1) - 1 + ((a >> d) & 1)) & mask  # half - 1 + lsb: ties go to even
        big_r = (a + incr) & ~mask
        # (an add-and-subtract 2^23·u trick is not safe here: XLA may fold it away inside fusions)
        small_r = jnp.round(mag * _pow2_normal(inv_u_exp)) * _pow2_normal(-inv_u_exp)
    else:
        words = random_bits(key, x.shape) if bits is None else jnp.asarray(bits, jnp.uint32)
        r24 = jax.lax.shift_right_logical(words, jnp.uint32(8)).astype(jnp.int32)
        # up with probability (dropped bits) / 2^d: the top d of 24 random bits fall below them
        # (the same event as r24 · 2^-24 < |x|/ulp - floor(|x|/ulp); d <= 23, so the shift is >= 1)
        up = jax.lax.shift_right_logical(r24, 24 - d) < (a & mask)
        big_r = (a & ~mask) + (up.astype(jnp.int32) << d)  # a carry runs into the next binade
        t = mag * _pow2_normal(inv_u_exp)  # |x| / u, exact
        lo = jnp.floor(t)
        u01 = r24.astype(jnp.float32) * (2.0**-24)
        small_r = (lo + (u01 < t - lo).astype(jnp.float32)) * _pow2_normal(-inv_u_exp)
    r = jnp.where(small, jax.lax.bitcast_convert_type(small_r, jnp.int32), big_r)
    r = jnp.minimum(r, max_bits)
    out = jnp.where(a > 0x7F800000, x_bits, r | (x_bits & jnp.int32(-0x80000000)))  # NaN passes through
    return jax.lax.bitcast_convert_type(out, jnp.float32)


# (ebits, mbits) of the IEEE formats whose nearest rounding `round_native` does with XLA's own
# ReducePrecision (bf16, fp16): bit-identical to `round_to_grid`, ~7-10 ops per element instead of ~55
_NATIVE = frozenset({(8, 7), (5, 10)})


def native(fmt: str | Format) -> Format | None:
    """The Format if `round_native` serves it (IEEE bf16 or fp16, named or built), else None."""
    f = get(fmt)
    ok = f.kind == "float" and f.encoding == "ieee" and (f.ebits, f.mbits) in _NATIVE
    return f if ok else None


@partial(jax.jit, static_argnames=("ebits", "mbits"))
def _round_native(x: jax.Array, ebits: int, mbits: int) -> jax.Array:
    f = float_format(ebits, mbits, "ieee")
    x = jnp.asarray(x, jnp.float32)
    # ReducePrecision: round-half-to-even on the bits (integer work, so float32 subnormals survive
    # XLA:CPU's DAZ/FTZ, and unlike an f32 -> bf16 -> f32 convert pair no pass removes it); it keeps
    # NaN payloads, overflows to ±inf and flushes the target format's own subnormals to ±0
    r = jax.lax.reduce_precision(x, exponent_bits=ebits, mantissa_bits=mbits)
    if f.emin > -126:  # fp16: below 2^emin the grid is the multiples of u (x · 2^(mbits - emin) is exact)
        u = 2.0 ** (f.emin - mbits)
        r = jnp.where(jnp.abs(x) < f.min_normal, jnp.round(x * (1.0 / u)) * u, r)
    # saturation after rounding, by select (a float min/max would flush float32 subnormals on CPU)
    return jax.lax.select(jnp.isinf(r), jax.lax.sign(r) * jnp.float32(f.max), r)


def round_native(x: jax.Array, fmt: str | Format) -> jax.Array:
    """`round_to_grid(x, fmt.params(), "nearest")` for a format `native` serves, bit for bit (±max
    for ±inf and values that round past max, NaN payloads kept, -0 kept, the format's subnormals
    kept) as XLA's ReducePrecision plus a select or two."""
    f = native(fmt)
    if f is None:
        raise ConfigError("format", getattr(fmt, "name", fmt), "bf16 or fp16 (formats.native)")
    return _round_native(x, f.ebits, f.mbits)


def round_to_format(
    x: jax.Array,
    fmt: str | Format | FormatParams,
    rounding: str = "nearest",
    key: jax.Array | None = None,
) -> jax.Array:
    """Round x elementwise to `fmt` in float32 arithmetic (see `round_to_grid`); bf16 and fp16
    named or given as a Format round to nearest with `round_native` (the same bits, a few ops)."""
    if rounding == "nearest" and isinstance(fmt, (str, Format)) and native(fmt) is not None:
        return round_native(x, fmt)
    return round_to_grid(x, params_of(fmt), rounding, key)


def representable(fmt: str | Format) -> list[float]:
    """All non-negative finite values of a float format with P <= 16 bits (for tests and tables)."""
    f = get(fmt)
    if f.kind == "int":
        return [float(i) for i in range(int(f.max) + 1)]
    if f.bits > 16:
        raise ConfigError("format", f.name, "a format of at most 16 bits")
    vals = [m * 2.0 ** (f.emin - f.mbits) for m in range(2**f.mbits)]
    for e in range(f.emin, f.emax + 1):
        vals += [(1 + m / 2**f.mbits) * 2.0**e for m in range(2**f.mbits)]
    return [v for v in vals if v <= f.max]


__all__ = ["Format", "FormatParams", "ROUNDINGS", "KNOWN", "get", "float_format", "int_format",
           "params_of", "random_bits", "round_to_grid", "round_to_format", "native", "round_native", "pow2", "floor_log2", "ceil_log2",
           "representable"]
