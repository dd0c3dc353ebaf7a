"""Studies: sweep grids and executors (take-off checks, local processes, Ray), results and curves as
DataFrames, compute as it is spent (cost models), law forms, fitting with bootstrap CIs, optimal
precision, IsoFLOP analysis and findings, figures and the report, and `reproduce`, the main job."""

from scaling._lazy import exports

_NAMES = {
    **{m: m for m in ("sweep", "results", "curves", "laws", "fit", "optimal", "analysis",
                      "plots", "report", "reproduce")},
    "FitResult": "fit", "fit_law": "fit", "optimal_precision": "optimal",
}
__all__ = list(_NAMES)
__getattr__ = exports(__name__, _NAMES)
