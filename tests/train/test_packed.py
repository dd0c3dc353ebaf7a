"""Many runs, one program (scaling.train.step.packed): each member against its single run, over
members of different seed, batch, learning rate and format of one structure.

A member's state, losses and grad norms are its single run's bit for bit where the dots of both
programs sum in one order. XLA:CPU's YNNPACK fusions (on by default) sum a batched dot in another
order than the single dot, so the test trains in a child process with them off
(`--xla_cpu_experimental_ynn_fusion_type=`). With them on, last-bit differences in near-zero
gradients become weight differences of the order of the learning rate within a few Adam steps."""

import json
import os
import subprocess
import sys

import jax
import numpy as np

from scaling.numerics import precision
from scaling.train import step as step_lib
from scaling.train.ladder import ModelConfig

CFG = ModelConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, vocab=64, seq_len=16)
STEPS = 3


def _batch(seed: int, step: int):
    return np.random.default_rng([seed, step]).integers(0, CFG.vocab, (4, CFG.seq_len + 1), dtype=np.int32)


def compare(members) -> dict:
    """Train each member alone and all of them packed for STEPS steps: whether every loss (training and
    eval) is equal, the largest absolute difference of any state leaf, and the last step's losses."""
    tx = step_lib.optimizer_tx(1.0, 0.1)
    recipes = [precision.get(r) for r, _, _ in members]
    assert step_lib.packable(CFG, recipes, tx)
    model_def, opt_def = step_lib.graph_defs(CFG, recipes[0], tx, 0)
    single_step, single_eval, single_init = step_lib.compiled()
    want_losses, want_states, want_evals = [], [], []
    for recipe, (_, seed, lr) in zip(recipes, members):
        state, losses = single_init(CFG, recipe, tx, seed), []
        for t in range(STEPS):
            state, loss, _, _ = single_step(model_def, opt_def, state, _batch(seed, t), seed, t, np.float32(lr), False)
            losses.append(float(loss))
        want_losses.append(losses)
        want_states.append(state)
        want_evals.append(float(single_eval(model_def, state["model"], _batch(seed, 99))))

    train_step, eval_loss, init = step_lib.packed()
    seeds = np.array([s for _, s, _ in members], np.int32)
    lrs = np.array([lr for _, _, lr in members], np.float32)
    states = init(CFG, recipes, tx, seeds.tolist())
    got = []
    for t in range(STEPS):
        tokens = np.stack([_batch(int(s), t) for s in seeds])
        states, losses, norms, _ = train_step(model_def, opt_def, states, tokens, seeds, t, lrs, False)
        assert losses.shape == norms.shape == (len(members),)
        got.append(np.asarray(losses).tolist())
    evals = np.asarray(eval_loss(model_def, states["model"], np.stack([_batch(int(s), 99) for s in seeds]))).tolist()
    worst = 0.0
    for k in range(len(members)):
        for want, leaf in zip(jax.tree_util.tree_leaves(want_states[k]), jax.tree_util.tree_leaves(states)):
            a, b = np.asarray(want, np.float64), np.asarray(leaf, np.float64)[k]
            assert np.array_equal(np.isnan(a), np.isnan(b))
            worst = max(worst, float(np.nanmax(np.abs(a - b), initial=0.0)))
    return {"losses_equal": [[g[k] for g in got] for k in range(len(members))] == want_losses and evals == want_evals,
            "state_max_diff": worst, "last": got[-1]}


MEMBERS = {"mxfp6 and mxfp8": [("mxfp6", 1, 2e-3), ("mxfp8", 1, 2e-3)], "fp8 and fp6": [("fp8", 1, 1e-3), ("fp6", 2, 3e-3)], "bf16": [("bf16", 1, 1e-3), ("bf16", 2, 3e-3)]}
NO_YNN_FUSIONS = "--xla_cpu_experimental_ynn_fusion_type="


def test_each_member_of_a_packed_program_has_its_single_runs_state_and_losses_bit_for_bit():
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {NO_YNN_FUSIONS}".strip()}
    proc = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert list(out) == list(MEMBERS)
    for name, got in out.items():
        assert got["state_max_diff"] == 0.0 and got["losses_equal"], (name, got)
        assert len(set(got["last"])) == len(got["last"])  # the members did train differently


def test_recipes_of_different_structure_do_not_pack():
    tx = step_lib.optimizer_tx(1.0, 0.1)
    assert not step_lib.packable(CFG, [precision.get("fp8"), precision.get("mxfp6")], tx)


if __name__ == "__main__":  # the test's child: XLA_FLAGS are read once, when the backend starts
    print(json.dumps({name: compare(members) for name, members in MEMBERS.items()}))
