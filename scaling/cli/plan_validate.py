"""`scaling plan validate`: the step model against the published runs of scaling/plan/step_cases.json
(scaling.plan.stepvalidate): one row per case (measured and predicted step time and memory, error, role),
then the errors by GPU generation, role and family; `--calibrate` first refits the efficiency constants
per generation on the calibration cases and prints them for scaling/plan/efficiency.py."""

from __future__ import annotations

import argparse

from scaling.plan import stepvalidate
from scaling.plan.efficiency import EFFICIENCY


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "The step model against published measurements: per-case errors and the calibration of its constants."
    parser.add_argument("--calibrate", action="store_true", help="refit EFFICIENCY on the calibration cases")


def main(args: argparse.Namespace) -> int:
    cases = stepvalidate.load_cases()
    effs = dict(EFFICIENCY)
    if args.calibrate:
        effs.update(stepvalidate.calibrate_all(cases))
        for g, e in effs.items():
            print(f'    "{g}": {e},')
    checks = [stepvalidate.check(c, effs[stepvalidate.generation(c)]) for c in cases]
    print(stepvalidate.table(checks))
    for line in stepvalidate.summary(checks):
        print(line)
    return 0
