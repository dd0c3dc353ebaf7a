"""Where one recipe's train step spends its time: XLA ops of a jax.profiler trace, summed.

    python benchmarks/profile_step.py [--recipe mxfp4] [--size 8] [--batch 16] [--seq-len 256] [--steps 3] [--top 30]

The trainer's own compiled step (as bench_step.py builds it, compile cache off), warmed up, then
--steps steps timed without the profiler, then --steps under `jax.profiler.trace`; the trace's complete events are summed per op name and
per op kind (the name up to its first '.', e.g. `multiply_bitcast_fusion`), in ms per step and as a
share of the step's wall time measured in the same process. On CPU, XLA runs independent thunks
concurrently, so the shares may sum to more than 1. To see what a fusion holds:
`step.as_text()` of the compiled step (bench_step.make_step) lists each fusion's computation.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import tempfile
import time

import jax

from bench_step import make_step
from scaling import host
from scaling.train import ladder
from scaling.numerics import precision

# host-side and runtime events, not XLA ops
HOST = ("ThunkExecutor", "$", "SlinkyThreadPool", "while", "TfrtCpu", "PjRt")


def main() -> None:
    # the header names the machine and the allocator setting: timings hold for those only
    print(f"{host.describe()}; {host.process_env_status()}", flush=True)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="mxfp4")
    ap.add_argument("--size", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()

    jax.config.update("jax_enable_compilation_cache", False)
    cfg = ladder.config_for_size(args.size, seq_len=args.seq_len)
    tokens = jax.random.randint(jax.random.key(0), (args.batch, args.seq_len + 1), 0, cfg.vocab)
    state, step, _, _ = make_step(cfg, precision.get(args.recipe), tokens)
    state, loss, _, _ = step(state, tokens, 0, 0, 1e-3, False)  # warm-up
    jax.block_until_ready(loss)
    t = time.perf_counter()  # the step's wall time, untraced
    for i in range(args.steps):
        state, loss, _, _ = step(state, tokens, 0, i, 1e-3, False)
    jax.block_until_ready(loss)
    wall = (time.perf_counter() - t) / args.steps
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            for i in range(args.steps):
                state, loss, _, _ = step(state, tokens, 0, i, 1e-3, False)
            jax.block_until_ready(loss)
        (path,) = glob.glob(f"{trace_dir}/**/perfetto_trace.json.gz", recursive=True)
        events = json.load(gzip.open(path))
    events = events["traceEvents"] if isinstance(events, dict) else events
    per_op: collections.Counter = collections.Counter()
    for e in events:
        if e.get("ph") == "X" and "dur" in e and not e["name"].startswith(HOST):
            per_op[e["name"]] += e["dur"] / 1e3 / args.steps  # us -> ms per step
    per_kind: collections.Counter = collections.Counter()
    for name, ms in per_op.items():
        per_kind[name.split(".")[0]] += ms
    print(f"{args.recipe}, size {args.size}, batch {args.batch}x{args.seq_len}: step {wall * 1e3:.0f} ms wall "
          f"(untraced), traced ops {sum(per_op.values()):.0f} ms per step")
    print(f"{'ms/step':>9s} {'of step':>8s}  op")
    for name, ms in per_op.most_common(args.top):
        print(f"{ms:9.1f} {ms / (wall * 1e3):8.3f}  {name}")
    print(f"{'ms/step':>9s} {'of step':>8s}  kind")
    for name, ms in per_kind.most_common(args.top):
        print(f"{ms:9.1f} {ms / (wall * 1e3):8.3f}  {name}")


if __name__ == "__main__":
    main()
