"""A new architecture is one module plus its registration (scaling.train.architectures):
examples/own_architecture.py registers a GELU-MLP transformer, and the harness trains it, counts its
parameters and FLOPs from its registration, and gives it run ids of its own; the default keeps
every existing run id; a name nobody registered is one clear error."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import jax
import pytest
from flax import nnx

from scaling.errors import ConfigError
from scaling.train import architectures, compute, config, ladder

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_architecture.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("own_architecture", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _param_sizes(cfg, recipe="fp8"):
    abstract = nnx.eval_shape(lambda: architectures.build(cfg, recipe, rngs=nnx.Rngs(0)))
    params = nnx.state(abstract, nnx.Param)
    return abstract, {jax.tree_util.keystr(p): v.shape for p, v in jax.tree_util.tree_leaves_with_path(params)}


@pytest.mark.parametrize("name", ["transformer", "gelu"])
def test_an_architectures_counts_are_its_own_parameters_and_flops(example, name):
    cfg = ladder.config_for_size(2, seq_len=32, architecture=name)
    abstract, shapes = _param_sizes(cfg)
    assert type(abstract).__name__ == {"transformer": "Transformer", "gelu": "GeluTransformer"}[name]
    sizes = {k: math.prod(s) for k, s in shapes.items()}
    embedding = sum(n for k, n in sizes.items() if "embed" in k or "head" in k)
    assert ladder.param_counts(cfg) == {"non_embedding": sum(sizes.values()) - embedding, "total": sum(sizes.values())}
    kernels = sorted(s for k, s in shapes.items() if "blocks" in k and "kernel" in k)  # stacked by layer
    assert kernels == sorted((cfg.n_layers, i, o) for i, o in ladder.projections(cfg))
    # the cost models' FLOPs by part add up to the architecture's FLOPs per token
    parts = compute.parts(cfg, "fp8", tokens_per_step=8 * cfg.seq_len)
    assert sum(p.flops for p in parts) == pytest.approx(ladder.flops_per_token(cfg), rel=1e-12)
    if name == "gelu":  # two 4·d matrices instead of three of 8/3·d (d_ff = 96 -> 4·64 = 256 wide)
        d = cfg.d_model
        assert ladder.param_counts(cfg)["non_embedding"] == cfg.n_layers * (4 * d * d + 8 * d * d + 2 * d) + d


@pytest.mark.slow
def test_a_registered_architecture_trains_under_the_harness_with_run_ids_of_its_own(example, tmp_path):
    base = example.config("transformer", tokens=8 * 64 * 6)
    gelu = example.config("gelu", tokens=8 * 64 * 6)
    for cfg in (base, gelu):
        cfg["precision"], cfg["train"]["batch_size"] = "mxfp4", 8
    # the default architecture, written out or not, is the run every earlier id names
    implicit = json.loads(json.dumps(base))
    del implicit["model"]["architecture"]
    assert config.validate(base).run_id == config.validate(implicit).run_id
    assert "architecture" not in config.canonical_form(config.validate(base))["model"]
    assert config.validate(gelu).run_id != config.validate(base).run_id
    summary = example.run(gelu, tmp_path / "gelu", echo=lambda line: None)
    assert summary["status"] == "ok" and summary["architecture"] == "gelu"
    shape = ladder.config_for_size(1, seq_len=64, architecture="gelu")
    assert summary["N"] == ladder.param_counts(shape)["non_embedding"]
    assert summary["flops_per_token"] == ladder.flops_per_token(shape)
    assert math.isfinite(summary["val_loss"]) and summary["val_loss"] < math.log(256)
    assert summary["telemetry"]["weight"]["amax"] > 0  # the recipe quantised its projections


def test_an_unregistered_architecture_is_one_clear_error():
    cfg = {"name": "x", "precision": "fp32", "model": {"size": 1, "architecture": "mamba"}}
    with pytest.raises(ConfigError) as err:
        config.validate(cfg)
    message = str(err.value)
    assert "model.architecture" in message and "mamba" in message and "transformer" in message
    assert "\n" not in message
    with pytest.raises(ConfigError, match="not yet registered"):
        architectures.register("transformer", build=lambda *a, **k: None, projections=lambda cfg: [])
    with pytest.raises(ConfigError, match="architecture.x.projections"):
        architectures.register("x", build=lambda *a, **k: None, projections=None)
    assert "x" not in architectures.names()


BROKEN = '''from scaling.train import architectures


def projections(cfg):
    return [(cfg.d_model, cfg.d_model // 0)]


def build(cfg, recipe, *, rngs):
    return cfg.no_such_field


architectures.register("broken", build=build, projections=projections)
'''


def test_an_error_in_a_registered_architecture_is_one_line_naming_its_file_and_line(tmp_path, monkeypatch):
    """The user's own projections or build raising: one ConfigError line, `architecture.NAME.KEY:
    FILE:LINE: Type: message` (was: a traceback out of the ladder's or the step's depths)."""
    monkeypatch.setattr(architectures, "_REGISTRY", dict(architectures._REGISTRY))
    own = tmp_path / "broken_arch.py"
    own.write_text(BROKEN)
    spec = importlib.util.spec_from_file_location("broken_arch", own)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    shape = architectures.ModelConfig(**{**vars(ladder.config_for_size(1, seq_len=64)), "architecture": "broken"})
    with pytest.raises(ConfigError) as err:
        ladder.param_counts(shape)
    assert str(err.value) == f"architecture.broken.projections: {own}:5: ZeroDivisionError: integer division or modulo by zero"
    with pytest.raises(ConfigError) as err:
        architectures.build(shape, "fp32", rngs=None)
    assert str(err.value).startswith(f"architecture.broken.build: {own}:9: AttributeError: ")
    assert "\n" not in str(err.value)
    # a registered module path that does not import: one line too
    monkeypatch.setitem(architectures._REGISTRY, "broken",
                        architectures.Architecture("broken", "no_such_module_here:Model", *list(vars(architectures.get("broken")).values())[2:]))
    with pytest.raises(ConfigError, match="architecture.broken.build: .*ModuleNotFoundError: No module named 'no_such_module_here'"):
        architectures.build(shape, "fp32", rngs=None)
