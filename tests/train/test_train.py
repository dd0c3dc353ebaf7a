import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from scaling.train import config, data, health, ladder, loop as train
from scaling.train import step as step_lib
from scaling._io import read_jsonl
from scaling.errors import ConfigError

TOKENS_PER_STEP = 8 * 32  # batch 8 x seq_len 32
# Delayed scaling (amax histories: state a checkpoint must carry) and stochastic rounding of
# gradients (keys that must be a pure function of seed and step), in one recipe so the slow
# tests share one compilation.
STATEFUL_NOISY = {"base": "fp8-delayed", "name": "fp8-delayed-sr",
                  "grad": {"format": "fp8_e5m2", "scaling": "delayed", "rounding": "stochastic"}}


def tiny(steps: int, **sections) -> dict:
    """A size-1 model on the synthetic chain: seconds per run once compiled."""
    cfg = {"name": "t", "precision": "fp32", "seed": 0,
           "model": {"size": 1, "seq_len": 32},
           "data": {"source": "synthetic", "eval_tokens": 1024},
           "train": {"tokens": TOKENS_PER_STEP * steps, "batch_size": 8, "lr": 1e-2, "log_every": 20,
                     "checkpoint_every": 0}}
    for key, value in sections.items():
        if key in ("model", "data", "train", "health"):
            cfg.setdefault(key, {}).update(value)
        else:
            cfg[key] = value
    return config.validate(cfg)


def fail_batch_at(monkeypatch, failing_step: int, message: str):
    """Make drawing training batch `failing_step` raise RuntimeError(message); returns the real
    data.batch, to put back for a retry."""
    real_batch = data.batch

    def batch(tokens, seed, step, batch_size, seq_len):
        if step == failing_step:
            raise RuntimeError(message)
        return real_batch(tokens, seed, step, batch_size, seq_len)

    monkeypatch.setattr(train.data, "batch", batch)
    return real_batch


def losses(run_dir: Path) -> list[tuple]:
    return [(r["phase"], r["step"], r["loss"]) for r in read_jsonl(run_dir / "metrics.jsonl") if "loss" in r]


# ---------------------------------------------------------------- schedule and ladder arithmetic


@pytest.mark.slow
def test_weight_decay_shrinks_matrices_not_norm_gains():
    """Zero gradients: AdamW's update is the decay alone, on every matrix (stacked layers
    included) and on no norm gain, although the stacked gains are 2-D arrays."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from scaling.train import model

    m = model.Transformer(ladder.config_for_size(1, seq_len=8), "fp32", rngs=nnx.Rngs(0))
    params = nnx.state(m, nnx.Param)
    tx = step_lib.optimizer_tx(grad_clip=1.0, weight_decay=0.5)
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zeros, tx.init(params), params, learning_rate=1.0)
    decayed = {jax.tree_util.keystr(path): bool(jnp.any(u != 0))
               for path, u in jax.tree_util.tree_flatten_with_path(updates)[0]}
    assert decayed and all(v == ("scale" not in k) for k, v in decayed.items()), decayed
    assert any("blocks" in k and "scale" in k for k in decayed)  # the stacked gains were checked


def test_our_clipping_and_adam_are_optaxs_to_the_last_bits_with_optaxs_state():
    """step.clip_by_global_norm and step.scale_by_adam multiply by reciprocals where optax divides
    (so packed runs keep their single run's bits): the same updates within an ulp or two, clipped and
    not, over steps whose bias corrections differ, and the same state types (checkpoints read back)."""
    import jax
    import optax

    rng = np.random.default_rng(0)
    params = {"w": np.float32(rng.standard_normal((64, 32))), "b": np.float32(rng.standard_normal(32))}
    ours = optax.chain(step_lib.clip_by_global_norm(1.0), step_lib.scale_by_adam(0.9, 0.95, 1e-8))
    theirs = optax.chain(optax.clip_by_global_norm(1.0), optax.scale_by_adam(b1=0.9, b2=0.95, eps=1e-8))
    state_ours, state_theirs = ours.init(params), theirs.init(params)
    assert jax.tree.structure(state_ours) == jax.tree.structure(state_theirs)
    clipped = []
    for step in range(6):
        grads = jax.tree.map(lambda p: np.float32(rng.standard_normal(p.shape) * (0.001 if step % 2 else 1.0)), params)
        clipped.append(float(optax.tree.norm(grads)) > 1.0)
        got, state_ours = ours.update(grads, state_ours)
        want, state_theirs = theirs.update(grads, state_theirs)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_array_max_ulp(np.asarray(a), np.asarray(b), maxulp=4)
    assert clipped == [True, False] * 3


def test_initial_state_is_the_recipes_own_model_and_its_weights_compile_once_per_shape(caplog):
    """The trainer's initialiser (weights drawn recipe-free, then the recipe's state around them)
    gives exactly the state of the recipe's model built in one program with the run's seed, and the
    weights' program compiles once for every recipe of a model shape."""
    import logging

    import jax
    from flax import nnx

    from scaling.train import model

    cfg = ladder.config_for_size(1, seq_len=40)  # a shape no other test initialises
    tx = step_lib.optimizer_tx(grad_clip=1.0, weight_decay=0.1)
    _, _, init = step_lib.compiled()
    with caplog.at_level(logging.WARNING), jax.log_compiles(True):
        states = {r: init(cfg, r, tx, 3) for r in ("fp32", "fp8", "mxfp4")}
    weight_compiles = [m for m in caplog.messages if m.startswith("Compiling jit(init_params)")]
    assert len(weight_compiles) == 1, weight_compiles
    for recipe, state in states.items():  # jitted as the trainer builds models (eager draws round differently)
        direct = jax.jit(lambda: nnx.state(model.Transformer(cfg, recipe, rngs=nnx.Rngs(jax.random.key(3)))))()
        got, want = jax.tree_util.tree_flatten_with_path(state["model"])[0], jax.tree_util.tree_flatten_with_path(direct)[0]
        assert [p for p, _ in got] == [p for p, _ in want], recipe
        for (path, a), (_, b) in zip(got, want):  # NaN: telemetry not measured yet
            assert np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True), (recipe, jax.tree_util.keystr(path))
    assert not np.array_equal(np.asarray(init(cfg, "fp32", tx, 4)["model"]["embed"][...]),
                              np.asarray(states["fp32"]["model"]["embed"][...]))  # the seed is used


def test_learning_rate_schedules_by_hand():
    wsd = train.schedule_for(tiny(100, train={"warmup": 0.1, "lr": 1.0, "eval_at": [0.5, 1.0]}))
    half, full = wsd.budgets
    assert (half.end, half.cooldown_start, full.end, full.cooldown_start) == (50, 40, 100, 80)
    assert train.learning_rate(wsd, 0, full) == pytest.approx(0.1)  # warmup (t+1)/W, W = 10
    assert train.learning_rate(wsd, 9, full) == pytest.approx(1.0)
    assert train.learning_rate(wsd, 45, half) == pytest.approx(0.5)  # (E - t)/(E - C) = 5/10
    assert train.learning_rate(wsd, 45, full) == pytest.approx(1.0)  # the trunk is still stable
    assert train.learning_rate(wsd, 99, full) == pytest.approx(1 / 20)
    cosine = train.schedule_for(tiny(100, train={"warmup": 0.1, "lr": 1.0, "schedule": "cosine"}))
    assert train.learning_rate(cosine, 55, cosine.final) == pytest.approx(0.5)  # halfway from 10 to 100
    assert train.learning_rate(cosine, 10 + 90 // 3, cosine.final) == pytest.approx((1 + math.cos(math.pi / 3)) / 2)


def test_ladder_saves_tokens_against_separate_runs():
    schedule = train.schedule_for(tiny(100))  # budgets 0.25, 0.5, 1.0; decay 0.2
    assert [(b.end, b.cooldown_start) for b in schedule.budgets] == [(25, 20), (50, 40), (100, 80)]
    assert schedule.tokens_trained() == (100 + 5 + 10) * TOKENS_PER_STEP
    assert schedule.tokens_separate_runs() == (25 + 50 + 100) * TOKENS_PER_STEP
    # T·(1 - decay) + decay·sum(E_b) at another decay: 60 + 0.4·175 = 130 steps
    longer = train.schedule_for(tiny(100, train={"decay": 0.4}))
    assert longer.tokens_trained() == 130 * TOKENS_PER_STEP


def test_evaluation_byte_counts_for_bits_per_byte(tmp_path, monkeypatch):
    from tokenizers import Tokenizer

    monkeypatch.setenv("SCALING_CACHE", str(tmp_path / "cache"))
    byte_level = train.prepare(tiny(4))
    assert byte_level.val_bytes == byte_level.val_windows[:, 1:].size  # bpb = loss / ln 2
    assert byte_level.train_bytes == byte_level.train_windows[:, 1:].size
    root, rng = tmp_path / "text", np.random.default_rng(0)
    root.mkdir()
    words = "alpha beta gamma delta epsilon return import class self".split()
    for i in range(200):
        (root / f"{i}.txt").write_text(" ".join(rng.choice(words, 100)) + "\n")
    setup = train.prepare(tiny(4, data={"source": str(root), "tokenizer": "bpe:300", "eval_tokens": 64}))
    assert setup.model_cfg.vocab == 300 and setup.corpus.describe()["tokenizer"] == "bpe:300"
    tokenizer = Tokenizer.from_str(setup.corpus.tokenizer_json)
    for windows, n_bytes in ((setup.val_windows, setup.val_bytes), (setup.train_windows, setup.train_bytes)):
        assert n_bytes == sum(len(tokenizer.decode(w[1:].tolist()).encode()) for w in windows) > 2 * windows[:, 1:].size


def test_loss_monitor_flags_nan_and_spikes_after_warmup():
    monitor = health.LossMonitor(spike_factor=3.0, window=10, warmup_steps=3)
    for step, loss in enumerate([5.0, 4.0, 3.0, 2.9, 2.8]):
        monitor.check(step, loss)
    monitor.check(5, 8.9)  # median of [5, 4, 3, 2.9, 2.8] = 3: 8.9 < 9 is not a spike
    with pytest.raises(health.RunStopped, match="spike") as stop:
        monitor.check(6, 12.1)  # median of [5, 4, 3, 2.9, 2.8, 8.9] = 3.5: 12.1 > 10.5
    assert (stop.value.status, stop.value.step) == ("diverged", 6)
    in_warmup = health.LossMonitor(spike_factor=3.0, window=10, warmup_steps=100)
    for step, loss in enumerate([5.0, 4.0, 3.0, 2.9, 2.8, 100.0]):
        in_warmup.check(step, loss)


def test_saturation_above_the_threshold_is_reported_per_role():
    telemetry = {"weight": {"amax": 1.0, "frac_saturated": 0.002}, "grad": {"frac_saturated": 0.05},
                 "act_max": [3.0, 4.0]}
    events = health.saturation_events(telemetry, max_saturation=0.01)
    assert events == [{"event": "saturation", "role": "grad", "frac_saturated": 0.05, "threshold": 0.01}]


def test_loss_monitor_nan():
    with pytest.raises(health.RunStopped, match="nan") as stop:
        health.LossMonitor(3.0, 10, 0).check(0, float("nan"))
    assert (stop.value.status, stop.value.step) == ("diverged", 0)


# ---------------------------------------------------------------- real runs


@pytest.mark.slow
def test_a_run_learns_lands_its_summary_and_is_not_rerun(tmp_path):
    cfg, out = tiny(200), tmp_path / "run"
    summary = train.run(cfg, out)
    assert summary["status"] == "ok"
    first = losses(out)[0]
    assert first[1] == 1 and first[2] > math.log(256) - 0.5  # untrained: about uniform over bytes
    # the chain's entropy rate is 1.71 nats; a tiny model gets well below uniform within 200 steps
    assert summary["val_loss"] < 2.6 and summary["train_loss"] < 2.6
    assert summary["entropy_rate"] == pytest.approx(data.synthetic_corpus().entropy_rate)
    assert (summary["N"], summary["N_total"]) == (26784, 26784 + 2 * 256 * 32)
    assert (summary["P"], summary["recipe"], summary["format"], summary["D"]) == (32, "fp32", "fp32", 200 * TOKENS_PER_STEP)
    assert summary["run_id"] == config.run_id(cfg) and summary["tokens_per_s"] > 0
    assert summary["corpus"]["fingerprint"] == data.synthetic_corpus().fingerprint
    # WSD: one evaluation per budget, each after its own cooldown
    assert [(e["D"], e["step"]) for e in summary["evals"]] == [(50 * TOKENS_PER_STEP, 50), (100 * TOKENS_PER_STEP, 100),
                                                              (200 * TOKENS_PER_STEP, 200)]
    for e in [summary, *summary["evals"]]:  # byte tokens: bits per byte is nats per token / ln 2
        assert e["val_bpb"] == pytest.approx(e["val_loss"] / math.log(2))
        assert e["train_bpb"] == pytest.approx(e["train_loss"] / math.log(2))
    vals = [e["val_loss"] for e in summary["evals"]]
    assert vals[0] > vals[1] > vals[2] == summary["val_loss"]
    assert summary["ladder"]["tokens_trained"] == (200 + 10 + 20) * TOKENS_PER_STEP
    records = read_jsonl(out / "metrics.jsonl")
    trunk = [r for r in records if r.get("phase") == "trunk"]
    assert {"step", "tokens", "loss", "lr", "grad_norm", "tokens_per_s", "telemetry"} <= set(trunk[-1])
    assert all("val_bpb" in r and "train_bpb" in r for r in records if r.get("event") == "eval")
    assert max(b["step"] - a["step"] for a, b in zip(trunk, trunk[1:])) <= cfg.train.log_every  # heartbeat
    assert any(r.get("phase") == "cooldown" and r.get("budget") == 50 * TOKENS_PER_STEP for r in records)
    assert json.loads((out / "config.json").read_text()) == cfg.to_dict()
    # a finished run is not re-run; a directory holding another config is refused
    before = (out / "metrics.jsonl").read_text()
    assert train.run(cfg, out) == summary
    assert (out / "metrics.jsonl").read_text() == before
    with pytest.raises(ConfigError, match="--out"):
        train.run(cfg.replace(seed=1), out)


@pytest.mark.slow
def test_wsd_branch_equals_a_separate_run_of_that_budget(tmp_path):
    """The 0.25 branch must be exactly the run a user would get by training 50 steps with the same
    cooldown fraction: same batches, same keys, same learning rates (warmup 0 so both agree)."""
    ladder = train.run(tiny(120, train={"warmup": 0.0, "eval_at": [0.25, 1.0]}), tmp_path / "ladder")
    single = train.run(tiny(30, train={"warmup": 0.0, "eval_at": [1.0]}), tmp_path / "single")
    branch = ladder["evals"][0]
    assert branch["step"] == 30 and branch["D"] == single["D"]
    assert branch["val_loss"] == single["val_loss"] and branch["train_loss"] == single["train_loss"]


@pytest.mark.slow
def test_same_config_and_seed_are_bit_identical(tmp_path):
    cfg = tiny(30, precision=STATEFUL_NOISY, train={"eval_at": [0.5, 1.0], "log_every": 1})
    a, b = train.run(cfg, tmp_path / "a"), train.run(cfg, tmp_path / "b")
    assert len(losses(tmp_path / "a")) == 30 + 3  # every trunk step and the 3-step cooldown branch
    assert losses(tmp_path / "a") == losses(tmp_path / "b")
    assert a["evals"] == b["evals"]
    c = train.run(cfg.replace(seed=1), tmp_path / "c")
    assert c["val_loss"] != a["val_loss"]


@pytest.mark.slow
def test_resume_after_sigkill_reaches_the_same_final_loss(tmp_path, capsys):
    """A real kill: SIGKILL the CLI once its first checkpoint is on disk, run it again, compare with an
    uninterrupted run. The recipe's amax histories must be checkpointed too. (100 steps: the kill lands
    within a poll of the checkpoint at 25, 75 steps before the run would end; 200 steps took 21 s of CPU, 100 take 16.)"""
    cfg = tiny(100, precision=STATEFUL_NOISY, train={"checkpoint_every": 25, "log_every": 25})
    path = tmp_path / "run.toml"
    path.write_text(_toml(cfg.to_dict()))
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "scaling.cli", "train", str(path), "--out", str(out)]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        deadline = time.time() + 240
        while not (out / "checkpoints" / "25").is_dir():
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.time() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "summary.json").exists()  # killed mid-run, before landing
    # the second attempt in this process (`scaling train`'s main), whose compiled step the uninterrupted run reuses
    from scaling import cli

    capsys.readouterr()
    assert cli.main(command[3:]) == 0
    assert "resumed from the checkpoint at step" in capsys.readouterr().out
    uninterrupted = train.run(cfg, tmp_path / "whole")
    killed = json.loads((out / "summary.json").read_text())
    assert killed["attempts"] == 2 and uninterrupted["attempts"] == 1
    assert killed["evals"] == uninterrupted["evals"]
    assert killed["val_loss"] == uninterrupted["val_loss"]
    # steps logged twice (after the checkpoint, before the kill) were recomputed identically
    logged = {}
    for phase, step, loss in losses(out):
        assert logged.setdefault((phase, step), loss) == loss
    assert logged == {(phase, step): loss for phase, step, loss in losses(tmp_path / "whole")}
    assert not (out / "checkpoints").exists()  # only kept while a run can still be resumed


@pytest.mark.slow
def test_divergence_lands_as_diverged_with_failure_json(tmp_path):
    summary = train.run(tiny(100, train={"lr": 1e3, "warmup": 0.0}), tmp_path / "run")
    assert summary["status"] == "diverged"
    failure = json.loads((tmp_path / "run" / "failure.json").read_text())
    assert failure["status"] == "diverged" and failure["step"] == summary["step"] < 100
    assert "spike" in failure["reason"] or "nan" in failure["reason"]
    assert failure["config"]["train"]["lr"] == 1e3 and failure["environment"]["versions"]["jax"]
    assert failure["last_losses"] and failure["traceback"] is None
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "diverged"


@pytest.mark.slow
def test_unexpected_error_writes_failure_json_and_propagates(tmp_path, monkeypatch):
    fail_batch_at(monkeypatch, 3, "disk on fire")
    with pytest.raises(RuntimeError, match="disk on fire"):
        train.run(tiny(20), tmp_path / "run")
    failure = json.loads((tmp_path / "run" / "failure.json").read_text())
    assert (failure["status"], failure["step"]) == ("failed", 3)
    assert "RuntimeError: disk on fire" in failure["traceback"] and len(failure["last_losses"]) == 3
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "failed"


def _toml(cfg: dict) -> str:
    """A config as TOML: JSON scalars and lists are TOML values, nested dicts become inline tables."""
    def value(v):
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + "}"
        return str(v).lower() if isinstance(v, bool) else json.dumps(v)

    lines = [f"{k} = {value(v)}" for k, v in cfg.items() if k not in ("model", "data", "train", "health")]
    for section in ("model", "data", "train", "health"):
        # TOML has no null: an unset key (model.n_layers = None, the ladder's depth) is left out
        lines += [f"[{section}]"] + [f"{k} = {value(v)}" for k, v in cfg[section].items() if v is not None]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- live curves (train.tracker)


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files under log_dir, per tag, as (step, value) in written order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    events = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})  # 0: keep every point
    events.Reload()
    return {tag: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in events.Tensors(tag)]
            for tag in events.Tags()["tensors"]}


@pytest.mark.slow
def test_tensorboard_mirrors_every_step_and_evaluation_record(tmp_path):
    cfg = tiny(60, precision="fp8", train={"tracker": ["tensorboard"], "log_every": 5,
                                           "eval_at": [0.5, 1.0]})
    out = tmp_path / "run"
    assert train.run(cfg, out)["status"] == "ok"
    scalars = tensorboard_scalars(out / "tensorboard")
    records = read_jsonl(out / "metrics.jsonl")
    trunk = [r for r in records if r.get("phase") == "trunk" and "loss" in r]
    cooldown = [r for r in records if r.get("phase") == "cooldown" and "loss" in r]
    assert len(trunk) == 60 // 5 + 1 and len(cooldown) == 2  # step 1, every 5th; the branch's 25th and 30th
    assert scalars["loss"] == [(r["step"], r["loss"]) for r in trunk]  # fp32 losses: exact in the event file
    assert scalars["grad_norm"] == [(r["step"], r["grad_norm"]) for r in trunk]
    assert scalars[f"cooldown_{30 * TOKENS_PER_STEP}/loss"] == [(r["step"], r["loss"]) for r in cooldown]
    for role_stat in ("weight/amax", "activation/frac_saturated", "grad/snr_db", "weight/block_amax/max"):
        role, *stat = role_stat.split("/")
        expected = [(r["step"], _get(r["telemetry"][role], stat)) for r in trunk]
        assert scalars[f"telemetry/{role_stat}"] == [(s, float(np.float32(v))) for s, v in expected]
    assert scalars["telemetry/act_max/1"] == [(r["step"], float(np.float32(r["telemetry"]["act_max"][1]))) for r in trunk]
    evals = [r for r in records if r.get("event") == "eval"]
    assert scalars["eval/val_loss"] == [(r["step"], float(np.float32(r["val_loss"]))) for r in evals]
    assert [s for s, _ in scalars["eval/train_loss"]] == [30, 60]


def _get(tree: dict, path: list[str]) -> float:
    for key in path:
        tree = tree[key]
    return tree


@pytest.mark.slow
def test_tensorboard_after_a_resume_holds_each_step_once(tmp_path, monkeypatch):
    """A run that fails after its checkpoint and is run again resumes there and logs the steps
    after the checkpoint again (metrics.jsonl has them twice); the event files have each once."""
    cfg = tiny(40, train={"tracker": ["tensorboard"], "log_every": 1, "checkpoint_every": 10, "eval_at": [1.0]})
    out = tmp_path / "run"
    real_batch = fail_batch_at(monkeypatch, 25, "node lost")
    with pytest.raises(RuntimeError, match="node lost"):
        train.run(cfg, out)
    monkeypatch.setattr(train.data, "batch", real_batch)
    assert train.run(cfg, out)["attempts"] == 2
    logged = losses(out)
    assert [step for _, step, _ in logged] == list(range(1, 26)) + list(range(21, 41))  # 21..25 twice
    assert len(list((out / "tensorboard").iterdir())) == 2  # one event file per attempt
    assert tensorboard_scalars(out / "tensorboard")["loss"] == sorted({(s, x) for _, s, x in logged})


# ---------------------------------------------------------------- telemetry only on logged steps


def _lowered_step(measure: bool) -> tuple[str, int]:
    """The lowered train step of a tiny MXFP4 model (telemetry on every quantised operand), logged
    (`measure`) or not, as StableHLO text, and its number of parameter leaves."""
    import jax
    from flax import nnx

    from scaling.numerics import precision

    cfg = ladder.ModelConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, vocab=64, seq_len=16)
    train_step, _, init = step_lib.compiled()
    tx = step_lib.optimizer_tx(1.0, 0.1)
    recipe = precision.get("mxfp4")
    model_def, opt_def = step_lib.graph_defs(cfg, recipe, tx, 0)
    state = jax.eval_shape(lambda: init(cfg, recipe, tx, 0))
    params = len(jax.tree.leaves(nnx.state(nnx.merge(model_def, state["model"]), nnx.Param)))
    tokens = jax.ShapeDtypeStruct((2, cfg.seq_len + 1), np.int32)
    return train_step.lower(model_def, opt_def, state, tokens, 0, 0, np.float32(1e-3), measure).as_text(), params


def _step_ops(measure: bool) -> "collections.Counter[str]":
    """StableHLO op counts of `_lowered_step(measure)`."""
    import collections
    import re

    return collections.Counter(re.findall(r"= \"?(stablehlo\.\w+)", _lowered_step(measure)[0]))


@pytest.mark.slow
def test_the_step_donates_the_state_it_updates(monkeypatch):
    """The weights and both Adam moments are updated in place (their buffers become the next state's),
    on the CPU program and on the two programs of a GPU."""
    import jax

    programs = []
    for backend, measure in (("cpu", True), ("gpu", True), ("gpu", False)):  # a GPU's logged and unlogged
        monkeypatch.setattr(jax, "default_backend", lambda backend=backend: backend)
        text, params = _lowered_step(measure)
        assert text.count("tf.aliasing_output") >= 3 * params, (backend, measure)  # weights, mu, nu
        programs.append(text)
    assert len(set(programs)) == 3


@pytest.mark.slow
def test_the_step_hashes_its_graph_definitions_once_per_run_and_equal_ones_share_a_compile(monkeypatch):
    """jax.jit hashes static arguments at every call, and hashing an nnx graph definition walks the
    graph; the step looks a run's definitions up by identity instead. Two equal definitions (two runs
    of one shape and recipe structure) still share one compiled step."""
    from flax import nnx

    from scaling.numerics import precision

    cfg = ladder.ModelConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, vocab=64, seq_len=16)
    train_step, eval_loss, init = step_lib.compiled()
    tx = step_lib.optimizer_tx(1.0, 0.1)
    recipe = precision.get("bf16")
    model_def, opt_def = nnx.eval_shape(lambda: step_lib.graph_defs(cfg, recipe, tx, 0))
    tokens = np.zeros((2, cfg.seq_len + 1), np.int32)
    state = init(cfg, recipe, tx, 0)
    state, *_ = train_step(model_def, opt_def, state, tokens, 0, 0, np.float32(1e-3), False)
    eval_loss(model_def, state["model"], tokens)
    hashes = []
    for graph_def in (model_def, opt_def):
        real = type(graph_def).__hash__
        monkeypatch.setattr(type(graph_def), "__hash__", lambda self, real=real: hashes.append(1) or real(self))
    for step in range(1, 4):
        state, *_ = train_step(model_def, opt_def, state, tokens, 0, step, np.float32(1e-3), False)
        eval_loss(model_def, state["model"], tokens)
    assert hashes == []
    monkeypatch.undo()
    # a second run's definitions: other objects, equal, so the same Static and no new trace
    again = nnx.eval_shape(lambda: step_lib.graph_defs(cfg, recipe, tx, 1))
    assert again[0] is not model_def and again == (model_def, opt_def)
    traced = []
    real_update = step_lib._update
    monkeypatch.setattr(step_lib, "_update", lambda *a: traced.append(1) or real_update(*a))
    train_step(*again, state, tokens, 0, 4, np.float32(1e-3), False)
    assert traced == []


@pytest.mark.slow
def test_an_unlogged_step_on_a_gpu_computes_no_telemetry(monkeypatch):
    """Off a CPU the host picks the logged or the unlogged program (no conditional for XLA:GPU to
    read on the host, no telemetry computed and masked): the unlogged one is smaller by the
    telemetry of every quantised operand, and sorts nothing (the block amax median is telemetry).
    Neither program scatters more than the embedding and the cross-entropy need."""
    import jax

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    unlogged, logged = _step_ops(False), _step_ops(True)
    for ops in (unlogged, logged):
        assert ops["stablehlo.case"] == ops["stablehlo.if"] == 0
    assert sum(unlogged.values()) < 0.9 * sum(logged.values()), (sum(unlogged.values()), sum(logged.values()))
    assert unlogged["stablehlo.log"] < logged["stablehlo.log"]  # the SNR in dB: telemetry only
    assert unlogged["stablehlo.sort"] == 0 < logged["stablehlo.sort"]
    # scatters (atomics on a GPU, or serial under deterministic ops): the embedding's and the
    # cross-entropy's backward only
    assert unlogged["stablehlo.scatter"] == logged["stablehlo.scatter"] == 2


@pytest.mark.slow
@pytest.mark.skipif(__import__("jax").default_backend() != "cpu", reason="a CPU's program")
def test_on_a_cpu_one_program_serves_logged_and_unlogged_steps():
    """XLA:CPU runs only the branch taken: one compile, the telemetry a runtime condition."""
    unlogged, logged = _step_ops(False), _step_ops(True)
    assert unlogged == logged and unlogged["stablehlo.case"] + unlogged["stablehlo.if"] > 0
