"""Take-off checks before a sweep trains: every corpus loads, the disk has room, and each distinct
model shape and recipe compiles and trains TAKEOFF_STEPS steps end to end (which also fills the
compilation cache the real runs reuse); and the sweep's ETA, first from this machine's matmul
speed, then from the probes' measured step times.

Probes run in this process and, on a CPU machine, in child lanes (`python -m scaling.study.sweeps.child takeoff
JOB PARENT_PID`, internal). The executors that train the cleared runs are scaling.study.sweeps.sweep.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from scaling.study.sweeps import devices, sweep
from scaling.study.sweeps.sweep import RunSpec
from scaling.train import data, ladder
from scaling._io import atomic_write_json
from scaling.errors import ConfigError

# JAX is imported where a probe flies or the machine is measured: planning a sweep never loads it.

MIN_FREE_BYTES = 1 << 30
TAKEOFF_STEPS = 2



def fly_probes_on_one_gpu() -> None:
    """Start this process's JAX backend on its first GPU only, with memory allocated as needed and
    given back (XLA would otherwise preallocate 75% of every visible GPU here, where the runs need
    it); the environment is restored afterwards, for the runs and a Ray cluster started from here.
    ConfigError if JAX's backend is not a GPU (`devices.require_gpu_backend`)."""
    import jax

    jax.config.update("jax_cuda_visible_devices", "0")
    with devices.parent_allocation():  # no preallocation, memory given back; restored for the runs
        jax.devices()
    devices.require_gpu_backend(jax.default_backend())  # a broken CUDA install: refused, not trained on the CPU




def take_off(specs: list[RunSpec], out_root: str | Path, *, keep_going: bool = False,
             hang_timeout: float = 600.0, lanes: int = 1, pins: list[dict[str, str]] | None = None,
             echo: Callable[[str], None] | None = None) -> tuple[list[RunSpec], dict[str, dict]]:
    """Before anything runs: every corpus loads, the disk has room, and each distinct shape and
    recipe compiles and trains TAKEOFF_STEPS steps end to end (one probe after another, which also
    fills the compilation cache the real runs reuse). Returns the specs cleared to fly and, per shape
    key, the take-off run's summary (its step time drives the ETA). Any failure refuses the whole
    sweep with a one-line ConfigError, unless keep_going, which drops the affected runs instead (and
    says so through `echo`).

    lanes > 1: the probes are dealt to that many lanes, this process and lanes - 1 child processes
    flying theirs one after another. XLA keeps ~1.5 cores busy compiling, so on 2 cores 2 lanes took
    the quick preset's 12 probes from 121 to 96 s (docs/performance.md). `pins`: the sweep's GPU slots
    (takeoff_lanes gives one lane each; this process's is on the first GPU: fly_probes_on_one_gpu);
    child lane i starts with pins[i], so it takes its slot's GPU and memory share as the runs will, and
    compiles there while the others do (about 10 s of CPU per probe on an H200's host).
    """
    out_root = Path(out_root)
    out_root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(out_root).free
    if free < MIN_FREE_BYTES:
        raise ConfigError("--out", str(out_root), f"a disk with at least 1 GiB free (has {free / 2**20:.0f} MiB)")
    say = echo or (lambda line: None)
    for source, tokenizer in sorted({(s.config.data.source, s.config.data.tokenizer) for s in specs}):
        say(f"take-off: corpus {source} ({tokenizer}), built once if not cached")
        corpus = data.load(source, tokenizer)  # raises ConfigError naming data.source; builds a BPE once, before any run
        for eval_tokens, seq_len in sorted({(s.config.data.eval_tokens, s.config.model.seq_len) for s in specs
                                            if (s.config.data.source, s.config.data.tokenizer) == (source, tokenizer)}):
            data.eval_windows(corpus.val, eval_tokens, seq_len)  # the runs' own evaluation (a probe's is smaller)
    sweep.use_compilation_cache()
    groups = {}
    for spec in specs:
        groups.setdefault(sweep.shape_key(spec.config), []).append(spec)
    probes = {key: _takeoff_spec(group[0]) for key, group in groups.items()}
    keys = list(probes)
    lanes = max(1, min(lanes, len(keys)))
    say(f"take-off: {len(keys)} shapes compile and train {TAKEOFF_STEPS} steps, {lanes} at a time "
        f"(about {COMPILE_SECONDS_PER_SHAPE * len(keys) / lanes / 60:.1f} min on 2 cores)")
    children = [_fly_in_child({k: probes[k] for k in keys[i::lanes]}, out_root, hang_timeout, pins[i] if pins else {})
                for i in range(1, lanes)]
    summaries: dict[str, dict] = {}
    said: set[str] = set()

    def cleared(landed: dict[str, dict]) -> None:  # a line per shape as it clears, whichever lane flew it
        for key, summary in landed.items():
            if key not in said and summary.get("status") == "ok":
                said.add(key)
                say(f"take-off: shape {len(said)}/{len(keys)} (L{summary.get('n_layers')}-h{summary.get('d_model')}, "
                    f"{summary.get('recipe')}) cleared in {summary.get('wall_s', 0.0):.1f} s")

    def children_landed() -> dict[str, dict]:
        landed = {}
        for key in keys:
            if key not in said and key not in keys[::lanes]:
                with contextlib.suppress(OSError, json.JSONDecodeError):
                    landed[key] = json.loads((probes[key].out_dir(out_root / ".takeoff") / "summary.json").read_text())
        return landed

    for key in keys[::lanes]:  # this process's lane: one JAX start-up for all its probes
        summaries[key] = _fly(probes[key].config, probes[key].out_dir(out_root / ".takeoff"))
        cleared({key: summaries[key], **children_landed()})
    for child in children:
        summaries.update(child(lambda: cleared(children_landed())))
    cleared(summaries)
    cleared, flights, failures = [], {}, []
    for key, group in groups.items():
        summary = summaries[key]
        if summary.get("status") == "ok":
            flights[key] = summary
            cleared += group
        else:
            failures.append((group, f"{summary.get('reason', summary.get('status'))} ({sweep.describe(group[0].config)})"))
    for group, reason in failures:
        if not keep_going:
            raise ConfigError("take-off", group[0].run_id, f"runs that compile and train: {reason}")
        say(f"skipping {len(group)} runs that failed take-off: {reason}")
    return [s for s in specs if s in cleared], flights


def pack_probe(specs: list[RunSpec], out_root: str | Path, pin: dict[str, str] = {},
               echo: Callable[[str], None] | None = None,
               measure: Callable[[dict], dict[str, float]] | None = None) -> set[str]:
    """The pack keys (scaling.train.loop.pack_key) whose runs may train packed: on the device the
    runs will use (a child process with `pin`, the first slot's settings), two of the key's runs
    packed for a few steps (step.packing_difference) are their single runs bit for bit. Packed
    members that differ are other runs, not copies (Adam turns a last-bit difference into one of the
    order of the learning rate), so a key that differs trains one run at a time, with a line saying so.
    `measure`: {key: [config, config]} -> {key: difference} (default: that child process)."""
    from scaling.train import loop

    say = echo or (lambda line: None)
    groups: dict[str, list[RunSpec]] = {}
    for spec in specs:
        groups.setdefault(loop.pack_key(spec.config), []).append(spec)
    job = {key: [g[0].config.to_dict(), g[1].config.to_dict()] for key, g in groups.items() if len(g) > 1}
    if not job:
        return set()
    say(f"take-off: packing probed for {len(job)} group{'s' if len(job) > 1 else ''} of runs "
        "(a packed step against its single steps)")
    differences = (measure or (lambda job: _probe_packing_in_child(job, Path(out_root), pin)))(job)
    cleared = set()
    for key, difference in differences.items():
        if difference == 0.0:
            cleared.add(key)
            continue
        say(f"not packing {len(groups[key])} runs like {sweep.describe(groups[key][0].config)}: a packed step on "
            f"this device is not their single steps bit for bit (differs by up to {difference:.3g}); they train one "
            "at a time (docs/gpu.md)")
    return cleared


def _probe_packing_in_child(job: dict, out_root: Path, pin: dict[str, str]) -> dict[str, float]:
    (out_root / ".takeoff").mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix="pack-", suffix=".json", dir=out_root / ".takeoff")
    os.close(fd)
    path = Path(name)
    path.write_text(json.dumps(job))
    proc = subprocess.run([sys.executable, "-m", devices.CHILD, "pack-probe", str(path), str(os.getpid())],
                          capture_output=True, text=True, env=sweep.worker_env(pin))
    out = path.with_suffix(".out")
    if proc.returncode != 0 or not out.is_file():
        raise ConfigError("--pack", str(path), f"a device where packed steps can be probed (the probe exited with code "
                          f"{proc.returncode}: {' '.join(proc.stderr.split()[-30:])})")
    differences = json.loads(out.read_text())
    for leftover in (path, out):
        leftover.unlink(missing_ok=True)
    return differences


def pack_probe_child(job: str, parent_pid: int) -> int:
    """Child entry point of the packing probe: each key's difference (scaling.train.step.packing_difference)."""
    sweep.die_with_parent(parent_pid)
    sweep.use_compilation_cache()
    from scaling.train import config, loop, step

    out = {}
    for key, pair in json.loads(Path(job).read_text()).items():
        setups = [loop.prepare(config.validate(c)) for c in pair]
        cfg = setups[0].cfg
        tx = step.optimizer_tx(cfg.train.grad_clip, cfg.train.weight_decay)
        out[key] = step.packing_difference(setups[0].model_cfg, [s.cfg.recipe for s in setups], tx,
                                           [s.cfg.seed for s in setups], [s.cfg.train.lr for s in setups],
                                           cfg.train.batch_size)
    atomic_write_json(Path(job).with_suffix(".out"), out)
    return 0


def takeoff_lanes(workers: int, pins: list[dict[str, str]] | None = None) -> int:
    """Take-off lanes: one per GPU slot (`pins`); else, for a sweep of `workers` concurrent runs, as
    many on a machine without GPUs (an unpinned process there would claim every GPU) and one with."""
    if pins:
        return len(pins)
    return 1 if devices.visible_gpus() else max(1, workers)


def _fly(config, out_dir: str | Path) -> dict:
    """One take-off probe in this process; a failure is its summary, not an exception. A probe
    another sweep is flying is waited for, and its landing reused."""
    import jax

    from scaling.train import loop as train

    try:  # on a GPU sweep of G GPUs per run, this process's lane has one (fly_probes_on_one_gpu)
        return train.run(config, out_dir, wait=True, fewer_devices=True)
    except Exception as error:  # noqa: BLE001 - any failure to take off is reported, not raised
        return {"status": "failed", "reason": f"{type(error).__name__}: {error}"}
    finally:
        # Drop the probe's executables: the runs load them from the persistent cache, and holding them
        # all crashed a 69-shape take-off (LLVM "Cannot allocate memory" after 42 probes, 2 cores 24 GiB).
        jax.clear_caches()


def _fly_in_child(probes: dict[str, RunSpec], out_root: Path, hang_timeout: float, pin: dict[str, str] = {}):
    """Start a child process flying these probes one after another (`pin`: its GPU slot's settings);
    returns a function that waits for it (at most hang_timeout per probe) and gives {shape key: summary}."""
    (out_root / ".takeoff").mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix="lane-", suffix=".json", dir=out_root / ".takeoff")
    os.close(fd)
    job = Path(name)
    job.write_text(json.dumps({key: [str(p.out_dir(out_root / ".takeoff")), p.config.to_dict()]
                               for key, p in probes.items()}))
    log = open(job.with_suffix(".log"), "wb")
    proc = subprocess.Popen([sys.executable, "-m", devices.CHILD, "takeoff", str(job), str(os.getpid())],
                            stdout=log, stderr=subprocess.STDOUT, env=sweep.worker_env(pin))

    def wait(tick: Callable[[], None] = lambda: None) -> dict[str, dict]:
        """`tick`: called about every second while the lane flies."""
        deadline = time.monotonic() + hang_timeout * len(probes)
        while proc.poll() is None and time.monotonic() < deadline:
            tick()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        done = json.loads(job.with_suffix(".out").read_text()) if job.with_suffix(".out").is_file() else {}
        reason = f"take-off process exited with code {proc.returncode} (log: {job.with_suffix('.log')})"
        out = {key: done.get(key, {"status": "failed", "reason": reason}) for key in probes}
        if proc.returncode == 0:
            for path in (job, job.with_suffix(".out"), job.with_suffix(".log")):
                path.unlink(missing_ok=True)
        return out

    return wait


def takeoff_child(job: str, parent_pid: int) -> int:
    """Child entry point of a take-off lane: fly the probes listed in `job`, write their summaries."""
    sweep.die_with_parent(parent_pid)
    sweep.use_compilation_cache()
    done = {key: _fly(cfg, out_dir) for key, (out_dir, cfg) in json.loads(Path(job).read_text()).items()}
    atomic_write_json(Path(job).with_suffix(".out"), done)
    return 0


def _takeoff_spec(spec: RunSpec) -> RunSpec:
    cfg = spec.config
    probe = {"tokens": TAKEOFF_STEPS * cfg.tokens_per_step, "eval_at": [1.0], "schedule": "wsd", "warmup": 0,
             "checkpoint_every": 0, "log_every": 1, "tracker": []}  # a probe, not a curve
    cfg = cfg.replace(**{f"train.{k}": v for k, v in probe.items()}, **{"study.flop_budgets": [],
                      "data.eval_tokens": min(cfg.data.eval_tokens, cfg.tokens_per_step)})
    return RunSpec(run_id=cfg.run_id, sweep=spec.sweep, config=cfg)


def measured_seconds(specs: list[RunSpec], flights: dict[str, dict], lanes: int = 1) -> float:
    """ETA from the take-off runs' measured step times (compilation is cached by then). Probes
    flown `lanes` at a time shared the machine as that many concurrent runs will: the runs' times
    add up `lanes` at once."""
    total = 0.0
    for spec in specs:
        flight = flights.get(sweep.shape_key(spec.config))
        if flight and flight.get("tokens_per_s"):
            # + WSD cooldown branches, and each run's start (its step loaded from the cache) and evaluations
            total += 1.15 * spec.config.train.tokens / flight["tokens_per_s"] + RUN_START_SECONDS
    return total / lanes


# ---------------------------------------------------------------- estimates before take-off

ASSUMED_MODEL_FLOPS_UTILISATION = 0.3  # of a plain fp32 matmul's FLOP/s; replaced by measured step times at take-off
# Measured on 2 cores of an AMD EPYC (the quick preset): a take-off probe compiles and flies in about 16 s
# (12 probes in 96 s on 2 lanes), and a run spends about 26 s (17-36 s) besides its training steps:
# its step loaded from the compilation cache, evaluations, landing.
COMPILE_SECONDS_PER_SHAPE = 16.0
RUN_START_SECONDS = 26.0


def matmul_flops_per_s(n: int = 1024, repeats: int = 5) -> float:
    """This machine's jitted fp32 matmul FLOP/s, the reference every estimate is scaled by."""
    import jax
    import jax.numpy as jnp

    a = jnp.ones((n, n), jnp.float32)
    f = jax.jit(jnp.dot)
    f(a, a).block_until_ready()
    start = time.perf_counter()
    for _ in range(repeats):
        f(a, a).block_until_ready()
    return 2 * n**3 * repeats / (time.perf_counter() - start)


def estimate_seconds(specs: list[RunSpec], flops_per_s: float) -> float:
    """Training FLOPs (the head at the corpus's vocabulary) / (machine FLOP/s x assumed utilisation)
    + each run's start and evaluations (RUN_START_SECONDS)."""
    total = 0.0
    for spec in specs:
        m = spec.config.model
        vocab = sweep._vocab(spec.config.to_dict())
        total += ladder.flops_per_token(m.shape(vocab)) * spec.config.train.tokens
    return total / (flops_per_s * ASSUMED_MODEL_FLOPS_UTILISATION) + RUN_START_SECONDS * len(specs)


def landed_flights(specs: list[RunSpec], out_root: str | Path) -> dict[str, dict]:
    """Per shape key, the summary of a take-off probe that has already flown for one of its specs
    (under <out>/.takeoff, where `take_off` lands them): measured step times before any run trains."""
    flights: dict[str, dict] = {}
    for spec in specs:
        key = sweep.shape_key(spec.config)
        if key in flights:
            continue
        probe = _takeoff_spec(spec)
        try:
            summary = json.loads((probe.out_dir(Path(out_root) / ".takeoff") / "summary.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if summary.get("status") == "ok" and summary.get("tokens_per_s"):
            flights[key] = summary
    return flights


def eta_seconds(specs: list[RunSpec], out_root: str | Path, lanes: int = 1,
                flops_per_s: Callable[[], float] | None = None) -> tuple[float, int, int]:
    """(seconds, shapes timed by landed take-off probes, shapes): the sweep's ETA from the probes'
    measured step times where they have flown, from this machine's matmul speed (`flops_per_s`,
    measured only when some shape has no probe) for the rest."""
    flights = landed_flights(specs, out_root)
    timed = [s for s in specs if sweep.shape_key(s.config) in flights]
    rest = [s for s in specs if sweep.shape_key(s.config) not in flights]
    seconds = measured_seconds(timed, flights, lanes)
    if rest:  # the runs, `lanes` at a time, and the take-off probes still to fly, as many at a time
        seconds += estimate_seconds(rest, (flops_per_s or matmul_flops_per_s)()) / lanes
        seconds += COMPILE_SECONDS_PER_SHAPE * len({sweep.shape_key(s.config) for s in rest}) / lanes
    return seconds, len(flights), len({sweep.shape_key(s.config) for s in specs})

