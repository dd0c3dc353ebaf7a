"""One word per thing: the planner's step recipes (scaling.plan.efficiency.RECIPES) are named as the
trainer's presets they price (scaling.numerics.precision.PRESETS). This test imports both packages;
the planner itself never imports scaling.numerics (tests/test_layout.py)."""

import json
from pathlib import Path

import pytest

from scaling.numerics import precision
from scaling.plan import efficiency, stepvalidate
# `scaling plan step` on a GPU that runs every recipe's tensor-core rate (B200: FP8, FP4, MX, NVFP4)
STEP = ["plan", "step", "--model", "llama3-8b", "--layers", "2", "--gpu", "b200", "--layout", "tp=1", "--json"]


def test_every_planner_recipe_is_a_trainer_preset_or_documented_planner_only():
    stray = sorted(set(efficiency.RECIPES) - set(precision.PRESETS) - set(efficiency.PLANNER_ONLY))
    assert not stray, f"planner recipes that are no trainer preset and not in efficiency.PLANNER_ONLY: {stray}"
    # PLANNER_ONLY names only planner recipes that really are no preset, each with why
    assert set(efficiency.PLANNER_ONLY) <= set(efficiency.RECIPES) - set(precision.PRESETS)
    assert all(isinstance(why, str) and why.strip() for why in efficiency.PLANNER_ONLY.values())
    documented = (Path(efficiency.__file__).parents[2] / "docs" / "planner.md").read_text(encoding="utf-8")
    assert all(f"`{name}`" in documented for name in efficiency.RECIPES)


def test_the_checked_step_cases_use_the_recipe_names():
    used = {case["precision"] for case in stepvalidate.load_cases()}
    assert "fp8-blockwise" in used and used <= set(efficiency.RECIPES), sorted(used - set(efficiency.RECIPES))


@pytest.mark.parametrize("name", precision.PRESETS)
def test_plan_step_prices_every_preset_it_can_and_names_the_rest(name, capsys):
    from scaling import cli

    rc = cli.main([*STEP, "--precision", name])
    out, err = capsys.readouterr()
    if name in efficiency.RECIPES:
        assert rc == 0, err
        step = json.loads(out)
        assert step["precision"] == name and step["step_ms"] > 0
    else:  # one line naming the key, the value and every recipe the planner prices
        assert rc == 2 and out == ""
        assert err.count("\n") == 1 and err.startswith(f"error: precision: got {name!r}; allowed: one of "), err
        assert err.strip().split("allowed: one of ")[1].split(", ") == list(efficiency.RECIPES)


def test_the_old_planner_name_is_gone():
    """`fp8-block` was the planner's word for the trainer's `fp8-blockwise`: one word now."""
    assert "fp8-block" not in efficiency.RECIPES and "fp8-blockwise" in efficiency.RECIPES
