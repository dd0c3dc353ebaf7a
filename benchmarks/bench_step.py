"""Train-step time of precision recipes relative to fp32, and model FLOP/s utilisation.

    python benchmarks/bench_step.py [--size 8] [--batch 16] [--seq-len 256] [--steps 10]
        [--recipes fp32,bf16,fp8,fp8-blockwise,mxfp4,nvfp4] [--path auto|bf16|fp32]

One process, one model shape (size 8 = width 256 by default), every recipe measured the same way:
the trainer's own jitted step (scaling.train.loop: model.grad_step + AdamW) as it runs between logged
steps (no quantisation telemetry: `measure` false), compiled ahead of time
(compile time reported as wall and CPU seconds, the persistent compilation cache off so every
recipe really compiles), then the median of --steps timed steps. Prints step time, ratio to fp32
(targets: fp8 <= 1.0 on AVX2-only CPUs and <= 0.8 with AMX, fp8-blockwise <= 1.2, mxfp4 and
nvfp4 <= 1.1) and model FLOP/s = flops_per_token · tokens / step time as a fraction of a jitted
fp32 matmul's FLOP/s at the model's largest GEMM shape. CPU time (all threads) is the steadier
measure on a shared machine; the recipes are interleaved over --rounds to even out the rest.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
from flax import nnx

from scaling import host
from scaling.train import ladder
from scaling.numerics import precision
from scaling.train import step as step_lib

TARGETS = {"fp8": 1.0 if not host.native_bf16() else 0.8, "fp8-blockwise": 1.2, "mxfp4": 1.1, "nvfp4": 1.1}


def matmul_flops(m: int, k: int, n: int, reps: int = 20) -> float:
    """FLOP/s of a jitted fp32 matmul (the reference for model FLOP/s utilisation)."""
    a = jax.random.normal(jax.random.key(0), (m, k), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (k, n), jnp.float32)
    f = jax.jit(lambda a, b: a @ b)
    f(a, b).block_until_ready()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        f(a, b).block_until_ready()
        times.append(time.perf_counter() - t)
    return 2.0 * m * k * n / statistics.median(times)


def make_step(cfg: ladder.ModelConfig, recipe: precision.Recipe, tokens_BxL1):
    """(state, compiled step, compile wall s, compile CPU s) for the trainer's step of this recipe."""
    tx = step_lib.optimizer_tx(grad_clip=1.0, weight_decay=0.1)
    train_step, _, init = step_lib.compiled()
    model_def, opt_def = nnx.eval_shape(lambda: step_lib.graph_defs(cfg, recipe, tx, 0))
    state = init(cfg, recipe, tx, 0)
    t, c = time.perf_counter(), time.process_time()
    step = train_step.lower(model_def, opt_def, state, tokens_BxL1, 0, 0, 1e-3, False).compile()
    return state, step, time.perf_counter() - t, time.process_time() - c


def main() -> None:
    # the header names the machine and the allocator setting: timings hold for those only
    print(f"{host.describe()}; {host.process_env_status()}", flush=True)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--recipes", default="fp32,bf16,fp8,fp8-blockwise,mxfp4,nvfp4")
    ap.add_argument("--path", choices=["auto", "bf16", "fp32"], default="auto",
                    help="GEMM path of exact low-precision dots: auto (bf16 where native), or forced")
    args = ap.parse_args()

    cfg = ladder.config_for_size(args.size, seq_len=args.seq_len)
    tokens = jax.random.randint(jax.random.key(0), (args.batch, args.seq_len + 1), 0, cfg.vocab)
    n_tok = args.batch * args.seq_len
    print(f"model size {args.size}: d_model {cfg.d_model}, layers {cfg.n_layers}, d_ff {cfg.d_ff}, "
          f"N {ladder.param_counts(cfg)['non_embedding']:,}; batch {args.batch}x{args.seq_len} = {n_tok} tokens; "
          f"{jax.devices()[0].device_kind}, GEMM path {args.path}")
    names = args.recipes.split(",")
    jax.config.update("jax_enable_compilation_cache", False)  # measure real compiles, every time
    steps = {}
    for name in names:
        recipe = dataclasses.replace(precision.get(name), fast_path={"auto": None, "bf16": True, "fp32": False}[args.path])
        steps[name] = make_step(cfg, recipe, tokens)
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    states = {name: steps[name][0] for name in names}
    for r in range(args.rounds):
        for name in names:
            step = steps[name][1]
            for i in range(args.steps):
                t, c = time.perf_counter(), time.process_time()
                states[name], loss, _, _ = step(states[name], tokens, 0, i, 1e-3, False)
                jax.block_until_ready(loss)
                times[name].append(time.perf_counter() - t)
                cpu[name].append(time.process_time() - c)
    ref_flops = matmul_flops(n_tok, cfg.d_model, 3 * cfg.d_model)
    flops_step = ladder.flops_per_token(cfg) * n_tok
    t32 = statistics.median(times["fp32"]) if "fp32" in times else None
    c32 = statistics.median(cpu["fp32"]) if "fp32" in cpu else None
    print(f"jitted fp32 matmul {n_tok}x{cfg.d_model}x{3 * cfg.d_model}: {ref_flops / 1e9:.1f} GFLOP/s")
    # CPU time (all threads) is the steadier measure on a shared machine; wall time is what a user waits
    print(f"{'recipe':15s} {'compile s':>9s} {'CPU s':>6s} {'step ms':>9s} {'vs fp32':>8s} {'CPU ms':>9s} {'vs fp32':>8s} "
          f"{'target':>7s} {'model GFLOP/s':>13s} {'MFU vs matmul':>13s}")
    for name in names:
        t, c = statistics.median(times[name]), statistics.median(cpu[name])
        ratio = f"{t / t32:.2f}" if t32 else "-"
        cratio = f"{c / c32:.2f}" if c32 else "-"
        target = f"<={TARGETS[name]}" if name in TARGETS else ""
        print(f"{name:15s} {steps[name][2]:9.1f} {steps[name][3]:6.1f} {t * 1e3:9.1f} {ratio:>8s} {c * 1e3:9.1f} {cratio:>8s} {target:>7s} "
              f"{flops_step / t / 1e9:13.1f} {flops_step / t / ref_flops:13.2f}")


if __name__ == "__main__":
    main()
