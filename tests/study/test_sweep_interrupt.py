"""Ctrl-C stops a sweep: no run starts after it, the runs in flight checkpoint and stop without
landing, one line gives the command that resumes, exit 130, no traceback; a second Ctrl-C kills the
runs at once. The rerun resumes each run where it stopped."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scaling.study.sweeps import results, sweep

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "experiments" / "smoke_sweep.toml"
pytestmark = pytest.mark.slow


def _experiment(tmp_path: Path) -> Path:
    """Three seeds of one shape (one take-off probe), 400 steps each (seconds), checkpoints every 100: a
    Ctrl-C lands within a few steps of the logged loss it waits for (step 16 of 1,600 when each run had
    1,600 and the rerun trained them all again, 29 s of the test's 40)."""
    path = tmp_path / "seeds.toml"
    path.write_text(SMOKE.read_text().replace("tokens = 10_240", "tokens = 102_400")
                    .replace("checkpoint_every = 10", "checkpoint_every = 100").replace("log_every = 5", "log_every = 20")
                    .replace('precision = ["fp32", "fp8", "fp4"]', "seed = [0, 1, 2]"))
    return path


def _events(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def _ctrl_c(argv: list[str], sweep_dir: Path, presses: int, after: str) -> subprocess.CompletedProcess:
    """Start `argv` as a terminal would (its own process group) and, once a run has logged a record
    with the key `after`, press Ctrl-C `presses` times (SIGINT to the whole group)."""
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 600
    while not any(after in r or r.get("event") == after for d in sweep_dir.glob("*") for r in _events(d)):
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail("no run logged a step: " + proc.communicate()[1][-2000:])
        time.sleep(0.2)
    for press in range(presses):
        if press:
            time.sleep(0.3)  # two presses, not one signal the kernel merges
        os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def _resume_command(done: subprocess.CompletedProcess) -> list[str]:
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "resume with: " in line]
    assert len(lines) == 1, done.stdout + done.stderr
    return shlex.split(lines[0].split("resume with: ", 1)[1])


def test_ctrl_c_stops_a_sweep_checkpoints_its_runs_and_the_rerun_resumes_them(tmp_path):
    experiment, out = _experiment(tmp_path), tmp_path / "out"
    sweep_dir = out / "smoke_sweep"
    argv = [sys.executable, "-m", "scaling.cli", "sweep", str(experiment), "--out", str(out), "--workers", "2",
            "--no-progress"]
    stopped = _ctrl_c(argv, sweep_dir, presses=1, after="loss")
    said = stopped.stdout + stopped.stderr
    assert stopped.returncode == 130, said
    assert "Traceback" not in said
    command = _resume_command(stopped)
    assert command == ["scaling", "sweep", str(experiment), "--out", str(out), "--workers", "2", "--no-progress"]

    started = [d for d in sweep_dir.iterdir() if (d / "config.json").is_file()]
    assert len(started) == 2  # the two workers' runs were in flight; the queued third never started
    assert json.loads((sweep_dir / "sweep.json").read_text())["counts"]["not started"] == 1
    assert not list(sweep_dir.glob("*/failure.json")) and not list(sweep_dir.glob("*/summary.json"))
    stopped_at = {}
    for run_dir in started:  # each stopped between two steps and logged it
        (event,) = [e for e in _events(run_dir) if e.get("event") == "interrupted"]
        if event["step"]:  # it had trained: checkpointed at the step it stopped at
            stopped_at[run_dir] = event["step"]
            assert (run_dir / "checkpoints" / str(event["step"])).is_dir()
        else:  # stopped before its first step (the second worker's run can be): nothing to keep
            assert not list(run_dir.glob("checkpoints/[0-9]*"))
    assert stopped_at  # the run that had logged a loss stopped mid-training

    # a second sweep: two presses kill its runs at once; still one line, exit 130, no traceback
    killed = _ctrl_c(argv, sweep_dir, presses=2, after="resumed")
    assert killed.returncode == 130 and "Traceback" not in killed.stdout + killed.stderr
    assert _resume_command(killed) == command
    assert not list(sweep_dir.glob("*/failure.json"))

    rerun = subprocess.run([sys.executable, "-m", "scaling.cli", *command[1:]], cwd=ROOT, capture_output=True,
                           text=True, timeout=900)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    df = results.load(sweep_dir)
    assert df.run_id.nunique() == 3 and (df.status == "ok").all() and not df.duplicated(["run_id", "D"]).any()
    for run_dir, step in stopped_at.items():  # nothing lost: the next attempt resumed at the step it stopped at
        resumed = [e["step"] for e in _events(run_dir) if e.get("event") == "resumed"]
        assert resumed and resumed[0] == step


def test_a_second_ctrl_c_kills_the_runs_in_flight():
    """The first press asks a child to stop (SIGINT); one that does not stop is killed by the second."""
    stop = sweep._Stop()
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, "
                              "signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        stop.started(child)
        stop.handle(signal.SIGINT, None)
        assert stop.requested.is_set() and not stop.at_once
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=0.5)  # asked, not made, to stop
        stop.handle(signal.SIGINT, None)
        assert stop.at_once and child.wait(timeout=60) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()


def test_ctrl_c_stops_a_single_run_at_its_next_step_and_says_how_to_resume(tmp_path):
    """`scaling train` showed a KeyboardInterrupt traceback on Ctrl-C and saved nothing since its last
    checkpoint: it now checkpoints at its next step, prints one line with the command that resumes, exits 130."""
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "scaling.cli", "train", str(ROOT / "experiments" / "smoke.toml"),
            "--set", "train.tokens=409600", "--set", "train.log_every=20", "--out", str(run_dir)]
    stopped = _ctrl_c(argv, tmp_path, presses=1, after="loss")
    said = stopped.stdout + stopped.stderr
    assert stopped.returncode == 130 and "Traceback" not in said, said
    assert _resume_command(stopped) == ["scaling", "train", str(ROOT / "experiments" / "smoke.toml"), "--set",
                                        "train.tokens=409600", "--set", "train.log_every=20", "--out", str(run_dir)]
    (event,) = [e for e in _events(run_dir) if e.get("event") == "interrupted"]
    assert not (run_dir / "summary.json").exists() and (run_dir / "checkpoints" / str(event["step"])).is_dir()
