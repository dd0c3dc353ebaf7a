"""Run directories: who owns one, whether it has landed, and how it lands.

A run directory holds config.json, metrics.jsonl, checkpoints/ while it trains, and, once it has
landed, summary.json (written atomically and last: its presence *is* landing) plus failure.json if
it did not end `ok`. Landed `ok` or `diverged` runs are done; `failed` and `hung` ones are retried.

One run, one owner: whoever trains a run holds an exclusive lock on <run_dir>/.lock from before it
decides the run needs training until the run has landed, so two sweeps (or a sweep and `scaling
train`) never train the same run at once. The lock is an OS file lock (flock), which the kernel
releases when its holder dies, SIGKILL included: there are no stale locks to clean up. The file
holds the holder's pid and host, for messages only. A sweep's watched child inherits its parent's
lock (the same open file), so the lock lives while either of them does.

Assumption: every process that may train a run sees the same lock. That holds on a local disk and
on NFS (Linux emulates flock with NFS byte-range locks; a dead client's locks are freed when its
lease expires); on filesystems without flock support (Lustre without `-o flock`) two hosts would
not see each other's locks.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import time
from pathlib import Path

from scaling.train import config as config_lib
from scaling.train import health
from scaling._io import atomic_write_json, read_jsonl
from scaling.errors import ConfigError

LOCK_FILE = ".lock"
SUMMARY_FILE = "summary.json"
FAILURE_FILE = "failure.json"
DONE = ("ok", "diverged")  # landed for good; `failed` and `hung` runs are retried
STATUSES = ("ok", "diverged", "failed", "hung")


# ---------------------------------------------------------------- ownership


class RunOwned(ConfigError):
    """Another process holds the run's lock: it is training there."""

    def __init__(self, run_dir: Path, holder: str):
        self.run_dir, self.holder = run_dir, holder
        super().__init__("--out", str(run_dir),
                         f"a run directory no other process is training ({holder} holds {run_dir / LOCK_FILE})")


class Lock:
    """An exclusive lock on a run directory, held until release() (or until its holder dies)."""

    def __init__(self, run_dir: Path, fd: int, inherited: bool = False):
        self.run_dir, self.fd, self.inherited = run_dir, fd, inherited

    def release(self) -> None:
        if self.fd < 0:
            return
        if not self.inherited:  # the holder's note goes with it; a child leaves its parent's note
            os.ftruncate(self.fd, 0)
        # Closing, not LOCK_UN: an unlock would free the lock for every process sharing this open
        # file (a parent and its child); closing frees it only when the last of them lets go.
        os.close(self.fd)
        self.fd = -1

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def acquire(run_dir: str | Path, *, wait: bool = False, poll_s: float = 1.0) -> Lock:
    """Take the run's lock (creating the directory). If another process holds it, raise RunOwned,
    or with `wait` poll until it is free (its holder landed the run, or died)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not wait:
                    raise RunOwned(run_dir, _holder(fd)) from None
                time.sleep(poll_s)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return Lock(run_dir, fd)


def inherit(run_dir: str | Path, fd: int) -> Lock:
    """The lock a parent passed down (subprocess pass_fds), checked to be this run's and held."""
    run_dir = Path(run_dir)
    ours, theirs = os.fstat(fd), os.stat(run_dir / LOCK_FILE)
    if (ours.st_dev, ours.st_ino) != (theirs.st_dev, theirs.st_ino):
        raise RuntimeError(f"file descriptor {fd} is not the lock of {run_dir}")
    # On the open file that holds the lock this succeeds at once; on any other it would fail.
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return Lock(run_dir, fd, inherited=True)


def _holder(fd: int) -> str:
    note = os.pread(fd, 200, 0).decode(errors="replace").strip()
    return note or "another process"


# ---------------------------------------------------------------- landed or not


def summary(run_dir: str | Path) -> dict | None:
    """What the run landed with (summary.json, any status), or None while it has not landed."""
    try:
        return json.loads((Path(run_dir) / SUMMARY_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _resolved(stored: dict) -> config_lib.RunConfig | None:
    """A config.json as today's schema resolves it (a key added since compares equal); None if invalid."""
    try:
        return config_lib.validate(config_lib.upgrade(stored))
    except ConfigError:
        return None


def finished(run_dir: str | Path, config: config_lib.RunConfig | None = None) -> dict | None:
    """The summary of a run landed for good (`ok` or `diverged`: not to be re-run), else None.

    With `config`, a directory holding another run is refused (it would mix two runs' logs): one
    whose config.json is another run id's, or one with other files and no config.json.
    """
    run_dir = Path(run_dir)
    if config is not None:
        config_file = run_dir / "config.json"
        if config_file.is_file():
            stored = _resolved(json.loads(config_file.read_text()))
            # the same run is the same run id: a check added later (data.fingerprint) is no other run
            mismatch = stored is None or stored.run_id != config.run_id
        else:
            # dot-files are the lock and another process's atomic writes in flight (.config.json.*.tmp)
            mismatch = run_dir.exists() and any(not p.name.startswith(".") for p in run_dir.iterdir())
        if mismatch:
            raise ConfigError("--out", str(run_dir), "a new or empty directory, or one holding a run of this config")
    landed = summary(run_dir)
    return landed if landed is not None and landed.get("status", "ok") in DONE else None


# ---------------------------------------------------------------- starting and landing (the owner only)


def begin(run_dir: str | Path, config: config_lib.RunConfig) -> None:
    """Start (or retry) a run: its config, and no summary or failure record of an earlier attempt."""
    run_dir = Path(run_dir)
    atomic_write_json(run_dir / "config.json", config.to_dict())
    (run_dir / SUMMARY_FILE).unlink(missing_ok=True)
    (run_dir / FAILURE_FILE).unlink(missing_ok=True)


def land(run_dir: str | Path, landed: dict) -> dict:
    """Write summary.json: the run has landed. A run landed for good drops its checkpoints
    (they exist to resume it, and it never will be)."""
    run_dir = Path(run_dir)
    atomic_write_json(run_dir / SUMMARY_FILE, landed)
    if landed.get("status") in DONE:
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    return landed


def has_checkpoint(run_dir: str | Path) -> bool:
    """Whether the run has a checkpoint to resume from (Orbax names one by its step once it is whole)."""
    checkpoints = Path(run_dir) / "checkpoints"
    return checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir())


def last_logged(run_dir: str | Path, n_losses: int = 10) -> dict:
    """The step, last losses and telemetry of a run's metrics.jsonl: all there is to say about a
    run whose process died or hung."""
    path = Path(run_dir) / "metrics.jsonl"
    metrics = read_jsonl(path) if path.exists() else []
    return {"step": max((r.get("step", 0) for r in metrics), default=0),
            "last_losses": [r["loss"] for r in metrics if "loss" in r][-n_losses:],
            "telemetry": metrics[-1].get("telemetry", {}) if metrics else {}}


def land_failure(run_dir: str | Path, *, config: dict, status: str, reason: str, step: int,
                 last_losses: list[float], telemetry: dict, error: BaseException | None = None,
                 log_tail: str = "", landed: dict | None = None, run_id: str | None = None) -> dict:
    """Land a run that did not end `ok`: failure.json (health.failure_record), then summary.json.

    `landed` is the full summary when the run could write one; otherwise a minimal summary lands
    (status, reason, step, no evals), naming the run `run_id` (default: its directory's name).
    `log_tail` is the traceback of a run that died in another process (its log, not an exception).
    """
    run_dir = Path(run_dir)
    record = health.failure_record(config=config, status=status, step=step, reason=reason,
                                   last_losses=last_losses, telemetry=telemetry, error=error)
    if log_tail:
        record["traceback"] = log_tail
    atomic_write_json(run_dir / FAILURE_FILE, record)
    if landed is None:
        landed = {"status": status, "reason": reason, "run_id": run_id or run_dir.name, "step": step, "evals": []}
    return land(run_dir, landed)
