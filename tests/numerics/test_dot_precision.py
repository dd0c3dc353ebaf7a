"""Every float32 dot of a training step runs at the precision its recipe says: `fp32` recipes at
lax.Precision.HIGHEST (without it a GPU runs float32 dots as TF32), the `tf32` recipe at DEFAULT.
Linted on the step's jaxpr, nested jaxprs included (scan, cond, remat, custom VJP bodies, inner
jits), with each dot's operand types as XLA will see them (the lowering's casts of mixed or
algorithm-typed operands applied), so every dot XLA will compile is seen: the GEMMs (the FP32 path
on dequantised operands, forward-only backward GEMMs), attention and the output head. The jaxpr,
not the lowered StableHLO, as lowering each program would cost about half as much again as tracing
it; test_the_jaxpr_lint_sees_the_dots_of_the_lowered_program checks that both see the same dots (a
quantised step, the autocast recipe's), and the autocast recipe's own test lints its StableHLO."""

from __future__ import annotations

import functools
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
AUTOCAST = Path(__file__).resolve().parents[2] / "experiments" / "recipes" / "bf16-autocast.toml"
DOT = re.compile(r"stablehlo\.dot_general .*: \(tensor<([0-9?x]*\w+)>, tensor<([0-9?x]*\w+)>\)")
PRECISION = re.compile(r"precision = \[(\w+), (\w+)\]")
ALGORITHM = re.compile(r"lhs_precision_type = (\w+), rhs_precision_type = (\w+), accumulation_type = (\w+), "
                       r".*num_primitive_operations = (\d+)")
HLO_TYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "float64": "f64",
             "float8_e4m3fn": "f8E4M3FN", "float8_e5m2": "f8E5M2"}
FP8 = {jnp.dtype(t) for t in (jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.float8_e5m2fnuz, jnp.float8_e4m3fnuz,
                               jnp.float8_e3m4, jnp.float8_e4m3, jnp.float8_e8m0fnu)}


@functools.lru_cache(maxsize=None)
def _abstract_step(recipe: precision.Recipe):
    """The graph definitions and abstract state of `recipe`'s step: the same whatever the backend,
    so the cases traced as on either share them."""
    _, _, init = step_lib.compiled()
    tx = step_lib.optimizer_tx(1.0, 0.1)
    model_def, opt_def = step_lib.graph_defs(CFG, recipe, tx, 0)
    return step_lib.Static(model_def), step_lib.Static(opt_def), jax.eval_shape(lambda: init(CFG, recipe, tx, 0))


def _traced_step(recipe: precision.Recipe, measure: bool):
    """The jitted step's trace for the backend jax.default_backend() names (jit's cache: a program
    traced once serves every test asking for it in this process)."""
    jitted, measure = step_lib.compiled()[0].program(measure)
    tokens = jax.ShapeDtypeStruct((2, CFG.seq_len + 1), np.int32)
    return jitted.trace(*_abstract_step(recipe), tokens, 0, 0, np.float32(1e-3), measure)


def _hlo_type(aval) -> str:
    return "x".join([*map(str, aval.shape), HLO_TYPES.get(aval.dtype.name, aval.dtype.name)])


def _label(line: str) -> str:
    """A StableHLO dot's precision ("DEFAULT" where none is set), or its algorithm as JAX names the
    preset (BF16_BF16_F32_X6: bf16 inputs, f32 accumulation, 6 products)."""
    if "algorithm" in line:
        lhs, rhs, acc, n = ALGORITHM.search(line).groups()
        return "_".join(t.upper() for t in (lhs, rhs, acc)) + ("" if n == "1" else f"_X{n}")
    m = PRECISION.search(line)
    assert m is None or m.group(1) == m.group(2), line
    return m.group(1) if m else "DEFAULT"


def stablehlo_dots(stablehlo: str) -> list[tuple[str, str, str]]:
    """(precision or algorithm, lhs type, rhs type) of every dot_general, types as StableHLO writes
    them ("32x64xf32")."""
    return [(_label(line), *DOT.search(line).groups()) for line in stablehlo.splitlines() if "stablehlo.dot_general" in line]


def _operand_types(eqn) -> tuple[str, str]:
    """A dot_general's operand types as lowered: an algorithm casts each to a type it takes, and
    mixed types (other than two fp8s) are cast to the output's (jax's _dot_general_lower)."""
    lhs, rhs = (v.aval for v in eqn.invars[:2])
    p = eqn.params["precision"]
    if isinstance(p, jax.lax.DotAlgorithmPreset):
        take = lambda aval, ok: aval if ok is None or aval.dtype in ok else aval.update(dtype=jnp.dtype(ok[0]))  # noqa: E731
        lhs, rhs = take(lhs, p.supported_lhs_types), take(rhs, p.supported_rhs_types)
    elif lhs.dtype != rhs.dtype and not {lhs.dtype, rhs.dtype} <= FP8:
        out = eqn.outvars[0].aval.dtype
        lhs, rhs = lhs.update(dtype=out), rhs.update(dtype=out)
    return _hlo_type(lhs), _hlo_type(rhs)


def jaxpr_dots(jaxpr, seen=None) -> list[tuple[str, str, str]]:
    """stablehlo_dots of the lowered program, read off its jaxpr: every dot_general, nested jaxprs
    included, each nested one once (as the lowering emits one function for a jaxpr called twice)."""
    seen = set() if seen is None else seen
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            p = eqn.params["precision"]
            if p is not None and not isinstance(p, jax.lax.DotAlgorithmPreset):
                assert p[0] == p[1], eqn
            label = "DEFAULT" if p is None else p.name if isinstance(p, jax.lax.DotAlgorithmPreset) else p[0].name
            found.append((label, *_operand_types(eqn)))
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's Jaxpr
                if hasattr(sub, "eqns") and id(sub) not in seen:
                    seen.add(id(sub))
                    found += jaxpr_dots(sub, seen)
    return found


def f32_dot_precisions(dots: list[tuple[str, str, str]]) -> list[str]:
    """The precision of every float32 × float32 dot ("DEFAULT" where none is set), or
    "BF16_BF16_F32_X6" where it carries that dot algorithm."""
    found = [label for label, lhs, rhs in dots if lhs.split("x")[-1] == rhs.split("x")[-1] == "f32"]
    assert set(found) <= {"DEFAULT", "HIGH", "HIGHEST", "BF16_BF16_F32_X6"}, found  # no other algorithm is asked for
    return found


def step_f32_dot_precisions(recipe: precision.Recipe, measure: bool) -> list[str]:
    return f32_dot_precisions(jaxpr_dots(_traced_step(recipe, measure).jaxpr.jaxpr))


X6 = "lhs_precision_type = bf16, rhs_precision_type = bf16, accumulation_type = f32, lhs_component_count = 1, " \
     "rhs_component_count = 1, num_primitive_operations = 6"


def test_the_lint_reads_precisions_off_stablehlo():
    line = ("%7 = stablehlo.dot_general %5, %6, contracting_dims = [1] x [0], precision = [HIGHEST, HIGHEST] : "
            "(tensor<32x32xf32>, tensor<32x64xf32>) -> tensor<32x64xf32>")
    plain = "%8 = stablehlo.dot_general %5, %6, contracting_dims = [1] x [0] : (tensor<4xf32>, tensor<4xf32>) -> tensor<f32>"
    bf16 = line.replace("xf32>, tensor<32x64xf32>", "xbf16>, tensor<32x64xbf16>")
    x6 = plain.replace(" :", f", algorithm = <{X6}, allow_imprecise_accumulation = false> :")
    assert stablehlo_dots(x6) == [("BF16_BF16_F32_X6", "4xf32", "4xf32")]
    assert f32_dot_precisions(stablehlo_dots("\n".join([line, plain, bf16, x6]))) == ["HIGHEST", "DEFAULT", "BF16_BF16_F32_X6"]


@pytest.mark.parametrize("backend, recipe", [("cpu", "nvfp4-nvidia"), ("gpu", str(AUTOCAST))], ids=["nvfp4-nvidia-cpu", "autocast-gpu"])
def test_the_jaxpr_lint_sees_the_dots_of_the_lowered_program(backend, recipe, monkeypatch):
    """The same dots, with the same precisions and operand types, off the jaxpr as off the StableHLO
    lowered from it: a quantised step with the most dots (its telemetry branches, rotations, scan,
    remat and custom VJPs), and one of mixed-type dots under a dot algorithm."""
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    traced = _traced_step(precision.get(recipe), False)
    found = jaxpr_dots(traced.jaxpr.jaxpr)
    assert len(found) > 20 and sorted(found) == sorted(stablehlo_dots(traced.lower().as_text()))


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_every_f32_dot_of_every_preset_runs_at_its_recipes_precision(backend, monkeypatch):
    """Traced as on a GPU too (its attention and telemetry paths differ); the unlogged step of
    each preset, and the logged one of a quantised and of the tf32 recipe."""
    if backend != "cpu":
        monkeypatch.setattr(jax, "default_backend", lambda: backend)
    cases = [(name, False) for name in precision.PRESETS] + [("mxfp4", True), ("tf32", True)]
    for name, measure in cases:
        recipe = precision.get(name)
        found = step_f32_dot_precisions(recipe, measure)
        want = {"fp32": "HIGHEST", "tf32": "DEFAULT"}[recipe.dot_precision]
        assert found, name  # the head and attention at least
        assert set(found) == {want}, (name, measure, sorted(set(found)))


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_a_forward_only_recipes_fp32_backward_and_custom_tf32_and_bf16x6_recipes_follow_the_recipe(backend, monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    for table, want in (({"base": "fp8", "forward_only": True}, "HIGHEST"),
                        ({"base": "fp8", "dot_precision": "tf32", "high_precision_embed": False}, "DEFAULT"),
                        ({"base": "bf16", "dot_precision": "bf16x6"}, "BF16_BF16_F32_X6")):
        found = step_f32_dot_precisions(precision.get(table), False)
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
    stablehlo = _traced_step(precision.get(str(AUTOCAST)), False).lower().as_text()  # the lint of the lowered program
    dots = [line for line in stablehlo.splitlines() if "stablehlo.dot_general" in line]
    bf16 = re.compile(r": \(tensor<(?:[0-9?]+x)*bf16>, tensor<(?:[0-9?]+x)*bf16>\)|lhs_precision_type = bf16, rhs_precision_type = bf16")
    assert dots and all(bf16.search(line) for line in dots), [line for line in dots if not bf16.search(line)][:2]
    assert set(step_f32_dot_precisions(precision.get("bf16"), False)) == {"HIGHEST"}


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="XLA:CPU ignores dot algorithms: bf16x6 is FP32 there")
def test_on_a_gpu_bf16x6_dots_are_as_close_to_float64_as_fp32s_and_tf32_is_not():
    """The dot of a bf16x6 recipe against float64: within 4 times HIGHEST's error (CUDA-core FP32),
    and at least 16 times closer than DEFAULT's (TF32); K = 1024, as an attention row's P·V."""
    a, b = (np.random.default_rng(seed).standard_normal(shape).astype(np.float32) for seed, shape in ((0, (256, 1024)), (1, (1024, 64))))
    exact = a.astype(np.float64) @ b.astype(np.float64)
    error = {name: float(np.max(np.abs(np.asarray(jnp.dot(a, b, precision=p), np.float64) - exact)))
             for name, p in precision.DOT_PRECISIONS.items()}
    assert error["bf16x6"] <= 4 * error["fp32"] and error["bf16x6"] * 16 <= error["tf32"], error

