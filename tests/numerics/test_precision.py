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
