"""`scaling figures`: regenerate every figure, REPORT.md and findings.json from results and a fitted law
(scaling.study.report; no training). paper_figures/make_figures.py is this verb with the committed files
as defaults."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from scaling.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Regenerate every figure and REPORT.md from results and a fitted law (no training). "
                          "Example: scaling figures --results results/isoflop.csv --curves results/isoflop_curves.parquet "
                          "--fit fits/isoflop.json --out paper_figures/")
    parser.add_argument("--results", help="results directory, or a committed .csv / .parquet summary (required)")
    parser.add_argument("--curves", help="per-step curves: a results directory with metrics.jsonl, or a .csv / .parquet "
                        "(default: the --results directory's own metrics.jsonl files, or the sweep's NAME_curves.parquet "
                        "beside a NAME.csv)")
    parser.add_argument("--fit", help="fitted law JSON (fits/NAME.json); without it figures 1-3 are skipped")
    parser.add_argument("--compute", nargs="+", help="compute budgets C in 16-bit FLOPs (default: from the results)")
    parser.add_argument("--prediction", help="a held-out budget's prediction JSON (`scaling predict`): REPORT sets "
                        "it against what that budget measured")
    parser.add_argument("--posthoc-prediction", help="the same budget predicted again after its runs existed "
                        "(`scaling predict`, say on lower budgets retrained on its corpus): REPORT scores it beside "
                        "--prediction, labelled post hoc")
    parser.add_argument("--sections", action="append", default=[], metavar="FILE.py",
                        help="a study's own REPORT sections: a Python file defining sections(results_path) -> "
                        "[scaling.study.report.Section] and optionally PAIRS, recipe contrasts to bootstrap "
                        "(repeatable; e.g. paper_figures/reference_study.py)")
    parser.add_argument("-o", "--out", default="paper_figures", help="output directory for the figures and REPORT.md")


def main(args: argparse.Namespace) -> int:
    from scaling.study.sweeps import curves as curves_lib
    from scaling.study.analysis.prediction import predict
    from scaling.study.sweeps import results as results_lib
    from scaling._io import check_writable_dir
    from scaling.study.report.writer import load_fit, load_sections, write_report
    from scaling.study.sweeps.summary import Summary

    if not args.results:
        raise ConfigError("results", args.results, "a results directory, .csv or .parquet (--results)")
    check_writable_dir("--out", args.out)
    results = results_lib.load(args.results)
    curves, beside = None, Summary(Path(args.results)).curves_path  # a sweep's summary: its curves sit beside it
    if args.curves:
        if not Path(args.curves).exists():
            raise ConfigError("curves", args.curves, "an existing results directory, .csv or .parquet")
        curves = curves_lib.load_curves(args.curves)
    elif Path(args.results).is_dir():  # run directories carry their own metrics.jsonl
        curves = curves_lib.load_curves(args.results)
        curves = curves if not curves.empty else None
    elif beside.is_file():
        curves = curves_lib.load_curves(beside)
        print(f"curves: {beside} (beside --results)")
    fit = load_fit(args.fit) if args.fit else None
    computes = None
    if args.compute:
        computes = []
        for text in args.compute:
            try:
                value = float(text)
            except ValueError:
                value = float("nan")
            if not (math.isfinite(value) and value > 0):
                raise ConfigError("compute", text, "a positive number of FLOPs, e.g. 1e18")
            computes.append(value)
    prediction = predict.load(args.prediction) if args.prediction else None
    posthoc = predict.load(args.posthoc_prediction) if args.posthoc_prediction else None
    sections, pairs = [], []
    for module in map(load_sections, args.sections):
        sections += list(module.sections(args.results))
        pairs += list(getattr(module, "PAIRS", ()))
    path = write_report(results, fit, args.out, curves=curves, compute=computes, prediction=prediction,
                        posthoc=posthoc, sections=sections, pairs=pairs, echo=print)
    print(f"wrote {path}")
    return 0

