"""A checkpoint that does not read back never loses the run: it is set aside and the next older one
restores (or, with none left, the run starts again from step 0), and the losses from there on are
an uninterrupted run's."""

import asyncio
import errno
import gc
import itertools
import os
import shutil
import sys
from pathlib import Path

import pytest

from scaling.train import loop as train

from test_train import fail_batch_at, losses, tiny

STEPS, EVERY, STOP = 40, 10, 35  # checkpoints at 10, 20, 30; the first attempt dies at step 35
CFG = tiny(STEPS, train={"checkpoint_every": EVERY, "log_every": 5})


def _garble(path: Path) -> None:
    path.write_bytes(os.urandom(7))  # a disk or copy fault: a few random bytes where the file was


def _files(root: Path, pattern: str) -> list[Path]:
    found = [p for p in root.rglob(pattern) if p.is_file()]
    assert found, f"no {pattern} under {root}: the checkpoint layout changed"
    return found


CORRUPTIONS = {
    # the JSON metadata: the checkpoint's, the progress record and the array store's tree
    "json": lambda ckpt: [_garble(p) for p in [ckpt / "_CHECKPOINT_METADATA", ckpt / "progress" / "metadata",
                                                 ckpt / "state" / "_METADATA"]],
    "manifest": lambda ckpt: [_garble(p) for p in _files(ckpt / "state", "manifest.ocdbt")],
    "array": lambda ckpt: [_garble(p) for p in _files(ckpt / "state" / "ocdbt.process_0" / "d", "*")],
    "missing": lambda ckpt: shutil.rmtree(ckpt / "state"),
    "every file": lambda ckpt: [_garble(p) for p in _files(ckpt, "*")],
}


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A run killed at step 35 with its checkpoints at 20 and 30 on disk, and the same run uninterrupted."""
    root = tmp_path_factory.mktemp("ckpt")
    with pytest.MonkeyPatch.context() as mp:
        fail_batch_at(mp, STOP, "node lost")
        with pytest.raises(RuntimeError, match="node lost"):
            train.run(CFG, root / "killed")
    assert sorted(int(p.name) for p in (root / "killed" / "checkpoints").iterdir() if p.name.isdigit()) == [20, 30]
    train.run(CFG, root / "whole")
    return root


def _resume(interrupted: Path, tmp_path: Path, corrupt: list[int], how) -> tuple[dict, Path, list[str]]:
    out = tmp_path / "run"
    shutil.copytree(interrupted / "killed", out)
    for step in corrupt:
        how(out / "checkpoints" / str(step))
    lines: list[str] = []
    return train.run(CFG, out, echo=lines.append), out, lines


def _after(run_dir: Path, step: int) -> dict:
    """The last logged loss of each (phase, step) after `step` (a resumed run logs some steps twice)."""
    return {(phase, s): loss for phase, s, loss in losses(run_dir) if s > step}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_a_corrupted_latest_checkpoint_falls_back_to_the_older_one(interrupted, tmp_path, kind):
    summary, out, lines = _resume(interrupted, tmp_path, [30], CORRUPTIONS[kind])
    assert summary["status"] == "ok"
    whole = train.run(CFG, interrupted / "whole")  # landed: read back, not trained
    assert summary["evals"] == whole["evals"] and summary["val_loss"] == whole["val_loss"]
    assert _after(out, 20) == _after(interrupted / "whole", 20)
    bad = [line for line in lines if "does not read back" in line]
    assert len(bad) == 1 and "checkpoint at step 30" in bad[0] and len(bad[0]) < 400
    assert "resumed from the checkpoint at step 20" in lines
    assert (out / train.BAD_CHECKPOINTS / "30").is_dir()  # set aside, not deleted
    assert not (out / "checkpoints").exists()  # the run landed: its checkpoints are gone


@pytest.mark.slow
def test_the_reads_a_failed_restore_abandons_print_nothing_later(interrupted, tmp_path, monkeypatch):
    """Orbax closes a restore's event loop at the first failed read, the other reads still pending
    (here: slowed down, as on a busy disk); collected later, each would print an exception with a
    TensorStore spec ("Exception ignored in") at some unrelated point of the run. The restore
    collects them itself, quietly: the bad checkpoint's one line is all a user sees."""
    from orbax.checkpoint._src.serialization import serialization

    real_read, calls = serialization._read_shard, itertools.count()

    async def slow_read(*args, **kwargs):
        if next(calls):  # every read but the first (which meets the garbled array)
            await asyncio.sleep(0.5)
        return await real_read(*args, **kwargs)

    monkeypatch.setattr(serialization, "_read_shard", slow_read)
    printed = []
    monkeypatch.setattr(sys, "unraisablehook", printed.append)
    summary, out, lines = _resume(interrupted, tmp_path, [30], CORRUPTIONS["array"])
    gc.collect()
    assert summary["status"] == "ok" and "resumed from the checkpoint at step 20" in lines
    assert [f"{u.object!r}: {u.exc_type.__name__}: {str(u.exc_value)[:80]} (cause: {u.exc_value.__cause__!r})"
            for u in printed] == []


@pytest.mark.slow
def test_no_checkpoint_reads_back_so_the_run_starts_again(interrupted, tmp_path):
    summary, out, lines = _resume(interrupted, tmp_path, [20, 30], CORRUPTIONS["every file"])
    assert summary["status"] == "ok"
    whole = train.run(CFG, interrupted / "whole")
    assert summary["evals"] == whole["evals"] and summary["val_loss"] == whole["val_loss"]
    assert _after(out, 0) == _after(interrupted / "whole", 0)
    assert [line.split(" does not")[0] for line in lines if "does not read back" in line] == [
        "checkpoint at step 30", "checkpoint at step 20"]
    assert "no checkpoint reads back: the run starts again from step 0" in lines
    assert sorted(p.name for p in (out / train.BAD_CHECKPOINTS).iterdir()) == ["20", "30"]


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.slow
@pytest.mark.parametrize("records_fit", [True, False], ids=["failure.json fits", "nothing fits"])
def test_a_full_disk_at_a_checkpoint_ends_the_run_in_one_line_and_keeps_the_last_good_one(tmp_path, monkeypatch,
                                                                                          capfd, records_fit):
    """The second checkpoint's save meets a full disk: one line names it and the last good checkpoint,
    failure.json is written where it still fits (else skipped, silently), nothing on stderr, no traceback;
    trained again, the run resumes from the first checkpoint and lands as an uninterrupted run would."""
    import orbax.checkpoint as ocp

    from scaling.train import runs

    cfg = tiny(30, train={"checkpoint_every": 10, "log_every": 5})
    real_save, saves = ocp.CheckpointManager.save, itertools.count(1)

    def save(self, *args, **kwargs):
        if next(saves) == 2:
            _enospc()
        return real_save(self, *args, **kwargs)

    lines: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ocp.CheckpointManager, "save", save)
        if not records_fit:  # the disk stays full for the failure record and the summary
            real_write = runs.atomic_write_json
            mp.setattr(runs, "atomic_write_json",
                       lambda path, obj: _enospc() if Path(path).name in ("failure.json", "summary.json") else real_write(path, obj))
        summary = train.run(cfg, tmp_path / "run", echo=lines.append)
    assert summary["status"] == "failed"
    failed = [line for line in lines if line.startswith("failed")]
    assert failed == [f"failed at step 20: DiskFull: no space left on the disk for the checkpoint at step 20; the last good "
                      "one (step 10) is intact: free space and train it again to resume there"]
    assert (tmp_path / "run" / "failure.json").exists() == records_fit
    assert (tmp_path / "run" / "summary.json").exists() == records_fit
    assert capfd.readouterr().err == ""
    lines.clear()
    again = train.run(cfg, tmp_path / "run", echo=lines.append)
    assert again["status"] == "ok" and "resumed from the checkpoint at step 10" in lines
    whole = train.run(cfg, tmp_path / "whole")
    assert again["val_loss"] == whole["val_loss"]


@pytest.mark.slow
def test_orbax_logs_nothing_beside_our_line_when_no_checkpoint_reads_back(interrupted, tmp_path, capfd):
    """Every checkpoint corrupt: the one line per checkpoint is ours; Orbax's own `ERROR:absl` lines
    about the same failed reads do not reach stderr, and absl's level is put back afterwards."""
    import logging

    level = logging.getLogger("absl").level
    # a user's program as the CLI runs: log records reach stderr ("ERROR:absl:..."), not pytest's capture
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(logging.Formatter(logging.BASIC_FORMAT))
    logging.getLogger().addHandler(stderr)
    capfd.readouterr()
    try:
        summary, out, lines = _resume(interrupted, tmp_path, [20, 30], CORRUPTIONS["every file"])
    finally:
        logging.getLogger().removeHandler(stderr)
    assert summary["status"] == "ok" and len([line for line in lines if "does not read back" in line]) == 2
    assert capfd.readouterr().err == ""
    assert logging.getLogger("absl").level == level
