"""From FLOPs to days, memory and failures on a GPU cluster (`scaling plan`).

Four small analytical models, pure Python (no JAX, no SciPy: the verb must start fast):

1. Time. days = F / (model FLOPs per second of the cluster), from the op-by-op step model
   (scaling.plan.stepmodel) of a model laid out on the cluster (`cluster_step`, CLUSTER_RECIPES: the
   talk's H100 table of issue #6 recomputed from written-down layouts), or from an MFU the user
   measured (`--mfu`).
2. Memory per GPU: the step model's busiest GPU (scaling.plan.stepmodel.stage_memory) under the
   layout the days come from; any other layout: `scaling plan step --model 7e9 --layout ...`.
3. Reliability (`expected_interruptions`, `checkpoint_goodput`, `drop_replica_goodput`):
   Poisson GPU failures; checkpoint-and-restart (Young/Daly) vs dropping a failed
   data-parallel replica and carrying on.
4. The tie to the science (`plan_fit`): a fitted law's compute-optimal (N, D, P) turned into
   days and memory, with P (bits) mapped to the hardware format that runs it.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from scaling.errors import ConfigError
from scaling.plan.hardware import GPUS, PRECISIONS, canonical_precision, get_gpu, precision_for_bits

# `scaling plan step ...`: one training step op by op (time, memory, breakdown) in its own module
SUBCOMMANDS = {"step": "scaling.plan.stepmodel"}

SECONDS_PER_DAY = 86_400.0
HOURS_PER_DAY = 24.0


# --------------------------------------------------------------------------------------------
# Time
# --------------------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class ClusterRecipe:
    """How a model is laid out on a cluster of any size.

    `layout`: the model-parallel part (stepmodel layout keys and flags, no dp). On K GPUs
    `cluster_step` keeps tp, cp, ep, etp and the overlaps, tries pp from half to twice the
    recipe's (vpp keeping the recipe's pp x vpp chunks) and the recipe's recompute or full
    recompute, fills the cluster with data parallelism (dp the largest that fits in K with ep x
    etp dividing tp x cp x dp; the GPUs left over idle as spares) and keeps the one with the
    highest throughput that fits memory. The global batch is fixed in sequences (rounded to whole
    micro-batches per replica, at least pp), or None: `micro_batches` per replica, times pp / 2
    under pipeline parallelism (weak scaling).
    """

    layout: str
    seq_len: int
    global_batch: int | None
    recompute: str = "selective"
    micro_batches: int = 8
    source: str = ""


# Written-down layouts for the talk's table (H100, Megatron practice: distributed optimizer with
# overlapped gradient reduce-scatter and parameter all-gather, sequence parallel under TP):
CLUSTER_RECIPES: dict[str, ClusterRecipe] = {
    "deepseek-v3": ClusterRecipe(
        "tp=2,pp=8,vpp=4,ep=64,etp=1,a2ao=1,deepep=1,ogr=1,opg=1", 4096, 15360,
        source="Megatron-Bridge's 1,024-H100 DeepSeek-V3 recipe (perf_recipes/deepseek/h100: TP2 PP8 VP4 EP64, DeepEP, "
               "1F1B all-to-all overlap, recompute of MLA up-projections); DeepSeek-V3's batch of 15,360 x 4,096 tokens"),
    "kimi-k2": ClusterRecipe(
        "tp=2,pp=16,vpp=2,ep=64,etp=1,a2ao=1,deepep=1,ogr=1,opg=1", 4096, 16384,
        source="the DeepSeek-V3 recipe with PP16 VP2 for Kimi K2's 1.5x experts (the fastest layout `scaling plan step "
               "--search` finds on 1,024 H100s); Kimi K2's batch of 67M tokens (Kimi Team 2025, Sec. 3)"),
    "gpt4-reported": ClusterRecipe(
        "tp=8,pp=8,vpp=5,ep=16,etp=8,a2ao=1,ogr=1,opg=1,tpo=1", 8192, 7324,
        source="TP8 with experts split over the same 8 GPUs (Megatron's default expert TP = TP), 16 experts over 16 "
               "nodes, PP8 VP5 (3 layers per virtual stage); the reported batch of 60M tokens at 8K"),
    "llama3-405b": ClusterRecipe(
        "tp=8,pp=16,vpp=4,ogr=1,opg=1", 8192, 2048, recompute="none",
        source="Llama 3 405B's layout on 8K-16K H100s (Dubey et al. 2024, Table 4: TP8 PP16, 16M-token batches)"),
}
# Dense shapes without a recipe (a fitted law's compute optimum): TP8 inside a node, PP8 (4-16
# after cluster_step's choice), 4 pp micro-batches per replica.
DENSE_RECIPE = ClusterRecipe("tp=8,pp=8,ogr=1,opg=1,tpo=1", 4096, None, recompute="none")

# The talk's H100 table (issue #6): training FLOPs and BF16 days on 1,024 / 5,000 / 10,000 H100s.
# What `scaling plan --flops F --model M` is checked against (docs/planner.md; tests/plan/test_plan.py).
TALK_TABLE: dict[str, tuple[str, float, dict[int, float]]] = {
    "DeepSeek-V3": ("deepseek-v3", 3.4e24, {1024: 97, 5000: 22, 10000: 13}),
    "Kimi K2": ("kimi-k2", 2.98e24, {1024: 85, 5000: 19, 10000: 11}),
    "GPT-4": ("gpt4-reported", 2.1e25, {1024: 602, 5000: 137, 10000: 80}),
}


def cluster_step(model: Any, gpu: str, gpus: int, precision: str, recipe: ClusterRecipe) -> Any:
    """The step of `model` on `gpus` GPUs under `recipe` (see ClusterRecipe): a stepmodel.StepResult."""
    from scaling.plan import stepmodel  # pure Python; imported here to keep the modules' import graph acyclic

    if not (isinstance(gpus, int) and gpus >= 1):
        raise ConfigError("gpus", gpus, "an integer >= 1")
    ref = stepmodel.parse_step_layout(recipe.layout)
    chunks = ref.pp * ref.vpp
    best, best_key = None, None
    # pp from half to twice the recipe's, within the model's layers (a model of fewer layers than half
    # the recipe's pp still gets pp = its layers and below)
    for pp in range(max(1, min(ref.pp // 2, model.layers)), min(model.layers, 2 * ref.pp) + 1):
        vpp = max(1, chunks // pp) if pp > 1 and not ref.dualpipe else 1
        if pp * vpp > model.layers or (ref.dualpipe and pp % 2):
            continue
        for recompute in dict.fromkeys((recipe.recompute, "full")):
            base = replace(ref, pp=pp, vpp=vpp, recompute=recompute)
            replica = base.tp * base.cp * pp
            unit = base.ep * base.expert_tp // math.gcd(base.tp * base.cp, base.ep * base.expert_tp)
            dp = gpus // replica // unit * unit
            if dp < 1:
                continue
            m = max(pp, round(recipe.global_batch / dp)) if recipe.global_batch else recipe.micro_batches * max(1, pp // 2)
            try:
                r = stepmodel.step(model, gpu, replace(base, dp=dp, micro_batches=m), precision, recipe.seq_len)
            except ConfigError:
                continue  # a pp the model cannot take (heads, tokens)
            key = (r.memory.total <= r.gpu.memory_bytes, r.model_flops / r.step_seconds)
            if best_key is None or key > best_key:
                best, best_key = r, key
    if best is None:
        smallest = ref.tp * ref.cp * max(1, ref.pp // 2) * ref.ep * ref.expert_tp // math.gcd(ref.tp * ref.cp, ref.ep * ref.expert_tp)
        raise ConfigError("gpus", gpus, f"at least {smallest} GPUs for {model.name} laid out as {recipe.layout}")
    return best


def step_mfu(result: Any, gpus: int) -> float:
    """Model FLOPs utilisation of a step over all `gpus` GPUs of the cluster (spares included)."""
    return result.model_flops / result.step_seconds / (gpus * result.gpu.peak_tflops[step_rate(result)] * 1e12)


def describe_layout(result: Any) -> str:
    """The layout of a step in short: 'tp2 pp8 vpp4 dp64 ep64 m240 selective'."""
    lay = result.layout
    parts = [f"tp{lay.tp}", f"pp{lay.pp}"] + [f"{k}{getattr(lay, k)}" for k in ("vpp", "cp") if getattr(lay, k) > 1]
    parts.append(f"dp{lay.dp}")
    if lay.ep > 1:
        parts.append(f"ep{lay.ep}" + (f"/etp{lay.expert_tp}" if lay.expert_tp > 1 else ""))
    return " ".join(parts + [f"m{lay.micro_batches}", lay.recompute])


# --------------------------------------------------------------------------------------------
# Reliability
# --------------------------------------------------------------------------------------------

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
    step: Any = None,
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


def step_rate(result: Any) -> str:
    """The tensor-core rate (bf16, fp8, fp4) a step's precision recipe runs its GEMMs at."""
    from scaling.plan import stepmodel

    return stepmodel.RECIPES[result.precision].rate


# --------------------------------------------------------------------------------------------
# The tie to the science: a fitted law's compute optimum on real hardware
# --------------------------------------------------------------------------------------------


def training_flops(params: float, tokens: float) -> float:
    """Hardware FLOPs of a training run, 6 N D (Kaplan et al. 2020); P sets the peak, not the count."""
    return 6.0 * params * tokens


def compute_for_target_loss(
    fit_result: Any,
    target_loss: float,
    optimize: Callable[..., dict],
    low: float = 1e15,
    high: float = 1e30,
) -> float:
    """Smallest compute C whose compute-optimal loss reaches `target_loss`: Brent's root on log10 C.

    `optimize(fit_result, compute=C)` returns a dict with 'loss' (scaling.study.optimal.optimal_precision);
    the optimal loss falls monotonically with C, so the root is unique; solved to 0.1% in C.
    """
    from scipy.optimize import brentq  # lazy: only the --fit path pays for SciPy

    def excess(log10_c: float) -> float:
        return optimize(fit_result, compute=10**log10_c)["loss"] - target_loss

    at_high = excess(math.log10(high))
    if at_high > 0:
        raise ConfigError("target-loss", target_loss, f"a loss the law reaches with <= {high:.0e} FLOPs "
                          f"(it gives {at_high + target_loss:.4g} there)")
    if excess(math.log10(low)) <= 0:
        return low
    return 10 ** brentq(excess, math.log10(low), math.log10(high), xtol=math.log10(1.001))


@dataclass(frozen=True)
class PrecisionPlan:
    """A compute-optimal (N, D, P) point and what it costs on the cluster."""

    bits: float
    hardware_precision: str
    params: float
    tokens: float
    loss: float
    flops: float
    runs: tuple[RunPlan, ...]


def plan_optimum(point: dict, gpus: list[int], gpu: str = "h100", recipe: ClusterRecipe = DENSE_RECIPE,
                 mfu: float | None = None, **run_options: Any) -> PrecisionPlan:
    """Days on each cluster size for one (P, N, D, loss) point, at the hardware format for P bits:
    the point's dense GPT shape (`stepmodel.gpt_for_params`) stepped on each cluster under `recipe`, or a given `mfu`."""
    from scaling.plan import stepmodel

    precision = precision_for_bits(float(point["P"]), gpu)
    flops = training_flops(float(point["N"]), float(point["D"]))
    if mfu is not None:
        runs = tuple(plan_run(flops, k, gpu, precision, mfu, **run_options) for k in gpus)
    else:
        tp = stepmodel.parse_step_layout(recipe.layout).tp
        model = stepmodel.gpt_for_params(float(point["N"]), tp)
        step_recipe = stepmodel.RECIPE_FOR_FORMAT[precision]
        runs = tuple(plan_run(flops, k, gpu, step=cluster_step(model, gpu, k, step_recipe, recipe), **run_options)
                     for k in gpus)
    return PrecisionPlan(float(point["P"]), precision, float(point["N"]), float(point["D"]), float(point["loss"]), flops, runs)


def plan_fit(
    fit_path: str | Path,
    gpus: list[int],
    gpu: str = "h100",
    compute: float | None = None,
    target_loss: float | None = None,
    **run_options: Any,
) -> tuple[float, PrecisionPlan, list[PrecisionPlan]]:
    """(compute, the optimum's plan, one plan per precision) for a fitted law at `compute` or `target_loss`."""
    from scaling.study import fit, optimal  # lazy: keeps `scaling plan --flops` free of the fitting stack

    if (compute is None) == (target_loss is None):
        raise ConfigError("fit", str(fit_path), "exactly one of --compute or --target-loss")
    if not Path(fit_path).is_file():
        raise ConfigError("fit", str(fit_path), "an existing fitted-law JSON file (fits/NAME.json)")
    fit_result = fit.FitResult.from_json(fit_path)
    if compute is None:
        compute = compute_for_target_loss(fit_result, target_loss, optimal.optimal_precision)
    best = optimal.optimal_precision(fit_result, compute=compute)
    per_precision = [plan_optimum(row, gpus, gpu, **run_options) for row in best["per_precision"].to_dict("records")]
    return compute, plan_optimum(best, gpus, gpu, **run_options), per_precision


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _positive(key: str, text: str, kind: type = float) -> Any:
    try:
        value = kind(float(text)) if kind is int else kind(text)
    except (ValueError, OverflowError):
        value = None
    if value is None or not math.isfinite(value) or value <= 0 or (kind is int and float(text) != value):
        raise ConfigError(key, text, f"a positive {'integer' if kind is int else 'number'}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Training days, memory per GPU and failure goodput on a GPU cluster. "
        "Examples: `scaling plan --flops 3.4e24 --model deepseek-v3 --gpus 1024 5000 10000`; "
        "`scaling plan --fit fits/NAME.json --compute 1e21 --gpus 1024`. "
        "One step op by op (time, memory per GPU, breakdown) for any model and layout: `scaling plan step --help`."
    )
    what = parser.add_argument_group("what to plan (one or more)")
    what.add_argument("--flops", help="training FLOPs, e.g. 3.4e24: print days per cluster size (with --model or --mfu)")
    what.add_argument("--model", help=f"with --flops: the model whose step on the cluster sets the speed: "
                      f"{', '.join(CLUSTER_RECIPES)} (their layouts: docs/planner.md)")
    what.add_argument("--fit", help="fitted law (fits/NAME.json): plan its compute-optimal (N, D, P)")
    what.add_argument("--compute", help="with --fit: training compute in FLOPs")
    what.add_argument("--target-loss", help="with --fit: the loss to reach (compute found by bisection)")
    hw = parser.add_argument_group("cluster")
    hw.add_argument("--gpus", nargs="+", default=["1024", "5000", "10000"], help="cluster sizes (default: 1024 5000 10000)")
    hw.add_argument("--gpu", default="h100", help=f"one of {', '.join(GPUS)} (default h100)")
    hw.add_argument("--precision", default="bf16", help=f"one of {', '.join(PRECISIONS)} (default bf16; --fit uses P)")
    hw.add_argument("--mfu", help="a measured MFU relative to the precision's peak, instead of the step model")
    hw.add_argument("--layout", help="with --fit: tp=,pp= of the optimum's dense shape (dp fills the cluster; "
                    "default tp=8 and a pp of 4-16)")
    hw.add_argument("--seq-len", default="4096", help="with --fit: sequence length (default 4096)")
    rel = parser.add_argument_group("reliability")
    rel.add_argument("--mtbf-hours", default=str(GPU_MTBF_HOURS), help="per-GPU MTBF in hours (default: Llama 3, 50,677)")
    rel.add_argument("--checkpoint-minutes", default=str(CHECKPOINT_MINUTES), help="checkpoint write cost")
    rel.add_argument("--restart-minutes", default=str(RESTART_MINUTES), help="restart cost after a crash")
    rel.add_argument("--repair-hours", default=str(REPAIR_HOURS), help="time until a dropped replica rejoins")
    rel.add_argument("--replica-gpus", help="GPUs a failure takes down with drop-replica (default: the step's replica, else 8)")


def _run_options(args: argparse.Namespace) -> dict[str, Any]:
    return dict(
        replica_gpus=_positive("replica-gpus", args.replica_gpus, int) if args.replica_gpus else None,
        gpu_mtbf_hours=_positive("mtbf-hours", args.mtbf_hours),
        checkpoint_minutes=_positive("checkpoint-minutes", args.checkpoint_minutes),
        restart_minutes=_positive("restart-minutes", args.restart_minutes),
        repair_hours=_positive("repair-hours", args.repair_hours),
    )


def format_runs(runs: tuple[RunPlan, ...] | list[RunPlan], gpu_mtbf_hours: float) -> str:
    """Days table: failure-free days, then checkpoint-and-restart and drop-a-failed-replica."""
    lines = [
        f"{'':>7} {'':>6} {'no failures':>11} | {'checkpoint-and-restart':^37} | {'drop a failed replica':^21} |",
        f"{'GPUs':>7} {'MFU':>6} {'days':>11} | {'every':>7} {'goodput':>8} {'days':>8} {'failures':>10} | {'goodput':>10} {'days':>10} |"
        + (" GiB/GPU step-model layout" if any(r.layout for r in runs) else ""),
    ]
    for r in runs:
        failures = expected_interruptions(r.checkpoint_days, r.gpus, gpu_mtbf_hours)
        lines.append(
            f"{r.gpus:>7,} {r.mfu:>6.3f} {r.days:>11.4g} | {r.checkpoint_interval_hours * 60:>5.0f} m {r.checkpoint_goodput:>8.3f}"
            f" {r.checkpoint_days:>8.4g} {failures:>10,.0f} | {r.drop_replica_goodput:>10.3f} {r.drop_replica_days:>10.4g} |"
            + (f" {r.memory_gib:>7.1f} {r.layout}" + ("" if r.fits else " (does NOT fit)") if r.layout else "")
        )
    return "\n".join(lines)


def _step_speedup(gpu: str, gpus: int, recipe: ClusterRecipe, best: PrecisionPlan) -> str:
    """The optimum's P-bit recipe against BF16 through the op-by-op step model, on the first
    cluster size and the layout its days come from."""
    from scaling.plan import stepmodel  # pure Python too

    model = stepmodel.gpt_for_params(best.params, stepmodel.parse_step_layout(recipe.layout).tp)
    try:
        low = cluster_step(model, gpu, gpus, stepmodel.RECIPE_FOR_FORMAT[best.hardware_precision], recipe)
        base = stepmodel.step(model, gpu, low.layout, "bf16", recipe.seq_len)
    except ConfigError as e:  # a layout the optimum's shape cannot take: say so, the rest of the plan stands
        return f"step model: not priced ({e})"
    return stepmodel.format_speedup(base, low)


def _model_runs(args: argparse.Namespace, flops: float, gpus: list[int], precision: str,
                options: dict[str, Any]) -> tuple[list[RunPlan], str]:
    """Days on each cluster size from --model's step under its CLUSTER_RECIPES layout."""
    from scaling.plan import stepmodel

    if args.model is None or args.model.lower() not in CLUSTER_RECIPES:
        raise ConfigError("model", args.model, f"one of {', '.join(CLUSTER_RECIPES)} with --flops (its step on the cluster "
                          "sets the speed), or --mfu for a measured utilisation")
    model = stepmodel.load_model(args.model)
    recipe = CLUSTER_RECIPES[args.model.lower()]
    step_recipe = stepmodel.RECIPE_FOR_FORMAT.get(precision)
    if step_recipe is None:
        raise ConfigError("precision", precision, f"one of {', '.join(stepmodel.RECIPE_FOR_FORMAT)} with --model")
    runs = [plan_run(flops, k, args.gpu, step=cluster_step(model, args.gpu, k, step_recipe, recipe), **options) for k in gpus]
    return runs, (f"{model.name} stepped on each cluster (seq {recipe.seq_len}, "
                  f"{recipe.global_batch:,} sequences per step)")


def main(args: argparse.Namespace) -> int:
    from scaling.plan import stepmodel

    if args.fit is None and (args.compute or args.target_loss or args.layout):
        raise ConfigError("compute/target-loss/layout", args.compute or args.target_loss or args.layout, "only together with --fit")
    if args.flops is None and args.fit is None:
        raise ConfigError("plan", "nothing", "--flops or --fit (memory and time of one step for any layout: scaling plan step)")
    spec = get_gpu(args.gpu)
    gpus = [_positive("gpus", g, int) for g in args.gpus]
    mfu = _positive("mfu", args.mfu) if args.mfu else None
    if mfu is not None and mfu > 1:
        raise ConfigError("mfu", args.mfu, "a fraction in (0, 1]")
    options = _run_options(args)

    sections: list[str] = []
    if args.flops is not None:
        flops = _positive("flops", args.flops)
        precision = canonical_precision(args.precision)
        spec.peak(precision)  # ConfigError if this GPU lacks the precision
        if mfu is not None:
            runs, how = [plan_run(flops, k, args.gpu, precision, mfu, **options) for k in gpus], f"MFU {mfu:g} (given)"
        else:
            runs, how = _model_runs(args, flops, gpus, precision, options)
        sections.append(
            f"{flops:.3g} FLOPs on {spec.name}, {precision} (dense peak {spec.peak_tflops[precision]:,.0f} TFLOP/s per GPU), {how}\n"
            + format_runs(runs, options["gpu_mtbf_hours"])
        )

    if args.fit is not None:
        compute = _positive("compute", args.compute) if args.compute else None
        target = _positive("target-loss", args.target_loss) if args.target_loss else None
        # the fit's dense shapes are stepped with --layout's tp and pp when given, else DENSE_RECIPE
        recipe = replace(DENSE_RECIPE, seq_len=_positive("seq-len", args.seq_len, int))
        if args.layout:
            lay = stepmodel.parse_step_layout(args.layout)
            recipe = replace(recipe, layout=f"tp={lay.tp},pp={lay.pp},ogr=1,opg=1" + (",tpo=1" if lay.tp > 1 else ""))
        compute, best, per_precision = plan_fit(args.fit, gpus, args.gpu, compute, target, recipe=recipe, mfu=mfu, **options)
        lines = [
            f"fit {args.fit}: compute {compute:.3g} FLOPs" + (f" (reaches loss {target:g})" if target else ""),
            f"{'P':>5} {'format':>6} {'N':>10} {'D':>10} {'loss':>8} {'6ND':>10} " + " ".join(f"{f'days@{k}':>11}" for k in gpus),
        ]
        for p in per_precision:
            mark = "  <- optimal" if p.bits == best.bits else ""
            lines.append(f"{p.bits:>5g} {p.hardware_precision:>6} {p.params:>10.3g} {p.tokens:>10.3g} {p.loss:>8.4f} {p.flops:>10.3g} "
                         + " ".join(f"{r.days:>11.3g}" for r in p.runs) + mark)
        sections.append("\n".join(lines))
        sections.append(
            f"optimum P={best.bits:.3g} bits -> {best.hardware_precision} on {spec.name}, N={best.params:.3g}, D={best.tokens:.3g}\n"
            + format_runs(best.runs, options["gpu_mtbf_hours"])
        )
        sections.append(_step_speedup(args.gpu, gpus[0], recipe, best))
    print("\n\n".join(sections))
    return 0
