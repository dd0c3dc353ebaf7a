"""`scaling predict HELDOUT.toml`: predict a budget before it is trained (scaling.study.predict).

The held-out experiment is an IsoFLOP design at a budget above every one the results hold; its
runs must not have landed yet (a prediction made after the data is not one). The laws are fitted on
the results of the same sweep, the prediction written as JSON for the history and the report.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scaling.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", help="the held-out IsoFLOP design (an experiment TOML with one budget)")
    parser.add_argument("--results", default=None,
                        help="the lower budgets' results (default results/<sweep>.csv of the experiment's sweep)")
    parser.add_argument("-o", "--out", default=None,
                        help="prediction JSON to write (default results/<sweep>_prediction.json); never overwritten")
    parser.add_argument("--bootstrap", type=int, default=50, help="resamples per law (runs resampled)")
    parser.add_argument("--candidate", action="append", default=[],
                        help="a law to choose among (repeatable; default every law)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")


def main(args: argparse.Namespace) -> int:
    from scaling._io import atomic_write_json
    from scaling.study import predict, results, sweep
    from scaling.study.summary import Summary

    if args.bootstrap < 0:
        raise ConfigError("--bootstrap", args.bootstrap, "an integer >= 0")
    name, _, _, design = sweep.experiment_points(args.experiment)
    if design is None or len(design.budgets) != 1:
        raise ConfigError("experiment", args.experiment, "an IsoFLOP design ([isoflop]) with exactly one budget")
    budget = design.budgets[0]
    summary = Summary(Path(args.results)) if args.results else Summary.of("results", name)
    out = Path(args.out) if args.out else summary.path.with_name(f"{name}_prediction.json")
    if out.exists():
        raise ConfigError("--out", str(out), "a path with no prediction yet (a committed prediction is never replaced)")
    if not summary.path.is_file():
        raise ConfigError("--results", str(summary.path), "an existing results .csv or .parquet")
    specs = sweep.expand(args.experiment)
    held = {s.run_id for s in specs}
    rows = results.load(summary.path)
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

