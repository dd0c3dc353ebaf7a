"""Quantiser throughput: fake_quant on a 4096×4096 float32 array vs a jitted elementwise copy.

    python benchmarks/bench_quant.py [--n 4096] [--repeats 15]

The reference is `x * 1.0001` (one read, one write: memory bound), timed in the same process and
interleaved with the quantisers so machine noise hits both alike. ratio = copy time / our time
(higher is better; targets: >= 0.5 for tensor, >= 0.3 for mx and nvfp4). Medians of `repeats`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import jax
import jax.numpy as jnp

from scaling import host
from scaling.numerics import quant

CASES = [
    ("tensor (fp8_e4m3)", quant.QuantSpec("fp8_e4m3", "tensor")),
    ("channel (fp8_e4m3)", quant.QuantSpec("fp8_e4m3", "channel")),
    ("block 128 (fp8_e4m3)", quant.QuantSpec("fp8_e4m3", "block", block=128)),
    ("mx (fp4_e2m1)", quant.QuantSpec("fp4_e2m1", "mx")),
    ("mx (fp8_e4m3)", quant.QuantSpec("fp8_e4m3", "mx")),
    ("nvfp4", quant.QuantSpec("fp4_e2m1", "nvfp4")),
]


def _time(fn, x) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(fn(x))
    return time.perf_counter() - t0


def main() -> None:
    # the header names the machine and the allocator setting: timings hold for those only
    print(f"{host.describe()}; {host.process_env_status()}", flush=True)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    x = jax.random.normal(jax.random.key(0), (args.n, args.n), jnp.float32)
    copy = jax.jit(lambda v: v * 1.0001)
    fns = {name: jax.jit(partial(quant.fake_quant, spec=spec)) for name, spec in CASES}
    for fn in [copy, *fns.values()]:  # compile and warm up
        jax.block_until_ready(fn(x))
        jax.block_until_ready(fn(x))
    times: dict[str, list[float]] = {"copy": [], **{name: [] for name in fns}}
    for _ in range(args.repeats):
        for name, fn in [("copy", copy), *fns.items()]:
            times[name].append(_time(fn, x))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"fake_quant on a {args.n}x{args.n} float32 array, {jax.devices()[0].platform}, "
          f"median of {args.repeats}; reference x * 1.0001: {med['copy'] * 1e3:.2f} ms\n")
    print("| granularity | ms | ratio (copy / ours) |")
    print("| --- | ---: | ---: |")
    for name in fns:
        print(f"| {name} | {med[name] * 1e3:.2f} | {med['copy'] / med[name]:.2f} |")


if __name__ == "__main__":
    main()
