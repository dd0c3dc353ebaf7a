"""The GPU table: dense tensor-core peaks per format, memory and bandwidths, that the cost models
(scaling.train.compute) and the planner (scaling.plan) price GEMMs with. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaling.errors import ConfigError


# ----------------------------------------------------------------------------- GPUs (peaks per format)


@dataclass(frozen=True)
class GPU:
    """One accelerator: dense (no 2:4 sparsity) tensor-core peaks in TFLOP/s per precision."""

    name: str
    memory_gb: float  # HBM capacity from the spec sheet, 1 GB = 1e9 bytes
    peak_tflops: dict[str, float]
    # What the step model (scaling.plan.stepmodel) prices memory-bound ops and collectives with:
    hbm_tbps: float = 0.0  # HBM bandwidth, TB/s
    nvlink_gbps: float = 0.0  # NVLink bandwidth per GPU per direction, GB/s
    net_gbps: float = 0.0  # inter-node network per GPU (one NIC per GPU), GB/s per direction
    nvlink_latency_us: float = 0.0  # per collective step (NCCL ring hop) inside a node
    net_latency_us: float = 0.0  # per collective step across nodes
    gpus_per_node: int = 8
    block_scaled: tuple[str, ...] = ()  # micro-scaled GEMM formats the tensor cores run natively
    sms: int = 132  # streaming multiprocessors (what communication kernels that run beside compute take from)
    # FP8 GEMMs take either operand transposed (Blackwell; Hopper's take only TN layouts, so a
    # per-tensor FP8 operand needs a transposed copy for the backward: TE's nvte_is_non_tn_fp8_gemm_supported)
    fp8_any_layout: bool = False

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9

    def peak(self, precision: str) -> float:
        """Dense peak in FLOP/s; ConfigError if this GPU has no tensor-core path for `precision`."""
        precision = canonical_precision(precision)
        if precision not in self.peak_tflops:
            raise ConfigError("precision", precision, f"one of {', '.join(self.peak_tflops)} on {self.name}")
        return self.peak_tflops[precision] * 1e12


# Dense peaks per GPU; NVIDIA data sheets print "with sparsity" numbers, which are 2x these.
# "fp32" is the CUDA-core (non-tensor) FP32 peak (AMD: the FP32 matrix peak, the same number as its
# vector peak on both chips below); "tf32" the tensor-core path FP32 matmuls take. "fp6" is listed
# where a chip runs FP6 natively, at whatever rate it runs it (Blackwell: the FP8 rate; MI355X: the
# FP4 rate); a chip without it runs FP6 as FP8 (precision_for_bits, and a cost model says so).
# - A100 SXM4 80GB (A100 data sheet): BF16/FP16 312, TF32 156, FP32 19.5; no FP8/FP4.
# - H100 SXM5 80GB (H100 data sheet, 3958/1979/989 TFLOP/s sparse for FP8/BF16/TF32):
#   FP8 1979, BF16 989, TF32 495 (494.7), FP32 67; no FP6/FP4 path.
# - H200 SXM 141GB (H200 data sheet): the H100 SXM die with more/faster HBM3e, same peaks.
# - B200 in HGX B200, 1000 W (HGX B200 data sheet, 8-GPU board totals divided by 8, and
#   Glenn Lockwood's B200 notes, glennklockwood.com/garden/processors/B200):
#   FP4 9000, FP8/FP6 4500, BF16 2250, TF32 1100, FP32 80; 1,440 GB per board = 180 GB per GPU.
# - B300 (Blackwell Ultra) in HGX B300 (NVIDIA's HGX B300 table per 8-GPU board, sparse: FP8/FP6 72,
#   BF16 36, TF32 18 PFLOPS; FP4 144 sparse, 105 dense; FP32 600 TFLOPS; 2.3 TB), divided by 8, as
#   Glenn Lockwood's B300 notes (glennklockwood.com/garden/processors/B300) tabulate them: FP4 13125,
#   FP8/FP6 4500, BF16 2250, TF32 1125, FP32 75; 288 GB HBM3e at 8 TB/s. Blackwell Ultra raised
#   only FP4 (and cut FP64 and INT8, which no cost here uses). NVIDIA's "15 PFLOPS dense NVFP4"
#   (developer.nvidia.com/blog/inside-nvidia-blackwell-ultra-the-chip-powering-the-ai-factory-era)
#   is the GB300 part at higher power, as the B200 entry is HGX's 9000 and not GB200's 10000.
#   sms = 160: that blog's "160 SMs" (its full GPU; NVIDIA does not say how many a B300 enables).
# - MI300X (AMD Instinct MI300X data sheet; BF16 1307.4 and FP8 2614.9 dense are also the figures
#   of github.com/alpharomercoma/MI300X-vs-H200 METHODOLOGY.md): FP8 2614.9, BF16/FP16 1307.4,
#   TF32 653.7, FP32 163.4 (matrix and vector); no FP6/FP4 (CDNA 3). Some spec aggregators
#   (gpu.blog) list TF32 as unsupported, but CDNA 3 (gfx942) has the XF32 MFMA instructions the
#   data sheet's 653.7 counts. sms = 304 compute units (AMD's CUs stand in for SMs).
# - MI355X (CDNA 4; 256 CUs = 8 XCDs x 32, ROCm's "AMD GPU specifications" table; 2.4 GHz peak
#   clock, Hot Chips 2025 via wccftech): FP8 8192 FLOPs per clock per CU (AMD at ISSCC 2026) ->
#   5033.2; BF16/FP16 half that, 2516.6; MXFP6 and MXFP4 twice it, 10066.3 (FP6 runs at the FP4
#   rate: AMD's Matrix Core blog gives CDNA 4 16x/32x/64x its FP32 rate for FP16/FP8/FP6-FP4;
#   Tom's Hardware: 20.1 PFLOPS FP4/FP6 with sparsity); FP32 157.3 (256 FLOPs per clock per CU).
#   These are AMD's published "2.5 / 5 / 10 PFLOPS" at the digits AMD prints. No TF32: gfx950 drops
#   the XF32 MFMA instructions (LLVM's AMDGPU assembler tests reject v_mfma_f32_32x32x4_xf32 on
#   gfx950), so FP32 matmuls run at the FP32 rate. 288 GB HBM3E at 8 TB/s. sms = 256 compute units.
# Bandwidths (step model; per direction, NVIDIA quotes NVLink as bidirectional totals):
# - A100 SXM4 80GB: HBM2e 2.039 TB/s; NVLink 3 600 GB/s total -> 300; DGX A100 has one 200 Gb/s
#   HDR InfiniBand NIC per GPU -> 25 GB/s (A100 and DGX A100 data sheets).
# - H100 SXM5: HBM3 3.35 TB/s; NVLink 4 900 GB/s total -> 450; DGX H100 one 400 Gb/s NDR NIC per
#   GPU -> 50 GB/s (H100 and DGX H100 data sheets; Llama 3's clusters also give each GPU 400 Gb/s).
# - H200 SXM: HBM3e 4.8 TB/s, otherwise as H100 (H200 data sheet).
# - H800 SXM5 80GB (the export variant of the H100 SXM5 DeepSeek-V3 trained on): the H100's
#   tensor cores and HBM3, NVLink cut to 400 GB/s total -> 200 (NVIDIA H800 product brief);
#   DeepSeek-V3's cluster gives each GPU a 400 Gb/s InfiniBand NIC, 50 GB/s (DeepSeek-AI 2024,
#   arXiv 2412.19437 Sec. 3.2.2: "IB (50 GB/s)", and NVLink "160 GB/s" achieved of the 200).
# - B200 (HGX): HBM3e 8 TB/s (64 TB/s per 8-GPU board); NVLink 5 1.8 TB/s total -> 900; DGX B200
#   one 400 Gb/s ConnectX-7 per GPU -> 50 GB/s. Blackwell tensor cores run MXFP8/MXFP6 at the FP8
#   rate and MXFP4/NVFP4 at the FP4 rate (NVIDIA Blackwell architecture technical brief).
# - B300 (HGX): HBM3e 8 TB/s; NVLink 5 1.8 TB/s total -> 900; one 800 Gb/s ConnectX-8 per GPU
#   (HGX B300: 1.6 TB/s networking per board) -> 100 GB/s. Same block-scaled formats as B200.
# - MI300X: HBM3 5.3 TB/s; Infinity Fabric, 7 links of 128 GB/s (bidirectional) to the node's other
#   7 GPUs, 896 GB/s in all -> 448 per direction (AMD data sheet; RCCL's rings use all links).
#   No block-scaled formats (CDNA 3 has no MX scaling).
# - MI355X: HBM3E 8 TB/s; Infinity Fabric, 7 links of 153.6 GB/s (bidirectional), 1075.2 GB/s in
#   all -> 537.6 per direction (AMD MI355X spec; Hume Consulting's MI355X analysis: ~153 GB/s per
#   link). MXFP8/MXFP6/MXFP4 natively (CDNA 4's scaled MFMA takes E8M0 block scales: MX, not NVFP4's
#   E4M3 scales). FP8 operand layouts are not published: priced as Hopper's (TN only).
# - AMD networks: one 400 Gb/s NIC per GPU -> 50 GB/s, as the DGX H100 entry (the NIC is the
#   cluster's choice; AMD's MI355X platforms pair each GPU with a 400 Gb/s Pollara NIC).
# Latencies are the usual NCCL per-hop orders of magnitude (~2-3 us on NVLink, ~5-8 us on
# InfiniBand/RoCE): assumptions that matter only for small messages (RCCL on Infinity Fabric: the same).
GPUS: dict[str, GPU] = {
    "a100": GPU("A100 SXM4 80GB", 80, {"fp32": 19.5, "tf32": 156, "bf16": 312},
                hbm_tbps=2.039, nvlink_gbps=300, net_gbps=25, nvlink_latency_us=3, net_latency_us=6, sms=108),
    "h100": GPU("H100 SXM5 80GB", 80, {"fp32": 67, "tf32": 495, "bf16": 989, "fp8": 1979},
                hbm_tbps=3.35, nvlink_gbps=450, net_gbps=50, nvlink_latency_us=2.5, net_latency_us=6),
    "h800": GPU("H800 SXM5 80GB", 80, {"fp32": 67, "tf32": 495, "bf16": 989, "fp8": 1979},
                hbm_tbps=3.35, nvlink_gbps=200, net_gbps=50, nvlink_latency_us=2.5, net_latency_us=6),
    "h200": GPU("H200 SXM 141GB", 141, {"fp32": 67, "tf32": 495, "bf16": 989, "fp8": 1979},
                hbm_tbps=4.8, nvlink_gbps=450, net_gbps=50, nvlink_latency_us=2.5, net_latency_us=6),
    "b200": GPU("B200 (HGX) 180GB", 180,
                {"fp32": 80, "tf32": 1100, "bf16": 2250, "fp8": 4500, "fp6": 4500, "fp4": 9000},
                hbm_tbps=8.0, nvlink_gbps=900, net_gbps=50, nvlink_latency_us=2.5, net_latency_us=6,
                block_scaled=("mxfp8", "mxfp6", "mxfp4", "nvfp4"), sms=148, fp8_any_layout=True),
    "b300": GPU("B300 (HGX) 288GB", 288,
                {"fp32": 75, "tf32": 1125, "bf16": 2250, "fp8": 4500, "fp6": 4500, "fp4": 13125},
                hbm_tbps=8.0, nvlink_gbps=900, net_gbps=100, nvlink_latency_us=2.5, net_latency_us=6,
                block_scaled=("mxfp8", "mxfp6", "mxfp4", "nvfp4"), sms=160, fp8_any_layout=True),
    "mi300x": GPU("MI300X 192GB", 192, {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp8": 2614.9},
                  hbm_tbps=5.3, nvlink_gbps=448, net_gbps=50, nvlink_latency_us=2.5, net_latency_us=6, sms=304),
    "mi355x": GPU("MI355X 288GB", 288,
                  {"fp32": 157.3, "bf16": 2516.6, "fp8": 5033.2, "fp6": 10066.3, "fp4": 10066.3},
                  hbm_tbps=8.0, nvlink_gbps=537.6, net_gbps=50, nvlink_latency_us=2.5, net_latency_us=6,
                  block_scaled=("mxfp8", "mxfp6", "mxfp4"), sms=256),
}

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp6", "fp4")
# The format a P-bit GEMM runs in on a chip that has them all: the narrowest at least P bits wide
# (above 16 bits, TF32: FP32 matmuls take the TF32 path by default in JAX and cuBLAS-backed frameworks)
WIDTHS = ((4, "fp4"), (6, "fp6"), (8, "fp8"), (16, "bf16"))


def canonical_precision(precision: str) -> str:
    precision = precision.lower()
    if precision not in PRECISIONS:
        raise ConfigError("precision", precision, PRECISIONS)
    return "bf16" if precision == "fp16" else precision  # FP16 and BF16 share the tensor-core rate


def gpu_key(device_kind: str) -> str | None:
    """The GPUS entry whose peaks hold for a JAX device kind ('NVIDIA H100 80GB HBM3' -> 'h100'), or
    None: not in the table, or a PCIe/NVL card (lower clocks and power than the SXM parts above)."""
    kind = device_kind.upper()
    if ("PCIE" in kind and "A100" not in kind) or "NVL" in kind:  # A100 PCIe keeps the SXM tensor peaks
        return None
    return next((key for key in GPUS if key.upper() in kind), None)


def get_gpu(name: str) -> GPU:
    if name.lower() not in GPUS:
        raise ConfigError("gpu", name, GPUS)
    return GPUS[name.lower()]


def native_precision(bits: float) -> str:
    """The format a P-bit GEMM runs in on a chip with every format (WIDTHS; above 16 bits tf32)."""
    if not bits > 0:
        raise ConfigError("P", bits, "a positive number of bits")
    return next((precision for width, precision in WIDTHS if bits <= width), "tf32")


def precision_for_bits(bits: float, gpu: str = "h100") -> str:
    """The hardware format that runs a P-bit recipe: the narrowest supported format with >= P bits.

    P <= 4 -> fp4, P <= 6 -> fp6, P <= 8 -> fp8, P <= 16 -> bf16, else tf32: FP32 matmuls run on
    TF32 tensor cores by default in JAX and cuBLAS-backed frameworks. A format the GPU lacks falls
    back to the next wider one (FP4 on H100 -> fp8, FP6 on H100 or MI300X -> fp8, FP8 on A100 ->
    bf16; TF32 on MI355X -> fp32): what running the recipe there costs, since the narrower format is
    then emulated in the wider one. `fallback` says when that happens.
    """
    native_precision(bits)  # a ConfigError for P <= 0
    supported = get_gpu(gpu).peak_tflops
    for width, precision in WIDTHS:
        if bits <= width and precision in supported:
            return precision
    return "tf32" if "tf32" in supported else "fp32"


def fallback(bits: float, gpu: str = "h100") -> tuple[str, str] | None:
    """(the format a P-bit GEMM runs in where a chip has it, the format `gpu` runs it in instead), or
    None where the GPU runs it natively (B200's FP6 at its FP8 rate is native: no fallback)."""
    wanted, charged = native_precision(bits), precision_for_bits(bits, gpu)
    return None if wanted == charged else (wanted, charged)
