"""Studies: IsoFLOP designs, sweep grids and executors (local processes, Ray), take-off checks and
ETAs, results and curves as DataFrames, law forms, fitting with bootstrap CIs, law selection by
held-out precision gaps, optimal precision, IsoFLOP analysis and findings, figures and the report,
and `reproduce`, the main job."""

from scaling._lazy import exports

_NAMES = {
    **{m: m for m in ("design", "sweep", "takeoff", "results", "curves", "laws", "fit", "selection", "optimal",
                      "analysis", "findings", "plots", "report", "reproduce")},
    "FitResult": "fit", "fit_law": "fit", "select_law": "selection", "optimal_precision": "optimal",
}
__all__ = list(_NAMES)
__getattr__ = exports(__name__, _NAMES)
