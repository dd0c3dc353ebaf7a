"""The quantised GEMMs of a training step, run on a precision recipe's structure.

`qdot_apply(x_MxK, w_KxN, structure, state)` is a `jax.custom_vjp` matmul that simulates all three GEMMs of a
dense layer:

    fprop  Y  = Q(X; along K) · Q(W; along K)
    dgrad  dX = Q(dY; along N) · Q(W; along N)ᵀ
    wgrad  dW = Q(X; along M)ᵀ · Q(dY; along M)

every operand quantised with its role's spec along *that* GEMM's reduction axis (a block or channel
scale must not straddle the sum). A GEMM the recipe's `hadamard` names has both operands rotated
along its reduction axis first (`scaling.numerics.transforms`; the exact product is unchanged), its
signs drawn from the GEMM's own key. Forward-only recipes (Kumar et al. 2024) keep dgrad/wgrad in FP32.
`fake_quant_along` quantises the inputs of the attention matmuls (the `attention` role).

The numbers all come from `scaling.numerics.quant`: an operand is `quant.quantize` along its axis (stochastic
rounding included: `formats.round_to_grid` with `formats.random_bits`), the plain path multiplies
`quant.dequantize`d operands, and the per-layer telemetry is `quant.telemetry_vector`. What is
here is the layout: which axis each GEMM quantises along, which quantisations are reused, how the
scales leave the bf16 dot (the fast path), and one layer's state (amax histories, grad sink).

Exact fast path. A value on an FP8/FP6/FP4/INT8 grid (<= 7 mantissa bits, exponent inside
bfloat16's range) is exactly a bfloat16, and the product of two such values is exact in FP32, so
`jnp.dot(v_a.astype(bf16), v_b.astype(bf16), preferred_element_type=f32)` on the *unscaled* grid
values gives the same products as the FP32 simulation; only FP32 accumulation order differs.
Scales are applied outside the dot: per tensor/channel as an outer product of row and column
scales, per K-block (1×k, k×k) as one batched dot per block summed in FP32, and for MX (power of
two E8M0 scale) and NVFP4 (E4M3 block scale × E2M1 value: <= 6 significant bits) the block scale is
folded into the bf16 operand, where it stays exact; NVFP4's FP32 tensor scale is applied outside.

Formats are runtime values (`precision.format_vector`), so one compiled train step serves every
format of the same granularity; only whether the fast path is exact (a static property of the
format family, `RoleStructure.exact_in_bf16`) changes the program.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from scaling.numerics import formats, quant, transforms
from scaling import host
from scaling.errors import ConfigError
from scaling.numerics.precision import GEMM_ROLES, Recipe, RecipeStructure, RoleStructure

TELEMETRY_SIZE = len(quant.TELEMETRY_FIELDS)
TELEMETRY_ROWS = 256  # training telemetry is estimated on <= this many evenly strided rows

# ---------------------------------------------------------------------------------------------
# Operands of a GEMM, quantised along its reduction axis
# ---------------------------------------------------------------------------------------------


class Operand(NamedTuple):
    """A 2-D GEMM operand quantised along its reduction axis `spec.axis`.

    q: the `quant.Quantized` (grid values, scales in quant's layout, amax, new amax history).
    spec: the QuantSpec it was quantised with (static).
    fmax: the element format's max (NVFP4's tensor scale depends on it).
    telemetry: the quant.TELEMETRY_FIELDS vector or None.
    """

    q: quant.Quantized
    spec: quant.QuantSpec
    fmax: jax.Array
    telemetry: jax.Array | None = None


def _spec(s: RoleStructure, axis: int, key: jax.Array | None) -> quant.QuantSpec:
    """The role's spec along `axis`; a stochastic role without a key (evaluation) rounds to nearest."""
    spec = s.along(axis)
    if spec.rounding == "stochastic" and key is None:
        spec = dataclasses.replace(spec, rounding="nearest")
    return spec


def quantise_operand(x: jax.Array, s: RoleStructure, fmt: jax.Array, axis: int, *,
                     key: jax.Array | None = None, history: jax.Array | None = None,
                     measure: jax.Array | None = None) -> Operand:
    """`quant.quantize` of a 2-D operand along `axis`, the element format the runtime vector `fmt`;
    with its telemetry where `measure` (a bool, may be traced) is given (see `_telemetry`)."""
    spec = _spec(s, axis, key)
    q = quant.quantize(x, spec, key=key if spec.rounding == "stochastic" else None, history=history,
                       fmt_params=None if s.native else fmt)
    op = Operand(q, spec, fmt[3])
    return op if measure is None else op._replace(telemetry=_telemetry(x, op, measure))


def _telemetry(x: jax.Array, op: Operand, measure: jax.Array | bool) -> jax.Array:
    """`quant.telemetry_vector` of one operand where `measure` is true, NaNs where it is false: the
    trainer reads telemetry only on its logged steps and skips the work on the others. A Python
    bool is the host's choice (a logged and an unlogged program: nothing is computed where false);
    a traced bool a runtime condition (one program serves both). One quantised along its columns (activations,
    gradients: rows are tokens) is measured on every (M // TELEMETRY_ROWS)-th row (amax stays
    exact): a few per cent of the quantisation's own cost instead of several times it."""
    axis = op.spec.axis
    stride = max(1, x.shape[0] // TELEMETRY_ROWS) if axis == 1 else 1
    scale = quant.expand_scale(op.q.scale, op.spec, x.shape)[::stride]  # fused: only sampled rows are formed
    xs, values = x[::stride], op.q.values[::stride]

    def measured():
        return quant.telemetry_vector(xs, values * scale, scale, op.q.amax, op.fmax, axis)

    nan = jnp.full((TELEMETRY_SIZE,), jnp.nan, jnp.float32)
    if isinstance(measure, bool):
        return measured() if measure else nan
    if jax.default_backend() == "cpu":  # XLA:CPU runs only the branch taken
        return jax.lax.cond(measure, measured, lambda: nan)
    # XLA:GPU reads a conditional's predicate on the host (a sync per operand per step), and the
    # telemetry is cheap there: computed and masked (unmeasured on a GPU, like the rest of that path)
    return jnp.where(measure, measured(), nan)


def _axis_free(s: RoleStructure | None) -> bool:
    """The quantisation does not depend on the reduction axis (no scale, one scale, or k×k tiles):
    reuse it across GEMMs."""
    return s is not None and (s.granularity in ("none", "tensor") or quant.is_square(s.spec))


def _reusable(s: RoleStructure | None, st: RecipeStructure, *gemms: str) -> bool:
    """One quantisation of a role serves these GEMMs: axis-free, and none of them rotates it."""
    return _axis_free(s) and all(getattr(st.hadamard, g) is None for g in gemms)


_SIGN_SALT = {"fprop": 2, "dgrad": 3, "wgrad": 4}  # key salts of the rotations' signs (0, 1: rounding)


def _rotated(a: jax.Array, ca: int, b: jax.Array, cb: int, st: RecipeStructure, gemm: str, key_data):
    """Both operands of `gemm` rotated along their reduction axes (ca of a, cb of b) where the
    recipe says so, with one sign vector; otherwise as they are. Returns (a, b, the signs or None)."""
    h = getattr(st.hadamard, gemm)
    if h is None:
        return a, b, None
    signs = transforms.signs_for(h, _keys(key_data, _SIGN_SALT[gemm], 1)[0])
    return transforms.rotate(a, ca, signs), transforms.rotate(b, cb, signs), signs


def _saved(op: Operand | None) -> quant.Quantized | None:
    """Residual of an axis-free operand (arrays only)."""
    return None if op is None else op.q._replace(history=None)


def _kept(op: Operand | None, s: RoleStructure | None) -> quant.Quantized | None:
    """A forward operand kept for the backward pass: its grid values in bfloat16 where the role's grid
    is exact there (half the bytes of float32, the same values), else as they are."""
    saved = _saved(op)
    return saved if saved is None or not s.exact_in_bf16 else saved._replace(values=saved.values.astype(jnp.bfloat16))


def _restored(saved: quant.Quantized | None, s: RoleStructure, fmt: jax.Array, axis: int) -> Operand | None:
    return None if saved is None else Operand(_as_f32(saved), s.along(axis), fmt[3])


def _as_f32(saved: quant.Quantized) -> quant.Quantized:
    return saved._replace(values=saved.values.astype(jnp.float32))


# ---------------------------------------------------------------------------------------------
# GEMM on quantised operands: plain (fp32 on dequantised operands) and exact fast (bf16) paths
# ---------------------------------------------------------------------------------------------


def _dot(a: jax.Array, ca: int, b: jax.Array, cb: int, precision: jax.lax.Precision, dtype=None) -> jax.Array:
    """Contract axis ca of 2-D a with axis cb of 2-D b -> (a's free dim, b's free dim), fp32
    accumulation; operands cast to `dtype` first (bf16 for the fast path). No explicit transposes.
    `precision` (the recipe's `RecipeStructure.f32_dots`) applies to float32 operands: without it a
    GPU runs them as TF32; bf16 operands multiply exactly either way."""
    if dtype is not None:
        a, b = a.astype(dtype), b.astype(dtype)
    f32 = a.dtype == jnp.float32 and b.dtype == jnp.float32
    return jax.lax.dot_general(a, b, (((ca,), (cb,)), ((), ())), precision=precision if f32 else None,
                               preferred_element_type=jnp.float32)


def _as_col(s: jax.Array) -> jax.Array:
    return s if s.ndim == 0 else s.reshape(-1, 1)


def _as_row(s: jax.Array) -> jax.Array:
    return s if s.ndim == 0 else s.reshape(1, -1)


def _fast_layout(op: Operand) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """(values, outer, blocks) for the bf16 dot: `outer` is applied outside the dot (a scalar, or
    x's shape with size 1 along the reduction axis); `blocks` (x's shape with that axis of length
    ceil(n / block)) scale each K-block's partial dot, or None. MX and NVFP4 block scales are
    multiplied into the values instead, exactly (powers of two; an E4M3 scale times an E2M1 value
    has <= 6 significant bits)."""
    q, spec = op.q, op.spec
    g, axis = spec.granularity, spec.axis
    one = jnp.float32(1.0)
    if g in ("none", "tensor"):
        return q.values, q.scale.reshape(()), None
    if g == "channel":
        return q.values, q.scale, None
    if g == "block":
        return q.values, one, q.scale
    if g == "block2d":  # (R/k, C/k) tiles: repeat along the non-reduction axis to full length
        other = 1 - axis
        return q.values, one, quant.repeat_blocks(q.scale, other, spec.block, q.values.shape[other])
    if g == "mx":
        return q.values * quant.expand_scale(q.scale, spec, q.values.shape), one, None
    # nvfp4: split scale = s_b · s_t back into the exact E4M3 s_b and quant's FP32 s_t
    s_t = quant.nvfp4_tensor_scale(q.amax, op.fmax)
    s_b = formats.round_to_format(q.scale * (1.0 / s_t), "fp8_e4m3")
    return q.values * quant.expand_scale(s_b, spec, q.values.shape), s_t, None


def _gemm(a: Operand | jax.Array, ca: int, b: Operand | jax.Array, cb: int, fast: bool,
          precision: jax.lax.Precision) -> jax.Array:
    """Σ over a's axis ca and b's axis cb -> (free dim of a) × (free dim of b), fp32. Raw arrays
    are unquantised operands. Fast path: bf16 dots on the grid values with the scales outside
    (`_fast_layout`): outer scales as a column (a) times a row (b); per-K-block scales (block,
    block2d) one 2-D bf16 dot per K-block, summed in fp32."""
    if not fast or not isinstance(a, Operand) or not isinstance(b, Operand):
        da = quant.dequantize(a.q, a.spec) if isinstance(a, Operand) else a
        db = quant.dequantize(b.q, b.spec) if isinstance(b, Operand) else b
        return _dot(da, ca, db, cb, precision)
    (va, outer_a, a_blocks), (vb, outer_b, b_blocks) = _fast_layout(a), _fast_layout(b)
    outer = _as_col(outer_a) * _as_row(outer_b)
    if a_blocks is None and b_blocks is None:
        return _dot(va, ca, vb, cb, precision, jnp.bfloat16) * outer
    ka, kb_ = a.spec.block, b.spec.block
    kb = min(k for k, bl in ((ka, a_blocks), (kb_, b_blocks)) if bl is not None)
    for k, bl in ((ka, a_blocks), (kb_, b_blocks)):
        if bl is not None and k % kb:
            raise ConfigError("block", k, f"a multiple of the other operand's block {kb}")
    va, vb = va.astype(jnp.bfloat16), vb.astype(jnp.bfloat16)
    n = va.shape[ca]
    acc = None
    for i, start in enumerate(range(0, n, kb)):
        stop = min(start + kb, n)
        part = _dot(jax.lax.slice_in_dim(va, start, stop, axis=ca), ca,
                    jax.lax.slice_in_dim(vb, start, stop, axis=cb), cb, precision)
        if a_blocks is not None:
            part = part * _as_col(jax.lax.index_in_dim(a_blocks, i // (ka // kb), axis=ca, keepdims=False))
        if b_blocks is not None:
            part = part * _as_row(jax.lax.index_in_dim(b_blocks, i // (kb_ // kb), axis=cb, keepdims=False))
        acc = part if acc is None else acc + part
    return acc * outer


def uses_bf16_dots(structure: RecipeStructure | Any) -> bool:
    """The recipe's fast_path, or where it is None (auto), whether this machine runs bf16 dots natively."""
    return host.native_bf16() if structure.fast_path is None else bool(structure.fast_path)


def _fast_ok(structure: RecipeStructure, *roles: RoleStructure | None) -> bool:
    return uses_bf16_dots(structure) and all(s is not None and s.exact_in_bf16 for s in roles)


# ---------------------------------------------------------------------------------------------
# The three-GEMM quantised matmul
# ---------------------------------------------------------------------------------------------


class QdotState(NamedTuple):
    """Runtime inputs of one quantised dense layer (arrays only; a pytree).

    fmt: role -> format vector (see `precision.format_vector`) for the quantised roles.
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
    return op if s_inv is None else op._replace(q=op.q._replace(values=op.q.values * s_inv))


def _quantise_x(x, smooth_K, st, state, key, axis, measure):
    """X (M×K) along `axis`; with Smooth-SwiGLU X·s is quantised and s undone on the values."""
    x_in = x if smooth_K is None else x * smooth_K[None, :]
    op = quantise_operand(x_in, st.activation, state.fmt["activation"], axis, key=key,
                          history=state.hist.get("activation"), measure=measure)
    return _unsmooth(op, None if smooth_K is None else 1.0 / smooth_K[None, :])


def _history(op: Operand | None) -> jax.Array | None:
    return None if op is None else op.q.history


def _measure(measure: "jax.Array | _Static") -> jax.Array | bool:
    """The runtime bool, or the host's choice carried as a static (leaf-free) pytree node."""
    return measure.value if isinstance(measure, _Static) else measure


def _kept_mask(x: jax.Array, op: Operand | None) -> jax.Array | None:
    """QuEST's trust mask of one forward operand: true where its quantisation did not clip x."""
    if op is None:
        return None
    return ~quant.clipped(x, quant.expand_scale(op.q.scale, op.spec, x.shape), op.fmax)


def _fprop(x, w, state: QdotState, key_data, smooth_K, measure, st: RecipeStructure):
    """Y = Q(X; along K) · Q(W; along K). Returns ((Y, telemetry by role, new forward histories),
    (the quantised operands for reuse in the backward pass, their trust masks where the recipe
    asks: see `_masked`)). A rotated fprop quantises X·R and Rᵀ·W; it has no use for
    Smooth-SwiGLU's channel scale (a rotation does not commute with it)."""
    ka, kw = _keys(key_data, 0, 2)
    sa, sw = st.activation, st.weight
    measure = _measure(measure)
    x, w, signs = _rotated(x, 1, w, 0, st, "fprop", key_data)
    smooth_K = None if signs is not None else smooth_K
    a = None if sa is None else _quantise_x(x, smooth_K, st, state, ka, 1, measure)
    b = None if sw is None else quantise_operand(w, sw, state.fmt["weight"], 0, key=kw,
                                                 history=state.hist.get("weight"), measure=measure)
    y = _gemm(x if a is None else a, 1, w if b is None else b, 0, _fast_ok(st, sa, sw), st.f32_dots)
    ops = (("activation", a), ("weight", b))
    telem = {r: op.telemetry for r, op in ops if op is not None}
    new_hist = {r: _history(op) for r, op in ops if _history(op) is not None}
    masks = None
    if st.clip_mask:
        masks = (_kept_mask(x if smooth_K is None else x * smooth_K[None, :], a), _kept_mask(w, b))
    return (y, telem, new_hist), (a, b, masks, signs)


@jax.custom_vjp
def _qdot(x, w, state, key_data, smooth_K, measure, box):
    return _fprop(x, w, state, key_data, smooth_K, measure, box.value)[0]


def _qdot_fwd(x, w, state, key_data, smooth_K, measure, box):
    out, (a, b, masks, signs) = _fprop(x, w, state, key_data, smooth_K, measure, box.value)
    st = box.value
    # keep the forward's quantised X / W when the backward would quantise them identically, or
    # quantises them again (backward_operands = "forward")
    again = st.backward_operands == "forward"
    a = _kept(a, st.activation) if again or _reusable(st.activation, st, "fprop", "wgrad") else None
    b = _kept(b, st.weight) if again or _reusable(st.weight, st, "fprop", "dgrad") else None
    signs = signs if again else None  # the backward leaves the fprop's rotated domain through them
    # X and W themselves only where the backward has no quantised copy of them to use instead
    if not (again or st.forward_only):
        x, w = (x if a is None else None), (w if b is None else None)
    return out, (x, w, state, key_data, smooth_K, measure, box, a, b, masks, signs)


def _masked(dx, dw, masks, signs, k: int):
    """The gradients of the fprop's (rotated, quantised) operands -> those of x and w: QuEST's trust
    masks where the recipe has them, then the fprop rotation's inverse where the backward ran in its
    domain (backward_operands = "forward": `signs` are its signs; recipes validate that a masked,
    rotated fprop does). k: the length of the fprop's reduction axis before padding."""
    if masks is not None:
        mask_x, mask_w = masks
        dx = dx if mask_x is None else jnp.where(mask_x, dx, 0.0)
        dw = dw if mask_w is None else jnp.where(mask_w, dw, 0.0)
    if signs is not None:
        dx, dw = transforms.unrotate(dx, 1, signs, k), transforms.unrotate(dw, 0, signs, k)
    return dx, dw


def _qdot_bwd(res, cts):
    x, w, state, key_data, smooth_K, measure, box, a_saved, b_saved, masks, signs_f = res
    k = None if x is None else x.shape[1]  # used where the fprop was rotated, which keeps X
    st: RecipeStructure = box.value
    dy = cts[0]
    measure = _measure(measure)
    zero_state = jax.tree.map(jnp.zeros_like, state)
    if st.forward_only:
        dx, dw = _masked(_dot(dy, 1, w, 1, st.f32_dots), _dot(x, 0, dy, 0, st.f32_dots), masks, None, k)
        return dx, dw, zero_state, None, None, None, None
    k_g1, k_w, k_a, k_g2 = _keys(key_data, 1, 4)
    sg, sw, sa = st.grad, st.weight, st.activation
    again = st.backward_operands == "forward"
    if again:  # the forward's quantised operands, in its (rotated) domain, re-quantised as gradients
        sw = sa = sg
        w = quant.dequantize(_as_f32(b_saved), st.weight.along(0))
        x = quant.dequantize(_as_f32(a_saved), st.activation.along(1))
        a_saved = b_saved = None
    fmt_w = state.fmt["grad" if again else "weight"]
    fmt_a = state.fmt["grad" if again else "activation"]
    sink = jnp.zeros_like(state.grad_sink)
    hist_g = state.grad_sink[TELEMETRY_SIZE:] if (sg is not None and sg.scaling == "delayed") else None
    # dgrad: dX (M×K) = Q(dY; along N) · Q(W; along N)ᵀ
    dy_n, w_n_in, _ = _rotated(dy, 1, w, 1, st, "dgrad", key_data)
    g_n = None
    if sg is not None:
        g_n = quantise_operand(dy_n, sg, state.fmt["grad"], 1, key=k_g1, history=hist_g, measure=measure)
        # by concatenation, not `.at[].set`: a scatter, vmapped over layers or packed runs
        history = sink[TELEMETRY_SIZE:] if g_n.q.history is None else g_n.q.history
        sink = jnp.concatenate([g_n.telemetry.astype(sink.dtype), history.astype(sink.dtype)])
    w_n = None if sw is None else _restored(b_saved, sw, fmt_w, 1)
    if sw is not None and w_n is None:  # same scale as the forward (delayed: pre-update history)
        w_n = quantise_operand(w_n_in, sw, fmt_w, 1, key=k_w, history=None if again else state.hist.get("weight"))
    dx = _gemm(dy_n if g_n is None else g_n, 1, w_n_in if w_n is None else w_n, 1, _fast_ok(st, sg, sw), st.f32_dots)
    # wgrad: dW (K×N) = Q(X; along M)ᵀ · Q(dY; along M)
    x_m_in, dy_m, signs_m = _rotated(x, 0, dy, 0, st, "wgrad", key_data)
    x_m = None if sa is None else _restored(a_saved, sa, fmt_a, 0)
    if sa is not None and x_m is None:
        if again:
            x_m = quantise_operand(x_m_in, sa, fmt_a, 0, key=k_a)
        else:
            x_m = _quantise_x(x_m_in, None if signs_m is not None else smooth_K, st, state, k_a, 0, None)
    g_m = _restored(_saved(g_n), sg, state.fmt["grad"], 0) if _reusable(sg, st, "dgrad", "wgrad") else None
    if sg is not None and g_m is None:
        g_m = quantise_operand(dy_m, sg, state.fmt["grad"], 0, key=k_g2, history=hist_g)
    dw = _gemm(x_m_in if x_m is None else x_m, 0, dy_m if g_m is None else g_m, 0, _fast_ok(st, sa, sg), st.f32_dots)
    # a rotated dgrad/wgrad pads its reduction axis, never the free axes: dx is M×K' and dw K'×N
    dx, dw = _masked(dx, dw, masks, signs_f, k)
    return dx, dw, zero_state._replace(grad_sink=sink), None, None, None, None


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
               key: jax.Array | None = None, smooth_K: jax.Array | None = None,
               measure: jax.Array | bool = True) -> tuple[jax.Array, dict, dict]:
    """The quantised matmul with explicit state. Returns (y, forward telemetry by role
    (quant.TELEMETRY_FIELDS vectors; NaN where the bool `measure` is false: a Python bool skips
    the work in the program, a traced one at run time),
    new forward-role histories).
    Leading batch axes of x are flattened: (B, L, K) -> (B·L, K). `smooth_K`: optional
    power-of-two per-input-channel scale applied before quantising X and undone on its grid
    values (Smooth-SwiGLU); exact at full precision."""
    lead = x_MxK.shape[:-1]
    x2 = x_MxK.reshape(-1, x_MxK.shape[-1]).astype(jnp.float32)
    w = w_KxN.astype(jnp.float32)
    if not structure.quantises_gemms:
        return _dot(x2, 1, w, 0, structure.f32_dots).reshape(*lead, w.shape[-1]), {}, {}
    key_data = None if key is None else jax.random.key_data(key)
    smooth = None if smooth_K is None else jax.lax.stop_gradient(smooth_K).astype(jnp.float32)
    # a host-side bool stays static through the custom VJP (no telemetry traced where false)
    flag = _Static(bool(measure)) if isinstance(measure, (bool, np.bool_)) else jnp.asarray(measure, bool)
    y, telem, new_hist = _qdot(x2, w, state, key_data, smooth, flag, _Static(structure))
    return y.reshape(*lead, w.shape[-1]), telem, new_hist


# ---------------------------------------------------------------------------------------------
# Attention-input fake quantisation (forward only, straight-through gradient)
# ---------------------------------------------------------------------------------------------


def fake_quant_along(x: jax.Array, s: RoleStructure, fmt: jax.Array, axis: int, key: jax.Array | None = None) -> jax.Array:
    """Fake-quantise x along `axis` (the reduction axis of the matmul it feeds) with a
    straight-through gradient: the attention role (Q, K along head_dim; P, V along the keys)."""
    spec = _spec(s, axis, key)
    xhat = quant.fake_quant(jax.lax.stop_gradient(x), spec, key=key if spec.rounding == "stochastic" else None,
                            fmt_params=None if s.native else fmt)
    return x + jax.lax.stop_gradient(xhat - x)
