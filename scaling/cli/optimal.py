"""`scaling optimal FIT --compute C`: the compute-optimal (N, D, P) of a fitted law
(scaling.study.analysis.pstar.optimal), with its bootstrap CI and its range across cost models, under the optimum
check `scaling plan --fit` prints too (scaling.study.analysis.pstar.optimum_check): "no optimum: <reasons>" instead of an
optimum (exit 0) where none exists, and "extrapolated: ..." where it lies outside the trained runs.

Then the profile (scaling.study.analysis.pstar.profile): the law's loss at each format real chips run (or --formats),
with bootstrap CIs, whether the law's error can tell each from the lowest (no P(best): the bootstrap holds
the law's parameter noise only), family-wise CIs of each neighbour difference and their directions, formats
the fit never saw trained flagged, and a continuous P* only where the law and data support one. Where no optimum exists
there is no profile either (its CIs would rest on the same too-few runs)."""

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
    parser.add_argument("--formats", nargs="+", default=None, metavar="FORMAT",
                        help="formats for the profile: names (nvfp4, mxfp4, 'mxfp6 e2m3', bf16, ...) or FORMAT[:GRANULARITY] "
                             "(e.g. e3m4:mx, fp8_e4m3:tensor); default: the formats real chips run")
    parser.add_argument("--results", default=None, metavar="CSV",
                        help="the fitted runs (results CSV): formats not among them are flagged untrained "
                             "(without it only the trained ranges the fit records are checked)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (exists, reasons, extrapolated, cost_model, P, P_ci, P_range, N, D, law, profile, ...)")


def _table(df: pd.DataFrame, columns: Sequence[str]) -> str:
    fmt = {"P": "{:.3g}", "N": "{:.4g}", "D": "{:.4g}", "loss": "{:.5f}", "ebits": "{:.0f}", "mbits": "{:.0f}",
           "N/N_best": "{:.3g}"}
    cells = [[fmt.get(c, "{}").format(v) for c, v in zip(columns, row)] for row in df[list(columns)].itertuples(index=False)]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from scaling.study.analysis.fit import FitResult
    from scaling.study.analysis.pstar.optimal import (Cost, cost_models, optimal_precision, optimal_precision_ci,
        share_of, specification_range)
    from scaling.study.analysis.pstar.optimum_check import check as check_optimum, describe
    from scaling.study.analysis import laws
    from scaling.study.analysis.pstar.profile import precision_profile

    fit = FitResult.from_json(args.fit)
    cost = Cost(model=args.cost_model, share=share_of(fit), overhead=args.overhead)
    header = f"law {fit.law}, compute {args.compute:.3g} in 16-bit FLOP units under cost model: {cost.name}"
    check = check_optimum(fit, cost=cost)
    if not check["exists"]:  # the same refusal as REPORT's P* and `scaling plan --fit`: no numbers at all
        if args.json:
            print(json.dumps({**check, "P": None, "P_ci": None, "P_range": None, "N": None, "D": None, "loss": None,
                              "compute": args.compute, "law": fit.law, "profile": None}, indent=2))
        else:
            print("\n".join([header, *describe(check)]))
        return 0
    if not laws.get(fit.law).bits_axis:
        return _recipe_ranking(fit, args, cost, check, header)
    p_range = (2.0, 32.0)
    best = optimal_precision(fit, args.compute, args.precisions, cost=cost, p_range=p_range)
    check = check_optimum(fit, best, cost)
    ci = None
    if fit.bootstrap and args.ci_samples > 0:  # the slow part (minutes at the default): say so on stderr
        print(f"the optimum's CI over up to {args.ci_samples} bootstrap resamples, then P* under each cost model "
              "(--ci-samples 0 skips the CI)...", file=sys.stderr, flush=True)
        ci = optimal_precision_ci(fit, args.compute, args.precisions, cost=cost, p_range=p_range,
                                  max_samples=args.ci_samples)
    spec = specification_range([(fit.law, fit)], args.compute, cost_models(fit), p_range=p_range)
    trained = None
    if args.results:
        import pandas as pd

        trained = pd.read_csv(args.results)
    prof = precision_profile(fit, args.compute, args.formats, cost, trained=trained, max_samples=args.ci_samples,
                             p_range=p_range)
    if args.json:
        out = {**check, "P": best["P"], "P_ci": list(ci["P"]) if ci else None, "P_range": spec["P_range"],
               "N": best["N"], "D": best["D"], "loss": best["loss"], "compute": args.compute, "law": fit.law,
               "specifications": spec["table"], "per_precision": best["per_precision"].to_dict("records"),
               "profile": prof}
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
    print("\n".join(profile_lines(prof)))
    return 0


def _recipe_ranking(fit, args: argparse.Namespace, cost, check: dict, header: str) -> int:
    """A law without a bits axis (quantisation errors, an efficiency per recipe) has no loss at a
    hypothetical P: it ranks the measured recipes (findings.recipe_optima), each at its own errors or
    efficiency and bits, from the runs in --results."""
    from scaling.errors import ConfigError
    from scaling.study.analysis import laws
    from scaling.study.analysis.isoflop import ok_rows
    from scaling.study.analysis.findings import recipe_optima
    from scaling.study.analysis.pstar.optimum_check import describe
    from scaling.study.analysis.pstar.profile import precision_profile
    from scaling.study.sweeps.results import load
    from scaling.train import compute as compute_lib

    axis = laws.get(fit.law).precision_axis
    if args.results is None:
        raise ConfigError("--results", None, f"the runs law {fit.law} was fitted on: it reads precision as "
                          f"{'no term at all' if axis is None else axis}, not bits, so it has no P* and ranks the "
                          "measured recipes at their own " + ("efficiency" if axis == "recipe" else "errors"))
    trained = load(args.results)
    ranked = recipe_optima(ok_rows(trained), fit, args.compute, cost, compute_lib.get(args.cost_model))
    if not ranked:
        raise ConfigError("--results", args.results, f"runs of the recipes law {fit.law} was fitted on, with their "
                          f"{'quantisation errors' if axis == 'quantisation error' else 'recipe'} columns")
    # the profile over the formats chips run: another law's where the fit's selection stored one
    # (profile.profile_source), otherwise none, saying why
    prof = precision_profile(fit, args.compute, args.formats, cost, trained=trained, max_samples=args.ci_samples)
    if args.json:
        print(json.dumps({**check, "P": None, "P_ci": None, "P_range": None, "N": ranked[0]["N"], "D": ranked[0]["D"],
                          "loss": ranked[0]["loss"], "compute": args.compute, "law": fit.law, "recipes": ranked,
                          "profile": prof, "no_bits_axis": axis}, indent=2))
        return 0
    print(header)
    print(f"no P*: law {fit.law} reads precision as {axis}, not bits; the measured recipes ranked, each at its "
          "compute-optimal N (bits: the recipe's effective bits, as the cost's P)")
    import pandas as pd

    table = pd.DataFrame([{"recipe": r["recipe"], "bits": f"{r['bits']:.3g}", "N": r["N"], "D": r["D"], "loss": r["loss"],
                           "within the law's error of the lowest": {None: "-", True: "yes", False: "no"}[r["within_law_error_of_best"]]}
                          for r in ranked])
    print(_table(table, list(table.columns)))
    for line in describe(check):
        print(line)
    print("\n".join(profile_lines(prof)))
    return 0


def profile_lines(prof: dict) -> list[str]:
    """The profile as text: one row per format (loss, CI, whether the law's error can tell it from the lowest,
    untrained flag), then each neighbour difference with its family-wise CI and direction, then the continuous
    P* or why there is none. No P(best): the bootstrap resamples hold the law's parameter noise, not its error."""
    from scaling.study.analysis.pstar.profile import direction

    if prof.get("no_bits_axis"):
        return [f"profile: none: {prof['no_bits_axis']}"]
    lines = [f"profile drawn from another law: {prof['drawn_from']}"] if prof.get("drawn_from") else []
    lines += [f"profile: the law's loss at each format's compute-optimal N ({prof['cost_model']}, each format's scale "
             f"bits counted; {prof['resamples']} bootstrap resamples, {prof['level']:.0%} CIs)"]
    error = prof.get("law_error")
    head = ("format", "bits/el", "E", "M", "block", "N", "loss", "CI",
            f"within {error:.1%} of lowest" if error is not None else "within error of lowest", "trained")
    cells = []
    for r in prof["rows"]:
        ci = f"[{r['loss_ci'][0]:.4f}, {r['loss_ci'][1]:.4f}]" if r["loss_ci"] else "-"
        cells.append((r["name"], f"{r['bits_per_element']:.3g}", f"{r['ebits']:g}", f"{r['mbits']:g}",
                      "-" if r["block"] is None else f"{r['block']:.4g}", f"{r['N']:.3g}", f"{r['loss']:.4f}", ci,
                      {None: "-", True: "yes", False: "no"}[r.get("within_law_error_of_best")],
                      "UNTRAINED: " + "; ".join(r["untrained_reasons"]) if r["untrained"] else "yes"))
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip())
    lines += ["  ".join(v.ljust(w) for v, w in zip(c, widths)).rstrip() for c in cells]
    if not prof["trained_formats_known"]:
        lines.append("(untrained: checked against the trained ranges the fit records only; --results names the runs)")
    if prof["pairs"]:
        fam = f"family-wise {prof['level']:.0%} over {len(prof['pairs'])} pairs" if prof["family_level"] else ""
        lines.append(f"neighbours (next minus this, {fam or 'no CI'}):")
        for p in prof["pairs"]:
            ci = f" [{p['ci'][0]:+.4f}, {p['ci'][1]:+.4f}]" if p["ci"] else ""
            noise = " (within the law's held-out error)" if p["within_law_error"] else ""
            lines.append(f"  {p['to']} - {p['from']}: {p['diff']:+.4f}{ci} {direction(p)}{noise}")
    ps = prof["pstar"]
    if ps.get("P") is not None:
        ci = f", CI [{ps['ci'][0]:.3g}, {ps['ci'][1]:.3g}] ({ps['interior_share']:.0%} of resamples inside the trained bits)" \
            if ps.get("ci") else ""
        lines.append(f"continuous P* = {ps['P']:.3g} bits{ci}")
    else:
        lines.append(f"continuous P*: none: {ps['reason']}")
    return lines
