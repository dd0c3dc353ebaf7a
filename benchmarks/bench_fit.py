"""Fitting speed, ours vs the plain scipy method, measured in the same process.

(a) Chinchilla Approach 3 on the real points (240 after dropping the 5 highest losses), the full
    4,500-start grid: fit.fit_law (batched JAX L-BFGS + scipy polish) vs fit.reference_fit (a Python
    loop of scipy.optimize.minimize(L-BFGS-B) per start, numpy objective, finite-difference gradients,
    as in Besiroglu et al.'s code). The loop is timed on a random subset of starts and extrapolated
    to 4,500 (pass --full to run all of them); both optima are printed.
(b) 1,000 bootstrap resamples of a 300-row synthetic kumar dataset: wall time of fit.bootstrap
    (target <= 60 s on 2 cores) vs the same resamples as a per-resample scipy loop (timed on a subset,
    extrapolated).

    python benchmarks/bench_fit.py [--subset 200] [--full]
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from scaling.study.analysis import fit, laws
from scaling import host

DATA = Path(__file__).resolve().parents[1] / "tests" / "study" / "data" / "chinchilla_svg_extracted.csv"


def chinchilla_data() -> pd.DataFrame:
    raw = pd.read_csv(DATA)
    df = pd.DataFrame({"N": raw["Model Size"], "D": raw["Training FLOP"] / (6 * raw["Model Size"]), "loss": raw["loss"]})
    return df.drop(df["loss"].nlargest(5).index).reset_index(drop=True)


def kumar_data() -> pd.DataFrame:
    truth = dict(E=1.8, A=400.0, B=2000.0, alpha=0.34, beta=0.36, gamma=2.5, kappa=3.0)
    grid = {"N": [1e7, 3e7, 1e8, 3e8, 1e9, 3e9], "D": [1e9, 3e9, 1e10, 3e10, 1e11], "P": [2, 3, 4, 5, 6, 8, 10, 12, 16, 32]}
    df = pd.DataFrame(list(itertools.product(*grid.values())), columns=list(grid))
    x = {c: df[c].to_numpy(float) for c in df.columns}
    df["loss"] = laws.get("kumar").predict(truth, x) * np.exp(0.01 * np.random.default_rng(0).standard_normal(len(df)))
    df["run_id"] = [f"n{n:g}-p{p:g}" for n, p in zip(df["N"], df["P"])]
    return df


def timed(f):
    t = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t


def fmt(params):
    return ", ".join(f"{k}={v:.5g}" for k, v in params.items())


def bench_grid(subset: int, full: bool) -> None:
    df = chinchilla_data()
    ours, t_cold = timed(lambda: fit.fit_law(df, "chinchilla"))
    ours, t_warm = timed(lambda: fit.fit_law(df, "chinchilla"))
    starts = fit.grid_starts(df, "chinchilla")
    if not full:
        starts = starts[np.random.default_rng(0).choice(len(starts), subset, replace=False)]
    ref, t_ref = timed(lambda: fit.reference_fit(df, "chinchilla", starts=starts))
    t_ref_full = t_ref * 4500 / len(starts)
    print("(a) Chinchilla grid, 4,500 starts, 240 points")
    print(f"  ours       : {t_warm:8.2f} s warm ({t_cold:.2f} s incl. JIT compile)  objective {ours.objective:.12g}")
    print(f"               {fmt(ours.params)}")
    how = "all 4,500 starts" if full else f"{len(starts)} random starts, x{4500 / len(starts):.1f} extrapolated"
    print(f"  scipy loop : {t_ref_full:8.2f} s ({how}; measured {t_ref:.2f} s)  objective {ref['objective']:.12g}")
    print(f"               {fmt(ref['params'])}")
    print(f"  same optimum: objective rel. diff {(ours.objective - ref['objective']) / ref['objective']:+.2e}, "
          f"max param rel. diff {max(abs(ours.params[k] / ref['params'][k] - 1) for k in ours.params):.2e}")
    print(f"  speed-up   : {t_ref_full / t_warm:6.1f}x warm, {t_ref_full / t_cold:6.1f}x cold (target >= 10x)")


def bench_bootstrap(subset: int = 20) -> None:
    df = kumar_data()
    result, t_total = timed(lambda: fit.bootstrap(df, "kumar", n=1000, seed=0))
    # The resampling part alone (the full-data fit above includes the 1,728-start grid).
    problem = fit._prepare(df, "kumar", None)
    theta = problem.theta(result.params)
    _, t_fit = timed(lambda: fit.fit_law(df, "kumar"))
    t_resamples = t_total - t_fit
    rng = np.random.default_rng(0)
    n_units = int(problem.units.max()) + 1
    weights = rng.multinomial(n_units, np.full(n_units, 1 / n_units), size=subset)[:, problem.units].astype(float)

    def scipy_loop():
        for w in weights:
            minimize(lambda th: fit._numpy_objective(problem, th, weights=w), theta, method="L-BFGS-B")

    _, t_ref = timed(scipy_loop)
    t_ref_full = t_ref * 1000 / subset
    print("(b) bootstrap, 1,000 resamples of 300 rows (kumar, resampling 60 runs)")
    print(f"  ours total : {t_total:8.2f} s (fit + resamples; target <= 60 s)  -> {60 / t_total:.2f}x under target")
    print(f"  resamples  : {t_resamples:8.2f} s (total minus a warm full-data fit of {t_fit:.2f} s)")
    print(f"  scipy loop : {t_ref_full:8.2f} s ({subset} resamples from the same optimum, x{1000 / subset:.0f} extrapolated)")
    print(f"  speed-up   : {t_ref_full / max(t_resamples, 1e-9):6.1f}x on the resamples")
    print("  95% CIs    : " + ", ".join(f"{k} [{lo:.4g}, {hi:.4g}]" for k, (lo, hi) in result.ci.items()))


def main() -> None:
    # the header names the machine and the allocator setting: timings hold for those only
    print(f"{host.describe()}; {host.process_env_status()}", flush=True)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subset", type=int, default=200, help="scipy-loop starts to time (extrapolated to 4,500)")
    parser.add_argument("--full", action="store_true", help="run the scipy loop on all 4,500 starts")
    args = parser.parse_args()
    bench_grid(args.subset, args.full)
    bench_bootstrap()


if __name__ == "__main__":
    main()
