"""Precision recipes and the quantised matmul that simulates all three GEMMs of a dense layer.

A `Recipe` names, per tensor role, a `quant.QuantSpec` (or None = full FP32):

    weight      W as input of the fprop (Y = X·W) and dgrad (dX = dY·Wᵀ) GEMMs
    activation  X as input of the fprop and wgrad (dW = Xᵀ·dY) GEMMs
    grad        dY as input of the dgrad and wgrad GEMMs
    attention   Q, K, V and the softmax probabilities as inputs of the two attention matmuls

`qdot(x_MxK, w_KxN, recipe)` is a `jax.custom_vjp` matmul:

    fprop  Y  = Q(X; along K) · Q(W; along K)
    dgrad  dX = Q(dY; along N) · Q(W; along N)ᵀ
    wgrad  dW = Q(X; along M)ᵀ · Q(dY; along M)

every operand quantised with its role's spec along *that* GEMM's reduction axis (a block or channel
scale must not straddle the sum). Forward-only recipes (Kumar et al. 2024) keep dgrad/wgrad in FP32.

Exact fast path. A value on an FP8/FP6/FP4/INT8 grid (<= 7 mantissa bits, exponent inside
bfloat16's range) is exactly a bfloat16, and the product of two such values is exact in FP32, so
`jnp.dot(v_a.astype(bf16), v_b.astype(bf16), preferred_element_type=f32)` on the *unscaled* grid
values gives the same products as the FP32 simulation; only FP32 accumulation order differs.
Scales are applied outside the dot: per tensor/channel as an outer product of row and column
scales, per K-block (1×k, k×k) as one batched dot per block summed in FP32, and for MX (power of
two E8M0 scale) and NVFP4 (E4M3 block scale × E2M1 value: <= 6 significant bits) the block scale is
folded into the bf16 operand, where it stays exact; NVFP4's FP32 tensor scale is applied outside.

Formats are runtime values. The numbers that define a format (mantissa bits, exponent range,
max) travel as a float32 vector (`format_vector`), so one compiled train step serves every format of
the same granularity; only whether the fast path is exact (a static property of the format family)
changes the program. `RecipeStructure` is the static, format-free part a model stores.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from scaling import formats, quant
from scaling.errors import ConfigError

ROLES = ("weight", "activation", "grad", "attention")
GEMM_ROLES = ("weight", "activation", "grad")
GRANULARITIES = ("none", "tensor", "channel", "block", "block2d", "mx", "nvfp4")

# ---------------------------------------------------------------------------------------------
# Recipe
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recipe:
    """Which QuantSpec each tensor role gets, plus the switches around it.

    forward_only: dgrad/wgrad GEMMs run in FP32 (quantisation-aware forward only, Kumar et al.).
    fp32_sensitive_ops: softmax, norms, residual adds and the loss in FP32; if False they are
        computed through bfloat16 (rounded in and out).
    high_precision_embed: embedding and output head unquantised (DeepSeek-V3); if False the head
        is a qdot like every other projection and the embedding table is fake-quantised as a weight.
    fast_path: run exact low-precision GEMMs as bf16×bf16→fp32 dots (see module docstring).
    """

    name: str = "fp32"
    weight: Any = None
    activation: Any = None
    grad: Any = None
    attention: Any = None
    forward_only: bool = False
    fp32_sensitive_ops: bool = True
    high_precision_embed: bool = True
    fast_path: bool = True

    def role_bits(self, role: str) -> int:
        """Bit width of one role's element format (32 when the role is unquantised)."""
        spec = getattr(self, role)
        return 32 if spec is None else int(formats.get(spec.format).bits)

    @property
    def bits_w(self) -> int:
        return self.role_bits("weight")

    @property
    def bits_a(self) -> int:
        return self.role_bits("activation")

    @property
    def bits_g(self) -> int:
        return self.role_bits("grad")

    @property
    def bits(self) -> int:
        """P the scaling laws see: the forward GEMM inputs' bit width, max(P_w, P_a).

        Kumar et al. fit P on the forward (weights/activations); gradients are reported separately
        as `bits_g`. The max is the conservative choice when weights and activations differ.
        """
        return max(self.bits_w, self.bits_a)

    def structure(self) -> "RecipeStructure":
        """The static, format-free part of the recipe (what a compiled program depends on)."""
        return RecipeStructure(
            **{r: None if getattr(self, r) is None else role_structure(getattr(self, r)) for r in ROLES},
            forward_only=self.forward_only,
            fp32_sensitive_ops=self.fp32_sensitive_ops,
            high_precision_embed=self.high_precision_embed,
            fast_path=self.fast_path,
        )

    def formats(self) -> dict[str, jax.Array]:
        """Runtime format vectors of the quantised roles (see `format_vector`)."""
        return {r: format_vector(getattr(self, r).format) for r in ROLES if getattr(self, r) is not None}

    def describe(self) -> dict:
        """JSON-friendly description (for config.json / summary.json)."""
        out: dict[str, Any] = {"name": self.name, "bits": self.bits, "bits_w": self.bits_w,
                               "bits_a": self.bits_a, "bits_g": self.bits_g}
        for r in ROLES:
            spec = getattr(self, r)
            out[r] = None if spec is None else {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
        for k in ("forward_only", "fp32_sensitive_ops", "high_precision_embed", "fast_path"):
            out[k] = getattr(self, k)
        return out


@dataclass(frozen=True)
class RoleStructure:
    """The static part of a role: its QuantSpec with a canonical stand-in element format (the real
    format is a runtime vector), and whether the real format's grid is exact in bfloat16."""

    spec: Any  # quant.QuantSpec
    exact_in_bf16: bool

    @property
    def granularity(self) -> str:
        return self.spec.granularity

    @property
    def block(self) -> int:
        return self.spec.block or 1

    @property
    def scaling(self) -> str:
        return self.spec.scaling

    @property
    def amax_history(self) -> int:
        return self.spec.amax_history

    def along(self, axis: int) -> Any:
        return dataclasses.replace(self.spec, axis=axis)


@dataclass(frozen=True)
class RecipeStructure:
    weight: RoleStructure | None = None
    activation: RoleStructure | None = None
    grad: RoleStructure | None = None
    attention: RoleStructure | None = None
    forward_only: bool = False
    fp32_sensitive_ops: bool = True
    high_precision_embed: bool = True
    fast_path: bool = True

    @property
    def quantises_gemms(self) -> bool:
        return any(getattr(self, r) is not None for r in GEMM_ROLES)


def role_structure(spec: Any) -> RoleStructure:
    exact = _exact_in_bf16(formats.get(spec.format))
    # the stand-in only has to pass QuantSpec's checks; nvfp4 requires E2M1 elements
    canonical = "fp4_e2m1" if spec.granularity == "nvfp4" else ("fp8_e4m3" if exact else "fp16")
    return RoleStructure(spec=dataclasses.replace(spec, format=canonical), exact_in_bf16=exact)


def _exact_in_bf16(fmt: Any) -> bool:
    """Every grid value of `fmt` is a bfloat16: <= 8 significant bits and exponents in range
    (bf16 shares float32's exponent range, subnormals down to 2^-133)."""
    if fmt.kind == "int":
        return fmt.bits <= 9  # |v| <= 2^(k-1) - 1 <= 255: at most 8 significant bits
    return fmt.mbits <= 7 and fmt.emax <= 127 and fmt.emin - fmt.mbits >= -133


def format_vector(name_or_format: Any) -> jax.Array:
    """The runtime description of an element format: float32 [mbits, emin, emax, max]
    (`formats.FormatParams` stacked; see `formats.round_to_grid`)."""
    return jnp.stack(formats.get(name_or_format).params()).astype(jnp.float32)


# ---------------------------------------------------------------------------------------------
# Presets and parsing
# ---------------------------------------------------------------------------------------------


def _spec(fmt: str, granularity: str = "tensor", **kw: Any) -> Any:
    return quant.QuantSpec(format=fmt, granularity=granularity, **kw)


def _uniform(name: str, fmt_fwd: str, fmt_grad: str, granularity: str, grad_rounding: str = "nearest", **kw: Any) -> Recipe:
    return Recipe(
        name=name,
        weight=_spec(fmt_fwd, granularity, **kw),
        activation=_spec(fmt_fwd, granularity, **kw),
        grad=_spec(fmt_grad, granularity, rounding=grad_rounding, **kw),
    )


def _preset(name: str) -> Recipe | None:
    """Named recipes. Element formats: FP8 = E4M3 forward / E5M2 gradients (Micikevicius et al.
    2022); FP6 = E2M3 forward / E3M2 gradients (more range for gradients, as in the OCP MX spec);
    FP4 = E2M1 everywhere. 4-bit recipes round gradients stochastically (NVIDIA's NVFP4 recipe,
    Tseng et al. 2025 for MXFP4), since nearest rounding biases small gradient updates to zero."""
    if name == "fp32":
        return Recipe(name="fp32")
    if name in ("bf16", "fp16"):
        fmt = name
        # fp16 gradients get a per-tensor scale: the ideal dynamic loss scale (fp16 has no range).
        return Recipe(name=name, weight=_spec(fmt, "none"), activation=_spec(fmt, "none"),
                      grad=_spec(fmt, "none" if name == "bf16" else "tensor"))
    table = {
        "fp8": ("fp8_e4m3", "fp8_e5m2", "tensor", "nearest", {}),
        "fp8-delayed": ("fp8_e4m3", "fp8_e5m2", "tensor", "nearest", {"scaling": "delayed", "amax_history": 16}),
        "mxfp8": ("fp8_e4m3", "fp8_e5m2", "mx", "nearest", {}),
        "mxfp6": ("fp6_e2m3", "fp6_e3m2", "mx", "nearest", {}),
        "mxfp4": ("fp4_e2m1", "fp4_e2m1", "mx", "stochastic", {}),
        "nvfp4": ("fp4_e2m1", "fp4_e2m1", "nvfp4", "stochastic", {}),
        "fp6": ("fp6_e2m3", "fp6_e3m2", "tensor", "nearest", {}),
        "fp4": ("fp4_e2m1", "fp4_e2m1", "tensor", "stochastic", {}),
    }
    if name in table:
        fwd, grad, gran, grad_rounding, kw = table[name]
        return _uniform(name, fwd, grad, gran, grad_rounding, **kw)
    if name == "fp8-blockwise":
        # DeepSeek-V3: 1×128 tiles for activations and gradients, 128×128 blocks for weights.
        return Recipe(name=name, weight=_spec("fp8_e4m3", "block2d", block=128),
                      activation=_spec("fp8_e4m3", "block", block=128),
                      grad=_spec("fp8_e4m3", "block", block=128))
    return None


PRESETS = ("fp32", "bf16", "fp16", "fp8", "fp8-delayed", "fp8-blockwise", "mxfp8", "mxfp6", "mxfp4",
           "nvfp4", "fp6", "fp4")

_RECIPE_KEYS = ("name", "base", "weight", "activation", "grad", "attention", "forward_only",
                "fp32_sensitive_ops", "high_precision_embed", "fast_path")


def get(value: str | Mapping[str, Any] | Recipe, *, key: str = "precision") -> Recipe:
    """A Recipe from a preset name, any format name (all GEMM roles that format, per tensor,
    current scaling), a TOML-style mapping, a path to a .toml recipe file (its [precision]
    table), or a Recipe (returned as is).

    Mapping form: {name=..., base="fp8" (optional preset to start from), weight={format=...,
    granularity=..., ...} | "none", activation=..., grad=..., attention=..., forward_only=bool,
    fp32_sensitive_ops=bool, high_precision_embed=bool, fast_path=bool}. Role tables take the
    QuantSpec fields; a role given as a string is a format name (per tensor, current).
    """
    if isinstance(value, Recipe):
        return value
    if isinstance(value, str) and value.endswith(".toml"):
        return _from_file(value, key)
    if isinstance(value, str):
        preset = _preset(value)
        if preset is not None:
            return preset
        try:
            formats.get(value)
        except ConfigError:
            raise ConfigError(key, value, "a preset (" + ", ".join(PRESETS) + "), a format name such as "
                              "'fp8_e4m3', 'e3m4', 'int8', or a table") from None
        return Recipe(name=value, weight=_spec(value), activation=_spec(value), grad=_spec(value))
    if isinstance(value, Mapping):
        return _from_mapping(value, key)
    raise ConfigError(key, value, "a preset name, a format name or a table")


def _from_file(path: str, key: str) -> Recipe:
    """A recipe file: its [precision] table (or the whole file if it has none)."""
    import tomllib

    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(key, path, f"a readable TOML recipe file ({e})") from None
    return _from_mapping(table.get("precision", table), key)


def _from_mapping(m: Mapping[str, Any], key: str) -> Recipe:
    for k in m:
        if k not in _RECIPE_KEYS:
            raise ConfigError(f"{key}.{k}", m[k], _RECIPE_KEYS)
    base = get(m["base"], key=f"{key}.base") if "base" in m else Recipe(name="custom")
    changes: dict[str, Any] = {}
    if "name" in m:
        if not isinstance(m["name"], str) or not m["name"]:
            raise ConfigError(f"{key}.name", m["name"], "a non-empty string")
        changes["name"] = m["name"]
    for role in ROLES:
        if role in m:
            changes[role] = _role_spec(m[role], f"{key}.{role}")
    for flag in ("forward_only", "fp32_sensitive_ops", "high_precision_embed", "fast_path"):
        if flag in m:
            if not isinstance(m[flag], bool):
                raise ConfigError(f"{key}.{flag}", m[flag], "true or false")
            changes[flag] = m[flag]
    recipe = dataclasses.replace(base, **changes)
    if "name" not in m and "base" in m and len(changes) > 0:
        recipe = dataclasses.replace(recipe, name=f"{base.name}-custom")
    _validate(recipe, key)
    return recipe


# QuantSpec fields a recipe may set; `axis` is not one: each GEMM sets its own reduction axis
_SPEC_KEYS = tuple(f.name for f in dataclasses.fields(quant.QuantSpec) if f.name != "axis")


def _role_spec(v: Any, key: str) -> Any:
    if v is None or v == "none":
        return None
    if isinstance(v, str):
        v = {"format": v}
    if not isinstance(v, Mapping):
        raise ConfigError(key, v, "a format name, 'none' or a table with format=, granularity=, ...")
    for k in v:
        if k not in _SPEC_KEYS:
            raise ConfigError(f"{key}.{k}", v[k], _SPEC_KEYS)
    if "format" not in v:
        raise ConfigError(f"{key}.format", None, "a format name such as 'fp8_e4m3', 'e3m4', 'int8'")
    try:
        return quant.QuantSpec(**dict(v))
    except ConfigError as e:  # QuantSpec names the field; prefix the recipe path
        raise ConfigError(f"{key}.{e.key}", e.value, e.allowed) from None


def _validate(recipe: Recipe, key: str) -> None:
    spec = recipe.attention
    if spec is not None and spec.scaling == "delayed":
        raise ConfigError(f"{key}.attention.scaling", "delayed", "current (attention inputs have no history)")


# ---------------------------------------------------------------------------------------------
# Operands of a GEMM, quantised along its reduction axis (quant.quantize with a runtime format)
# ---------------------------------------------------------------------------------------------

TELEMETRY_FIELDS = ("amax", "frac_saturated", "frac_underflow", "snr_db",
                    "block_amax_min", "block_amax_p50", "block_amax_max")
TELEMETRY_SIZE = len(TELEMETRY_FIELDS)
TELEMETRY_ROWS = 256  # telemetry fractions/SNR are estimated on <= this many evenly strided rows
TELEMETRY_BLOCK = 32  # block amax statistics use 32-wide blocks along the reduction axis (MX's)


class Operand(NamedTuple):
    """A 2-D GEMM operand quantised along its reduction `axis`, laid out for the dot.

    values: grid values (x / scale rounded), float32, x's shape.
    outer: scale that can be applied outside the dot: scalar, or x's shape with size 1 along `axis`.
    blocks: None, or per-block scales along the reduction axis: x's shape with that axis of
        length nb = ceil(n / block).
    fold: the block scales may be multiplied into the values exactly (MX: powers of two; NVFP4:
        an E4M3 scale times an E2M1 value has <= 6 significant bits).
    telemetry: the TELEMETRY_FIELDS vector or None.
    history: the updated amax history (delayed scaling) or None.
    """

    values: jax.Array
    outer: jax.Array
    blocks: jax.Array | None
    fold: bool
    telemetry: jax.Array | None
    history: jax.Array | None


def _expand(scale: jax.Array, axis: int, k: int, n: int) -> jax.Array:
    return jax.lax.slice_in_dim(jnp.repeat(scale, k, axis=axis), 0, n, axis=axis)


def _full_scale(op: Operand, axis: int, block: int) -> jax.Array:
    scale = op.outer
    if op.blocks is not None:
        scale = _expand(op.blocks, axis, block, op.values.shape[axis]) * scale
    return scale


def dequantise(op: Operand, axis: int, block: int) -> jax.Array:
    return op.values * _full_scale(op, axis, block)


def _rows(a: jax.Array | None, stride: int) -> jax.Array | None:
    return a if (a is None or a.ndim == 0 or a.shape[0] == 1 or stride == 1) else a[::stride]


def _block_amax_stats(xs: jax.Array, axis: int) -> jax.Array:
    """[min, median, max] over the amax of TELEMETRY_BLOCK-wide blocks along the reduction axis,
    whatever the recipe's own granularity: what a just-in-time per-block scale would see, beside
    the per-tensor amax (a trailing partial block is left out; a short axis is one block)."""
    a = jnp.abs(xs if axis == 1 else xs.T)
    n = a.shape[1]
    k = TELEMETRY_BLOCK if n >= TELEMETRY_BLOCK else n
    nb = n // k
    blocks = jnp.max(a[:, : nb * k].reshape(a.shape[0], nb, k), axis=-1)
    return jnp.stack([jnp.min(blocks), jnp.median(blocks), jnp.max(blocks)])


def _telemetry(x: jax.Array, op: Operand, amax: jax.Array, fmax: jax.Array, axis: int, block: int) -> jax.Array:
    """TELEMETRY_FIELDS: [amax (exact), frac_saturated (|x / scale| > max), frac_underflow (non-zero
    x quantised to 0), snr_db (10·log10 Σx² / Σ(x - x̂)²), block amax min / median / max
    (`_block_amax_stats`)], all but amax on every (M // 256)-th row when the operand is quantised
    along its columns (activations, gradients): a few per cent of the quantisation's own cost
    instead of several times it."""
    stride = max(1, x.shape[0] // TELEMETRY_ROWS) if axis == 1 else 1
    sub = Operand(_rows(op.values, stride), _rows(op.outer, stride), _rows(op.blocks, stride), op.fold, None, None)
    xs = _rows(x, stride)
    scale = _full_scale(sub, axis, block)
    xhat = sub.values * scale
    saturated = jnp.mean((jnp.abs(xs) > fmax * scale).astype(jnp.float32))
    nonzero = xs != 0
    underflow = jnp.sum(nonzero & (sub.values == 0)) / jnp.maximum(jnp.sum(nonzero), 1)
    norm = jnp.where(amax > 0, 1.0 / amax, 1.0)  # Σx² cannot overflow
    sig = jnp.sum(jnp.square(xs * norm))
    err = jnp.sum(jnp.square((xs - xhat) * norm))
    snr = jnp.where(err > 0, 10.0 * jnp.log10(jnp.maximum(sig, 1e-30) / jnp.where(err > 0, err, 1.0)), jnp.inf)
    head = jnp.stack([amax, saturated, underflow.astype(jnp.float32), snr])
    return jnp.concatenate([head, _block_amax_stats(xs, axis)]).astype(jnp.float32)


def _lowbias32(h: jax.Array) -> jax.Array:
    """A 32-bit integer hash with low bias (C. Wellons' lowbias32)."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x7FEB352D)
    h = h ^ (h >> 15)
    h = h * jnp.uint32(0x846CA68B)
    return h ^ (h >> 16)


def _hash_uniform(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """U[0, 1) on a 2^-24 grid from a counter-based hash of (element index XOR a 32-bit seed
    drawn from `key`): lowbias32 is a bijection with full avalanche, so distinct (index, seed)
    give independent-looking draws. ~20x cheaper on CPU than jax.random.uniform's threefry,
    which would otherwise dominate a low-precision train step."""
    seed = jax.random.bits(key, (), jnp.uint32)
    idx = jax.lax.iota(jnp.uint32, math.prod(shape)).reshape(shape)
    return (_lowbias32(idx ^ seed) >> 8).astype(jnp.float32) * (2.0**-24)


def stochastic_round(a: jax.Array, fmt: jax.Array, key: jax.Array) -> jax.Array:
    """Unbiased stochastic rounding of `a` to the grid of `fmt` (the rule of
    `formats.round_to_grid(..., 'stochastic')`, with `_hash_uniform`'s cheap random numbers): down to
    the lower neighbour lo or up with probability (|a|/ulp - lo); saturating at ±max."""
    mbits = fmt[0].astype(jnp.int32)
    mag = jnp.abs(a)
    e = jnp.clip(formats.floor_log2(mag), fmt[1].astype(jnp.int32), fmt[2].astype(jnp.int32))
    t = mag * formats.pow2(mbits - e)  # |a| / ulp, exact
    lo = jnp.floor(t)
    q = lo + (_hash_uniform(key, a.shape) < t - lo).astype(jnp.float32)
    return jnp.copysign(jnp.minimum(q * formats.pow2(e - mbits), fmt[3]), a)


def quantise_operand(x: jax.Array, s: RoleStructure, fmt: jax.Array, axis: int, *,
                     key: jax.Array | None = None, history: jax.Array | None = None,
                     with_telemetry: bool = False) -> Operand:
    """`quant.quantize` of a 2-D operand along `axis`, with the format as the runtime vector `fmt`,
    and its scale rearranged into outer / per-reduction-block factors (see `Operand`).
    Stochastic rounding takes quant's scales and rounds with `stochastic_round` (no key, as in
    evaluation: nearest)."""
    spec = dataclasses.replace(s.along(axis), rounding="nearest")
    q = quant.quantize(x, spec, history=history, fmt_params=fmt)
    if s.spec.rounding == "stochastic" and key is not None:
        scale = quant.expand_scale(q.scale, spec, x.shape)
        live = scale > 0  # nvfp4 flushes blocks whose E4M3 scale underflowed
        values = jnp.where(live, stochastic_round(x / jnp.where(live, scale, 1.0), fmt, key), 0.0)
        q = q._replace(values=values)
    g, k, other = spec.granularity, s.block, 1 - axis
    if g in ("none", "tensor"):
        op = Operand(q.values, q.scale.reshape(()), None, False, None, q.history)
    elif g == "channel":
        op = Operand(q.values, q.scale, None, False, None, None)
    elif g == "block2d":  # (R/k, C/k) tiles: expand the non-reduction axis to full length
        op = Operand(q.values, jnp.float32(1.0), _expand(q.scale, other, k, x.shape[other]), False, None, None)
    elif g == "nvfp4":  # split scale = s_b · s_t back into the exact E4M3 s_b and the FP32 s_t
        s_t = jnp.where((q.amax > 0) & jnp.isfinite(q.amax), q.amax / (448.0 * fmt[3]), 1.0)
        op = Operand(q.values, s_t, formats.round_to_format(q.scale / s_t, "fp8_e4m3"), True, None, None)
    else:  # block, mx
        op = Operand(q.values, jnp.float32(1.0), q.scale, g == "mx", None, None)
    if with_telemetry:
        op = op._replace(telemetry=_telemetry(x, op, q.amax, fmt[3], axis, k))
    return op


def _axis_free(s: RoleStructure | None) -> bool:
    """The quantisation does not depend on the reduction axis: reuse it across GEMMs."""
    return s is not None and s.granularity in ("none", "tensor")


def _saved(op: Operand | None) -> tuple | None:
    """Residual of an axis-free operand (arrays only: values and the scalar scale)."""
    return None if op is None else (op.values, op.outer)


def _restored(saved: tuple | None) -> Operand | None:
    return None if saved is None else Operand(saved[0], saved[1], None, False, None, None)


# ---------------------------------------------------------------------------------------------
# GEMM on quantised operands: plain (fp32 on dequantised operands) and exact fast (bf16) paths
# ---------------------------------------------------------------------------------------------


def _dot(a: jax.Array, ca: int, b: jax.Array, cb: int, dtype=None) -> jax.Array:
    """Contract axis ca of 2-D a with axis cb of 2-D b -> (a's free dim, b's free dim), fp32
    accumulation; operands cast to `dtype` first (bf16 for the fast path). No explicit transposes."""
    if dtype is not None:
        a, b = a.astype(dtype), b.astype(dtype)
    return jax.lax.dot_general(a, b, (((ca,), (cb,)), ((), ())), preferred_element_type=jnp.float32)


def _dot32(a: jax.Array, b: jax.Array) -> jax.Array:
    return _dot(a, 1, b, 0)


def _as_col(s: jax.Array) -> jax.Array:
    return s if s.ndim == 0 else s.reshape(-1, 1)


def _as_row(s: jax.Array) -> jax.Array:
    return s if s.ndim == 0 else s.reshape(1, -1)


def _gemm(a: Operand | jax.Array, sa: RoleStructure | None, ca: int,
          b: Operand | jax.Array, sb: RoleStructure | None, cb: int, fast: bool) -> jax.Array:
    """Σ over a's axis ca and b's axis cb -> (free dim of a) × (free dim of b), fp32. Raw arrays
    are unquantised operands. Fast path: bf16 dots on the grid values with the scales outside:
    outer scales as a column (a) times a row (b); MX/NVFP4 block scales folded into the values;
    other block scales (block, block2d) one 2-D bf16 dot per K-block, summed in fp32."""
    if not fast or not isinstance(a, Operand) or not isinstance(b, Operand):
        da = dequantise(a, ca, sa.block) if isinstance(a, Operand) else a
        db = dequantise(b, cb, sb.block) if isinstance(b, Operand) else b
        return _dot(da, ca, db, cb)
    va, vb = a.values, b.values
    if a.blocks is not None and a.fold:
        va = va * _expand(a.blocks, ca, sa.block, va.shape[ca])
    if b.blocks is not None and b.fold:
        vb = vb * _expand(b.blocks, cb, sb.block, vb.shape[cb])
    outer = _as_col(a.outer) * _as_row(b.outer)
    a_blocks = a.blocks if (a.blocks is not None and not a.fold) else None
    b_blocks = b.blocks if (b.blocks is not None and not b.fold) else None
    if a_blocks is None and b_blocks is None:
        return _dot(va, ca, vb, cb, jnp.bfloat16) * outer
    kb = min(s.block for s, bl in ((sa, a_blocks), (sb, b_blocks)) if bl is not None)
    for s, bl in ((sa, a_blocks), (sb, b_blocks)):
        if bl is not None and s.block % kb:
            raise ConfigError("block", s.block, f"a multiple of the other operand's block {kb}")
    va, vb = va.astype(jnp.bfloat16), vb.astype(jnp.bfloat16)
    n = va.shape[ca]
    acc = None
    for i, start in enumerate(range(0, n, kb)):
        stop = min(start + kb, n)
        part = _dot(jax.lax.slice_in_dim(va, start, stop, axis=ca), ca,
                    jax.lax.slice_in_dim(vb, start, stop, axis=cb), cb)
        if a_blocks is not None:
            part = part * _as_col(jax.lax.index_in_dim(a_blocks, i // (sa.block // kb), axis=ca, keepdims=False))
        if b_blocks is not None:
            part = part * _as_row(jax.lax.index_in_dim(b_blocks, i // (sb.block // kb), axis=cb, keepdims=False))
        acc = part if acc is None else acc + part
    return acc * outer


def _fast_ok(structure: RecipeStructure, *roles: RoleStructure | None) -> bool:
    return structure.fast_path and all(s is not None and s.exact_in_bf16 for s in roles)


# ---------------------------------------------------------------------------------------------
# The three-GEMM quantised matmul
# ---------------------------------------------------------------------------------------------


class QdotState(NamedTuple):
    """Runtime inputs of one quantised dense layer (arrays only; a pytree).

    fmt: role -> format vector (see `format_vector`) for the quantised roles.
    hist: 'weight' / 'activation' -> amax history (delayed scaling, newest first), else absent.
    grad_sink: zeros(TELEMETRY_SIZE + H_g); the backward pass returns [grad telemetry, new grad-role
        history (H_g)] as its cotangent ("overwrite with gradient", as Flax's fp8_ops).
    """

    fmt: dict
    hist: dict
    grad_sink: jax.Array


class _Static:
    """Hashable, leaf-free pytree node carrying the static RecipeStructure through custom_vjp."""

    def __init__(self, value: Any):
        self.value = value

    def __hash__(self) -> int:
        return hash(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Static) and other.value == self.value


jax.tree_util.register_pytree_node(_Static, lambda s: ((), s.value), lambda v, _: _Static(v))


def _keys(key_data: jax.Array | None, salt: int, n: int) -> list:
    if key_data is None:
        return [None] * n
    return list(jax.random.split(jax.random.fold_in(jax.random.wrap_key_data(key_data), salt), n))


def _unsmooth(op: Operand, s_inv: jax.Array | None) -> Operand:
    """Undo a power-of-two input-channel scale on the grid values (exact, also in bf16)."""
    return op if s_inv is None else op._replace(values=op.values * s_inv)


def _quantise_x(x, smooth_K, st, state, key, axis, with_telemetry):
    """X (M×K) along `axis`; with Smooth-SwiGLU X·s is quantised and s undone on the values."""
    x_in = x if smooth_K is None else x * smooth_K[None, :]
    op = quantise_operand(x_in, st.activation, state.fmt["activation"], axis, key=key,
                          history=state.hist.get("activation"), with_telemetry=with_telemetry)
    return _unsmooth(op, None if smooth_K is None else 1.0 / smooth_K[None, :])


def _fprop(x, w, state: QdotState, key_data, smooth_K, st: RecipeStructure):
    """Y = Q(X; along K) · Q(W; along K). Returns ((Y, telemetry by role, new forward histories),
    the quantised operands for reuse in the backward pass)."""
    ka, kw = _keys(key_data, 0, 2)
    sa, sw = st.activation, st.weight
    a = None if sa is None else _quantise_x(x, smooth_K, st, state, ka, 1, True)
    b = None if sw is None else quantise_operand(w, sw, state.fmt["weight"], 0, key=kw,
                                                 history=state.hist.get("weight"), with_telemetry=True)
    y = _gemm(x if a is None else a, sa, 1, w if b is None else b, sw, 0, _fast_ok(st, sa, sw))
    telem = {r: op.telemetry for r, op in (("activation", a), ("weight", b)) if op is not None}
    new_hist = {r: op.history for r, op in (("activation", a), ("weight", b)) if op is not None and op.history is not None}
    return (y, telem, new_hist), (a, b)


@jax.custom_vjp
def _qdot(x, w, state, key_data, smooth_K, box):
    return _fprop(x, w, state, key_data, smooth_K, box.value)[0]


def _qdot_fwd(x, w, state, key_data, smooth_K, box):
    out, (a, b) = _fprop(x, w, state, key_data, smooth_K, box.value)
    st = box.value
    # keep the forward's quantised X / W when the backward would quantise them identically
    a = _saved(a) if _axis_free(st.activation) else None
    b = _saved(b) if _axis_free(st.weight) else None
    return out, (x, w, state, key_data, smooth_K, box, a, b)


def _qdot_bwd(res, cts):
    x, w, state, key_data, smooth_K, box, a_saved, b_saved = res
    st: RecipeStructure = box.value
    dy = cts[0]
    zero_state = jax.tree.map(jnp.zeros_like, state)
    if st.forward_only:
        return _dot(dy, 1, w, 1), _dot(x, 0, dy, 0), zero_state, None, None, None
    k_g1, k_w, k_a, k_g2 = _keys(key_data, 1, 4)
    sg, sw, sa = st.grad, st.weight, st.activation
    sink = jnp.zeros_like(state.grad_sink)
    hist_g = state.grad_sink[TELEMETRY_SIZE:] if (sg is not None and sg.scaling == "delayed") else None
    # dgrad: dX (M×K) = Q(dY; along N) · Q(W; along N)ᵀ
    g_n = None
    if sg is not None:
        g_n = quantise_operand(dy, sg, state.fmt["grad"], 1, key=k_g1, history=hist_g, with_telemetry=True)
        sink = sink.at[:TELEMETRY_SIZE].set(g_n.telemetry)
        if g_n.history is not None:
            sink = sink.at[TELEMETRY_SIZE:].set(g_n.history)
    w_n = _restored(b_saved)
    if sw is not None and w_n is None:  # same scale as the forward (delayed: pre-update history)
        w_n = quantise_operand(w, sw, state.fmt["weight"], 1, key=k_w, history=state.hist.get("weight"))
    dx = _gemm(dy if g_n is None else g_n, sg, 1, w if w_n is None else w_n, sw, 1, _fast_ok(st, sg, sw))
    # wgrad: dW (K×N) = Q(X; along M)ᵀ · Q(dY; along M)
    x_m = _restored(a_saved)
    if sa is not None and x_m is None:
        x_m = _quantise_x(x, smooth_K, st, state, k_a, 0, False)
    g_m = _restored(_saved(g_n)) if _axis_free(sg) else None
    if sg is not None and g_m is None:
        g_m = quantise_operand(dy, sg, state.fmt["grad"], 0, key=k_g2, history=hist_g)
    dw = _gemm(x if x_m is None else x_m, sa, 0, dy if g_m is None else g_m, sg, 0, _fast_ok(st, sa, sg))
    return dx, dw, zero_state._replace(grad_sink=sink), None, None, None


_qdot.defvjp(_qdot_fwd, _qdot_bwd)


def qdot_state(recipe: Recipe, structure: RecipeStructure | None = None) -> QdotState:
    """A fresh QdotState for one layer: the recipe's format vectors and zero amax histories."""
    structure = structure or recipe.structure()
    hist = {r: jnp.zeros((getattr(structure, r).amax_history,), jnp.float32) for r in ("weight", "activation")
            if getattr(structure, r) is not None and getattr(structure, r).scaling == "delayed"}
    sg = structure.grad
    h_g = sg.amax_history if (sg is not None and sg.scaling == "delayed") else 0
    fmt = {r: v for r, v in recipe.formats().items() if r in GEMM_ROLES}
    return QdotState(fmt=fmt, hist=hist, grad_sink=jnp.zeros((TELEMETRY_SIZE + h_g,), jnp.float32))


def qdot_apply(x_MxK: jax.Array, w_KxN: jax.Array, structure: RecipeStructure, state: QdotState,
               key: jax.Array | None = None, smooth_K: jax.Array | None = None) -> tuple[jax.Array, dict, dict]:
    """The quantised matmul with explicit state. Returns (y, forward telemetry by role
    ([amax, frac_saturated, frac_underflow, snr_db]), new forward-role histories).
    Leading batch axes of x are flattened: (B, L, K) -> (B·L, K). `smooth_K`: optional
    power-of-two per-input-channel scale applied before quantising X and undone on its grid
    values (Smooth-SwiGLU); exact at full precision."""
    lead = x_MxK.shape[:-1]
    x2 = x_MxK.reshape(-1, x_MxK.shape[-1]).astype(jnp.float32)
    w = w_KxN.astype(jnp.float32)
    if not structure.quantises_gemms:
        return _dot32(x2, w).reshape(*lead, w.shape[-1]), {}, {}
    key_data = None if key is None else jax.random.key_data(key)
    smooth = None if smooth_K is None else jax.lax.stop_gradient(smooth_K).astype(jnp.float32)
    y, telem, new_hist = _qdot(x2, w, state, key_data, smooth, _Static(structure))
    return y.reshape(*lead, w.shape[-1]), telem, new_hist


def qdot(x_MxK: jax.Array, w_KxN: jax.Array, recipe: Recipe | str | Mapping, *, key: jax.Array | None = None) -> jax.Array:
    """Quantised matmul with all three GEMMs simulated, for a standalone call (fresh state: a
    delayed-scaling recipe uses the current amax, as on its first step; the model keeps the
    histories, see `scaling.model`). `key` feeds stochastic rounding."""
    recipe = get(recipe)
    structure = recipe.structure()
    return qdot_apply(x_MxK, w_KxN, structure, qdot_state(recipe, structure), key)[0]


# ---------------------------------------------------------------------------------------------
# Attention-input fake quantisation (forward only, straight-through gradient)
# ---------------------------------------------------------------------------------------------


def fake_quant_along(x: jax.Array, s: RoleStructure, fmt: jax.Array, axis: int, key: jax.Array | None = None) -> jax.Array:
    """Fake-quantise x along `axis` (the reduction axis of the matmul it feeds) with a
    straight-through gradient: the attention role (Q, K along head_dim; P, V along the keys)."""
    spec = s.along(axis)
    if spec.rounding == "stochastic" and key is None:
        spec = dataclasses.replace(spec, rounding="nearest")
    xhat = quant.fake_quant(jax.lax.stop_gradient(x), spec, key=key if spec.rounding == "stochastic" else None,
                            fmt_params=fmt)
    return x + jax.lax.stop_gradient(xhat - x)
