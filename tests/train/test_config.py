import json
from pathlib import Path

import pytest

from scaling import cli
from scaling.train import config, ladder
from scaling.errors import ConfigError


def test_defaults_are_filled_into_a_frozen_typed_config():
    import dataclasses

    cfg = config.validate({"name": "x", "train": {"lr": 1e-3}})
    assert cfg.train.lr == 1e-3 and cfg.train.batch_size == 32 and cfg.tokens_per_step == 32 * 128
    assert cfg.train.eval_at == (0.25, 0.5, 1.0) and cfg.precision == "fp32" and cfg.recipe.name == "fp32"
    assert cfg.model == config.Model(size=1, seq_len=128, smooth_swiglu=False, n_layers=None)
    assert config.validate(cfg) is cfg  # validated once: a RunConfig is not checked again
    assert config.validate(cfg.to_dict()) == cfg and cfg.to_dict()["train"]["eval_at"] == [0.25, 0.5, 1.0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.lr = 1.0
    assert cfg.replace(**{"train.lr": 2e-3}).train.lr == 2e-3 and cfg.train.lr == 1e-3
    with pytest.raises(ConfigError, match="train.lr"):
        cfg.replace(**{"train.lr": -1})
    # cosine runs cannot branch: their default evaluation is the end only
    assert config.validate({"train": {"schedule": "cosine"}}).train.eval_at == (1.0,)


def test_run_id_hashes_the_resolved_config():
    short = {"name": "x", "train": {"lr": 1e-3}}
    explicit = config.validate(short)
    assert config.run_id(short) == config.run_id(explicit)
    assert len(config.run_id(short)) == 12 and int(config.run_id(short), 16) >= 0
    assert config.run_id({"name": "x", "train": {"lr": 2e-3}}) != config.run_id(short)
    # integral floats from the command line (2e6) resolve to the same config as integers
    assert config.run_id({"train": {"tokens": 2e6}}) == config.run_id({"train": {"tokens": 2_000_000}})
    # [study] labels came later: a run outside a design keeps the id it had before them
    assert config.run_id(short) == config.run_id({**short, "study": {"flop_budgets": []}})
    labelled = {**short, "study": {"flop_budgets": [1e12, 2e12, 4e12]}}
    assert config.run_id(labelled) != config.run_id(short)


def test_data_tokenizer_leaves_byte_level_run_ids_alone():
    short = {"name": "x", "train": {"lr": 1e-3}}
    assert config.validate(short).data.tokenizer == "bytes"
    assert config.run_id(short) == config.run_id({**short, "data": {"tokenizer": "bytes"}})
    bpe = config.run_id({**short, "data": {"tokenizer": "bpe:4096"}})
    assert bpe != config.run_id(short) and bpe == config.run_id({**short, "data": {"tokenizer": "bpe:04096"}})
    assert config.validate({"data": {"source": "pysrc", "tokenizer": "bpe:4096"}}).data.source == "pysrc"
    with pytest.raises(ConfigError) as err:  # a BPE needs text
        config.validate({"data": {"source": "synthetic", "tokenizer": "bpe:4096"}})
    assert err.value.key == "data.tokenizer" and "synthetic" in str(err.value) and "\n" not in str(err.value)


def test_auto_learning_rate_is_the_ladder_rate_resolved_into_the_config():
    rates = [config.validate({"model": {"size": s}, "train": {"lr": "auto"}}).train.lr for s in (1, 2, 4, 5)]
    assert rates == [ladder.ladder_lr(s) for s in (1, 2, 4, 5)]
    assert rates[0] == pytest.approx(1.6e-2) and rates[2] == pytest.approx(1.6e-2 / 4**1.2)
    assert rates == sorted(rates, reverse=True)  # wider models take smaller steps
    # the id hashes the number, so "auto" and the rate it resolves to are the same run
    auto = {"model": {"size": 4}, "train": {"lr": "auto"}}
    assert config.run_id(auto) == config.run_id({"model": {"size": 4}, "train": {"lr": rates[2]}})
    with pytest.raises(ConfigError, match='train.lr: got \'fast\'.*"auto"'):
        config.validate({"train": {"lr": "fast"}})


@pytest.mark.parametrize("override, key, allowed", [
    ("train.lr=-1", "train.lr", "a number > 0"),
    ("train.lrr=0.1", "train.lrr", "one of the [train] keys"),
    ("colour=1", "colour", "one of the top-level keys"),
    ("model.size=0", "model.size", "an integer >= 1"),
    ("model.size=1.5", "model.size", "an integer >= 1"),
    ("model.smooth_swiglu=1", "model.smooth_swiglu", "true or false"),
    ("train.schedule=linear", "train.schedule", "one of wsd, cosine"),
    ("train.eval_at=[0.5, 0.25, 1.0]", "train.eval_at", "ascending"),
    ("train.eval_at=[0.25, 0.5]", "train.eval_at", "ending with 1.0"),
    ("train.warmup=1.5", "train.warmup", "a whole number of steps"),
    ("train.warmup=-0.1", "train.warmup", "a fraction of the steps in [0, 1)"),
    ("train.warmup=1000", "train.warmup", "fewer steps than the run's 488"),
    ("study.flop_budgets=[1e12]", "study.flop_budgets", "one budget per train.eval_at entry (3)"),
    ("study.flop_budgets=[3e12, 1e12, 2e12]", "study.flop_budgets", "ascending"),
    ("study.cost=tpu", "study.cost", "one of bits, nominal"),
    ("train.tokens=100", "train.tokens", "at least batch_size x seq_len = 4096"),
    ("seed=-1", "seed", "an integer >= 0"),
    ("data.source=/no/such/path", "data.source", "existing file or directory"),
    ("data.tokenizer=bpe:256", "data.tokenizer", "an integer from 257 to 65536"),
    ("data.tokenizer=bpe:65537", "data.tokenizer", "an integer from 257 to 65536"),
    ("data.tokenizer=sentencepiece", "data.tokenizer", '"bytes", or "bpe:VOCAB"'),
    ("data.tokenizer=4096", "data.tokenizer", '"bytes", or "bpe:VOCAB"'),
    ("precision=fp5", "precision", "a preset"),
    ("health.spike_factor=1", "health.spike_factor", "> 1"),
    ('train.tracker=["mlflow"]', "train.tracker", "from tensorboard, wandb"),
    ("train.tracker=tensorboard", "train.tracker", "a list"),
    ('train.tracker=["tensorboard", "tensorboard"]', "train.tracker", "distinct"),
    ("parallel.data=0", "parallel.data", "an integer >= 1"),
    ("parallel.data=3", "parallel.data", "a divisor of train.batch_size = 32"),
    ("parallel.fsdp=1", "parallel.fsdp", "true or false"),
])
def test_bad_values_name_key_value_and_what_is_allowed(override, key, allowed):
    with pytest.raises(ConfigError) as err:
        config.validate(config.apply_overrides({}, [override]))
    assert err.value.key == key
    assert str(err.value).startswith(f"{key}: got ")
    assert allowed in err.value.allowed


def test_cosine_with_branch_evaluations_is_refused():
    with pytest.raises(ConfigError, match="train.eval_at.*cosine"):
        config.validate({"train": {"schedule": "cosine", "eval_at": [0.5, 1.0]}})


def test_evaluations_must_fall_on_distinct_steps():
    # 4096 tokens per step, 10 steps: 0.01 and 0.02 both round to 0 steps
    with pytest.raises(ConfigError, match="distinct step counts"):
        config.validate({"train": {"tokens": 40960, "eval_at": [0.01, 0.02, 1.0]}})


def test_override_values_use_toml_syntax_with_string_fallback():
    assert config.parse_value("3e-3") == 0.003
    assert config.parse_value("2_000") == 2000
    assert config.parse_value("true") is True
    assert config.parse_value("[0.5, 1.0]") == [0.5, 1.0]
    assert config.parse_value('"fp8"') == "fp8"
    assert config.parse_value("fp4") == "fp4"
    assert config.parse_value("/data/corpus") == "/data/corpus"
    cfg = config.apply_overrides({"train": {"lr": 1.0}}, ["train.lr=0.5", "precision=fp4", "model.size=2"])
    assert cfg == {"train": {"lr": 0.5}, "precision": "fp4", "model": {"size": 2}}
    with pytest.raises(ConfigError, match="--set"):
        config.apply_overrides({}, ["train.lr"])
    with pytest.raises(ConfigError, match="parent 'precision' is a table"):
        config.apply_overrides({"precision": "fp8"}, ["precision.weight=fp4"])


def test_load_reads_toml_and_applies_overrides(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('name = "t"\nprecision = "fp8"\n[train]\nlr = 1e-3\nbatch_size = 8\n')
    cfg = config.validate(config.load(path, ["train.batch_size=4"]))
    assert (cfg.name, cfg.precision, cfg.train.lr, cfg.train.batch_size) == ("t", "fp8", 1e-3, 4)
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(ConfigError, match="valid TOML"):
        config.load(bad)
    with pytest.raises(ConfigError, match="existing TOML file"):
        config.load(tmp_path / "missing.toml")


def test_precision_table_is_accepted_and_checked():
    table = {"base": "fp8", "grad": {"format": "fp8_e5m2", "granularity": "channel"}}
    assert config.validate({"precision": table}).precision == table
    with pytest.raises(ConfigError, match="precision.weight.format"):
        config.validate({"precision": {"weight": {"format": "fp9_e9m9"}}})


def test_cli_bad_value_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_text('name = "t"\n[data]\nsource = "synthetic"\n')
    out = tmp_path / "run"
    code = cli.main(["train", str(path), "--set", "train.lr=-1", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert err == 'error: train.lr: got -1; allowed: a number > 0, or "auto" (the tuned rate for model.size)\n'
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.toml"]


def test_config_json_of_a_run_round_trips():
    cfg = config.validate({"precision": {"base": "fp8", "name": "mine"}})
    assert config.validate(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_shipped_smoke_config_is_valid_and_small():
    cfg = config.validate(config.load(Path(__file__).resolve().parents[2] / "experiments" / "smoke.toml"))
    assert cfg.data.source == "stdlib" and cfg.model.size == 1 and cfg.steps == 400


def test_recipe_file_is_hashed_by_content_not_path(tmp_path):
    recipe = '[precision]\nname = "mine"\nweight = "fp8_e4m3"\nactivation = "fp8_e4m3"\ngrad = "fp8_e5m2"\n'
    a, b = tmp_path / "a.toml", tmp_path / "sub" / "b.toml"
    b.parent.mkdir()
    a.write_text(recipe)
    b.write_text(recipe)
    assert config.run_id({"precision": str(a)}) == config.run_id({"precision": str(b)})
    b.write_text(recipe.replace('grad = "fp8_e5m2"', 'grad = "fp8_e4m3"'))
    assert config.run_id({"precision": str(a)}) != config.run_id({"precision": str(b)})


def test_existing_run_ids_are_unchanged_by_the_tracker_key():
    """Ids computed before train.tracker existed (pinned literals): a run without a tracker keeps
    its id, so finished runs are still found; naming a tracker gives a new run."""
    smoke = config.load(Path(__file__).resolve().parents[2] / "experiments" / "smoke.toml")
    assert config.run_id(smoke) == "c2198edb8f83"
    assert config.run_id({"name": "x", "train": {"lr": 1e-3}}) == "5575666bdbe5"
    assert config.run_id({"name": "x", "train": {"lr": 1e-3, "tracker": []}}) == "5575666bdbe5"
    assert config.run_id({"name": "x", "train": {"lr": 1e-3, "tracker": ["tensorboard"]}}) != "5575666bdbe5"
    assert config.validate({}).train.tracker == ()
    # the pinned ids hashed train.eval_every = 0, a knob since removed: they still hold, and the key is refused
    with pytest.raises(ConfigError, match="train.eval_every"):
        config.validate({"train": {"eval_every": 0}})


def test_n_layers_sets_the_depth_at_the_sizes_width_and_leaves_ladder_ids_alone():
    deep = config.validate({"model": {"size": 1, "n_layers": 4}})
    assert (deep.model.shape().d_model, deep.model.shape().n_layers) == (32, 4)
    assert config.validate({"model": {"size": 3}}).model.shape().n_layers == 2 + 3 // 2
    assert config.validate({"model": {"size": 1, "n_layers": 4}, "train": {"lr": "auto"}}).train.lr == ladder.ladder_lr(1)
    # unset is the ladder's depth and the id it always had (pinned above); set, another run
    assert config.run_id({"name": "x", "train": {"lr": 1e-3}, "model": {"n_layers": None}}) == "5575666bdbe5"
    assert config.run_id({"name": "x", "train": {"lr": 1e-3}, "model": {"n_layers": 2}}) == "5575666bdbe5"
    assert config.run_id({"name": "x", "train": {"lr": 1e-3}, "model": {"n_layers": 3}}) != "5575666bdbe5"
    with pytest.raises(ConfigError, match=r"^model\.n_layers: got 0; allowed: an integer >= 1$"):
        config.validate({"model": {"n_layers": 0}})


def test_wandb_tracker_needs_the_package(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"train.tracker: got \['wandb'\]; allowed: .*wandb is not \(pip install wandb\)"):
        config.validate({"train": {"tracker": ["wandb"]}})
    assert config.validate({"train": {"tracker": ["tensorboard"]}}).train.tracker == ("tensorboard",)


def test_docs_hold_the_reference_table_of_every_key():
    """docs/training.md's key table is the schema's (regenerate: scaling.train.config.reference_table())."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text()
    start = doc.index("<!-- config-reference")
    start = doc.index("\n", start) + 1
    assert doc[start:doc.index("<!-- end config-reference -->")] == config.reference_table()
    table = config.reference_table().splitlines()[2:]
    assert [row.split(" | ")[0].strip("| `") for row in table] == list(config.settings())
    for row, setting in zip(table, config.settings().values()):
        assert all(cell.strip() for cell in row.strip("|").split(" | ")) and setting.meaning and setting.allowed


def test_each_key_is_declared_once_with_its_default_and_check():
    """The schema is read from the dataclasses: a default there is the default validate fills."""
    import dataclasses

    resolved = config.validate({}).to_dict()
    for key, setting in config.settings().items():
        section, _, name = key.rpartition(".")
        cls = config.SECTIONS[section] if section else config.RunConfig
        declared = {f.name: f for f in dataclasses.fields(cls)}[name]
        assert declared.default == setting.default
        if key != "train.eval_at":  # unset resolves per schedule
            value = resolved[section][name] if section else resolved[name]
            assert value == (list(setting.default) if isinstance(setting.default, tuple) else setting.default), key


def test_parallel_keys_are_a_layout_not_part_of_the_run_id():
    """[parallel] splits one global computation over devices (scaling.train.parallel): the device
    count and FSDP leave the run id alone, so a run resumed on another device count is the same run."""
    base = {"name": "x", "train": {"lr": 1e-3}}
    assert config.validate(base).parallel.data == 1 and config.validate(base).parallel.fsdp is False
    for layout in ({"data": 8}, {"data": 4, "fsdp": True}, {"data": 32, "fsdp": False}):
        cfg = config.validate({**base, "parallel": layout})
        assert cfg.run_id == "5575666bdbe5"  # the pinned id of this config above
        assert cfg.to_dict()["parallel"] == {"fsdp": False, **layout}
    assert "parallel" not in config.canonical_form(config.validate({**base, "parallel": {"data": 8}}))
    with pytest.raises(ConfigError, match="parallel.data: got 8; allowed: a divisor of train.batch_size = 12"):
        config.validate({"train": {"batch_size": 12}, "parallel": {"data": 8}})
