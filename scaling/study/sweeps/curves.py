"""Per-step training curves: <run_dir>/metrics.jsonl -> one tidy DataFrame, and a small committed copy.

One row per (run, step): run_id, sweep, step, tokens, loss, lr, val_loss (on eval steps), the
flattened telemetry `<role>_<metric>` (nested dicts become `<outer>_<inner>` columns, so
{"telemetry": {"activation": {"amax": 3.0}}} -> activation_amax and {"act": {"max": 2}} -> act_max),
and the run-level fields figures group by (N, P, recipe, format, granularity, scaling,
smooth_swiglu, seed, size, status) joined from summary.json. Per-layer lists (act_max,
swiglu_max) become their maximum: the largest magnitude anywhere in the model at that step.

Which records make the curve: the trunk's train records and its eval records. WSD cooldown
branches re-run steps of the trunk with another schedule, so their records (phase 'cooldown',
and eval records of a branch budget, fraction < 1) would overwrite the trunk at the same step;
they are left out, as are event records (resumed, saturation). A resumed run logs some steps
twice; the last record of a step wins.

Committed curves are subsampled by `export_curves`: at most `max_points` rows per run, spaced
evenly in log(step) so that the fast early part of training is visible on a log-token axis, with
the first and last step and every eval step kept.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scaling.study.sweeps import results
from scaling._io import read_jsonl
from scaling.errors import ConfigError

REQUIRED = ("run_id", "step", "loss")
# Run-level fields copied from summary.json onto every curve row (what figures facet and colour by).
RUN_FIELDS = ("N", "P", "recipe", "format", "granularity", "scaling", "smooth_swiglu", "seed", "size", "status")
_BLOCK_AMAX = re.compile(r"^(?P<role>[a-z]+)_block_amax_(?P<stat>min|max|p\d+)$")


def flatten_record(record: dict, prefix: str = "") -> dict[str, Any]:
    """{'telemetry': {'grad': {'amax': 1}, 'act_max': [1, 5]}, 'loss': 2} -> {'grad_amax': 1, 'act_max': 5, 'loss': 2}."""
    flat: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_record(value, "" if name == "telemetry" else f"{name}_"))
        elif isinstance(value, (list, tuple)):
            numbers = [v for v in value if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if numbers:
                flat[name] = max(numbers)
        else:
            flat[name] = value
    return flat


def _is_trunk(record: dict) -> bool:
    if record.get("phase") == "cooldown":
        return False
    event = record.get("event")
    if event is None:
        return True
    return event == "eval" and float(record.get("fraction", 1.0)) >= 1.0


def curve_of_run(run_dir: Path) -> pd.DataFrame:
    """One run's metrics.jsonl as rows keyed by step (records of the same step are merged)."""
    records = [flatten_record(r) for r in read_jsonl(run_dir / "metrics.jsonl") if "step" in r and _is_trunk(r)]
    if not records:
        return pd.DataFrame()
    df = pd.DataFrame(records)
    # a train record and an eval record at one step become one row (last non-null value wins)
    df = df.drop(columns=[c for c in ("event", "phase", "fraction", "D") if c in df.columns])
    df = df.groupby("step", sort=True).last().reset_index()
    meta: dict[str, Any] = {"run_id": run_dir.name, "sweep": run_dir.parent.name}
    summary_path = run_dir / "summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        meta.update({k: summary[k] for k in RUN_FIELDS if k in summary})
        meta["run_id"] = summary.get("run_id", meta["run_id"])
        meta["sweep"] = summary.get("sweep", meta["sweep"])
    for key, value in meta.items():
        df[key] = value
    return df


def load_curves(path: str | Path) -> pd.DataFrame:
    """Curves of every run under a results directory (any depth), or a committed .csv / .parquet."""
    path = Path(path)
    if path.is_file():
        df = results.load(path)  # same .csv / .parquet reader
    elif path.is_dir():
        frames = []
        for metrics in sorted(path.rglob("metrics.jsonl")):
            if any(part.startswith(".") for part in metrics.relative_to(path).parts):
                continue  # take-off probes (.takeoff/) and temporaries are not runs
            try:
                frames.append(curve_of_run(metrics.parent))
            except (OSError, json.JSONDecodeError) as e:
                warnings.warn(f"skipping unreadable run {metrics.parent}: {e}")
        frames = [f for f in frames if not f.empty]
        df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(REQUIRED))
    else:
        raise FileNotFoundError(f"no curves at {path}")
    return validate_curves(df, str(path))


def validate_curves(df: pd.DataFrame, source: str = "curves") -> pd.DataFrame:
    """Malformed curves are an error, not an empty figure: required columns present, numeric step/loss."""
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ConfigError(f"{source} columns", sorted(df.columns), f"a table with columns {', '.join(REQUIRED)}")
    for col in ("step", "loss", "tokens"):
        if col in df.columns and len(df) and not pd.api.types.is_numeric_dtype(df[col]):
            raise ConfigError(f"{source} column {col}", str(df[col].dtype), "numbers")
    lead = [c for c in ("run_id", "sweep", "step", "tokens", "loss", "lr", "val_loss") if c in df.columns]
    return df[lead + [c for c in df.columns if c not in lead]].reset_index(drop=True)


def subsample(df: pd.DataFrame, max_points: int = 200) -> pd.DataFrame:
    """At most ~max_points rows per run, evenly spaced in log(step); first, last and eval steps kept."""
    keep = []
    for _, run in df.groupby("run_id", sort=False):
        run = run.sort_values("step")
        steps = run["step"].to_numpy(dtype=float)
        if len(run) <= max_points:
            keep.append(run)
            continue
        targets = np.unique(np.geomspace(max(steps[0], 1.0), steps[-1], max_points))
        idx = set(np.searchsorted(steps, targets).clip(0, len(steps) - 1).tolist()) | {0, len(steps) - 1}
        if "val_loss" in run.columns:
            idx |= set(np.flatnonzero(run["val_loss"].notna().to_numpy()).tolist())
        keep.append(run.iloc[sorted(idx)])
    return pd.concat(keep, ignore_index=True) if keep else df


def export_curves(df: pd.DataFrame, path: str | Path, max_points: int = 200) -> Path:
    """Write a small committed copy of the curves (.parquet or .csv), atomically."""
    return results.export(subsample(validate_curves(df), max_points), path)


def amax_long(curves: pd.DataFrame) -> pd.DataFrame:
    """Tidy amax table for the amax-distribution figure: run_id, step, tokens, role, granularity, stat, amax.

    `<role>_amax` (amax of the whole tensor) -> granularity 'tensor', stat 'max';
    `<role>_block_amax_<stat>` (stat = min, max or pNN quantile over the tensor's blocks)
    -> granularity 'block'.
    """
    id_cols = [c for c in ("run_id", "step", "tokens", "P", "recipe", "granularity") if c in curves.columns]
    frames = []
    for col in curves.columns:
        if col.endswith("_amax") and col.count("_") == 1:
            role, granularity, stat = col[: -len("_amax")], "tensor", "max"
        elif m := _BLOCK_AMAX.match(col):
            role, granularity, stat = m["role"], "block", m["stat"]
        else:
            continue
        part = curves[id_cols].rename(columns={"granularity": "run_granularity"}).copy()
        part["role"], part["granularity"], part["stat"] = role, granularity, stat
        part["amax"] = pd.to_numeric(curves[col], errors="coerce")
        frames.append(part.dropna(subset=["amax"]))
    if not frames:
        return pd.DataFrame(columns=id_cols + ["role", "granularity", "stat", "amax"])
    return pd.concat(frames, ignore_index=True)
