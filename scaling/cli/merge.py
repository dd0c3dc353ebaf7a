"""`scaling merge SIDE.csv --into results/SWEEP.csv`: join a side summary into a sweep's committed one.

A held-out budget, or a recipe added after the rest had landed, trains into a summary of its own so the
committed analysis never sees a partial design (docs/experiments.md); once all its runs have landed, this
joins its rows and curves into the sweep's summary (scaling.study.sweeps.summary.Summary.merge). Run it again
after an interruption: a run both hold takes the side summary's rows, so a second merge changes nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scaling.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("side", help="the side summary (.csv; its curves beside it as <name>_curves.parquet)")
    parser.add_argument("--into", required=True, help="the sweep's committed summary (.csv), rewritten in place")


def main(args: argparse.Namespace) -> int:
    from scaling.study.sweeps.summary import Summary

    side, into = Path(args.side), Path(args.into)
    for key, path in (("side", side), ("--into", into)):
        if path.suffix != ".csv" or not path.is_file():
            raise ConfigError(key, str(path), "an existing summary .csv")
    if side.resolve() == into.resolve():
        raise ConfigError("--into", str(into), "another summary than the side one")
    added, replaced = Summary(into).merge(Summary(side))
    print(f"{into}: {added} runs added, {replaced} replaced from {side} (and their curves); "
          f"{side} is unchanged: remove it once the merge is committed")
    return 0
