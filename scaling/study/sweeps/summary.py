"""A sweep's committed summary: `results/<sweep>.csv` (one row per run and evaluated budget) and
`results/<sweep>_curves.parquet` (each run's per-step curve, thinned to CURVE_POINTS).

Run directories (checkpoints, logs) stay on the machine that trained them; the summary is what a
repository commits, so it is also what tells a sweep on another machine, or after the first one is
gone, which runs have landed:

- a run in the summary with a final status (`ok`, `diverged`) is not trained again, and an IsoFLOP
  design reads its rows for its edges and replicates (`landed_rows`);
- as runs land, the sweep rewrites both files (`update`): the committed rows, with those of the
  runs landed under the results root replacing theirs. Each file is written atomically, so a kill
  at any moment leaves the last whole summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import pandas as pd

from scaling.errors import ConfigError
from scaling.study.sweeps import curves, results

# per run in the committed curves: a few hundred runs at 40 points stay near a megabyte (85 points
# about double it), a curve's shape on a log-step axis is kept, and eval steps always are
CURVE_POINTS = 40
FINAL = ("ok", "diverged")  # runs.finished's statuses: landed for good, never trained again


@dataclass(frozen=True)
class Summary:
    """The committed summary of one sweep: `path` is its .csv, the curves sit beside it."""

    path: Path
    corpus: Mapping[str, str] = field(default_factory=dict)  # sweep -> its data.fingerprint: rows of
    # its runs trained on other data have not landed (a sweep without a pin takes every row)

    @classmethod
    def of(cls, root: str | Path, sweep: str, corpus: Mapping[str, str] | None = None) -> "Summary":
        """The repository's layout: <root>/<sweep>.csv (root: results/)."""
        return cls(Path(root) / f"{sweep}.csv", dict(corpus or {}))

    @property
    def curves_path(self) -> Path:
        return self.path.with_name(f"{self.path.stem}_curves.parquet")

    def rows(self) -> pd.DataFrame:
        """The committed rows, of runs on their sweep's pinned corpus."""
        rows = self.all_rows()
        return rows[self._pinned(rows)].reset_index(drop=True)

    def all_rows(self) -> pd.DataFrame:
        """Every committed row (empty where there is no summary yet)."""
        return results.load(self.path) if self.path.is_file() else pd.DataFrame(columns=results.COLUMNS)

    def elsewhere(self) -> pd.DataFrame:
        """Committed rows of runs trained on another corpus than their sweep pins (to be trained again)."""
        rows = self.all_rows()
        return rows[~self._pinned(rows)]

    def _pinned(self, rows: pd.DataFrame) -> pd.Series:
        keep = pd.Series(True, index=rows.index)
        for sweep, pin in self.corpus.items():
            if pin and len(rows):
                mine = rows["sweep"] == sweep if "sweep" in rows.columns else keep
                keep &= ~mine | results.on_corpus(rows, pin)
        return keep

    def landed_ids(self) -> set[str]:
        """Runs the summary records as landed for good."""
        rows = self.rows()
        return set(rows.loc[rows["status"].isin(FINAL), "run_id"]) if len(rows) else set()

    def landed_rows(self, run_dir: str | Path) -> pd.DataFrame:
        """The committed rows and those of the runs under `run_dir` (<results root>/<sweep>), the
        latter replacing a committed run's rows where both hold it."""
        return landed_rows(Path(run_dir), self)

    def update(self, run_dir: str | Path, only: set[str] | None = None) -> None:
        """Rewrite the summary with the runs landed under `run_dir` (any depth; `only`: these run
        ids, the others there are left out), each file atomically."""
        run_dir = Path(run_dir)
        fresh = _fresh_rows(run_dir)
        if only is not None:
            fresh = fresh[fresh["run_id"].isin(only)].reset_index(drop=True)
        if fresh.empty:
            return
        results.export(_replace_runs(self.all_rows(), fresh, results.tidy), self.path)
        run_curves = curves.load_curves(run_dir)
        run_curves = curves.subsample(run_curves[run_curves["run_id"].isin(set(fresh["run_id"]))], CURVE_POINTS)
        if self.curves_path.is_file():
            run_curves = _replace_runs(curves.load_curves(self.curves_path), run_curves, lambda df: df)
        results.export(curves.validate_curves(run_curves), self.curves_path)

    def merge(self, other: "Summary") -> tuple[int, int]:
        """Join another summary of the same sweep (a held-out budget's, a recipe added later) into
        this one: its rows and curves replace this summary's for the runs both hold. Returns (runs
        added, runs replaced). Both files are written atomically; the other summary is left as it is."""
        theirs, mine = other.all_rows(), self.all_rows()
        if theirs.empty:
            raise ConfigError("merge", str(other.path), "a summary with landed runs")
        if len(mine) and "sweep" in theirs.columns and "sweep" in mine.columns:
            foreign = set(theirs["sweep"].dropna()) - set(mine["sweep"].dropna())
            if foreign:
                raise ConfigError("merge", str(other.path),
                                  f"rows of sweep {', '.join(sorted(mine['sweep'].dropna().unique()))} "
                                  f"(it holds {', '.join(sorted(foreign))})")
        ids, held = set(theirs["run_id"]), set(mine["run_id"]) if len(mine) else set()
        merged_curves = (curves.subsample(curves.load_curves(other.curves_path), CURVE_POINTS)
                         if other.curves_path.is_file() else pd.DataFrame(columns=list(curves.REQUIRED)))
        if self.curves_path.is_file():
            merged_curves = _replace_runs(curves.load_curves(self.curves_path), merged_curves, lambda df: df)
        results.export(_replace_runs(mine, theirs, results.tidy), self.path)
        if len(merged_curves):  # rows first: a merge cut off between the two is finished by running it again
            results.export(curves.validate_curves(merged_curves), self.curves_path)
        return len(ids - held), len(ids & held)


def landed_rows(run_dir: Path | None, summary: Summary | None) -> pd.DataFrame:
    """Rows of a sweep's landed runs: its committed summary's and those under run_dir (<results
    root>/<sweep>), the run directories' rows replacing a committed run's."""
    committed = summary.rows() if summary else pd.DataFrame(columns=results.COLUMNS)
    return _replace_runs(committed, _fresh_rows(run_dir) if run_dir else committed.iloc[:0], results.tidy)


def _fresh_rows(run_dir: Path) -> pd.DataFrame:
    """Rows of the runs landed (summary.json written) under run_dir."""
    return results.load(run_dir) if run_dir.is_dir() else pd.DataFrame(columns=results.COLUMNS)


def _replace_runs(committed: pd.DataFrame, fresh: pd.DataFrame, tidy) -> pd.DataFrame:
    if fresh.empty:
        return committed
    if committed.empty:
        return fresh
    kept = committed[~committed["run_id"].isin(set(fresh["run_id"]))]
    return tidy(pd.concat([kept, fresh], ignore_index=True))
