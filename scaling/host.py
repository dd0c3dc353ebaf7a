"""What the machine running JAX does natively, named the same way everywhere (benchmarks' first line,
summary.json): the device, and on a CPU the model name and the instruction-set flags that decide
how fast a bf16 dot is. Without AMX or AVX512-BF16 (e.g. AMD EPYC Zen 3: AVX2 only) XLA emulates
bf16 dots and they run slower than fp32 ones; with them, or on a GPU, bf16 is native.
The GPU table the cost models and the planner price GEMMs with is scaling.plan.hardware.
PROCESS_ENV is the environment a training process should start with (malloc with huge pages).
"""

from __future__ import annotations

import collections
import functools
import os
import platform
from pathlib import Path
from typing import Mapping


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


def describe(platform_name: str | None = None, cpuinfo: str | None = None, devices: list | None = None) -> str:
    """One line: 'cpu: AMD EPYC (avx2; no avx512f, avx512_bf16, amx_bf16)', or on an accelerator
    each kind of device this process sees and how many: 'gpu: NVIDIA H100 80GB HBM3 x8'.
    `devices` defaults to jax.local_devices() (anything with .platform and .device_kind)."""
    if devices is None:
        import jax

        devices = jax.local_devices()
    platform_name = platform_name or devices[0].platform
    if platform_name != "cpu":
        kinds = collections.Counter(str(getattr(d, "device_kind", d)) for d in devices)
        return f"{platform_name}: " + ", ".join(f"{kind} x{n}" for kind, n in kinds.items())
    info = cpu(cpuinfo)
    missing = [f for f in REPORTED_FLAGS if f not in info["flags"]]
    has = ", ".join(info["flags"]) or "none of " + ", ".join(REPORTED_FLAGS)
    return f"cpu: {info['model']} ({has}" + (f"; no {', '.join(missing)})" if missing and info["flags"] else ")")


# glibc's malloc serves XLA CPU's per-step scratch (~1 GB at size 8) from fresh mmaps that it unmaps
# on free, so every step faults all its pages in again: 141k minor faults and 0.3 s of kernel time
# per 2.5 s fp32 step on a 2-core EPYC. Asking malloc for transparent huge pages cuts the faults
# ~10x and the step by 10-20%, bit for bit the same (docs/performance.md). The dynamic loader reads
# it at process start, so it is set from outside: sweeps start their runs' processes with it, and a
# single `scaling train` or a benchmark has it where the user exports it (no process re-executes itself).
PROCESS_ENV = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}


def process_env(environ: Mapping[str, str], system: str | None = None) -> dict[str, str]:
    """The PROCESS_ENV settings a training process on this system should start with that `environ`
    does not set already (a user's own GLIBC_TUNABLES wins); none off Linux (no glibc)."""
    if (system or platform.system()) != "Linux":
        return {}
    return {k: v for k, v in PROCESS_ENV.items() if k not in environ}


def process_env_status(environ: Mapping[str, str] | None = None, system: str | None = None) -> str:
    """One phrase for a benchmark's header line: whether malloc serves this process (started with
    `environ`, default os.environ) from huge pages, and the GLIBC_TUNABLES that decided it."""
    if (system or platform.system()) != "Linux":
        return "malloc: no glibc tunables"
    environ = os.environ if environ is None else environ
    value = environ.get("GLIBC_TUNABLES")
    if value is None:
        return f"malloc huge pages off (GLIBC_TUNABLES unset; GLIBC_TUNABLES={PROCESS_ENV['GLIBC_TUNABLES']} turns them on)"
    tunables = dict(t.partition("=")[::2] for t in value.split(":"))
    on = tunables.get("glibc.malloc.hugetlb", "0") not in ("", "0")  # 1: THP via madvise, 2: hugetlbfs
    return f"malloc huge pages {'on' if on else 'off'} (GLIBC_TUNABLES={value})"
