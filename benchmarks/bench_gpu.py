"""Tokens/s and model FLOP/s utilisation of our train step per recipe on one GPU, against PyTorch bf16.

    pip install -e '.[gpu]' torch        # torch for the reference only; never a dependency
    python benchmarks/bench_gpu.py [--params 20e6,100e6 | --sizes 14,24] [--seq-len 1024] [--batch 16]
        [--steps 20] [--warmup 3] [--recipes bf16,fp8,mxfp6,mxfp4,nvfp4] [--gpu auto|h100|h200|b200|a100]
        [--torch auto|compile|eager|off]
    python benchmarks/bench_gpu.py --sizes 1 --seq-len 64 --batch 4 --steps 3 --warmup 1   # CPU smoke run

Per ladder size (the one whose non-embedding N is nearest each --params target, ladder.param_counts),
one process measures, the same way for each: our training step as `scaling train` runs it
(scaling.train.step: the model's quantised GEMMs, AdamW, clipping; fast path where bf16 is native),
compiled and warmed up, then --steps steps dispatched back to back and waited for once; and the
same model in PyTorch (benchmarks/bench_torch.TorchLM) under bf16 autocast with fused AdamW,
torch.compile'd when it compiles. Printed per row: step time, tokens/s, and model FLOP/s
utilisation = ladder.flops_per_token x tokens/s / the GPU's dense bf16 peak (scaling.plan.hardware.GPUS;
"-" on a device the table lacks, unless --gpu names one). Ratios: our bf16 tokens/s over PyTorch's
(target >= 0.8), and each simulated recipe's step time over our bf16's (target <= 1.3).
The first line is host.describe() and host.process_env_status(): timings hold for that machine only.
"""

from __future__ import annotations

import argparse
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

TORCH_VS_OURS_TARGET, RECIPE_VS_BF16_TARGET = 0.8, 1.3


def size_near(params: float) -> int:
    """The ladder size whose non-embedding parameter count is nearest `params` (in log terms)."""
    sizes = range(1, 129)
    counts = {s: ladder.param_counts(ladder.config_for_size(s))["non_embedding"] for s in sizes}
    return min(sizes, key=lambda s: abs(np.log(counts[s] / params)))


def time_ours(cfg: ladder.ModelConfig, recipe_name: str, tokens: np.ndarray, steps: int, warmup: int) -> tuple[float, float]:
    """(compile seconds, seconds per step) of the training step `scaling train` runs."""
    recipe = precision.get(recipe_name)
    tx = step_lib.optimizer_tx(grad_clip=1.0, weight_decay=0.1)
    train_step, _, init = step_lib.compiled()
    from flax import nnx

    model_def, opt_def = nnx.eval_shape(lambda: step_lib.graph_defs(cfg, recipe, tx, 0))
    state = init(cfg, recipe, tx, 0)
    batch, lr = jax.device_put(tokens), np.float32(1e-4)
    started = time.perf_counter()
    state, loss, _, _ = train_step(model_def, opt_def, state, batch, 0, 0, lr, False)
    jax.block_until_ready(loss)
    compile_s = time.perf_counter() - started
    for i in range(warmup):
        state, loss, _, _ = train_step(model_def, opt_def, state, batch, 0, i + 1, lr, False)
    jax.block_until_ready(loss)
    started = time.perf_counter()
    for i in range(steps):
        state, loss, _, _ = train_step(model_def, opt_def, state, batch, 0, warmup + i + 1, lr, False)
    jax.block_until_ready(loss)
    return compile_s, (time.perf_counter() - started) / steps


def time_torch(cfg: ladder.ModelConfig, tokens: np.ndarray, steps: int, warmup: int, mode: str) -> tuple[str, float, float]:
    """(label, compile seconds, seconds per step) of the PyTorch bf16 reference (bf16 autocast
    matmuls, fp32 master weights, as our bf16 recipe)."""
    import torch
    import torch.nn.functional as F

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
    for _ in range(warmup):
        step(forward)
    sync()
    started = time.perf_counter()
    for _ in range(steps):
        step(forward)
    sync()
    return f"pytorch bf16 ({label}, torch {torch.__version__})", compile_s, (time.perf_counter() - started) / steps


def main() -> None:
    # the header names the machine and the allocator setting: timings hold for those only
    print(f"{host.describe()}; {host.process_env_status()}", flush=True)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="20e6,100e6", help="non-embedding parameter targets; nearest ladder sizes")
    ap.add_argument("--sizes", default=None, help="ladder sizes instead of --params (e.g. 1 for a CPU smoke run)")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--recipes", default="bf16,fp8,mxfp6,mxfp4,nvfp4")
    ap.add_argument("--gpu", default="auto", help="GPUS entry whose dense bf16 peak MFU divides by (auto: by device kind)")
    ap.add_argument("--torch", choices=["auto", "compile", "eager", "off"], default="auto",
                    help="PyTorch reference: torch.compile where it compiles (auto), forced, eager, or none")
    args = ap.parse_args()
    recipes = args.recipes.split(",")
    if "bf16" not in recipes:
        ap.error("--recipes must include bf16 (the reference of the recipe ratios)")
    device = jax.local_devices()[0]
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
        cfg = ladder.config_for_size(size, seq_len=args.seq_len)
        tokens = data.batch(data.synthetic_corpus().train, 0, 0, args.batch, args.seq_len)
        n_tok = args.batch * args.seq_len
        flops_step = ladder.flops_per_token(cfg) * n_tok
        print(f"\nsize {size}: d_model {cfg.d_model}, {cfg.n_layers} layers, d_ff {cfg.d_ff}, "
              f"N {ladder.param_counts(cfg)['non_embedding'] / 1e6:.2f}M non-embedding; "
              f"batch {args.batch} x {args.seq_len} = {n_tok} tokens; {ladder.flops_per_token(cfg) / 1e6:,.2f} MFLOP/token")
        rows = {}
        if args.torch != "off":
            try:
                label, compile_s, step_s = time_torch(cfg, tokens, args.steps, args.warmup, args.torch)
                rows[label] = (compile_s, step_s)
            except ImportError:
                print("PyTorch is not installed: no reference row (pip install torch)")
        for name in recipes:
            rows[f"ours {name}"] = time_ours(cfg, name, tokens, args.steps, args.warmup)
        torch_label = next((label for label in rows if label.startswith("pytorch")), None)
        ours_bf16 = rows["ours bf16"][1]
        print(f"{'implementation':52s} {'compile s':>9s} {'step ms':>9s} {'tokens/s':>11s} {'MFU':>6s}  ratio")
        for label, (compile_s, step_s) in rows.items():
            mfu = f"{flops_step / step_s / peak:6.3f}" if peak else f"{'-':>6s}"
            if label == "ours bf16" and torch_label:
                ratio = f"{rows[torch_label][1] / step_s:.2f} tokens/s vs PyTorch (target >= {TORCH_VS_OURS_TARGET})"
            elif label.startswith("ours") and label != "ours bf16":
                ratio = f"{step_s / ours_bf16:.2f} step time vs our bf16 (target <= {RECIPE_VS_BF16_TARGET})"
            else:
                ratio = ""
            print(f"{label:52s} {compile_s:9.1f} {step_s * 1e3:9.2f} {n_tok / step_s:11,.0f} {mfu}  {ratio}")


if __name__ == "__main__":
    main()
