"""Every float32 dot of a training step runs at the precision its recipe says: `fp32` recipes at
lax.Precision.HIGHEST (without it a GPU runs float32 dots as TF32), the `tf32` recipe at DEFAULT.
Linted on the lowered StableHLO of the step, so every dot XLA will compile is seen: the GEMMs (the
FP32 path on dequantised operands, forward-only backward GEMMs), attention and the output head."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scaling.errors import ConfigError
from scaling.numerics import precision
from scaling.train import ladder
from scaling.train import step as step_lib

pytestmark = pytest.mark.slow  # every test here compiles or trains several models

CFG = ladder.ModelConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, vocab=64, seq_len=16)
DOT = re.compile(r"stablehlo\.dot_general .*?(?:precision = \[(\w+), (\w+)\].*?)?: "
                 r"\(tensor<(?:[0-9?]+x)*(\w+)>, tensor<(?:[0-9?]+x)*(\w+)>\)")


def _lowered_step(recipe: precision.Recipe, measure: bool) -> str:
    train_step, _, init = step_lib.compiled()
    tx = step_lib.optimizer_tx(1.0, 0.1)
    model_def, opt_def = step_lib.graph_defs(CFG, recipe, tx, 0)
    state = jax.eval_shape(lambda: init(CFG, recipe, tx, 0))
    tokens = jax.ShapeDtypeStruct((2, CFG.seq_len + 1), np.int32)
    return train_step.lower(model_def, opt_def, state, tokens, 0, 0, np.float32(1e-3), measure).as_text()


X6 = "lhs_precision_type = bf16, rhs_precision_type = bf16, accumulation_type = f32, lhs_component_count = 1, " \
     "rhs_component_count = 1, num_primitive_operations = 6"


def f32_dot_precisions(stablehlo: str) -> list[str]:
    """The precision of every float32 × float32 dot_general ("DEFAULT" where none is set), or
    "BF16_BF16_F32_X6" where it carries that dot algorithm."""
    found = []
    for line in stablehlo.splitlines():
        m = DOT.search(line)
        if m and m.group(3) == m.group(4) == "f32":
            assert m.group(1) == m.group(2), line
            assert "algorithm" not in line or X6 in line, line  # no other algorithm is asked for
            found.append("BF16_BF16_F32_X6" if X6 in line else m.group(1) or "DEFAULT")
    return found


def test_the_lint_reads_precisions_off_stablehlo():
    line = ("%7 = stablehlo.dot_general %5, %6, contracting_dims = [1] x [0], precision = [HIGHEST, HIGHEST] : "
            "(tensor<32x32xf32>, tensor<32x64xf32>) -> tensor<32x64xf32>")
    plain = "%8 = stablehlo.dot_general %5, %6, contracting_dims = [1] x [0] : (tensor<4xf32>, tensor<4xf32>) -> tensor<f32>"
    bf16 = line.replace("xf32>, tensor<32x64xf32>", "xbf16>, tensor<32x64xbf16>")
    assert f32_dot_precisions("\n".join([line, plain, bf16])) == ["HIGHEST", "DEFAULT"]


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_every_f32_dot_of_every_preset_runs_at_its_recipes_precision(backend, monkeypatch):
    """Traced as on a GPU too (its attention and telemetry paths differ); the unlogged step of
    each preset, and the logged one of a quantised and of the tf32 recipe."""
    if backend != "cpu":
        monkeypatch.setattr(jax, "default_backend", lambda: backend)
    cases = [(name, False) for name in precision.PRESETS] + [("mxfp4", True), ("tf32", True)]
    for name, measure in cases:
        recipe = precision.get(name)
        found = f32_dot_precisions(_lowered_step(recipe, measure))
        want = {"fp32": "HIGHEST", "tf32": "DEFAULT"}[recipe.dot_precision]
        assert found, name  # the head and attention at least
        assert set(found) == {want}, (name, measure, sorted(set(found)))


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_a_forward_only_recipes_fp32_backward_and_custom_tf32_and_bf16x6_recipes_follow_the_recipe(backend, monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    for table, want in (({"base": "fp8", "forward_only": True}, "HIGHEST"),
                        ({"base": "fp8", "dot_precision": "tf32", "high_precision_embed": False}, "DEFAULT"),
                        ({"base": "bf16", "dot_precision": "bf16x6"}, "BF16_BF16_F32_X6")):
        found = f32_dot_precisions(_lowered_step(precision.get(table), False))
        assert found and set(found) == {want}, table


def test_tf32_recipe_is_fp32_storage_with_19_bit_dot_inputs():
    tf32 = precision.get("tf32")
    assert (tf32.weight, tf32.activation, tf32.grad, tf32.attention) == (None, None, None, None)
    assert tf32.bits == tf32.bits_g == 19 and precision.get("fp32").bits == 32
    assert tf32.describe()["dot_precision"] == "tf32"
    assert "dot_precision" not in precision.get("fp32").describe()  # run ids of FP32 recipes unchanged
    assert tf32.structure().f32_dots == jax.lax.Precision.DEFAULT
    assert precision.get("bf16").structure().f32_dots == jax.lax.Precision.HIGHEST
    with pytest.raises(ConfigError, match="precision.dot_precision: got 'tf16'"):
        precision.get({"base": "fp8", "dot_precision": "tf16"})


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="a GPU runs DEFAULT as TF32")
def test_on_a_cpu_tf32_bf16x6_and_fp32_give_the_same_bits():
    """XLA:CPU runs DEFAULT as FP32 (the explicit HIGHEST changed no committed CPU result) and ignores
    dot algorithms (bf16x6 runs as FP32)."""
    train_step, _, init = step_lib.compiled()
    tx = step_lib.optimizer_tx(1.0, 0.1)
    tokens = jax.random.randint(jax.random.key(0), (2, CFG.seq_len + 1), 0, CFG.vocab)
    losses = {}
    for name in ("fp32", "tf32", "bf16x6"):
        recipe = precision.get({"base": "fp32", "name": name, "dot_precision": name})
        model_def, opt_def = step_lib.graph_defs(CFG, recipe, tx, 0)
        state = init(CFG, recipe, tx, 0)
        for step in range(2):
            state, loss, grad_norm, _ = train_step(model_def, opt_def, state, tokens, 0, step, np.float32(1e-2), True)
        losses[name] = (float(loss), float(grad_norm))
    assert losses["fp32"] == losses["tf32"] == losses["bf16x6"]


def test_the_autocast_recipe_traced_as_on_a_gpu_runs_every_dot_on_bf16_inputs(monkeypatch):
    """experiments/recipes/bf16-autocast.toml (what PyTorch's autocast trains; bench_gpu's `autocast`
    row): on a GPU every dot of its step, attention and head included, multiplies bf16 inputs (bf16
    operands, or f32 operands under the BF16_BF16_F32 dot algorithm), none runs in FP32; the bf16
    preset, the study's 16-bit reference, keeps attention and the head at HIGHEST."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    autocast = Path(__file__).resolve().parents[2] / "experiments" / "recipes" / "bf16-autocast.toml"
    dots = [line for line in _lowered_step(precision.get(str(autocast)), False).splitlines() if "stablehlo.dot_general" in line]
    bf16 = re.compile(r": \(tensor<(?:[0-9?]+x)*bf16>, tensor<(?:[0-9?]+x)*bf16>\)|lhs_precision_type = bf16, rhs_precision_type = bf16")
    assert dots and all(bf16.search(line) for line in dots), [line for line in dots if not bf16.search(line)][:2]
    assert set(f32_dot_precisions(_lowered_step(precision.get("bf16"), False))) == {"HIGHEST"}


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="XLA:CPU ignores dot algorithms: bf16x6 is FP32 there")
def test_on_a_gpu_bf16x6_dots_are_as_close_to_float64_as_fp32s_and_tf32_is_not():
    """The dot of a bf16x6 recipe against float64: within 4 times HIGHEST's error (CUDA-core FP32),
    and at least 16 times closer than DEFAULT's (TF32); K = 1024, as an attention row's P·V."""
    a, b = (np.random.default_rng(seed).standard_normal(shape).astype(np.float32) for seed, shape in ((0, (256, 1024)), (1, (1024, 64))))
    exact = a.astype(np.float64) @ b.astype(np.float64)
    error = {name: float(np.max(np.abs(np.asarray(jnp.dot(a, b, precision=p), np.float64) - exact)))
             for name, p in precision.DOT_PRECISIONS.items()}
    assert error["bf16x6"] <= 4 * error["fp32"] and error["bf16x6"] * 16 <= error["tf32"], error

