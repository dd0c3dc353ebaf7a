"""`scaling sweep EXPERIMENT.toml`: expand a grid, check take-off, run it, print what landed.

The grid and executors are scaling.study.sweeps.sweep, the take-off checks and ETAs scaling.study.sweeps.takeoff.
The library comes in with main, not for `--help` (no pandas, no JAX); the ETA measures this machine's
matmul speed with JAX.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from scaling._lazy import exports
from scaling.errors import ConfigError

if TYPE_CHECKING:
    from scaling.study.sweeps.summary import Summary

# the library modules main imports, also reachable as attributes (`sweep_cli.takeoff`), imported on first use
__getattr__ = exports(__name__, {m: f"scaling.study.{m}" for m in ("design_checks", "devices", "sweep", "takeoff")}
                      | {"runs": "scaling.train.runs", "Summary": "scaling.study.sweeps.summary"})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", help="experiment TOML: a base config plus [grid] axes")
    parser.add_argument("-o", "--out", default="results", help="results root (default: results/)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a base config key for every run (repeatable)")
    parser.add_argument("--executor", default="local", choices=["local", "ray"],
                        help="local: child processes on this machine; ray: a Ray cluster (default local)")
    parser.add_argument("--workers", type=int, default=None,
                        help="local: concurrent runs, each a watched child process; 0 = in-process, sequential "
                             "(default 1, or one per visible GPU with --gpus-per-run)")
    parser.add_argument("--ray-address", default=None, help="ray: cluster address (default: start a local Ray)")
    parser.add_argument("--cpus-per-run", type=float, default=1, help="ray: CPUs reserved per run")
    parser.add_argument("--gpus-per-run", type=float, default=0,
                        help="GPUs per run: ray reserves this many (a fraction shares a GPU); local: 1 pins each "
                             "run to its own GPU, 1/k puts k runs on each GPU, a whole G > 1 gives each run G GPUs "
                             "(parallel.data = G unless set: one run across them) (default 0: no GPU reserved)")
    parser.add_argument("--pack", type=int, default=1, metavar="K",
                        help="local executor: train runs that differ only in seed, learning rate or format values K "
                             "at a time as one program in one process, where a take-off probe finds a packed step on "
                             "this device bit for bit its single steps (default 1: one run per process; docs/gpu.md)")
    parser.add_argument("--hang-timeout", type=float, default=600,
                        help="seconds without a metrics heartbeat before a run is stopped as hung")
    parser.add_argument("--dry-run", action="store_true", help="print the expanded runs and an ETA, run nothing")
    parser.add_argument("--keep-going", action="store_true",
                        help="skip runs that fail the take-off checks instead of refusing to start")
    parser.add_argument("--summary", default=None, metavar="CSV",
                        help="the sweep's committed summary: runs in it have landed (not trained again) and it is "
                             "rewritten, with its _curves.parquet, as runs land (default <out>/<sweep>.csv)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar: one line per landed run instead")


def _gpu_pins(args: argparse.Namespace) -> list[dict[str, str]] | None:
    """The local executor's GPU slots (None: no GPU asked for, or Ray); ConfigError if they cannot be had.
    With GPUs, this process's JAX starts on the first one only (the take-off probes fly there)."""
    from scaling.study.sweeps import devices, sweep, takeoff

    gpus = devices.visible_gpus() if args.gpus_per_run else []
    devices.check_gpus_per_run(args.gpus_per_run, args.executor, gpus)
    pins = devices.gpu_slots(gpus, args.workers, args.gpus_per_run) if args.executor == "local" and args.gpus_per_run else None
    if pins == []:
        raise ConfigError("--workers", args.workers, "at least 1 with --gpus-per-run (each run a child on its GPU)")
    if gpus:
        takeoff.fly_probes_on_one_gpu()
    return pins


def _sets_parallel_data(args: argparse.Namespace) -> bool:
    """Whether the experiment (its base, grid or --set) chooses parallel.data itself."""
    import tomllib

    if any(item.split("=", 1)[0].strip() == "parallel.data" for item in args.set):
        return True
    try:
        text = Path(args.experiment).read_text()
        table = tomllib.loads(text)
    except (OSError, tomllib.TOMLDecodeError):
        return False  # the sweep's own reading of the file says what is wrong
    return "data" in table.get("parallel", {}) or "parallel.data" in text


def _todo(specs: list, out_root: Path, committed: Summary | None = None) -> list:
    """The specs neither landed under out_root nor in the committed summary."""
    from scaling.train import runs

    landed = committed.landed_ids() if committed else set()
    return [s for s in specs if s.run_id not in landed and not runs.finished(s.out_dir(out_root))]


# the options a rerun must repeat to be the same sweep (flag, attribute, default); the rest print or plan
_RERUN_OPTIONS = (("--executor", "executor", "local"), ("--workers", "workers", None), ("--ray-address", "ray_address", None),
                  ("--cpus-per-run", "cpus_per_run", 1), ("--gpus-per-run", "gpus_per_run", 0), ("--pack", "pack", 1),
                  ("--hang-timeout", "hang_timeout", 600), ("--summary", "summary", None))


def rerun_command(args: argparse.Namespace) -> str:
    """The command that runs this sweep again (resuming what was interrupted), quoted for a shell."""
    import shlex

    argv = ["scaling", "sweep", args.experiment, "--out", args.out]
    argv += [word for item in args.set for word in ("--set", item)]
    argv += [word for flag, name, default in _RERUN_OPTIONS if getattr(args, name) != default
             for word in (flag, f"{getattr(args, name):g}" if isinstance(getattr(args, name), float) else str(getattr(args, name)))]
    argv += ["--keep-going"] * args.keep_going + ["--no-progress"] * args.no_progress
    return shlex.join(argv)


def main(args: argparse.Namespace) -> int:
    """Ctrl-C: one line (what stopped, the command that resumes), exit 130, no traceback."""
    from scaling.study.sweeps import sweep

    command = rerun_command(args)  # before main adds its own --set
    try:
        return _main(args)
    except sweep.Interrupted as stop:
        counts = stop.report["counts"]
        stopped = counts.get(sweep.INTERRUPTED, 0)
        done = sum(n for key, n in counts.items() if key not in (sweep.INTERRUPTED, sweep.NOT_STARTED, "skipped"))
        how = "killed (they resume from their last checkpoint)" if stop.at_once else "checkpointed and stopped"
        print(f"interrupted: {stopped} run{'s' if stopped != 1 else ''} in flight {how}, "
              f"{counts.get(sweep.NOT_STARTED, 0)} not started, {done} landed; resume with: {command}", flush=True)
    except KeyboardInterrupt:  # outside the runs (take-off, a summary) or under Ray: no run of ours to stop
        print(f"\ninterrupted; resume with: {command}", flush=True)
    return 130


def _check_options(args: argparse.Namespace) -> None:
    """Refuse option values no sweep runs with, and (unless a dry run) an --out this process cannot write."""
    if args.workers is not None and args.workers < 0:
        raise ConfigError("--workers", args.workers, "an integer >= 0")
    if args.hang_timeout <= 0:
        raise ConfigError("--hang-timeout", args.hang_timeout, "seconds > 0")
    if args.pack < 1:
        raise ConfigError("--pack", args.pack, "an integer >= 1")
    if args.pack > 1 and (args.executor != "local" or args.workers == 0 or args.gpus_per_run > 1):
        raise ConfigError("--pack", args.pack, "1 unless the local executor trains runs in child processes "
                          "(--workers >= 1) on one device each (--gpus-per-run <= 1)")
    if not args.dry_run:  # refused before any take-off or run (a dry run writes nothing)
        from scaling._io import check_writable_dir
        check_writable_dir("--out", args.out)


def _print_reused(committed: Summary, specs: list, pinned: str) -> None:
    """How many of these runs the committed summary holds, and how many of those trained on another corpus
    than the pinned one (trained again)."""
    if not committed.path.is_file():
        return
    reused = committed.landed_ids() & {s.run_id for s in specs}
    print(f"{committed.path}: {len(reused)} of these runs landed there (reused, not trained again)")
    elsewhere = committed.elsewhere()
    elsewhere = elsewhere[elsewhere["run_id"].isin({s.run_id for s in specs})].drop_duplicates("run_id")
    if len(elsewhere):
        corpora = ", ".join(sorted(map(str, elsewhere["corpus"].fillna("no recorded corpus").unique())))
        print(f"{committed.path}: {len(elsewhere)} of these runs trained on another corpus ({corpora}), "
              f"not the pinned {pinned}: trained again, their rows replaced as they land")


def _print_eta(args: argparse.Namespace, specs: list, todo: list, out_root: Path, pins: list | None) -> None:
    """The plan in one line: runs landed and to run, and the estimated time (take-off's probes where flown)."""
    from scaling.study.sweeps import takeoff

    lanes = (len(pins) if pins else args.workers or 1) if args.executor == "local" else 1
    eta, timed, shapes = takeoff.eta_seconds(todo, out_root, lanes)
    source = (f", {timed} of {shapes} shapes timed by take-off probes" if timed else
              ", from this machine's matmul speed (no take-off probe has flown yet)") if shapes else ""
    print(f"{len(specs)} runs in {specs[0].sweep if specs else '-'}: {len(specs) - len(todo)} landed, "
          f"{len(todo)} to run, estimated {eta / 60:.1f} min{source}; take-off and each run's start counted, "
          f"building a corpus or tokenizer that is not cached not counted")


def _dry_run(args: argparse.Namespace, specs: list, todo: list, out_root: Path, committed: Summary) -> int:
    """--dry-run: each run and whether it is done, the pack plan, the design's notes and warnings, and
    whether training here would stop on the corpus; writes nothing."""
    from scaling.study.sweeps import design_checks, sweep

    for spec in specs:
        print(f"  {spec.run_id}  {'done' if spec not in todo else 'todo'}  {sweep.describe(spec.config)}")
    if args.pack > 1:
        print(f"  {sweep.pack_plan(todo, args.pack)}")
    notes, warnings = design_checks.check(args.experiment, args.set, out_root, committed)
    for line in notes:
        print(f"  {line}")
    for line in warnings:
        print(f"warning: {line}")
    try:
        sweep.check_corpus(todo, out_root)
    except ConfigError as e:  # a dry run only looks: say what training here would meet
        print(f"warning: training here would stop: {e}")
    return 0


def _preflight(args: argparse.Namespace, todo: list, out_root: Path, pins: list | None) -> list | None:
    """The checks before anything compiles: the corpus, runs wider than a slot, and every GPU a run will see
    (the local slots, or the Ray cluster's); returns the slots that passed."""
    from scaling.study.sweeps import devices, sweep

    sweep.check_corpus(todo, out_root)
    if args.executor == "local":  # fresh runs wider than a slot: refused once, before take-off
        slot = len(pins[0]["CUDA_VISIBLE_DEVICES"].split(",")) if pins else None
        devices.check_parallel([(s.config, s.out_dir(out_root)) for s in todo], slot)
    if pins:  # GPU take-off, before anything compiles: each slot probed as its runs will see it
        pins = devices.check_gpu_slots(pins, sweep.worker_env, devices.check_gpu_pins)  # every GPU of a slot
    if args.executor == "ray" and args.gpus_per_run > 0:  # the same on every GPU of the Ray cluster
        devices.check_ray_gpus(int(sweep.start_ray(args.ray_address, args.gpus_per_run)), sweep.worker_env)
    return pins


def _run_rounds(args: argparse.Namespace, specs: list, todo: list, out_root: Path, committed: Summary, name: str,
                pins: list | None) -> tuple[dict[str, int], list[dict]]:
    """Take off and run `todo`, then each round of replicates the landed minima call for: (counts by
    outcome over every round, the slow runs)."""
    from scaling.study.sweeps import sweep, takeoff

    counts: dict[str, int] = {}
    slow: list[dict] = []
    while todo:  # a design with replicates: the runs its landed minima call for come in the next round
        lanes = takeoff.takeoff_lanes(args.workers or 1, pins) if args.executor == "local" else 1
        todo, flights = takeoff.take_off(todo, out_root, keep_going=args.keep_going, hang_timeout=args.hang_timeout,
                                         lanes=lanes, pins=pins, echo=print)
        print(f"take-off: {len(flights)} shapes compiled and trained {takeoff.TAKEOFF_STEPS} steps; "
              f"{len(todo)} runs cleared, measured ETA {takeoff.measured_seconds(todo, flights, lanes) / 60:.1f} min")
        pack_keys = takeoff.pack_probe(todo, out_root, pins[0] if pins else {}, echo=print) if args.pack > 1 else set()
        report = sweep.run_sweep(todo, out_root, executor=args.executor,
                                 workers=1 if args.workers is None else args.workers,
                                 hang_timeout=args.hang_timeout, ray_address=args.ray_address,
                                 cpus_per_run=args.cpus_per_run, gpus_per_run=args.gpus_per_run, gpu_pins=pins,
                                 progress=not args.no_progress,
                                 on_landed=lambda: committed.update(out_root / name),
                                 pack=args.pack, pack_keys=pack_keys)
        for key, n in report["counts"].items():
            counts[key] = counts.get(key, 0) + n
        slow += report["slow_runs"]
        tried = {s.run_id for s in specs}
        specs = sweep.expand(args.experiment, args.set, landed=out_root, summary=committed)
        todo = [s for s in _todo(specs, out_root, committed) if s.run_id not in tried]
        if todo:
            print(f"replicates: {len(todo)} runs at the landed IsoFLOP minima and their neighbours")
    return counts, slow


def _main(args: argparse.Namespace) -> int:
    from scaling.study.sweeps import sweep
    from scaling.study.sweeps.summary import Summary

    _check_options(args)
    pins = _gpu_pins(args)
    if args.gpus_per_run > 1 and not _sets_parallel_data(args):
        args.set = [*args.set, f"parallel.data={round(args.gpus_per_run)}"]  # a layout: the run ids stay
    out_root = Path(args.out)
    name = sweep.experiment_points(args.experiment, args.set)[0]
    pinned = sweep.pinned_corpus(args.experiment, args.set)
    committed = Summary(Path(args.summary), {name: pinned}) if args.summary else Summary.of(out_root, name, {name: pinned})
    specs = sweep.expand(args.experiment, args.set, landed=out_root, summary=committed)
    todo = _todo(specs, out_root, committed)
    _print_reused(committed, specs, pinned)
    _print_eta(args, specs, todo, out_root, pins)
    if args.dry_run:
        return _dry_run(args, specs, todo, out_root, committed)
    pins = _preflight(args, todo, out_root, pins)
    counts, slow = _run_rounds(args, specs, todo, out_root, committed, name, pins)
    print("landed: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    for run in slow:
        print(f"slow run {run['run_id']}: {run['tokens_per_s']:.0f} tokens/s vs peer median "
              f"{run['peer_median']:.0f}")
    return 0 if counts.get("failed", 0) == counts.get("hung", 0) == 0 else 1
