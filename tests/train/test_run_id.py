"""Run ids: the canonical form they hash is explicit and versioned, every committed result keeps its
id, and a recipe file enters by what it says."""

import copy
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from scaling.errors import ConfigError
from scaling.study.sweeps import design as design_lib, sweep
from scaling.train import architectures, config, runs

ROOT = Path(__file__).resolve().parents[2]


def _expanded_ids(experiment: str, landed: pd.DataFrame) -> set[str]:
    """The run ids an experiment expands to, with the edge and replicate runs that its landed rows call
    for (as `scaling sweep` adds them from the results it finds)."""
    path = ROOT / "experiments" / f"{experiment}.toml"
    ids = {spec.run_id for spec in sweep.expand(path)}
    table = sweep.load_experiment(path)
    if "isoflop" in table:
        design = design_lib.Design.from_table(table["isoflop"])
        base = {k: v for k, v in table.items() if k not in sweep.EXPERIMENT_KEYS}
        points = []
        for point in sweep.grid_points(table):
            cfg = copy.deepcopy(base)
            for key, value in point.items():
                config.set_dotted(cfg, key, value)
            points.append(cfg)
        vocab = sweep._vocab(base)
        designed = design_lib.extend_edges(points, design_lib.design_runs(points, design, vocab), design, landed, vocab)
        ids |= {c.run_id for cfgs in designed for c in cfgs}
        ids |= {c.run_id for c in design_lib.replicates(designed, design, landed)}
    return ids


def _merged(experiment: str, landed: pd.DataFrame) -> bool:
    """Whether an experiment's runs are in the results: an IsoFLOP design none of whose budgets they
    hold (the held-out budget, training into a summary of its own until `scaling merge`) is not."""
    budgets = sweep.load_experiment(ROOT / "experiments" / f"{experiment}.toml").get("isoflop", {}).get("budgets")
    held = pd.to_numeric(landed.get("budget", pd.Series(dtype=float)), errors="coerce").dropna().to_numpy()
    return not budgets or any(abs(held - b).min(initial=math.inf) <= 1e-6 * b for b in budgets)


@pytest.mark.parametrize("results, experiments", [
    ("isoflop", ("isoflop", "isoflop_heldout")), ("isoflop", ("granularity",)), ("isoflop", ("outliers",)),
    ("quick", ("quick",)), ("lr_probe", ("lr_probe",)), ("lr_precision", ("lr_precision",)),
])
def test_committed_results_keep_their_run_ids(results, experiments):
    """Every committed run is a run its experiments (one sweep) expand to today, and every run they
    expand to has landed (the reference study's lower budgets included, now that every recipe's
    common shapes have; the held-out budget once merged)."""
    rows = pd.read_csv(ROOT / "results" / f"{results}.csv")
    landed = rows[rows["sweep"] == sweep.load_experiment(ROOT / "experiments" / f"{experiments[0]}.toml")["name"]]
    assert len(landed) > 0
    merged = [e for e in experiments if _merged(e, landed)]
    assert merged[:1] == [experiments[0]]
    assert set(landed["run_id"]) == set().union(*(_expanded_ids(e, landed) for e in merged))


@pytest.mark.parametrize("cfg, run_id", [
    (config.load(ROOT / "experiments" / "smoke.toml"), "c2198edb8f83"),
    ({"name": "x", "train": {"lr": 1e-3}}, "5575666bdbe5"),
    ({"name": "x", "train": {"lr": 1e-3}, "study": {"cost": "nominal"}}, "5575666bdbe5"),  # cost labels nothing alone
    ({"name": "x", "train": {"lr": 1e-3, "tracker": ["tensorboard"]}}, "fb091b5b8266"),
    ({"name": "t", "precision": {"name": "mxfp4-weights", "base": "bf16",
                                 "weight": {"format": "fp4_e2m1", "granularity": "mx"}}}, "4a466afff54b"),
    ({"name": "x", "data": {"source": "pysrc", "tokenizer": "bpe:4096"}}, "342b43237d01"),
    ({"model": {"size": 2, "n_layers": 4}, "train": {"schedule": "cosine", "lr": "auto", "warmup": 10}}, "6509ce121d6a"),
    ({"name": "d", "precision": "fp8", "train": {"tokens": 409600, "eval_at": [0.5, 1.0]},
      "study": {"flop_budgets": [1e11, 2e11], "cost": "nominal"}}, "0a43ab829aba"),
])
def test_hand_written_configs_keep_their_run_ids(cfg, run_id):
    """Literal ids computed before the canonical form was written down (each pins one of its rules)."""
    assert config.run_id(cfg) == run_id


# One value other than the default for every key: a key added to the schema must be placed in the
# canonical form (and listed here) before this test passes.
CHANGED = {
    "name": "other", "precision": "fp8", "seed": 1,
    "model.size": 2, "model.seq_len": 64, "model.smooth_swiglu": True, "model.n_layers": 3,
    "model.architecture": "transformer-variant",
    "data.source": "synthetic", "data.tokenizer": "bpe:4096", "data.eval_tokens": 4096,
    "data.fingerprint": "0123456789ab", "train.tokens": 1_000_000, "train.batch_size": 16, "train.lr": 1e-3, "train.weight_decay": 0.0,
    "train.warmup": 10, "train.schedule": "cosine", "train.decay": 0.5, "train.eval_at": [0.5, 1.0],
    "train.grad_clip": 0.0, "train.log_every": 5, "train.checkpoint_every": 0, "train.tracker": ["tensorboard"],
    "health.spike_factor": 5.0, "health.spike_window": 20, "health.max_saturation": 0.1,
    "study.flop_budgets": [1e11, 2e11, 4e11], "study.cost": "nominal",
    "parallel.data": 2, "parallel.fsdp": True,
}
NEEDS = {"data.tokenizer": {"data.source": "stdlib"}, "train.schedule": {"train.eval_at": [1.0]},
         "study.cost": {"study.flop_budgets": [1e11, 2e11, 4e11]}}  # what a changed value needs to be valid


# Checks, not settings of the experiment: the run is the same, only where it may train is narrowed.
# The device layout: float32 summation order only, no per-device granularity (docs/training.md).
NOT_HASHED = {"data.fingerprint", "parallel.data", "parallel.fsdp"}


def test_every_key_enters_the_run_id():
    if "transformer-variant" not in architectures.names():  # the transformer under another name
        architectures.register("transformer-variant", build="scaling.train.model:Transformer",
                               projections=architectures.transformer_projections)
    assert list(CHANGED) == list(config.settings())
    for key, value in CHANGED.items():
        base = {}
        for k, v in NEEDS.get(key, {}).items():
            config.set_dotted(base, k, v)
        changed = copy.deepcopy(base)
        config.set_dotted(changed, key, value)
        assert (config.run_id(changed) == config.run_id(base)) == (key in NOT_HASHED), key


def test_the_canonical_form_is_version_1_under_the_names_ids_were_made_with():
    cfg = config.validate({"train": {"eval_at": [0.5, 1.0]}, "study": {"flop_budgets": [1e11, 2e11]},
                           "model": {"n_layers": 2}})  # size 1's own depth: unset
    form = config.canonical_form(cfg)
    assert config.RUN_ID_VERSION == 1
    assert form["train"]["budgets"] == [0.5, 1.0] and "eval_at" not in form["train"]
    assert form["study"] == {"budgets": [1e11, 2e11], "cost": "bits"} and form["train"]["eval_every"] == 0
    assert "n_layers" not in form["model"] and "tokenizer" not in form["data"] and "tracker" not in form["train"]
    assert json.loads(json.dumps(form)) == form  # plain JSON: what is hashed is what is written


RECIPE = '[precision]\nname = "mine"\nweight = "fp8_e4m3"\nactivation = "fp8_e4m3"\ngrad = "fp8_e5m2"\n'
RECIPE_TABLE = {"name": "mine", "weight": "fp8_e4m3", "activation": "fp8_e4m3", "grad": "fp8_e5m2"}


def test_a_recipe_file_enters_the_id_by_its_contents(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(RECIPE)
    from_file = config.validate({"precision": str(path)})
    assert from_file.precision == RECIPE_TABLE  # the config holds what the file said
    assert from_file.run_id == config.run_id({"precision": RECIPE_TABLE})  # inline or in a file: one run
    path.write_text(RECIPE.replace('grad = "fp8_e5m2"', 'grad = "fp8_e4m3"'))
    edited = config.validate({"precision": str(path)})
    assert edited.run_id != from_file.run_id and edited != from_file and edited.recipe.grad.format == "fp8_e4m3"


def test_a_recipe_files_base_file_enters_by_its_contents_too(tmp_path):
    base, derived = tmp_path / "base.toml", tmp_path / "derived.toml"
    base.write_text(RECIPE)
    derived.write_text(f'[precision]\nname = "derived"\nbase = "{base}"\nforward_only = true\n')
    before = config.validate({"precision": str(derived)})
    assert before.precision["base"] == RECIPE_TABLE and before.recipe.weight.format == "fp8_e4m3"
    base.write_text(RECIPE.replace('weight = "fp8_e4m3"', 'weight = "int8"'))
    assert config.run_id({"precision": str(derived)}) != before.run_id
    derived.write_text(f'[precision]\nbase = "{derived}"\n')
    with pytest.raises(ConfigError, match=r"^precision\.base: got .*derived\.toml'; allowed: a recipe file that does not name itself$"):
        config.validate({"precision": str(derived)})
    with pytest.raises(ConfigError, match=r"^precision: got .*missing\.toml'; allowed: a readable TOML recipe file"):
        config.validate({"precision": str(tmp_path / "missing.toml")})


def test_a_run_directory_of_the_recipe_before_an_edit_is_not_the_edited_run(tmp_path):
    """`scaling train CONFIG --out DIR` after editing the recipe file: DIR holds another run."""
    path, run_dir = tmp_path / "mine.toml", tmp_path / "run"
    path.write_text(RECIPE)
    cfg = config.validate({"precision": str(path)})
    runs.begin(run_dir, cfg)
    runs.land(run_dir, {"status": "ok"})
    assert runs.finished(run_dir, config.validate({"precision": str(path)})) == {"status": "ok"}
    path.write_text(RECIPE.replace('grad = "fp8_e5m2"', 'grad = "fp8_e4m3"'))
    with pytest.raises(ConfigError, match=r"^--out: "):
        runs.finished(run_dir, config.validate({"precision": str(path)}))


def test_config_json_of_earlier_versions_reads_in_todays_keys(tmp_path):
    cfg = config.validate({"train": {"eval_at": [0.5, 1.0]}, "study": {"flop_budgets": [1e11, 2e11]}})
    stored = cfg.to_dict()
    stored["train"]["budgets"] = stored["train"].pop("eval_at")
    stored["study"]["budgets"] = stored["study"].pop("flop_budgets")
    stored["train"]["eval_every"] = 0
    assert config.validate(config.upgrade(stored)) == cfg
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(stored))
    (run_dir / "summary.json").write_text('{"status": "ok"}')
    assert runs.finished(run_dir, cfg) == {"status": "ok"}
    # a stored recipe file path cannot say what the file said when the run began: not this run
    with pytest.raises(ConfigError, match=r"^precision: got 'r\.toml'; allowed: a recipe table"):
        config.upgrade({**stored, "precision": "r.toml"})


def test_the_old_key_names_in_a_file_say_the_new_ones():
    with pytest.raises(ConfigError, match=r"^train\.budgets: got \[0\.5, 1\.0\]; allowed: .*train\.eval_at"):
        config.validate({"train": {"budgets": [0.5, 1.0]}})
    with pytest.raises(ConfigError, match=r"^study\.budgets: got \[\]; allowed: .*study\.flop_budgets"):
        config.validate({"study": {"budgets": []}})
