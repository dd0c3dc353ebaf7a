"""How often does law selection's precision test say "a precision term helps" when it does not, and
when it does? Repeats the synthetic studies of tests/study/test_selection_truths.py (a ladder of runs,
4 sizes x 3 D/N x 4 recipes x 2 seeds, three WSD evaluations each, a persistent luck per run) under
fresh draws: `null`, no precision effect (the truth is chinchilla), and `data`, a precision penalty
that grows with D (the truth is kumar_data). For each draw, selection.select_law over (chinchilla,
kumar) for null and (chinchilla, kumar, kumar_data) for data; records the precision test's p-value,
whether it rejected at selection.ALPHA, and the chosen law. Writes one JSON summary with the
rejection rate and its 95% Wilson interval; a truth run again replaces its own entry in an existing
summary, so the two truths can be run apart.

    python paper_figures/selection_calibration.py --truths null --draws 30 -o results/selection_calibration.json
    python paper_figures/selection_calibration.py --truths data --draws 10 -o results/selection_calibration.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "study"))  # the synthetic truths, defined once with their tests

from test_selection_truths import CHINCHILLA, KUMAR_DATA, QUICK, ladder  # noqa: E402

from scaling.study.analysis import selection  # noqa: E402

TRUTHS = {"null": ("chinchilla", CHINCHILLA, ["chinchilla", "kumar"]),
          "data": ("kumar_data", KUMAR_DATA, ["chinchilla", "kumar", "kumar_data"])}


def wilson(k: int, n: int, z: float = 1.96) -> list[float]:
    """The 95% Wilson score interval of a proportion k/n."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [max(0.0, float(centre - half)), min(1.0, float(centre + half))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=30)
    parser.add_argument("--truths", nargs="+", default=list(TRUTHS), choices=list(TRUTHS))
    parser.add_argument("-o", "--out", required=True)
    args = parser.parse_args()
    path = Path(args.out)
    out: dict = json.loads(path.read_text()) if path.is_file() else {"alpha": selection.ALPHA, "truths": {}}
    for name in args.truths:
        law, params, candidates = TRUTHS[name]
        rows, started = [], time.perf_counter()
        for seed in range(1, args.draws + 1):  # seed 0 is the test's own draw
            sel = selection.select_law(ladder(law, params, seed=seed), candidates, **QUICK)
            pt = sel["precision_test"] or {}
            rows.append({"seed": seed, "chosen": sel["chosen"], "p_value": pt.get("p_value"),
                         "rejected": bool(pt.get("beats")), "n_clusters": pt.get("n_clusters")})
            print(f"{name} {seed}: {sel['chosen']} p={pt.get('p_value')}", flush=True)
        k = sum(r["rejected"] for r in rows)
        out["truths"][name] = {"truth": law, "candidates": candidates, "draws": len(rows), "rejections": k,
                               "rejection_rate": k / len(rows), "rejection_ci": wilson(k, len(rows)),
                               "chosen": {c: sum(r["chosen"] == c for r in rows) for c in candidates},
                               "seconds": round(time.perf_counter() - started), "rows": rows}
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({n: {k: v for k, v in t.items() if k != "rows"} for n, t in out["truths"].items()}, indent=1))


if __name__ == "__main__":
    main()
