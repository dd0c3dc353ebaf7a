"""Experiments as TOML grids -> RunSpecs -> runs (local or Ray), crash-safe and resumable.

An experiment file is a base config (the `scaling train` schema) plus:

    [grid]                      # axes, expanded to their product
    "model.size" = [1, 2, 3]    # dotted keys, or nested tables: [grid.model] size = [1, 2, 3]
    precision = ["fp32", "fp8", "fp4"]
    [[include]]                 # extra points, each applied to the base config
    "model.size" = 4
    precision = "fp8"
    [[exclude]]                 # grid points matching every key here are dropped
    "model.size" = 3
    precision = "fp4"

A grid key naming several comma-separated keys is one axis of tuples that vary together:
    "model.size,precision" = [[2, "fp32"], [3, "bf16"], [5, "fp4"]]

The run id is a stable hash of the resolved config, so running a sweep again skips what
has finished. Layout: <out>/<sweep>/<run_id>/{config.json, metrics.jsonl, summary.json, failure.json}.

GPUs (`--gpus-per-run G`): the Ray executor reserves G GPUs per run (a fraction packs runs onto one
GPU, each child given that share of its memory); the local executor pins each run's child process
to one GPU (CUDA_VISIBLE_DEVICES), at most 1/G runs per GPU (G = 1 or 1/k, each child given that
share of its memory), as many concurrent runs as that allows unless --workers says fewer. A whole
G > 1 gives one run G GPUs (`parallel.data = G` unless the experiment sets it: one run across the
devices, scaling.train.parallel; not part of the run id): each local slot is G GPUs, and the
take-off check probes every GPU of every slot, leaving out a slot with any GPU that fails. GPUs are
found without JAX (CUDA_VISIBLE_DEVICES, else `nvidia-smi -L`); the take-off probes
(scaling.study.sweeps.takeoff) fly one lane per slot, this process's on the first GPU allocating memory as
needed and giving it back, so the runs find their GPUs free.

Several sweeps may share an --out: each run is trained by the one process holding its lock
(scaling.train.runs). A sweep that reaches a run another process owns moves on, and once its own runs
have landed waits for those (training any whose owner died before landing them), so every sweep
ends with every run of its grid landed, each trained once.

Packs (`--pack K`, local executor): runs that differ only in seed, learning rate or format values
(scaling.train.loop.pack_key) train K at a time as one program in one watched child
(`execute_pack`), each under its own lock and into its own directory, where take-off found a packed
step on the device bit for bit its single steps (scaling.study.sweeps.takeoff.pack_probe).

Ctrl-C (local executor, `_Stop`): no run starts after it, the runs in flight checkpoint and stop
without landing (a rerun resumes them), and run_sweep raises Interrupted; a second one kills them.

One module: the grid's expansion, the two executors (with the child entry points and the Ray task they
start) and the crash-safe bookkeeping share the RunSpec and the directory layout above.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import ctypes
import itertools
import json
import math
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from scaling.train import config, data, runs
from scaling.study.sweeps import devices
from scaling import host
from scaling._io import atomic_write_json, atomic_write_text
from scaling.train.config import set_dotted
from scaling.errors import ConfigError

if TYPE_CHECKING:
    from scaling.study.sweeps import summary as summary_lib

# JAX (train, the machine probes) and Ray are imported where a run or a cluster starts: planning a
# sweep (--dry-run, --help) never loads them.

EXPERIMENT_KEYS = ("grid", "include", "exclude", "isoflop")


@dataclass(frozen=True)
class RunSpec:
    run_id: str
    sweep: str
    config: Any  # scaling.train.config.RunConfig

    def out_dir(self, root: str | Path) -> Path:
        return Path(root) / self.sweep / self.run_id


def flatten(table: dict, prefix: str = "") -> dict[str, Any]:
    """{'model': {'size': [1, 2]}} -> {'model.size': [1, 2]}; lists and scalars are leaves."""
    flat = {}
    for key, value in table.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and not (dotted == "precision" or dotted.endswith(".precision")):
            flat.update(flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def grid_points(experiment: dict) -> list[dict[str, Any]]:
    """The experiment's points as {dotted key: value} overrides: grid product - excludes + includes."""
    grid = flatten(experiment.get("grid", {}))
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"grid.{key}", values, "a non-empty list of values")
        width = len(key.split(","))
        if width > 1 and not all(isinstance(v, list) and len(v) == width for v in values):
            raise ConfigError(f"grid.{key}", values, f"a list of {width}-element lists (one value per key)")
    excludes = [flatten(e) for e in _tables(experiment, "exclude")]
    points = [_unzip(dict(zip(grid, combo))) for combo in itertools.product(*grid.values())]
    points = [p for p in points if not any(_matches(p, ex) for ex in excludes)]
    return points + [flatten(inc) for inc in _tables(experiment, "include")]


def _unzip(point: dict[str, Any]) -> dict[str, Any]:
    """{"a,b": [1, 2]} -> {"a": 1, "b": 2}: zipped axes become ordinary keys."""
    out = {}
    for key, value in point.items():
        keys = [k.strip() for k in key.split(",")]
        out.update(zip(keys, value) if len(keys) > 1 else [(key, value)])
    return out


def _tables(experiment: dict, key: str) -> list[dict]:
    tables = experiment.get(key, [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(key, tables, f"an array of tables ([[{key}]])")
    return tables


def _matches(point: dict, pattern: dict) -> bool:
    return all(k in point and point[k] == v for k, v in pattern.items())


def load_experiment(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError("experiment", str(path), "an existing TOML file")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("experiment", str(path), f"valid TOML ({e})") from None


def expand(path: str | Path, overrides: list[str] = (), landed: str | Path | None = None,
           summary: "summary_lib.Summary | None" = None) -> list[RunSpec]:
    """Expand an experiment file into validated RunSpecs (unique by run id, in grid order).

    `overrides` are `key=value` strings applied to the base config (as `scaling train --set`).
    Every point is validated before anything runs: a bad value anywhere is a ConfigError.
    `landed`: the results root the sweep writes to; an IsoFLOP design with `extend_edges` or
    `replicates` adds the edge and replicate runs its landed runs there call for
    (scaling.study.sweeps.design.extend_edges, scaling.study.sweeps.design.replicates), and those in the sweep's
    committed `summary` (scaling.study.sweeps.summary) count as landed too.
    """
    sweep, base, points, design = experiment_points(path, overrides)
    if design:
        from scaling.study.sweeps import design as design_lib
    try:
        designed = design_lib.design_runs([c for _, c in points], design, _vocab(base)) if design else None
    except ConfigError as e:
        raise ConfigError(e.key, e.value, f"{e.allowed} (the [isoflop] design)") from None
    specs: dict[str, RunSpec] = {}
    for i, (point, cfg) in enumerate(points):
        try:
            cfgs = [config.validate(cfg)] if designed is None else designed[i]
        except ConfigError as e:
            where = ", ".join(f"{k}={v!r}" for k, v in point.items())
            raise ConfigError(e.key, e.value, f"{e.allowed} (grid point {where})") from None
        for cfg in cfgs:
            specs.setdefault(cfg.run_id, RunSpec(run_id=cfg.run_id, sweep=sweep, config=cfg))
    if design and (design.replicates or design.extend_edges) and (landed is not None or summary is not None):
        from scaling.study.sweeps.summary import landed_rows

        rows = landed_rows(Path(landed) / sweep if landed is not None else None, summary)
        designed = design_lib.extend_edges([c for _, c in points], designed, design, rows, _vocab(base))
        for cfg in [c for cfgs in designed for c in cfgs] + design_lib.replicates(designed, design, rows):
            specs.setdefault(cfg.run_id, RunSpec(run_id=cfg.run_id, sweep=sweep, config=cfg))
    return list(specs.values())


def experiment_points(path: str | Path, overrides: list[str] = ()) -> tuple[str, dict, list[tuple[dict, dict]], Any]:
    """(sweep name, base config, [(grid point overrides, its config)], its Design or None): an
    experiment file before its runs are placed (`expand` places them)."""
    experiment = load_experiment(path)
    base = {k: v for k, v in experiment.items() if k not in EXPERIMENT_KEYS}
    base = config.apply_overrides(base, list(overrides))
    sweep = str(base.get("name") or Path(path).stem)
    design = None
    if "isoflop" in experiment:  # an IsoFLOP design places the sizes and budgets of every grid point
        from scaling.study.sweeps import design as design_lib

        design = design_lib.Design.from_table(experiment["isoflop"])
    points = []
    for point in grid_points(experiment):
        cfg = copy.deepcopy(base)
        for key, value in point.items():
            set_dotted(cfg, key, value)
        points.append((point, cfg))
    return sweep, base, points, design


def pinned_corpus(path: str | Path, overrides: list[str] = ()) -> str:
    """The data.fingerprint an experiment's runs pin ("": none); ConfigError where its points differ:
    a sweep's runs are compared with each other, so they train on one corpus."""
    pins = {str((cfg.get("data") or {}).get("fingerprint", "")) for _, cfg in experiment_points(path, overrides)[2]}
    if len(pins) > 1:
        raise ConfigError("data.fingerprint", sorted(pins), "one value for every run of a sweep")
    return pins.pop() if pins else ""


def check_corpus(specs: list[RunSpec], out_root: Path) -> None:
    """Before anything trains: each pinned source (data.fingerprint) resolves here to its corpus, and
    no run directory of a pinned sweep (<out_root>/<sweep>/<run id>) holds a run on other data."""
    pins = {(s.config.data.source, s.config.data.tokenizer, s.config.data.fingerprint) for s in specs
            if s.config.data.fingerprint}
    for source, tokenizer, pin in sorted(pins):
        data.check_fingerprint(data.load(source, tokenizer), pin)
    from scaling.study.sweeps import results, summary as summary_lib

    for sweep, pin in sorted({(s.sweep, s.config.data.fingerprint) for s in specs if s.config.data.fingerprint}):
        run_dir = Path(out_root) / sweep
        rows = summary_lib.landed_rows(run_dir, None).drop_duplicates("run_id")
        other = rows[~results.on_corpus(rows, pin)]
        if len(other):
            raise ConfigError("data.fingerprint", pin, f"run directories of that corpus only ({len(other)} under {run_dir} "
                              f"trained on {', '.join(sorted(map(str, other['corpus'].fillna('no recorded corpus').unique())))}, "
                              f"e.g. {other['run_id'].iloc[0]}: move them away to train them again)")


def _vocab(cfg: dict) -> int:
    """The vocabulary a config's corpus gives (the head's FLOPs depend on it); byte corpora: 256, BPE: V."""
    source, tokenizer = cfg.get("data", {}).get("source", "stdlib"), cfg.get("data", {}).get("tokenizer", "bytes")
    bpe_vocab = data.tokenizer_vocab(tokenizer, source)  # known without training the tokenizer
    if bpe_vocab is not None:
        return bpe_vocab
    return 256 if source in ("stdlib", "pysrc") else data.load(source).vocab


# ---------------------------------------------------------------- running

OWNED = "owned"  # not a status: another process holds the run's lock; the sweep comes back to it
# Nor these: Ctrl-C came before the run started, or stopped it (checkpointed, not landed); a rerun
# trains or resumes it.
NOT_STARTED, INTERRUPTED = "not started", "interrupted"
INTERRUPTED_EXIT = 130  # a run child's exit code when a stop request stopped it (128 + SIGINT)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a sweep's runs (`report`: run_sweep's, with the interrupted and not started
    counts; `at_once`: a second Ctrl-C killed the runs in flight instead of letting them checkpoint)."""

    def __init__(self, report: dict, at_once: bool):
        super().__init__("interrupted")
        self.report, self.at_once = report, at_once


class _Stop:
    """Ctrl-C during a sweep's runs. The first: no run starts after it, and each run child in flight
    is sent SIGINT (the children have process groups of their own, so the terminal's Ctrl-C reaches
    this process alone), on which it checkpoints between two steps and exits with INTERRUPTED_EXIT,
    not landed; an in-process run is stopped the same way (loop.STOP). The second: the children are
    killed. The handler only sets flags and signals: the sweep's threads and main loop act on them."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.at_once = False
        self.in_process = False  # --workers 0: the run trains in this process
        self._children: set[subprocess.Popen] = set()
        self._lock = threading.Lock()  # never taken by the main thread outside the handler

    def handle(self, signum, frame) -> None:
        if self.requested.is_set():
            self.at_once = True
        self.requested.set()
        if self.in_process:
            from scaling.train import loop  # imported already: the run trains here

            loop.STOP.set()
        with self._lock:
            for proc in self._children:
                proc.kill() if self.at_once else proc.send_signal(signal.SIGINT)

    def started(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._children.add(proc)
            if self.requested.is_set():  # the request came while the child was starting
                proc.send_signal(signal.SIGINT)

    def ended(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._children.discard(proc)


_STOP = _Stop()  # this process's sweep (one at a time); run_sweep installs its handler



def die_with_parent(parent_pid: int) -> None:
    """Linux: the kernel SIGKILLs this run when its sweep process dies, so a killed sweep leaves
    no orphan writing into a run directory that the next sweep will resume."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the sweep died before prctl took effect
        os._exit(1)


def _compilation_cache_settings() -> dict[str, str]:
    cache = data.cache_dir() / "jax"  # where train.run puts it too
    return {"JAX_COMPILATION_CACHE_DIR": str(cache), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def worker_env(pin: Mapping[str, str] = {}) -> dict[str, str]:
    """Runs share XLA's persistent compilation cache: a shape compiled once (at take-off) is loaded,
    not recompiled, by every later run of that shape, in any process; their processes start with
    host.PROCESS_ENV (malloc with huge pages). `pin`: a GPU slot's settings."""
    return {**_compilation_cache_settings(), **host.process_env(os.environ), **os.environ, **pin}


def use_compilation_cache() -> None:
    """This process's JAX reads and writes the runs' shared persistent compilation cache."""
    import jax

    for name, value in _compilation_cache_settings().items():
        value = os.environ.get(name, value)
        kind = str if name.endswith("DIR") else float if name.endswith("SECS") else int
        jax.config.update(name.lower(), kind(value))


def execute(spec: RunSpec, out_root: str | Path, hang_timeout: float, poll_s: float = 1.0,
            wait: bool = False, pin: Mapping[str, str] = {}) -> str:
    """Run one spec in a child process, watched: returns its status ('skipped' if it had landed).

    This process holds the run's lock from the check that it has not landed until it has, and the
    child inherits it; a run another process holds is OWNED (with `wait`: waited for, then
    skipped if it landed for good, else trained here). The child resumes from its own checkpoint if
    a previous attempt was interrupted. A run whose heartbeat (metrics.jsonl, or the start) is
    older than `hang_timeout` seconds is killed and landed as `hung`; a child that dies without
    a summary is landed as `failed`. `pin`: environment settings of the child (its GPU).
    """
    out_dir = spec.out_dir(out_root)
    if runs.finished(out_dir):
        return "skipped"
    while True:
        if _STOP.requested.is_set():
            return NOT_STARTED
        try:
            lock = runs.acquire(out_dir, poll_s=poll_s)
            break
        except runs.RunOwned:
            if not wait:
                return OWNED
            time.sleep(poll_s)  # polled here, not in runs.acquire, so that Ctrl-C ends the wait
    with lock:
        if runs.finished(out_dir):  # landed by the process that held the lock before us
            return "skipped"
        runs.begin(out_dir, spec.config)
        return _watch([spec], out_root, [lock], hang_timeout, poll_s, pin)[0]


def execute_pack(specs: list[RunSpec], out_root: str | Path, hang_timeout: float, poll_s: float = 1.0,
                 pin: Mapping[str, str] = {}) -> list[str]:
    """Run specs of one pack key (scaling.train.loop.pack_key) as one program in one watched child
    process (scaling.train.loop.run_packed), each under its own lock as `execute` holds it: returns
    each one's status. Runs that have landed are skipped and runs another process holds are OWNED;
    if one run is left it trains alone. A hang or a death lands every member not yet landed."""
    statuses: list[str] = []
    held: list[tuple[RunSpec, runs.Lock]] = []
    if _STOP.requested.is_set():
        return [NOT_STARTED] * len(specs)
    try:
        for spec in specs:
            out_dir = spec.out_dir(out_root)
            if runs.finished(out_dir):
                statuses.append("skipped")
                continue
            try:
                lock = runs.acquire(out_dir, poll_s=poll_s)
            except runs.RunOwned:
                statuses.append(OWNED)
                continue
            if runs.finished(out_dir):
                lock.release()
                statuses.append("skipped")
                continue
            held.append((spec, lock))
            statuses.append("")
        for spec, _ in held:
            runs.begin(spec.out_dir(out_root), spec.config)
        trained = iter(_watch([s for s, _ in held], out_root, [lock for _, lock in held], hang_timeout, poll_s, pin)
                       if held else [])
        return [status or next(trained) for status in statuses]
    finally:
        for _, lock in held:
            lock.release()


def _watch(specs: list[RunSpec], out_root: str | Path, locks: list[runs.Lock], hang_timeout: float, poll_s: float,
           pin: Mapping[str, str]) -> list[str]:
    """Train these runs in a watched child (one run, or a pack of them) and return their statuses."""
    out_dirs = [s.out_dir(out_root) for s in specs]
    log_path = out_dirs[0] / "run.log"  # a pack's log is its first member's
    started = time.time()
    members = [f"{d}:{lock.fd}" for d, lock in zip(out_dirs, locks)]
    argv = ["run", str(out_dirs[0]), str(os.getpid()), str(locks[0].fd)] if len(specs) == 1 else \
        ["pack", str(os.getpid()), *members]
    with open(log_path, "ab") as log:
        # a session of its own: the terminal's Ctrl-C reaches the sweep, which asks the child to stop (_Stop)
        proc = subprocess.Popen([sys.executable, "-m", devices.CHILD, *argv], pass_fds=[lock.fd for lock in locks],
                                stdout=log, stderr=subprocess.STDOUT, env=worker_env(pin), start_new_session=True)
        _STOP.started(proc)
        try:
            while True:
                try:
                    proc.wait(timeout=poll_s)  # returns as the child exits
                    break
                except subprocess.TimeoutExpired:
                    pass
                heartbeat = max([started] + [_mtime(d / "metrics.jsonl") for d in out_dirs])
                if time.time() - heartbeat > hang_timeout:
                    proc.kill()
                    proc.wait()
                    return [_land_dead(d, s.config, "hung", f"no progress for {hang_timeout:.0f} s", log_path)
                            for s, d in zip(specs, out_dirs)]
        finally:
            _STOP.ended(proc)
    if _STOP.requested.is_set():  # stopped by Ctrl-C (checkpointed, or killed at a second one): not landed
        return [(runs.summary(d) or {}).get("status", INTERRUPTED) for d in out_dirs]
    reason = f"run process exited with code {proc.returncode}"
    return [_land_dead(d, s.config, "failed", reason, log_path) for s, d in zip(specs, out_dirs)]


def _land_dead(out_dir: Path, config, status: str, reason: str, log_path: Path) -> str:
    """The status of a run whose process ended: as it landed, else (it died or hung) landed here with
    what it logged, and its log's tail as the traceback (the child's own traceback is in its log, not
    in this process)."""
    landed = runs.summary(out_dir)
    if landed is not None:
        return landed.get("status", "ok")
    runs.land_failure(out_dir, config=config.to_dict(), status=status, reason=reason, **runs.last_logged(out_dir),
                      log_tail=_tail(log_path))
    return status


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _tail(path: Path, n_bytes: int = 8000) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - n_bytes))
        return f.read().decode(errors="replace")


def run_child(out_dir: str, parent_pid: int, lock_fd: int) -> int:
    """Child entry point: train the run whose validated config.json is in out_dir, under the
    lock its parent holds (passed down as an open file)."""
    die_with_parent(parent_pid)
    from scaling.train import loop as train

    out = Path(out_dir)
    signal.signal(signal.SIGINT, lambda *_: train.STOP.set())  # the sweep's stop request (_Stop)
    with runs.inherit(out, lock_fd) as lock:
        try:
            summary = train.run(json.loads((out / "config.json").read_text()), out, lock=lock)
        except train.Interrupted:
            return INTERRUPTED_EXIT
    return 0 if summary.get("status") in runs.STATUSES else 1


def pack_child(parent_pid: int, members: list[str]) -> int:
    """Child entry point of a pack: train the runs of these `DIR:LOCK_FD`s as one program
    (scaling.train.loop.run_packed) under the locks its parent holds."""
    die_with_parent(parent_pid)
    from scaling.train import loop as train

    dirs = [Path(m.rsplit(":", 1)[0]) for m in members]
    signal.signal(signal.SIGINT, lambda *_: train.STOP.set())  # the sweep's stop request (_Stop)
    with contextlib.ExitStack() as stack:
        locks = [stack.enter_context(runs.inherit(out, int(member.rsplit(":", 1)[1])))
                 for member, out in zip(members, dirs)]
        try:
            summaries = train.run_packed([json.loads((out / "config.json").read_text()) for out in dirs], dirs,
                                         echo=print, locks=locks)
        except train.Interrupted:
            return INTERRUPTED_EXIT
    return 0 if all(s.get("status") in runs.STATUSES for s in summaries) else 1


def _ray_task(spec: RunSpec, out_root: str, hang_timeout: float, wait: bool,
              gpus_per_run: float) -> tuple[str, dict[str, str]]:
    """One Ray task = one watched run; returns its files so the driver holds them even without shared
    storage. Ray sets the task's CUDA_VISIBLE_DEVICES to the GPUs it reserved; the child inherits it."""
    status = execute(spec, out_root, hang_timeout, wait=wait, pin=devices.ray_pin(gpus_per_run))
    out_dir = spec.out_dir(out_root)
    files = {} if status == OWNED else {name: (out_dir / name).read_text() for name in RUN_FILES
                                        if (out_dir / name).exists()}
    return status, files


RUN_FILES = ("config.json", "metrics.jsonl", "summary.json", "failure.json")


def packs(specs: list[RunSpec], pack: int, pack_keys: Collection[str]) -> list[list[RunSpec]]:
    """The specs as units a slot trains: runs of a pack key in `pack_keys` (scaling.train.loop.pack_key)
    in groups of up to `pack`, in the order their first member comes; every other run alone."""
    from scaling.train import loop

    units: list[list[RunSpec]] = []
    open_packs: dict[str, list[RunSpec]] = {}
    for spec in specs:
        key = loop.pack_key(spec.config) if pack > 1 and pack_keys else None
        if key not in pack_keys:
            units.append([spec])
            continue
        unit = open_packs.get(key)
        if unit is None or len(unit) == pack:
            unit = open_packs[key] = []
            units.append(unit)
        unit.append(spec)
    return units


def pack_plan(specs: list[RunSpec], pack: int) -> str:
    """One line for a dry run: how `--pack` groups these runs, before take-off probes each group on the device."""
    from scaling.train import loop

    packed = [u for u in packs(specs, pack, {loop.pack_key(s.config) for s in specs}) if len(u) > 1]
    sizes = ", ".join(str(len(u)) for u in packed) or "none"
    return (f"--pack {pack}: {sum(map(len, packed))} of {len(specs)} runs in {len(packed)} pack{'' if len(packed) == 1 else 's'} "
            f"(sizes {sizes}), "
            "the rest one at a time; take-off keeps a group packed only where its packed step is its single steps "
            "bit for bit on the device")


def _run_local(specs, out_root, hang_timeout, workers, on_done, wait, slots=None, units=None) -> None:
    """`slots`: one environment pin per concurrent child (its GPU); default `workers` unpinned ones.
    `units`: the specs grouped as `packs` gives them (default: one run each)."""
    if workers == 0 and not slots:  # in-process, sequential: compiled steps are reused in memory; no hang watchdog
        for spec in specs:
            on_done(spec, NOT_STARTED if _STOP.requested.is_set() else _run_in_process(spec, out_root, wait))
        return
    free: queue.Queue = queue.Queue()
    for pin in slots or [{}] * workers:
        free.put(pin)

    def in_a_slot(unit: list[RunSpec]) -> list[str]:
        pin = free.get()  # a thread starts only when a slot is free: there are as many threads as slots
        try:
            if len(unit) == 1:
                return [execute(unit[0], out_root, hang_timeout, wait=wait, pin=pin)]
            return execute_pack(unit, out_root, hang_timeout, pin=pin)
        finally:
            free.put(pin)

    with concurrent.futures.ThreadPoolExecutor(max_workers=free.qsize()) as pool:
        futures = {pool.submit(in_a_slot, unit): unit for unit in units or [[s] for s in specs]}
        pending, said = set(futures), False
        while pending:  # woken twice a second, so that a Ctrl-C is answered while every run is busy
            done, pending = concurrent.futures.wait(pending, timeout=0.5, return_when=concurrent.futures.FIRST_COMPLETED)
            if _STOP.requested.is_set() and not said:
                said = True
                print("stopping: no run starts; the runs in flight checkpoint and stop (Ctrl-C again: kill them now)",
                      flush=True)
            for future in done:
                for spec, status in zip(futures[future], future.result()):
                    on_done(spec, status)


def _run_in_process(spec: RunSpec, out_root: Path, wait: bool) -> str:
    """execute()'s ownership rules, without the child process."""
    from scaling.train import loop as train

    out_dir = spec.out_dir(out_root)
    if runs.finished(out_dir):
        return "skipped"
    try:
        lock = runs.acquire(out_dir, wait=wait)
    except runs.RunOwned:
        return OWNED
    with lock:
        if runs.finished(out_dir):
            return "skipped"
        try:
            return train.run(spec.config, out_dir, lock=lock).get("status", "failed")
        except train.Interrupted:
            return INTERRUPTED


def start_ray(address: str | None, gpus_per_run: float = 0) -> float:
    """Connect to (or start) the Ray cluster; its GPU count. ConfigError if a run asks for more GPUs."""
    import ray

    ray.init(address=address, ignore_reinit_error=True, include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    cluster_gpus = ray.cluster_resources().get("GPU", 0)
    if gpus_per_run > cluster_gpus:
        raise ConfigError("--gpus-per-run", gpus_per_run, f"at most the Ray cluster's {cluster_gpus:g} GPUs")
    return cluster_gpus


def _run_ray(specs, out_root, hang_timeout, address, cpus_per_run, gpus_per_run, on_done, wait) -> None:
    import ray

    start_ray(address, gpus_per_run)
    # max_retries: a run whose worker (or node) dies is started again elsewhere; it resumes from its
    # checkpoint (the dead worker's lock died with it).
    task = ray.remote(num_cpus=cpus_per_run, num_gpus=gpus_per_run, max_retries=3)(_ray_task)
    pending = {task.remote(s, str(out_root), hang_timeout, wait, gpus_per_run): s for s in specs}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        spec = pending.pop(done[0])
        status, files = ray.get(done[0])
        out_dir = spec.out_dir(out_root)
        for name, text in files.items():  # no-op on shared storage; copies results home otherwise
            if not (out_dir / name).exists():
                atomic_write_text(out_dir / name, text)
        on_done(spec, status)


def run_sweep(specs: list[RunSpec], out_root: str | Path, *, executor: str = "local", workers: int = 1,
              hang_timeout: float = 600.0, ray_address: str | None = None, cpus_per_run: float = 1,
              gpus_per_run: float = 0, gpu_pins: list[dict[str, str]] | None = None,
              progress: bool = True, on_landed: Callable[[], None] | None = None,
              pack: int = 1, pack_keys: Collection[str] = ()) -> dict[str, Any]:
    """Run every spec not yet landed; returns and writes <out>/<sweep>/sweep.json (counts, slow runs).
    Local: `gpu_pins` (gpu_slots, each probed first: scaling.study.sweeps.devices.check_gpu_pins) runs one
    child per pin; Ray: each run reserves `gpus_per_run` GPUs. Local, with child processes: runs of
    the pack keys in `pack_keys` (those scaling.study.sweeps.takeoff.pack_probe cleared) train `pack` at a
    time as one program in one child (`packs`); runs another process owned are waited for alone.
    `on_landed`: called as each run lands (the sweep's committed summary is rewritten there).
    Ctrl-C (local executor; _Stop): no run starts after it, the runs in flight checkpoint and stop
    without landing (a second Ctrl-C kills them), sweep.json is written and Interrupted is raised."""
    if executor not in ("local", "ray"):
        raise ConfigError("executor", executor, ["local", "ray"])
    global _STOP
    _STOP = _Stop()
    _STOP.in_process = executor == "local" and workers == 0 and not gpu_pins
    handled = executor == "local" and threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, _STOP.handle) if handled else None
    try:
        return _run_sweep(specs, Path(out_root), executor, workers, hang_timeout, ray_address, cpus_per_run,
                          gpus_per_run, gpu_pins, progress, on_landed, pack, pack_keys)
    finally:
        if handled:
            signal.signal(signal.SIGINT, previous)
        if _STOP.in_process:
            from scaling.train import loop

            loop.STOP.clear()


def _run_sweep(specs, out_root, executor, workers, hang_timeout, ray_address, cpus_per_run, gpus_per_run, gpu_pins,
               progress, on_landed, pack, pack_keys) -> dict[str, Any]:
    counts = {s: 0 for s in (*runs.STATUSES, "skipped")}
    owned: list[RunSpec] = []
    total_tokens = sum(_tokens(s) for s in specs) or 1
    started = time.perf_counter()
    with _progress(progress, total_tokens) as (bar, task_id):
        def on_done(spec: RunSpec, status: str) -> None:
            if status == OWNED:
                owned.append(spec)
                return
            if status in (INTERRUPTED, NOT_STARTED):  # counted only when there are some
                counts[status] = counts.get(status, 0) + 1
                return
            counts[status if status in counts else "failed"] += 1
            if on_landed is not None and status != "skipped":
                on_landed()
            bar.update(task_id, advance=_tokens(spec),
                       description=" ".join(f"{k} {v}" for k, v in counts.items() if v))
            if not progress:  # no bar: a line per run, so a long sweep is never silent
                print(f"{sum(counts.values())}/{len(specs)} {spec.run_id} {status} "
                      f"({time.perf_counter() - started:.0f} s in all)", flush=True)

        def run(todo: list[RunSpec], wait: bool) -> None:
            if executor == "local":
                units = None if wait else packs(todo, pack, pack_keys)
                _run_local(todo, out_root, hang_timeout, workers, on_done, wait, gpu_pins, units)
            else:
                _run_ray(todo, out_root, hang_timeout, ray_address, cpus_per_run, gpus_per_run, on_done, wait)

        run(specs, wait=False)
        # Runs another process was training: wait for them, so this sweep's counts and exit status
        # cover every run, each once (one whose owner died unlanded is trained here).
        waited, owned = owned, []
        if _STOP.requested.is_set():
            counts[NOT_STARTED] = counts.get(NOT_STARTED, 0) + len(waited)
            waited = []
        if waited:
            bar.console.print(f"{len(waited)} run{'s' if len(waited) > 1 else ''} owned by another process: "
                              "waiting for them to land")
            run(waited, wait=True)
    report = {"counts": counts, "owned_elsewhere": len(waited), "slow_runs": slow_runs(specs, out_root)}
    for sweep in sorted({s.sweep for s in specs}):
        atomic_write_json(out_root / sweep / "sweep.json", report)
    if _STOP.requested.is_set():
        raise Interrupted(report, _STOP.at_once)
    return report


def _tokens(spec: RunSpec) -> int:
    return spec.config.train.tokens


@contextlib.contextmanager
def _progress(enabled: bool, total: int):
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}% of tokens"),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, disable=not enabled, transient=False) as bar:
        yield bar, bar.add_task("starting", total=total)


def shape_key(cfg) -> str:
    """Runs sharing a model shape, recipe and batch compile the same step and run at the same speed
    (the corpus and its tokenizer set the vocabulary, part of the shape)."""
    d = cfg.to_dict()
    return json.dumps([d["model"], d["precision"], cfg.train.batch_size, cfg.data.source, cfg.data.tokenizer],
                      sort_keys=True)


def slow_runs(specs: list[RunSpec], out_root: Path, factor: float = 0.5) -> list[dict]:
    """The sweep's "slow node": runs with under `factor` x the median tokens/s of their peers
    (same model shape, recipe and batch, trained in packs of the same size: a packed run's tokens/s
    is its own, the pack's shared by its members), which points at a sick machine rather than the config."""
    peers: dict[tuple[str, int], list[tuple[str, float]]] = {}
    for spec in specs:
        try:
            summary = json.loads((spec.out_dir(out_root) / "summary.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if summary.get("status") == "ok" and summary.get("tokens_per_s"):
            key = (shape_key(spec.config), len(summary.get("packed_with", [])))
            peers.setdefault(key, []).append((spec.run_id, float(summary["tokens_per_s"])))
    flagged = []
    for group in peers.values():
        if len(group) >= 3:
            median = statistics.median(t for _, t in group)
            flagged += [{"run_id": r, "tokens_per_s": t, "peer_median": median}
                        for r, t in group if t < factor * median]
    return flagged


def describe(cfg) -> str:
    """One line naming a run's size, precision, tokens, learning rate and seed."""
    depth = "" if cfg.model.n_layers is None else f"x{cfg.model.n_layers}"
    return (f"size={cfg.model.size}{depth} precision={cfg.recipe.name} tokens={cfg.train.tokens:,} "
            f"lr={cfg.train.lr:g} seed={cfg.seed}")

