"""`scaling plan`: training days, memory per GPU and failure goodput on a GPU cluster, from FLOPs and a
model's step on the cluster, a measured MFU, or a fitted law's compute optimum (which this module loads
and optimises with scaling.study, then prices with scaling.plan). `scaling plan step` and
`scaling plan validate` are their own modules (scaling.cli.SUBVERBS).

scaling.plan is pure Python (tests/test_layout.py), so this module and its subcommands' modules import it at
the top: their --help lists its GPUs, models and recipes; the fitting stack comes in only with --fit."""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from pathlib import Path

from scaling.errors import ConfigError
from scaling.plan.cluster import (
    CLUSTER_RECIPES,
    DENSE_RECIPE,
    ClusterRecipe,
    PrecisionPlan,
    cluster_step,
    compute_for_target_loss,
    optimum_speedup,
    plan_optimum,
)
from scaling.plan.efficiency import RECIPE_FOR_FORMAT, recipe_for_format
from scaling.plan.hardware import GPUS, PRECISIONS, canonical_precision, get_gpu
from scaling.plan.layout import parse_step_layout
from scaling.plan.reliability import (
    CHECKPOINT_MINUTES,
    GPU_MTBF_HOURS,
    REPAIR_HOURS,
    RESTART_MINUTES,
    expected_interruptions,
)
from scaling.plan.runplan import RunPlan, plan_run
from scaling.plan.shapes import load_model
from scaling.plan.stepmodel import CATEGORIES, StepResult, breakdown

def _positive(key: str, text: str, kind: type = float) -> float | int:
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
    what.add_argument("--compute", help="with --fit: training compute in 16-bit FLOP units under the `bits` cost model "
                      "(as `scaling optimal`: a FLOP at P bits counts P/16), e.g. 1e22")
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


def _run_options(args: argparse.Namespace) -> dict[str, float | None]:
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


def format_speedup(base: StepResult, low: StepResult) -> str:
    """A P-bit recipe's step against BF16's on the same layout: the ratio, then ms per step by category."""
    b, q = breakdown(base), breakdown(low)
    lay = low.layout
    overlaps = ",".join(k for k, on in (("tpo", lay.tp_overlap), ("ogr", lay.overlap_grad_reduce),
                                        ("opg", lay.overlap_param_gather)) if on)
    lines = [f"step model ({lay.gpus} x {low.gpu.name}, {base.model.name}, seq {base.seq_len}, "
             f"tp={lay.tp} pp={lay.pp} dp={lay.dp}, {lay.micro_batches} micro-batches, recompute {lay.recompute}"
             + (f", overlaps {overlaps}" if overlaps else "") + "): "
             f"{low.precision} step {low.step_seconds * 1e3:,.1f} ms vs bf16 {base.step_seconds * 1e3:,.1f} ms: "
             f"{base.step_seconds / low.step_seconds:.2f}x faster",
             f"  {'ms per step':<16} {'bf16':>10} {low.precision:>10}"]
    lines += [f"  {k:<16} {b[k] * 1e3:>10.1f} {q[k] * 1e3:>10.1f}" for k in CATEGORIES if b[k] or q[k]]
    return "\n".join(lines)


def _step_speedup(gpu: str, gpus: int, recipe: ClusterRecipe, best: PrecisionPlan) -> str:
    """The optimum's P-bit recipe against BF16 through the op-by-op step model, on the first
    cluster size and the layout its days come from."""
    try:
        base, low = optimum_speedup(best, gpu, gpus, recipe)
    except ConfigError as e:  # a layout the optimum's shape cannot take: say so, the rest of the plan stands
        return f"step model: not priced ({e})"
    return format_speedup(base, low)


def _model_runs(args: argparse.Namespace, flops: float, gpus: list[int], precision: str,
                options: dict[str, float | None]) -> tuple[list[RunPlan], str]:
    """Days on each cluster size from --model's step under its CLUSTER_RECIPES layout."""
    if args.model is None or args.model.lower() not in CLUSTER_RECIPES:
        raise ConfigError("model", args.model, f"one of {', '.join(CLUSTER_RECIPES)} with --flops (its step on the cluster "
                          "sets the speed), or --mfu for a measured utilisation")
    model = load_model(args.model)
    recipe = CLUSTER_RECIPES[args.model.lower()]
    if precision not in RECIPE_FOR_FORMAT:
        raise ConfigError("precision", precision, f"one of {', '.join(RECIPE_FOR_FORMAT)} with --model")
    step_recipe = recipe_for_format(precision, get_gpu(args.gpu))
    runs = [plan_run(flops, k, args.gpu, step=cluster_step(model, args.gpu, k, step_recipe, recipe), **options) for k in gpus]
    return runs, (f"{model.name} stepped on each cluster (seq {recipe.seq_len}, "
                  f"{recipe.global_batch:,} sequences per step)")


def plan_fit(
    fit_path: str | Path,
    gpus: list[int],
    gpu: str = "h100",
    compute: float | None = None,
    target_loss: float | None = None,
    **plan_options: ClusterRecipe | float | None,
) -> tuple[float, PrecisionPlan, list[PrecisionPlan], dict]:
    """(compute, the optimum's plan, one plan per precision, the optimum check) for a fitted law at
    `compute` or `target_loss`: the law's compute optimum (scaling.study.analysis.pstar.optimal, under the cost model
    `scaling optimal` uses by default: `bits` with the fit's runs' unquantised share) priced by
    scaling.plan.cluster.plan_optimum. The check is scaling.study.analysis.pstar.optimum_check's, the one `scaling
    optimal` prints: where no optimum exists, a one-line ConfigError naming every reason."""
    # lazy: keeps `scaling plan --flops` free of the fitting stack
    from scaling.study.analysis import fit, laws
    from scaling.study.analysis.pstar import optimal, optimum_check

    if (compute is None) == (target_loss is None):
        raise ConfigError("fit", str(fit_path), "exactly one of --compute or --target-loss")
    if not Path(fit_path).is_file():
        raise ConfigError("fit", str(fit_path), "an existing fitted-law JSON file (fits/NAME.json)")
    fit_result = fit.FitResult.from_json(fit_path)
    cost = optimal.Cost(share=optimal.share_of(fit_result))
    axis = laws.get(fit_result.law).precision_axis
    if axis != "bits":
        raise ConfigError(f"--fit {fit_path}", f"{fit_result.law} fit", f"a law with a bits axis ({fit_result.law} reads precision "
                          f"as {axis or 'no term at all'}, so there is no compute-optimal P to plan; `scaling optimal FIT "
                          "--results RESULTS` ranks its measured recipes)")
    check = optimum_check.check(fit_result, cost=cost)
    if not check["exists"]:
        raise ConfigError(f"--fit {fit_path}", f"{fit_result.law} fit, " + "; ".join(check["reasons"]),
                          "a fit from which a compute optimum exists (`scaling optimal` gives the same check)")
    if compute is None:
        compute = compute_for_target_loss(lambda c: optimal.optimal_precision(fit_result, compute=c, cost=cost)["loss"],
                                          target_loss)
    best = optimal.optimal_precision(fit_result, compute=compute, cost=cost)
    per_precision = [plan_optimum(row, gpus, gpu, **plan_options) for row in best["per_precision"].to_dict("records")]
    return (compute, plan_optimum(best, gpus, gpu, **plan_options), per_precision,
            optimum_check.check(fit_result, best, cost))


def main(args: argparse.Namespace) -> int:
    if args.fit is None and (args.compute or args.target_loss or args.layout):
        raise ConfigError("compute/target-loss/layout", args.compute or args.target_loss or args.layout, "only together with --fit")
    if args.flops is None and args.fit is None:
        raise ConfigError("plan", "nothing", "--flops or --fit (memory and time of one step for any layout: scaling plan step)")
    get_gpu(args.gpu)  # an unknown GPU is the first error, before the other arguments
    gpus = [_positive("gpus", g, int) for g in args.gpus]
    mfu = _positive("mfu", args.mfu) if args.mfu else None
    if mfu is not None and mfu > 1:
        raise ConfigError("mfu", args.mfu, "a fraction in (0, 1]")
    options = _run_options(args)

    sections: list[str] = []
    if args.flops is not None:
        sections.append(_flops_section(args, gpus, mfu, options))
    if args.fit is not None:
        sections += _fit_sections(args, gpus, mfu, options)
    print("\n\n".join(sections))
    return 0


def _flops_section(args: argparse.Namespace, gpus: list[int], mfu: float | None, options: dict[str, float | None]) -> str:
    """--flops: days on each cluster size at a measured MFU or from --model's step."""
    spec = get_gpu(args.gpu)
    flops = _positive("flops", args.flops)
    precision = canonical_precision(args.precision)
    spec.peak(precision)  # ConfigError if this GPU lacks the precision
    if mfu is not None:
        runs, how = [plan_run(flops, k, args.gpu, precision, mfu, **options) for k in gpus], f"MFU {mfu:g} (given)"
    else:
        runs, how = _model_runs(args, flops, gpus, precision, options)
    return (f"{flops:.3g} FLOPs on {spec.name}, {precision} (dense peak {spec.peak_tflops[precision]:,.0f} TFLOP/s per GPU), {how}\n"
            + format_runs(runs, options["gpu_mtbf_hours"]))


def _fit_sections(args: argparse.Namespace, gpus: list[int], mfu: float | None, options: dict[str, float | None]) -> list[str]:
    """--fit: the law's optimum per precision, the optimum's days table, and its recipe against BF16."""
    spec = get_gpu(args.gpu)
    compute = _positive("compute", args.compute) if args.compute else None
    target = _positive("target-loss", args.target_loss) if args.target_loss else None
    # the fit's dense shapes are stepped with --layout's tp and pp when given, else DENSE_RECIPE
    recipe = replace(DENSE_RECIPE, seq_len=_positive("seq-len", args.seq_len, int))
    if args.layout:
        lay = parse_step_layout(args.layout)
        recipe = replace(recipe, layout=f"tp={lay.tp},pp={lay.pp},ogr=1,opg=1" + (",tpo=1" if lay.tp > 1 else ""))
    compute, best, per_precision, check = plan_fit(args.fit, gpus, args.gpu, compute, target, recipe=recipe, mfu=mfu,
                                                   **options)
    from scaling.study.analysis.pstar.optimum_check import describe  # the fitting stack is loaded by now (plan_fit)

    gib = spec.memory_bytes / 2**30
    lines = [
        f"fit {args.fit}: compute {compute:.3g} in 16-bit FLOP units under cost model {check['cost_model']} "
        f"(a FLOP at P bits counts P/16)" + (f" (reaches loss {target:g})" if target else ""),
        *describe(check),
        "6ND: the hardware FLOPs of each row (every FLOP counts 1, whatever P); days from them",
        f"{'P':>5} {'format':>6} {'N':>10} {'D':>10} {'loss':>8} {'6ND':>10} " + " ".join(f"{f'days@{k}':>11}" for k in gpus),
    ]
    for p in per_precision:
        mark = "  <- optimal" if p.bits == best.bits else ""
        over = [r for r in p.runs if r.memory_gib is not None and not r.fits]
        if over:
            mark += f"  ({max(r.memory_gib for r in over):,.0f} GiB/GPU: does not fit)"
        lines.append(f"{p.bits:>5g} {p.hardware_precision:>6} {p.params:>10.3g} {p.tokens:>10.3g} {p.loss:>8.4f} {p.flops:>10.3g} "
                     + " ".join(f"{r.days:>11.3g}" for r in p.runs) + mark)
    memory = [f"memory: {r.memory_gib:,.0f} GiB per GPU on {r.gpus:,} GPUs, above the {spec.name}'s {gib:,.1f} GiB: "
              "this plan does not fit as laid out" for r in best.runs if r.memory_gib is not None and not r.fits]
    return [
        "\n".join(lines),
        f"optimum P={best.bits:.3g} bits -> {best.hardware_precision} on {spec.name}, N={best.params:.3g}, D={best.tokens:.3g}\n"
        + format_runs(best.runs, options["gpu_mtbf_hours"]) + "".join("\n" + m for m in memory),
        _step_speedup(args.gpu, gpus[0], recipe, best),
    ]
