"""The joint IsoFLOP fit with shape effects (scaling.study.analysis.shapes): recipes measured on different shapes
compared like with like, and verdicts calibrated over many synthetic seeds."""

import math

import numpy as np
import pandas as pd
import pytest

from scaling.study.analysis import isoflop as analysis, shapes
from scaling.train import compute, ladder

BUDGET = 1e12
# the shapes each recipe ran: "ref" all of them, "a" only the 2-layer models, "b" only the 4-layer ones
SHAPES = {"ref": [(d, 2) for d in (32, 48, 64, 96, 128)] + [(d, 4) for d in (32, 40, 48, 64, 80)],
          "a": [(d, 2) for d in (32, 48, 64, 96, 128)],
          "b": [(d, 4) for d in (32, 40, 48, 64, 80)]}


def _shaped_runs(depth_effect: float, rng: int, noise: float = 0.005) -> pd.DataFrame:
    """Two seeds per (recipe, shape) at one budget: loss = 2 + (ln N - ln 1e5)²/8 + depth_effect at 4 layers
    + noise, N = 12·d_model²·n_layers; "a" and "b" tie, "ref" is 0.1 worse."""
    gen = np.random.default_rng(rng)
    cols = compute.columns(ladder.config_for_size(2, seq_len=64), "bf16", 1024)
    per_token = compute.get("bits").per_token(pd.DataFrame([{**cols, "N": 1e5, "P": 16}]))[0]
    rows = []
    for recipe, shape_list in SHAPES.items():
        for d_model, n_layers in shape_list:
            for seed in (0, 1):
                n = 12 * d_model ** 2 * n_layers
                loss = (2 + (math.log(n) - math.log(1e5)) ** 2 / 8 + depth_effect * (n_layers == 4)
                        + 0.1 * (recipe == "ref") + noise * gen.standard_normal())
                rows.append({**cols, "run_id": f"{recipe}-{d_model}x{n_layers}-{seed}", "recipe": recipe, "seed": seed,
                             "N": float(n), "P": 16, "status": "ok", "d_model": d_model, "n_layers": n_layers,
                             "D": BUDGET / per_token, "val_loss": loss})
    return pd.DataFrame(rows)


def test_two_recipes_that_tie_on_different_shapes_have_no_winner():
    """a and b tie, but b ran only 4-layer models, which cost 0.04 nats at the same N. Fitting each recipe's
    parabola alone (shape_term=False, which is the analysis as it was before shape effects: one parabola
    per recipe, noise from its residuals) puts the whole 0.04 into b's minimum and names a, with a CI
    far from zero (run on the committed code before this change, isoflop named a in each of rng 1-4, by
    0.040-0.045 nats). The joint fit learns the depth effect from "ref", which ran both depths, and
    compares a and b on shape-adjusted minima."""
    runs = _shaped_runs(depth_effect=0.04, rng=2)
    alone = analysis.isoflop(runs, BUDGET, "bits", shape_term=False)
    assert alone["winner"] == "a" and alone["diff"] > 0.03
    res = analysis.isoflop(runs, BUDGET, "bits")
    assert {res["best"], res["runner_up"]} == {"a", "b"} and res["winner"] is None and "cannot tell" in res["reason"]
    assert abs(res["diff"]) < 0.015
    effects = {e["shape"]: e["effect"] for e in res["shape_effects"]}
    assert set(effects) == {f"d{d}×{n}" for d, n in SHAPES["ref"]}
    deep = np.mean([effects[f"d{d}×4"] for d, _ in SHAPES["b"]])
    shallow = np.mean([effects[f"d{d}×2"] for d, _ in SHAPES["a"]])
    assert deep - shallow == pytest.approx(0.04, abs=0.015)
    # the depth step was most of the scatter about the parabolas; what is left is the seed noise
    assert res["shape_share"] > 0.5 and res["sigma"] == pytest.approx(0.005, rel=0.4)
    assert res["sigma_parabolas"] > 2 * res["sigma"]


def test_on_common_shapes_the_shape_term_moves_only_noise():
    """Every recipe on the same shapes: a shape effect orthogonal to quadratics in ln N leaves each recipe's
    parabola exactly as fitted alone; only the residual scatter shrinks."""
    gen = np.random.default_rng(0)
    x = np.tile(np.log(np.geomspace(1e5, 1e7, 7)), 3)
    recipe_of = np.repeat(np.arange(3), 7)
    labels = [f"{v:.4f}" for v in x]
    bump = np.tile([0.0, 0.03, -0.02, 0.0, 0.04, -0.01, 0.0], 3)
    y = 2 + (x - math.log(1e6)) ** 2 / 8 + bump + 0.002 * gen.standard_normal(x.size)
    joint, alone = shapes.joint_design(x, recipe_of, labels), shapes.joint_design(x, recipe_of, labels, shape_term=False)
    (c_joint,), (rss_joint,) = shapes.fit(joint, y)
    (c_alone,), (rss_alone,) = shapes.fit(alone, y)
    assert len(joint.shapes) == 7 and np.allclose(c_joint[:9], c_alone[:9])
    assert rss_joint < 0.05 * rss_alone


def _null_design(n_recipes: int):
    x = np.tile(np.repeat(np.log(np.geomspace(1e5, 1e7, 7)), 2), n_recipes)  # 7 sizes x 2 seeds
    recipe_of = np.repeat(np.arange(n_recipes), 14)
    return shapes.joint_design(x, recipe_of, [f"{v:.4f}" for v in x]), x, recipe_of


def test_verdicts_are_calibrated_over_many_seeds():
    """600 synthetic studies of two recipes with no true difference: the share that names a winner stays
    near the nominal 5%. Then a true gap of 3 noise widths (3 x the scatter of the fitted difference of
    minima across the null studies) is named, for the right recipe, in most of them."""
    design, x, recipe_of = _null_design(2)
    gen = np.random.default_rng(7)
    mean = 2 + (x - math.log(1e6)) ** 2 / 8
    null = mean + 0.02 * gen.standard_normal((600, x.size))
    res = shapes.compare(design, null, n_boot=300, level=0.95, rng=np.random.default_rng(8))
    false_rate = float(np.mean(res["winner"] >= 0))
    assert false_rate <= 0.07
    width = float(np.std(res["loss"][:, 1] - res["loss"][:, 0]))
    gapped = null + 3 * width * (recipe_of == 1)
    named = shapes.compare(design, gapped, n_boot=300, level=0.95, rng=np.random.default_rng(9))["winner"]
    assert np.mean(named == 0) >= 0.70 and np.mean(named == 1) <= 0.01


def test_more_recipes_and_a_lower_level_stay_at_or_below_their_nominal_rate():
    """Naming the best of three tied recipes is no easier than of two: at level 0.80 the false-winner
    rate stays at or below 20% (the best two are compared, the third can only make them closer)."""
    design, x, _ = _null_design(3)
    gen = np.random.default_rng(11)
    null = 2 + (x - math.log(1e6)) ** 2 / 8 + 0.02 * gen.standard_normal((400, x.size))
    res = shapes.compare(design, null, n_boot=300, level=0.80, rng=np.random.default_rng(12))
    assert np.mean(res["winner"] >= 0) <= 0.22
    assert res["p_best"].shape == (400, 3) and np.allclose(res["p_best"].sum(axis=1), 1)


def test_gaps_to_the_reference_and_pairs_are_paired_differences_of_minima():
    """Every fitted recipe carries its minimum minus the reference's with a paired CI, and a requested pair
    its difference and verdict: here "ref" (the one with the most bits, so made the reference by raising
    its P) is 0.1 worse than a and b, which tie; a pair with a recipe not fitted is left out."""
    runs = _shaped_runs(depth_effect=0.04, rng=3)
    runs.loc[runs["recipe"] == "ref", "P"] = 32
    res = analysis.isoflop(runs, BUDGET, "bits", pairs=[("a", "b"), ("a", "ref"), ("a", "missing")])
    by = {e["recipe"]: e for e in res["recipes"]}
    assert by["ref"]["gap"] is None and by["ref"]["gap_ci"] is None
    for r in ("a", "b"):
        lo, hi = by[r]["gap_ci"]
        assert lo < by[r]["gap"] < hi and lo < -0.1 + 0.02 and -0.1 - 0.02 < hi < 0
        assert by[r]["gap"] == pytest.approx(by[r]["loss"] - by["ref"]["loss"])
    pairs = {(p["a"], p["b"]): p for p in res["pairs"]}
    assert set(pairs) == {("a", "b"), ("a", "ref")}
    tie, beat = pairs[("a", "b")], pairs[("a", "ref")]
    assert tie["ci"][0] < 0 < tie["ci"][1] and tie["verdict"].startswith("cannot tell")
    assert beat["ci"][1] < 0 and beat["verdict"].startswith("a lower than ref by")
    assert beat["diff"] == pytest.approx(by["a"]["gap"])
