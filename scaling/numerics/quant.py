"""Scaled fake-quantisation: x -> values = round(x / scale) on the format grid, x̂ = values · scale.

Granularity (how many scales, and over which elements amax is taken). `axis` is the REDUCTION
axis of the GEMM the operand feeds; blocks run along it, so no scale straddles a dot product's sum.

    none     no scale (plain cast to the format): scale = 1
    tensor   one scale:                                 scale = amax(x) · 2^margin / max
    channel  one scale per slice orthogonal to `axis`:  amax over `axis`   (scale has size 1 there)
    block    1×k tiles along `axis` (k = 128, DeepSeek-V3): amax per tile
    block2d  k×k tiles over the two trailing axes (DeepSeek-V3's 128×128 weights)
    mx       OCP Microscaling, blocks of 32 along `axis`, an E8M0 power-of-two scale
                 floor: 2^(floor(log2 amax_blk) - emax_elem)      (OCP; the block max may saturate)
                 ceil:  2^(ceil(log2(amax_blk / max_elem)))       (the block max never clips)
             clamped to E8M0's range 2^-127 .. 2^127; elements saturate at ±max.
    nvfp4    E2M1 elements in blocks of 16 with a two-level scale:
                 s_t = amax(x) · fl(1 / (448 · 6))                 (FP32 tensor scale)
                 s_b = round_to_format(amax_blk / (6 · s_t), fp8_e4m3)   (E4M3 block scale)
                 scale = s_b · s_t,  values = round(x / scale)
             An E4M3 block scale that underflows to 0 flushes its block to ±0 (scale 0).

`square_blocks = true` (mx, nvfp4) takes each scale over a k×k tile of the two trailing axes
instead of 1×k along `axis` (NVIDIA's NVFP4 recipe: 16×16 weight tiles), so a matrix and its
transpose quantise to the same values and the forward and backward GEMMs see one quantised weight.
`scale_from = "rms"` (mx) sets the E8M0 exponent from the block's root mean square instead of its
amax, QuEST-style (Panferov et al. 2025; Quartet's forward pass, Castro et al. 2025 §4):
    e = floor(log2(rms_blk · fl(QUEST_CLIP / max_elem)))
so the grid's top sits near QUEST_CLIP standard deviations and the rarer larger elements clip.

A block dimension that k does not divide is zero-padded to a multiple of k internally: the last
block is partial (fewer than k real elements) and has its own scale; padding never reaches the
outputs. An amax of 0 (or a non-finite amax) gives scale 1, so all-zero tensors and blocks are safe.
`pow2_scale` rounds a scale UP to a power of two (the amax still never clips): UE8M0 scales for
per-tensor/channel/block formats, as DeepSeek-V3.1's blockwise FP8 (experiments/recipes/
fp8-blockwise-ue8m0.toml). mx's `scale_rounding = "ceil"` rounds the E8M0 exponent up instead of
OCP's floor, so no block element saturates: NVIDIA's MXFP8 recipe (experiments/recipes/mxfp8-nvidia.toml).

Scale timing. 'current': from this tensor. 'delayed' (per tensor, TransformerEngine semantics):
from the max over the amax history BEFORE this step's amax is pushed; an all-zero history (the first step) falls back to the current amax. The history (newest
first) is explicit state: `quantize(..., history=h).history` / `fake_quant_with_history` return
it rolled with this step's amax.

Traced formats. Every function takes `fmt_params=` (a `formats.FormatParams` or a float32 vector
[mbits, emin, emax, max]) overriding the spec's element format, so a format can be a traced value
and one compiled program serves a whole precision sweep (the spec's granularity etc. stay static).

Exact arithmetic. XLA compiles x / s for a broadcast s as x · (1/s), so the definitions are written
that way to be the same eagerly, under jit and in a numpy reference: values = round(x · fl(1/scale)),
scale = amax · fl(2^margin / max), nvfp4's s_t = amax · fl(1/2688) and s_b = E4M3(amax_blk ·
fl(1 / (6 · s_t))) (each within an ulp of the quotient). MX scales are powers of two, so there x · 2^-e is exact.

XLA's CPU backend flushes float32 subnormals in arithmetic, so a tensor/channel/block scale that
would fall below 2^-126 (amax below ~2^-126 · max) is replaced by 1 (the values are then rounded
unscaled), and an MX block whose E8M0 scale is 2^-127 dequantises to zero on CPU.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from scaling.numerics import formats
from scaling.errors import ConfigError

GRANULARITIES = ("none", "tensor", "channel", "block", "block2d", "mx", "nvfp4")
SCALINGS = ("current", "delayed")
SCALE_ROUNDINGS = ("floor", "ceil")
DEFAULT_BLOCK = {"block": 128, "block2d": 128, "mx": 32, "nvfp4": 16}
E4M3_MAX = 448.0
E8M0_EXP = (-127, 127)
SCALE_FROM = ("amax", "rms")
# QuEST's clip for E2M1 (Panferov et al. 2025; Quartet's code uses 2.92247856 / 6 · σ): the MSE-optimal
# clip of a Gaussian on the FP4 grid, in standard deviations
QUEST_CLIP = 2.92247856


@dataclass(frozen=True)
class QuantSpec:
    """How one tensor is quantised (see module docstring). Hashable: use it as a static jit arg."""

    format: str | formats.Format = "fp8_e4m3"  # a name, or a Format such as float_format(3, 4, "ieee")
    granularity: str = "tensor"
    block: int | None = None  # default 128 for block/block2d, 32 for mx, 16 for nvfp4
    axis: int = -1  # the reduction axis of the GEMM this operand feeds
    scaling: str = "current"
    rounding: str = "nearest"
    margin: int = 0  # scale = 2^margin · amax / max
    amax_history: int = 16
    pow2_scale: bool = False
    scale_rounding: str = "floor"  # mx only
    square_blocks: bool = False  # mx, nvfp4: k×k tiles over the two trailing axes
    scale_from: str = "amax"  # mx only: "rms" for QuEST-style clipping

    def __post_init__(self) -> None:
        fmt = formats.get(self.format)  # ConfigError('format', ...) for unknown names; a Format is kept as is
        g = self.granularity
        if g not in GRANULARITIES:
            raise ConfigError("granularity", g, GRANULARITIES)
        if g in DEFAULT_BLOCK:
            if self.block is None:
                object.__setattr__(self, "block", DEFAULT_BLOCK[g])
            if isinstance(self.block, bool) or not isinstance(self.block, int) or self.block < 1:
                raise ConfigError("block", self.block, "an integer >= 1")
        elif self.block is not None:
            raise ConfigError("block", self.block, f"None for granularity={g!r} (only block, block2d, mx, nvfp4 have blocks)")
        if isinstance(self.axis, bool) or not isinstance(self.axis, int):
            raise ConfigError("axis", self.axis, "an integer axis index")
        if self.scaling not in SCALINGS:
            raise ConfigError("scaling", self.scaling, SCALINGS)
        if self.scaling == "delayed" and g != "tensor":
            raise ConfigError("scaling", self.scaling, f"'current' with granularity={g!r} (delayed scaling is per tensor)")
        if self.rounding not in formats.ROUNDINGS:
            raise ConfigError("rounding", self.rounding, formats.ROUNDINGS)
        if isinstance(self.margin, bool) or not isinstance(self.margin, int):
            raise ConfigError("margin", self.margin, "an integer (scale = 2^margin · amax / max)")
        if isinstance(self.amax_history, bool) or not isinstance(self.amax_history, int) or self.amax_history < 1:
            raise ConfigError("amax_history", self.amax_history, "an integer >= 1")
        if not isinstance(self.pow2_scale, bool):
            raise ConfigError("pow2_scale", self.pow2_scale, "true or false")
        if self.pow2_scale and g in ("none", "mx", "nvfp4"):
            raise ConfigError("pow2_scale", True, f"false for granularity={g!r} (mx scales are powers of two already; nvfp4's are E4M3)")
        if self.scale_rounding not in SCALE_ROUNDINGS:
            raise ConfigError("scale_rounding", self.scale_rounding, SCALE_ROUNDINGS)
        if self.scale_rounding != "floor" and g != "mx":
            raise ConfigError("scale_rounding", self.scale_rounding, "'floor' unless granularity='mx'")
        if not isinstance(self.square_blocks, bool):
            raise ConfigError("square_blocks", self.square_blocks, "true or false")
        if self.square_blocks and g not in ("mx", "nvfp4"):
            raise ConfigError("square_blocks", True, f"false for granularity={g!r} (block2d is square already; only mx, nvfp4 take it)")
        if self.scale_from not in SCALE_FROM:
            raise ConfigError("scale_from", self.scale_from, SCALE_FROM)
        if self.scale_from == "rms" and (g != "mx" or self.scale_rounding != "floor"):
            raise ConfigError("scale_from", "rms", "'amax' unless granularity='mx' with scale_rounding='floor'")
        if g == "nvfp4" and fmt.name != "fp4_e2m1":
            raise ConfigError("format", self.format, "fp4_e2m1 with granularity='nvfp4'")
        if g == "none" and self.margin != 0:
            raise ConfigError("margin", self.margin, "0 with granularity='none' (no scale)")

    @property
    def fmt(self) -> formats.Format:
        return formats.get(self.format)

    @property
    def bits(self) -> int:
        return self.fmt.bits


class Quantized(NamedTuple):
    """values: x / scale rounded to the grid (float32, x's shape); scale: float32, x's shape with the
    blocked axis of length ceil(n / k) (both trailing axes for block2d and square blocks; all ones for none/tensor;
    size 1 along `axis` for channel); amax: max |x| (scalar); history: the updated amax history
    (delayed scaling) or None."""

    values: jax.Array
    scale: jax.Array
    amax: jax.Array
    history: jax.Array | None


def init_history(spec: QuantSpec) -> jax.Array:
    """An empty amax history (all zeros: the first step falls back to the current amax)."""
    return jnp.zeros((spec.amax_history,), jnp.float32)


# ---------------------------------------------------------------------------------------------
# Scales
# ---------------------------------------------------------------------------------------------


def _amax_scale(amax: jax.Array, fmax: jax.Array, spec: QuantSpec) -> jax.Array:
    """amax · (2^margin / max) (one float32 product; see "Exact arithmetic" in the module doc),
    optionally rounded up to a power of two; 1 where that is not a positive, finite, normal number."""
    scale = amax * ((2.0**spec.margin) / fmax)
    if spec.pow2_scale:
        scale = formats.pow2(formats.ceil_log2(jnp.where(scale > 0, scale, 1.0)))
    ok = (scale >= 2.0**-126) & jnp.isfinite(scale)
    return jnp.where(ok, scale, 1.0)


def _mx_exponent(amax: jax.Array, fmax: jax.Array, emax: jax.Array, spec: QuantSpec) -> jax.Array:
    """E8M0 scale exponent per block (int32), clamped to [-127, 127]; 0 for all-zero blocks."""
    ok = (amax > 0) & jnp.isfinite(amax)
    a = jnp.where(ok, amax, 1.0)
    if spec.scale_rounding == "floor":
        e = formats.floor_log2(a) - jnp.asarray(emax).astype(jnp.int32)
    else:
        # ceil(log2(amax / max)) from the two mantissas in [0.5, 1) and their exponents, taken
        # exactly first: amax / max itself may be a float32 subnormal, which XLA:CPU flushes to 0
        m_a, e_a = jnp.frexp(a)
        m_f, e_f = jnp.frexp(jnp.asarray(fmax, jnp.float32))
        c = formats.ceil_log2(m_a * (1.0 / m_f))  # m_a / m_f in (0.5, 2): c in {-1, 0, 1}
        # the rounded ratio may sit on the wrong side of a power of two: settle it exactly
        c = c + (m_a > m_f * formats.pow2(c)).astype(jnp.int32) - (m_a <= m_f * formats.pow2(c - 1)).astype(jnp.int32)
        e = e_a.astype(jnp.int32) - e_f.astype(jnp.int32) + c
    return jnp.where(ok, jnp.clip(e, *E8M0_EXP), 0)


def _rms_exponent(rms: jax.Array, fmax: jax.Array) -> jax.Array:
    """QuEST's E8M0 exponent floor(log2(rms · fl(QUEST_CLIP / max))), clamped; 0 for a zero block."""
    t = rms * (jnp.float32(QUEST_CLIP) / fmax)
    ok = (t > 0) & jnp.isfinite(t)
    return jnp.where(ok, jnp.clip(formats.floor_log2(jnp.where(ok, t, 1.0)), *E8M0_EXP), 0)


def is_square(spec: QuantSpec) -> bool:
    """Scales over k×k tiles of the two trailing axes (block2d, or mx/nvfp4 with square_blocks):
    the quantisation does not depend on the reduction axis."""
    return spec.granularity == "block2d" or spec.square_blocks


def nvfp4_tensor_scale(amax: jax.Array, fmax: jax.Array) -> jax.Array:
    """NVFP4's FP32 tensor scale s_t = amax · fl(1 / (448 · max)); 1 for a zero or non-finite amax."""
    ok = (amax > 0) & jnp.isfinite(amax)
    return jnp.where(ok, amax * (1.0 / (E4M3_MAX * fmax)), 1.0)


def _delayed_amax(amax: jax.Array, history: jax.Array | None, spec: QuantSpec) -> tuple[jax.Array, jax.Array]:
    if history is None:
        raise ConfigError("history", None, "an amax history (quant.init_history(spec)) with scaling='delayed'")
    history = jnp.asarray(history, jnp.float32)
    past = jnp.max(history)
    used = jnp.where(past > 0, past, amax)
    return used, jnp.concatenate([amax[None], history[:-1]])


# ---------------------------------------------------------------------------------------------
# Blocked layout: pad the blocked axis to a multiple of k and split it into (n_blocks, k)
# ---------------------------------------------------------------------------------------------


def _once_per_block(scale: jax.Array) -> jax.Array:
    """A block scale that bfloat16 holds exactly (a power of two in E8M0's range 2^-127..2^127, or an
    E4M3 value: bfloat16 has float32's exponent range, 7 mantissa bits and subnormals down to 2^-133)
    through bfloat16 and back: the same numbers, but a float32 -> bfloat16 convert is a producer
    XLA:CPU does not duplicate into the elementwise consumer that broadcasts it, so the scale's ~40-op
    integer chain runs once per block. Without it XLA fused that chain into the consumer and ran it for
    every element of the block (the MXFP4 step's quantiser fusions took ~2x as long);
    optimization_barrier does not help (XLA:CPU removes it before fusion)."""
    return scale.astype(jnp.bfloat16).astype(jnp.float32)


def _amax_along(a: jax.Array, axis: int) -> jax.Array:
    """max |a| over `axis` (kept, length 1): halve the axis with elementwise maxima down to 32, then
    reduce. XLA's CPU reduction over a long minor axis is several times slower than these
    vectorised passes; the final reduce keeps the halving out of the consumers' fusions (which
    would otherwise recompute it per element)."""
    a = jnp.abs(a)
    while a.shape[axis] > 32 and a.shape[axis] % 2 == 0:
        h = a.shape[axis] // 2
        a = jnp.maximum(jax.lax.slice_in_dim(a, 0, h, axis=axis), jax.lax.slice_in_dim(a, h, 2 * h, axis=axis))
    return jnp.max(a, axis=axis, keepdims=True)


def _norm_axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise ConfigError("axis", axis, f"an axis of a {ndim}-d array")
    return axis % ndim


def _pad_axis(x: jax.Array, axis: int, k: int) -> jax.Array:
    pad = (-x.shape[axis]) % k
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths)


def _to_blocks(x: jax.Array, axis: int, k: int) -> jax.Array:
    """(..., n, ...) -> (..., ceil(n/k), k, ...) along `axis`, zero-padded."""
    xp = _pad_axis(x, axis, k)
    return xp.reshape(xp.shape[:axis] + (xp.shape[axis] // k, k) + xp.shape[axis + 1:])


def _from_blocks(xb: jax.Array, axis: int, n: int) -> jax.Array:
    x = xb.reshape(xb.shape[:axis] + (-1,) + xb.shape[axis + 2:])
    return jax.lax.slice_in_dim(x, 0, n, axis=axis)


def _to_tiles(x: jax.Array, k: int) -> jax.Array:
    """(..., R, C) -> (..., R/k, k, C/k, k), both trailing axes zero-padded."""
    xp = _pad_axis(_pad_axis(x, x.ndim - 2, k), x.ndim - 1, k)
    r, c = xp.shape[-2:]
    return xp.reshape(xp.shape[:-2] + (r // k, k, c // k, k))


def _from_tiles(xt: jax.Array, r: int, c: int) -> jax.Array:
    x = xt.reshape(xt.shape[:-4] + (xt.shape[-4] * xt.shape[-3], xt.shape[-2] * xt.shape[-1]))
    return x[..., :r, :c]


# ---------------------------------------------------------------------------------------------
# Quantisation
# ---------------------------------------------------------------------------------------------


def _runtime(fmt_params: Any) -> formats.FormatParams | None:
    """fmt_params as arrays (names and Formats are resolved before they meet jit)."""
    return None if fmt_params is None else formats.params_of(fmt_params)


def _params(spec: QuantSpec, fmt_params: Any) -> formats.FormatParams:
    return spec.fmt.params() if fmt_params is None else formats.params_of(fmt_params)


@partial(jax.jit, static_argnums=(1,))
def _quantize(x, spec: QuantSpec, key, history, fmt_params):
    """Returns (values, scale, amax, new_history, x̂); under jit the unused ones cost nothing."""
    if spec.rounding == "stochastic" and key is None:
        raise ConfigError("key", None, "a jax.random key when rounding='stochastic'")
    x = jnp.asarray(x, jnp.float32)
    p = _params(spec, fmt_params)
    fmax = jnp.asarray(p.max, jnp.float32)
    # stochastic rounding draws one word per element of x, laid out with x's blocks: an element's
    # draw depends on the key and its index in x, whatever the granularity
    words = formats.random_bits(key, x.shape) if spec.rounding == "stochastic" else None

    # a static bf16/fp16 element format rounds to nearest natively (the same bits, ~1/6 of the ops);
    # a runtime format (fmt_params) keeps the emulation, which serves every format in one program
    native = fmt_params is None and spec.rounding == "nearest" and formats.native(spec.fmt) is not None

    def rnd(v, bits=words):
        if native:
            return formats.round_native(v, spec.fmt)
        return formats.round_to_grid(v, p, spec.rounding, bits=bits)

    amax = jnp.max(jnp.abs(x)) if x.size else jnp.float32(0.0)
    ones = (1,) * x.ndim
    g = spec.granularity
    new_history = None
    if g == "none":
        values = rnd(x)
        return values, jnp.ones(ones, jnp.float32), amax, None, values
    if g == "tensor":
        used = amax
        if spec.scaling == "delayed":
            used, new_history = _delayed_amax(amax, history, spec)
        scale = _amax_scale(used, fmax, spec)
        values = rnd(x * (1.0 / scale))
        return values, scale.reshape(ones), amax, new_history, values * scale
    if x.ndim == 0:
        raise ConfigError("granularity", g, "'none' or 'tensor' for a scalar")
    if g == "channel":
        ax = _norm_axis(spec.axis, x.ndim)
        scale = _amax_scale(jnp.max(jnp.abs(x), axis=ax, keepdims=True), fmax, spec)
        values = rnd(x * (1.0 / scale))
        return values, scale, amax, None, values * scale
    k = spec.block
    if g == "block2d":
        if x.ndim < 2:
            raise ConfigError("granularity", g, "a granularity other than 'block2d' for a 1-d array")
        r, c = x.shape[-2:]
        xt = _to_tiles(x, k)
        scale = _amax_scale(_amax_along(_amax_along(xt, xt.ndim - 1), xt.ndim - 3), fmax, spec)
        vt = rnd(xt * (1.0 / scale), None if words is None else _to_tiles(words, k))
        return (_from_tiles(vt, r, c), scale[..., :, 0, :, 0], amax, None,
                _from_tiles(vt * scale, r, c))
    if spec.square_blocks:  # mx / nvfp4 over k×k tiles
        if x.ndim < 2:
            raise ConfigError("square_blocks", True, "false for a 1-d array")
        r, c = x.shape[-2:]
        xt = _to_tiles(x, k)
        axes = (xt.ndim - 3, xt.ndim - 1)
        amax_t = _amax_along(_amax_along(xt, axes[1]), axes[0])
        scale, vt = _micro_scaled(xt, amax_t, axes, spec, p, amax, rnd, None if words is None else _to_tiles(words, k))
        return (_from_tiles(vt, r, c), scale[..., :, 0, :, 0], amax, None, _from_tiles(vt * scale, r, c))
    ax = _norm_axis(spec.axis, x.ndim)
    n = x.shape[ax]
    xb = _to_blocks(x, ax, k)
    amax_b = _amax_along(xb, ax + 1)
    bb = None if words is None else _to_blocks(words, ax, k)
    if g == "block":
        scale = _amax_scale(amax_b, fmax, spec)
        vb = rnd(xb * (1.0 / scale), bb)
    elif g in ("mx", "nvfp4"):
        scale, vb = _micro_scaled(xb, amax_b, (ax + 1,), spec, p, amax, rnd, bb)
    else:  # unreachable: QuantSpec validated the granularity
        raise ConfigError("granularity", g, GRANULARITIES)
    return (_from_blocks(vb, ax, n), jnp.squeeze(scale, ax + 1), amax, None,
            _from_blocks(vb * scale, ax, n))


def _micro_scaled(xb, amax_b, axes, spec: QuantSpec, p: formats.FormatParams, amax, rnd, bb):
    """(scale, values) of MX or NVFP4 blocks: xb laid out in blocks whose elements run along `axes`
    (one axis for 1×k blocks, two for k×k tiles), amax_b their amax (size 1 along `axes`)."""
    fmax = jnp.asarray(p.max, jnp.float32)
    if spec.granularity == "mx":
        if spec.scale_from == "rms":  # a partial block's padding counts as zeros (it is one in the GEMM)
            n = math.prod(xb.shape[a] for a in axes)
            rms = jnp.sqrt(jnp.sum(jnp.square(xb), axis=axes, keepdims=True) * jnp.float32(1.0 / n))
            e = _rms_exponent(rms, fmax)
        else:
            e = _mx_exponent(amax_b, fmax, p.emax, spec)
        scale = _once_per_block(formats.pow2(e))
        return scale, rnd(xb * _once_per_block(formats.pow2(-e)), bb)  # exact, and 2^127 is normal where 2^-127 is not
    s_t = nvfp4_tensor_scale(amax, fmax)
    s_b = formats.round_to_format(amax_b * (1.0 / (fmax * s_t)), "fp8_e4m3")
    s_b = _once_per_block(jnp.where(amax_b > 0, s_b, 1.0))
    scale = s_b * s_t
    live = scale > 0  # an E4M3 block scale that underflowed flushes its block, keeping signs (-0)
    return scale, jnp.where(live, rnd(xb * (1.0 / jnp.where(live, scale, 1.0)), bb), jnp.copysign(0.0, xb))


def quantize(x: jax.Array, spec: QuantSpec, *, key: jax.Array | None = None,
             history: jax.Array | None = None, fmt_params: Any = None) -> Quantized:
    """Quantise x per `spec`: values on the format grid, their scales, amax and the new history.
    `key` is required for stochastic rounding, `history` for delayed scaling; `fmt_params`
    overrides the element format with runtime numbers (see module docstring)."""
    values, scale, amax, new_history, _ = _quantize(x, spec, key, history, _runtime(fmt_params))
    return Quantized(values, scale, amax, new_history)


def repeat_blocks(scale: jax.Array, axis: int, k: int, n: int) -> jax.Array:
    """Per-block scales along `axis` (length ceil(n / k)) repeated to the n elements they scale."""
    return jax.lax.slice_in_dim(jnp.repeat(scale, k, axis=axis), 0, n, axis=axis)


def expand_scale(scale: jax.Array, spec: QuantSpec, shape: tuple[int, ...]) -> jax.Array:
    """The scale broadcast to the full tensor shape (blocks repeated along the blocked axes)."""
    g = spec.granularity
    if g in ("none", "tensor", "channel"):
        return jnp.broadcast_to(scale, shape)
    k = spec.block
    if is_square(spec):
        rows = repeat_blocks(scale, len(shape) - 2, k, shape[-2])
        return repeat_blocks(rows, len(shape) - 1, k, shape[-1])
    ax = _norm_axis(spec.axis, len(shape))
    return repeat_blocks(scale, ax, k, shape[ax])


def dequantize(q: Quantized, spec: QuantSpec, shape: tuple[int, ...] | None = None) -> jax.Array:
    """x̂ = values · scale (scale expanded along the blocked axes)."""
    shape = q.values.shape if shape is None else tuple(shape)
    return q.values.reshape(shape) * expand_scale(q.scale, spec, shape)


def fake_quant(x: jax.Array, spec: QuantSpec, *, key: jax.Array | None = None,
               history: jax.Array | None = None, fmt_params: Any = None) -> jax.Array:
    """x̂ = dequantize(quantize(x)) (for delayed scaling see `fake_quant_with_history`)."""
    return _quantize(x, spec, key, history, _runtime(fmt_params))[4]


def fake_quant_with_history(x: jax.Array, spec: QuantSpec, history: jax.Array, *,
                            key: jax.Array | None = None, fmt_params: Any = None) -> tuple[jax.Array, jax.Array]:
    """(x̂, new history) for delayed scaling (the history rolled with this step's amax)."""
    _, _, _, new_history, xhat = _quantize(x, spec, key, history, _runtime(fmt_params))
    return xhat, new_history


# ---------------------------------------------------------------------------------------------
# Telemetry (the one definition: training's per-layer statistics are `telemetry_vector` too)
# ---------------------------------------------------------------------------------------------

TELEMETRY_FIELDS = ("amax", "frac_saturated", "frac_underflow", "snr_db",
                    "block_amax_min", "block_amax_p50", "block_amax_max")
TELEMETRY_BLOCK = 32  # block amax statistics use 32-wide blocks along the reduction axis (MX's)

# Saturation slack (2^-22: two float32 ulps at 1). The element that set a tensor/channel/block
# scale (scale = amax · fl(1/max)) maps to amax · fl(1 / fl(amax · fl(1/max))): four float32
# roundings from max, so up to (1 + 2^-24)^4 ≈ 1 + 2^-22 above it (measured: up to 2.02 · 2^-24).
# It loses nothing, yet with no slack it counts as clipped in 0.3% (fp8) to 25% (int8) of
# tensors, up to one element per block with block scales. A value clipped by less than the slack
# loses less than half a grid step at max (any format up to 16 bits): no more than rounding does.
_SATURATION_SLACK = 1.0 + 2.0**-22


def clipped(x: jax.Array, scale: jax.Array, fmax: jax.Array) -> jax.Array:
    """Where x was clipped at ±max by its quantisation: |x · fl(1/scale)| > max · (1 + 2^-22)
    (`_SATURATION_SLACK`); `scale` is x's scale broadcast to x's shape (`expand_scale`). A zero
    scale (a block NVFP4 flushed) clips nothing. Telemetry's frac_saturated is its mean; QuEST's
    trust mask its negation."""
    x = jnp.asarray(x, jnp.float32)
    live = scale > 0
    inv = jnp.where(live, 1.0 / jnp.where(live, scale, 1.0), 0.0)
    return jnp.abs(x * inv) > jnp.asarray(fmax, jnp.float32) * _SATURATION_SLACK


def telemetry_vector(x: jax.Array, xhat: jax.Array, scale: jax.Array, amax: jax.Array, fmax: jax.Array,
                     axis: int = -1) -> jax.Array:
    """float32 [TELEMETRY_FIELDS] of one quantisation of x (x may be a subsample of the tensor's rows,
    with the matching rows of x̂ and of the scale):

    amax            max |x| over the whole tensor (passed in: exact even when x is a subsample)
    frac_saturated  fraction of elements clipped at ±max: |x · fl(1/scale)| > max · (1 + 2^-22)
                    (`_SATURATION_SLACK`; a zero scale, a block NVFP4 flushed, clips nothing)
    frac_underflow  fraction of the non-zero elements of x that came out as zero
    snr_db          10·log10(Σ x² / Σ (x - x̂)²), on x · 2^-floor(log2 amax) (an exact power of two
                    that is never subnormal, so the sums cannot overflow and the scale cannot be
                    flushed to zero as 1/amax would for amax > 2^126); +inf when x̂ = x
    block_amax_*    [min, median, max] over the amax of TELEMETRY_BLOCK-wide blocks along `axis`,
                    whatever the quantisation's own granularity: what a just-in-time per-block scale
                    would see (a trailing partial block is left out; a shorter axis is one block)

    `scale` is x's scale broadcast to x's shape (`expand_scale`), `fmax` the element format's max.
    """
    x = jnp.asarray(x, jnp.float32)
    saturated = jnp.mean(clipped(x, scale, fmax).astype(jnp.float32))
    nonzero = x != 0
    underflow = jnp.sum(nonzero & (xhat == 0)) / jnp.maximum(jnp.sum(nonzero), 1)
    ok = (amax > 0) & jnp.isfinite(amax)
    norm = formats.pow2(-jnp.clip(formats.floor_log2(jnp.where(ok, amax, 1.0)), -126, 126))
    sig = jnp.sum(jnp.square(x * norm))
    err = jnp.sum(jnp.square((x - xhat) * norm))
    snr = jnp.where(err > 0, 10.0 * jnp.log10(sig / jnp.where(err > 0, err, 1.0)), jnp.inf)
    head = jnp.stack([jnp.asarray(amax, jnp.float32), saturated, underflow.astype(jnp.float32), snr.astype(jnp.float32)])
    return jnp.concatenate([head, _block_amax_stats(x, axis)])


def _block_amax_stats(x: jax.Array, axis: int) -> jax.Array:
    """[min, median, max] of the amax of TELEMETRY_BLOCK-wide blocks along `axis`."""
    a = jnp.abs(jnp.moveaxis(jnp.atleast_1d(x), axis if x.ndim else 0, -1))
    n = a.shape[-1]
    a = a.reshape(-1, n)
    if a.size == 0:
        return jnp.zeros((3,), jnp.float32)
    k = min(TELEMETRY_BLOCK, n)
    nb = n // k
    blocks = jnp.max(a[:, : nb * k].reshape(a.shape[0], nb, k), axis=-1)
    # jnp.median's value, without its NaN pass over the input (a reduction and a select, several
    # kernels in each quantised GEMM's telemetry): amaxes are >= 0 or +NaN, which sorts last
    s = jax.lax.sort(blocks.ravel())
    mid = (s[(s.size - 1) // 2] + s[s.size // 2]) * 0.5
    return jnp.stack([jnp.min(blocks), jnp.where(jnp.isnan(s[-1]), jnp.nan, mid), jnp.max(blocks)])


def telemetry(x: jax.Array, q: Quantized | jax.Array, spec: QuantSpec, *, history: jax.Array | None = None,
              fmt_params: Any = None) -> dict[str, jax.Array]:
    """`telemetry_vector` of one quantisation of x as a dict {TELEMETRY_FIELDS: scalar}, block
    statistics along `spec.axis`.

    `q` is the Quantized from `quantize` or x̂ itself; given x̂ the scales are recomputed from x
    (pass the same `history` and `fmt_params` as for the quantisation).
    """
    return dict(zip(TELEMETRY_FIELDS, _telemetry(x, q, spec, history, _runtime(fmt_params))))


@partial(jax.jit, static_argnums=(2,))
def _telemetry(x, q, spec: QuantSpec, history, fmt_params) -> jax.Array:
    x = jnp.asarray(x, jnp.float32)
    p = _params(spec, fmt_params)
    if isinstance(q, Quantized):
        scale, amax, xhat = q.scale, q.amax, dequantize(q, spec, x.shape)
    else:
        xhat = jnp.asarray(q, jnp.float32)
        nearest = dataclasses.replace(spec, rounding="nearest")  # scales do not depend on rounding
        _, scale, amax, _, _ = _quantize(x, nearest, None, history, fmt_params)
    axis = _norm_axis(spec.axis, x.ndim) if x.ndim else 0
    return telemetry_vector(x, xhat, expand_scale(scale, spec, x.shape), amax, p.max, axis)


__all__ = ["QuantSpec", "Quantized", "GRANULARITIES", "SCALINGS", "SCALE_ROUNDINGS",
           "DEFAULT_BLOCK", "TELEMETRY_FIELDS", "TELEMETRY_BLOCK", "init_history", "quantize", "dequantize",
           "expand_scale", "repeat_blocks", "is_square", "SCALE_FROM", "QUEST_CLIP", "nvfp4_tensor_scale", "fake_quant", "fake_quant_with_history",
           "telemetry", "telemetry_vector", "clipped"]
