"""Precision recipes (scaling.numerics.precision): presets, parsing, errors, bits."""

from __future__ import annotations

import glob
import os
import tomllib

import pytest

from scaling.numerics import precision
from scaling.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_preset_bits_and_roles():
    expect = {"fp32": (32, 32, 32), "bf16": (16, 16, 16), "fp16": (16, 16, 16), "fp8": (8, 8, 8),
              "fp8-delayed": (8, 8, 8), "fp8-blockwise": (8, 8, 8), "mxfp8": (8, 8, 8), "mxfp6": (6, 6, 6),
              "mxfp4": (4, 4, 4), "nvfp4": (4, 4, 4), "fp6": (6, 6, 6), "fp4": (4, 4, 4), "int4": (4, 4, 4),
              "e3m4": (8, 8, 8)}
    for name, (p, pw, pg) in expect.items():
        r = precision.get(name)
        assert (r.bits, r.bits_w, r.bits_g) == (p, pw, pg), name
    fp8 = precision.get("fp8")
    assert (fp8.weight.format, fp8.activation.format, fp8.grad.format) == ("fp8_e4m3", "fp8_e4m3", "fp8_e5m2")
    bw = precision.get("fp8-blockwise")
    assert (bw.weight.granularity, bw.weight.block, bw.activation.granularity, bw.activation.block) == ("block2d", 128, "block", 128)
    assert precision.get("fp8-delayed").grad.scaling == "delayed"
    mixed = precision.get({"weight": "fp4_e2m1", "activation": "fp8_e4m3"})
    assert (mixed.bits, mixed.bits_w, mixed.bits_a, mixed.bits_g) == (8, 4, 8, 32)


@pytest.mark.parametrize("value, key", [
    ("fp7", "precision"),
    ({"wieght": "fp8_e4m3"}, "precision.wieght"),
    ({"weight": {"format": "fp8_e4m3", "granularity": "rows"}}, "precision.weight.granularity"),
    ({"weight": {"format": "e9m2"}}, "precision.weight.format"),
    ({"grad": {"format": "fp8_e5m2", "scaling": "delayed", "granularity": "mx"}}, "precision.grad.scaling"),
    ({"activation": {"format": "fp8_e4m3", "axis": 0}}, "precision.activation.axis"),
    ({"forward_only": "yes"}, "precision.forward_only"),
    ({"base": "fp9"}, "precision.base"),
    ({"attention": {"format": "fp8_e4m3", "scaling": "delayed"}}, "precision.attention.scaling"),
])
def test_recipe_errors_name_the_key(value, key):
    with pytest.raises(ConfigError) as e:
        precision.get(value)
    assert e.value.key == key
    assert "\n" not in str(e.value) and str(e.value).startswith(key + ": got ")


def test_recipe_from_mapping_overrides_a_base():
    r = precision.get({"base": "fp8", "forward_only": True, "grad": "none"})
    assert r.forward_only and r.grad is None and r.weight == precision.get("fp8").weight
    assert r.name == "fp8-custom"


def test_example_recipe_files_load():
    paths = sorted(glob.glob(os.path.join(ROOT, "experiments", "recipes", "*.toml")))
    assert len(paths) >= 3
    for path in paths:
        with open(path, "rb") as f:
            table = tomllib.load(f)["precision"]
        r = precision.get(path)
        assert r == precision.get(table)
        assert r.name == table["name"]
        assert r.bits <= 32
    # the documented examples of the rarer scale options carry them into every role
    nvidia = precision.get(os.path.join(ROOT, "experiments", "recipes", "mxfp8-nvidia.toml"))
    assert {s.scale_rounding for s in (nvidia.weight, nvidia.activation, nvidia.grad)} == {"ceil"}
    ue8m0 = precision.get(os.path.join(ROOT, "experiments", "recipes", "fp8-blockwise-ue8m0.toml"))
    assert all(s.pow2_scale for s in (ue8m0.weight, ue8m0.activation, ue8m0.grad))


# ---------------------------------------------------------------------------------------------
# The preset registry
# ---------------------------------------------------------------------------------------------


def _frozen_presets() -> dict:
    """Every built-in preset as it was written before the registry (the `_preset` if-chain),
    spelled out field by field: the registry must build exactly these (run ids hash them)."""
    from scaling.numerics.quant import QuantSpec as Q
    from scaling.numerics.transforms import GemmHadamard, Hadamard
    R = precision.Recipe

    def uniform(name, fwd, grad, gran, grad_rounding="nearest", **kw):
        return R(name=name, weight=Q(fwd, gran, **kw), activation=Q(fwd, gran, **kw),
                 grad=Q(grad, gran, rounding=grad_rounding, **kw))

    quartet = R(name="quartet", weight=Q("fp4_e2m1", "mx", scale_from="rms"),
                activation=Q("fp4_e2m1", "mx", scale_from="rms"),
                grad=Q("fp4_e2m1", "mx", rounding="stochastic", scale_rounding="ceil"),
                hadamard=GemmHadamard(fprop=Hadamard(32, signs="fixed"), dgrad=Hadamard(32), wgrad=Hadamard(32)))
    return {
        "fp32": R(name="fp32"),
        "tf32": R(name="tf32", dot_precision="tf32"),
        "bf16": R(name="bf16", weight=Q("bf16", "none"), activation=Q("bf16", "none"), grad=Q("bf16", "none")),
        "fp16": R(name="fp16", weight=Q("fp16", "none"), activation=Q("fp16", "none"), grad=Q("fp16", "tensor")),
        "fp8": uniform("fp8", "fp8_e4m3", "fp8_e5m2", "tensor"),
        "fp8-delayed": uniform("fp8-delayed", "fp8_e4m3", "fp8_e5m2", "tensor", scaling="delayed", amax_history=16),
        "fp8-blockwise": R(name="fp8-blockwise", weight=Q("fp8_e4m3", "block2d", block=128),
                           activation=Q("fp8_e4m3", "block", block=128), grad=Q("fp8_e4m3", "block", block=128)),
        "mxfp8": uniform("mxfp8", "fp8_e4m3", "fp8_e5m2", "mx"),
        "mxfp6": uniform("mxfp6", "fp6_e2m3", "fp6_e3m2", "mx"),
        "mxfp4": uniform("mxfp4", "fp4_e2m1", "fp4_e2m1", "mx", "stochastic"),
        "nvfp4": uniform("nvfp4", "fp4_e2m1", "fp4_e2m1", "nvfp4", "stochastic"),
        "fp6": uniform("fp6", "fp6_e2m3", "fp6_e3m2", "tensor"),
        "fp4": uniform("fp4", "fp4_e2m1", "fp4_e2m1", "tensor", "stochastic"),
        "nvfp4-nvidia": R(name="nvfp4-nvidia", weight=Q("fp4_e2m1", "nvfp4", square_blocks=True),
                          activation=Q("fp4_e2m1", "nvfp4"), grad=Q("fp4_e2m1", "nvfp4", rounding="stochastic"),
                          hadamard=GemmHadamard(wgrad=Hadamard(16, signs="fixed")), high_precision_last=1),
        "quartet": quartet,
        "quartet-full": R(**{**{f: getattr(quartet, f) for f in precision.Recipe.__dataclass_fields__},
                             "name": "quartet-full", "backward_operands": "forward", "clip_mask": True}),
        "mxfp4-rht": R(name="mxfp4-rht", weight=Q("bf16", "none"), activation=Q("bf16", "none"),
                       grad=Q("fp4_e2m1", "mx", rounding="stochastic", scale_rounding="ceil"),
                       hadamard=GemmHadamard(dgrad=Hadamard(32), wgrad=Hadamard(32)), backward_operands="forward"),
    }


def test_every_preset_builds_its_frozen_recipe():
    frozen = _frozen_presets()
    assert precision.PRESETS == tuple(frozen)  # same names, same order
    for name in precision.PRESETS:
        built = precision.get(name)
        assert built == frozen[name], name
        assert built.describe() == frozen[name].describe(), name
        assert precision.preset_doc(name) and "\n" not in precision.preset_doc(name), name
    assert precision.get("quartet") is not precision.get("quartet")  # a fresh Recipe each call, as before


@pytest.fixture
def registry(monkeypatch):
    """The registry, restored after the test."""
    monkeypatch.setattr(precision, "_PRESETS", dict(precision._PRESETS))
    monkeypatch.setattr(precision, "_PRESET_DOCS", dict(precision._PRESET_DOCS))
    monkeypatch.setattr(precision, "PRESETS", precision.PRESETS)
    return precision


def test_register_preset_adds_a_named_recipe(registry):
    built_in = registry.PRESETS

    @registry.register_preset("fp8-e4m3-grads")
    def _fp8_e4m3_grads():
        """FP8 with E4M3 gradients too."""
        return precision.Recipe(name="fp8-e4m3-grads", weight=precision.get("fp8").weight,
                                activation=precision.get("fp8").activation, grad=precision.get("fp8").weight)

    registry.register_preset("fp6-mx-fwd", lambda: precision.get({"name": "fp6-mx-fwd", "base": "mxfp6", "grad": "none"}),
                             doc="MXFP6 forward only.")
    assert registry.PRESETS == built_in + ("fp8-e4m3-grads", "fp6-mx-fwd")
    r = precision.get("fp8-e4m3-grads")
    assert r.name == "fp8-e4m3-grads" and r.bits_g == 8 and r.grad.format == "fp8_e4m3"
    assert precision.preset_doc("fp8-e4m3-grads") == "FP8 with E4M3 gradients too."
    assert precision.get("fp6-mx-fwd").grad is None and precision.preset_doc("fp6-mx-fwd") == "MXFP6 forward only."
    # a registered name works wherever a preset does: as a base and as the kept blocks' recipe
    assert precision.get({"base": "fp8-e4m3-grads", "forward_only": True}).grad.format == "fp8_e4m3"
    assert precision.get({"base": "nvfp4", "high_precision_last": 1, "high_precision": "fp8-e4m3-grads"}).kept().name == "fp8-e4m3-grads"


@pytest.mark.parametrize("name, build, allowed", [
    ("fp8", lambda: precision.Recipe(name="fp8"), "a name not yet registered"),
    ("", lambda: precision.Recipe(name=""), "a non-empty string"),
    ("mine.toml", lambda: precision.Recipe(name="mine.toml"), "not ending in '.toml'"),
    ("mine", lambda: precision.Recipe(name="other"), "a Recipe named 'mine'"),
    ("mine", lambda: "fp8", "a Recipe named 'mine'"),
])
def test_register_preset_rejects_in_one_line(registry, name, build, allowed):
    before = registry.PRESETS
    with pytest.raises(ConfigError) as e:
        registry.register_preset(name, build)
    assert "\n" not in str(e.value) and allowed in e.value.allowed
    assert e.value.key.startswith("preset")
    assert registry.PRESETS == before


def test_register_preset_duplicate_names_key_value_and_allowed(registry):
    with pytest.raises(ConfigError) as e:
        registry.register_preset("nvfp4")(lambda: precision.Recipe(name="nvfp4"))
    assert str(e.value).startswith("preset: got 'nvfp4'; allowed: a name not yet registered (taken: fp32, tf32, ")
    assert "\n" not in str(e.value)
    assert precision.get("nvfp4").grad.granularity == "nvfp4"  # the built-in is kept
