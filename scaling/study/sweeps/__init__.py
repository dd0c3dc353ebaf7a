"""Sweeps: experiment grids and IsoFLOP designs turned into runs, the executors that train them (local
child processes, Ray, a node's GPUs), take-off checks and ETAs, the checks a design gets before it
trains, and the committed summaries and per-step curves its runs land in. May import the analysis
wing (a design reads IsoFLOP budgets and the fit's run-count rule), never the report."""

from scaling._lazy import exports

_NAMES = {m: m for m in ("sweep", "devices", "takeoff", "design", "design_checks", "summary", "results", "curves")}
__all__ = list(_NAMES)
__getattr__ = exports(__name__, _NAMES)
