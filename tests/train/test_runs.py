"""Run directories: the per-run lock (exclusive across processes, gone with its holder), landed or
not, landing a failure."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scaling.train import runs
from scaling._io import append_jsonl, atomic_write_json
from scaling.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def python(code: str, *args, **kw) -> subprocess.Popen:
    """A child interpreter running `code` (stdout piped, line by line)."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)}, **kw)


TRY_LOCK = """
    import sys
    from scaling.train import runs
    try:
        runs.acquire(sys.argv[1]).release()
    except runs.RunOwned as e:
        print(e)
        sys.exit(3)
"""


def test_lock_is_exclusive_across_processes(tmp_path):
    with runs.acquire(tmp_path / "run"):
        child = python(TRY_LOCK, tmp_path / "run")
        out, _ = child.communicate(timeout=60)
        assert child.returncode == 3
        assert out.count("\n") == 1 and f"pid {os.getpid()}" in out and "no other process is training" in out
        with pytest.raises(runs.RunOwned):  # another open of the lock file, even in this process
            runs.acquire(tmp_path / "run")
    child = python(TRY_LOCK, tmp_path / "run")
    assert child.wait(timeout=60) == 0
    assert (tmp_path / "run" / runs.LOCK_FILE).read_text() == ""  # released: no holder named


def test_sigkill_releases_the_lock(tmp_path):
    holder = python("""
        import sys, time
        from scaling.train import runs
        lock = runs.acquire(sys.argv[1])
        print("locked", flush=True)
        time.sleep(120)
    """, tmp_path / "run")
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(runs.RunOwned, match=f"pid {holder.pid} "):
            runs.acquire(tmp_path / "run")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    runs.acquire(tmp_path / "run").release()  # the kernel let go of the dead holder's lock


def test_inherited_lock_lives_while_parent_or_child_does(tmp_path):
    lock = runs.acquire(tmp_path / "run")
    child = python("""
        import sys
        from scaling.train import runs
        with runs.inherit(sys.argv[1], int(sys.argv[2])):
            print("inherited", flush=True)
            sys.stdin.readline()
    """, tmp_path / "run", lock.fd, pass_fds=(lock.fd,), stdin=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == "inherited"
        lock.release()
        with pytest.raises(runs.RunOwned):  # the child still holds it
            runs.acquire(tmp_path / "run")
    finally:
        child.stdin.close()
        child.wait(timeout=60)
    runs.acquire(tmp_path / "run").release()
    with pytest.raises(RuntimeError, match="not the lock"):
        with open(tmp_path / "other", "w") as f:
            runs.inherit(tmp_path / "run", f.fileno())


def test_finished_is_a_landed_ok_or_diverged_run_of_this_config(tmp_path):
    from scaling.train import config

    seed0, seed1 = config.validate({"seed": 0}), config.validate({"seed": 1})
    run = tmp_path / "run"
    assert runs.finished(run, seed0) is None  # no directory yet
    runs.acquire(run).release()
    assert runs.finished(run, seed0) is None  # only the lock file: still empty
    (run / ".config.json.x1.tmp").write_text("{")  # another process's config.json being written
    assert runs.finished(run, seed0) is None
    (run / ".config.json.x1.tmp").unlink()
    (run / "stray.txt").write_text("x")
    with pytest.raises(ConfigError, match="--out.*a new or empty directory"):
        runs.finished(run, seed0)
    (run / "stray.txt").unlink()
    runs.begin(run, seed0)
    with pytest.raises(ConfigError, match="--out"):
        runs.finished(run, seed1)
    assert runs.finished(run, seed0.replace(**{"data.fingerprint": "0123456789ab"})) is None  # pinned later: the same run
    for status, done in [("failed", False), ("hung", False), ("diverged", True), ("ok", True)]:
        runs.land(run, {"status": status})
        assert (runs.finished(run) is not None) == done and runs.summary(run)["status"] == status
    runs.begin(run, seed0)  # a retry lands afresh
    assert runs.summary(run) is None and runs.finished(run) is None


def test_land_failure_from_what_a_dead_run_logged(tmp_path):
    from scaling.train import config

    run = tmp_path / "sw" / "abc"
    runs.begin(run, config.validate({"seed": 0}))
    (run / "checkpoints" / "10").mkdir(parents=True)
    for step, loss in [(5, 3.0), (10, float("nan"))]:
        append_jsonl(run / "metrics.jsonl", {"step": step, "loss": loss, "telemetry": {"weight": {"amax": step}}})
    landed = runs.land_failure(run, config={"seed": 0}, status="hung", reason="no progress",
                               **runs.last_logged(run), log_tail="Traceback: stuck")
    assert landed == {"status": "hung", "reason": "no progress", "run_id": "abc", "step": 10, "evals": []}
    assert runs.summary(run) == landed and runs.finished(run) is None
    failure = json.loads((run / runs.FAILURE_FILE).read_text())
    assert failure["last_losses"] == [3.0, "nan"] and failure["telemetry"] == {"weight": {"amax": 10}}
    assert failure["traceback"] == "Traceback: stuck" and failure["config"] == {"seed": 0}
    assert (run / "checkpoints").is_dir()  # a failed or hung run is retried: it resumes from them
    # a run that could land itself: its full summary; diverged is for good, so no more checkpoints
    full = {"status": "diverged", "reason": "spike", "val_loss": 9.0, "evals": []}
    try:
        raise FloatingPointError("spike")
    except FloatingPointError as error:
        assert runs.land_failure(run, config={"seed": 0}, status="diverged", reason="spike", step=3,
                                 last_losses=[1.0], telemetry={}, error=error, landed=full) == full
    assert "FloatingPointError: spike" in json.loads((run / runs.FAILURE_FILE).read_text())["traceback"]
    assert runs.finished(run) == full and not (run / "checkpoints").exists()


@pytest.mark.slow
def test_train_refuses_a_run_another_process_is_training(tmp_path):
    from scaling.train import config, loop as train

    cfg = config.validate({"name": "t", "model": {"size": 1, "seq_len": 32},
                           "data": {"source": "synthetic", "eval_tokens": 256},
                           "train": {"tokens": 2560, "batch_size": 8}})
    run = tmp_path / "run"
    atomic_write_json(run / "config.json", cfg.to_dict())  # what a sweep writes once it holds the lock
    with runs.acquire(run):
        before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}
        with pytest.raises(runs.RunOwned) as refused:
            train.run(cfg, run)
        assert {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == before  # nothing written
    message = str(refused.value)
    assert message.startswith(f"--out: got '{run}'; allowed: a run directory no other process is training")
    assert "\n" not in message and f"pid {os.getpid()}" in message


def test_a_config_json_written_before_a_knob_was_removed_is_the_same_run(tmp_path):
    from scaling.train import config

    cfg = config.validate({"name": "t", "data": {"source": "synthetic"}})
    old = cfg.to_dict()
    old["train"]["eval_every"] = 0  # every config.json had it until the knob went
    atomic_write_json(tmp_path / "config.json", old)
    assert runs.finished(tmp_path, cfg) is None  # same run, not landed: no refusal
    old["train"]["eval_every"] = 5  # a run that did use it is another run
    atomic_write_json(tmp_path / "config.json", old)
    with pytest.raises(ConfigError, match="--out"):
        runs.finished(tmp_path, cfg)
