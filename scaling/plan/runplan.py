"""From FLOPs to days on a GPU cluster, and the days under failures (RunPlan).

days = F / (model FLOPs per second of the cluster): from a step of the op-by-op step model
(scaling.plan.stepmodel) laid out on the cluster, or from an MFU the user measured. The failure
model (checkpoint-and-restart at Daly's interval, or dropping a failed replica) is
scaling.plan.reliability's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scaling.errors import ConfigError
from scaling.plan.efficiency import RECIPES
from scaling.plan.hardware import get_gpu
from scaling.plan.reliability import (
    CHECKPOINT_MINUTES,
    GPU_MTBF_HOURS,
    RECONFIGURE_MINUTES,
    REPAIR_HOURS,
    RESTART_MINUTES,
    checkpoint_goodput,
    drop_replica_goodput,
    optimal_checkpoint_interval,
)
from scaling.plan.stepmodel import StepResult

SECONDS_PER_DAY = 86_400.0


def train_days(flops: float, gpus: int, gpu: str = "h100", precision: str = "bf16", *, mfu: float) -> float:
    """Wall-clock days to run `flops` on `gpus` GPUs without failures: F / (K * peak * mfu * 86400).

    `mfu` is relative to `precision`'s peak over all K GPUs: from the step model
    (`cluster_step` -> `step_mfu`) or measured on a real stack.
    """
    if not flops > 0:
        raise ConfigError("flops", flops, "a positive number of FLOPs")
    peak = get_gpu(gpu).peak(precision)
    if not 0 < mfu <= 1:
        raise ConfigError("mfu", mfu, "a fraction in (0, 1]")
    if gpus < 1:
        raise ConfigError("gpus", gpus, "an integer >= 1")
    return flops / (gpus * peak * mfu * SECONDS_PER_DAY)


def step_rate(result: StepResult) -> str:
    """The tensor-core rate (bf16, fp8, fp4) a step's precision recipe runs its GEMMs at."""
    return RECIPES[result.precision].rate


def step_mfu(result: StepResult, gpus: int) -> float:
    """Model FLOPs utilisation of a step over all `gpus` GPUs of the cluster (spares included)."""
    return result.model_flops / result.step_seconds / (gpus * result.gpu.peak_tflops[step_rate(result)] * 1e12)


def describe_layout(result: StepResult) -> str:
    """The layout of a step in short: 'tp2 pp8 vpp4 dp64 ep64 m240 selective'."""
    lay = result.layout
    parts = [f"tp{lay.tp}", f"pp{lay.pp}"] + [f"{k}{getattr(lay, k)}" for k in ("vpp", "cp") if getattr(lay, k) > 1]
    parts.append(f"dp{lay.dp}")
    if lay.ep > 1:
        parts.append(f"ep{lay.ep}" + (f"/etp{lay.expert_tp}" if lay.expert_tp > 1 else ""))
    return " ".join(parts + [f"m{lay.micro_batches}", lay.recompute])


@dataclass(frozen=True)
class RunPlan:
    """One row of the days table: ideal days, then wall days under each failure strategy."""

    gpus: int
    mfu: float
    days: float
    checkpoint_interval_hours: float
    checkpoint_goodput: float
    drop_replica_goodput: float
    layout: str = ""  # the step-model layout the days come from ('' for a given MFU)
    memory_gib: float | None = None  # that step's peak on its busiest GPU (None for a given MFU)
    fits: bool = True  # whether that peak fits in the GPU's memory

    @property
    def checkpoint_days(self) -> float:
        return self.days / self.checkpoint_goodput

    @property
    def drop_replica_days(self) -> float:
        return self.days / self.drop_replica_goodput


def plan_run(
    flops: float,
    gpus: int,
    gpu: str = "h100",
    precision: str = "bf16",
    mfu: float | None = None,
    replica_gpus: int | None = None,
    gpu_mtbf_hours: float = GPU_MTBF_HOURS,
    checkpoint_minutes: float = CHECKPOINT_MINUTES,
    restart_minutes: float = RESTART_MINUTES,
    repair_hours: float = REPAIR_HOURS,
    reconfigure_minutes: float = RECONFIGURE_MINUTES,
    step: StepResult | None = None,
) -> RunPlan:
    """Days on `gpus` GPUs and the goodput of both failure strategies (checkpoint at Daly's optimum).

    The utilisation is a step-model `step` on this cluster (`cluster_step`) or a given `mfu`.
    A failure takes down a replica of `replica_gpus` GPUs (default: the step's tp x cp x pp, or
    for MoE the pp stages of the smallest group that holds every expert, lcm(tp cp, ep etp) x pp;
    8 with a given MFU).
    """
    if step is not None:
        mfu, precision = step_mfu(step, gpus), step_rate(step)
        lay = step.layout
        if replica_gpus is None:
            replica_gpus = math.lcm(lay.tp * lay.cp, lay.ep * lay.expert_tp) * lay.pp
    elif mfu is None:
        raise ConfigError("mfu", mfu, "a measured MFU in (0, 1], or a step-model step (scaling plan --model)")
    replica_gpus = min(gpus, replica_gpus or 8)
    job_mtbf = gpu_mtbf_hours / gpus
    checkpoint_hours = checkpoint_minutes / 60
    interval = optimal_checkpoint_interval(job_mtbf, checkpoint_hours)
    return RunPlan(
        gpus=gpus,
        mfu=mfu,
        days=train_days(flops, gpus, gpu, precision, mfu=mfu),
        checkpoint_interval_hours=interval,
        checkpoint_goodput=checkpoint_goodput(job_mtbf, interval, checkpoint_hours, restart_minutes / 60),
        drop_replica_goodput=drop_replica_goodput(gpus, replica_gpus, gpu_mtbf_hours, repair_hours, reconfigure_minutes / 60),
        layout=(describe_layout(step) + (f" ({gpus - step.layout.gpus:,} idle)" if step.layout.gpus < gpus else ""))
        if step is not None else "",
        memory_gib=step.memory.total / 2**30 if step is not None else None,
        fits=step is None or step.memory.total <= step.gpu.memory_bytes,
    )


def run_days(result: StepResult, tokens: float, **failure_options: float) -> RunPlan:
    """The RunPlan of training on `tokens` tokens at this step's speed: the failure-free days are
    tokens / (tokens/s of the step); the failure model (checkpoint-and-restart at Daly's interval, or
    dropping a failed replica: tp*cp*pp GPUs, for MoE lcm(tp*cp, ep*etp)*pp) is plan_run's."""
    return plan_run(result.model_flops / result.tokens * tokens, result.layout.gpus, result.gpu_key,
                    step=result, **failure_options)
