"""Run logs -> one pandas DataFrame, one row per (run, evaluated token budget).

A run directory holds config.json, metrics.jsonl and, once it has landed, summary.json
(and failure.json if it did not end `ok`). summary.json carries `evals`: one entry per
token budget the run evaluated (WSD cooldown branches give several), each becoming a row.
Files are written atomically, so a summary is either whole or absent; a run that crashed
before landing has no summary and no row. Rows are unique on (run_id, D).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pandas as pd

from scaling.train import compute
from scaling._io import atomic_write_text
from scaling.errors import ConfigError

# The DESIGN.md schema, in order; telemetry columns (`<role>_<metric>`) follow.
COLUMNS = [
    "run_id", "sweep", "N", "N_total", "D", "P", "recipe", "format", "granularity", "scaling",
    "smooth_swiglu", "seed", "train_loss", "val_loss", "status", "wall_s", "tokens_per_s",
]
# Run-level extras that fits and figures use (the floating-point law needs ebits/mbits/block).
EXTRAS = ["size", "n_layers", "d_model", "architecture", "lr", "tokens", "ebits", "mbits", "block", "flops_per_token", "step", "corpus", "tokenizer",
          "val_bpb", "train_bpb",
          "hardware"]  # scaling.host.describe() where it trained: the GEMM path moves a loss's last bits
EVAL_KEYS = ("D", "step", "val_loss", "train_loss", "val_bpb", "train_bpb")  # what each evaluation row carries
TELEMETRY_METRICS = ["amax", "frac_saturated", "frac_underflow", "snr_db"]


def rows_from_summary(summary: dict, run_id: str, sweep: str) -> list[dict]:
    """One row per entry of summary['evals'] (a run that stopped early has one row: where it stopped)."""
    base = {k: summary.get(k) for k in COLUMNS + EXTRAS if k in summary}
    base.update(run_id=summary.get("run_id", run_id), sweep=summary.get("sweep", sweep))
    base.setdefault("status", "ok")
    corpus = summary.get("corpus")
    if isinstance(corpus, dict):  # which data: the source and the first 12 hex digits of its fingerprint
        base["corpus"] = f"{corpus.get('source', '?')} {str(corpus.get('fingerprint', ''))[:12]}".strip()
        # summaries from before data.tokenizer: byte-level, unless a token array's vocab says otherwise
        base["tokenizer"] = corpus.get("tokenizer") or ("bytes" if corpus.get("vocab", 256) == 256 else "array")
        if base["tokenizer"] not in ("bytes", "array"):  # one text, another tokenizer: another corpus of tokens
            base["corpus"] += f" {base['tokenizer']}"
    if summary.get("study"):  # an IsoFLOP design's run: its evaluations carry `budget` under this cost model
        base["budget_cost"] = summary["study"].get("cost")
    base.update(summary.get("compute") or {})  # FLOPs by part, effective bits (scaling.train.compute.columns)
    for role, metrics in (summary.get("telemetry") or {}).items():
        if isinstance(metrics, dict):
            for metric in TELEMETRY_METRICS:
                if metric in metrics:
                    base[f"{role}_{metric}"] = metrics[metric]
    evals = summary.get("evals") or [{k: summary.get(k) for k in EVAL_KEYS}]  # a failed run: one row
    return [{**base, **{k: v for k, v in e.items() if k in (*EVAL_KEYS, "budget")}} for e in evals]


def _run_dirs(root: Path) -> list[Path]:
    """Run directories under root; dot-directories (take-off probes, temporaries) are not results."""
    return sorted(p.parent for p in root.rglob("summary.json")
                  if not any(part.startswith(".") for part in p.relative_to(root).parts))


def on_corpus(rows: pd.DataFrame, fingerprint: str) -> pd.Series:
    """Which rows trained on the corpus data.fingerprint pins: the `corpus` column holds its source
    and first 12 hex digits ("pysrc e32929165c71"); a row without one is on no known corpus."""
    if "corpus" not in rows.columns:
        return pd.Series(False, index=rows.index)
    digits = rows["corpus"].astype("string").str.split(" ").str[1]
    return digits.fillna("").map(lambda d: len(d) >= 12 and fingerprint.startswith(d)).astype(bool)


def load(path: str | Path) -> pd.DataFrame:
    """Load runs from a results directory (any depth), or a committed .csv / .parquet summary: the one
    front door (scaling fit, scaling figures, reproduce), so every table gets compute.backfill's columns."""
    path = Path(path)
    allowed = "an existing results directory, .csv or .parquet"
    if path.is_file():
        try:
            if path.suffix == ".parquet":
                return compute.backfill(pd.read_parquet(path))
            if path.suffix == ".csv":
                return compute.backfill(pd.read_csv(path))
        except (OSError, ValueError) as e:  # unreadable or malformed: one line, not a traceback
            raise ConfigError("results", str(path), f"{allowed} ({type(e).__name__}: {e})") from None
    if not path.is_dir():
        raise ConfigError("results", str(path), allowed)
    rows = []
    for run_dir in _run_dirs(path):
        try:
            summary = json.loads((run_dir / "summary.json").read_text())
        except (OSError, json.JSONDecodeError) as e:  # atomic writes make this unexpected: say so
            warnings.warn(f"skipping unreadable {run_dir / 'summary.json'}: {e}")
            continue
        rows += rows_from_summary(summary, run_id=run_dir.name, sweep=run_dir.parent.name)
    return tidy(pd.DataFrame(rows))


def tidy(df: pd.DataFrame) -> pd.DataFrame:
    """Rows unique on (run_id, D) (the last kept), compute.backfill's columns, the schema's order."""
    if df.empty:
        return pd.DataFrame(columns=COLUMNS)
    df = compute.backfill(df.drop_duplicates(subset=["run_id", "D"], keep="last"))
    ordered = [c for c in COLUMNS + EXTRAS if c in df.columns]
    return df[ordered + sorted(c for c in df.columns if c not in ordered)].reset_index(drop=True)


def export(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a small committed summary (.parquet or .csv), atomically."""
    path = Path(path)
    if path.suffix == ".csv":
        atomic_write_text(path, df.to_csv(index=False))
    elif path.suffix == ".parquet":
        tmp = path.with_name(f".{path.name}.tmp")
        path.parent.mkdir(parents=True, exist_ok=True)
        df.to_parquet(tmp, index=False, compression="zstd")  # a quarter smaller than snappy
        tmp.replace(path)
    else:
        raise ValueError(f"{path}: export to .csv or .parquet")
    return path


def checked(df: pd.DataFrame, loss_column: str = "val_loss") -> pd.DataFrame:
    """df with a repeated (run_id, D) row kept once where its losses agree; refused in one line naming the
    runs where they differ (which one is right is the user's to say) or where a run that landed `ok` has a
    non-finite loss (a run that diverged lands `diverged`): a fit or prediction must not quietly use one
    of two losses, or quietly lose a row."""
    import numpy as np

    if df.empty or loss_column not in df.columns:
        return df
    ok = df["status"].fillna("ok").eq("ok") if "status" in df.columns else pd.Series(True, index=df.index)
    loss = pd.to_numeric(df[loss_column], errors="coerce")
    bad = ok & ~np.isfinite(loss.to_numpy(float))
    if bad.any():
        runs = list(dict.fromkeys(df.loc[bad, "run_id"].astype(str))) if "run_id" in df.columns else []
        got = ", ".join(f"{v}" for v in dict.fromkeys(loss[bad].astype(str)))
        raise ConfigError(loss_column, f"{got} in {int(bad.sum())} row(s) of ok runs {', '.join(runs[:5])}"
                          f"{' ...' if len(runs) > 5 else ''}",
                          "finite losses on runs that landed ok (mark a diverged run's status, or drop its rows)")
    if not {"run_id", "D"} <= set(df.columns):
        return df
    keys = [df["run_id"].astype(str), pd.to_numeric(df["D"], errors="coerce")]
    spread = loss.groupby(keys).agg(lambda s: float(s.max() - s.min()) if s.notna().any() else 0.0)
    conflicts = spread[spread > 1e-9 * loss.abs().max()]
    if len(conflicts):
        runs = list(dict.fromkeys(str(r) for r, _ in conflicts.index))
        raise ConfigError("run_id", ", ".join(runs[:5]) + (" ..." if len(runs) > 5 else ""),
                          f"one {loss_column} per run and D ({len(conflicts)} (run_id, D) repeated with different "
                          "losses: remove the stale rows)")
    return df.drop_duplicates(subset=["run_id", "D", loss_column]).reset_index(drop=True)
