"""One training run: the model-size ladder, the run config (declared and validated once), data and
tokenizers, the transformer, the compiled step, the loop (schedule, eval, checkpoints, metrics),
in-flight health checks, live tracking and run directories (one owner each)."""

from scaling._lazy import exports

_NAMES = {
    "ladder": "ladder", "compute": "compute", "config": "config", "data": "data", "model": "model", "step": "step",
    "loop": "loop", "health": "health", "tracking": "tracking", "runs": "runs",
    "RunConfig": "config", "validate": "config", "run": "loop",
}
__all__ = list(_NAMES)
__getattr__ = exports(__name__, _NAMES)
