"""The GPU take-off check: before a sweep trains on GPUs, every device shows that it computes what
the recipes assume and at the speed its peers and its datasheet say. A device that fails is left
out with one line saying why; with none left the sweep stops before anything trains.

Numerics probe (`numerics_problems`), each a computation whose right answer is known exactly:

- a float32 dot at Precision.HIGHEST whose inputs need 13 mantissa bits: exact in FP32, wrong in
  TF32 (10 bits), so a device or an XLA setting that runs FP32 as TF32 is caught;
- subnormal round trips: float32 subnormals to the device and back, bfloat16 and float16 ones
  through casts there (the formats' smallest values and the fast path's operands);
- the quantised GEMM's exact bf16 fast path against its FP32 path (`scaling.numerics.gemm`): the
  same products, only the accumulation order may differ.

Speed probe (`device_matmul_flops_per_s`): bf16 matmul FLOP/s, against the median of the devices that
passed the numerics (SLOW_FRACTION) and against the datasheet dense bf16 peak of its kind
(`scaling.plan.hardware`, PEAK_FRACTION).

On GPUs each device is probed in a child process started with the environment its runs get
(`gpu_pin`: CUDA_VISIBLE_DEVICES, JAX_PLATFORMS=cuda, deterministic GPU ops), so a CUDA install
that would silently fall back to the CPU fails here. `python -m scaling.study.sweeps.child device-probe OUT.json`
is that child (internal).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from scaling.errors import ConfigError
from scaling.plan import hardware

# JAX is imported where a device is probed: planning a sweep never loads it.

SLOW_FRACTION = 0.5  # a device under half its peers' median matmul FLOP/s is left out (a slow node)
PEAK_FRACTION = 0.1  # ... and one under a tenth of its datasheet peak (throttled, wrong clocks or path)
SPEED_N, SPEED_REPEATS = 4096, 10  # the speed probe's bf16 matmul: large enough for tensor-core peak
PROBE_TIMEOUT_S = 300.0
CHILD = "scaling.study.sweeps.child"  # the one entry point of every process a sweep starts (run, pack, probes)
# runs promise a bit-identical resume and same-seed repeat: no autotuned or atomics-based choice may differ
DETERMINISTIC_FLAG = "--xla_gpu_deterministic_ops=true"


@dataclass
class Probe:
    """One device's take-off result: what it is, what went wrong, its matmul speed."""

    name: str
    kind: str = ""
    problems: list[str] = field(default_factory=list)
    flops_per_s: float = 0.0
    peak_flops_per_s: float | None = None  # datasheet dense bf16 peak of its kind, where known


class Target:
    """A JAX device the probes run on. The probes' float32 dot and the matmul timer are methods,
    so a test can stand in a device that computes like TF32 or runs slowly."""

    def __init__(self, device: Any, name: str | None = None, kind: str | None = None):
        self.device = device
        self.name = name or f"{device.platform} {device.id}"
        self.kind = kind if kind is not None else device.device_kind

    def run(self, fn: Callable, *args):
        """fn jitted and run on this device; the result on the host (numpy)."""
        import jax
        import numpy as np

        placed = jax.device_put(args, self.device)
        return jax.tree.map(np.asarray, jax.jit(fn)(*placed))

    def f32_dot(self, a, b):
        import jax
        import jax.numpy as jnp

        return jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST)

    def time_matmul(self, n: int, repeats: int) -> float:
        """Seconds for `repeats` bf16 n×n matmuls (after one warm-up), dispatched back to back."""
        import jax
        import jax.numpy as jnp

        a = jax.device_put(jnp.ones((n, n), jnp.bfloat16), self.device)
        f = jax.jit(lambda x: jnp.dot(x, x, preferred_element_type=jnp.float32).astype(jnp.bfloat16))
        f(a).block_until_ready()
        started = time.perf_counter()
        out = a
        for _ in range(repeats):
            out = f(out)
        out.block_until_ready()
        return time.perf_counter() - started


# ---------------------------------------------------------------- probes


def numerics_problems(target: Target) -> list[str]:
    """What this device computes wrong (empty: nothing), one short phrase each."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    problems = []
    # 1. FP32 dot: (1 + 2^-12)·I times small integers; exact in FP32 (<= 24 significant bits), TF32 drops the 2^-12
    n = 256
    a = np.eye(n, dtype=np.float32) * np.float32(1 + 2**-12)
    b = np.random.default_rng(0).integers(-1024, 1025, (n, n)).astype(np.float32)
    got = target.run(target.f32_dot, a, b)
    if not np.array_equal(got, a @ b):
        problems.append(f"float32 dot at HIGHEST off by up to {np.max(np.abs(got - a @ b)):.3g} "
                        "(computes like TF32: check XLA_FLAGS and jax_default_matmul_precision)")
    # 2. subnormal round trips: float32 ones to the device and back, bf16 and fp16 ones through casts
    # there (XLA flushes subnormal float32 arithmetic to zero on some backends: not probed, by design)
    f32_sub = np.array([2.0**-149, 2.0**-140, 1.5 * 2.0**-127], np.float32)
    bf16_sub = np.array([2.0**-133, 2.0**-130, 3 * 2.0**-132], np.float32)
    fp16_sub = np.array([2.0**-24, 2.0**-20, 3 * 2.0**-22], np.float32)
    back, bf16, fp16 = target.run(lambda x, y, z: (x, y.astype(jnp.bfloat16).astype(jnp.float32),
                                                   z.astype(jnp.float16).astype(jnp.float32)), f32_sub, bf16_sub, fp16_sub)
    for what, got, want in (("float32 transfer", back, f32_sub), ("bfloat16 cast", bf16, bf16_sub),
                            ("float16 cast", fp16, fp16_sub)):
        if not np.array_equal(got, want):
            problems.append(f"subnormals lost in a {what} round trip")
    # 3. the quantised GEMM's bf16 fast path against its FP32 path: equal products, summed in another order
    from scaling.numerics import layers, precision

    keys = jax.random.split(jax.random.key(0), 2)
    x, w = (np.asarray(jax.random.normal(k, s, jnp.float32)) for k, s in zip(keys, ((64, 256), (256, 64))))
    paths = {fast: precision.get({"base": "mxfp8", "fast_path": fast}) for fast in (True, False)}
    fast, fp32 = (target.run(lambda x, w, r=paths[f]: layers.qdot(x, w, r), x, w) for f in (True, False))
    scale = float(np.max(np.abs(fp32))) or 1.0
    if not np.allclose(fast, fp32, rtol=1e-5, atol=1e-5 * scale):
        problems.append(f"quantised GEMM's bf16 fast path differs from its FP32 path by up to "
                        f"{np.max(np.abs(fast - fp32)) / scale:.2g} of its largest value")
    return problems


def device_matmul_flops_per_s(target: Target, n: int = SPEED_N, repeats: int = SPEED_REPEATS) -> float:
    return 2.0 * n**3 * repeats / target.time_matmul(n, repeats)


def probe(target: Target, n: int = SPEED_N, repeats: int = SPEED_REPEATS) -> Probe:
    """Numerics and speed of one device; an exception is a problem, not a crash."""
    gpu = hardware.gpu_key(target.kind)
    peak = hardware.get_gpu(gpu).peak("bf16") if gpu else None
    result = Probe(name=target.name, kind=target.kind, peak_flops_per_s=peak)
    try:
        result.problems = numerics_problems(target)
        result.flops_per_s = device_matmul_flops_per_s(target, n, repeats)
    except Exception as error:  # noqa: BLE001 - a device that cannot run the probes is left out, saying why
        result.problems.append(f"probe failed: {type(error).__name__}: {error}")
    return result


def judge(probes: list[Probe]) -> tuple[list[Probe], list[str]]:
    """(the usable probes, one line per device left out). Peers: the devices whose numerics passed."""
    lines, passed = [], []
    for p in probes:
        if p.problems:
            lines.append(f"device {_label(p)} left out: {'; '.join(p.problems)}")
        else:
            passed.append(p)
    median = statistics.median(p.flops_per_s for p in passed) if passed else 0.0
    usable = []
    for p in passed:
        if len(passed) > 1 and p.flops_per_s < SLOW_FRACTION * median:
            lines.append(f"device {_label(p)} left out: bf16 matmul at {p.flops_per_s / 1e12:.3g} TFLOP/s, "
                         f"under {SLOW_FRACTION:g} x its peers' median {median / 1e12:.3g} TFLOP/s")
        elif p.peak_flops_per_s and p.flops_per_s < PEAK_FRACTION * p.peak_flops_per_s:
            lines.append(f"device {_label(p)} left out: bf16 matmul at {p.flops_per_s / 1e12:.3g} TFLOP/s, "
                         f"under {PEAK_FRACTION:g} x its datasheet peak {p.peak_flops_per_s / 1e12:.0f} TFLOP/s")
        else:
            usable.append(p)
    return usable, lines


def _label(p: Probe) -> str:
    return f"{p.name} ({p.kind})" if p.kind else p.name


def check(targets: list[Target], *, echo: Callable[[str], None] = print, n: int = SPEED_N,
          repeats: int = SPEED_REPEATS) -> list[Target]:
    """Probe every device; echo one line per device left out; return the usable ones, or raise a
    ConfigError when none is (the sweep stops before training)."""
    probes = [probe(t, n, repeats) for t in targets]
    return [targets[probes.index(p)] for p in _usable_or_stop(probes, echo)]


def _usable_or_stop(probes: list[Probe], echo: Callable[[str], None]) -> list[Probe]:
    usable, lines = judge(probes)
    for line in lines:
        echo(line)
    if not usable:
        raise ConfigError("take-off", ", ".join(p.name for p in probes) or "no device",
                          "at least one device that passes the numerics and speed probes (see the lines above)")
    return usable


# ---------------------------------------------------------------- GPUs: which, how many per run, pinned how


def visible_gpus(environ: Mapping[str, str] | None = None, listing: str | None = None) -> list[str]:
    """The GPUs runs may use, found without JAX (a JAX backend here would claim them): the entries of
    CUDA_VISIBLE_DEVICES if it is set (indices or UUIDs; CUDA ignores everything from an invalid
    entry such as -1 on), else the GPUs `nvidia-smi -L` lists (`listing`: its output)."""
    environ = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in environ:
        entries = [e.strip() for e in environ["CUDA_VISIBLE_DEVICES"].split(",")]
        return list(itertools.takewhile(lambda e: e and not e.startswith("-"), entries))
    if listing is None:
        try:
            listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            listing = ""
    return re.findall(r"^GPU (\d+):", listing, flags=re.MULTILINE)


def gpu_slots(gpus: list[str], workers: int | None, gpus_per_run: float = 1) -> list[dict[str, str]]:
    """The local executor's concurrent runs with --gpus-per-run: one child process per slot, each
    pinned to its GPU; 1/k GPUs per run gives each GPU k slots with 1/k of XLA's default memory share
    (gpu_share). Slots go round the GPUs, so fewer `workers` spread over as many GPUs as they can;
    `workers` None = every slot, else at most that many."""
    if gpus_per_run > 1:  # one run across G GPUs: consecutive groups of G, a leftover fewer unused
        g = round(gpus_per_run)
        slots = [{"CUDA_VISIBLE_DEVICES": ",".join(gpus[i:i + g])} for i in range(0, len(gpus) - g + 1, g)]
        return slots if workers is None else slots[:workers]
    share = gpu_share(gpus_per_run)
    slots = [{"CUDA_VISIBLE_DEVICES": gpu, **share} for _ in range(round(1 / gpus_per_run)) for gpu in gpus]
    return slots if workers is None else slots[:workers]


def check_gpu_slots(pins: list[dict[str, str]], child_env: Callable[[Mapping[str, str]], dict[str, str]],
                    check: Callable | None = None) -> list[dict[str, str]]:
    """The take-off device check of slots: every GPU of a slot probed (a slot of G GPUs is one run's
    devices, all of which it trains on), the slots whose GPUs all pass kept, each with its probed
    settings. `check`: default check_gpu_pins (one child probe per GPU)."""
    check = check or check_gpu_pins
    if all("," not in pin.get("CUDA_VISIBLE_DEVICES", "") for pin in pins):
        return check(pins, child_env)
    one_each = [{**pin, "CUDA_VISIBLE_DEVICES": gpu} for pin in pins for gpu in pin["CUDA_VISIBLE_DEVICES"].split(",")]
    usable = check(one_each, child_env)
    passed = {p["CUDA_VISIBLE_DEVICES"] for p in usable}
    by_gpu = {p["CUDA_VISIBLE_DEVICES"]: p for p in usable}
    return [{**by_gpu[pin["CUDA_VISIBLE_DEVICES"].split(",")[0]], "CUDA_VISIBLE_DEVICES": pin["CUDA_VISIBLE_DEVICES"]}
            for pin in pins if set(pin["CUDA_VISIBLE_DEVICES"].split(",")) <= passed]


def gpu_share(gpus_per_run: float, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A Ray run reserving a fraction of a GPU gets that fraction of XLA's default 75% memory
    preallocation (unless the user set a fraction), so the runs sharing the GPU fit on it."""
    environ = os.environ if environ is None else environ
    if not 0 < gpus_per_run < 1 or {"XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"} & set(environ):
        return {}
    return {"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{0.75 * gpus_per_run:.3f}"}


def ray_pin(gpus_per_run: float, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A Ray run's settings on the GPU(s) Ray reserved (Ray sets CUDA_VISIBLE_DEVICES): JAX must start
    on CUDA with deterministic ops, as a local GPU run does (devices.gpu_pin), with its memory share."""
    return gpu_pin(gpu_share(gpus_per_run, environ), environ) if gpus_per_run > 0 else {}


def check_gpus_per_run(gpus_per_run: float, executor: str, gpus: list[str]) -> None:
    """ConfigError unless --gpus-per-run fits the executor and, for the local one, this machine."""
    whole = gpus_per_run >= 1 and float(gpus_per_run).is_integer()
    if gpus_per_run < 0 or (gpus_per_run > 1 and not whole):
        raise ConfigError("--gpus-per-run", gpus_per_run, "a number in [0, 1], or a whole number of GPUs for one "
                          "run across them (parallel.data)")
    if executor == "local" and gpus_per_run > 1:
        if len(gpus) < gpus_per_run:
            raise ConfigError("--gpus-per-run", gpus_per_run, f"at most the {len(gpus)} GPUs visible here")
        return
    runs_per_gpu = 1 / gpus_per_run if gpus_per_run else 0
    if executor == "local" and gpus_per_run and not math.isclose(runs_per_gpu, round(runs_per_gpu), rel_tol=1e-6):
        raise ConfigError("--gpus-per-run", gpus_per_run, "0, 1 or 1/k with the local executor (k runs share "
                          "each GPU, e.g. 0.5 or 0.25); other fractions with --executor ray")
    if executor == "local" and gpus_per_run and not gpus:
        raise ConfigError("--gpus-per-run", gpus_per_run, "0 on a machine without GPUs (CUDA_VISIBLE_DEVICES "
                          "names none and `nvidia-smi -L` lists none)")


def gpu_pin(pin: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A GPU slot's environment as its runs get it: JAX must start on CUDA (no silent CPU fallback)
    and GPU ops are deterministic (the runs' bit-identical resume; the user's XLA_FLAGS kept).
    Memory settings are the user's (the parent's own are undone once its JAX has started)."""
    environ = os.environ if environ is None else environ
    flags = environ.get("XLA_FLAGS", "")
    if "xla_gpu_deterministic_ops" not in flags:
        flags = f"{flags} {DETERMINISTIC_FLAG}".strip()
    return {**pin, "JAX_PLATFORMS": environ.get("JAX_PLATFORMS") or "cuda", "XLA_FLAGS": flags}


# the sweep's own process: no preallocation (XLA would take 75% of its GPU, which a run needs), and
# memory given back when freed; read by JAX when its backend starts
PARENT_ALLOCATION = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}


@contextlib.contextmanager
def parent_allocation(environ: dict[str, str] | None = None):
    """PARENT_ALLOCATION while this process starts JAX's backend, with the runs' XLA_FLAGS (the
    take-off probes compiled here fill the persistent compilation cache, whose key holds the flags:
    with the user's flags instead, every run would compile again); the environment restored after
    (the runs and a Ray cluster started from here get the user's settings)."""
    environ = os.environ if environ is None else environ
    settings = {**PARENT_ALLOCATION, "XLA_FLAGS": gpu_pin({}, environ)["XLA_FLAGS"]}
    saved = {k: environ.get(k) for k in settings}
    environ.update(settings)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                environ.pop(k, None)
            else:
                environ[k] = v


def require_gpu_backend(backend: str) -> None:
    """--gpus-per-run > 0 where JAX's backend is not a GPU (a CPU-only jaxlib, a broken CUDA
    install) is refused, instead of training on the CPU."""
    if backend != "gpu":
        raise ConfigError("--gpus-per-run", f"> 0 with JAX's backend {backend!r}",
                          "0, or a JAX that starts on the GPUs: pip install -e '.[gpu]'; "
                          "JAX_PLATFORMS=cuda python -c 'import jax; jax.devices()' shows why it does not")


def check_parallel(configs_and_dirs: list[tuple[Any, Path]], devices_per_run: int | None = None) -> None:
    """Before take-off, once for the sweep: ConfigError if a run that starts fresh asks for more devices
    (`parallel.data`) than each of its slots has (`devices_per_run`; None: this process's JAX devices).
    A run with a checkpoint may resume on fewer (scaling.train.parallel: the devices left)."""
    from scaling.train import runs

    wide = [(cfg, d) for cfg, d in configs_and_dirs if cfg.parallel.data > 1]
    if not wide:
        return
    if devices_per_run is None:
        import jax

        devices_per_run = jax.device_count()
    fresh = [cfg.parallel.data for cfg, d in wide if cfg.parallel.data > devices_per_run and not runs.has_checkpoint(d)]
    if fresh:
        from scaling.train import parallel

        raise ConfigError("parallel.data", max(fresh), parallel.fresh_allowed(devices_per_run))


def check_gpu_pins(pins: list[dict[str, str]], child_env: Callable[[Mapping[str, str]], dict[str, str]], *,
                   echo: Callable[[str], None] = print, timeout: float = PROBE_TIMEOUT_S) -> list[dict[str, str]]:
    """Probe each GPU in a child process with its runs' environment (`child_env(pin)`: the sweep's
    `worker_env`), all at once, one probe per GPU (slots sharing a GPU share its verdict: probes
    sharing it would time each other); the usable slots' pins (with `gpu_pin`'s settings), one line
    per GPU left out; ConfigError when none is usable."""
    pinned = [gpu_pin(pin) for pin in pins]
    gpu = lambda pin: pin.get("CUDA_VISIBLE_DEVICES")  # noqa: E731
    first = [pin for i, pin in enumerate(pinned) if gpu(pin) not in {gpu(p) for p in pinned[:i]}]  # a slot per GPU
    with tempfile.TemporaryDirectory(prefix="devices-") as tmp:
        outs = [Path(tmp) / f"{i}.json" for i in range(len(first))]
        procs = [subprocess.Popen([sys.executable, "-m", CHILD, "device-probe", str(out)], env=child_env(pin),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for pin, out in zip(first, outs)]
        probes = [_landed(proc, out, pin, timeout) for proc, out, pin in zip(procs, outs, first)]
    usable = {gpu(first[probes.index(p)]) for p in _usable_or_stop(probes, echo)}
    return [pin for pin in pinned if gpu(pin) in usable]


def check_ray_gpus(count: int, child_env: Callable[[Mapping[str, str]], dict[str, str]], *,
                   echo: Callable[[str], None] = print, timeout: float = PROBE_TIMEOUT_S) -> None:
    """The take-off check on a Ray cluster's `count` GPUs: one task reserving a GPU each, all at once,
    probes it in a child process with its runs' environment (`child_env(gpu_pin(...))`). Ray places
    runs on any GPU of the cluster, so none can be left out: one line per unusable GPU, then a
    ConfigError (the sweep stops before training). A probe names its node and GPU; two on one GPU mean
    Ray packed them (a GPU of the cluster went unprobed), which is said too."""
    import ray

    task = ray.remote(num_gpus=1, num_cpus=0, max_retries=0)(_ray_probe)
    probes = [Probe(**p) for p in ray.get([task.remote(child_env, timeout) for _ in range(count)])]
    usable, lines = judge(probes)
    names = [p.name for p in probes]
    if len(set(names)) < len(names):
        lines.append(f"only {len(set(names))} of the cluster's {count} GPUs were probed (Ray placed two probes on one)")
    for line in lines:
        echo(line)
    if lines:
        raise ConfigError("take-off", ", ".join(sorted(set(names))),
                          "every GPU of the Ray cluster usable and probed (Ray places runs on any of them): "
                          "fix or remove the nodes named above")


def _ray_probe(child_env: Callable[[Mapping[str, str]], dict[str, str]], timeout: float) -> dict[str, Any]:
    """In a Ray task holding one GPU (Ray set CUDA_VISIBLE_DEVICES): that GPU's Probe, named by node."""
    import ray

    pin = gpu_pin({"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "")})
    with tempfile.TemporaryDirectory(prefix="devices-") as tmp:
        out = Path(tmp) / "probe.json"
        proc = subprocess.Popen([sys.executable, "-m", CHILD, "device-probe", str(out)], env=child_env(pin),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        result = _landed(proc, out, pin, timeout)
    result.name = f"{ray.util.get_node_ip_address()} {result.name}"
    return asdict(result)


def _landed(proc: subprocess.Popen, out: Path, pin: Mapping[str, str], timeout: float) -> Probe:
    name = f"CUDA_VISIBLE_DEVICES={pin.get('CUDA_VISIBLE_DEVICES', '?')}"
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return Probe(name=name, problems=[f"probe did not finish in {timeout:.0f} s"])
    if proc.returncode != 0 or not out.is_file():
        tail = (log or b"").decode(errors="replace").strip().splitlines()[-1:] or [""]
        return Probe(name=name, problems=[f"probe process exited with code {proc.returncode}: {tail[0][:200]}"])
    return Probe(**{**json.loads(out.read_text()), "name": name})


def device_probe_child(out: str) -> int:
    """Child entry point: probe this process's first device (the slot's GPU), write its Probe."""
    import jax

    try:
        backend = jax.default_backend()
    except Exception as error:  # noqa: BLE001 - JAX_PLATFORMS=cuda where CUDA does not start: say so
        why = ": ".join(filter(None, (type(error).__name__, str(error)[:200])))
        problem = f"JAX did not start on CUDA ({why}; is jax[cuda12] installed? pip install -e '.[gpu]')"
        Path(out).write_text(json.dumps(asdict(Probe(name="?", problems=[problem]))))
        return 0
    if backend != "gpu":
        result = Probe(name="?", kind=backend, problems=[f"JAX's backend is {backend!r}, not a GPU"])
    else:
        result = probe(Target(jax.devices()[0]))
    Path(out).write_text(json.dumps(asdict(result)))
    return 0

