"""The host's cost per training step, where the host bounds the step (a size-1 model, 1 x 8 tokens).

    python benchmarks/bench_host.py [--recipe bf16] [--steps 1000] [--rounds 3]

Three ways to call the trainer's jitted step (scaling.train.step.compiled), interleaved over
--rounds, median wall ms per step of --steps steps each:
  - identity: as the trainer calls it, the graph definitions found by identity (`step.Static`, hashed
    once per run);
  - hashed:   the reference, the graph definitions hashed at every call (what jax.jit does with
    static arguments on its own: the trainer before `step.Static`);
  - AOT:      the compiled executable called directly (no static arguments at all): the floor of
    dispatching the step from Python.
The first line names the host (`scaling.host.describe()`) and XLA_FLAGS.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from flax import nnx

from scaling import host
from scaling.numerics import precision
from scaling.train import ladder
from scaling.train import step as step_lib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="bf16")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"{host.describe()}; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")

    recipe = precision.get(args.recipe)
    cfg = ladder.config_for_size(1, seq_len=8)
    tx = step_lib.optimizer_tx(grad_clip=1.0, weight_decay=0.1)
    train_step, _, init = step_lib.compiled()
    model_def, opt_def = nnx.eval_shape(lambda: step_lib.graph_defs(cfg, recipe, tx, 0))
    tokens = np.zeros((1, cfg.seq_len + 1), np.int32)
    lr, measure = np.float32(1e-3), False
    box = {"state": init(cfg, recipe, tx, 0)}
    executable = train_step.lower(model_def, opt_def, box["state"], tokens, 0, 0, lr, measure).compile()

    def identity(step):
        box["state"], loss, _, _ = train_step(model_def, opt_def, box["state"], tokens, 0, step, lr, measure)
        return loss

    def hashed(step):
        static = step_lib._static
        step_lib._static = step_lib.Static  # a new Static per call: hashed at every call
        try:
            return identity(step)
        finally:
            step_lib._static = static

    def aot(step):
        box["state"], loss, _, _ = executable(box["state"], tokens, 0, step, lr, np.bool_(measure))
        return loss

    ways = {"identity": identity, "hashed": hashed, "AOT": aot}
    for call in ways.values():
        call(0).block_until_ready()
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, call in ways.items():
            t = time.perf_counter()
            for step in range(args.steps):
                loss = call(step)
            loss.block_until_ready()
            times[name].append((time.perf_counter() - t) / args.steps * 1e3)
    reference = statistics.median(times["hashed"])
    print(f"{args.recipe}, size 1, 1 x {cfg.seq_len} tokens, {args.steps} steps x {args.rounds} rounds")
    print(f"{'call':10s} {'ms/step':>8s} {'vs hashed':>9s}")
    for name, ts in times.items():
        ms = statistics.median(ts)
        print(f"{name:10s} {ms:8.3f} {ms / reference:9.2f}")


if __name__ == "__main__":
    main()
