"""Attention never holds B×H×L×L scores per layer where nothing in it is rounded: FP32 inputs run
the blocked flash-style attention on every backend, bf16/fp16 inputs `jax.nn.dot_product_attention`
(cuDNN flash attention asked for by name on a GPU, XLA's form where it cannot run, said). Checked on a CPU against the dense form, values and gradients,
and by the compiled step's memory at bench_gpu's default shape (traced as on a GPU)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scaling.numerics import precision
from scaling.train import ladder, model
from scaling.train import step as step_lib

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_gpu  # noqa: E402

TINY = ladder.ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, vocab=64, seq_len=16)


def _qkvg(L: int, seed: int = 0):
    shape = (2, L, 4, 16)  # B×L×H×K
    return [jax.random.normal(k, shape, jnp.float32) for k in jax.random.split(jax.random.key(seed), 4)]


def _dense(q, k, v, probs_dtype=None):
    """softmax(mask(Q·Kᵀ/√K))·V, written out; probabilities rounded to `probs_dtype` if given."""
    logits = jnp.einsum("blhk,bmhk->bhlm", q, k, precision="highest") / np.sqrt(q.shape[-1])
    L = q.shape[1]
    probs = jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((L, L), bool)), logits, -1e30), axis=-1)
    if probs_dtype is not None:
        probs = probs.astype(probs_dtype).astype(jnp.float32)
    return jnp.einsum("bhlm,bmhk->blhk", probs, v, precision="highest")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["cpu", "gpu"])
@pytest.mark.parametrize("L", [16, model.ATTENTION_CHUNK, 2 * model.ATTENTION_CHUNK + 5, 4 * model.ATTENTION_CHUNK + 5])
def test_flash_attention_matches_the_dense_form_on_every_backend(L, backend, monkeypatch):
    """A CPU maps over batch rows in ATTENTION_CHUNK-row blocks, other backends take them all at once
    in ATTENTION_BLOCKS_GPU blocks (66 rows at the longest L here, the last one shorter): the same function."""
    if backend != "cpu":
        monkeypatch.setattr(jax, "default_backend", lambda: backend)
    q, k, v, g = _qkvg(L)
    out, vjp = jax.vjp(model._causal_attention, q, k, v)
    ref, ref_vjp = jax.vjp(_dense, q, k, v)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    for got, want in zip(vjp(g), ref_vjp(g)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_fused_attention_is_the_dense_form_on_rounded_inputs(dtype):
    """Q, K, V rounded to the 16-bit type, probabilities rounded to it for P·V, output in it:
    values and all three gradients agree with the dense form of that computation to its precision."""
    q, k, v, g = _qkvg(2 * model.ATTENTION_CHUNK + 5, seed=1)

    def reference(q, k, v):
        r = lambda x: x + jax.lax.stop_gradient(x.astype(dtype).astype(jnp.float32) - x)  # straight through
        return _dense(r(q), r(k), r(v), probs_dtype=dtype)

    out, vjp = jax.vjp(lambda q, k, v: model._fused_attention(q, k, v, jnp.dtype(dtype)), q, k, v)
    ref, ref_vjp = jax.vjp(reference, q, k, v)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, ref, rtol=2e-2, atol=2e-2)
    for got, want in zip(vjp(g), ref_vjp(g)):
        np.testing.assert_allclose(got, want, rtol=5e-2, atol=5e-2)


@pytest.mark.slow
def test_the_model_runs_the_fused_kernel_exactly_where_the_inputs_are_16_bit(monkeypatch):
    calls = []
    fused = model._fused_attention
    monkeypatch.setattr(model, "_fused_attention", lambda *a: calls.append(a[-1]) or fused(*a))
    tokens = jax.random.randint(jax.random.key(0), (2, TINY.seq_len + 1), 0, TINY.vocab)
    cases = {"bf16": None, "fp8": None,
             "bf16-attention": ({"base": "bf16", "attention": {"format": "bf16", "granularity": "none"}}, "bfloat16"),
             "scaled bf16": ({"base": "bf16", "attention": "bf16"}, None),  # a role's string: per-tensor scale
             "fp16-attention": ({"base": "fp8", "attention": {"format": "fp16", "granularity": "none"}}, "float16"),
             "scaled fp16": ({"base": "fp8", "attention": "fp16"}, None),  # per-tensor scale: not a cast
             "stochastic bf16": ({"base": "bf16", "attention": {"format": "bf16", "granularity": "none",
                                                                  "rounding": "stochastic"}}, None),
             "e4m3, no scale": ({"base": "fp8", "attention": {"format": "fp8_e4m3", "granularity": "none"}}, None)}
    for what, case in cases.items():
        table, want = case if case else (what, None)
        recipe = precision.get(table)
        assert recipe.structure().attention_dtype == want, what
        calls.clear()
        m = model.Transformer(TINY, recipe, rngs=nnx.Rngs(0))
        loss = model.eval_loss(m, tokens)
        assert np.isfinite(float(loss)) and calls == ([jnp.dtype(want)] if want else []), what


@pytest.mark.slow
def test_the_compiled_step_holds_no_LxL_scores_per_layer(monkeypatch):
    """bench_gpu's default shape (the ladder size nearest 20M parameters, batch 16 × 1024 tokens),
    its bf16 reference recipe, traced as on a GPU and compiled on this CPU: the step's temporary
    memory grows by less than one B×H×L×L float32 buffer per layer (the dense form keeps two)."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    defaults = bench_gpu.build_parser().parse_args([])
    params = float(defaults.params.split(",")[0])
    base = ladder.config_for_size(bench_gpu.size_near(params), seq_len=defaults.seq_len)
    batch, L = defaults.batch, base.seq_len
    train_step, _, init = step_lib.compiled()
    tx = step_lib.optimizer_tx(1.0, 0.1)
    recipe = precision.get("bf16")
    temp = {}
    for n_layers in (2, 4):
        cfg = dataclasses.replace(base, n_layers=n_layers)
        model_def, opt_def = step_lib.graph_defs(cfg, recipe, tx, 0)
        state = jax.eval_shape(lambda: init(cfg, recipe, tx, 0))
        tokens = jax.ShapeDtypeStruct((batch, L + 1), np.int32)
        compiled = train_step.lower(model_def, opt_def, state, tokens, 0, 0, np.float32(1e-3), False).compile()
        temp[n_layers] = compiled.memory_analysis().temp_size_in_bytes
    per_layer = (temp[4] - temp[2]) / 2
    scores = batch * base.n_heads * L * L * 4
    assert 0 < per_layer < scores, (per_layer / 1e9, scores / 1e9)


@pytest.mark.slow
def test_on_a_gpu_a_layers_attention_runs_a_bounded_number_of_dots_whatever_the_sequence_length(monkeypatch):
    """The bf16 recipe's training step (FP32 attention) traced as on a GPU: its dots do not grow with L
    past ATTENTION_BLOCKS_GPU blocks of ATTENTION_CHUNK rows (64-row blocks at L = 1024 were 16 blocks
    x 7 small dots per layer). Each block adds 7 dots to a layer: Q·Kᵀ and P·V forward; Q·Kᵀ again,
    dO·Vᵀ, dQ, dK and dV backward. The layers are scanned: the text holds one layer's dots."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    train_step, _, init = step_lib.compiled()
    tx = step_lib.optimizer_tx(1.0, 0.1)
    recipe = precision.get("bf16")

    def dots(L: int) -> int:
        cfg = ladder.config_for_size(1, seq_len=L)
        model_def, opt_def = step_lib.graph_defs(cfg, recipe, tx, 0)
        state = jax.eval_shape(lambda: init(cfg, recipe, tx, 0))
        tokens = jax.ShapeDtypeStruct((2, L + 1), np.int32)
        text = train_step.lower(model_def, opt_def, state, tokens, 0, 0, np.float32(1e-3), False).as_text()
        return text.count("stablehlo.dot_general")

    one_block, four, longest = dots(model.ATTENTION_CHUNK), dots(4 * model.ATTENTION_CHUNK), dots(1024)
    assert four == longest == one_block + 7 * (model.ATTENTION_BLOCKS_GPU - 1), (one_block, four, longest)


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_the_blocked_attentions_gradient_has_no_scatter(backend, monkeypatch):
    """dK and dV sum each query block's part into the keys it saw by static slices: no scatter (a
    GPU runs a scatter-add with atomics, or serially under deterministic ops), where rows run one at a
    time (a CPU) and where they are vmapped (a GPU)."""
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    q, k, v, g = _qkvg(2 * model.ATTENTION_CHUNK + 5)
    grad = jax.grad(lambda q, k, v: jnp.sum(model._causal_attention(q, k, v) * g), argnums=(0, 1, 2))
    text = jax.jit(grad).lower(q, k, v).as_text()
    assert "stablehlo.dot_general" in text and "stablehlo.scatter" not in text


def test_a_gpu_asks_for_cudnn_by_name_and_says_when_xla_ran_instead(monkeypatch):
    """jax.nn.dot_product_attention's default (implementation=None) is XLA's form: a GPU asks for cuDNN
    by name; where cuDNN cannot run (here: no GPU at all) XLA's form runs, and the record says why."""
    q, k, v, _ = _qkvg(16)
    want = model._fused_attention(q, k, v, jnp.bfloat16)
    assert model.attention_kernels()["bfloat16"] == "xla"
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    got = model._fused_attention(q, k, v, jnp.bfloat16)  # cuDNN's lowering refuses a CPU
    assert np.array_equal(np.asarray(got), np.asarray(want))
    assert model.attention_kernels()["bfloat16"].startswith("xla (cuDNN flash attention did not run: ")
    asked = []
    real = jax.nn.dot_product_attention

    def fake(*args, implementation=None, **kwargs):
        asked.append(implementation)
        return real(*args, implementation="xla", **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", fake)
    model._fused_attention(q, k, v, jnp.bfloat16)
    assert asked == ["cudnn"] and model.attention_kernels()["bfloat16"] == "cudnn"


@pytest.mark.slow
def test_a_run_with_16_bit_attention_logs_which_kernel_ran(tmp_path):
    from scaling import train
    from scaling._io import read_jsonl
    from scaling.train import config

    recipe = Path(__file__).resolve().parents[2] / "experiments" / "recipes" / "bf16-attention.toml"
    cfg = config.validate({"name": "t", "precision": str(recipe), "seed": 0, "model": {"size": 1, "seq_len": 32},
                           "data": {"source": "synthetic", "eval_tokens": 1024},
                           "train": {"tokens": 8 * 32 * 4, "batch_size": 8, "lr": 1e-2, "log_every": 2,
                                     "checkpoint_every": 0}})
    train.run(cfg, tmp_path)
    events = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r.get("event") == "attention"]
    assert events == [{"event": "attention", "step": 0, "dtype": "bfloat16", "kernel": "xla"}]
