"""`scaling reproduce`: the main job, end to end, on the embedded corpus.

    sweep (experiments/<preset>.toml) -> fit (kumar law, bootstrap CIs) -> with an iso-compute sweep,
    each of its recipes also at the law's optimal (N, D) (law_optimal_specs) -> results.csv +
    curves.parquet -> compute-optimal precision -> figures + REPORT.md

Everything lands under --out (default runs/<preset>/) in the repository's own layout:
runs/ (one directory per run), results/<sweep>.csv and results/<sweep>_curves.parquet (small
summaries), fits/<sweep>.json, and paper_figures/ (figures and REPORT.md). So
`scaling reproduce --preset full --out .` regenerates the committed reference study (hours on
2 cores). A second run of the same command reuses every finished run and only refits and redraws.
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import numpy as np
import pandas as pd

from scaling.errors import ConfigError

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
# preset -> the sweeps it runs; the first one is fitted, the others feed their own figures.
PRESETS = {
    "quick": ["quick.toml"],
    "full": ["ladder.toml", "isocompute.toml", "granularity.toml", "outliers.toml"],
}
LAW = "kumar"
ISOCOMPUTE, LAW_SWEEP = "isocompute", "isocompute_law"
LAW_SIZES = range(1, 9)  # the ladder sizes the law's optimal N is chosen from (model.config_for_size)


def reproduce(preset: str, out: str | Path, *, bootstrap: int = 100, workers: int = 1,
              hang_timeout: float = 600.0, progress: bool = True) -> Path:
    """Run the preset and write its report; returns the path of REPORT.md."""
    from scaling import curves, fit, report, results, runs, sweep

    if preset not in PRESETS:
        raise ConfigError("--preset", preset, list(PRESETS))
    out = Path(out)
    started = time.perf_counter()
    experiments = [EXPERIMENTS / name for name in PRESETS[preset]]
    missing = [str(p) for p in experiments if not p.is_file()]
    if missing:
        raise ConfigError("--preset", preset, f"a preset whose experiment files exist (missing {missing[0]})")
    specs = [spec for path in experiments for spec in sweep.expand(path)]  # validate everything first
    todo = [s for s in specs if not runs.finished(s.out_dir(out / "runs"))]
    print(f"{preset}: {len(specs)} runs, {len(specs) - len(todo)} already landed")
    if todo:
        todo, flights = sweep.take_off(todo, out / "runs", hang_timeout=hang_timeout)
        print(f"take-off ok: {len(flights)} shapes; measured ETA {sweep.measured_seconds(todo, flights) / 60:.1f} min")
        sweep.run_sweep(todo, out / "runs", workers=workers, hang_timeout=hang_timeout, progress=progress)

    fitted_sweep = specs[0].sweep
    # the preset's own runs only: a run left in the same folder by an older grid is not part of the study
    df = _landed(out, specs)
    fit_rows = df[(df["sweep"] == fitted_sweep) & (df["status"] == "ok")]
    result = fit.fit_law(fit_rows, LAW, loss_column="val_loss", bootstrap=bootstrap)
    # keep the held-out fit's params: figure 3 then shows what it actually predicted
    if fit_rows["N"].nunique() > 1:
        result.heldout = fit.holdout_error(fit_rows, LAW, by="N", loss_column="val_loss")
    else:
        print(f"{preset}: one model size, so no held-out extrapolation test")
    result.to_json(out / "fits" / f"{fitted_sweep}.json")

    # the direct test's second half needs the fit: each precision at the law's own optimal (N, D)
    law_specs = law_optimal_specs(result, df, specs)
    todo = [s for s in law_specs if not runs.finished(s.out_dir(out / "runs"))]
    if law_specs:
        print(f"{preset}: {len(law_specs)} runs at the law's optimal N, D per precision, {len(todo)} to run")
    if todo:
        todo, _ = sweep.take_off(todo, out / "runs", hang_timeout=hang_timeout)
        sweep.run_sweep(todo, out / "runs", workers=workers, hang_timeout=hang_timeout, progress=progress)
    specs += law_specs
    df = _landed(out, specs)

    results.export(df, out / "results" / f"{fitted_sweep}.csv")
    run_curves = curves.load_curves(out / "runs")
    run_curves = run_curves[run_curves["run_id"].isin({s.run_id for s in specs})].reset_index(drop=True)
    curves.export_curves(run_curves, out / "results" / f"{fitted_sweep}_curves.parquet")
    path = report.write_report(df, result, out / "paper_figures", curves=run_curves)
    print(f"{preset}: {len(df)} rows, fit and report in {time.perf_counter() - started:.0f} s -> {path}")
    return path


def _landed(out: Path, specs: list) -> pd.DataFrame:
    """The results table of these specs' landed runs (one row per run and token budget)."""
    from scaling import results

    df = results.load(out / "runs")
    return df[df["run_id"].isin({s.run_id for s in specs})].reset_index(drop=True)


def law_optimal_specs(fit_result, df: pd.DataFrame, specs: list, sizes: range = LAW_SIZES) -> list:
    """At each iso-compute budget C, every recipe of the iso-compute sweep at the (N, D) the fitted law
    predicts best among the ladder sizes, with D = what C affords at that N and P (whole steps).

    The iso-compute sweep trains each precision at its cost-model size for the same tokens; this is the
    other half of the direct test: the law's own allocation, measured. Runs form the sweep
    `isocompute_law` (a single budget; the iso-compute sweep's seeds, so both halves have error bars).
    None when the preset has no landed iso-compute runs."""
    from scaling import config, model, optimal, plots
    from scaling.sweep import RunSpec

    iso_specs = {s.run_id: s for s in specs if s.sweep == ISOCOMPUTE}
    iso = df[df["run_id"].isin(iso_specs) & (df["status"] == "ok")]
    if iso.empty:
        return []
    n_of = {size: model.param_counts(model.config_for_size(size))["non_embedding"] for size in sizes}
    out: dict[str, RunSpec] = {}
    for compute in plots.default_budgets(iso):
        for _, rows in iso.groupby("recipe", sort=False):
            row = rows.iloc[0]
            candidates = pd.DataFrame([row.to_dict()] * len(n_of))
            candidates["N"] = list(n_of.values())
            candidates["D"] = optimal.Cost().tokens(candidates["N"], compute, row["P"])
            best = int(np.argmin(fit_result.predict(candidates)))
            size = list(n_of)[best]
            for seed in sorted({int(iso_specs[r].config["seed"]) for r in rows["run_id"]}):
                cfg = copy.deepcopy(iso_specs[row["run_id"]].config)
                per_step = cfg["train"]["batch_size"] * cfg["model"]["seq_len"]
                steps = max(1, round(candidates["D"].iloc[best] / per_step))
                cfg.update(name=LAW_SWEEP, seed=seed)
                cfg["model"]["size"] = size
                cfg["train"].update(tokens=steps * per_step, budgets=[1.0], lr="auto")
                cfg = config.validate(cfg)
                run_id = config.run_id(cfg)
                out.setdefault(run_id, RunSpec(run_id=run_id, sweep=LAW_SWEEP, config=cfg))
    return list(out.values())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="quick", help=f"one of {', '.join(PRESETS)} (default quick)")
    parser.add_argument("--out", default=None, help="output directory (default runs/<preset>)")
    parser.add_argument("--bootstrap", type=int, default=100, help="bootstrap resamples for the CIs (default 100)")
    parser.add_argument("--workers", type=int, default=1, help="concurrent runs (default 1)")
    parser.add_argument("--no-progress", action="store_true")


def main(args: argparse.Namespace) -> int:
    if args.bootstrap < 0:
        raise ConfigError("--bootstrap", args.bootstrap, "a count >= 0")
    if args.workers < 0:
        raise ConfigError("--workers", args.workers, "an integer >= 0")
    reproduce(args.preset, args.out or Path("runs") / args.preset, bootstrap=args.bootstrap,
              workers=args.workers, progress=not args.no_progress)
    return 0
