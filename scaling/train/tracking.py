"""Live curves: metrics.jsonl mirrored into TensorBoard and/or Weights & Biases (`train.tracker`).

metrics.jsonl stays the record (results, curves and resumes read it); a tracker mirrors its step
and evaluation records as scalars, at the record's training step:

    trunk step record        loss, lr, grad_norm, tokens_per_s, telemetry/<role>/<stat>
    cooldown step record     cooldown_<budget tokens>/loss, ... (one curve per WSD branch)
    evaluation at a budget   eval/val_loss, eval/train_loss

Nested telemetry becomes slash-separated tags, a list element's index the last part
(`telemetry/weight/block_amax/max`, `telemetry/act_max/0` for layer 0). Other records (resumed,
saturation events) are not mirrored. "tensorboard" writes event files to RUN_DIR/tensorboard/
(one per attempt; `tensorboard --logdir runs/`); "wandb" logs to a run with the run id as its
id, in RUN_DIR/wandb/, offline unless WANDB_MODE says otherwise (`wandb sync` uploads it).

Resume: a run resumed from its checkpoint at step S trains the steps after S again and logs them
again to metrics.jsonl (identically). Each curve is mirrored only past the last step it had in
metrics.jsonl when the attempt started, so no point is written twice; the mirror is flushed after
every record, so what metrics.jsonl held before a crash had been mirrored too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

STEP_KEYS = ("loss", "lr", "grad_norm", "tokens_per_s")
TRACKED_EVAL_KEYS = ("val_loss", "train_loss")


def scalars(record: dict) -> tuple[str, int, dict[str, float]] | None:
    """(curve, step, {tag: value}) for a metrics.jsonl record, or None if it is not mirrored."""
    if record.get("event") == "eval":
        return "eval", int(record["step"]), {f"eval/{k}": float(record[k]) for k in TRACKED_EVAL_KEYS}
    if "event" in record or "loss" not in record:
        return None
    curve = "trunk" if record["phase"] == "trunk" else f"cooldown_{record['budget']}"
    prefix = "" if curve == "trunk" else curve + "/"
    values = {k: float(record[k]) for k in STEP_KEYS}
    values.update(flatten(record.get("telemetry", {}), "telemetry"))
    return curve, int(record["step"]), {prefix + tag: value for tag, value in values.items()}


def flatten(tree: Any, prefix: str) -> dict[str, float]:
    """{'weight': {'amax': 2.0}, 'act_max': [1.0, 3.0]} -> {'<prefix>/weight/amax': 2.0,
    '<prefix>/act_max/0': 1.0, '<prefix>/act_max/1': 3.0}."""
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = enumerate(tree)
    else:
        return {prefix: float(tree)}
    return {tag: v for key, value in items for tag, v in flatten(value, f"{prefix}/{key}").items()}


def high_water(records: Iterable[dict]) -> dict[str, int]:
    """Each curve's last mirrored step, for the records a metrics.jsonl already holds."""
    marks: dict[str, int] = {}
    for record in records:
        point = scalars(record)
        if point is not None:
            marks[point[0]] = max(point[1], marks.get(point[0], point[1]))
    return marks


class Mirror:
    """The run's trackers behind one log() call; skips points at or before `marks` (resume)."""

    def __init__(self, trackers: list, marks: dict[str, int]):
        self.trackers, self.marks = trackers, dict(marks)

    def log(self, record: dict) -> None:
        point = scalars(record)
        if point is None or not self.trackers:
            return
        curve, step, values = point
        if step <= self.marks.get(curve, -1):
            return
        for tracker in self.trackers:
            tracker.write(step, values)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []


def open_mirror(cfg, run_dir: Path, records: Iterable[dict]) -> Mirror:
    """The trackers cfg.train.tracker names (cfg: a config.RunConfig) for the run in `run_dir`,
    past what `records` (its metrics so far) held."""
    opened = {"tensorboard": lambda: TensorBoard(run_dir / "tensorboard"),
              "wandb": lambda: Wandb(run_dir, cfg)}
    return Mirror([opened[name]() for name in cfg.train.tracker], high_water(records))


class TensorBoard:
    """Event files written by tensorboard's own writer (no TensorFlow needed)."""

    def __init__(self, log_dir: Path):
        from tensorboard.summary import Writer

        self.writer = Writer(str(log_dir))

    def write(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class Wandb:
    """One wandb run per run id (resumed by a later attempt), its x-axis the training step."""

    def __init__(self, run_dir: Path, cfg):
        import wandb

        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "scaling"), group=cfg.name,
                              name=f"{cfg.name}-{cfg.run_id}", id=cfg.run_id, resume="allow", dir=str(run_dir),
                              config=cfg.to_dict(), mode=os.environ.get("WANDB_MODE", "offline"))
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def write(self, step: int, values: dict[str, float]) -> None:
        self.run.log({"step": step, **values})

    def close(self) -> None:
        self.run.finish()
