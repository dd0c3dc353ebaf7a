"""`scaling predict`: predict before training.

`scaling predict HELDOUT.toml`: predict a held-out IsoFLOP budget before it is trained
(scaling.study.analysis.prediction.predict). The held-out experiment is an IsoFLOP design at a budget above every one the
results hold; its runs must not have landed yet (a prediction made after the data is not one). The laws
are fitted on the results of the same sweep, the prediction written as JSON for the history and the report.

`scaling predict --rows TABLE.csv --results RESULTS.csv [--law NAME] -o OUT.csv`: predict any runs
(scaling.study.analysis.prediction.table.predict_table): each row (N, D, recipe; the recipe must have runs in the
results; a `budget` column is not needed) gets the loss and interval of the predictor the results' own
backtests choose on CRPS (calibrate.choose: the calibrated one, unless the law's bootstrap or the law
shifted by the latest backtest's mean miss beats it on CRPS beyond chance), its gap to the reference recipe's row at the same (N, D)
and P(best) among those rows; OUT.json beside it holds the law, the choice and the calibration.

`scaling predict --backtest --results RESULTS.csv [--law NAME] -o OUT.json`: score the predictors on the
results' own backtests (scaling.study.analysis.prediction.calibrate.backtest_all): every pair of budgets
(fit the lower, score the higher) and every size threshold (fit the smaller N, score the larger), each
predictor calibrated only on the backtests inside its own fitted data, with coverage, CRPS and the 95%
interval score, and the winner. A study's report reads the JSON (paper_figures/reference_study.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scaling._io import check_writable_dir
from scaling.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", nargs="?", default=None,
                        help="the held-out IsoFLOP design (an experiment TOML with one budget); not with --rows")
    parser.add_argument("--rows", default=None,
                        help="a CSV of runs to predict (columns N, D, recipe): writes each row's loss with the "
                             "interval of the predictor that won the backtests to -o OUT.csv (needs --results)")
    parser.add_argument("--backtest", action="store_true",
                        help="score the predictors on the results' backtests along compute and N: writes -o OUT.json "
                             "(needs --results)")
    parser.add_argument("--law", default=None,
                        help="with --rows: the law to fit, e.g. sun or 'kumar[kappa free]' (default: chosen by "
                             "held-out precision gaps among --candidate)")
    parser.add_argument("--results", default=None,
                        help="the lower budgets' results (default results/<sweep>.csv of the experiment's sweep); "
                             "with --rows, the results the law is fitted and calibrated on")
    parser.add_argument("-o", "--out", default=None,
                        help="prediction JSON to write (default results/<sweep>_prediction.json; never overwritten); "
                             "with --rows, the CSV to write (and OUT.json beside it)")
    parser.add_argument("--bootstrap", type=int, default=50, help="resamples per law (runs resampled)")
    parser.add_argument("--candidate", action="append", default=[],
                        help="a law to choose among (repeatable; default every law)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")


def main(args: argparse.Namespace) -> int:
    if args.bootstrap < 0:
        raise ConfigError("--bootstrap", args.bootstrap, "an integer >= 0")
    if args.backtest:
        return _backtest(args)
    if args.rows is not None:
        return _rows(args)
    if args.experiment is None:
        raise ConfigError("experiment", None, "a held-out experiment TOML, or --rows TABLE.csv")
    if args.law is not None:
        raise ConfigError("--law", args.law, "only with --rows (a held-out design chooses among --candidate)")
    from scaling._io import atomic_write_json
    from scaling.study.analysis.prediction import predict
    from scaling.study.sweeps import results, sweep
    from scaling.study.sweeps.summary import Summary

    name, _, _, design = sweep.experiment_points(args.experiment)
    if design is None or len(design.budgets) != 1:
        raise ConfigError("experiment", args.experiment, "an IsoFLOP design ([isoflop]) with exactly one budget")
    budget = design.budgets[0]
    summary = Summary(Path(args.results)) if args.results else Summary.of("results", name)
    out = Path(args.out) if args.out else summary.path.with_name(f"{name}_prediction.json")
    if out.exists():
        raise ConfigError("--out", str(out), "a path with no prediction yet (a committed prediction is never replaced)")
    check_writable_dir("--out", out.parent)
    if not summary.path.is_file():
        raise ConfigError("--results", str(summary.path), "an existing results .csv or .parquet")
    specs = sweep.expand(args.experiment)
    held = {s.run_id for s in specs}
    rows = results.checked(results.load(summary.path))
    rows = rows[rows["sweep"] == name] if "sweep" in rows.columns else rows
    landed = held & set(rows["run_id"])
    if landed:
        raise ConfigError("experiment", args.experiment,
                          f"a design none of whose runs has landed ({len(landed)} of {len(held)} have: "
                          "a prediction must come before its data)")
    line = predict.design_line([s.config for s in specs], budget, sweep._vocab(sweep.experiment_points(args.experiment)[1]))
    found = predict.predict(rows, line, budget, cost=design.cost, bootstrap=args.bootstrap, seed=args.seed,
                            candidates=args.candidate or None)
    found = {"experiment": str(args.experiment), "results": str(summary.path), "design_runs": sorted(held), **found}
    atomic_write_json(out, found)
    print(f"C = {budget:g}: fitted on {found['fitted_on']['runs']} runs at {found['fitted_on']['budgets']}, "
          f"{len(found['laws'])} laws within noise, {found['draws']} draws")
    for e in sorted(found["recipes"], key=lambda e: e["loss"]):
        print(f"  {e['recipe']:<14} minimum {e['loss']:.4f}  95% PI {e['loss_pi'][0]:.4f}-{e['loss_pi'][1]:.4f}  "
              f"at N {e['N_opt']:.3g} ({e['N_pi'][0]:.3g}-{e['N_pi'][1]:.3g}){'  (edge)' if e['edge'] else ''}  "
              f"P(best) {e['p_best']:.2f}")
    print(found["reason"])
    print(f"-> {out}")
    return 0


def _backtest(args: argparse.Namespace) -> int:
    """--backtest mode: the method scored on the results' own budgets, written atomically."""
    if args.experiment is not None or args.rows is not None:
        raise ConfigError("--backtest", "with " + ("an experiment" if args.experiment else "--rows"),
                          "--backtest alone with --results (it scores the method, it predicts nothing new)")
    if args.results is None or not Path(args.results).is_file():
        raise ConfigError("--results", args.results, "an existing results .csv or .parquet (required with --backtest)")
    if args.out is None or not args.out.endswith(".json"):
        raise ConfigError("--out", args.out, "a .json path to write the backtests to (required with --backtest)")
    check_writable_dir("--out", Path(args.out).parent)
    from scaling._io import atomic_write_json
    from scaling.study.analysis import isoflop as analysis, selection
    from scaling.study.analysis.prediction import calibrate
    from scaling.study.sweeps import results

    if args.law is not None:
        selection.parse_candidate(args.law)
    rows = analysis.ok_rows(analysis.study_part(results.checked(results.load(args.results)), "main"))
    found = calibrate.backtest_all(rows, args.law, candidates=args.candidate or None, bootstrap=args.bootstrap,
                                   seed=args.seed)
    atomic_write_json(Path(args.out), {"results": str(args.results), **found})
    for p in found["pairs"] + found["sizes"]:
        said = "; ".join(f"{n} CRPS {s['crps']:.4f} 95% {s['coverage']['0.95']:.0%} (width {s['width']:.3f})"
                         for n, s in p["scores"].items())
        chosen = f"; chosen {p['chosen']['predictor']}" if p.get("chosen") else ""
        print(f"{p['label']}: {p['n']} rows, law mean error {p['mean_error']:+.3f}; {said}{chosen}")
    print(_choice_line(found["choice"]))
    print(f"-> {args.out}")
    return 0


def _choice_line(choice: dict) -> str:
    """Which predictor won the backtests on CRPS, and by how much, in one line."""
    if not choice["n"]:
        return f"predictor: {choice['winner']} ({choice['rule']})"
    win, other = choice["winner"], choice["runner_up"]
    said = (f"{choice['relative']:.0%} lower" if (choice["relative"] or 0) >= 0 else
            f"higher, kept: {other}'s lower CRPS on {choice['sign_test'][other]['wins']} of {choice['n']} is within "
            f"chance, sign test p = {choice['sign_test'][other]['p']:.2g}")
    return (f"predictor: {win}, mean CRPS {choice['crps'][win]:.4f} against {other} {choice['crps'][other]:.4f} "
            f"({said}) over {choice['n']} backtest(s) ({choice['rule']})")


def _rows(args: argparse.Namespace) -> int:
    """--rows mode: every check before any fit, both files written atomically at the end."""
    if args.experiment is not None:
        raise ConfigError("experiment", args.experiment, "none with --rows (predict a held-out design or rows, not both)")
    if args.results is None:
        raise ConfigError("--results", None, "the results CSV the law is fitted on (required with --rows)")
    if args.out is None or not args.out.endswith(".csv"):
        raise ConfigError("--out", args.out, "a .csv path to write the predicted rows to (required with --rows)")
    check_writable_dir("--out", Path(args.out).parent)
    rows_path, results_path = Path(args.rows), Path(args.results)
    if not rows_path.is_file():
        raise ConfigError("--rows", str(rows_path), "an existing CSV with columns N, D, recipe")
    if not results_path.is_file():
        raise ConfigError("--results", str(results_path), "an existing results .csv or .parquet")
    import pandas as pd

    from scaling._io import atomic_write_json, atomic_write_text
    from scaling.study.analysis import isoflop as analysis, selection
    from scaling.study.analysis.prediction import table as table_lib
    from scaling.study.sweeps import results

    if args.law is not None:
        selection.parse_candidate(args.law)
    try:
        table = pd.read_csv(rows_path)
    except (OSError, ValueError) as e:
        raise ConfigError("--rows", str(rows_path), f"a readable CSV with columns N, D, recipe ({e})") from None
    found = analysis.study_part(results.checked(results.load(results_path)), "main")
    out, facts = table_lib.predict_table(found, table, args.law, candidates=args.candidate or None,
                                         bootstrap=args.bootstrap, seed=args.seed)
    path = Path(args.out)
    side = path.with_suffix(".json")
    atomic_write_json(side, {"rows": str(rows_path), "results": str(results_path), **facts})
    atomic_write_text(path, out.to_csv(index=False))
    cal = facts["calibration"]
    shift = (f"shift {cal['shift']:+.3f} nats per decade from the fitted data ({cal['k']} backtest(s))"
             if cal["shift"] is not None else "no backtest to calibrate on")
    fixed = ", ".join(f"{k}={v:g}" for k, v in facts["fixed"].items())
    print(f"law {facts['law']}{f'[{fixed}]' if fixed else ''} fitted on {results_path} ({'budgets ' + ', '.join(f'{b:g}' for b in facts['budgets']) if facts['budgets'] else 'no budget labels'}); "
          f"{shift}")
    print(_choice_line(facts["choice"]))
    for note in facts["notes"]:
        print(f"  note: {note}")
    for r in out.itertuples():
        print(f"  {r.recipe:<14} N {r.N:.3g} D {r.D:.3g}: {r.loss:.4f}  {r.level:.0%} PI {r.loss_lo:.4f}-{r.loss_hi:.4f} "
              f"({r.predictor})")
    print(f"-> {path} (+ {side.name})")
    return 0
