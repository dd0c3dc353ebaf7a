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
# "fp32" is the CUDA-core (non-tensor) FP32 peak; "tf32" the tensor-core path FP32 matmuls take.
# - A100 SXM4 80GB (A100 data sheet): BF16/FP16 312, TF32 156, FP32 19.5; no FP8/FP4.
# - H100 SXM5 80GB (H100 data sheet, 3958/1979/989 TFLOP/s sparse for FP8/BF16/TF32):
#   FP8 1979, BF16 989, TF32 495 (494.7), FP32 67.
# - H200 SXM 141GB (H200 data sheet): the H100 SXM die with more/faster HBM3e, same peaks.
# - B200 in HGX B200, 1000 W (HGX B200 data sheet, 8-GPU board totals divided by 8, and
#   Glenn Lockwood's B200 notes, glennklockwood.com/garden/processors/B200):
#   FP4 9000, FP8/FP6 4500, BF16 2250, TF32 1100, FP32 80; 1,440 GB per board = 180 GB per GPU.
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
# Latencies are the usual NCCL per-hop orders of magnitude (~2-3 us on NVLink, ~5-8 us on
# InfiniBand/RoCE): assumptions that matter only for small messages.
GPUS: dict[str, GPU] = {
    "a100": GPU("A100 SXM4 80GB", 80, {"fp32": 19.5, "tf32": 156, "bf16": 312},
                hbm_tbps=2.039, nvlink_gbps=300, net_gbps=25, nvlink_latency_us=3, net_latency_us=6, sms=108),
    "h100": GPU("H100 SXM5 80GB", 80, {"fp32": 67, "tf32": 495, "bf16": 989, "fp8": 1979},
                hbm_tbps=3.35, nvlink_gbps=450, net_gbps=50, nvlink_latency_us=2.5, net_latency_us=6),
    "h800": GPU("H800 SXM5 80GB", 80, {"fp32": 67, "tf32": 495, "bf16": 989, "fp8": 1979},
                hbm_tbps=3.35, nvlink_gbps=200, net_gbps=50, nvlink_latency_us=2.5, net_latency_us=6),
    "h200": GPU("H200 SXM 141GB", 141, {"fp32": 67, "tf32": 495, "bf16": 989, "fp8": 1979},
                hbm_tbps=4.8, nvlink_gbps=450, net_gbps=50, nvlink_latency_us=2.5, net_latency_us=6),
    "b200": GPU("B200 (HGX) 180GB", 180, {"fp32": 80, "tf32": 1100, "bf16": 2250, "fp8": 4500, "fp4": 9000},
                hbm_tbps=8.0, nvlink_gbps=900, net_gbps=50, nvlink_latency_us=2.5, net_latency_us=6,
                block_scaled=("mxfp8", "mxfp6", "mxfp4", "nvfp4"), sms=148, fp8_any_layout=True),
}

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4")


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


def precision_for_bits(bits: float, gpu: str = "h100") -> str:
    """The hardware format that runs a P-bit recipe: the narrowest supported format with >= P bits.

    P <= 4 -> fp4, P <= 8 -> fp8 (FP6 runs at the FP8 rate on Blackwell), P <= 16 -> bf16,
    else tf32: FP32 matmuls run on TF32 tensor cores by default in JAX and cuBLAS-backed
    frameworks. A format the GPU lacks falls back to the next wider one (FP4 on H100 -> fp8,
    FP8 on A100 -> bf16).
    """
    if not bits > 0:
        raise ConfigError("P", bits, "a positive number of bits")
    supported = get_gpu(gpu).peak_tflops
    for width, precision in ((4, "fp4"), (8, "fp8"), (16, "bf16")):
        if bits <= width and precision in supported:
            return precision
    return "tf32"
