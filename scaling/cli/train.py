"""`scaling train CONFIG.toml [--set key=value ...] [--out DIR]`: one run (scaling.train.loop.run).

One run across devices: `--set parallel.data=8` (and `parallel.fsdp=true`); across hosts, one process
per host with JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID set, or under a launcher
JAX detects (SLURM, Open MPI): scaling.train.parallel."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="run config (TOML); schema in scaling/train/config.py")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a dotted key, TOML value syntax (e.g. --set precision=fp4 --set train.lr=1e-3)")
    parser.add_argument("-o", "--out", help="run directory (default: runs/<name>/<run_id>)")


def main(args: argparse.Namespace) -> int:
    from scaling._io import check_writable_dir
    from scaling.train import config, loop, parallel  # JAX: only once a run is asked for, not for --help

    if args.out:
        check_writable_dir("--out", args.out)  # before JAX starts
    parallel.initialize()  # several hosts: jax.distributed from the environment, before JAX's backends start
    cfg = config.validate(config.load(args.config, args.set))
    out_dir = Path(args.out) if args.out else Path("runs") / cfg.name / cfg.run_id
    if not args.out:
        check_writable_dir("run directory", out_dir)
    previous = signal.signal(signal.SIGINT, _stop_at_the_next_step)
    try:
        summary = loop.run(cfg, out_dir, echo=print)
    except loop.Interrupted:
        again = " ".join(["scaling train", shlex.quote(args.config), *(f"--set {shlex.quote(s)}" for s in args.set),
                          "--out", shlex.quote(str(out_dir))])
        print(f"interrupted: resume with: {again}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGINT, previous)
        loop.STOP.clear()
    for e in summary["evals"]:
        print(f"D={e['D']:>10d}  val_loss={e['val_loss']:.4f}  train_loss={e['train_loss']:.4f}")
    print(f"{summary['status']}: N={summary['N']} P={summary['P']} recipe={summary['recipe']} "
          f"{summary['tokens_per_s']:.0f} tok/s, {summary['wall_s']:.1f} s -> {out_dir}")
    return 0 if summary["status"] == "ok" else 1


def _stop_at_the_next_step(signum, frame) -> None:
    """Ctrl-C: the run checkpoints at its next step and stops unlanded (loop.STOP); a second one stops at once."""
    from scaling.train import loop

    if loop.STOP.is_set():
        raise KeyboardInterrupt
    loop.STOP.set()
