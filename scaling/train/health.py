"""Run health: in-flight checks that stop a run early, and the record of a run that failed.

In flight (every training step's loss, read back in order at the next log step; scaling.train.loop):
- a NaN or infinite loss stops the run as `diverged`;
- after warmup, a loss above `spike_factor` x the running median of the last `spike_window`
  trunk losses (once at least 5 are in) stops the run as `diverged` (a median ignores the odd
  noisy batch; a spike of several times the typical loss does not come back on its own);
- a quantised role whose saturated fraction exceeds `max_saturation` is reported (a metrics
  line naming the role), not stopped: saturation costs accuracy, divergence is the loss's job.

Failure record: a run that did not end `ok` lands with failure.json (config, status, step,
reason, last losses, telemetry, traceback, environment; built here, written by
runs.land_failure) and a summary.json with the same status, so a results table shows every run,
including the ones that failed.
"""

from __future__ import annotations

import math
import platform
import statistics
import sys
import traceback as traceback_lib
from collections import deque
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

MIN_SPIKE_HISTORY = 5
_VERSIONED = ("scaling", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "ml_dtypes")


class RunStopped(Exception):
    """The run was stopped by a health check; `status` is a results status (`diverged`, ...)."""

    def __init__(self, status: str, step: int, reason: str):
        self.status, self.step, self.reason = status, step, reason
        super().__init__(f"{status} at step {step}: {reason}")


@dataclass
class LossMonitor:
    """NaN/Inf and spike detection over the trunk's recent losses (restored on resume)."""

    spike_factor: float
    window: int
    warmup_steps: int
    recent: deque = field(default_factory=deque)

    def __post_init__(self) -> None:
        self.recent = deque(self.recent, maxlen=self.window)

    def check(self, step: int, loss: float, *, trunk: bool = True) -> None:
        """Raise RunStopped if `loss` (of training step `step`) is not finite or is a spike."""
        if not math.isfinite(loss):
            raise RunStopped("diverged", step, f"loss is {loss}")
        # Judged after warmup, against at least a few losses (training loss never triples between
        # steps, even early on; a blown-up lr can leave it finite but orders of magnitude up).
        if step >= self.warmup_steps and len(self.recent) >= min(self.window, MIN_SPIKE_HISTORY):
            median = statistics.median(self.recent)
            if loss > self.spike_factor * median:
                raise RunStopped("diverged", step,
                                 f"loss spike: {loss:.4g} > {self.spike_factor:g} x running median {median:.4g}")
        if trunk:
            self.recent.append(loss)


def saturation_events(telemetry: dict[str, Any], max_saturation: float) -> list[dict]:
    """One event per quantised role (or layer/role) whose saturated fraction exceeds the threshold."""
    events = []
    for role, metrics in sorted(telemetry.items()):
        frac = metrics.get("frac_saturated") if isinstance(metrics, dict) else None
        if frac is not None and float(frac) > max_saturation:
            events.append({"event": "saturation", "role": role, "frac_saturated": float(frac),
                           "threshold": max_saturation})
    return events


def environment() -> dict[str, Any]:
    """Versions and platform, so a failure can be reproduced (or blamed on an upgrade)."""
    versions = {}
    for name in _VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"python": sys.version.split()[0], "platform": platform.platform(),
            "machine": platform.machine(), "versions": versions}


def failure_record(*, config: dict, status: str, step: int, reason: str, last_losses: list[float],
                   telemetry: dict, error: BaseException | None = None) -> dict:
    """What failure.json says about a run that did not end `ok` (JSON-ready: non-finite losses as text)."""
    return {
        "status": status,
        "step": step,
        "reason": reason,
        "last_losses": [loss if math.isfinite(loss) else str(loss) for loss in last_losses],
        "telemetry": telemetry,
        "traceback": "".join(traceback_lib.format_exception(error)) if error is not None else None,
        "environment": environment(),
        "config": config,
    }
