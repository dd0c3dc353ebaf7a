"""`scaling fit RESULTS -o fits/NAME.json`: fit one law (scaling.study.analysis.fit), or with `--law auto`
choose among candidate laws by held-out precision gaps (scaling.study.analysis.selection), and print the table."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from scaling.cli._names import LAWS
from scaling.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

    from scaling.study.analysis.fit import FitResult


def _runs_to_fit(df: pd.DataFrame, loss_column: str | None) -> tuple[pd.DataFrame, str]:
    """Only runs that landed (`status` ok, if present), checked (results.checked); loss column: given, else
    `loss`, else `val_loss`."""
    if "status" in df.columns:
        landed = df.drop_duplicates("run_id")["status"] if "run_id" in df.columns else df["status"]
        df = df[df["status"] == "ok"]
        if df.empty:
            counts = ", ".join(f"{s} {n}" for s, n in landed.value_counts().items())
            raise ConfigError("results", f"{len(landed)} runs, none ok ({counts})",
                              "runs that landed ok (each failed run's failure.json says why)")
    if loss_column is None:
        loss_column = next((c for c in ("loss", "val_loss") if c in df.columns), None)
        if loss_column is None:
            raise ConfigError("--loss-column", None, "a loss column to fit: the table has neither loss nor val_loss")
    from scaling.study.sweeps.results import checked  # conflicting or non-finite losses: one line, as predict refuses them

    return checked(df.reset_index(drop=True), loss_column), loss_column


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", metavar="RESULTS", help="results .csv / .parquet file or results directory")
    parser.add_argument("--law", default="kumar",
                        help=f"law to fit: {', '.join(LAWS)} (default kumar), or auto: fit every candidate and keep "
                             "the one that best predicts held-out precision gaps (scaling.study.analysis.selection.select_law)")
    parser.add_argument("--candidate", action="append", default=[], metavar="LAW[VARIANT]",
                        help="with --law auto: a candidate (repeatable), e.g. kumar or 'kumar[kappa free]'; "
                             "default: every law, plus each with its fixed params freed")
    parser.add_argument("--reference", default=None, metavar="RECIPE",
                        help="with --law auto: the high-precision reference recipe (default: the rows with the largest P)")
    parser.add_argument("--sweep", default=None, help="fit only the rows of this sweep (a multi-sweep table's `sweep` column)")
    parser.add_argument("-o", "--out", required=True, help="where to write the fit JSON, e.g. fits/NAME.json")
    parser.add_argument("--bootstrap", type=int, default=0, metavar="N", help="bootstrap resamples for CIs (e.g. 1000)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    parser.add_argument("--loss-column", default=None, help="loss column (default: loss, else val_loss)")
    parser.add_argument("--fix", action="append", default=[], metavar="NAME=VALUE",
                        help="hold a param fixed (repeatable); default: the law's (kumar: kappa=3); --fix none frees all")
    parser.add_argument("--holdout", choices=["N", "compute"], default=None,
                        help="also record the held-out error (fit on the smaller 80%% by N or compute)")


def _parse_fixed(items: Sequence[str]) -> dict[str, float] | None:
    if not items:
        return None
    if items == ["none"]:
        return {}
    fixed = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            fixed[name] = float(value)
        except ValueError:
            raise ConfigError("--fix", item, "NAME=VALUE with a number, or none") from None
    return fixed


def _print_fit(result: FitResult) -> None:
    from scaling.study.analysis.fit import exponent_note

    width = max(len(k) for k in result.params)
    print(f"law {result.law}: {result.data.get('n_points')} points, objective {result.objective:.6g}")
    header = f"  {'param':<{width}}  {'value':>12}"
    if result.ci:
        header += f"  {'ci lo':>12}  {'ci hi':>12}"
    print(header)
    for k, v in result.params.items():
        line = f"  {k:<{width}}  {v:>12.5g}"
        if k in result.ci:
            line += f"  {result.ci[k][0]:>12.5g}  {result.ci[k][1]:>12.5g}"
        elif k in result.fixed:
            line += "  (fixed)"
        print(line)
    if result.heldout:
        print(f"  held-out (by {result.heldout['by']}): mean abs rel error {result.heldout['mare']:.4%}")
    if result.degenerate:
        print(f"  DEGENERATE: {result.degenerate}; `scaling optimal` and `scaling plan --fit` refuse this fit")
    note = exponent_note(result)
    if note:
        print(f"  note: {note}; not extrapolated to cluster scale in the report")


def _print_selection(law_choice: Mapping[str, Any]) -> None:
    """One line per candidate law: the chosen one starred, unfittable ones with the reason; then why the
    starred law is chosen where another has a lower held-out error, and what `-` means."""
    ref = law_choice["reference"]
    splits = law_choice.get("splits") or []
    print(f"law selection: held-out precision-gap MAE (nats) vs the reference ({', '.join(ref.get('recipes', [])) or ref}), "
          f"one column per held-out split (every row at or beyond its threshold left out), score = their mean; vs chosen: excess over the chosen law, "
          f"SE clustered by {law_choice.get('clustered_by', 'recipe')}; within noise: score <= best + {law_choice['noise_se']:g} SE of the best")
    labels = {"budget": "gap|C", "compute": "gap|C", "N": "gap|N", "D/N": "gap|D/N"}
    cols = [by for by in ("budget", "compute", "N", "D/N")
            if any(by in (c.get("heldout_gap_mae") or {}) for c in law_choice["candidates"])]
    width = max(len(c["name"]) for c in law_choice["candidates"])
    print(f"  {'law':<{width}}  {'k':>2}  {'AIC(runs)':>10}  {'MARE':>7}" + "".join(f"  {labels[by]:>8}" for by in cols)
          + f"  {'score':>8}  {'vs chosen':>18}")

    def num(v, fmt):
        return format(v, fmt) if v is not None else "-"

    for c in law_choice["candidates"]:
        mark = "*" if c["name"] == law_choice["chosen"] else " "
        if not c["fittable"]:
            print(f"{mark} {c['name']:<{width}}  not fitted: {c['reason']}")
            continue
        gap, diff = c["heldout_gap_mae"], c["gap_mae_diff"]
        versus = "-" if diff is None else "chosen" if mark == "*" else \
            f"{diff['value']:+.4f} ± {num(diff['se'], '.4f')}"
        flags = [f for f, on in (("within noise", c["within_noise"] and mark != "*"),
                                 ("degenerate: not chosen", bool(c.get("degenerate")) and mark != "*"),
                                 ("degenerate, as every fitted law is", bool(c.get("degenerate")) and mark == "*")) if on]
        print(f"{mark} {c['name']:<{width}}  {c['n_params']:>2}  {num(c['aic'], '10.2f')}  {num(c['mare'], '7.3%')}"
              + "".join(f"  {num(gap.get(by), '8.4f')}" for by in cols)
              + f"  {num(c.get('score'), '8.4f')}  {versus:>18}" + (f"  {'; '.join(flags)}" if flags else ""))
    for line in _selection_notes(law_choice, splits):
        print(f"  {line}")


def _selection_notes(law_choice: Mapping[str, Any], splits: Sequence[str]) -> list[str]:
    """Footnotes: the precision test and nested tests, why the star is not on the lowest score, what `-` means."""
    out = []
    pt = law_choice.get("precision_test") or {}
    if pt.get("big"):
        p = pt.get("p_value")
        out.append(f"precision test: `{pt['big']}` vs `{pt['small']}`, held-out likelihood ratio {pt['loglik_ratio']:+.2f}, "
                   f"t = {num_or_dash(pt.get('statistic'), '.2f')}, one-sided p = {num_or_dash(p, '.3g')}, "
                   f"{pt['n_clusters']} (N, seed) clusters: {pt.get('verdict')}")
    elif pt.get("reason"):
        out.append(f"precision test: not made ({pt['reason']})")
    for t in law_choice.get("nested_tests") or []:
        out.append(f"nested test: `{t['big']}` vs `{t['small']}`, t = {num_or_dash(t.get('statistic'), '.2f')}, "
                   f"p = {num_or_dash(t.get('p_value'), '.3g')}: {'beats' if t['beats'] else 'does not beat'} it")
    scored = [c for c in law_choice["candidates"] if c.get("score") is not None]
    chosen = next((c for c in scored if c["name"] == law_choice["chosen"]), None)
    lower = [c for c in scored if chosen is not None and c["score"] < chosen["score"]]
    if lower:
        why = []
        degenerate = [c["name"] for c in lower if c.get("degenerate")]
        if degenerate:
            why.append(f"{', '.join(degenerate)}: degenerate full-data fit (no optimum may be derived from it)")
        rest = [c for c in lower if not c.get("degenerate")]
        more = [c["name"] for c in rest if c.get("within_noise") and c["n_params"] > chosen["n_params"]]
        tested = [c["name"] for c in rest if c["name"] not in more]
        if more:
            why.append(f"{', '.join(more)}: within noise of it with more params (the rule for laws within noise)")
        if tested:
            why.append(f"{', '.join(tested)}: not preferred by the precision / nested likelihood tests "
                       f"({law_choice.get('criterion', '')})")
        out.append("starred over a lower score: " + "; ".join(why))
    out.append("-: not measured (a split whose held-out gaps could not be scored for that law, see heldout_notes in "
               "the fit JSON; `vs chosen` - where no held-out error was measured)")
    short = {"budget": "gap|C", "compute": "gap|C", "N": "gap|N", "D/N": "gap|D/N"}
    for d in law_choice.get("split_details") or []:  # each split's rule in words (selection._strict_split)
        if d.get("by") in splits and d.get("label"):
            out.append(f"{short.get(d['by'], d['by'])}: {d['label']}, {d['scored_rows']} gaps scored")
    return out


def stability_line(law_choice: Mapping[str, Any]) -> str:
    """One line: each law's share of wins over the cluster resamples, and the rule for laws within noise."""
    shares = law_choice.get("stability")
    won = ", ".join(f"{name} {share:.0%}" for name, share in (shares or {}).items() if share > 0)
    head = (f"stability: {won} of {law_choice['stability_resamples']} resamples of {law_choice['stability_unit']}s"
            if shares else "stability: not measured (no held-out gaps to resample)")
    return f"{head}; within noise: {law_choice.get('rule', '-')}"


def num_or_dash(v: Any, fmt: str) -> str:
    return format(v, fmt) if v is not None else "-"


def main(args: argparse.Namespace) -> int:
    from scaling.study.sweeps import results
    from scaling.study.analysis import selection
    from scaling.study.analysis.fit import fit_law, holdout_error

    df = results.load(args.results)
    if args.sweep is not None:
        sweeps = sorted(df["sweep"].astype(str).unique()) if "sweep" in df.columns else []
        if args.sweep not in sweeps:
            raise ConfigError("--sweep", args.sweep, f"a sweep of the results ({', '.join(sweeps) or 'none recorded'})")
        df = df[df["sweep"].astype(str) == args.sweep]
    df, loss_column = _runs_to_fit(df, args.loss_column)
    if args.bootstrap < 0:
        raise ConfigError("--bootstrap", args.bootstrap, "a count >= 0")
    fixed = _parse_fixed(args.fix)
    if args.law == "auto":
        if fixed is not None:
            raise ConfigError("--fix", args.fix, "no --fix with --law auto (name a variant: --candidate 'kumar[kappa=2]')")
        law_choice, fits = selection.select(df, args.candidate or None, loss_column, args.reference, {})
        _print_selection(law_choice)
        if law_choice["chosen"] is None:
            raise ConfigError("--law", "auto", "data on which at least one candidate law can be fitted (see the table)")
        result = selection.chosen_fit(df, law_choice, fits, bootstrap=args.bootstrap, seed=args.seed,
                                      loss_column=loss_column)
        print(f"chosen: {law_choice['chosen']}, by {law_choice['criterion']}")
        print(stability_line(law_choice))
        if not law_choice.get("splits"):
            for by, why in (law_choice.get("split_notes") or {}).items():
                print(f"  held-out split {by}: {why}")
        law, fixed = result.law, result.fixed
    else:
        if args.candidate or args.reference:
            raise ConfigError("--candidate/--reference", args.candidate or args.reference, "only with --law auto")
        law = args.law
        result = fit_law(df, law, fixed=fixed, loss_column=loss_column, bootstrap=args.bootstrap, seed=args.seed)
    if args.holdout:
        result.heldout = holdout_error(df, law, by=args.holdout, fixed=fixed, loss_column=loss_column)
    result.to_json(args.out)
    _print_fit(result)
    print(f"wrote {args.out}")
    return 0
