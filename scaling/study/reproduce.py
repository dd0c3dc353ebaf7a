"""`scaling reproduce`: the main job, end to end, on the embedded corpus.

    IsoFLOP sweep (experiments/<preset>.toml's [isoflop] design) -> law chosen by held-out precision
    gaps (selection.select_law over the preset's CANDIDATES) + bootstrap -> results.csv + curves.parquet ->
    findings.json (IsoFLOP minima per recipe and budget, P(best), winner or none, P* with CI and
    specification range) + figures + REPORT.md

Everything lands under --out (default runs/<preset>/) in the repository's own layout:
runs/ (one directory per run), results/<sweep>.csv and results/<sweep>_curves.parquet (small
summaries), fits/<sweep>.json, and paper_figures/ (figures, REPORT.md, findings.json). So
`scaling reproduce --preset full --out .` regenerates the reference study (hours on 2 cores). A
second run of the same command reuses every finished run and redraws; runs in the committed summary
(results/<sweep>.csv, scaling.study.sweeps.summary) count as finished on any machine. It refits only where
the fit would change: fits/<sweep>.json records what it was made from (the rows, the candidate laws,
the bootstrap, the package's code), and a fit made from the same is reused.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Callable

import pandas as pd

from scaling.study.sweeps import curves, sweep, takeoff
from scaling.study.analysis import fit, isoflop as analysis, selection
from scaling.study.analysis.prediction import predict
from scaling.study.report import writer as report
from scaling.study.presets import SECTIONS, STUDY_PRESETS, WORKERS
from scaling.study.sweeps.summary import Summary
from scaling.train import runs
from scaling.errors import ConfigError

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
# STUDY_PRESETS (preset -> the sweeps it runs) and WORKERS: scaling.study.presets
# The laws each preset chooses among. quick ties every role to one precision, so only the laws that
# grid can identify (kappa free and fixed at 2 and 4 enter P*'s specification range in the report);
# full has recipes that quantise weights or activations alone, so every law (`scaling fit --law auto`).
CANDIDATES = {"quick": ("chinchilla", "kumar", "kumar_data"), "full": None}
PACKAGE = Path(__file__).resolve().parents[1]


def made_from(rows: pd.DataFrame, candidates, bootstrap: int) -> dict:
    """What a reproduce fit depends on: the rows it is fitted to, the candidate laws, the bootstrap
    resamples and the package's code (any change to it refits: the laws, the fitter and the
    quantisation errors the laws read all live there)."""
    table = rows.sort_values(["run_id", "D"]).reset_index(drop=True)
    data = hashlib.sha256(json.dumps(list(table.columns)).encode())
    data.update(pd.util.hash_pandas_object(table, index=False).to_numpy().tobytes())
    code = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        code.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes())
    return {"rows": len(table), "rows_sha256": data.hexdigest(), "candidates": None if candidates is None else list(candidates),
            "bootstrap": bootstrap, "code_sha256": code.hexdigest()}


def reusable_fit(path: Path, made: dict) -> fit.FitResult | None:
    """The fit at `path` if it was made from `made` (reproduce's own record of it); None otherwise."""
    try:
        result = fit.FitResult.from_json(path)
    except (ConfigError, OSError):
        return None
    return result if result.data.get("made_from") == made else None


def _summary(preset: str, experiments: list[Path], out: Path) -> Summary:
    """The preset's committed summary (results/<first sweep>.csv, all its sweeps' rows): what it holds
    has landed, on this machine or another, and it is rewritten as runs land. One sweep's experiments (a
    held-out budget's too) share a corpus: ConfigError where they pin different ones."""
    pins: dict[str, str] = {}  # sweep -> its corpus
    for path in experiments:
        name, pin = sweep.experiment_points(path)[0], sweep.pinned_corpus(path)
        if pins.setdefault(name, pin) != pin:
            raise ConfigError("data.fingerprint", [pins[name], pin], f"one value for every experiment of sweep {name!r}")
    return Summary.of(out / "results", sweep.experiment_points(experiments[0])[0], pins)


def _expand(experiments: list[Path], out: Path, committed: Summary) -> list:
    """Every run of the preset's experiments (all validated first); a design's replicates follow its landed runs."""
    return [spec for path in experiments for spec in sweep.expand(path, landed=out / "runs", summary=committed)]


def _unlanded(specs: list, out: Path, committed: Summary) -> list:
    """The specs landed neither in the committed summary nor under out/runs."""
    landed = committed.landed_ids()
    return [s for s in specs if s.run_id not in landed and not runs.finished(s.out_dir(out / "runs"))]


def _train(preset: str, experiments: list[Path], out: Path, committed: Summary, workers: int, hang_timeout: float,
           progress: bool, echo: Callable[[str], None]) -> list:
    """Take off and train every unlanded run, round after round while a design's landed minima call for
    replicates; returns the preset's runs as last expanded."""
    specs = _expand(experiments, out, committed)
    todo = _unlanded(specs, out, committed)
    sweep.check_corpus(todo, out / "runs")  # only what trains here must find its corpus here
    echo(f"{preset}: {len(specs)} runs, {len(specs) - len(todo)} already landed")
    while todo:
        lanes = takeoff.takeoff_lanes(workers)
        phase = time.perf_counter()
        todo, flights = takeoff.take_off(todo, out / "runs", hang_timeout=hang_timeout, lanes=lanes, echo=echo)
        echo(f"take-off ok: {len(flights)} shapes in {time.perf_counter() - phase:.0f} s; "
             f"measured ETA {takeoff.measured_seconds(todo, flights, lanes) / 60:.1f} min")
        phase = time.perf_counter()
        ids = {s.run_id for s in specs}
        sweep.run_sweep(todo, out / "runs", workers=workers, hang_timeout=hang_timeout, progress=progress,
                        on_landed=lambda: committed.update(out / "runs", only=ids))
        echo(f"{len(todo)} runs in {time.perf_counter() - phase:.0f} s")
        specs = _expand(experiments, out, committed)
        todo = [s for s in _unlanded(specs, out, committed) if s.run_id not in ids]
    return specs


def _law(preset: str, rows: pd.DataFrame, studied: str, out: Path, bootstrap: int,
         echo: Callable[[str], None]) -> fit.FitResult:
    """The law fitted to the study's rows: fits/<sweep>.json where it was made from the same rows,
    candidates, bootstrap and code; else chosen by held-out precision gaps, bootstrapped and written there."""
    made = made_from(rows, CANDIDATES.get(preset), bootstrap)
    result = reusable_fit(out / "fits" / f"{studied}.json", made)
    if result is not None:
        echo(f"{preset}: law {result.law} reused from fits/{studied}.json (made from the same {len(rows)} rows, "
             "candidates, bootstrap and code)")
        return result
    law_choice, fits = selection.select(rows, CANDIDATES.get(preset), loss_column="val_loss")  # None: every law
    if law_choice["chosen"] is None:
        raise ConfigError("results", studied, "runs on which at least one candidate law can be fitted")
    result = selection.chosen_fit(rows, law_choice, fits, bootstrap=bootstrap, seed=0, loss_column="val_loss")
    echo(f"{preset}: law {law_choice['chosen']} chosen by held-out precision gaps ({law_choice['criterion']})")
    if rows["N"].nunique() > 1:  # figure 3: what the law predicts for the largest size, fitted without it
        result.heldout = fit.holdout_error(rows, result.law, by="N", fixed=result.fixed, loss_column="val_loss")
    result.data["made_from"] = made
    result.to_json(out / "fits" / f"{studied}.json")
    return result


def _write_report(preset: str, df: pd.DataFrame, result: fit.FitResult, studied: str, out: Path, committed: Summary,
                  ids: set) -> Path:
    """REPORT.md and its figures under out/paper_figures, from the study's rows and curves, a held-out
    budget's committed prediction (and its post-hoc one) and the preset's own sections."""
    run_curves = curves.load_curves(committed.curves_path)
    run_curves = run_curves[run_curves["run_id"].isin(ids)].reset_index(drop=True)
    # a held-out budget's prediction, committed beside the results before that budget trained
    predicted, posthoc = (out / "results" / f"{studied}_prediction{tail}.json" for tail in ("", "_posthoc"))
    sections, pairs = [], []
    if preset in SECTIONS:  # the study's own arms and side experiments (runs trained again on another host, ...)
        module = report.load_sections(EXPERIMENTS.parent / SECTIONS[preset])
        sections, pairs = module.sections(out / "results" / f"{studied}.csv"), getattr(module, "PAIRS", ())
    return report.write_report(df, result, out / "paper_figures", curves=run_curves,
                               prediction=predict.load(predicted) if predicted.is_file() else None,
                               posthoc=predict.load(posthoc) if posthoc.is_file() else None,
                               sections=sections, pairs=pairs)


def reproduce(preset: str, out: str | Path, *, bootstrap: int = 100, workers: int = WORKERS,
              hang_timeout: float = 600.0, progress: bool = True, echo: Callable[[str], None] | None = None) -> Path:
    """Run the preset and write its report; returns the path of REPORT.md. `echo` gets a line per
    phase (runs, take-off, training, the chosen law, the report) with its time."""
    echo = echo or (lambda line: None)
    if preset not in STUDY_PRESETS:
        raise ConfigError("--preset", preset, list(STUDY_PRESETS))
    out = Path(out)
    started = time.perf_counter()
    experiments = [EXPERIMENTS / name for name in STUDY_PRESETS[preset]]
    missing = [str(p) for p in experiments if not p.is_file()]
    if missing:
        raise ConfigError("--preset", preset, f"a preset whose experiment files exist (missing {missing[0]})")
    committed = _summary(preset, experiments, out)
    specs = _train(preset, experiments, out, committed, workers, hang_timeout, progress, echo)
    studied = specs[0].sweep
    phase = time.perf_counter()
    # the preset's own runs only: a run left in the same folder by an older grid is not part of the study
    ids = {s.run_id for s in specs}
    committed.update(out / "runs", only=ids)
    df = committed.rows()
    df = df[df["run_id"].isin(ids)].reset_index(drop=True)
    rows = analysis.ok_rows(df[df["sweep"] == studied])
    result = _law(preset, rows, studied, out, bootstrap, echo)
    path = _write_report(preset, df, result, studied, out, committed, ids)
    end = time.perf_counter()
    echo(f"{preset}: {len(df)} rows, fit and report in {end - phase:.0f} s ({end - started:.0f} s in all) -> {path}")
    return path

