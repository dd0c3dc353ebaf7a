"""Precision recipes: which number format each tensor role of a training step gets.

A `Recipe` names, per tensor role, a `quant.QuantSpec` (or None = full FP32):

    weight      W as input of the fprop (Y = X·W) and dgrad (dX = dY·Wᵀ) GEMMs
    activation  X as input of the fprop and wgrad (dW = Xᵀ·dY) GEMMs
    grad        dY as input of the dgrad and wgrad GEMMs
    attention   Q, K, V and the softmax probabilities as inputs of the two attention matmuls

plus switches (forward-only, FP32-sensitive ops, high-precision embeddings, the fast path), the
precision of the float32 dots (`dot_precision`: true FP32, or TF32 as GPUs run them by default), the
GEMMs whose operands are rotated by a randomised Hadamard transform before they are quantised
(`hadamard`, see `scaling.numerics.transforms`) and the transformer blocks kept in a higher
precision (`high_precision_first` / `high_precision_last` blocks run the `high_precision` preset). `get`
builds one from a preset name, a format name, a TOML table or file. The recipe is a value: the
quantised GEMMs that run it are `scaling.numerics.gemm`.

Formats are runtime values. The numbers that define a format (mantissa bits, exponent range,
max) travel as a float32 vector (`format_vector`), so one compiled train step serves every format of
the same granularity. `RecipeStructure` is the static, format-free part a model stores; its
`RoleStructure.exact_in_bf16` says whether a role's grid is exact in bfloat16 (the fast path).

One module: the Recipe, the static RecipeStructure a model stores of it, the presets and the parser
(`get`) change together: a new role or switch is a field of the first, a part of the second and a key
the other two build and check.
"""

from __future__ import annotations

import dataclasses
import functools
import tomllib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from scaling.numerics import formats, quant, transforms
from scaling.numerics.transforms import GemmHadamard
from scaling.errors import ConfigError

ROLES = ("weight", "activation", "grad", "attention")
GEMM_ROLES = ("weight", "activation", "grad")

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
    fast_path: run exact low-precision GEMMs as bf16×bf16→fp32 dots (see `scaling.numerics.gemm`); both paths
        give the same bits. None (default): where bf16 dots are native (`scaling.host.native_bf16`:
        GPUs, CPUs with AMX or AVX512-BF16), since elsewhere XLA emulates them and they are slower
        than the FP32 path; true / false force it.
    hadamard: per GEMM (fprop / dgrad / wgrad), a randomised Hadamard rotation of both operands
        along the reduction axis before they are quantised (`transforms.GemmHadamard`).
    backward_operands: where the backward GEMMs take W (dgrad) and X (wgrad) from. "inputs": quantised
        afresh from the full-precision tensors with their own roles' specs (TransformerEngine, torchao).
        "forward": the forward GEMM's quantised W and X, quantised again with the grad role's spec
        along the backward GEMM's reduction axis (Quartet's backward, Castro et al. 2025, Alg. 1: an
        unbiased estimate of the gradient of the quantised forward when that spec rounds
        stochastically); the gradients then leave the fprop's rotated domain through its inverse.
    clip_mask: QuEST's trust estimator (Panferov et al. 2025; Quartet): the gradient of an element of
        W or X that the forward quantisation clipped is zero (the straight-through estimator passes
        the rest).
    high_precision_first / high_precision_last: the first / last k transformer blocks run the
        `high_precision` recipe (a preset name, default bf16) instead (NVIDIA's NVFP4 recipe keeps
        the last blocks in BF16); the embedding and head follow `high_precision_embed`.
    dot_precision: how every float32 × float32 dot runs (unquantised GEMMs, the FP32 path on
        dequantised operands, attention, the head): "fp32" (lax.Precision.HIGHEST, true FP32 on
        every backend), "tf32" (lax.Precision.DEFAULT: TF32 tensor cores on Ampere and later
        GPUs, what most GPU users train with; FP32 on a CPU) or "bf16x6" (the BF16_BF16_F32_X6 dot
        algorithm: each operand split into three bf16 parts, six bf16 products on tensor cores,
        FP32's 24 significant bits to within the accumulation's rounding; XLA:CPU ignores dot
        algorithms and runs FP32).
    """

    name: str = "fp32"
    weight: Any = None
    activation: Any = None
    grad: Any = None
    attention: Any = None
    forward_only: bool = False
    fp32_sensitive_ops: bool = True
    high_precision_embed: bool = True
    fast_path: bool | None = None
    hadamard: GemmHadamard = GemmHadamard()
    backward_operands: str = "inputs"
    clip_mask: bool = False
    high_precision_first: int = 0
    high_precision_last: int = 0
    high_precision: str = "bf16"
    dot_precision: str = "fp32"

    def role_bits(self, role: str) -> int:
        """Bit width of one role's element format (unquantised: 32, or TF32's 19 where the dots run in TF32)."""
        spec = getattr(self, role)
        if spec is None:
            return DOT_PRECISION_BITS[self.dot_precision]
        return int(formats.get(spec.format).bits)

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
            hadamard=self.hadamard,
            backward_operands=self.backward_operands,
            clip_mask=self.clip_mask,
            high_precision_first=self.high_precision_first,
            high_precision_last=self.high_precision_last,
            kept=self.kept().structure() if self.keeps_layers else None,
            dot_precision=self.dot_precision,
            attention_dtype=_attention_dtype(self.attention),
        )

    @property
    def keeps_layers(self) -> bool:
        return self.high_precision_first + self.high_precision_last > 0

    def kept(self) -> "Recipe":
        """The recipe of the blocks kept in high precision (`high_precision`)."""
        return get(self.high_precision, key="precision.high_precision")

    def formats(self) -> dict[str, jax.Array]:
        """Runtime format vectors of the quantised roles (see `format_vector`)."""
        return {r: format_vector(getattr(self, r).format) for r in ROLES if getattr(self, r) is not None}

    def describe(self) -> dict:
        """JSON-friendly description (for config.json / summary.json)."""
        out: dict[str, Any] = {"name": self.name, "bits": self.bits, "bits_w": self.bits_w,
                               "bits_a": self.bits_a, "bits_g": self.bits_g}
        for r in ROLES:
            spec = getattr(self, r)
            out[r] = None if spec is None else _describe_spec(spec)
        for k in ("forward_only", "fp32_sensitive_ops", "high_precision_embed", "fast_path"):
            out[k] = getattr(self, k)
        # keys added later appear only where set, so recipes without them describe (and hash) as before
        if self.hadamard:
            out["hadamard"] = self.hadamard.describe()
        if self.backward_operands != "inputs":
            out["backward_operands"] = self.backward_operands
        if self.clip_mask:
            out["clip_mask"] = True
        if self.dot_precision != "fp32":
            out["dot_precision"] = self.dot_precision
        if self.keeps_layers:
            out.update(high_precision_first=self.high_precision_first, high_precision_last=self.high_precision_last,
                       high_precision=self.high_precision)
        return out


_SPEC_DEFAULTS_OMITTED = {"square_blocks": False, "scale_from": "amax"}  # QuantSpec fields added later


def _describe_spec(spec: Any) -> dict:
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)
            if _SPEC_DEFAULTS_OMITTED.get(f.name, object()) != getattr(spec, f.name)}


@dataclass(frozen=True)
class RoleStructure:
    """The static part of a role: its QuantSpec with a canonical stand-in element format (the real
    format is a runtime vector), and whether the real format's grid is exact in bfloat16."""

    spec: Any  # quant.QuantSpec
    exact_in_bf16: bool
    # the spec holds the real format, static (not a stand-in): an unscaled bf16/fp16 role rounded to
    # nearest is XLA's ReducePrecision plus a select (formats.round_native), not the ~60-op emulation
    native: bool = False

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
    fast_path: bool | None = None
    hadamard: GemmHadamard = GemmHadamard()
    backward_operands: str = "inputs"
    clip_mask: bool = False
    high_precision_first: int = 0
    high_precision_last: int = 0
    kept: "RecipeStructure | None" = None  # the structure of the blocks kept in high precision
    dot_precision: str = "fp32"
    # "bfloat16" / "float16" where the attention inputs are exactly that type (the role's format,
    # unscaled): attention then runs as a fused kernel on them (cuDNN flash attention on a GPU)
    attention_dtype: str | None = None

    @property
    def quantises_gemms(self) -> bool:
        return any(getattr(self, r) is not None for r in GEMM_ROLES)

    @property
    def f32_dots(self) -> jax.lax.Precision | jax.lax.DotAlgorithmPreset:
        """The lax precision of this recipe's float32 × float32 dots (see `Recipe.dot_precision`)."""
        return DOT_PRECISIONS[self.dot_precision]


# Explicit on every f32 dot: with no precision, JAX runs float32 dots as TF32 on Ampere and later GPUs.
DOT_PRECISIONS = {"fp32": jax.lax.Precision.HIGHEST, "tf32": jax.lax.Precision.DEFAULT,
                  "bf16x6": jax.lax.DotAlgorithmPreset.BF16_BF16_F32_X6}
# TF32: sign, 8 exponent and 10 mantissa bits; bf16x6: three bf16 parts, 24 significant bits as FP32
DOT_PRECISION_BITS = {"fp32": 32, "tf32": 19, "bf16x6": 32}


def _attention_dtype(spec: Any) -> str | None:
    """The dtype the attention inputs are, where rounding them to the role's format without a scale is a cast."""
    if spec is None or spec.granularity != "none" or spec.rounding != "nearest":
        return None
    return {"bf16": "bfloat16", "fp16": "float16"}.get(formats.get(spec.format).name)


def role_structure(spec: Any) -> RoleStructure:
    exact = _exact_in_bf16(formats.get(spec.format))
    if spec.granularity == "none" and spec.rounding == "nearest" and formats.native(spec.format) is not None:
        # no scale, no randomness: the program depends on the format anyway, so it is static here
        return RoleStructure(spec=dataclasses.replace(spec, format=formats.native(spec.format).name),
                             exact_in_bf16=exact, native=True)
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


# The preset registry: one definition per named recipe. `register_preset(name, build, doc)` (or the
# decorator `@register_preset(name)`) adds one; `PRESETS` lists them in the order they were added.
# Element formats of the built-in presets: FP8 = E4M3 forward / E5M2 gradients (Micikevicius et al.
# 2022); FP6 = E2M3 forward / E3M2 gradients (more range for gradients, as in the OCP MX spec);
# FP4 = E2M1 everywhere. 4-bit recipes round gradients stochastically (NVIDIA's NVFP4 recipe,
# Tseng et al. 2025 for MXFP4), since nearest rounding biases small gradient updates to zero.
_PRESETS: dict[str, Callable[[], Recipe]] = {}
_PRESET_DOCS: dict[str, str] = {}
PRESETS: tuple[str, ...] = ()  # the registered names, in registration order (rebound by register_preset)


def register_preset(name: str, build: Callable[[], Recipe] | None = None, *, doc: str | None = None) -> Any:
    """Add a named recipe: `get(name)` (and every `precision = "name"`) then builds `build()`.

    `build` takes no arguments and returns a Recipe whose `name` is `name`; `doc` (default: the
    builder's docstring) is one line saying what it is. Called without `build`, it is a decorator:

        @precision.register_preset("fp8-e4m3-grads")
        def _():
            "FP8 with E4M3 gradients too."
            return precision.Recipe(name="fp8-e4m3-grads", weight=..., activation=..., grad=...)

    A name already registered, not a non-empty string, or ending in '.toml' (a recipe file) raises
    ConfigError, as does a builder that does not return a Recipe of that name. Returns `build`.
    """
    global PRESETS
    if not isinstance(name, str) or not name or name.endswith(".toml"):
        raise ConfigError("preset", name, "a non-empty string not ending in '.toml'")
    if name in _PRESETS:
        raise ConfigError("preset", name, "a name not yet registered (taken: " + ", ".join(_PRESETS) + ")")
    if build is None:
        def decorate(fn: Callable[[], Recipe]) -> Callable[[], Recipe]:
            return register_preset(name, fn, doc=doc)
        return decorate
    if not callable(build):
        raise ConfigError(f"preset.{name}", build, "a function of no arguments returning a Recipe")
    recipe = build()
    if not isinstance(recipe, Recipe) or recipe.name != name:
        raise ConfigError(f"preset.{name}", recipe.name if isinstance(recipe, Recipe) else recipe,
                          f"a Recipe named {name!r}")
    _PRESETS[name] = build
    _PRESET_DOCS[name] = " ".join((doc if doc is not None else build.__doc__ or "").split())
    PRESETS = tuple(_PRESETS)
    return build


def preset_doc(name: str) -> str:
    """The one-line description a preset was registered with."""
    if name not in _PRESETS:
        raise ConfigError("preset", name, PRESETS)
    return _PRESET_DOCS[name]


def _preset(name: str) -> Recipe | None:
    """The recipe a registered preset builds (a fresh one each call), or None if `name` is none."""
    build = _PRESETS.get(name)
    return None if build is None else build()


def _register_uniform(name: str, fmt_fwd: str, fmt_grad: str, granularity: str, grad_rounding: str = "nearest", *,
                      doc: str, **kw: Any) -> None:
    """A preset whose three GEMM roles share a granularity (`_uniform`)."""
    register_preset(name, functools.partial(_uniform, name, fmt_fwd, fmt_grad, granularity, grad_rounding, **kw), doc=doc)


register_preset("fp32", lambda: Recipe(name="fp32"), doc="No role quantised; every dot in true FP32.")
# FP32 storage, every dot on TF32 tensor cores (PyTorch's allow_tf32, JAX's GPU default)
register_preset("tf32", lambda: Recipe(name="tf32", dot_precision="tf32"),
                doc="No role quantised; every dot on TF32 tensor cores (the GPU default).")
register_preset("bf16", lambda: Recipe(name="bf16", weight=_spec("bf16", "none"), activation=_spec("bf16", "none"),
                                       grad=_spec("bf16", "none")),
                doc="Every GEMM input cast to BF16, no scale.")
# fp16 gradients get a per-tensor scale: the ideal dynamic loss scale (fp16 has no range).
register_preset("fp16", lambda: Recipe(name="fp16", weight=_spec("fp16", "none"), activation=_spec("fp16", "none"),
                                       grad=_spec("fp16", "tensor")),
                doc="Weights and activations cast to FP16; gradients FP16 with a per-tensor scale (ideal loss scaling).")
_register_uniform("fp8", "fp8_e4m3", "fp8_e5m2", "tensor",
                  doc="FP8 (E4M3 forward, E5M2 gradients), per-tensor current scaling.")
_register_uniform("fp8-delayed", "fp8_e4m3", "fp8_e5m2", "tensor", scaling="delayed", amax_history=16,
                  doc="FP8 (E4M3 forward, E5M2 gradients), per-tensor delayed scaling (amax history 16).")


@register_preset("fp8-blockwise")
def _fp8_blockwise() -> Recipe:
    """DeepSeek-V3's FP8: E4M3 everywhere, 1x128 tiles for activations and gradients, 128x128 blocks for weights."""
    return Recipe(name="fp8-blockwise", weight=_spec("fp8_e4m3", "block2d", block=128),
                  activation=_spec("fp8_e4m3", "block", block=128),
                  grad=_spec("fp8_e4m3", "block", block=128))


_register_uniform("mxfp8", "fp8_e4m3", "fp8_e5m2", "mx", doc="MXFP8 (E4M3 forward, E5M2 gradients), E8M0 scale per 32.")
_register_uniform("mxfp6", "fp6_e2m3", "fp6_e3m2", "mx", doc="MXFP6 (E2M3 forward, E3M2 gradients), E8M0 scale per 32.")
_register_uniform("mxfp4", "fp4_e2m1", "fp4_e2m1", "mx", "stochastic",
                  doc="MXFP4 (E2M1), E8M0 scale per 32; gradients rounded stochastically.")
_register_uniform("nvfp4", "fp4_e2m1", "fp4_e2m1", "nvfp4", "stochastic",
                  doc="NVFP4 (E2M1), E4M3 scale per 16 and an FP32 tensor scale; gradients rounded stochastically.")
_register_uniform("fp6", "fp6_e2m3", "fp6_e3m2", "tensor", doc="FP6 (E2M3 forward, E3M2 gradients), per-tensor current scaling.")
_register_uniform("fp4", "fp4_e2m1", "fp4_e2m1", "tensor", "stochastic",
                  doc="FP4 (E2M1), per-tensor current scaling; gradients rounded stochastically.")


@register_preset("nvfp4-nvidia")
def _nvfp4_nvidia() -> Recipe:
    """NVIDIA's NVFP4 pretraining recipe: 16x16 weight tiles, a fixed 16-point Hadamard on wgrad, the last block in BF16."""
    # NVIDIA, "Pretraining Large Language Models with NVFP4" (2025), §4: 16×16 2-D block scales for
    # weights (§4.3, W and Wᵀ quantise alike), 1×16 blocks for activations and gradients, a random
    # Hadamard transform of size 16 on the wgrad GEMM's inputs with one fixed sign vector (§4.2),
    # stochastic rounding on gradients only (§4.4), the last blocks in BF16 (§4.1: ~16% of the
    # linear layers at 12B; one block is that share at this ladder's 5-10 layers).
    return Recipe(name="nvfp4-nvidia", weight=_spec("fp4_e2m1", "nvfp4", square_blocks=True),
                  activation=_spec("fp4_e2m1", "nvfp4"),
                  grad=_spec("fp4_e2m1", "nvfp4", rounding="stochastic"),
                  hadamard=GemmHadamard(wgrad=transforms.Hadamard(16, signs="fixed")),
                  high_precision_last=1)


def _quartet() -> Recipe:
    """Quartet (Castro et al. 2025): MXFP4 GEMMs after 32-point Hadamard rotations, QuEST RMS scales forward."""
    # Castro et al., "Quartet: Native FP4 Training Can Be Optimal for LLMs" (2025), §4 (Algorithm 1):
    # every GEMM in MXFP4 after a Hadamard transform of the group size 32 along its reduction
    # axis; forward QuEST-style (E8M0 scale from the block RMS with the MSE-optimal Gaussian
    # clip, round to nearest), backward with stochastic rounding of the gradients and freshly
    # drawn signs. Simplifications: the backward re-uses the roles' forward rounding for W and X
    # (Quartet rounds them stochastically too), gradients take the E8M0 scale that never clips
    # (Quartet: amax scale times 4/3) and QuEST's clipped-element gradient mask is not applied.
    fwd = _spec("fp4_e2m1", "mx", scale_from="rms")
    return Recipe(name="quartet", weight=fwd, activation=fwd,
                  grad=_spec("fp4_e2m1", "mx", rounding="stochastic", scale_rounding="ceil"),
                  hadamard=GemmHadamard(fprop=transforms.Hadamard(32, signs="fixed"),
                                        dgrad=transforms.Hadamard(32), wgrad=transforms.Hadamard(32)))


register_preset("quartet", _quartet)


@register_preset("quartet-full")
def _quartet_full() -> Recipe:
    """Quartet as its code trains: `quartet`, the backward re-rounding the forward's W and X, QuEST's trust mask."""
    # Quartet as its code trains (IST-DASLab/Quartet, main_setup.sh: QuestMXFP4Quantizer forward,
    # AlbertTsengQuantizer gradients, backward scheme "Q(E)Q(Wt)t_Q(Et)Q(Xt)t"): the `quartet`
    # preset plus the two parts it leaves out. The backward GEMMs take the forward's quantised W
    # and X and round them again stochastically along their own reduction axes, rotated with the
    # gradients' fresh signs; QuEST's trust mask zeroes the gradient of every element the forward
    # clipped. Kept apart from the paper: gradient scales are true E8M0 (the one that never
    # clips; Quartet's kernel multiplies a power of two by 4/3), forward scales from the block
    # RMS rather than its standard deviation, and the fprop rotation has random signs.
    return dataclasses.replace(_quartet(), name="quartet-full", backward_operands="forward", clip_mask=True)


@register_preset("mxfp4-rht")
def _mxfp4_rht() -> Recipe:
    """Tseng et al. 2025: the forward in BF16, the backward GEMMs in MXFP4 after random Hadamard rotations (32)."""
    # Tseng, Yu & Park, "Training LLMs with MXFP4" (2025): the forward in BF16, the backward GEMMs
    # (dgrad, wgrad) in MXFP4 with every operand (dY, W, X) rounded stochastically after a random
    # Hadamard transform along the GEMM's reduction axis, so the gradient is unbiased and the
    # transform bounds the rounding's variance. Transform size 32 and a scale that never clips,
    # as Quartet's code reimplements it (AlbertTsengQuantizer: 3/4 of the amax scale; here the
    # E8M0 scale rounded up).
    bf16 = _spec("bf16", "none")
    return Recipe(name="mxfp4-rht", weight=bf16, activation=bf16,
                  grad=_spec("fp4_e2m1", "mx", rounding="stochastic", scale_rounding="ceil"),
                  hadamard=GemmHadamard(dgrad=transforms.Hadamard(32), wgrad=transforms.Hadamard(32)),
                  backward_operands="forward")

_RECIPE_KEYS = ("name", "base", "weight", "activation", "grad", "attention", "forward_only",
                "fp32_sensitive_ops", "high_precision_embed", "fast_path", "hadamard",
                "high_precision_first", "high_precision_last", "high_precision", "dot_precision",
                "backward_operands", "clip_mask")
BACKWARD_OPERANDS = ("inputs", "forward")


def get(value: str | Mapping[str, Any] | Recipe, *, key: str = "precision") -> Recipe:
    """A Recipe from a preset name, any format name (all GEMM roles that format, per tensor,
    current scaling), a TOML-style mapping, a path to a .toml recipe file (its [precision]
    table), or a Recipe (returned as is).

    Mapping form: {name=..., base="fp8" (optional preset to start from), weight={format=...,
    granularity=..., ...} | "none", activation=..., grad=..., attention=..., forward_only=bool,
    fp32_sensitive_ops=bool, high_precision_embed=bool, fast_path=bool, dot_precision="fp32"|"tf32"}. Role tables take the
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
    for flag in ("forward_only", "fp32_sensitive_ops", "high_precision_embed", "fast_path", "clip_mask"):
        if flag in m:
            if not isinstance(m[flag], bool):
                raise ConfigError(f"{key}.{flag}", m[flag], "true or false")
            changes[flag] = m[flag]
    if "hadamard" in m:
        changes["hadamard"] = transforms.parse(m["hadamard"], f"{key}.hadamard")
    for count in ("high_precision_first", "high_precision_last"):
        if count in m:
            v = m[count]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"{key}.{count}", v, "an integer >= 0 (transformer blocks)")
            changes[count] = v
    if "backward_operands" in m:
        if m["backward_operands"] not in BACKWARD_OPERANDS:
            raise ConfigError(f"{key}.backward_operands", m["backward_operands"], BACKWARD_OPERANDS)
        changes["backward_operands"] = m["backward_operands"]
    if "dot_precision" in m:
        if m["dot_precision"] not in DOT_PRECISIONS:
            raise ConfigError(f"{key}.dot_precision", m["dot_precision"], list(DOT_PRECISIONS))
        changes["dot_precision"] = m["dot_precision"]
    if "high_precision" in m:
        if not isinstance(m["high_precision"], str) or _preset(m["high_precision"]) is None:
            raise ConfigError(f"{key}.high_precision", m["high_precision"], PRESETS)
        changes["high_precision"] = m["high_precision"]
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
    operands = {"fprop": ("activation", "weight"), "dgrad": ("grad", "weight"), "wgrad": ("activation", "grad")}
    for gemm, roles in operands.items():
        if getattr(recipe.hadamard, gemm) is None:
            continue
        if gemm != "fprop" and recipe.forward_only:
            raise ConfigError(f"{key}.hadamard.{gemm}", getattr(recipe.hadamard, gemm).block,
                              "none with forward_only = true (the backward GEMMs run in FP32)")
        if all(getattr(recipe, r) is None for r in roles):
            raise ConfigError(f"{key}.hadamard.{gemm}", getattr(recipe.hadamard, gemm).block,
                              f"none unless {roles[0]} or {roles[1]} is quantised")
    if recipe.backward_operands == "forward":
        missing = [r for r in GEMM_ROLES if getattr(recipe, r) is None]
        if missing or recipe.forward_only:
            raise ConfigError(f"{key}.backward_operands", "forward", "'inputs' unless weight, activation and grad "
                              "are all quantised and forward_only is false")
        if recipe.grad.scaling == "delayed":
            raise ConfigError(f"{key}.backward_operands", "forward", "'inputs' with a delayed grad scale")
    if recipe.clip_mask:
        if recipe.weight is None and recipe.activation is None:
            raise ConfigError(f"{key}.clip_mask", True, "false unless weight or activation is quantised")
        if recipe.hadamard.fprop is not None and recipe.backward_operands != "forward":
            raise ConfigError(f"{key}.clip_mask", True, "false with a rotated fprop unless backward_operands = "
                              "'forward' (the mask lives in the fprop's rotated domain)")
    if recipe.keeps_layers and recipe.kept().keeps_layers:
        raise ConfigError(f"{key}.high_precision", recipe.high_precision, "a preset that keeps no layers itself")
