"""What the machine running JAX does natively, named the same way everywhere (benchmarks' first line,
summary.json): the device, and on a CPU the model name and the instruction-set flags that decide
how fast a bf16 dot is. Without AMX or AVX512-BF16 (e.g. AMD EPYC Zen 3: AVX2 only) XLA emulates
bf16 dots and they run slower than fp32 ones; with them, or on a GPU, bf16 is native.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # native bf16 dot products on x86 CPUs
REPORTED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


@functools.lru_cache(maxsize=4)
def cpu(cpuinfo: str | None = None) -> dict[str, object]:
    """{'model': the CPU's model name, 'flags': the REPORTED_FLAGS it has}, from `cpuinfo` (default:
    Linux /proc/cpuinfo; elsewhere the platform's processor string and no flags)."""
    model, flags = platform.processor() or platform.machine(), set()
    text = cpuinfo
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            model = value.strip()
        elif key.strip() == "flags":
            flags = set(value.split())
            break
    return {"model": model, "flags": [f for f in REPORTED_FLAGS if f in flags]}


def native_bf16(platform_name: str | None = None, cpuinfo: str | None = None) -> bool:
    """Whether bf16×bf16→fp32 dots are native here: any GPU/TPU, or a CPU with AMX or AVX512-BF16."""
    if platform_name is None:
        import jax

        platform_name = jax.default_backend()
    if platform_name != "cpu":
        return True
    return any(f in cpu(cpuinfo)["flags"] for f in BF16_FLAGS)


def describe(platform_name: str | None = None, cpuinfo: str | None = None) -> str:
    """One line: 'cpu: AMD EPYC (avx2; no avx512f, avx512_bf16, amx_bf16)' or 'gpu: NVIDIA H100 ...'."""
    import jax

    device = jax.devices()[0]
    platform_name = platform_name or device.platform
    if platform_name != "cpu":
        return f"{platform_name}: {getattr(device, 'device_kind', device)}"
    info = cpu(cpuinfo)
    missing = [f for f in REPORTED_FLAGS if f not in info["flags"]]
    has = ", ".join(info["flags"]) or "none of " + ", ".join(REPORTED_FLAGS)
    return f"cpu: {info['model']} ({has}" + (f"; no {', '.join(missing)})" if missing and info["flags"] else ")")
