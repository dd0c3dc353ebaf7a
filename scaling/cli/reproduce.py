"""`scaling reproduce [--preset quick|full] [--out DIR]`: the main job end to end (scaling.study.reproduce)."""

from __future__ import annotations

import argparse
from pathlib import Path

from scaling.errors import ConfigError
from scaling.study.presets import STUDY_PRESETS, WORKERS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="quick", help=f"one of {', '.join(STUDY_PRESETS)} (default quick)")
    parser.add_argument("-o", "--out", default=None, help="output directory (default runs/<preset>)")
    parser.add_argument("--bootstrap", type=int, default=100, help="bootstrap resamples for the CIs (default 100)")
    parser.add_argument("--workers", type=int, default=WORKERS, help=f"concurrent runs (default min(4, CPUs) = {WORKERS})")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar: one line per landed run instead")


def main(args: argparse.Namespace) -> int:
    from scaling.study.reproduce import reproduce

    if args.bootstrap < 0:
        raise ConfigError("--bootstrap", args.bootstrap, "a count >= 0")
    if args.workers < 0:
        raise ConfigError("--workers", args.workers, "an integer >= 0")
    reproduce(args.preset, args.out or Path("runs") / args.preset, bootstrap=args.bootstrap,
              workers=args.workers, progress=not args.no_progress, echo=print)
    return 0
