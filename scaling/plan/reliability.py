"""Failures on a GPU cluster, pure math: how many a run meets (Poisson GPU failures), and the useful
fraction of wall time under checkpoint-and-restart (Young/Daly) or when a failed data-parallel
replica is dropped and training goes on."""

from __future__ import annotations

import math

from scaling.errors import ConfigError

HOURS_PER_DAY = 24.0

# Llama 3 (Dubey et al. 2024, Sec. 3.3.4): 419 unexpected interruptions in a 54-day snapshot on
# 16,384 H100 GPUs -> 54 * 24 * 16,384 / 419 = 50,677 GPU-hours between failures per GPU
# (host, network and software faults attributed per GPU): the whole job fails every ~3.1 h.
GPU_MTBF_HOURS = 54 * 24 * 16_384 / 419
# Assumptions, not measurements (change them on the command line): a sharded checkpoint
# written synchronously to a parallel file system in 5 minutes; 20 minutes to reschedule,
# reload and warm up after a crash; 4 hours to bring a failed node back (swap or drain and
# replace); 1 minute for the survivors to re-form collectives when a replica is dropped.
CHECKPOINT_MINUTES = 5.0
RESTART_MINUTES = 20.0
REPAIR_HOURS = 4.0
RECONFIGURE_MINUTES = 1.0


def expected_interruptions(days: float, gpus: int, gpu_mtbf_hours: float = GPU_MTBF_HOURS) -> float:
    """Expected failures in `days` on `gpus` GPUs with independent exponential failures: T*K/MTBF."""
    return days * HOURS_PER_DAY * gpus / gpu_mtbf_hours


def optimal_checkpoint_interval(job_mtbf_hours: float, checkpoint_hours: float) -> float:
    """Daly's (2006) higher-order optimum of the compute time between checkpoints.

    tau = sqrt(2 d M) * (1 + sqrt(d / 2M) / 3 + (d / 2M) / 9) - d   for d < 2M, else M
    (Young 1974's first-order sqrt(2 d M) plus corrections), M = job MTBF, d = checkpoint cost.
    """
    m, d = job_mtbf_hours, checkpoint_hours
    if d >= 2 * m:
        return m
    x = d / (2 * m)
    return math.sqrt(2 * d * m) * (1 + math.sqrt(x) / 3 + x / 9) - d


def checkpoint_goodput(job_mtbf_hours: float, interval_hours: float, checkpoint_hours: float, restart_hours: float) -> float:
    """Useful fraction of wall time with checkpoint-and-restart (exact for exponential failures).

    Each segment is tau of compute followed by a checkpoint of cost d. A failure (rate 1/M, also
    during checkpoints and restarts) loses the segment's progress, then costs a restart R before
    the segment is redone. The expected wall time per segment (Daly 2006, eq. 12) is
        E[T] = M * exp(R/M) * (exp((tau + d)/M) - 1),   goodput = tau / E[T].
    """
    m, tau = job_mtbf_hours, interval_hours
    return tau / (m * math.exp(restart_hours / m) * math.expm1((tau + checkpoint_hours) / m))


def drop_replica_goodput(
    gpus: int,
    replica_gpus: int,
    gpu_mtbf_hours: float = GPU_MTBF_HOURS,
    repair_hours: float = REPAIR_HOURS,
    reconfigure_hours: float = RECONFIGURE_MINUTES / 60,
) -> float:
    """Useful fraction of full-cluster throughput when a failed replica is dropped and training goes on.

    n = gpus // replica_gpus replicas, independent; a replica fails at rate replica_gpus / MTBF_gpu
    while up (mean up time m = MTBF_gpu / replica_gpus) and rejoins after T_r = `repair_hours`.
    Throughput is proportional to live replicas (per-replica batch kept), and every failure
    stalls the whole job for c = `reconfigure_hours` while collectives are re-formed (c <= T_r).
    By renewal-reward a replica is up a fraction A = m / (m + T_r) and inside its own stall
    window a fraction q = c / (m + T_r); an up replica is never in its window, so
        goodput = (1/n) sum_i P(i up, no replica in its window) = A * (1 - q)^(n - 1).
    """
    if not 1 <= replica_gpus <= gpus:
        raise ConfigError("replica_gpus", replica_gpus, f"1..{gpus} (the GPU count)")
    if reconfigure_hours > repair_hours:
        raise ConfigError("reconfigure_hours", reconfigure_hours, f"at most the repair time ({repair_hours} h)")
    replicas = gpus // replica_gpus  # leftover GPUs, if any, idle as spares
    cycle_hours = gpu_mtbf_hours / replica_gpus + repair_hours
    availability = (gpu_mtbf_hours / replica_gpus) / cycle_hours
    return availability * (1 - reconfigure_hours / cycle_hours) ** (replicas - 1)
