"""Does the quick preset's committed uncertainty cover a rerun? Compares the committed quick study
(results/quick.csv, fits/quick.json) with a rerun of the same design under another seed (or on a
machine with another GEMM path), analysed the way `scaling reproduce --preset quick` analyses it:
each recipe's IsoFLOP minimum against the committed 95% CI, the verdicts, and P* against the
committed interval (bootstrap CI and specification range together).

    sed 's/^seed = 0/seed = 1/' experiments/quick.toml > /tmp/quick_seed1.toml
    scaling sweep /tmp/quick_seed1.toml --out /tmp/quick_seed1
    python paper_figures/rerun_check.py /tmp/quick_seed1/quick.csv
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scaling.study.analysis import isoflop as analysis, findings, fit, selection
from scaling.study.sweeps import results
from scaling.study import reproduce

ROOT = Path(__file__).resolve().parents[1]


def study(csv: Path, fit_json: Path | None = None):
    """findings of a quick study: with its committed fit, or the law chosen and bootstrapped as reproduce does."""
    df = results.load(csv)
    df = df[df["sweep"] == "quick"].reset_index(drop=True)
    if fit_json is not None:
        law = fit.FitResult.from_json(fit_json)
    else:
        rows = analysis.ok_rows(df)
        choice, fits = selection.select(rows, reproduce.CANDIDATES["quick"], loss_column="val_loss")
        law = selection.chosen_fit(rows, choice, fits, bootstrap=100, seed=0, loss_column="val_loss")
    return law, findings.findings(df, law)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rerun", type=Path, help="the rerun's summary csv (results of the quick design)")
    args = parser.parse_args()
    law0, f0 = study(ROOT / "results" / "quick.csv", ROOT / "fits" / "quick.json")
    law1, f1 = study(args.rerun)
    print(f"law: committed {law0.law}, rerun {law1.law}" + (f" (degenerate: {law1.degenerate})" if law1.degenerate else ""))
    inside = total = 0
    for b0, b1 in zip(f0["budgets"], f1["budgets"]):
        rerun = {e["recipe"]: e for e in b1["recipes"]}
        for e in b0["recipes"]:
            m, (lo, hi) = rerun[e["recipe"]]["loss"], e["ci"]
            inside, total = inside + (lo <= m <= hi), total + 1
            print(f"C = {b0['budget']:g} {e['recipe']:<6} minimum: committed {e['loss']:.3f} (95% CI {lo:.3f}-{hi:.3f}), "
                  f"rerun {m:.3f}: {'inside' if lo <= m <= hi else 'OUTSIDE'}")
        print(f"  verdict: committed '{b0['reason']}'; rerun '{b1['reason']}'")
    print(f"minima inside the committed 95% CIs: {inside} of {total}")
    for p0, p1 in zip(f0["P_star"], f1["P_star"]):
        lo, hi = p0["interval"]
        if "P" not in p1:
            print(f"P* at C = {p0['compute']:g}: committed {p0['P']:.2f} (interval {lo:.2f}-{hi:.2f}); rerun none: {p1.get('error')}")
            continue
        print(f"P* at C = {p0['compute']:g}: committed {p0['P']:.2f} (bootstrap CI {p0['P_ci'][0]:.2f}-{p0['P_ci'][1]:.2f}, "
              f"interval {lo:.2f}-{hi:.2f}); rerun {p1['P']:.2f}: {'inside' if lo <= p1['P'] <= hi else 'OUTSIDE'} the "
              f"interval, {'inside' if p0['P_ci'][0] <= p1['P'] <= p0['P_ci'][1] else 'outside'} the bootstrap CI alone")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
