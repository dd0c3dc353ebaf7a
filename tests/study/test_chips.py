"""Each chip's verdict computed from the reference's loss curves and the recipes' matched gaps
(scaling.study.analysis.chips), checked against a known truth."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest

from scaling.errors import ConfigError
from scaling.study.analysis import chips

SIZES = (1e4, 2e4, 4e4, 8e4, 1.6e5, 3.2e5)
D_OVER_N = np.geomspace(5, 800, 8)  # each run evaluated at 8 token counts (cooldown branches)
SEEDS = (0, 1, 2)
E, A, ALPHA, B, BETA = 1.0, 30.0, 0.35, 2000.0, 0.55  # the reference's true surface (optima inside the design)


def true_reference(N, D):
    return E + A * np.asarray(N) ** -ALPHA + B * np.asarray(D) ** -BETA


# The true matched gaps: wide8 a small constant; narrow4 larger and growing with tokens per parameter.
GAPS = {"wide8": lambda N, DN: 0.004 + 0 * N,
        "narrow4": lambda N, DN: 0.035 + 0.012 * np.log(DN / 40.0)}
BITS = {"ref16": 16, "wide8": 8, "narrow4": 4}


@dataclass(frozen=True)
class Chip:
    """A cost model by its charge per 6N per token, per recipe (what compute.CostModel gives a real chip)."""

    name: str
    charge: dict

    def describe(self) -> str:
        return f"{self.name}: synthetic"

    def per_token(self, rows: pd.DataFrame) -> np.ndarray:
        unknown = set(rows["recipe"]) - set(self.charge)
        if unknown:
            raise ConfigError("recipe", sorted(unknown)[0], sorted(self.charge))
        return 6.0 * rows["N"].to_numpy(float) * rows["recipe"].map(self.charge).to_numpy(float)


# fast4 runs 4-bit GEMMs at twice the 8-bit rate; slow4 has no 4-bit path (it runs them at the 8-bit rate)
FAST4 = Chip("fast4", {"ref16": 1.0, "wide8": 0.5, "narrow4": 0.25})
SLOW4 = Chip("slow4", {"ref16": 1.0, "wide8": 0.5, "narrow4": 0.5})


def study(seed: int = 0, cell_sd: float = 0.004, row_sd: float = 0.0015) -> pd.DataFrame:
    """Every recipe at every (size, seed, D): the cell's luck shared by its recipes, as a seed does."""
    rng = np.random.default_rng(seed)
    rows = []
    for N in SIZES:
        for s in SEEDS:
            luck = rng.normal(0, cell_sd)
            for dn in D_OVER_N:
                D = N * dn
                for recipe in BITS:
                    gap = 0.0 if recipe == "ref16" else GAPS[recipe](N, dn)
                    rows.append({"recipe": recipe, "N": N, "D": D, "seed": s, "P": BITS[recipe], "status": "ok",
                                 "val_loss": true_reference(N, D) + gap + luck + rng.normal(0, row_sd)})
    return pd.DataFrame(rows)


def truth(chip: Chip, budget: float) -> dict[str, float]:
    """Each recipe's true best loss over the trained sizes at this chip and budget."""
    out = {}
    for recipe, charge in chip.charge.items():
        N = np.array(SIZES)
        D = budget / (6 * N * charge)
        gap = 0.0 if recipe == "ref16" else GAPS[recipe](N, D / N)
        out[recipe] = float(np.min(true_reference(N, D) + gap))
    return out


BUDGETS = (1e12, 3e12)


@pytest.fixture(scope="module")
def result():
    return chips.chip_verdicts(study(), BUDGETS, [FAST4, SLOW4], reference="ref16", draws=60)


def test_the_truth_makes_the_cheaper_recipe_win_only_where_the_chip_makes_it_cheaper():
    """The design's premise: narrow4 is worse at matched tokens, wins on fast4 and loses on slow4."""
    for budget in BUDGETS:
        fast, slow = truth(FAST4, budget), truth(SLOW4, budget)
        assert min(fast, key=fast.get) == "narrow4" and min(slow, key=slow.get) == "wide8"


def test_each_chips_verdict_recovers_the_truth(result):
    for chip in (FAST4, SLOW4):
        for verdict, budget in zip(result["chips"][chip.name]["budgets"], BUDGETS):
            true = truth(chip, budget)
            assert verdict["compared"] == 3 and verdict["winner"] == min(true, key=true.get)
            for e in verdict["recipes"]:  # each recipe's best loss within 4 of its bootstrap SEs of the truth
                assert abs(e["loss"] - true[e["recipe"]]) < 4 * e["loss_se"] + 1e-3, (chip.name, budget, e)
            lead = sorted(true.values())[1] - sorted(true.values())[0]
            lo, hi = verdict["diff_ci"]
            assert lo <= lead <= hi and lo > 0


def test_the_gap_models_recover_the_true_gaps(result):
    got = result["gaps"]
    assert got["wide8"]["coefficients"]["a"] == pytest.approx(0.004, abs=0.003)
    assert abs(got["wide8"]["coefficients"]["c"]) < 0.003
    assert got["narrow4"]["coefficients"]["c"] == pytest.approx(0.012, abs=0.003)


def test_a_recipe_the_data_cannot_separate_is_a_tie_not_a_winner():
    """Two recipes with the same true gap and charge: the verdict names both, never one of them."""
    df = study(seed=3)
    twin = df[df["recipe"] == "wide8"].assign(recipe="wide8b")
    twin = twin.assign(val_loss=twin["val_loss"] + np.random.default_rng(4).normal(0, 0.0015, len(twin)))
    chip = Chip("twin", {"ref16": 1.0, "wide8": 0.5, "narrow4": 0.5, "wide8b": 0.5})
    got = chips.chip_verdicts(pd.concat([df, twin]), [3e12], [chip], reference="ref16", draws=60)
    v = got["chips"]["twin"]["budgets"][0]
    assert v["winner"] is None and set(v["tied"]) >= {"wide8", "wide8b"} and v["verdict"].startswith("cannot tell")
    assert v["compared"] == 4


def test_reading_beyond_what_was_measured_says_so():
    """Sizes measured only at short D: a budget that buys far more tokens reads the reference beyond
    its measured D and the gaps beyond their D/N, and the verdict's entries say both."""
    df = study(seed=5)
    df = df[df["D"] / df["N"] <= 40]
    got = chips.chip_verdicts(df, [3e13], [SLOW4], reference="ref16", draws=20)
    notes = {e["recipe"]: " ".join(e["notes"]) for e in got["chips"]["slow4"]["budgets"][0]["recipes"]}
    assert "beyond" in notes["ref16"] and "outside the (N, D/N)" in notes["wide8"]


def test_a_recipe_a_cost_model_cannot_price_is_named_not_charged():
    chip = Chip("partial", {"ref16": 1.0, "wide8": 0.5})
    got = chips.chip_verdicts(study(seed=6), [3e12], [chip], reference="ref16", draws=10)
    c = got["chips"]["partial"]
    assert "narrow4" in c["not_priced"] and c["budgets"][0]["compared"] == 2
    assert {e["recipe"] for e in c["budgets"][0]["recipes"]} == {"ref16", "wide8"}


def test_answer_table_has_a_cell_per_chip_and_budget(result):
    table = chips.answer_table(result)
    lines = table.splitlines()
    assert len(lines) == 4 and lines[2].startswith("| fast4 | **narrow4**, ") and "below wide8 [+" in lines[2]
    assert lines[3].startswith("| slow4 | **wide8**, ") and "below narrow4" in lines[3]


def test_chips_with_the_same_answer_share_a_row():
    """A chip whose relative rates equal another's (as an H200's equal an H100's) gives the same answer: one row."""
    twin = Chip("fast4b", dict(FAST4.charge))
    got = chips.chip_verdicts(study(), BUDGETS, [FAST4, SLOW4, twin], reference="ref16", draws=20)
    rows = chips.answer_table(got).splitlines()[2:]
    assert len(rows) == 2 and rows[0].startswith("| fast4, fast4b | **narrow4**") and rows[1].startswith("| slow4 | ")
