"""`scaling plan step`: time and peak memory of one training step, op by op, for a model shape, a GPU,
a parallel layout and a precision recipe (scaling.plan.stepmodel), or the fastest layout that fits
(scaling.plan.search); with --tokens, the days of the whole run (scaling.plan.runplan)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from scaling.errors import ConfigError
from scaling.plan.efficiency import RECIPES
from scaling.plan.hardware import GPUS
from scaling.plan.layout import RECOMPUTE, parse_step_layout
from scaling.plan.memory import GIB
from scaling.plan.reliability import expected_interruptions
from scaling.plan.runplan import run_days
from scaling.plan.search import search
from scaling.plan.shapes import MODELS, SHAPE_KEYS, load_model
from scaling.plan.stepmodel import CATEGORIES, StepResult, breakdown, step


def _positive_int(key: str, text: str) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        value = 0
    if value < 1 or str(value) != str(text).strip():
        raise ConfigError(key, text, "a positive integer")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Time and peak memory of one training step, op by op, for a model shape, a GPU, a parallel "
        "layout and a precision recipe. Example: `scaling plan step --model llama3-70b --layers 12 "
        "--gpu b200 --layout tp=4,pp=1,dp=2,zero=1 --seq-len 4096 --micro-batch 1 --micro-batches 8 --json`."
    )
    parser.add_argument("--model", default="llama3-8b", help=f"{', '.join(MODELS)}, a JSON file of {', '.join(SHAPE_KEYS)}, "
                        "or a parameter count (e.g. 7e9: a GPT shape with h = 128 L, 32K vocabulary)")
    parser.add_argument("--layers", help="override the model's layer count (e.g. a cut-down model for a benchmark)")
    parser.add_argument("--gpu", default="h100", help=f"one of {', '.join(GPUS)} (default h100)")
    parser.add_argument("--gpus", help="cluster size: the layout's tp*cp*pp*dp must equal it")
    parser.add_argument("--layout", default="tp=1", help="tp=,pp=,dp=,cp=,ep=,etp=,zero=,vpp=, flags 0|1: sp (sequence parallel), "
                        "ogr (overlap grad reduce), opg (overlap param gather), tpo (TP comm overlap), p2p (overlap pipeline "
                        "send/recv), seo (shared experts overlap the all-to-all), a2ao (all-to-all overlapped by another "
                        "micro-batch), deepep (node-deduplicated token dispatch)")
    parser.add_argument("--seq-len", default="4096", help="sequence length (default 4096)")
    parser.add_argument("--micro-batch", default="1", help="micro-batch size (default 1)")
    parser.add_argument("--micro-batches", default="1", help="micro-batches per step per data-parallel rank (default 1)")
    parser.add_argument("--precision", default="bf16", help=f"GEMM recipe: {', '.join(RECIPES)} (default bf16)")
    parser.add_argument("--recompute", default="none", help=f"activation recompute: {', '.join(RECOMPUTE)} (default none)")
    sp = parser.add_mutually_exclusive_group()
    sp.add_argument("--sequence-parallel", dest="sp", action="store_true", default=None, help="(default when tp > 1)")
    sp.add_argument("--no-sequence-parallel", dest="sp", action="store_false", help="sequence parallel off, even when tp > 1")
    parser.add_argument("--cp", help="context parallel size (or cp= in --layout)")
    parser.add_argument("--ep", help="expert parallel size (MoE models; or ep= in --layout)")
    parser.add_argument("--allow-oom", action="store_true", help="report a layout even if it does not fit in memory")
    parser.add_argument("--search", action="store_true",
                        help="find the fastest layout that fits (needs --gpus and --global-batch; ignores --layout)")
    parser.add_argument("--global-batch", help="sequences per optimizer step (with --search)")
    parser.add_argument("--no-overlap", action="store_true",
                        help="with --search: leave Megatron's opt-in overlaps (tpo, ogr, opg) off")
    parser.add_argument("--tokens", help="training tokens: add days, goodput and failures of the whole run")
    parser.add_argument("--figure", help="write a stacked bar of the step's breakdown (BF16 next to --precision) to this PNG")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def format_result(r: StepResult) -> str:
    d = r.to_json()
    lines = [
        f"{d['model']} ({d['params'] / 1e9:.3g}B params" + (f", {d['activated_params'] / 1e9:.3g}B activated" if r.model.moe else "")
        + f", {r.model.layers} layers) on {d['layout']['gpus']} x {d['gpu']}, "
        f"{d['precision']}, seq {d['seq_len']}, layout {d['layout']}",
        f"step {d['step_ms']:,.1f} ms   {d['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU   "
        f"{d['model_tflops_per_gpu']:,.0f} model TFLOP/s/GPU   MFU {d['mfu']:.3f}",
        f"memory on the busiest GPU (stage {d['busiest_stage']}): {d['memory_gib']:.2f} GiB of {d['gpu_memory_gib']:.1f}",
    ]
    lines += [f"  {k:<14} {v:>9.2f} GiB" for k, v in d["memory_breakdown_gib"].items() if k != "total"]
    lines.append("time per step on the critical path (ms):")
    lines += [f"  {k:<26} {v:>10.2f} ms" for k, v in d["by_op_ms"].items() if v > 0]
    return "\n".join(lines)


def _positive_float(key: str, text: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise ConfigError(key, text, "a positive number")
    return value


def main(args: argparse.Namespace) -> int:
    layers = _positive_int("layers", args.layers) if args.layers else None
    tokens = _positive_float("tokens", args.tokens) if args.tokens else None
    if args.search:
        if not args.gpus or not args.global_batch:
            raise ConfigError("search", "--gpus/--global-batch missing", "both --gpus K and --global-batch B with --search")
        model = load_model(args.model, tp=8, layers=layers)  # a parameter count gets heads that tp <= 8 divides
        result, fitting = search(model, args.gpu, _positive_int("gpus", args.gpus), _positive_int("global-batch", args.global_batch),
                                 _positive_int("seq-len", args.seq_len), args.precision, overlap=not args.no_overlap)
        return _print(args, result, tokens, {"fitting_layouts": fitting})
    if args.global_batch:
        raise ConfigError("global-batch", args.global_batch, "only with --search (otherwise give --micro-batches)")
    layout = parse_step_layout(
        args.layout,
        sp=args.sp,
        recompute=args.recompute,
        micro_batch=_positive_int("micro-batch", args.micro_batch),
        micro_batches=_positive_int("micro-batches", args.micro_batches),
        cp=_positive_int("cp", args.cp) if args.cp else None,
        ep=_positive_int("ep", args.ep) if args.ep else None,
    )
    model = load_model(args.model, tp=layout.tp, layers=layers)
    gpus = _positive_int("gpus", args.gpus) if args.gpus else None
    result = step(model, args.gpu, layout, args.precision, _positive_int("seq-len", args.seq_len), gpus)
    if not args.allow_oom and result.memory.total > result.gpu.memory_bytes:
        raise ConfigError("memory", f"{result.memory.total / GIB:.1f} GiB on stage {result.busiest_stage}",
                          f"at most {result.gpu.memory_bytes / GIB:.1f} GiB on {result.gpu.name}: raise tp, pp or zero, "
                          "use --recompute full, or pass --allow-oom")
    return _print(args, result, tokens)


def _print(args: argparse.Namespace, result: StepResult, tokens: float | None, extra: dict | None = None) -> int:
    d = result.to_json() | (extra or {})
    text = format_result(result)
    if args.figure:
        results, labels = [result], [result.precision]
        if result.precision != "bf16":
            results.insert(0, step(result.model, result.gpu, result.layout, "bf16", result.seq_len))
            labels.insert(0, "bf16")
        d["figure"] = str(breakdown_figure(results, labels, args.figure))
        text += f"\nfigure: {d['figure']}"
    if extra:
        text = f"fastest of {extra['fitting_layouts']:,} fitting layouts:\n" + text
    if tokens:
        run = run_days(result, tokens)
        failures = expected_interruptions(run.checkpoint_days, run.gpus)
        d["run"] = {"tokens": tokens, "days": run.days, "checkpoint_interval_minutes": run.checkpoint_interval_hours * 60,
                    "checkpoint_goodput": run.checkpoint_goodput, "checkpoint_days": run.checkpoint_days,
                    "expected_interruptions": failures, "drop_replica_goodput": run.drop_replica_goodput,
                    "drop_replica_days": run.drop_replica_days, "gpu_hours": run.days * 24 * run.gpus}
        text += (f"\n{tokens:.3g} tokens: {run.days:,.2f} days without failures ({run.days * 24 * run.gpus:,.0f} GPU-hours); "
                 f"checkpoint-and-restart every {run.checkpoint_interval_hours * 60:.0f} min: goodput {run.checkpoint_goodput:.3f}, "
                 f"{run.checkpoint_days:,.2f} days, ~{failures:,.0f} interruptions; dropping a failed replica: goodput "
                 f"{run.drop_replica_goodput:.3f}, {run.drop_replica_days:,.2f} days")
    print(json.dumps(d) if args.json else text)
    return 0


def breakdown_figure(results: list[StepResult], labels: list[str], path: str | Path) -> Path:
    """A stacked bar per step (ms per step by CATEGORIES). matplotlib is imported only here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(results) + 2.5), 4.5))
    bottoms = [0.0] * len(results)
    for cat in CATEGORIES:
        heights = [breakdown(r)[cat] * 1e3 for r in results]
        if any(heights):
            ax.bar(labels, heights, bottom=bottoms, label=cat)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_ylabel("ms per optimizer step")
    r = results[0]
    ax.set_title(f"{r.model.name} on {r.layout.gpus} x {r.gpu.name}, seq {r.seq_len}", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
