"""Studies, in three wings and the main job on top (imports flow sweeps -> analysis, report -> both;
analysis imports neither, sweeps never the report: tests/test_layout.py):
  scaling.study.sweeps    grids and IsoFLOP designs, executors (local, Ray, GPUs), take-off, design checks,
                          summaries, results and curves as DataFrames
  scaling.study.analysis  laws, fits, law selection, IsoFLOP analysis, matched gaps, cost verdicts, findings;
                          P* (analysis.pstar) and prediction (analysis.prediction)
  scaling.study.report    figures, REPORT.md's text and the report (its Section hook)
  scaling.study.reproduce `scaling reproduce`, the main job

The modules' old flat paths (`scaling.study.fit`, `from scaling.study.sweep import expand`, ...) still
import, as the same module objects, for one release (MOVED)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

from scaling._lazy import exports

# old flat module -> its place in the wings; kept importable for one release
MOVED = {
    **{m: f"sweeps.{m}" for m in ("sweep", "devices", "takeoff", "design", "design_checks", "summary", "results", "curves")},
    **{m: f"analysis.{m}" for m in ("shapes", "laws", "fit", "selection", "matched", "costs", "findings")},
    **{m: f"analysis.pstar.{m}" for m in ("optimal", "profile", "optimum_check")},
    **{m: f"analysis.prediction.{m}" for m in ("predict", "calibrate")},
    **{m: f"report.{m}" for m in ("plots", "law_plots", "figure_base", "prose", "law_prose")},
}


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import scaling.study.fit` and friends: the moved module itself, under its old name too."""

    def find_spec(self, fullname, path=None, target=None):
        prefix, _, leaf = fullname.rpartition(".")
        if prefix == __name__ and leaf in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(f"{__name__}.{MOVED[spec.name.rpartition('.')[2]]}")

    def exec_module(self, module):
        pass  # the module ran under its own name


if not any(isinstance(f, _OldPaths) for f in sys.meta_path):
    sys.meta_path.append(_OldPaths())

_NAMES = {
    **{m: m for m in ("sweeps", "analysis", "report", "reproduce")},
    **{m: where for m, where in MOVED.items()},
    "FitResult": "analysis.fit", "fit_law": "analysis.fit", "select_law": "analysis.selection",
    "optimal_precision": "analysis.pstar.optimal",
}
__all__ = list(_NAMES)
__getattr__ = exports(__name__, _NAMES)
