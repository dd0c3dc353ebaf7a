"""Regenerate every figure and REPORT.md from committed results and fits alone (no training).

    python paper_figures/make_figures.py
    python paper_figures/make_figures.py --results results/ladder.csv --curves results/ladder_curves.parquet \
        --fit fits/ladder.json --out paper_figures/

The defaults are the committed reference study: the IsoFLOP study's files (results/isoflop.csv and
its curves, written as its runs land, and fits/isoflop.json, fitted once the sweep is complete) when
its fit exists, else the earlier ladder study's, else the quick preset's.

Same as `scaling figures` with the committed files as defaults. Without curves or a fit, the figures
that need them are listed as skipped in REPORT.md; missing results, or any malformed input, is an
error (exit code 2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a fresh clone without installing the package

from scaling import report  # noqa: E402
from scaling.errors import ConfigError  # noqa: E402

STUDY = next(name for name, ready in (("isoflop", (ROOT / "fits" / "isoflop.json").exists()),
                                      ("ladder", (ROOT / "results" / "ladder.csv").exists()), ("quick", True)) if ready)
DEFAULTS = {
    "results": ROOT / "results" / f"{STUDY}.csv",
    "curves": ROOT / "results" / f"{STUDY}_curves.parquet",
    "fit": ROOT / "fits" / f"{STUDY}.json",
    "out": ROOT / "paper_figures",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make_figures.py", description=__doc__.splitlines()[0])
    report.add_arguments(parser)
    parser.set_defaults(results=str(DEFAULTS["results"]), out=str(DEFAULTS["out"]),
                        curves=str(DEFAULTS["curves"]) if DEFAULTS["curves"].exists() else None,
                        fit=str(DEFAULTS["fit"]) if DEFAULTS["fit"].exists() else None)
    args = parser.parse_args(argv)
    try:
        return report.main(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
