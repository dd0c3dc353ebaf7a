"""Tokens/s and model FLOP/s utilisation of our train step per recipe on one GPU, against PyTorch bf16.

    pip install -e '.[gpu]' torch        # torch for the reference only; never a dependency
    python benchmarks/bench_gpu.py [--params 20e6,100e6 | --sizes 14,24] [--seq-len 1024] [--batch 16]
        [--steps 20] [--warmup 3] [--windows 3] [--recipes autocast,bf16,fp8,mxfp6,mxfp4,nvfp4]
        [--gpu auto|h100|h200|b200|a100] [--torch auto|compile|eager|off] [--pilot [EXPERIMENT.toml]] [--pack K]
    python benchmarks/bench_gpu.py --sizes 1 --seq-len 64 --batch 4 --steps 3 --warmup 1 --pack 2 --pilot  # CPU smoke run

Per ladder size (the one whose non-embedding N is nearest each --params target, ladder.param_counts),
one process measures, the same way for each: our training step as `scaling train` runs it
(scaling.train.step: the model's quantised GEMMs, AdamW, clipping; fast path where bf16 is native),
compiled and warmed up, then --windows windows of --steps steps, each dispatched back to back and
waited for once (the median window is printed, with the range); and the same model in PyTorch
(benchmarks/bench_torch.TorchLM) under bf16 autocast with fused AdamW, torch.compile'd when it
compiles, timed the same way and, where XLA_FLAGS asks XLA for deterministic ops, with
torch.use_deterministic_algorithms(True): both sides under the same determinism setting.

Like with like: `autocast` is our step as PyTorch's bf16 autocast trains (every matmul's inputs in
bf16, attention and the output head included: the `bf16` preset with bf16 attention inputs and
`high_precision_embed = false`), the row whose tokens/s is compared with PyTorch's (target >= 0.8);
our `bf16` preset (attention and head in FP32) is its own row, the price of FP32 attention. Each
simulated recipe's step time is compared with our bf16's (target <= 1.3). MFU = ladder.flops_per_token
x tokens/s / the GPU's dense bf16 peak (scaling.plan.hardware.GPUS; "-" on a device the table lacks,
unless --gpu names one). The header is host.describe(), the allocator setting and XLA_FLAGS: timings
hold for that machine and those flags only.

--pilot (default experiments/gpu_pilot.toml) also measures an experiment's own runs: each distinct
model shape, batch and sequence length of its expanded grid (scaling.study.sweeps.sweep.expand, the IsoFLOP
design placed) with the recipes it trains, then the experiment's training time at those speeds
(its tokens over each run's measured tokens/s; evaluations and compiles not included). --pack K
times, per pilot shape and recipe, K runs trained as one vmapped program (scaling.train.step.packed:
own seeds, batches and learning rates) against one run alone (target: K at a time >= 4x one run's
tokens/s), and says whether two packed members of the first recipe are their single runs bit for bit on this device
(step.packing_difference, the probe `scaling sweep --pack` flies at take-off).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

from scaling.train import data, ladder
from scaling import host
from scaling.plan import hardware
from scaling.numerics import precision
from scaling.train import step as step_lib

TORCH_VS_OURS_TARGET, RECIPE_VS_BF16_TARGET, PACKED_TARGET = 0.8, 1.3, 4.0
# PyTorch's bf16 autocast as one of our recipes: bf16 inputs to every matmul, attention and head included
AUTOCAST = Path(__file__).resolve().parents[1] / "experiments" / "recipes" / "bf16-autocast.toml"


def recipe_for(name: str):
    return precision.get(str(AUTOCAST) if name == "autocast" else name)


def deterministic() -> bool:
    """Whether XLA_FLAGS asks XLA:GPU for deterministic ops (the sweep's runs get it)."""
    return "--xla_gpu_deterministic_ops=true" in os.environ.get("XLA_FLAGS", "")


def windows(run_steps, steps: int, n: int) -> tuple[float, float, float]:
    """(median, min, max) seconds per step over n windows of `steps` steps; run_steps(k) dispatches k
    steps and waits for the last."""
    per_step = []
    for _ in range(n):
        started = time.perf_counter()
        run_steps(steps)
        per_step.append((time.perf_counter() - started) / steps)
    return statistics.median(per_step), min(per_step), max(per_step)


def size_near(params: float) -> int:
    """The ladder size whose non-embedding parameter count is nearest `params` (in log terms)."""
    sizes = range(1, 129)
    counts = {s: ladder.param_counts(ladder.config_for_size(s))["non_embedding"] for s in sizes}
    return min(sizes, key=lambda s: abs(np.log(counts[s] / params)))


def time_ours(cfg: ladder.ModelConfig, recipe_name: str, tokens: np.ndarray, steps: int, warmup: int,
              n_windows: int = 3) -> tuple[float, tuple[float, float, float]]:
    """(compile seconds, (median, min, max) seconds per step) of the training step `scaling train` runs."""
    recipe = recipe_for(recipe_name)
    tx = step_lib.optimizer_tx(grad_clip=1.0, weight_decay=0.1)
    train_step, _, init = step_lib.compiled()
    from flax import nnx

    model_def, opt_def = nnx.eval_shape(lambda: step_lib.graph_defs(cfg, recipe, tx, 0))
    box = {"state": init(cfg, recipe, tx, 0), "step": 0}
    batch, lr = jax.device_put(tokens), np.float32(1e-4)

    def run_steps(k: int) -> None:
        for _ in range(k):
            box["state"], loss, _, _ = train_step(model_def, opt_def, box["state"], batch, 0, box["step"], lr, False)
            box["step"] += 1
        jax.block_until_ready(loss)

    started = time.perf_counter()
    run_steps(1)
    compile_s = time.perf_counter() - started
    if warmup:
        run_steps(warmup)
    return compile_s, windows(run_steps, steps, n_windows)


def time_packed(cfg: ladder.ModelConfig, recipe_name: str, tokens: np.ndarray, members: int, steps: int,
                warmup: int, n_windows: int = 3) -> tuple[float, float, float]:
    """(median, min, max) seconds per step of `members` runs of this shape trained as one program
    (scaling.train.step.packed; each member its own seed, learning rate and batch)."""
    recipe = recipe_for(recipe_name)
    tx = step_lib.optimizer_tx(grad_clip=1.0, weight_decay=0.1)
    model_def, opt_def = step_lib.graph_defs(cfg, recipe, tx, 0)
    train_step, _, init = step_lib.packed()
    seeds = np.arange(members, dtype=np.int32)
    lrs = np.geomspace(1e-4, 1e-3, members).astype(np.float32)
    batch = jax.device_put(np.stack([np.roll(tokens, m, axis=0) for m in range(members)]))
    box = {"state": init(cfg, [recipe] * members, tx, seeds.tolist()), "step": 0}

    def run_steps(k: int) -> None:
        for _ in range(k):
            box["state"], losses, _, _ = train_step(model_def, opt_def, box["state"], batch, seeds, box["step"], lrs, False)
            box["step"] += 1
        jax.block_until_ready(losses)

    run_steps(1 + warmup)
    return windows(run_steps, steps, n_windows)


def time_torch(cfg: ladder.ModelConfig, tokens: np.ndarray, steps: int, warmup: int, mode: str,
               n_windows: int = 3) -> tuple[str, float, tuple[float, float, float]]:
    """(label, compile seconds, (median, min, max) seconds per step) of the PyTorch bf16 reference
    (bf16 autocast matmuls, fp32 master weights, as our `autocast` row), deterministic where XLA's is."""
    import torch
    import torch.nn.functional as F

    if deterministic():  # the same setting on both sides (cuBLAS needs a fixed workspace for it)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_torch import TorchLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    net = TorchLM(cfg).to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, weight_decay=0.1, fused=device == "cuda")
    batch = torch.tensor(tokens, dtype=torch.long, device=device)

    def step(forward):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16):
            logits = forward(batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, cfg.vocab), batch[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        return loss

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    label, forward = "eager", net
    started = time.perf_counter()
    if mode in ("auto", "compile") and hasattr(torch, "compile"):
        try:
            compiled = torch.compile(net)
            step(compiled)
            sync()
            label, forward = "compiled", compiled
        except Exception as error:  # noqa: BLE001 - no compiler toolchain here: the eager reference stands
            if mode == "compile":
                raise
            label = f"eager; torch.compile failed: {type(error).__name__}"
    if forward is net:
        step(net)
        sync()
    compile_s = time.perf_counter() - started

    def run_steps(k: int) -> None:
        for _ in range(k):
            step(forward)
        sync()

    if warmup:
        run_steps(warmup)
    label = f"pytorch bf16 ({label}, torch {torch.__version__}{', deterministic' if deterministic() else ''})"
    return label, compile_s, windows(run_steps, steps, n_windows)


PILOT = Path(__file__).resolve().parents[1] / "experiments" / "gpu_pilot.toml"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="20e6,100e6", help="non-embedding parameter targets; nearest ladder sizes")
    ap.add_argument("--sizes", default=None, help="ladder sizes instead of --params (e.g. 1 for a CPU smoke run)")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--windows", type=int, default=3, help="timed windows of --steps steps; the median is printed")
    ap.add_argument("--recipes", default="autocast,bf16,fp8,mxfp6,mxfp4,nvfp4",
                    help="presets, recipe files, or `autocast` (our step as PyTorch's bf16 autocast trains)")
    ap.add_argument("--gpu", default="auto", help="GPUS entry whose dense bf16 peak MFU divides by (auto: by device kind)")
    ap.add_argument("--torch", choices=["auto", "compile", "eager", "off"], default="auto",
                    help="PyTorch reference: torch.compile where it compiles (auto), forced, eager, or none")
    ap.add_argument("--pilot", nargs="?", const=str(PILOT), default=None, metavar="EXPERIMENT",
                    help=f"also time an experiment's own shapes and recipes (default {PILOT.relative_to(PILOT.parents[1])})")
    ap.add_argument("--pack", type=int, default=0, metavar="K",
                    help="with --pilot: also time K runs of each pilot shape and recipe as one vmapped program")
    return ap


def pilot_shapes(experiment: str | Path) -> dict[tuple, dict]:
    """{(model config, batch): {"recipes": [recipe names], "tokens": {recipe: tokens over its runs}}}
    of an experiment's expanded runs, in grid order."""
    from scaling.study.sweeps import sweep

    shapes: dict[tuple, dict] = {}
    for spec in sweep.expand(experiment):
        cfg = spec.config
        entry = shapes.setdefault((cfg.model.shape(), cfg.train.batch_size), {"recipes": [], "tokens": {}})
        name = cfg.recipe.name
        if name not in entry["recipes"]:
            entry["recipes"].append(name)
        entry["tokens"][name] = entry["tokens"].get(name, 0) + cfg.train.tokens
    return shapes


def bench_shape(cfg: ladder.ModelConfig, batch: int, recipes: list[str], args: argparse.Namespace,
                peak: float | None) -> dict[str, float]:
    """Time the PyTorch reference and our step per recipe at one shape, print the table; returns
    {recipe: tokens/s} of ours."""
    tokens = data.batch(data.synthetic_corpus().train, 0, 0, batch, cfg.seq_len)
    n_tok = batch * cfg.seq_len
    flops_step = ladder.flops_per_token(cfg) * n_tok
    print(f"d_model {cfg.d_model}, {cfg.n_layers} layers, d_ff {cfg.d_ff}, "
          f"N {ladder.param_counts(cfg)['non_embedding'] / 1e6:.2f}M non-embedding; "
          f"batch {batch} x {cfg.seq_len} = {n_tok} tokens; {ladder.flops_per_token(cfg) / 1e6:,.2f} MFLOP/token")
    rows = {}
    if args.torch != "off":
        try:
            label, compile_s, step_s = time_torch(cfg, tokens, args.steps, args.warmup, args.torch, args.windows)
            rows[label] = (compile_s, step_s)
        except ImportError:
            print("PyTorch is not installed: no reference row (pip install torch)")
    for name in recipes:
        rows[f"ours {name}"] = time_ours(cfg, name, tokens, args.steps, args.warmup, args.windows)
    torch_label = next((label for label in rows if label.startswith("pytorch")), None)
    ours_bf16 = rows["ours bf16"][1][0] if "ours bf16" in rows else None
    print(f"{'implementation':52s} {'compile s':>9s} {'step ms':>9s} {'range ms':>15s} {'tokens/s':>11s} {'MFU':>6s}  ratio")
    for label, (compile_s, (step_s, lo, hi)) in rows.items():
        mfu = f"{flops_step / step_s / peak:6.3f}" if peak else f"{'-':>6s}"
        vs_torch = f"{rows[torch_label][1][0] / step_s:.2f} tokens/s vs PyTorch" if torch_label else ""
        if label == "ours autocast" and torch_label:
            ratio = f"{vs_torch} (like with like; target >= {TORCH_VS_OURS_TARGET})"
        elif label == "ours bf16" and torch_label:
            ratio = f"{vs_torch} (attention and head in FP32)"
        elif label.startswith("ours") and label not in ("ours bf16", "ours autocast") and ours_bf16:
            ratio = f"{step_s / ours_bf16:.2f} step time vs our bf16 (target <= {RECIPE_VS_BF16_TARGET})"
        else:
            ratio = ""
        spread = f"{lo * 1e3:.2f}-{hi * 1e3:.2f}"
        print(f"{label:52s} {compile_s:9.1f} {step_s * 1e3:9.2f} {spread:>15s} {n_tok / step_s:11,.0f} {mfu}  {ratio}")
    print(f"(step ms: the median of {args.windows} windows of {args.steps} steps; range: the fastest and slowest window)")
    return {label[len("ours "):]: n_tok / step_s for label, (_, (step_s, _, _)) in rows.items() if label.startswith("ours ")}


def bench_packing(cfg: ladder.ModelConfig, batch: int, recipes: list[str], single: dict[str, float],
                  args: argparse.Namespace) -> None:
    """Per recipe: --pack runs of this shape as one program against one run's tokens/s (`single`)."""
    tokens = data.batch(data.synthetic_corpus().train, 0, 0, batch, cfg.seq_len)
    k = args.pack
    for name in recipes:
        step_s, lo, hi = time_packed(cfg, name, tokens, k, args.steps, args.warmup, args.windows)
        rate = k * batch * cfg.seq_len / step_s
        print(f"  {k} x {name} packed: {step_s * 1e3:.2f} ms per step ({lo * 1e3:.2f}-{hi * 1e3:.2f}), "
              f"{rate:,.0f} tokens/s = {rate / single[name]:.2f}x one run's (target >= {PACKED_TARGET})")
    # what `scaling sweep --pack` decides at take-off (two members packed for 3 steps against their single
    # steps), for the first recipe only: two more compiles per recipe would not fit a short GPU loan
    recipe = recipe_for(recipes[0])
    difference = step_lib.packing_difference(cfg, [recipe, recipe], step_lib.optimizer_tx(1.0, 0.1), [0, 1],
                                             [1e-3, 2e-3], batch)
    verdict = "bit for bit: a sweep packs them" if difference == 0 else \
        f"not bit for bit, up to {difference:.3g} apart: a sweep trains them one at a time"
    print(f"  packed {recipes[0]} members against their single runs: {verdict}")


def main() -> None:
    # the header names the machine and the allocator setting: timings hold for those only
    print(f"{host.describe()}; {host.process_env_status()}; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}", flush=True)
    ap = build_parser()
    args = ap.parse_args()
    recipes = args.recipes.split(",")
    if "bf16" not in recipes:
        ap.error("--recipes must include bf16 (the reference of the recipe ratios)")
    device = jax.local_devices()[0]
    print(f"JAX backend {jax.default_backend()}, device {device.device_kind}", flush=True)
    gpu = hardware.gpu_key(device.device_kind) if args.gpu == "auto" and device.platform == "gpu" else (
        None if args.gpu == "auto" else args.gpu)
    peak = hardware.get_gpu(gpu).peak("bf16") if gpu else None
    if peak:
        print(f"MFU: model FLOP/s over the dense bf16 peak of {hardware.GPUS[gpu].name}, {peak / 1e12:.0f} TFLOP/s")
    else:
        print(f"MFU: none, {device.device_kind!r} has no peak in scaling.plan.hardware.GPUS (--gpu NAME to pick one)")
    sizes = ([int(s) for s in args.sizes.split(",")] if args.sizes
             else [size_near(float(p)) for p in args.params.split(",")])
    for size in sizes:
        print(f"\nsize {size}: ", end="")
        bench_shape(ladder.config_for_size(size, seq_len=args.seq_len), args.batch, recipes, args, peak)
    if args.pilot:
        seconds = 0.0
        for (cfg, batch), entry in pilot_shapes(args.pilot).items():
            print(f"\n{Path(args.pilot).name}: ", end="")
            speed = bench_shape(cfg, batch, entry["recipes"], args, peak)
            seconds += sum(tokens / speed[name] for name, tokens in entry["tokens"].items())
            if args.pack > 1:
                bench_packing(cfg, batch, entry["recipes"], speed, args)
        print(f"\n{Path(args.pilot).name}: {seconds / 60:.1f} min of training steps at these speeds "
              "(evaluations and compiles not included)")


if __name__ == "__main__":
    main()
