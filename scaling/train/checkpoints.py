"""A run's Orbax checkpoints: saving, restoring the newest one that reads back, setting aside one that
does not, and a full disk said in one line.

A run keeps its latest KEEP_CHECKPOINTS checkpoints in DIR/checkpoints/<step>/ (the training state's
arrays and the loop's progress record as JSON), written synchronously at `train.checkpoint_every`.
A checkpoint that does not read back (any error: unreadable metadata, a truncated or missing file, a
shape that no longer fits) is moved to DIR/bad_checkpoints/ with one line naming it, kept for
inspection, and the next older one is tried. A save that meets a full disk raises DiskFull naming the
last good checkpoint, which stays intact.

Orbax's own noise about a checkpoint already named in one line is kept off the user's screen: its
absl error logs are silenced for the call (`quiet_orbax`), and the reads a failed restore abandons
are never printed (`drop_abandoned_reads`, a process-wide `sys.unraisablehook`). The training loop
(scaling.train.loop) decides when to save and restore; this module is how.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import itertools
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp

KEEP_CHECKPOINTS = 2
BAD_CHECKPOINTS = "bad_checkpoints"  # checkpoints that did not read back, kept for inspection


class DiskFull(Exception):
    """A checkpoint could not be written for want of space; the message names the last good one."""


def disk_full(error: BaseException) -> bool:
    """Whether `error` (or an exception it was raised from) is the disk running out of space or quota."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, DiskFull) or (isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)):
            return True
        if "No space left on device" in str(error):  # TensorStore's errors carry the OS's words, not its errno
            return True
        error = error.__cause__ or error.__context__
    return False


@contextlib.contextmanager
def quiet_orbax():
    """Orbax logs its own errors through absl ("ERROR:absl:..." on stderr) about a checkpoint we already
    name in one line (a save or a restore that failed): silenced for the call only, the level put back."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


def _abandoned_read(unraisable) -> bool:
    """Whether an exception Python can only print comes from a read a failed restore abandoned."""
    error = unraisable.exc_value
    return (isinstance(error.__cause__, GeneratorExit)  # a pending read closed when collected
            or (unraisable.object is None and isinstance(error, RuntimeError)  # a read in flight calling back
                and str(error) == "Event loop is closed"))


def drop_abandoned_reads() -> None:
    """Never print what a failed restore leaves behind. Orbax runs a restore's reads as tasks of an
    event loop it closes as soon as one read fails (orbax asyncio_utils.run_sync), the others still
    pending or in flight in TensorStore: a read in flight calls back into the closed loop ("Event
    loop is closed", from a TensorStore thread, at once), and each pending read catches
    BaseException, so when Python closes it the GeneratorExit becomes an exception it can only print
    ("Exception ignored in", a TensorStore spec per array), at any later point of the process. The
    checkpoint is named in one line instead. Installed once per process, before the first restore,
    over whatever hook is in place; every other unraisable exception goes on to it."""
    if not getattr(sys.unraisablehook, "drops_abandoned_reads", False):
        previous = sys.unraisablehook

        def hook(unraisable):
            if not _abandoned_read(unraisable):
                previous(unraisable)

        hook.drops_abandoned_reads = True
        sys.unraisablehook = hook


def abstract(state):
    """The shapes and dtypes (and shardings) of `state`: what a restore reads into."""
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, state)


class Checkpoints:
    """One run directory's checkpoints (DIR/checkpoints/): each holds the training state and a
    progress record (a JSON-able dict whose `step` is the checkpoint's). `echo` says, in one line,
    which checkpoint was set aside and why."""

    def __init__(self, out_dir: Path, echo: Callable[[str], None]):
        self.out_dir, self.folder, self.echo = out_dir, out_dir / "checkpoints", echo
        self.manager = self._manager()

    def _manager(self) -> ocp.CheckpointManager:
        options = ocp.CheckpointManagerOptions(max_to_keep=KEEP_CHECKPOINTS, enable_async_checkpointing=False)
        with quiet_orbax():  # it reads every step's metadata: a bad one is named by restore, once
            return ocp.CheckpointManager(self.folder.absolute(), options=options)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, progress: dict) -> None:
        """Checkpoint `state` and `progress` at `step`; DiskFull (naming the last good one) for want of space."""
        try:
            with quiet_orbax():
                self.manager.save(step, args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state), progress=ocp.args.JsonSave(progress)))
        except Exception as error:
            if not disk_full(error):
                raise
            folder = self.folder
            good = [int(p.name) for p in folder.iterdir() if p.name.isdigit() and int(p.name) != step] if folder.is_dir() else []
            raise DiskFull(f"no space left on the disk for the checkpoint at step {step}; "
                           + (f"the last good one (step {max(good)}) is intact: free space and train it again to resume there"
                              if good else "there is no earlier one: training it again starts over")) from error

    def restore(self, abstract_state, read_progress: Callable[[dict], Any]) -> tuple[Any, Any, list[int]]:
        """The newest checkpoint that reads back: (state, read_progress(its record), the steps set
        aside), or (None, None, the steps set aside) when none does. One that does not (any error,
        `read_progress`'s and a record whose `.step` is not the checkpoint's included) is set aside in
        DIR/bad_checkpoints/ with one line naming it, and the next older one is tried."""
        set_aside = []
        with quiet_orbax():
            steps = sorted(self.manager.all_steps(), reverse=True)
        if steps:
            drop_abandoned_reads()
        for step in steps:
            if set_aside:  # the read before failed: collect what it left behind, once its error is gone
                gc.collect()
            try:
                with quiet_orbax():  # a checkpoint that does not read back is ours to name, once
                    restored = self.manager.restore(step, args=ocp.args.Composite(
                        state=ocp.args.StandardRestore(abstract_state), progress=ocp.args.JsonRestore()))
                progress = read_progress(restored.progress)
                if progress.step != step:
                    raise ValueError(f"its progress record is for step {progress.step}")
            except Exception as error:  # noqa: BLE001 - whatever went wrong, an older checkpoint may read back
                self._set_aside(step, error)
                set_aside.append(step)
                continue
            return restored.state, progress, set_aside
        if set_aside:
            gc.collect()
        return None, None, set_aside

    def _set_aside(self, step: int, error: Exception) -> None:
        """Move checkpoint `step` out of the manager's sight (kept, not deleted) and say why."""
        bad = self.out_dir / BAD_CHECKPOINTS
        bad.mkdir(exist_ok=True)
        target = bad / str(step)
        for n in itertools.count(1):  # a step set aside before (an earlier attempt) keeps its copy
            if not target.exists():
                break
            target = bad / f"{step}.{n}"
        os.replace(self.folder / str(step), target)
        self.manager.close()  # a fresh manager: nothing of the failed read lingers in the old one
        self.manager = self._manager()
        reason = " ".join(f"{type(error).__name__}: {error}".split())
        self.echo(f"checkpoint at step {step} does not read back ({reason[:160]}); moved to {target}")
