"""quant: hand-computed cases for every granularity, an ml_dtypes reference, scale timing, telemetry."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from scaling.numerics import formats, quant
from scaling.errors import ConfigError
from scaling.numerics.quant import QuantSpec

# block maxima 1.5, 12, 0.75, 3 = 6 · 2^k, so every E2M1 scale below is exact
X = np.array([[0.75, -1.5, 3.0, 12.0],
              [0.375, 0.75, -1.25, 3.0]], np.float32)

HAND = [  # (spec kwargs, expected values, expected scale); format fp4_e2m1, grid 0 .5 1 1.5 2 3 4 6
    # no scale: .75 -> tie(.5, 1) -> 1 (the even code), 12 -> 6 | .375 -> .5, -1.25 -> tie(1, 1.5) -> -1
    (dict(granularity="none"), [[1, -1.5, 3, 6], [0.5, 1, -1, 3]], [[1.0]]),
    (dict(granularity="tensor"),  # scale 12/6 = 2; x/2 = .375 -.75 1.5 6 | .1875 .375 -.625 1.5
     [[0.5, -1, 1.5, 6], [0, 0.5, -0.5, 1.5]], [[2.0]]),
    (dict(granularity="channel"),  # amax per row along axis -1: 12, 3 -> scales 2, .5
     [[0.5, -1, 1.5, 6], [1, 1.5, -2, 6]], [[2.0], [0.5]]),
    (dict(granularity="channel", axis=0),  # per column: .75 1.5 3 12 -> .125 .25 .5 2
     [[6, -6, 6, 6], [3, 3, -2, 1.5]], [[0.125, 0.25, 0.5, 2.0]]),
    (dict(granularity="block", block=2),  # tiles [.75 -1.5][3 12] | [.375 .75][-1.25 3]
     [[3, -6, 1.5, 6], [3, 6, -2, 6]], [[0.25, 2.0], [0.125, 0.5]]),
    (dict(granularity="block", block=2, axis=0),  # tiles are the 2-row columns
     [[6, -6, 6, 6], [3, 3, -2, 1.5]], [[0.125, 0.25, 0.5, 2.0]]),
    (dict(granularity="block2d", block=2),  # 2x2 tiles: amax 1.5 and 12
     [[3, -6, 1.5, 6], [1.5, 3, -0.5, 1.5]], [[0.25, 2.0]]),
    (dict(granularity="mx", block=2),  # 2^(floor(log2 amax) - 2): 2^-2, 2^1, 2^-3, 2^-1
     [[3, -6, 1.5, 6], [3, 6, -2, 6]], [[0.25, 2.0], [0.125, 0.5]]),
]


@pytest.mark.parametrize("kw,values,scale", HAND, ids=[f"{h[0]['granularity']}-{i}" for i, h in enumerate(HAND)])
def test_hand_computed_e2m1(kw, values, scale):
    spec = QuantSpec(format="fp4_e2m1", **kw)
    q = quant.quantize(X, spec)
    np.testing.assert_array_equal(np.asarray(q.values), np.array(values, np.float32))
    np.testing.assert_array_equal(np.asarray(q.scale), np.array(scale, np.float32))
    assert float(q.amax) == 12.0 and q.history is None
    xhat = np.asarray(quant.fake_quant(X, spec))
    np.testing.assert_array_equal(xhat, np.asarray(quant.dequantize(q, spec, X.shape)))
    np.testing.assert_array_equal(xhat, np.array(values, np.float32) * np.asarray(quant.expand_scale(q.scale, spec, X.shape)))


@pytest.mark.slow
def test_mx_scale_exponent_floor_vs_ceil_and_saturation():
    x = np.array([[5.0, 1.0, -7.0, 0.3]], np.float32)
    floor = QuantSpec("fp4_e2m1", "mx", block=4)
    q = quant.quantize(x, floor)  # 2^(floor(log2 7) - emax 2) = 1: 7 saturates at 6
    assert float(q.scale[0, 0]) == 1.0
    np.testing.assert_array_equal(np.asarray(q.values), [[4, 1, -6, 0.5]])
    assert float(quant.telemetry(x, q, floor)["frac_saturated"]) == 0.25
    ceil = QuantSpec("fp4_e2m1", "mx", block=4, scale_rounding="ceil")
    q = quant.quantize(x, ceil)  # 2^ceil(log2(7/6)) = 2: nothing clips
    assert float(q.scale[0, 0]) == 2.0
    np.testing.assert_array_equal(np.asarray(q.values), [[2, 0.5, -4, 0]])
    assert float(quant.telemetry(x, q, ceil)["frac_saturated"]) == 0.0
    # amax exactly max · 2^k: ceil keeps 2^k (no spurious extra factor 2)
    q = quant.quantize(np.array([[6.0, -3.0]], np.float32), QuantSpec("fp4_e2m1", "mx", block=2, scale_rounding="ceil"))
    assert float(q.scale[0, 0]) == 1.0
    # ceil never clips the block max, for random blocks and an element format with a ragged max
    rng = np.random.default_rng(0)
    y = (rng.standard_normal((64, 96)) * np.exp2(rng.uniform(-20, 20, (64, 1)))).astype(np.float32)
    for fmt in ("fp4_e2m1", "fp8_e4m3", "fp6_e2m3"):
        t = quant.telemetry(y, quant.quantize(y, QuantSpec(fmt, "mx", scale_rounding="ceil")), QuantSpec(fmt, "mx", scale_rounding="ceil"))
        assert float(t["frac_saturated"]) == 0.0


def test_mx_e8m0_clamp():
    # fp8_e4m3 (emax 8): amax 2^-120 wants 2^-128, clamped to E8M0's 2^-127
    x = np.array([[2.0**-120, 2.0**-121]], np.float32)
    q = quant.quantize(x, QuantSpec("fp8_e4m3", "mx", block=2))
    assert np.asarray(q.scale).view(np.int32)[0, 0] == np.float32(2.0**-127).view(np.int32)
    np.testing.assert_array_equal(np.asarray(q.values), [[128.0, 64.0]])
    # a zero block gets scale 1 and zeros
    q = quant.quantize(np.zeros((1, 4), np.float32), QuantSpec("fp8_e4m3", "mx", block=2))
    np.testing.assert_array_equal(np.asarray(q.scale), [[1.0, 1.0]])


ML_DTYPES = {"fp4_e2m1": ml_dtypes.float4_e2m1fn, "fp6_e2m3": ml_dtypes.float6_e2m3fn,
             "fp6_e3m2": ml_dtypes.float6_e3m2fn, "fp8_e4m3": ml_dtypes.float8_e4m3fn,
             "fp8_e5m2": ml_dtypes.float8_e5m2}


@pytest.mark.parametrize("fmt", ["fp4_e2m1", "fp6_e2m3", "fp6_e3m2", "fp8_e4m3"])
def test_mx_ceil_scale_of_blocks_below_2_pow_minus_126_times_max(fmt):
    # amax / max is a float32 subnormal here (XLA:CPU flushes it to 0): the scale must still be
    # 2^ceil(log2(amax / max)) (clamped to E8M0), computed in float64 by the reference, and the
    # block's values the ml_dtypes rounding of x · 2^-e (no block zeroed)
    fmax = formats.get(fmt).max
    rng = np.random.default_rng(3)
    rows = []
    for k in np.arange(-127.0, -112.0, 0.5):  # amax from 2^-127 · max up: elements stay float32-normal
        amax = max(2.0**k * fmax, 2.0**-125)
        rows.append(np.concatenate([[amax], amax * rng.uniform(0.02, 1.0, 7) * rng.choice([-1, 1], 7)]))
    x = np.maximum(np.abs(np.array(rows)), 2.0**-126) * np.sign(rows)
    x = x.astype(np.float32)
    spec = QuantSpec(fmt, "mx", block=8, scale_rounding="ceil")
    q = quant.quantize(x, spec)
    amax = np.max(np.abs(x.astype(np.float64)), axis=1, keepdims=True)
    e = np.clip(np.ceil(np.log2(amax / fmax)), -127, 127)
    np.testing.assert_array_equal(np.log2(np.asarray(q.scale, np.float64)), e)
    ref = np.clip(x * np.exp2(-e), -fmax, fmax).astype(ML_DTYPES[fmt]).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(q.values).view(np.int32), ref.view(np.int32))
    assert np.all(np.abs(np.asarray(q.values))[:, 0] > 0)  # the block max never vanishes


def test_nvfp4_block_flushed_by_its_scale_keeps_the_sign_of_zero():
    # tensor amax 1e30 makes block 1's E4M3 scale (1e-10 / 6 / s_t) round to 0: its elements flush
    # to ±0 with the sign of the input, as TransformerEngine's cast gives (-0 for negative inputs)
    x = np.zeros((2, 32), np.float32)
    x[0, 0] = 1e30
    x[:, 16:] = np.linspace(-1e-10, 1e-10, 32, dtype=np.float32).reshape(2, 16)
    x[1, 20] = -0.0
    spec = QuantSpec("fp4_e2m1", "nvfp4")
    q = quant.quantize(x, spec)
    assert np.all(np.asarray(q.scale)[:, 1] == 0)
    for out in (np.asarray(q.values), np.asarray(quant.fake_quant(x, spec))):
        np.testing.assert_array_equal(out[:, 16:], 0.0)
        np.testing.assert_array_equal(np.signbit(out[:, 16:]), np.signbit(x[:, 16:]))


def test_nvfp4_two_level_scale_hand_case():
    # tensor amax 2688 = 448 · 6 -> s_t = 2688 · fl(1/2688) = 1. Blocks of 16:
    #   block 0: amax 2688 -> s_b = E4M3(448) = 448, element 2688/448 = 6
    #   block 1: amax 60   -> s_b = E4M3(10) = 10, 25/10 = 2.5 -> tie -> 2
    #   block 2: amax 7    -> s_b = E4M3(7/6 = 1.1667) = 1.125; 7/1.125 = 6.22 saturates to 6
    x = np.zeros((1, 48), np.float32)
    x[0, 0], x[0, 1] = 2688.0, -448.0
    x[0, 16], x[0, 17] = 60.0, 25.0
    x[0, 32], x[0, 33] = 7.0, 1.125
    spec = QuantSpec("fp4_e2m1", "nvfp4")
    assert spec.block == 16
    q = quant.quantize(x, spec)
    np.testing.assert_array_equal(np.asarray(q.scale), [[448.0, 10.0, 1.125]])
    v = np.asarray(q.values)[0]
    assert (v[0], v[1], v[16], v[17], v[32], v[33]) == (6, -1, 6, 2, 6, 1)
    assert float(quant.telemetry(x, q, spec)["frac_saturated"]) == pytest.approx(1 / 48)
    # tensor scale not 1: s_t = 12 / 2688; block 1 amax 0.75 -> E4M3(0.75 / 6 / s_t = 28) = 28
    y = np.zeros((1, 32), np.float32)
    y[0, 0], y[0, 16], y[0, 17] = 12.0, 0.75, 0.5
    q = quant.quantize(y, spec)
    s_t = np.float32(12.0) * (np.float32(1) / np.float32(2688.0))
    np.testing.assert_array_equal(np.asarray(q.scale), [[np.float32(448) * s_t, np.float32(28) * s_t]])
    assert float(q.values[0, 17]) == 4.0  # 0.5 / (28 · 12/2688) = 4


def _reference(x: np.ndarray, spec: QuantSpec) -> tuple[np.ndarray, np.ndarray]:
    """Independent numpy reference: loop over scale groups, ml_dtypes cast of clip(x · fl(1/scale))
    (the quantiser's documented arithmetic: every division by a scale is a reciprocal product)."""
    dtype = {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2,
             "fp4_e2m1": ml_dtypes.float4_e2m1fn, "fp6_e3m2": ml_dtypes.float6_e3m2fn}[spec.format]
    fmt = spec.fmt
    fmax = np.float32(fmt.max)
    xt = np.moveaxis(x, spec.axis, -1)  # groups run along the last axis of xt
    vals = np.zeros_like(xt)
    n = xt.shape[-1]
    k = spec.block or n
    nb = math.ceil(n / k)
    scales = np.zeros(xt.shape[:-1] + (nb,), np.float32)
    amax_t = np.float32(np.max(np.abs(x)))
    one = np.float32(1.0)
    if spec.granularity == "tensor":
        s = amax_t * (one / fmax)
        return np.clip(x * (one / s), -fmax, fmax).astype(dtype).astype(np.float32), np.full((1, 1), s)
    for idx in np.ndindex(*xt.shape[:-1]):
        for b in range(nb):
            seg = xt[idx][b * k:(b + 1) * k]
            a = np.float32(np.max(np.abs(seg)))
            if spec.granularity == "mx":
                s = np.float32(2.0 ** (math.floor(math.log2(a)) - fmt.emax)) if a > 0 else np.float32(1)
            elif spec.granularity == "nvfp4":
                s_t = amax_t * (one / np.float32(2688.0))
                s_b = np.float32((a * (one / (np.float32(6.0) * s_t))).astype(ml_dtypes.float8_e4m3fn))
                s = (s_b if a > 0 else np.float32(1)) * s_t
            else:
                s = a * (one / fmax) if a > 0 else np.float32(1)
            scales[idx + (b,)] = s
            vals[idx][b * k:(b + 1) * k] = np.clip(seg * (one / s), -fmax, fmax).astype(dtype).astype(np.float32)
    return np.moveaxis(vals, -1, spec.axis), np.moveaxis(scales, -1, spec.axis)


REF_SPECS = [
    QuantSpec("fp8_e4m3", "tensor"),
    QuantSpec("fp8_e5m2", "channel", axis=0),
    QuantSpec("fp6_e3m2", "block", block=32),
    QuantSpec("fp8_e4m3", "block", block=16, axis=0),
    QuantSpec("fp8_e4m3", "block", block=128),  # the amax halving path (k > 32), one padded block
    QuantSpec("fp6_e3m2", "block", block=64, axis=0),
    QuantSpec("fp4_e2m1", "mx"),
    QuantSpec("fp8_e4m3", "mx", axis=0),
    QuantSpec("fp4_e2m1", "nvfp4"),
    QuantSpec("fp4_e2m1", "nvfp4", axis=0),
]


@pytest.mark.parametrize("spec", REF_SPECS, ids=lambda s: f"{s.format}-{s.granularity}-ax{s.axis}")
def test_against_numpy_reference_with_partial_blocks(spec):
    rng = np.random.default_rng(1)
    # 40 and 70 are not multiples of 16 or 32: the last block along either axis is partial
    x = (rng.standard_normal((40, 70)) * np.exp2(rng.uniform(-6, 6, (40, 70)))).astype(np.float32)
    x[3] = 0.0  # an all-zero row (and so all-zero blocks)
    want_v, want_s = _reference(x, spec)
    q = quant.quantize(x, spec)
    np.testing.assert_array_equal(np.asarray(q.scale), want_s)
    np.testing.assert_array_equal(np.asarray(q.values), want_v)


def test_non_dividing_block_has_its_own_scale():
    x = np.array([[0.75, 1.5, 3.0, 6.0, 0.375], [0, 0, 0, 0, 12.0]], np.float32)
    spec = QuantSpec("fp4_e2m1", "block", block=2)
    q = quant.quantize(x, spec)
    assert q.scale.shape == (2, 3)
    np.testing.assert_array_equal(np.asarray(q.scale), [[0.25, 1.0, 0.0625], [1.0, 1.0, 2.0]])
    np.testing.assert_array_equal(np.asarray(q.values), [[3, 6, 3, 6, 6], [0, 0, 0, 0, 6]])
    np.testing.assert_array_equal(np.asarray(quant.fake_quant(x, spec)), x)
    # block2d on a 3x5 array with 2x2 tiles: a 2x3 grid of tiles, the edge ones partial
    q = quant.quantize(np.arange(15, dtype=np.float32).reshape(3, 5), QuantSpec("fp8_e4m3", "block2d", block=2))
    tile_amax = np.array([[6, 8, 9], [11, 13, 14]], np.float32)
    np.testing.assert_array_equal(np.asarray(q.scale), tile_amax * (np.float32(1) / np.float32(448)))
    # 64x64 tiles of a 70x130 array: tile maxima against numpy
    y = np.random.default_rng(5).standard_normal((70, 130)).astype(np.float32)
    q = quant.quantize(y, QuantSpec("fp8_e4m3", "block2d", block=64))
    yp = np.pad(np.abs(y), ((0, 58), (0, 62)))
    tile_amax = yp.reshape(2, 64, 3, 64).max(axis=(1, 3))
    np.testing.assert_array_equal(np.asarray(q.scale), tile_amax * (np.float32(1) / np.float32(448)))
    s_full = np.repeat(np.repeat(np.asarray(q.scale), 64, 0), 64, 1)[:70, :130]
    ref = np.clip(y * (np.float32(1) / s_full), -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(q.values), ref)


@pytest.mark.slow
@pytest.mark.parametrize("gran", ["none", "tensor", "channel", "block", "block2d", "mx", "nvfp4"])
def test_all_zero_input_is_safe(gran):
    spec = QuantSpec("fp4_e2m1", gran)
    x = jnp.zeros((4, 40), jnp.float32)
    q = quant.quantize(x, spec)
    assert np.all(np.asarray(q.values) == 0) and np.all(np.asarray(q.scale) == 1.0)
    t = quant.telemetry(x, q, spec)
    assert float(t["amax"]) == 0 and float(t["frac_saturated"]) == 0 and float(t["frac_underflow"]) == 0
    assert float(t["snr_db"]) == np.inf


def test_pow2_scale_and_margin():
    x = np.array([[3.0, -1.0, 0.5, 10.0]], np.float32)  # amax 10 / max 6 = 1.667 -> 2
    q = quant.quantize(x, QuantSpec("fp4_e2m1", "tensor", pow2_scale=True))
    assert float(q.scale.squeeze()) == 2.0
    np.testing.assert_array_equal(np.asarray(q.values), [[1.5, -0.5, 0.0, 4.0]])  # x/2: .25 -> 0, 5 -> 4 (ties to even)
    q = quant.quantize(x, QuantSpec("fp4_e2m1", "tensor", margin=1))  # scale 10 · fl(2/6)
    assert float(q.scale.squeeze()) == np.float32(10.0) * (np.float32(2.0) / np.float32(6.0))
    q = quant.quantize(np.array([[12.0, 1.0]], np.float32), QuantSpec("fp4_e2m1", "tensor", pow2_scale=True))
    assert float(q.scale.squeeze()) == 2.0  # an exact power of two stays


def test_delayed_scaling_history_semantics():
    spec = QuantSpec("fp8_e4m3", "tensor", scaling="delayed", amax_history=3)
    base = np.array([1.0, -0.5, 0.25], np.float32)
    amaxes = [448.0, 896.0, 224.0, 112.0, 56.0]
    h = quant.init_history(spec)
    np.testing.assert_array_equal(np.asarray(h), [0, 0, 0])
    expected_scales = [1.0, 1.0, 2.0, 2.0, 2.0]  # step 1: current (empty history); then max of the past 3
    expected_hist = [[448, 0, 0], [896, 448, 0], [224, 896, 448], [112, 224, 896], [56, 112, 224]]
    for a, s, eh in zip(amaxes, expected_scales, expected_hist):
        x = base * np.float32(a)
        q = quant.quantize(x, spec, history=h)
        assert float(q.scale.squeeze()) == s
        np.testing.assert_array_equal(np.asarray(q.history), eh)
        xhat, h2 = quant.fake_quant_with_history(x, spec, h)
        np.testing.assert_array_equal(np.asarray(h2), eh)
        np.testing.assert_array_equal(np.asarray(xhat), np.asarray(quant.dequantize(q, spec)))
        h = q.history
    # step 2 used the stale amax 448 for a tensor of amax 896: it saturated
    q = quant.quantize(base * 896, spec, history=jnp.array([448.0, 0, 0]))
    assert float(q.values[0]) == 448.0
    assert float(quant.telemetry(base * 896, q, spec)["frac_saturated"]) == pytest.approx(1 / 3)
    with pytest.raises(ConfigError, match="history"):
        quant.quantize(base, spec)


def test_telemetry_values():
    spec = QuantSpec("fp4_e2m1", "none")
    x = np.array([1.0, 2.0, 3.0, 100.0, 0.2, 0.0, -0.1, 0.0], np.float32)
    t = {k: float(v) for k, v in quant.telemetry(x, quant.quantize(x, spec), spec).items()}
    # x̂ = 1 2 3 6 0 0 -0 0: one clipped of 8; 0.2 and -0.1 flushed of 6 non-zeros
    err = 94.0**2 + 0.2**2 + 0.1**2
    sig = 1 + 4 + 9 + 100.0**2 + 0.2**2 + 0.1**2
    assert t["amax"] == 100.0
    assert t["frac_saturated"] == 1 / 8
    assert t["frac_underflow"] == pytest.approx(2 / 6)
    assert t["snr_db"] == pytest.approx(10 * math.log10(sig / err), rel=1e-5)
    # x̂ instead of Quantized gives the same numbers; a lossless quantisation has infinite SNR
    t2 = quant.telemetry(x, quant.fake_quant(x, spec), spec)
    assert all(float(t2[k]) == pytest.approx(v) for k, v in t.items())
    exact = np.array([1.0, -2.0, 6.0], np.float32)
    assert float(quant.telemetry(exact, quant.quantize(exact, spec), spec)["snr_db"]) == np.inf
    # huge values do not overflow the SNR sums
    big = np.array([3e38, -1e38, 2e38], np.float32)
    tb = quant.telemetry(big, quant.quantize(big, QuantSpec("fp8_e4m3")), QuantSpec("fp8_e4m3"))
    assert np.isfinite(float(tb["snr_db"])) and float(tb["snr_db"]) > 20


def test_saturation_counts_clipped_values_not_the_one_that_set_the_scale():
    """frac_saturated: |x · fl(1/scale)| beyond max by more than the float32 error of the reciprocal
    products (quant._SATURATION_SLACK). The amax element of an INT8 tensor lands above 127 in float32
    for about a quarter of amaxes; it is not clipped, so nothing here saturates."""
    rng = np.random.default_rng(7)
    amax = (rng.uniform(1, 2, 4000) * np.exp2(rng.integers(-20, 20, 4000))).astype(np.float32)
    one, fmax = np.float32(1), np.float32(127)
    above = amax[amax * (one / (amax * (one / fmax))) > fmax][:16]
    assert len(above) == 16
    spec = QuantSpec("int8", "tensor")
    for a in above:
        x = np.array([a, -a / 3, a / 7, 0.0], np.float32)
        assert float(quant.telemetry(x, quant.quantize(x, spec), spec)["frac_saturated"]) == 0.0
    # a really clipped value counts: a stale delayed scale, 2x too small
    x = np.array([254.0, 1.0, -3.0, 100.0], np.float32)
    delayed = QuantSpec("int8", "tensor", scaling="delayed", amax_history=2)
    q = quant.quantize(x, delayed, history=jnp.array([127.0, 0.0]))
    assert float(quant.telemetry(x, q, delayed, history=jnp.array([127.0, 0.0]))["frac_saturated"]) == 0.25
    # an NVFP4 block whose E4M3 scale underflowed is flushed: underflow, not saturation
    y = np.zeros((1, 32), np.float32)
    y[0, 0], y[0, 16], y[0, 17] = 2688.0, 1e-3, -5e-4  # block 1: 1e-3 / 6 < E4M3's smallest 2^-9 / 2
    q = quant.quantize(y, QuantSpec("fp4_e2m1", "nvfp4"))
    assert float(q.scale[0, 1]) == 0.0 and float(q.values[0, 16]) == 0.0
    t = quant.telemetry(y, q, QuantSpec("fp4_e2m1", "nvfp4"))
    assert float(t["frac_saturated"]) == 0.0 and float(t["frac_underflow"]) == pytest.approx(2 / 3)


def test_block_amax_telemetry_sees_blocks_the_tensor_amax_hides():
    """Per-block amax statistics (32-wide blocks along the reduction axis) beside the per-tensor
    amax: a zero block gives min 0, the largest block is the tensor amax, the median is exact."""
    rows, k = 4, 96  # 3 blocks of 32 per row
    block_amax = np.array([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0], [6.0, 7.0, 8.0], [9.0, 10.0, 400.0]], np.float32)
    x = np.zeros((rows, k), np.float32)
    for r in range(rows):
        for b in range(3):
            x[r, 32 * b + (r + b) % 32] = -block_amax[r, b] if b % 2 else block_amax[r, b]
    spec = QuantSpec("fp8_e4m3", axis=1)
    tel = {f: float(v) for f, v in quant.telemetry(x, quant.quantize(x, spec), spec).items()}
    assert tel["amax"] == 400.0
    assert (tel["block_amax_min"], tel["block_amax_p50"], tel["block_amax_max"]) == (0.0, np.median(block_amax), 400.0)
    # along axis 0 (a weight K x N) the blocks run down the columns: the transpose gives the same stats
    spec0 = QuantSpec("fp8_e4m3", axis=0)
    tel_t = quant.telemetry(x.T, quant.quantize(x.T, spec0), spec0)
    assert all(float(tel_t[f]) == tel[f] for f in ("block_amax_min", "block_amax_p50", "block_amax_max"))


@pytest.mark.parametrize("shape", [(3, 96), (4, 96), (5, 64), (1, 32), (7, 20)])
@pytest.mark.parametrize("nan", [False, True])
def test_block_amax_median_is_numpys_also_with_nan(shape, nan):
    """The median of the block amaxes (odd and even block counts, a block shorter than 32) is
    numpy's, and NaN where an element is NaN, as numpy's median would be."""
    x = np.random.default_rng(shape[0]).standard_normal(shape).astype(np.float32)
    if nan:
        x[-1, 0] = np.nan
    k = min(quant.TELEMETRY_BLOCK, shape[1])
    blocks = np.abs(x[:, : shape[1] // k * k]).reshape(shape[0], -1, k).max(axis=-1)
    got = np.asarray(jax.jit(lambda v: quant._block_amax_stats(v, 1))(x))
    np.testing.assert_array_equal(got, [np.min(blocks), np.median(blocks), np.max(blocks)])


@pytest.mark.parametrize("spec", [QuantSpec("fp4_e2m1", "mx", rounding="stochastic"),
                                  QuantSpec("fp4_e2m1", "mx", axis=0, rounding="stochastic"),
                                  QuantSpec("fp4_e2m1", "nvfp4", rounding="stochastic"),
                                  QuantSpec("fp6_e3m2", "block", block=16, rounding="stochastic"),
                                  QuantSpec("fp8_e4m3", "block2d", block=16, rounding="stochastic"),
                                  QuantSpec("int4", "channel", rounding="stochastic")],
                         ids=lambda s: f"{s.granularity}-ax{s.axis}")
@pytest.mark.slow
def test_stochastic_draws_follow_the_element_not_the_block_layout(spec):
    """Each element's random number is drawn for its index in x (formats.random_bits of x's shape),
    whatever the padded block layout: quantising equals rounding x / scale elementwise with the key."""
    x = np.random.default_rng(8).standard_normal((40, 70)).astype(np.float32)  # partial blocks on both axes
    key = jax.random.key(9)
    q = quant.quantize(x, spec, key=key)
    nearest = quant.quantize(x, dataclasses.replace(spec, rounding="nearest"))
    np.testing.assert_array_equal(np.asarray(q.scale), np.asarray(nearest.scale))
    inv = np.float32(1) / np.asarray(quant.expand_scale(q.scale, spec, x.shape))
    want = formats.round_to_format(x * inv, spec.format, "stochastic", key)
    np.testing.assert_array_equal(np.asarray(q.values), np.asarray(want))


def test_stochastic_rounding_through_fake_quant():
    spec = QuantSpec("fp4_e2m1", "mx", rounding="stochastic")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    nearest = quant.quantize(x, QuantSpec("fp4_e2m1", "mx"))
    f = jax.jit(jax.vmap(lambda k: quant.fake_quant(x, spec, key=k)))
    draws = np.asarray(f(jax.random.split(jax.random.key(0), 4000)), np.float64)
    full_scale = np.asarray(quant.expand_scale(nearest.scale, spec, x.shape))
    grid = np.array(formats.representable("fp4_e2m1"))
    mag = np.abs(x / full_scale).astype(np.float64)
    i = np.clip(np.searchsorted(grid, mag, side="right"), 1, len(grid) - 1)
    lo = grid[i - 1] * full_scale
    hi = np.where(mag >= grid[-1], grid[-1], grid[i]) * full_scale
    d = np.abs(draws)
    assert np.all((d == lo) | (d == hi))  # only the two neighbours
    se = (hi - lo) / 2 / np.sqrt(draws.shape[0])
    assert np.all(np.abs(draws.mean(0) - x) <= 5 * se + 1e-7)  # unbiased (saturated ones: hi == lo)
    with pytest.raises(ConfigError, match="key"):
        quant.fake_quant(x, spec)


@pytest.mark.parametrize("spec", [QuantSpec("fp8_e4m3", "channel"), QuantSpec("fp6_e2m3", "block", block=8),
                                  QuantSpec("fp4_e2m1", "mx"), QuantSpec("fp4_e2m1", "nvfp4"),
                                  QuantSpec("int8", "block2d", block=4)], ids=lambda s: s.granularity)
@pytest.mark.slow
def test_jit_and_vmap_match_eager(spec):
    x = np.random.default_rng(3).standard_normal((3, 8, 40)).astype(np.float32)
    eager = np.stack([np.asarray(quant.fake_quant(xi, spec)) for xi in x])
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(lambda v: quant.fake_quant(v, spec)))(x)), eager)
    q = jax.jit(lambda v: quant.quantize(v, spec))(x[0])
    np.testing.assert_array_equal(np.asarray(quant.dequantize(q, spec)), eager[0])
    t = jax.jit(lambda v: quant.telemetry(v, quant.quantize(v, spec), spec))(x[0])
    assert set(t) == set(quant.TELEMETRY_FIELDS)


@pytest.mark.slow
def test_traced_format_params_one_compile():
    traces = []

    def f(x, p):
        traces.append(1)
        return quant.fake_quant(x, QuantSpec("fp8_e4m3", "mx"), fmt_params=p)

    jf = jax.jit(f)
    x = np.random.default_rng(4).standard_normal((8, 64)).astype(np.float32)
    for name in ("fp8_e4m3", "fp8_e5m2", "fp6_e2m3", "fp6_e3m2", "fp4_e2m1", "int8"):
        got = np.asarray(jf(x, formats.get(name).params()))
        np.testing.assert_array_equal(got, np.asarray(quant.fake_quant(x, QuantSpec(name, "mx"))))
    assert len(traces) == 1
    # names and Formats are accepted too (resolved outside jit)
    np.testing.assert_array_equal(np.asarray(quant.fake_quant(x, QuantSpec("fp8_e4m3", "mx"), fmt_params="fp6_e3m2")),
                                  np.asarray(quant.fake_quant(x, QuantSpec("fp6_e3m2", "mx"))))
    ieee = formats.float_format(3, 4, "ieee")  # a Format object as the spec's format
    v = np.asarray(quant.quantize(np.array([[15.5, 16.0, 40.0]], np.float32), QuantSpec(ieee, "none")).values)
    np.testing.assert_array_equal(v, [[15.5, 15.5, 15.5]])


def test_int_formats():
    x = np.array([[2.5, -3.5, 0.5, 7.0, 100.0, -0.4]], np.float32)
    q = quant.quantize(x, QuantSpec("int4", "none"))
    np.testing.assert_array_equal(np.asarray(q.values), [[2, -4, 0, 7, 7, -0.0]])
    q = quant.quantize(x, QuantSpec("int8", "tensor"))  # scale 100 · fl(1/127)
    s = np.float32(100.0) * (np.float32(1) / np.float32(127.0))
    np.testing.assert_array_equal(np.asarray(q.values), np.clip(np.rint(x * (np.float32(1) / s)), -127, 127))


def test_spec_validation_and_properties():
    s = QuantSpec("e4m3", "mx")
    assert s.block == 32 and s.fmt == formats.get("fp8_e4m3") and s.bits == 8
    assert QuantSpec("fp8_e4m3", "block").block == 128 and QuantSpec("fp8_e4m3", "block2d").block == 128
    assert QuantSpec("fp4_e2m1", "nvfp4").block == 16 and QuantSpec("int4").bits == 4
    bad = [
        (dict(format="fp7"), "format"),
        (dict(granularity="row"), "granularity"),
        (dict(granularity="nvfp4", format="fp8_e4m3"), "format"),
        (dict(scaling="delayed", granularity="mx"), "scaling"),
        (dict(scaling="later"), "scaling"),
        (dict(granularity="block", block=0), "block"),
        (dict(granularity="tensor", block=32), "block"),
        (dict(rounding="up"), "rounding"),
        (dict(margin=0.5), "margin"),
        (dict(amax_history=0), "amax_history"),
        (dict(granularity="mx", pow2_scale=True), "pow2_scale"),
        (dict(scale_rounding="ceil"), "scale_rounding"),
        (dict(granularity="mx", scale_rounding="up"), "scale_rounding"),
    ]
    for kw, key in bad:
        with pytest.raises(ConfigError) as err:
            QuantSpec(**kw)
        assert err.value.key == key and "\n" not in str(err.value), kw
    with pytest.raises(ConfigError, match="axis"):
        quant.quantize(np.ones((2, 3), np.float32), QuantSpec("fp8_e4m3", "channel", axis=2))


def test_precision_doc_snippet_runs():
    """The telemetry snippet in docs/precision.md (moved there from README.md) runs as written."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "precision.md").read_text()
    section = doc.split("## Number formats and quantisation", 1)[1]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(snippet.strip().splitlines()) == 3
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(snippet, "docs/precision.md", "exec"), {})
    stats = eval(out.getvalue().strip())  # the snippet prints a dict of floats
    assert set(stats) == set(quant.TELEMETRY_FIELDS)
    assert 10 < stats["snr_db"] < 30 and 0 < stats["frac_saturated"] < 0.1


def test_block_scales_pass_through_bfloat16_unchanged():
    """quant._once_per_block (a fusion boundary for XLA:CPU) must not change a block scale: every E8M0
    power of two 2^-127..2^127 (2^-127 a float32 subnormal) and every finite E4M3 value (NVFP4's block
    scales, subnormals included) comes back bit for bit, jitted, on this backend."""
    e8m0 = np.ldexp(np.float32(1), np.arange(-127, 128)).astype(np.float32)
    e4m3 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    e4m3 = e4m3[np.isfinite(e4m3)]
    for scales in (e8m0, e4m3):
        out = np.asarray(jax.jit(quant._once_per_block)(jnp.asarray(scales)))
        assert np.array_equal(out.view(np.uint32), scales.view(np.uint32))
