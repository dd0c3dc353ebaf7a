"""Local executor modes on the smoke grid: in-process sequential (--workers 0) vs one watched
child process per run (--workers 1, the default) vs two concurrent children (--workers 2).

Each mode runs the same 3-run sweep into a fresh directory with a fresh compilation cache;
take-off is included (it is part of every sweep). Prints wall seconds and the ratio to the
in-process mode, measured in this one invocation:

    python benchmarks/bench_sweep.py [--repeats 1]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scaling import host

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "experiments" / "smoke_sweep.toml"


def run_mode(workers: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "SCALING_CACHE": tmp}  # cold compilation cache, as a first sweep sees it
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "scaling.cli", "sweep", str(SMOKE), "--out", f"{tmp}/out",
                        "--workers", str(workers), "--no-progress"], check=True, cwd=ROOT, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return time.perf_counter() - start


def main() -> None:
    # the header names the machine and the allocator setting: timings hold for those only
    print(f"{host.describe()}; {host.process_env_status()}", flush=True)
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    modes = {"in-process (--workers 0)": 0, "child per run (--workers 1)": 1, "2 children (--workers 2)": 2}
    times = {name: [] for name in modes}
    for _ in range(args.repeats):  # interleaved, so a noisy neighbour hits every mode alike
        for name, workers in modes.items():
            times[name].append(run_mode(workers))
    reference = min(times["in-process (--workers 0)"])
    print("| local executor mode | wall s (best) | ratio to in-process |")
    print("| --- | ---: | ---: |")
    for name, ts in times.items():
        print(f"| {name} | {min(ts):.1f} | {min(ts) / reference:.2f} |")


if __name__ == "__main__":
    main()
