"""Regenerate every figure and REPORT.md from committed results and fits alone (no training).

    python paper_figures/make_figures.py
    python paper_figures/make_figures.py --results results/quick.csv --curves results/quick_curves.parquet \
        --fit fits/quick.json --out /tmp/quick_figures

The defaults are the committed reference study (`scaling reproduce --preset full --out .`):
results/isoflop.csv (the IsoFLOP design plus the granularity and outlier sweeps), its curves and
fits/isoflop.json, the held-out budget's prediction (results/isoflop_prediction.json) once made, its
post-hoc re-prediction (results/isoflop_prediction_posthoc.json) if one was made, and the study's own
sections (paper_figures/reference_study.py: the FP4 and integer arms, runs trained again on another
kind of host from results/isoflop_hosts.csv, the GPU pilot from results/gpu_pilot.csv).

Same as `scaling figures` with the committed files as defaults. Without curves or a fit, the figures
that need them are listed as skipped in REPORT.md; missing results, or any malformed input, is an
error (exit code 2). Writing into the committed paper_figures/ also rewrites README.md's findings block
from the new findings.json (paper_figures/readme.py); `--readme-only` rewrites just that block from the
committed findings.json, without making figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a fresh clone without installing the package

import readme  # noqa: E402  (paper_figures/readme.py: this study's README block)
from scaling.cli import figures  # noqa: E402
from scaling.study.report import schema  # noqa: E402
from scaling._io import atomic_write_text  # noqa: E402
from scaling.errors import ConfigError  # noqa: E402

README = ROOT / "README.md"

DEFAULTS = {
    "results": ROOT / "results" / "isoflop.csv",
    "curves": ROOT / "results" / "isoflop_curves.parquet",
    "fit": ROOT / "fits" / "isoflop.json",
    "prediction": ROOT / "results" / "isoflop_prediction.json",
    "posthoc_prediction": ROOT / "results" / "isoflop_prediction_posthoc.json",
    "sections": ROOT / "paper_figures" / "reference_study.py",
    "out": ROOT / "paper_figures",
}


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """`scaling figures`' arguments with the committed reference study as defaults."""
    parser = argparse.ArgumentParser(prog="make_figures.py", description=__doc__.splitlines()[0])
    figures.add_arguments(parser)
    parser.set_defaults(results=str(DEFAULTS["results"]), out=str(DEFAULTS["out"]),
                        curves=str(DEFAULTS["curves"]) if DEFAULTS["curves"].exists() else None,
                        fit=str(DEFAULTS["fit"]) if DEFAULTS["fit"].exists() else None,
                        prediction=str(DEFAULTS["prediction"]) if DEFAULTS["prediction"].exists() else None,
                        posthoc_prediction=(str(DEFAULTS["posthoc_prediction"])
                                            if DEFAULTS["posthoc_prediction"].exists() else None),
                        sections=[str(DEFAULTS["sections"])])
    parser.add_argument("--readme-only", action="store_true",
                        help="only rewrite README.md's findings block from the committed paper_figures/findings.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    try:
        code = 0 if args.readme_only else figures.main(args)
        if code == 0 and (args.readme_only or Path(args.out).resolve() == DEFAULTS["out"].resolve()):
            write_readme_findings(DEFAULTS["out"] / "findings.json")
        return code
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def write_readme_findings(findings_path: Path) -> None:
    """README.md's findings block from `findings_path` (checked against its schema: another version is a
    ConfigError); the file is rewritten only if the block changed."""
    findings = schema.load(findings_path).to_json()
    text = README.read_text(encoding="utf-8")
    new = readme.with_findings(text, readme.findings_markdown(findings))
    if new != text:
        atomic_write_text(README, new)
        print(f"wrote {README}'s findings block")


if __name__ == "__main__":
    sys.exit(main())
