"""Many runs, one program: K runs of one shape trained as one vmapped step (scaling.train.step.packed)
against the same K runs stepped one after another in the same process.

    python benchmarks/bench_packed.py [--size 1] [--batch 8] [--seq-len 128] [--members 4]
        [--recipe fp8] [--steps 10] [--rounds 3]

Both sides run the trainer's own jitted steps (no telemetry: `measure` false), compiled before
timing; each member has its own seed, batch and learning rate. Prints the median time of a packed
step (all K members) and of K single steps, their ratio (above 1: packing is faster), tokens/s
of each, and whether each member's state is then its single run's bit for bit. The header names
the device, XLA_FLAGS and the host; the result holds for those only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import numpy as np

from scaling import host
from scaling.numerics import precision
from scaling.train import ladder
from scaling.train import step as step_lib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--recipe", default="fp8")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"{host.describe()}; {jax.devices()[0].device_kind}; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}", flush=True)

    cfg = ladder.config_for_size(args.size, seq_len=args.seq_len)
    tx = step_lib.optimizer_tx(1.0, 0.1)
    recipe = precision.get(args.recipe)
    model_def, opt_def = step_lib.graph_defs(cfg, recipe, tx, 0)
    k = args.members
    seeds = np.arange(1, k + 1, dtype=np.int32)
    lrs = np.geomspace(1e-3, 1e-2, k).astype(np.float32)
    rng = np.random.default_rng(0)
    tokens_KxBxL1 = rng.integers(0, cfg.vocab, (k, args.batch, args.seq_len + 1), dtype=np.int32)
    n_tok = k * args.batch * args.seq_len
    print(f"model size {args.size}: d_model {cfg.d_model}, layers {cfg.n_layers}, "
          f"N {ladder.param_counts(cfg)['non_embedding']:,}; {k} members x {args.batch}x{args.seq_len} tokens; "
          f"recipe {args.recipe}")

    single_step, _, single_init = step_lib.compiled()
    singles = [single_init(cfg, recipe, tx, int(s)) for s in seeds]
    train_step, _, init = step_lib.packed()
    packed = init(cfg, [recipe] * k, tx, seeds.tolist())
    # compile both before timing (the first call of each)
    for m in range(k):
        singles[m], loss, _, _ = single_step(model_def, opt_def, singles[m], tokens_KxBxL1[m], int(seeds[m]), 0,
                                             lrs[m], np.bool_(False))
    jax.block_until_ready(loss)
    packed, losses, _, _ = train_step(model_def, opt_def, packed, tokens_KxBxL1, seeds, 0, lrs, False)
    jax.block_until_ready(losses)

    single_s, packed_s = [], []
    step = 1
    for _ in range(args.rounds):  # interleaved, so a busy spell on a shared machine hits both
        for _ in range(args.steps):
            t = time.perf_counter()
            for m in range(k):
                singles[m], loss, _, _ = single_step(model_def, opt_def, singles[m], tokens_KxBxL1[m], int(seeds[m]),
                                                     step, lrs[m], np.bool_(False))
            jax.block_until_ready(loss)
            single_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            packed, losses, _, _ = train_step(model_def, opt_def, packed, tokens_KxBxL1, seeds, step, lrs, False)
            jax.block_until_ready(losses)
            packed_s.append(time.perf_counter() - t)
            step += 1
    s, p = statistics.median(single_s), statistics.median(packed_s)
    print(f"{k} single steps: {s * 1e3:.1f} ms ({n_tok / s:,.0f} tokens/s); one packed step: {p * 1e3:.1f} ms "
          f"({n_tok / p:,.0f} tokens/s); packed speed-up {s / p:.2f}x (median of {len(single_s)})")
    # both sides took the same steps on the same batches: is each member still its single run?
    same, worst = True, 0.0
    for m in range(k):
        for a, b in zip(jax.tree.leaves(singles[m]), jax.tree.leaves(packed)):
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)[m]
            same &= bool(np.array_equal(a, b, equal_nan=True))
            worst = max(worst, float(np.nanmax(np.abs(a - b), initial=0.0)))
    print(f"after {step} steps each member's state is its single run's "
          + ("bit for bit" if same else f"to within {worst:.3g} (not bit for bit)"))


if __name__ == "__main__":
    main()
