"""Training compute as it is spent: FLOPs by part, the bits each operand really carries, cost models.

A training step of the transformer in `scaling.train.model` runs these GEMM parts (per token, training =
forward + backward, Chinchilla's convention of 2 FLOPs per multiply-add):

    fprop   X·W      of every dense projection (qkv, out, up/gate, down)   2·N_matmul
    dgrad   dY·Wᵀ    of the same projections                               2·N_matmul
    wgrad   Xᵀ·dY    of the same projections                               2·N_matmul
    head_fprop / head_dgrad / head_wgrad   the output head                 2·d·V each
    attn_fwd   Q·Kᵀ and P·V, full T×T (no causal discount)                 4·n_layers·T·d
    attn_bwd   their four backward matmuls                                 8·n_layers·T·d

A recipe that keeps blocks in high precision (`high_precision_first` / `_last`) adds the kept
blocks' projections as parts of their own (kept_fprop, kept_dgrad, kept_wgrad: the same FLOPs per
layer, the kept recipe's bits), and one that rotates GEMM operands (`hadamard`) adds `rotations`:
2·b FLOPs per rotated element (a b×b product per block, run in BF16 on a GPU's tensor cores) over
both operands of every rotated GEMM (and, where the backward re-quantises the forward's operands,
`backward_operands = "forward"`, the inverse fprop rotation of dX and dW; there W and X enter
dgrad and wgrad with the grad role's bits). These `EXTRA_PARTS` are absent from older results tables,
where they count as zero.

Each part has two operands, and each operand a tensor role of the recipe (fprop: activation,
weight; dgrad: grad, weight; wgrad: activation, grad; attention: the `attention` role; the head
only when the recipe does not keep it in high precision; none of the backward parts of a
forward-only recipe). An operand's *effective bits* are its element bits plus its scale's bits
per element: MX +8/32 (E8M0 per 32), NVFP4 +8/16 (E4M3 per 16; the FP32 tensor scale is
negligible), `block` k +32/k, `block2d` k×k +32/k², `channel` +32/K (one FP32 scale per row of
the reduction length K), `tensor` +0 (one scale per tensor). An unquantised operand is 32 bits in
the simulation. `parts(cfg, recipe, tokens_per_step)` gives these exactly for one run; results
tables carry them as columns (`columns`), so any cost model can be applied after the fact.

A cost model turns parts into 16-bit FLOP units (one BF16 FLOP = 1):

    bits     each FLOP costs the mean effective bits of its two operands / 16
    h100, b200, mi355x, ...  every chip of `hardware.GPUS`: each GEMM runs at the rate of the format
             the GPU executes it in (the wider operand's element width, `hardware.precision_for_bits`):
             cost = BF16 peak / that peak (H100: FP8 and FP6/FP4 at 2x BF16; B200: FP4 at 4x, FP8/FP6
             at 2x; MI355X: FP6/FP4 at 4x, FP8 at 2x; FP32 = TF32 at 0.5x, MI355X's FP32 at 1/16).
             A format the chip lacks runs in the next wider one (FP4 on an H100 at the FP8 rate: the
             emulation's cost) and `CostModel.fallbacks` says which recipes and GEMMs that touched
    nominal  Kumar et al.'s convention, 6·N·D·P/16: every FLOP at the recipe's label P, attention
             and head not counted (what the toolkit used before; kept to compare against)
    FILE.toml  a user's own throughput table (`ThroughputTable`): a listed recipe costs its BF16
             FLOPs / its measured step throughput relative to BF16; another recipe each GEMM at
             1 / the table's relative rate of the format it runs in (docs/fitting.md)

In `bits` and the GPU models an operand the recipe leaves unquantised (attention, head, a
forward-only backward) costs `high_bits` (default 16: real low-precision training keeps these in
BF16), except in a run that quantises nothing: the FP32 reference costs 32 bits throughout.

One module: the parts and their operands' bits are the columns a results row carries (`columns`) and
every cost model prices exactly those columns back (`CostModel`), so a new part, role or scale layout
changes both sides together.
"""

from __future__ import annotations

import dataclasses
import functools
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from scaling.plan import hardware
from scaling.train import architectures, ladder
from scaling.errors import ConfigError

if TYPE_CHECKING:  # pandas loads in backfill: a run's process (scaling.train.member) never needs it
    import pandas as pd

# The JAX-side modules (formats, precision, quant) are imported inside the functions that quantise
# or parse recipes: results, fit and `scaling plan --fit` read this module without loading JAX.

PARTS = ("fprop", "dgrad", "wgrad", "head_fprop", "head_dgrad", "head_wgrad", "attn_fwd", "attn_bwd")
EXTRA_PARTS = ("kept_fprop", "kept_dgrad", "kept_wgrad", "rotations")  # only where a recipe has them
DENSE_PARTS = ("fprop", "dgrad", "wgrad", "kept_fprop", "kept_dgrad", "kept_wgrad")  # the projections' GEMMs
ROTATION_BITS = 16.0  # a Hadamard rotation runs as a BF16 matrix product
ROLE_SHORT = {"weight": "w", "activation": "a", "grad": "g"}
UNQUANTISED_BITS = 32.0
# bits of one scale value per granularity (a scale shared by a block of elements)
SCALE_BITS = {"mx": 8.0, "nvfp4": 8.0, "block": 32.0, "block2d": 32.0, "channel": 32.0}


@dataclass(frozen=True)
class Part:
    """One GEMM part of a training step: FLOPs per token and its two operands' effective bits."""

    name: str
    flops: float
    bits: tuple[float, float]
    width: float  # the wider operand's element bits: the format a GPU runs this GEMM in


# ----------------------------------------------------------------------------- bits per operand

def effective_bits(spec: Any, K: float) -> float:
    """Element bits + scale bits per element of an operand quantised by `spec` (a QuantSpec) along a
    reduction axis of length K; UNQUANTISED_BITS for None."""
    from scaling.numerics import formats

    if spec is None:
        return UNQUANTISED_BITS
    bits = float(formats.get(spec.format).bits)
    g = spec.granularity
    if g in ("none", "tensor"):
        return bits
    if g == "channel":
        return bits + SCALE_BITS[g] / K
    k = spec.block ** 2 if (g == "block2d" or spec.square_blocks) else min(spec.block, K)
    return bits + SCALE_BITS[g] / k


def element_bits(spec: Any) -> float:
    from scaling.numerics import formats

    return UNQUANTISED_BITS if spec is None else float(formats.get(spec.format).bits)


def _mean_bits(spec: Any, shapes: Sequence[tuple[float, float]]) -> float:
    """FLOP-weighted mean effective bits over GEMMs given as (flops weight, reduction length K)."""
    total = sum(w for w, _ in shapes)
    return sum(w * effective_bits(spec, K) for w, K in shapes) / total


def parts(cfg: Any, recipe: Any, tokens_per_step: int) -> list[Part]:
    """The GEMM parts of one training step of the config's architecture under `recipe`, per token.

    tokens_per_step (batch·seq_len) is wgrad's reduction length (only per-channel scales see it)."""
    from scaling.numerics import precision

    recipe = precision.get(recipe)
    L, d, V = cfg.n_layers, cfg.d_model, cfg.vocab
    w, a, g = recipe.weight, recipe.activation, recipe.grad
    bwd_g, bwd_w, bwd_a = (None, None, None) if recipe.forward_only else (g, w, a)
    if recipe.backward_operands == "forward":  # the forward's W and X re-quantised as gradients
        bwd_w = bwd_a = g
    proj = ladder.projections(cfg)
    # (flops weight, K) per projection for each GEMM: fprop reduces over d_in, dgrad over d_out, wgrad over tokens
    fprop_k = [(i * o, i) for i, o in proj]
    dgrad_k = [(i * o, o) for i, o in proj]
    wgrad_k = [(i * o, tokens_per_step) for i, o in proj]
    kept_layers = min(L, recipe.high_precision_first + recipe.high_precision_last)
    L_q = L - kept_layers
    n_matmul = L_q * sum(i * o for i, o in proj)
    head = not recipe.high_precision_embed
    t = recipe.attention
    def part(name, flops, spec_0, spec_1, ks_0, ks_1=None):
        bits = (_mean_bits(spec_0, ks_0), _mean_bits(spec_1, ks_1 or ks_0))
        return Part(name, flops, bits, max(element_bits(spec_0), element_bits(spec_1)))

    hd = (lambda s: s) if head else (lambda s: None)
    attention = architectures.of(cfg).attention(cfg)  # the transformer's: Q·Kᵀ over head_dim, P·V over T
    attn_flops = L * sum(f for f, _ in attention)
    extra = []
    if kept_layers:
        k = recipe.kept()
        kw_, ka_, kg_ = k.weight, k.activation, k.grad
        if k.forward_only:
            kg_ = kw_b = ka_b = None
        else:
            kw_b, ka_b = kw_, ka_
        n_kept = kept_layers * sum(i * o for i, o in proj)
        extra += [part("kept_fprop", 2.0 * n_kept, ka_, kw_, fprop_k),
                  part("kept_dgrad", 2.0 * n_kept, kg_, kw_b, dgrad_k),
                  part("kept_wgrad", 2.0 * n_kept, ka_b, kg_, wgrad_k)]
    rot = rotation_flops(recipe, proj, tokens_per_step) * L_q
    if rot:
        extra.append(Part("rotations", rot, (ROTATION_BITS, ROTATION_BITS), ROTATION_BITS))
    return [
        part("fprop", 2.0 * n_matmul, a, w, fprop_k),
        part("dgrad", 2.0 * n_matmul, bwd_g, bwd_w, dgrad_k),
        part("wgrad", 2.0 * n_matmul, bwd_a, bwd_g, wgrad_k),
        part("head_fprop", 2.0 * d * V, hd(a), hd(w), [(1, d)]),
        part("head_dgrad", 2.0 * d * V, hd(bwd_g), hd(bwd_w), [(1, V)]),
        part("head_wgrad", 2.0 * d * V, hd(bwd_a), hd(bwd_g), [(1, tokens_per_step)]),
        part("attn_fwd", attn_flops, t, t, attention),
        # backward: the saved (quantised) Q, K, V, P meet unquantised gradients
        part("attn_bwd", 2.0 * attn_flops, t, None, attention),
    ] + extra


def rotation_flops(recipe: Any, proj: Sequence[tuple[int, int]], tokens_per_step: int) -> float:
    """FLOPs per token of one layer's Hadamard rotations: every rotated GEMM's two operands, each
    element at `transforms.flops_per_element` (a weight's elements are shared by the step's tokens)."""
    from scaling.numerics import transforms

    total = 0.0
    for i, o in proj:
        w = i * o / tokens_per_step  # a weight's elements per token
        per_gemm = {"fprop": i + w, "dgrad": o + w, "wgrad": i + o}  # (X or dY) + (W or dY) per token
        if recipe.backward_operands == "forward":  # dX and dW leave the fprop's rotated domain
            per_gemm["fprop"] += i + w
        for gemm, elements in per_gemm.items():
            total += elements * transforms.flops_per_element(getattr(recipe.hadamard, gemm))
    return total


# ----------------------------------------------------------------------------- per-role columns

@functools.lru_cache(maxsize=256)
def quant_error(spec: Any) -> float:
    """Relative quantisation error of a role on Gaussian data: E[(x̂ - x)²] / E[x²] for x ~ N(0, 1) of
    shape 256×1024 quantised along its last axis (fixed seeds; current scaling even for a delayed
    spec, since Gaussian data has no history). 0 for an unquantised role. The recipe's error, known
    before training (Panferov et al. 2025 put precision into a law through such an error)."""
    if spec is None:
        return 0.0
    import jax
    import jax.numpy as jnp

    from scaling.numerics import quant

    spec = dataclasses.replace(spec, axis=-1, scaling="current")
    x = jax.random.normal(jax.random.key(0), (256, 1024), jnp.float32)
    xhat = quant.fake_quant(x, spec, key=jax.random.key(1))
    return float(jnp.mean((xhat - x) ** 2) / jnp.mean(x ** 2))


def role_columns(cfg: Any, recipe: Any) -> dict[str, float]:
    """Per-role precision columns the laws read: element bits P_w/P_a/P_g (32 unquantised; a
    forward-only recipe's gradients are 32), P_fwd = max(P_w, P_a), P_bwd = P_g; E/M bits per role;
    qerr_<role> (quant_error); and `block`, the weight role's scale block in fprop, with coarse
    scaling as a block as long as the scaled axis (channel: d_in; tensor: d_in·d_out; geometric
    mean over the projections), so Sun et al.'s log2(block) ranks tensor > channel > 128 > 32 > 16."""
    from scaling.numerics import formats, precision

    recipe = precision.get(recipe)
    out: dict[str, float] = {}
    for role, short in ROLE_SHORT.items():
        spec = getattr(recipe, role)
        if role == "grad" and recipe.forward_only:
            spec = None
        fmt = None if spec is None else formats.get(spec.format)
        out[f"P_{short}"] = UNQUANTISED_BITS if fmt is None else float(fmt.bits)
        out[f"ebits_{short}"] = 8.0 if fmt is None else float(getattr(fmt, "ebits", 0) or 0)
        out[f"mbits_{short}"] = 23.0 if fmt is None else float(getattr(fmt, "mbits", fmt.bits - 1) or 0)
        out[f"qerr_{short}"] = quant_error(spec)
    out["P_fwd"] = max(out["P_w"], out["P_a"])
    out["P_bwd"] = out["P_g"]
    out["block"] = scale_block(recipe.weight, ladder.projections(cfg))
    return out


def scale_block(spec: Any, proj: Sequence[tuple[int, int]]) -> float:
    """Elements sharing one scale (geometric mean over projections): a block's size, d_in for
    channel, d_in·d_out for tensor (and for an unquantised role, which has no finer scale)."""
    sizes = []
    for i, o in proj:
        g = None if spec is None else spec.granularity
        if g in ("block", "mx", "nvfp4"):
            sizes.append(min(spec.block, i))
        elif g == "block2d" or getattr(spec, "square_blocks", False):
            sizes.append(min(spec.block, i) * min(spec.block, o))
        elif g == "channel":
            sizes.append(i)
        else:
            sizes.append(i * o)
    return float(np.exp(np.mean(np.log(sizes))))


def columns(cfg: Any, recipe: Any, tokens_per_step: int) -> dict[str, float]:
    """Everything a results row needs to cost a run under any cost model, plus the role columns:
    flops_<part> (per token), bits_<part>_0 / _1 (operand effective bits), bits_eff (mean effective
    bits of the dense projections' GEMM operands, the recipe's number to quote), role_columns."""
    ps = parts(cfg, recipe, tokens_per_step)
    out: dict[str, float] = {}
    for p in ps:  # EXTRA_PARTS only where the recipe has them (older tables: absent, i.e. zero)
        out[f"flops_{p.name}"] = p.flops
        out[f"bits_{p.name}_0"], out[f"bits_{p.name}_1"] = p.bits
        out[f"width_{p.name}"] = p.width
    dense = [p for p in ps if p.name in DENSE_PARTS]
    out["bits_eff"] = sum(p.flops * sum(p.bits) / 2 for p in dense) / sum(p.flops for p in dense)
    out.update(role_columns(cfg, recipe))
    return out


# ----------------------------------------------------------------------------- cost models

TABLE_FORMATS = ("fp32", "tf32", "bf16", "fp8", "fp6", "fp4")  # the formats a throughput table may rate
TABLE_KEYS = ("name", "description", "recipes", "formats")


@dataclass(frozen=True)
class ThroughputTable:
    """A user's own measured throughputs, relative to BF16 (tokens/s of a recipe's step / tokens/s of
    BF16's; for a format, its GEMMs' FLOP/s / BF16's): `recipes` for whole recipes, `formats` for the
    GEMMs of recipes it does not list. Loaded from TOML (`load`; docs/fitting.md has the format)."""

    name: str
    path: str
    recipes: tuple[tuple[str, float], ...] = ()
    formats: tuple[tuple[str, float], ...] = ()

    @classmethod
    def load(cls, path: str | Path) -> "ThroughputTable":
        path = Path(path)
        if not path.is_file():
            raise ConfigError("cost_model", str(path), "a throughput table (a .toml file) that exists")
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError("cost_model", str(path), f"valid TOML ({str(e).splitlines()[0]})") from None
        for key in data:
            if key not in TABLE_KEYS:
                raise ConfigError(f"{path}: key", key, TABLE_KEYS)
        name = data.get("name", path.stem)
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{path}: name", name, "a non-empty string")
        rates = {}
        for section in ("recipes", "formats"):
            table = data.get(section, {})
            if not isinstance(table, dict):
                raise ConfigError(f"{path}: {section}", table, "a table of name = relative throughput")
            for key, value in table.items():
                if section == "formats" and key not in TABLE_FORMATS:
                    raise ConfigError(f"{path}: formats.{key}", value, f"a rate for one of {', '.join(TABLE_FORMATS)}")
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                    raise ConfigError(f"{path}: {section}.{key}", value, "a positive number: throughput relative to BF16")
                if section == "formats" and key == "bf16" and value != 1:
                    raise ConfigError(f"{path}: formats.bf16", value, "1 (rates are relative to BF16)")
            rates[section] = tuple((str(k), float(v)) for k, v in table.items())
        if not rates["recipes"] and not rates["formats"]:
            raise ConfigError(f"{path}: rates", "none", "a [recipes] or [formats] table with at least one rate")
        return cls(name.strip(), str(path), rates["recipes"], rates["formats"])

    def recipe_rate(self, recipe: Any) -> float | None:
        return dict(self.recipes).get(str(recipe))

    def format_rate(self, width: float) -> float | None:
        """The relative rate of the format a `width`-bit GEMM runs in (`hardware.native_precision`; above
        16 bits tf32, else fp32 if only that is given); BF16 is 1 unless given. None: the table has none."""
        formats = {"bf16": 1.0, **dict(self.formats)}
        fmt = hardware.native_precision(width)
        return formats.get(fmt, formats.get("fp32") if fmt == "tf32" else None)


@dataclass(frozen=True)
class Fallback:
    """A recipe's GEMMs that a chip runs in a wider format than their width asks for (it has no path for
    that format): what a cost model charges them, said in one line (str)."""

    recipe: str
    parts: tuple[str, ...]
    width: float
    wanted: str
    charged: str
    chip: str

    def __str__(self) -> str:
        return (f"{self.recipe} on the {self.chip}: its {self.wanted.upper()} GEMMs ({', '.join(self.parts)}) "
                f"charged at the {self.charged.upper()} rate: no {self.wanted.upper()} path")


@dataclass(frozen=True)
class CostModel:
    """How many 16-bit FLOP units a FLOP costs. kind: 'bits', 'nominal', a GPU name of
    `scaling.plan.hardware.GPUS` (e.g. 'h100', 'b200', 'mi355x'), or 'table' with `table` a user's
    ThroughputTable (`get("FILE.toml")`). high_bits: what an operand left unquantised costs in a run
    that quantises something (16: BF16)."""

    kind: str = "bits"
    high_bits: float = 16.0
    table: ThroughputTable | None = None

    def __post_init__(self):
        if self.kind not in ("bits", "nominal", "table") and self.kind not in hardware.GPUS:
            raise ConfigError("cost_model", self.kind, ["bits", "nominal", *hardware.GPUS, "FILE.toml"])
        if (self.kind == "table") != (self.table is not None):
            raise ConfigError("cost_model.table", self.table, "a ThroughputTable exactly when kind is 'table'")
        if not 0 < self.high_bits <= 32:
            raise ConfigError("cost_model.high_bits", self.high_bits, "bits in (0, 32]")

    @property
    def name(self) -> str:
        kind = self.table.name if self.table is not None else self.kind
        return kind if self.high_bits == 16 else f"{kind}(high={self.high_bits:g})"

    @property
    def gpu(self) -> hardware.GPU | None:
        """The chip this model prices on (None for bits, nominal and a throughput table)."""
        return hardware.GPUS.get(self.kind)

    def describe(self) -> str:
        if self.kind == "bits":
            return f"bits: each FLOP at its operands' mean effective bits / 16 (unquantised parts at {self.high_bits:g} bits)"
        if self.kind == "nominal":
            return "nominal: 6·N·D·P/16 (Kumar et al.; attention and head not counted)"
        if self.table is not None:
            listed = ", ".join(f"{k} {v:g}x" for k, v in self.table.recipes) or "none"
            rates = ", ".join(f"{k} {v:g}x" for k, v in self.table.formats) or "none"
            return (f"{self.table.name} ({self.table.path}): measured throughput relative to BF16; recipes: {listed}; "
                    f"other recipes' GEMMs at the format rates: {rates}")
        lacks = [f.upper() for f in ("fp4", "fp6", "fp8", "tf32") if f not in self.gpu.peak_tflops]
        note = f"; no {'/'.join(lacks)} path: those GEMMs charged at the next wider format's rate" if lacks else ""
        return f"{self.kind}: each GEMM at the {self.gpu.name} peak of the format it runs in, relative to BF16{note}"

    def gemm_factor(self, bits_0, bits_1, width):
        """Cost of one FLOP of a GEMM whose operands carry these effective bits (unquantised ones
        already mapped to high_bits) and whose wider operand has `width` element bits."""
        bits_0, bits_1, width = (np.asarray(v, float) for v in (bits_0, bits_1, width))
        if self.kind == "bits":
            return (bits_0 + bits_1) / 32.0
        slowdown = self._table_slowdown if self.table is not None else functools.partial(_slowdown, self.kind)
        if width.ndim == 0:  # the law optimiser's case, hundreds of thousands of calls
            return np.asarray(slowdown(float(width)))
        return np.vectorize(lambda w: slowdown(float(w)), otypes=[float])(width)

    def _table_slowdown(self, width: float) -> float:
        rate = self.table.format_rate(width)
        if rate is None:
            raise ConfigError(f"cost_model {self.table.name} ({self.table.path})", f"a {width:g}-bit GEMM",
                              f"a [formats] rate for {hardware.native_precision(width)}")
        return 1.0 / rate

    def fallback_note(self, width: float) -> str | None:
        """One line where this model's chip has no path for the format a `width`-bit GEMM asks for
        (it is charged at the next wider format's rate, what emulating it there costs); else None."""
        if self.gpu is None:
            return None
        fb = hardware.fallback(width, self.kind)
        if fb is None:
            return None
        return f"{fb[0].upper()} GEMMs on the {self.gpu.name} charged at the {fb[1].upper()} rate: no {fb[0].upper()} path"

    def fallbacks(self, df: pd.DataFrame) -> list[Fallback]:
        """Each (recipe, format) of a results table that this model's chip has no path for: the GEMM
        parts it touches and the format they are charged at instead (empty for bits, nominal, tables)."""
        if self.gpu is None or df.empty:
            return []
        flops, bits, width = _part_columns(df)
        quantised_run = np.any([b < UNQUANTISED_BITS for p in bits for b in bits[p]], axis=0)
        recipes = df["recipe"].astype(str).to_numpy() if "recipe" in df.columns else np.full(len(df), "a row")
        found: dict[tuple[str, float], list[str]] = {}
        for p in width:
            w = self._mapped(width[p], quantised_run)
            for recipe, wi, f in zip(recipes, w, flops[p]):
                if f > 0 and np.isfinite(wi) and hardware.fallback(float(wi), self.kind) is not None:
                    parts = found.setdefault((recipe, float(wi)), [])
                    if p not in parts:
                        parts.append(p)
        out = []
        for (recipe, wi), parts in found.items():
            wanted, charged = hardware.fallback(wi, self.kind)
            out.append(Fallback(recipe, tuple(parts), wi, wanted, charged, self.gpu.name))
        return out

    def _mapped(self, bits, quantised_run):
        bits = np.asarray(bits, float)
        return np.where((bits >= UNQUANTISED_BITS) & quantised_run, self.high_bits, bits)

    def per_token(self, df: pd.DataFrame) -> np.ndarray:
        """16-bit FLOP units per training token of each row (needs `columns`' columns; nominal: N, P)."""
        if self.kind == "nominal":
            return 6.0 * df["N"].to_numpy(float) * df["P"].to_numpy(float) / 16.0
        missing = [f"flops_{p}" for p in PARTS if f"flops_{p}" not in df.columns]
        if missing:
            raise ConfigError("results columns", missing[0], "a table with FLOPs by part (scaling.train.compute.columns)")
        flops, bits, width = _part_columns(df)
        quantised_run = np.any([b < UNQUANTISED_BITS for p in bits for b in bits[p]], axis=0)
        if self.table is not None:
            return self._table_per_token(df, flops, bits, width, quantised_run)
        total = np.zeros(len(df))
        for p in bits:
            b0, b1, w = (self._mapped(b, quantised_run) for b in (*bits[p], width[p]))
            total += flops[p] * self.gemm_factor(b0, b1, w)
        return total

    def _table_per_token(self, df, flops, bits, width, quantised_run) -> np.ndarray:
        """A listed recipe: its BF16 FLOPs (every GEMM of the model at the BF16 rate; rotations, which a
        BF16 run does not do, left out: the measured throughput has them) / its relative throughput.
        Another: each GEMM at 1 / the table's rate of its format; ConfigError where the table has neither."""
        recipes = df["recipe"].astype(str).to_numpy() if "recipe" in df.columns else np.full(len(df), "(no recipe column)")
        rate = np.array([self.table.recipe_rate(r) or np.nan for r in recipes])
        bf16_flops = sum(flops[p] for p in flops if p != "rotations")
        total = bf16_flops / rate
        unlisted = np.isnan(rate)
        if unlisted.any():
            per_part = np.zeros(len(df))
            for p in bits:
                w = self._mapped(width[p], quantised_run)
                inverse = np.array([np.nan if (r := self.table.format_rate(x)) is None else 1.0 / r for x in w])
                missing = unlisted & (flops[p] > 0) & np.isnan(inverse)
                if missing.any():
                    i = int(np.flatnonzero(missing)[0])
                    raise ConfigError(f"cost_model {self.table.name} ({self.table.path})", recipes[i],
                                      f"a recipe in its [recipes], or a [formats] rate for {hardware.native_precision(w[i])} "
                                      f"(its {p} GEMMs)")
                per_part += flops[p] * np.where(flops[p] > 0, inverse, 0.0)
            total = np.where(unlisted, per_part, total)
        return total

    def effective_bits(self, df: pd.DataFrame) -> np.ndarray:
        """Each row's effective bits as this model costs them: the FLOP-weighted mean over the dense
        projections' GEMMs (fprop, dgrad, wgrad) of their operands' bits, an unquantised operand in a
        run that quantises something at high_bits (the raw `bits_eff` column counts it at 32)."""
        flops, bits, _ = _part_columns(df)
        dense = [p for p in DENSE_PARTS if p in bits]
        quantised_run = np.any([b < UNQUANTISED_BITS for p in bits for b in bits[p]], axis=0)
        total = sum(flops[p] for p in dense)
        return sum(flops[p] * sum(self._mapped(b, quantised_run) for b in bits[p]) / 2 for p in dense) / total

    def compute(self, df: pd.DataFrame) -> np.ndarray:
        """Training compute of each row (run at token budget D) in 16-bit FLOP units."""
        return self.per_token(df) * df["D"].to_numpy(float)

    # --- hypothetical models (the law optimiser): N params at P bits, no run to read parts from

    def factor(self, P, overhead: float = 0.0):
        """Cost per FLOP of a dense GEMM whose operands all carry P element bits (+ scale overhead)."""
        P = np.asarray(P, float)
        if self.kind == "nominal":
            return P / 16.0
        return self.gemm_factor(P + overhead, P + overhead, P)

    def high_factor(self, P):
        """Cost per FLOP of the parts a P-bit run leaves unquantised (a 32-bit run: 32 bits)."""
        P = np.asarray(P, float)
        hi = np.full(P.shape, self.high_bits)
        return np.where(P >= UNQUANTISED_BITS, self.gemm_factor(P, P, P), self.gemm_factor(hi, hi, hi))


@functools.lru_cache(maxsize=None)
def _slowdown(gpu: str, width: float) -> float:
    """The GPU's BF16 peak over the peak of the format a `width`-bit GEMM runs in."""
    spec = hardware.get_gpu(gpu)
    return spec.peak("bf16") / spec.peak(hardware.precision_for_bits(width, gpu))


def _part_columns(df: pd.DataFrame):
    """flops, (bits_0, bits_1) and width per part of a results table: PARTS, plus the EXTRA_PARTS
    its columns have (rows without one, such as runs of recipes that lack it, count it as zero FLOPs)."""
    present = list(PARTS) + [p for p in EXTRA_PARTS if f"flops_{p}" in df.columns]
    col = lambda name, fill: df[name].to_numpy(float) if name in df.columns else np.full(len(df), fill)
    flops = {p: np.nan_to_num(col(f"flops_{p}", 0.0), nan=0.0) for p in present}
    bits = {p: tuple(np.where(flops[p] > 0, col(f"bits_{p}_{i}", UNQUANTISED_BITS), UNQUANTISED_BITS)
                     for i in (0, 1)) for p in present}
    width = {p: np.where(flops[p] > 0, col(f"width_{p}", UNQUANTISED_BITS), UNQUANTISED_BITS) for p in present}
    for p in PARTS:  # the base parts as the table has them (a row's missing value stays missing)
        flops[p] = df[f"flops_{p}"].to_numpy(float)
        bits[p] = (df[f"bits_{p}_0"].to_numpy(float), df[f"bits_{p}_1"].to_numpy(float))
        width[p] = df[f"width_{p}"].to_numpy(float)
    return flops, bits, width


COST_MODELS = ("bits", "nominal", *hardware.GPUS)  # and any user throughput table, FILE.toml


def get(name: str | Path | CostModel) -> CostModel:
    """A CostModel by name ('bits', 'nominal', a chip of hardware.GPUS: 'h100', 'b200', 'mi355x', ...) or
    a throughput table's path ('my-h100-bench.toml': ThroughputTable)."""
    if isinstance(name, CostModel):
        return name
    if str(name).endswith(".toml"):
        return CostModel(kind="table", table=ThroughputTable.load(name))
    return CostModel(kind=str(name))


@dataclass(frozen=True)
class UnquantisedShare:
    """The unquantised share of a hypothetical model of N non-embedding params, for the law optimiser:
    its FLOPs per token are 6·N in the dense GEMMs plus 6·N·ratio(N) left unquantised (attention, head),
    ratio(N) the FLOPs left unquantised per dense FLOP, a power law in N fitted by least squares in
    log-log to the trained runs' own values (exact through two).
    Why a fit, not the values joined: the trained shapes differ in depth and width, so their ratios
    jump between neighbouring sizes, and a ratio interpolated between them puts a kink in the cost at
    every trained N, where a law's compute-optimal N then snaps. Attention and head FLOPs fall as a
    share of the dense ones as models grow, which the power law carries beyond the trained sizes.
    No knots: ratio 0 (every FLOP in a quantised GEMM, Kumar et al.'s assumption)."""

    knots_N: tuple[float, ...] = ()
    knots_ratio: tuple[float, ...] = ()

    def ratio(self, N):
        slope, intercept = self._power_law
        return np.exp(intercept + slope * np.log(np.asarray(N, float)))

    @functools.cached_property
    def _power_law(self) -> tuple[float, float]:
        """(slope, intercept) of log ratio on log N, fitted once (the optimiser calls ratio millions of times)."""
        log_n, ratio = np.log(np.asarray(self.knots_N, float)), np.asarray(self.knots_ratio, float)
        # a knot with no finite ratio (fits made before from_results counted kept blocks as projections
        # stored inf where a recipe kept every block) says nothing: the others carry the trend
        log_n, ratio = log_n[np.isfinite(ratio)], ratio[np.isfinite(ratio)]
        if not len(ratio) or (ratio <= 0).all():
            return 0.0, -np.inf  # no knots: ratio 0
        if len(set(log_n)) < 2 or (ratio <= 0).any():  # one size, or a zero share: its mean, flat
            return 0.0, float(np.log(ratio.mean()))
        slope, intercept = np.polyfit(log_n, np.log(ratio), 1)
        return float(slope), float(intercept)

    @classmethod
    def from_results(cls, df: pd.DataFrame) -> "UnquantisedShare":
        """Knots from a results table: per N, (attention + head FLOPs) / dense projection FLOPs, the
        projections' blocks a recipe keeps in high precision counted as projections (the architecture's
        ratio, the same for every recipe: a recipe that keeps every block has no quantised fprop)."""
        if "flops_fprop" not in df.columns or df.empty:
            return cls()
        other = sum(df[f"flops_{p}"] for p in PARTS if p not in DENSE_PARTS)
        dense = sum(df[f"flops_{p}"] for p in DENSE_PARTS if f"flops_{p}" in df.columns)
        ratio = (other / dense).groupby(df["N"]).mean().sort_index()
        return cls(tuple(float(n) for n in ratio.index), tuple(float(r) for r in ratio))

    def to_dict(self) -> dict:
        return {"N": list(self.knots_N), "ratio": list(self.knots_ratio)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "UnquantisedShare":
        return cls() if not d else cls(tuple(d["N"]), tuple(d["ratio"]))


def hypothetical_compute(cost: CostModel, share: UnquantisedShare, N, D, P, overhead: float = 0.0):
    """16-bit FLOP units to train N params for D tokens at P bits under `cost` and unquantised `share`."""
    N = np.asarray(N, float)
    if cost.kind == "nominal":
        return 6.0 * N * np.asarray(D, float) * np.asarray(P, float) / 16.0
    per_token = 6.0 * N * (cost.factor(P, overhead) + share.ratio(N) * cost.high_factor(P))
    return per_token * np.asarray(D, float)


def hypothetical_tokens(cost: CostModel, share: UnquantisedShare, N, C, P, overhead: float = 0.0):
    """D affordable at compute C (inverse of hypothetical_compute)."""
    return C / hypothetical_compute(cost, share, N, 1.0, P, overhead)


def run_row(cfg, vocab: int = 256) -> dict[str, float]:
    """What a results row of a run config (scaling.train.config.RunConfig) will carry for the cost
    models, known before it runs: `columns`, N and P."""
    m = cfg.model
    model_cfg = m.shape(vocab)
    return {**columns(model_cfg, cfg.recipe, cfg.tokens_per_step),
            "N": float(ladder.param_counts(model_cfg)["non_embedding"]), "P": float(cfg.recipe.bits)}


# ----------------------------------------------------------------------------- older tables

def backfill(df: pd.DataFrame, *, batch_size: int = 16) -> pd.DataFrame:
    """Add `columns` to a results table written before runs recorded them, from each row's `size`,
    `recipe` (a preset or a recipe file in experiments/recipes) and `flops_per_token` (which fixes
    seq_len); rows already carrying them are kept. batch_size only enters per-channel wgrad scales."""
    import pandas as pd

    from scaling.numerics import precision

    if df.empty or ("flops_fprop" in df.columns and df["flops_fprop"].notna().all()):
        return df
    if not {"size", "recipe", "flops_per_token"} <= set(df.columns):
        return df  # a table that cannot say what was trained: nothing to derive (cost models will say so)
    rows = []
    cache: dict[tuple, dict] = {}
    for size, recipe, fpt in zip(df["size"], df["recipe"], df["flops_per_token"]):
        if pd.isna(size) or pd.isna(fpt) or pd.isna(recipe):
            rows.append({})
            continue
        key = (int(size), str(recipe), float(fpt))
        if key not in cache:
            base = ladder.config_for_size(int(size))
            # flops_per_token = 6·(N_matmul + d·V) + 12·n_layers·T·d  =>  T
            n_matmul = base.n_layers * sum(i * o for i, o in ladder.projections(base))
            T = round((float(fpt) - 6 * (n_matmul + base.d_model * base.vocab)) / (12 * base.n_layers * base.d_model))
            cfg = ladder.config_for_size(int(size), seq_len=T)
            rec = precision.get(_recipe_by_name(str(recipe)))
            cache[key] = columns(cfg, rec, batch_size * T)
        rows.append(cache[key])
    extra = pd.DataFrame(rows, index=df.index)
    if "flops_fprop" in df.columns:  # keep what runs recorded themselves
        extra = df[[c for c in extra.columns if c in df.columns]].combine_first(extra)
    keep = [c for c in df.columns if c not in extra.columns]
    return pd.concat([df[keep], extra], axis=1)


def _recipe_by_name(name: str) -> Any:
    """A recipe named in an older table: a preset, a file in experiments/recipes, or a named
    `precision` table in an experiment grid (the granularity sweep names its recipes that way)."""
    experiments = Path(__file__).resolve().parents[2] / "experiments"
    path = experiments / "recipes" / f"{name}.toml"
    if path.is_file():
        return str(path)
    for grid_file in sorted(experiments.glob("*.toml")):
        grid = tomllib.loads(grid_file.read_text()).get("grid", {})
        for value in grid.get("precision", []):
            if isinstance(value, dict) and value.get("name") == name:
                return value
    return name
