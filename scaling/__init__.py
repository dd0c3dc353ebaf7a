"""scaling: precision-aware scaling-law research toolkit.

Four packages; data and imports flow one way (numerics <- train <- study; plan is pure Python):
  scaling.numerics  number formats, scaled quantisation, precision recipes, the quantised GEMMs
  scaling.train     one training run: config, data, model, compiled step, loop, health, tracking, runs
  scaling.study     sweeps, results, cost models, laws and fits, IsoFLOP analysis, figures, report
  scaling.plan      the GPU-cluster planner: hardware table, step model, days and goodput (never imports JAX)
  scaling.cli       the `scaling` command: argparse and printing
The most used modules are importable from the top (`from scaling import formats, quant, precision,
fit, optimal, plan, results`); each is imported on first use, so light verbs such as `scaling plan`
never pay for importing JAX.
"""

from scaling._lazy import exports

__version__ = "0.1.0"

_MODULES = {
    **{m: f"scaling.numerics.{m}" for m in ("formats", "quant", "precision", "gemm")},
    "compute": "scaling.train.compute",
    "curves": "scaling.study.sweeps.curves", "results": "scaling.study.sweeps.results",
    **{m: f"scaling.study.analysis.{m}" for m in ("fit", "laws")}, "optimal": "scaling.study.analysis.pstar.optimal",
}
__all__ = ["numerics", "train", "study", "plan", "cli", *_MODULES]
__getattr__ = exports(__name__, _MODULES)
