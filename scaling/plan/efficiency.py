"""How fast a step's kernels run: the precision recipe's GEMM rate and bytes (StepRecipe, RECIPES) and
the calibrated fractions of the spec sheet that real kernels reach, per GPU generation (Efficiency,
EFFICIENCY; fitted by scaling.plan.stepvalidate on scaling/plan/step_cases.json).

RECIPES names each recipe as the trainer's preset it prices (scaling.numerics.precision.PRESETS), so
the planner prices the same names the trainer trains. PLANNER_ONLY lists the recipe names that are no
trainer preset, each with why (none today)."""

from __future__ import annotations

from dataclasses import dataclass

from scaling.errors import ConfigError
from scaling.plan.hardware import GPU, GPUS

ROTATED_GEMMS = ("fprop", "dgrad", "wgrad")


@dataclass(frozen=True)
class StepRecipe:
    """How a precision recipe runs the linear layers' GEMMs.

    rate: the tensor-core peak it runs at; bytes: bytes per quantised element including its
    scales; native: a block-scaled format the GPU must run natively (Blackwell MX/NVFP4);
    blocks: scales run in blocks along the reduction axis, so the backward GEMMs, which reduce
    along the other axis, need a second copy quantised along it (TE's row- and column-wise data).
    Attention, norms and communication stay in BF16 in every recipe (Transformer Engine's default).

    The published FP4 recipes add (scaling.numerics.precision's presets of the same names):
    rotated: the GEMMs ("fprop", "dgrad", "wgrad") whose two operands are rotated by a
      block-diagonal Hadamard transform of `rotation_block` along their reduction axis before
      quantisation, 2 * rotation_block FLOPs per element (a b x b product per block of b);
    fused_rotations: those of them whose rotation runs inside the quantiser (no pass of its own);
      the others cost a BF16 read and write (4 bytes per element) before it;
    weight_tile: k > 0 for k x k weight scales (one scale per tile, so W and W^T quantise to the same
      values): one quantised weight serves the forward and backward GEMMs where the GPU's GEMMs at
      this rate take a transposed operand (weight_copies);
    rms_scales: the forward roles' (weights' and activations') scales come from the block RMS
      (QuEST): a sum of squares, 2 FLOPs per element, fused in the quantiser (no bytes, no time);
    unrotated_grads: the backward runs in the fprop's rotated domain (Quartet's code: the forward's
      quantised W and X are re-quantised for dgrad and wgrad), so dX and dW leave it through the
      inverse rotation: 2 * rotation_block FLOPs and a BF16 read and write per element of each;
    kept_first / kept_last: shares of the transformer layers, first and last, whose GEMMs stay in BF16
      (priced at the BF16 rate with no quantise passes; kept_layers).
    """

    rate: str
    bytes: float
    native: str | None = None
    blocks: bool = False
    rotated: tuple[str, ...] = ()
    rotation_block: int = 0
    fused_rotations: tuple[str, ...] = ()
    weight_tile: int = 0
    rms_scales: bool = False
    unrotated_grads: bool = False
    kept_first: float = 0.0
    kept_last: float = 0.0

    def copies(self, gpu: GPU) -> int:
        """Quantised copies of each GEMM input: two where the backward needs its own (blocks, or
        per-tensor FP8 on GPUs whose FP8 GEMMs take only TN layouts: a transposed copy), else one."""
        return 2 if self.blocks or (self.rate == "fp8" and not gpu.fp8_any_layout) else 1

    def weight_copies(self, gpu: GPU) -> int:
        """Quantised copies of each weight: one under square weight tiles where the GEMM takes the
        quantised weight transposed (W and W^T hold the same values and scales), else `copies`."""
        return 1 if self.weight_tile and takes_transposed(self.rate, gpu) else self.copies(gpu)

    def kept_layers(self, layers: int) -> tuple[int, int]:
        """(first, last) layers of a `layers`-layer model kept in BF16 (shares rounded half up;
        together at most all of them)."""
        first = min(layers, int(layers * self.kept_first + 0.5))
        return first, min(layers - first, int(layers * self.kept_last + 0.5))

    def rotation_flops(self, gemm: str) -> float:
        """FLOPs to rotate one element of an operand of `gemm` (0 where that GEMM is not rotated)."""
        return 2.0 * self.rotation_block if gemm in self.rotated else 0.0

    def rotation_bytes(self, gemm: str) -> float:
        """HBM bytes to rotate one element of an operand of `gemm` outside the quantiser."""
        return 4.0 if gemm in self.rotated and gemm not in self.fused_rotations else 0.0


def takes_transposed(rate: str, gpu: GPU) -> bool:
    """Whether the GPU's GEMMs at `rate` take a quantised operand in either layout, so the backward
    can read the forward's copy. FP8: Blackwell yes, Hopper TN only (hardware.GPU.fp8_any_layout).
    FP4: TN only, both operands K-major ("NVFP4 GEMM only supports the TN layout": Transformer
    Engine's NVFP4 documentation, "Handling transposes"), so even a 2-D-scaled FP4 weight is also
    written transposed."""
    if rate == "fp8":
        return gpu.fp8_any_layout
    return rate != "fp4"


# NVIDIA's NVFP4 pretraining recipe (arXiv 2509.25149, Sec. 4): its 12B model keeps the first two
# and the last eight of its 62 blocks in BF16 (about 16% of the linear layers; the training preset,
# on 5-10 layer models, keeps the last one).
NVFP4_NVIDIA_KEPT = (2 / 62, 8 / 62)


# Scale overhead per element: MX formats carry one E8M0 byte per 32 elements (OCP MX spec v1.0);
# NVFP4 one E4M3 byte per 16 (NVIDIA); DeepSeek-V3's blockwise FP8 one FP32 per 128 (1x128 tiles).
#
# One word per thing: a recipe here is named as the trainer's preset it prices
# (scaling.numerics.precision.PRESETS: `scaling plan step --precision fp8-blockwise` prices what
# `precision = "fp8-blockwise"` trains). A recipe with no trainer preset must be listed in PLANNER_ONLY
# (tests/plan/test_recipe_names.py checks both). A trainer preset with no recipe here is not priced
# (`--precision` then names the allowed ones; mxfp4-rht, whose forward and backward run at different
# rates: docs/planner.md).
RECIPES: dict[str, StepRecipe] = {
    "bf16": StepRecipe("bf16", 2.0),
    "fp8": StepRecipe("fp8", 1.0),  # per-tensor scaling (Transformer Engine delayed/current scaling)
    "fp8-blockwise": StepRecipe("fp8", 1.0 + 4 / 128, blocks=True),  # DeepSeek-V3 (its 128x128 weight blocks priced as 1x128 tiles)
    "mxfp8": StepRecipe("fp8", 1.0 + 1 / 32, "mxfp8", blocks=True),
    # the chip's FP6 rate: Blackwell's is its FP8 rate, MI355X's its FP4 rate (hardware.GPUS)
    "mxfp6": StepRecipe("fp6", 0.75 + 1 / 32, "mxfp6", blocks=True),
    "mxfp4": StepRecipe("fp4", 0.5 + 1 / 32, "mxfp4", blocks=True),
    "nvfp4": StepRecipe("fp4", 0.5 + 1 / 16, "nvfp4", blocks=True),
    # NVIDIA's NVFP4 recipe (Sec. 4): 16x16 weight tiles, a 16-point random Hadamard transform on the
    # wgrad GEMM's inputs, the first/last blocks in BF16. Transformer Engine fuses that transform into
    # the column-wise NVFP4 cast (hadamard_transform_cast_fusion) and the amax pass it needs anyway
    # (nvte_hadamard_transform_amax): FLOPs, no bytes of its own. The 2-D scales are stored per 1x16
    # row of the tile (the GEMM reads one scale per 16 along K): the same bytes as 1-D.
    "nvfp4-nvidia": StepRecipe("fp4", 0.5 + 1 / 16, "nvfp4", blocks=True, rotated=("wgrad",), rotation_block=16,
                               fused_rotations=("wgrad",), weight_tile=16,
                               kept_first=NVFP4_NVIDIA_KEPT[0], kept_last=NVFP4_NVIDIA_KEPT[1]),
    # Quartet (Castro et al. 2025, Sec. 4): MXFP4 GEMMs whose operands are all rotated by 32-point
    # Hadamard transforms, forward scales from the block RMS (QuEST). Its forward quantiser fuses the
    # rotation (QuTLASS's fusedQuantizeMx: transform + quantisation + scales in one kernel); the
    # backward rotations (fresh signs) are priced as passes of their own, a BF16 read and write.
    "quartet": StepRecipe("fp4", 0.5 + 1 / 32, "mxfp4", blocks=True, rotated=ROTATED_GEMMS, rotation_block=32,
                          fused_rotations=("fprop",), rms_scales=True),
    # Quartet as its code trains (scaling.numerics.precision's `quartet-full`): `quartet` plus the
    # inverse fprop rotation of dX and dW (QuEST's backward: (dX ⊙ mask)·Hᵀ, a pass of its own in
    # Quartet's code); its trust mask is 1 bit per element of X and W, not priced
    "quartet-full": StepRecipe("fp4", 0.5 + 1 / 32, "mxfp4", blocks=True, rotated=ROTATED_GEMMS, rotation_block=32,
                               fused_rotations=("fprop",), rms_scales=True, unrotated_grads=True),
    # FP32 GEMMs on TF32 tensor cores (what cuBLAS and XLA do by default): priced as BF16 inputs
    # cast to FP32 per GEMM; the activations, norms and collectives stay priced in BF16
    "tf32": StepRecipe("tf32", 4.0),
    # FP32 GEMMs at the FP32 rate: what FP32 matmuls cost on a chip with no TF32 path (MI355X), and
    # what the `fp32` preset (dot precision HIGHEST) asks of any chip; priced otherwise as tf32
    "fp32": StepRecipe("fp32", 4.0),
}


# Recipes the planner prices that are no trainer preset (each with why): none today; every RECIPES
# name is a preset of scaling.numerics.precision.
PLANNER_ONLY: dict[str, str] = {}


def get_recipe(precision: str, gpu: GPU) -> StepRecipe:
    recipe = RECIPES.get(precision.lower())
    if recipe is None:
        raise ConfigError("precision", precision, RECIPES)
    if recipe.rate not in gpu.peak_tflops or (recipe.native and recipe.native not in gpu.block_scaled):
        runs = [p for p, r in RECIPES.items() if r.rate in gpu.peak_tflops and (not r.native or r.native in gpu.block_scaled)]
        raise ConfigError("precision", precision, f"one of {', '.join(runs)} on {gpu.name}")
    return recipe


# hardware format (scaling.plan.hardware.precision_for_bits) -> the recipe that runs it
RECIPE_FOR_FORMAT = {"bf16": "bf16", "fp8": "fp8", "fp6": "mxfp6", "fp4": "nvfp4", "tf32": "tf32", "fp32": "fp32"}


def recipe_for_format(precision: str, gpu: GPU) -> str:
    """The step recipe that runs a hardware format on `gpu`: RECIPE_FOR_FORMAT's, except FP4 on a chip
    with MX but no NVFP4 scaling (MI355X), which runs mxfp4."""
    name = RECIPE_FOR_FORMAT[precision]
    if name == "nvfp4" and "nvfp4" not in gpu.block_scaled and "mxfp4" in gpu.block_scaled:
        return "mxfp4"
    return name


# --------------------------------------------------------------------------------------------
# Efficiency constants (calibrated: `scaling plan validate --calibrate`)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Efficiency:
    """Fractions of the spec sheet a real kernel reaches.

    gemm: best GEMM efficiency; a GEMM of F FLOPs reaches gemm * F / (F + gemm_half_flops)
      (small GEMMs are launch/tail bound: the knee is where half the best is lost).
    attention: flash attention's fraction of the BF16 peak on its hardware FLOPs (forward and
      backward together); with attention_half_flops, its best fraction: a call of F forward FLOPs
      (one micro-batch's causal attention on one GPU) reaches attention * F / (F + attention_half_flops)
      (few heads or short sequences leave SMs idle); mla_attention is the best fraction of MLA's
      kernels (d_qk != d_v; 0: attention). The three come from kernel measurements where a generation
      has them (stepvalidate.kernel_attention), else attention is fitted and the others stay 0.
    bandwidth: fraction of HBM, NVLink and NIC bandwidth that memory-bound kernels and NCCL reach.
    moe_layer_seconds: time per MoE layer per micro-batch (forward + backward) that the listed
      ops do not account for: dropless routing synchronises host and device in every layer
      (the dispatcher needs the token counts per expert on the host), after which the GPU waits
      on the host to launch the layer's many small router, permute and per-expert kernels; such
      layers cannot be captured in CUDA graphs (Megatron-LM's MoE README). Fitted on MoE runs
      only, after the other four (0: none).
    gemm_rates: (rate, gemm) pairs for the tensor-core rates whose GEMMs reach another share of
      their peak than the rate the four constants were fitted on (FP8 kernels reach a smaller share
      of their 2x peak than BF16's); fitted on that rate's runs with the rest held.
    """

    gemm: float
    gemm_half_flops: float
    attention: float
    bandwidth: float
    moe_layer_seconds: float = 0.0
    gemm_rates: tuple[tuple[str, float], ...] = ()
    attention_half_flops: float = 0.0
    mla_attention: float = 0.0

    def attention_at(self, flops: float, mla: bool = False) -> float:
        """Flash attention's fraction of the BF16 peak for a call of `flops` forward FLOPs."""
        best = self.mla_attention if mla and self.mla_attention else self.attention
        h = self.attention_half_flops
        return best * flops / (flops + h) if h else best

    def gemm_at(self, rate: str) -> float:
        """Best GEMM efficiency at a tensor-core rate ('bf16', 'fp8', ...): `gemm` unless `gemm_rates`
        has its own, fitted on runs at that rate (a format's kernels reach another share of its peak)."""
        return dict(self.gemm_rates).get(rate, self.gemm)


# Least squares of log step time over the calibration runs of scaling/plan/step_cases.json, one fit per
# GPU generation (`scaling plan validate --calibrate`):
# - b200: 8 of SimuMax's real Megatron-LM runs on 8x B200 (BF16, micro-batches = 8, no TP/DP overlap).
#   Low next to B200 GEMM microbenchmarks (~65-70% of peak on large shapes) because they also absorb
#   what the model does not list (kernel launch gaps, CPU-side overhead, TE's casts and copies).
#   Flash attention's three constants are not fitted on those steps (attention is ~10% of each, so any
#   fraction from 0.26 to 0.6 fits them alike; the fit had settled at 0.263, which priced 128K-token CP
#   runs 17-29% slow) but on SimuMax's TE kernel timings from the same node (19 shapes, 4K-128K tokens,
#   4-128 heads; each within 25% of the curve): 0.462 of the BF16 peak at best, half of it lost at
#   3.2e10 FLOPs per call (few heads or short sequences leave SMs idle), 0.366 for MLA's kernels.
# - h100: 5 of NeMo's published DGX-H100 runs (FP8 per-tensor; Llama 2 7B/13B, Llama 3 8B with CP,
#   GPT-3 175B on 128 GPUs, Llama 3 70B on 64 GPUs), with the overlaps those recipes turn on. The
#   GEMM fraction is of the FP8 peak; BF16 runs on H100 came out 11-32% slow with it, so BF16 GEMMs
#   get their own (gemm_rates), fitted with the four held on 4 BF16 runs of NVIDIA's DGX Cloud
#   Benchmarking recipes (NeMo 24.12: Llama 3.1 8B/70B/405B, GPT-3 175B), whose tables also ran
#   every model in FP8: BF16/FP8 step ratios 1.31-1.60 measured, 1.35-1.52 priced.
#   moe_layer_seconds, fitted afterwards with those held: 5 of Megatron-Bridge's DGX-H100 MoE
#   runs from its newest containers (Qwen3-235B-A22B on 256 GPUs, Qwen3-30B-A3B on 16; FP8, dropless).
#   Without it the model is 17-36% fast on them; fitted on each model alone it comes to 2.3 ms
#   (Qwen3-235B) and 3.4 ms (Qwen3-30B) per MoE layer per micro-batch, although their expert GEMMs
#   and all-to-alls differ 1.2-2.5x: mostly a fixed host-side cost, not a GEMM or all-to-all efficiency. Older Bridge containers, DeepSeek-V3 (H100, H800) are held out.
# - b200 moe_layer_seconds: the same rule, Megatron-Bridge's DGX-B200 MXFP8 Qwen3 runs of 26.04 and
#   later (3). One constant leaves Qwen3-235B 16% fast and Qwen3-30B (CUDA-graphed router and
#   attention) 15% slow; SimuMax's BF16 DeepSeek-V2/V3 runs, held out, come within 10%.
# B200's constants priced the H100 runs 20-37% (FP8) and 47-71% (Llama 3 BF16) too slow: the
# constants are per generation and software stack, not portable.
# One set per GPU generation: `scaling plan validate --calibrate` fits each generation
# on its own calibration cases. Hopper (H100/H200): NeMo's published Megatron-Core runs on DGX H100
# (FP8, TP/DP/PP communication overlapped). A100 has no calibration runs yet and borrows Hopper's.
EFFICIENCY: dict[str, Efficiency] = {
    "b200": Efficiency(gemm=0.478, gemm_half_flops=9.25e10, attention=0.462, bandwidth=0.545,
                       moe_layer_seconds=0.97e-3, attention_half_flops=3.18e10, mla_attention=0.366),
    "h100": Efficiency(gemm=0.493, gemm_half_flops=2.13e10, attention=0.558, bandwidth=0.806,
                       moe_layer_seconds=3.13e-3, gemm_rates=(("bf16", 0.595),)),
}
# B300 borrows B200's (the same Blackwell tensor cores and software stack); AMD's chips have no
# calibration runs yet and borrow Hopper's, as A100 does
GENERATION = {"a100": "h100", "h100": "h100", "h800": "h100", "h200": "h100", "b200": "b200", "b300": "b200",
              "mi300x": "h100", "mi355x": "h100"}


def efficiency_for(gpu: str | GPU) -> Efficiency:
    """The calibrated constants of this GPU's generation (`gpu` a GPUS key or a GPUS value)."""
    key = gpu if isinstance(gpu, str) else next((k for k, v in GPUS.items() if v == gpu), "h100")
    return EFFICIENCY[GENERATION.get(key.lower(), "h100")]

