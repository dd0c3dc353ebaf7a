"""IsoFLOP designs: one common set of shapes per budget for every recipe, the edge runs that follow a
minimum for all of them, landed runs reused, and what the dry-run says before anything trains."""

import copy
import json
from pathlib import Path

import pandas as pd
import pytest

from scaling.errors import ConfigError
from scaling.study.sweeps import design as design_lib, design_checks, sweep, takeoff
from scaling.train import compute, config

ROOT = Path(__file__).resolve().parents[2]
BASE = {"name": "d", "model": {"seq_len": 64}, "data": {"source": "stdlib", "eval_tokens": 4096},
        "train": {"batch_size": 8, "lr": 1e-2, "warmup": 5, "schedule": "wsd", "decay": 0.2}}
TABLE = {"budgets": [4e12, 3e13], "sizes": [1, 2, 3, 4, 5, 6], "sizes_per_budget": 3, "tokens_per_param": 20,
         "min_steps": 16}


def _points(*recipes):
    out = []
    for recipe in recipes:
        point = copy.deepcopy(BASE)
        point["precision"] = recipe
        out.append(point)
    return out


def _shapes_by_budget(cfgs):
    out = {}
    for c in cfgs:
        for b in c.study.flop_budgets:
            if b:
                out.setdefault(b, set()).add(c.model.size)
    return out


def test_two_recipes_with_different_optima_get_one_shape_set_per_budget():
    points = _points("fp32", "mxfp4")
    own = design_lib.design_runs(points, design_lib.Design.from_table({**TABLE, "shapes": "per_recipe"}))
    assert _shapes_by_budget(own[0]) != _shapes_by_budget(own[1])  # MXFP4's optimum sits at larger N
    common = design_lib.design_runs(points, design_lib.Design.from_table(TABLE))
    fp32, mxfp4 = _shapes_by_budget(common[0]), _shapes_by_budget(common[1])
    assert fp32 == mxfp4
    for budget in TABLE["budgets"]:  # the union of both windows, no gap
        union = _shapes_by_budget(own[0])[budget] | _shapes_by_budget(own[1])[budget]
        assert fp32[budget] == set(range(min(union), max(union) + 1))
    for mine, theirs in zip(own, common):  # the windows' runs keep their ids; the rest serve one budget
        assert {c.run_id for c in mine} <= {c.run_id for c in theirs}
        assert all(len([b for b in c.study.flop_budgets if b]) == 1 for c in theirs if c not in mine)


def test_shapes_rule_is_checked():
    with pytest.raises(ConfigError, match=r"^isoflop\.shapes: got 'same'; allowed: one of common, per_recipe$"):
        design_lib.Design.from_table({**TABLE, "shapes": "same"})


def _landed(designed, loss_of):
    """Results rows of every designed run at each budget it serves: val_loss = loss_of(recipe, N)."""
    rows = []
    for cfgs in designed:
        for c in cfgs:
            n = compute.run_row(c)["N"]
            for b in c.study.flop_budgets:
                if b:
                    rows.append({"run_id": c.run_id, "status": "ok", "budget": b, "N": n,
                                 "val_loss": loss_of(c.recipe.name, n)})
    return pd.DataFrame(rows)


def test_an_edge_minimum_of_one_recipe_extends_the_shapes_of_all():
    points = _points("fp32", "mxfp4")
    design = design_lib.Design.from_table({**TABLE, "budgets": [4e12], "extend_edges": True})
    designed = design_lib.design_runs(points, design)
    largest = max(c.model.size for c in designed[0])
    # fp32's minimum is inside; mxfp4's at the largest shape
    landed = _landed(designed, lambda r, n: (n - 1e5) ** 2 if r == "fp32" else -n)
    extended = design_lib.extend_edges(points, designed, design, landed)
    for before, after in zip(designed, extended):
        added = [c for c in after if c not in before]
        assert [c.model.size for c in added] == [largest + 1]
    per_recipe = design_lib.Design.from_table({**TABLE, "budgets": [4e12], "extend_edges": True, "shapes": "per_recipe"})
    designed = design_lib.design_runs(points, per_recipe)
    extended = design_lib.extend_edges(points, designed, per_recipe, _landed(designed, lambda r, n: (n - 1e5) ** 2 if r == "fp32" else -n))
    assert len(extended[0]) == len(designed[0]) and len(extended[1]) == len(designed[1]) + 1


def test_edge_runs_never_repeat_a_budget_and_shape_a_design_run_serves():
    """A run serving two budgets (a WSD branch at the first), or a reference run trained on to other
    recipes' steps, already holds each (budget, shape) it serves: the edge runs a landed edge calls
    for add new shapes only, never a second run of the same model, tokens and seed."""
    points = _points("fp32", "mxfp4")
    design = design_lib.Design.from_table({**TABLE, "extend_edges": True, "reference": "fp32"})
    designed = design_lib.design_runs(points, design)
    assert any(len([b for b in c.study.flop_budgets if b]) == 2 for c in designed[1])  # a shape serving both
    extended = design_lib.extend_edges(points, designed, design, _landed(designed, lambda r, n: -n))
    for before, after in zip(designed, extended):
        served = [(b, c.model.size, c.model.n_layers) for c in after for b in c.study.flop_budgets if b]
        assert len(served) == len(set(served))
        largest = {b: max(sizes) for b, sizes in _shapes_by_budget(before).items()}
        assert _shapes_by_budget([c for c in after if c not in before]) == {b: {n + 1} for b, n in largest.items()}


@pytest.mark.slow
def test_the_reference_study_on_common_shapes_reuses_every_landed_run():
    """The lower budgets and the held-out budget (one sweep, two designs): every landed run is one the
    designs expand to, and at every budget every recipe has the same shapes."""
    rows = pd.read_csv(ROOT / "results" / "isoflop.csv")
    landed = rows[rows["sweep"] == "isoflop"]
    ids = set()
    for experiment in ("isoflop.toml", "isoflop_heldout.toml"):
        _, base, points, design = sweep.experiment_points(ROOT / "experiments" / experiment)
        assert design.shapes == "common"
        cfgs, vocab = [c for _, c in points], sweep._vocab(base)
        designed = design_lib.extend_edges(cfgs, design_lib.design_runs(cfgs, design, vocab), design, landed, vocab)
        ids |= {c.run_id for runs in designed for c in runs} | {c.run_id for c in design_lib.replicates(designed, design, landed)}
        for budget in design.budgets:
            sets = {frozenset((c.model.size, c.model.n_layers) for c in runs
                              if budget in c.study.flop_budgets) for runs in designed}
            assert len(sets) == 1
    assert set(landed["run_id"]) <= ids
    # one run per cell: a second run of the same model, tokens and seed would count as two observations
    cells = landed[landed["budget"] > 0].groupby(["recipe", "N", "seed", "budget"])["run_id"].nunique()
    assert cells.max() == 1


# --------------------------------------------------------------------------- before a sweep runs

def _experiment(tmp_path, isoflop: dict, precision=("fp32", "fp8"), **data):
    lines = ['name = "pre"', 'precision = "fp32"', "[model]", "seq_len = 64", "[data]", 'source = "stdlib"',
             "eval_tokens = 4096"] + [f'{k} = "{v}"' for k, v in data.items()] + [
             "[train]", "batch_size = 8", "lr = 1e-2", "warmup = 5", "[grid]", f"precision = {json.dumps(list(precision))}",
             "[isoflop]"] + [f"{k} = {json.dumps(v)}" for k, v in isoflop.items()]
    path = tmp_path / "pre.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_dry_run_warns_when_profiles_leave_no_degrees_of_freedom_for_noise(tmp_path):
    notes, warnings = design_checks.check(_experiment(tmp_path, {**TABLE, "sizes": [1, 2, 3]}))
    noise = [w for w in warnings if "degrees of freedom" in w]
    assert noise == [f"at {b:g}: 3 shapes x 1 seed leave no degrees of freedom for noise in a parabola (3 parameters) "
                     "for fp32, fp8: add shapes (isoflop.sizes_per_budget) or seeds (isoflop.replicates)"
                     for b in TABLE["budgets"]]
    _, warnings = design_checks.check(_experiment(tmp_path, {**TABLE, "sizes": [1, 2, 3], "replicates": [1]}))
    assert not [w for w in warnings if "degrees of freedom" in w]


def test_dry_run_warns_when_a_minimum_cannot_be_bracketed(tmp_path):
    """At these budgets 20 tokens per parameter needs a model below size 1: every window is clipped."""
    notes, warnings = design_checks.check(_experiment(tmp_path, {**TABLE, "budgets": [1e11, 4e11]}))
    edge = [w for w in warnings if "cannot be bracketed" in w]
    assert len(edge) == 4 and all("at the smallest shape" in w for w in edge)
    path = _experiment(tmp_path, {**TABLE, "budgets": [3e13]})
    notes, warnings = design_checks.check(path)
    assert not [w for w in warnings if "bracketed" in w]
    assert len(notes) == 2 and all("inside" in n for n in notes)


def test_dry_run_says_when_the_design_has_too_few_runs_for_any_p_star(tmp_path):
    """The rule the fit's P* follows (optimum_check.min_runs), not a number of its own: two recipes at
    one budget are fewer runs than the 19 kumar (6 free parameters) needs."""
    from scaling.study.analysis.pstar import optimum_check

    path = _experiment(tmp_path, {**TABLE, "budgets": [3e13]})
    _, warnings = design_checks.check(path)
    (few,) = [w for w in warnings if "too few for a P*" in w]
    kumar = optimum_check.min_runs("kumar", {"kappa": 3.0})
    assert kumar == 19 and optimum_check.too_few_runs_reason(kumar - 1, "kumar", {"kappa": 3.0})
    assert optimum_check.too_few_runs_reason(kumar, "kumar", {"kappa": 3.0}) is None
    assert few.startswith(f"{len(sweep.expand(path))} runs: too few for a P* from any law (kumar needs 19, ") and "sun needs 26" in few
    assert design_checks.pstar_warnings(kumar) == [] and design_checks.pstar_warnings(kumar - 3, replicates=3) == []


def test_dry_run_shows_where_flops_go_when_the_head_dominates(tmp_path):
    path = _experiment(tmp_path, {**TABLE, "sizes": [1, 2, 3, 4]}, precision=("bf16", "fp8"), tokenizer="bpe:4096")
    _, warnings = design_checks.check(path)
    flops = [w for w in warnings if w.startswith("FLOPs per token")]
    assert flops and flops[0].startswith("FLOPs per token at d_model 32 x 2 layers, vocab 4096: projections 16%, head 79%")
    assert "fp8 keeps in high precision" in flops[0]
    cfg = config.validate({"precision": "fp8", "model": {"size": 1}})
    shares = design_checks.flops_shares(cfg, 4096)
    assert shares["head"] > 0.75 and shares["unquantised"] >= shares["head"]
    assert design_checks.flops_shares(cfg, 256)["head"] < 0.2  # bytes: the head is small
    assert not design_checks.flops_warnings([config.validate({"precision": "bf16", "model": {"size": 1}})], 4096)


def test_dry_run_eta_comes_from_landed_take_off_probes(tmp_path):
    specs = sweep.expand(ROOT / "experiments" / "smoke_sweep.toml")
    keys = {sweep.shape_key(s.config) for s in specs}
    first = {}
    for s in specs:
        first.setdefault(sweep.shape_key(s.config), s)
    probe = takeoff._takeoff_spec(next(iter(first.values())))
    out = probe.out_dir(tmp_path / ".takeoff")
    out.mkdir(parents=True)
    (out / "summary.json").write_text(json.dumps({"status": "ok", "tokens_per_s": 1000.0}))
    seconds, timed, shapes = takeoff.eta_seconds(specs, tmp_path, flops_per_s=lambda: 1e12)
    assert (timed, shapes) == (1, len(keys))
    timed_specs = [s for s in specs if sweep.shape_key(s.config) == sweep.shape_key(probe.config)]
    rest = [s for s in specs if s not in timed_specs]
    # measured where a probe flew (each run's start and evaluations counted); estimated, with the
    # probes still to fly, elsewhere
    assert seconds == pytest.approx(1.15 * sum(s.config.train.tokens for s in timed_specs) / 1000.0
                                    + takeoff.RUN_START_SECONDS * len(timed_specs)
                                    + takeoff.estimate_seconds(rest, 1e12)
                                    + takeoff.COMPILE_SECONDS_PER_SHAPE * (len(keys) - 1))
    if len(keys) == 1:
        assert takeoff.eta_seconds(specs, tmp_path, flops_per_s=lambda: pytest.fail("measured"))[1] == 1


def test_the_estimate_counts_the_head_at_the_corpus_vocabulary(tmp_path):
    bytes_, bpe = (sweep.RunSpec("x", "s", config.validate({"model": {"size": 1}, "train": {"tokens": 10**6},
                                                            "data": {"source": "pysrc", "tokenizer": t}}))
                   for t in ("bytes", "bpe:4096"))
    assert takeoff.estimate_seconds([bpe], 1e9) > 2 * takeoff.estimate_seconds([bytes_], 1e9) - 2 * takeoff.RUN_START_SECONDS
