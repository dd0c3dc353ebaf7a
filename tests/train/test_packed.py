"""Many runs, one program (scaling.train.step.packed, scaling.train.loop.run_packed): each member
against its single run, over members of different seed, batch, learning rate and format of one
structure; as steps, and as runs (metrics, evaluations, divergence, a kill and its resume).

A member's state, losses and grad norms are its single run's bit for bit where the dots of both
programs sum in one order. XLA:CPU's YNNPACK fusions (on by default) sum a batched dot in another
order than the single dot, so the test trains in a child process with them off
(`--xla_cpu_experimental_ynn_fusion_type=`). With them on, last-bit differences in near-zero
gradients become weight differences of the order of the learning rate within a few Adam steps."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scaling.numerics import precision
from scaling.train import config, data, loop, runs
from scaling.train import step as step_lib
from scaling.train.ladder import ModelConfig

pytestmark = pytest.mark.slow  # its tests spawn processes that train, or train several models

CFG = ModelConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, vocab=64, seq_len=16)
STEPS = 3


def compare(members) -> float:
    """step.packing_difference of these (recipe, seed, lr) members over STEPS steps (0.0: bit for bit)."""
    tx = step_lib.optimizer_tx(1.0, 0.1)
    recipes = [precision.get(r) for r, _, _ in members]
    assert step_lib.packable(CFG, recipes, tx)
    return step_lib.packing_difference(CFG, recipes, tx, [s for _, s, _ in members], [lr for _, _, lr in members],
                                       batch_size=4, steps=STEPS)


MEMBERS = {"mxfp6 and mxfp8": [("mxfp6", 1, 2e-3), ("mxfp8", 1, 2e-3)], "fp8 and fp6": [("fp8", 1, 1e-3), ("fp6", 2, 3e-3)], "bf16": [("bf16", 1, 1e-3), ("bf16", 2, 3e-3)]}
NO_YNN_FUSIONS = "--xla_cpu_experimental_ynn_fusion_type="

# Runs: 24 steps of 8 x 32 tokens, WSD with a cooldown branch at half, checkpoints every 8 steps. The
# third member's learning rate diverges it within a few steps; its slot trains on, unread.
RUN = {"name": "p", "model": {"size": 1, "seq_len": 32}, "data": {"source": "synthetic", "eval_tokens": 512},
       "train": {"tokens": 8 * 32 * 24, "batch_size": 8, "warmup": 0.0, "log_every": 4, "checkpoint_every": 8,
                 "eval_at": [0.5, 1.0]}}
RUN_MEMBERS = [("fp8", 0, 1e-2), ("fp6", 1, 3e-3), ("fp8", 2, 1e3)]
KILLED_AT = 13  # drawing this step's batch fails: the checkpoint at 8 is where the members resume


def _logged(run_dir: Path) -> dict:
    """The last logged loss of each (phase, step), and the evaluations (a resumed run logs some steps twice)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"losses": sorted({(r["phase"], r["step"]): r["loss"] for r in records if "loss" in r}.items()),
            "evals": sorted({r["step"]: (r["val_loss"], r["train_loss"]) for r in records if r.get("event") == "eval"}.items())}


def compare_runs(root: Path) -> dict:
    """Each run trained alone, and all packed: killed at KILLED_AT and resumed packed; and resumed
    again from a copy in which one member's checkpoint is gone (the members cannot train in step)."""
    cfgs = [config.validate({**RUN, "precision": p, "seed": s, "train": {**RUN["train"], "lr": lr}})
            for p, s, lr in RUN_MEMBERS]
    single = [loop.run(c, root / "single" / c.run_id) for c in cfgs]
    packed_dirs = [root / "packed" / c.run_id for c in cfgs]
    real_batch = data.batch

    def batch(tokens, seed, step, *args):
        if step == KILLED_AT:
            raise RuntimeError("node lost")
        return real_batch(tokens, seed, step, *args)

    data.batch = batch
    try:
        loop.run_packed(cfgs, packed_dirs)
    except RuntimeError:
        pass
    finally:
        data.batch = real_batch
    killed = [json.loads((d / "summary.json").read_text())["status"] for d in packed_dirs]
    shutil.copytree(root / "packed", root / "unaligned")
    shutil.rmtree(root / "unaligned" / cfgs[0].run_id / "checkpoints" / "8")
    packed = loop.run_packed(cfgs, packed_dirs)
    lines: list[str] = []
    unaligned = loop.run_packed(cfgs, [root / "unaligned" / c.run_id for c in cfgs], echo=lines.append)
    return {"killed": killed,
            "single": [[s["status"], s["step"], s["val_loss"]] for s in single],
            "packed": [[s["status"], s["step"], s["val_loss"]] for s in packed],
            "unaligned": [[s["status"], s["step"], s["val_loss"]] for s in unaligned],
            "packed_with": [s.get("packed_with") for s in packed],
            "logged_equal": [_logged(root / "single" / c.run_id) == _logged(root / "packed" / c.run_id)
                             == _logged(root / "unaligned" / c.run_id) for c in cfgs[:2]],
            "resumed": [[r["step"] for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())
                         if r.get("event") == "resumed"] for d in packed_dirs],
            "unaligned_line": [line for line in lines if "different steps" in line]}


@pytest.fixture(scope="module")
def child(once_per_run):
    """The comparisons, in a child process with XLA:CPU's YNNPACK fusions off (XLA_FLAGS are read
    once, when the backend starts); once per pytest run, whichever xdist workers this module's tests land on."""
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {NO_YNN_FUSIONS}".strip()}

    def compare_in_a_child(root):
        proc = subprocess.run([sys.executable, __file__, str(root)], capture_output=True, text=True, env=env)
        return {"returncode": proc.returncode, "stderr": proc.stderr[-5000:], "stdout": proc.stdout}

    _, proc = once_per_run("packed-child", compare_in_a_child)
    assert proc["returncode"] == 0, proc["stderr"]
    return json.loads(proc["stdout"].splitlines()[-1])


def test_each_member_of_a_packed_program_has_its_single_runs_state_and_losses_bit_for_bit(child):
    assert child["steps"] == {name: 0.0 for name in MEMBERS}


def test_packed_runs_land_as_their_single_runs_through_divergence_a_kill_and_resume(child):
    runs = child["runs"]
    assert runs["single"][2][0] == "diverged" and [s[:2] for s in runs["single"][:2]] == [["ok", 24]] * 2
    assert runs["killed"] == ["failed", "failed", "diverged"]  # the diverged member landed before the kill
    assert runs["packed"] == runs["single"] and runs["unaligned"] == runs["single"]
    assert runs["logged_equal"] == [True, True]  # every logged loss and evaluation, bit for bit
    assert runs["resumed"][:2] == [[8], [8]]  # the two left resumed packed, from their checkpoints
    # with whom each last trained: the two resumed as a pair; the diverged one landed from the first three
    assert [len(p) for p in runs["packed_with"]] == [1, 1, 2] and runs["unaligned_line"]


def test_a_pack_refuses_a_run_another_process_is_training_and_writes_nothing(tmp_path):
    cfgs = [config.validate({**RUN, "precision": "fp8", "seed": s}) for s in (0, 1)]
    dirs = [tmp_path / c.run_id for c in cfgs]
    with runs.acquire(dirs[1]):  # another owner: a second open file on the lock conflicts, as another process's
        with pytest.raises(runs.RunOwned):
            loop.run_packed(cfgs, dirs)
    assert not any((d / "config.json").exists() for d in dirs)
    runs.acquire(dirs[0]).release()  # the lock the pack took on the first run was let go


def test_recipes_of_different_structure_do_not_pack():
    tx = step_lib.optimizer_tx(1.0, 0.1)
    assert not step_lib.packable(CFG, [precision.get("fp8"), precision.get("mxfp6")], tx)


def test_runs_pack_only_where_all_but_seed_learning_rate_and_formats_agree():
    base = config.validate({**RUN, "precision": "fp8"})
    assert loop.pack_key(base) == loop.pack_key(base.replace(**{"seed": 3, "train.lr": 0.1, "precision": "fp6"}))
    for other in ({"precision": "mxfp6"}, {"train.tokens": 8 * 32 * 16}, {"train.batch_size": 4}, {"model.size": 2}):
        assert loop.pack_key(base) != loop.pack_key(base.replace(**other)), other


if __name__ == "__main__":  # the tests' child
    print(json.dumps({"steps": {name: compare(members) for name, members in MEMBERS.items()},
                      "runs": compare_runs(Path(sys.argv[1]))}))
