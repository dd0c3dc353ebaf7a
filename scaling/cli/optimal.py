"""`scaling optimal FIT --compute C`: the compute-optimal (N, D, P) of a fitted law
(scaling.study.optimal), with its bootstrap CI and its range across cost models, under the verdict
`scaling plan --fit` prints too (scaling.study.optimum_check): "no optimum: <reasons>" instead of an
optimum (exit 0) where none exists, and "extrapolated: ..." where it lies outside the trained runs."""

from __future__ import annotations

import argparse
import sys
import json
from typing import TYPE_CHECKING, Sequence

from scaling.cli._names import COST_MODELS

if TYPE_CHECKING:
    import pandas as pd


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("fit", metavar="FIT", help="fit JSON written by `scaling fit`")
    parser.add_argument("--compute", type=float, required=True, help="training compute in 16-bit FLOP units under --cost-model, e.g. 1e18")
    parser.add_argument("--precisions", type=float, nargs="+", default=None,
                        help="bit widths to choose from (default: continuous P in 2..32)")
    parser.add_argument("--cost-model", default="bits", help=f"one of {', '.join(COST_MODELS)} "
                        "(default bits: each FLOP at its operands' bits / 16; a GPU: at that GPU's rate for the format)")
    parser.add_argument("--overhead", type=float, default=0.0, help="scale bits per element (MX: 0.25, NVFP4: 0.5)")
    parser.add_argument("--ci-samples", type=int, default=200,
                        help="bootstrap resamples used for the CI of the optimum when the fit has them (0: skip)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (exists, reasons, extrapolated, cost_model, P, P_ci, P_range, N, D, law, ...)")


def _table(df: pd.DataFrame, columns: Sequence[str]) -> str:
    fmt = {"P": "{:.3g}", "N": "{:.4g}", "D": "{:.4g}", "loss": "{:.5f}", "ebits": "{:.0f}", "mbits": "{:.0f}",
           "N/N_best": "{:.3g}"}
    cells = [[fmt.get(c, "{}").format(v) for c, v in zip(columns, row)] for row in df[list(columns)].itertuples(index=False)]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from scaling.study.fit import FitResult
    from scaling.study.optimal import (Cost, cost_models, optimal_precision, optimal_precision_ci, shape_of,
                                       specification_range)
    from scaling.study.optimum_check import describe, verdict

    fit = FitResult.from_json(args.fit)
    cost = Cost(model=args.cost_model, shape=shape_of(fit), overhead=args.overhead)
    header = f"law {fit.law}, compute {args.compute:.3g} in 16-bit FLOP units under cost model: {cost.name}"
    check = verdict(fit, cost=cost)
    if not check["exists"]:  # the same refusal as REPORT's P* and `scaling plan --fit`: no numbers at all
        if args.json:
            print(json.dumps({**check, "P": None, "P_ci": None, "P_range": None, "N": None, "D": None, "loss": None,
                              "compute": args.compute, "law": fit.law}, indent=2))
        else:
            print("\n".join([header, *describe(check)]))
        return 0
    p_range = (2.0, 32.0)
    best = optimal_precision(fit, args.compute, args.precisions, cost=cost, p_range=p_range)
    check = verdict(fit, best, cost)
    ci = None
    if fit.bootstrap and args.ci_samples > 0:  # the slow part (minutes at the default): say so on stderr
        print(f"the optimum's CI over up to {args.ci_samples} bootstrap resamples, then P* under each cost model "
              "(--ci-samples 0 skips the CI)...", file=sys.stderr, flush=True)
        ci = optimal_precision_ci(fit, args.compute, args.precisions, cost=cost, p_range=p_range,
                                  max_samples=args.ci_samples)
    spec = specification_range([(fit.law, fit)], args.compute, cost_models(fit), p_range=p_range)
    if args.json:
        out = {**check, "P": best["P"], "P_ci": list(ci["P"]) if ci else None, "P_range": spec["P_range"],
               "N": best["N"], "D": best["D"], "loss": best["loss"], "compute": args.compute, "law": fit.law,
               "specifications": spec["table"], "per_precision": best["per_precision"].to_dict("records")}
        print(json.dumps(out, indent=2))
        return 0
    table = best["per_precision"].copy()
    table["N/N_best"] = table["N"] / best["N"]
    cols = [c for c in ("P", "ebits", "mbits", "N", "D", "loss", "N/N_best") if c in table.columns]
    print(header)
    print(_table(table, cols))
    print(f"optimum: P = {best['P']:.3g} bits, N = {best['N']:.4g}, D = {best['D']:.4g}, loss = {best['loss']:.5f}")
    for line in describe(check):
        print(line)
    if ci:
        print(f"{ci['level']:.0%} bootstrap CI ({len(ci['samples'])} resamples, this law and cost model only): "
              + ", ".join(f"{q} [{ci[q][0]:.4g}, {ci[q][1]:.4g}]" for q in ("P", "N", "D", "loss")))
    if spec["P_range"]:
        print(f"P* across cost models ({'; '.join(c.name for c in cost_models(fit))}): "
              f"{spec['P_range'][0]:.3g}-{spec['P_range'][1]:.3g} bits; across laws and exponents: see `scaling figures` findings.json")
    return 0
