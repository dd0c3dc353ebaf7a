"""One run's side of training, the same whether it trains alone or as a member of a packed program
(scaling.train.loop runs the program):

  Schedule      its steps, evaluation budgets and learning-rate shape (schedule_for, learning_rate: the
                formulas are scaling.train.loop's docstring)
  Setup         everything it needs, loaded and checked before anything is written (prepare)
  Progress      everything besides the arrays that resuming it needs (saved as JSON in each checkpoint)
  _Member       its side of a program: its health checks, metrics.jsonl, checkpoints and landing
  summarize     its summary.json, from its setup and progress record alone

Apart from scaling.train.loop, whose _Trainer drives the device program (the trunk, its cooldown branches,
evaluations and checkpoints in step for every member): what one run logs, checks, saves and lands does not
depend on how many runs share the program, and the summary a run lands with is read without the device
loop. loop imports this module and re-exports the names callers read there (schedule_for, learning_rate,
prepare, Setup, Progress, summarize); this module never imports loop.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from scaling.train import compute as compute_lib
from scaling.train import config as config_lib
from scaling.train import architectures, checkpoints, data, health, ladder, parallel, runs, tracking
from scaling.train.checkpoints import disk_full
from scaling.numerics import formats, gemm, precision
from scaling import host
from scaling._io import append_jsonl, atomic_write_json
from scaling.errors import ConfigError


# ---------------------------------------------------------------- the schedule: steps, budgets, learning rate


@dataclass(frozen=True)
class Budget:
    fraction: float
    end: int  # E_b: steps trained when this budget is evaluated
    cooldown_start: int  # C_b: where its cooldown leaves the trunk (WSD); unused by cosine


@dataclass(frozen=True)
class Schedule:
    """A run's steps, its evaluation budgets and its learning-rate shape (`kind`: wsd or cosine)."""

    steps: int
    tokens_per_step: int
    warmup_steps: int
    kind: str
    lr: float
    budgets: tuple[Budget, ...]

    @property
    def final(self) -> Budget:
        return self.budgets[-1]

    def tokens_trained(self) -> int:
        """Tokens through the optimiser: the trunk plus every cooldown branch."""
        branches = sum(b.end - b.cooldown_start for b in self.budgets[:-1])
        return (self.steps + branches) * self.tokens_per_step

    def tokens_separate_runs(self) -> int:
        """Tokens the same budgets would cost as separate runs."""
        return sum(b.end for b in self.budgets) * self.tokens_per_step


def schedule_for(cfg: config_lib.RunConfig) -> Schedule:
    train, steps = cfg.train, cfg.steps
    budgets = []
    for fraction in train.eval_at:
        end = round(fraction * steps)
        cooldown = max(1, round(train.decay * end)) if train.schedule == "wsd" else 0
        budgets.append(Budget(fraction, end, end - cooldown))
    warmup = train.warmup if train.warmup >= 1 else round(train.warmup * steps)
    return Schedule(steps=steps, tokens_per_step=cfg.tokens_per_step, warmup_steps=warmup,
                    kind=train.schedule, lr=train.lr, budgets=tuple(budgets))


def learning_rate(schedule: Schedule, step: int, budget: Budget) -> float:
    """The learning rate of training step `step` (0-based) on the way to `budget` (the formulas in
    scaling.train.loop's docstring)."""
    warm = min(1.0, (step + 1) / schedule.warmup_steps) if schedule.warmup_steps else 1.0
    if schedule.kind == "cosine":
        span = max(1, budget.end - schedule.warmup_steps)
        progress = min(1.0, max(0.0, (step - schedule.warmup_steps) / span))
        return schedule.lr * warm * 0.5 * (1.0 + math.cos(math.pi * progress))
    cool = min(1.0, (budget.end - step) / (budget.end - budget.cooldown_start))
    return schedule.lr * warm * cool


# ---------------------------------------------------------------- setup (everything that can be wrong)


@dataclass
class Setup:
    cfg: config_lib.RunConfig
    schedule: Schedule
    corpus: data.Corpus
    model_cfg: Any
    val_windows: np.ndarray
    train_windows: np.ndarray
    val_bytes: int | None  # bytes the windows' target tokens decode to (bits per byte); None: unknown
    train_bytes: int | None
    layout: parallel.Layout | None = None  # the run's devices ([parallel]); None: one device


def prepare(cfg: config_lib.RunConfig, *, fewer_devices: bool = False) -> Setup:
    """Load everything a run needs; raises ConfigError before anything is written. `fewer_devices`:
    the run may train on fewer devices than `parallel.data` (it resumes, or is a take-off probe)."""
    corpus = data.load(cfg.data.source, cfg.data.tokenizer)
    data.check_fingerprint(corpus, cfg.data.fingerprint)
    seq_len, eval_tokens = cfg.model.seq_len, cfg.data.eval_tokens
    if corpus.train.size < seq_len + 1:
        raise ConfigError("model.seq_len", seq_len, f"at most {corpus.train.size - 1} for this corpus")
    model_cfg = cfg.model.shape(corpus.vocab)
    val_windows = data.eval_windows(corpus.val, eval_tokens, seq_len)
    train_windows = data.train_sample(corpus.train, eval_tokens, seq_len)
    layout = parallel.layout_for(cfg.parallel.data, cfg.parallel.fsdp, cfg.train.batch_size, fewer=fewer_devices)
    return Setup(cfg=cfg, schedule=schedule_for(cfg), corpus=corpus, model_cfg=model_cfg, val_windows=val_windows, train_windows=train_windows,
                 val_bytes=data.target_bytes(val_windows, corpus.token_bytes),
                 train_bytes=data.target_bytes(train_windows, corpus.token_bytes), layout=layout)


# ---------------------------------------------------------------- a run's progress and its side of a program


@dataclass
class Progress:
    """Everything besides the arrays that a resumed run needs (saved as JSON in each checkpoint)."""

    step: int = 0  # trunk steps done
    evals: list[dict] = field(default_factory=list)  # one per finished budget
    recent_losses: list[float] = field(default_factory=list)  # the spike detector's window
    telemetry_sum: dict = field(default_factory=dict)  # summed over logged trunk steps
    telemetry_count: int = 0
    tokens_trained: int = 0  # trunk + branches
    timed_s: float = 0.0  # wall time of training steps after the first (compile) one
    timed_tokens: int = 0
    compile_s: float = 0.0
    eval_s: float = 0.0
    wall_s: float = 0.0  # over all attempts
    attempts: int = 0

    def tokens_per_s(self) -> float:
        """Training throughput, compile steps excluded."""
        return self.timed_tokens / self.timed_s if self.timed_s else 0.0


class _Member:
    """One run's side of a program: its progress, health checks, logs, checkpoints and summary."""

    def __init__(self, setup: Setup, out_dir: Path, echo: Callable[[str], None], index: int, packed: bool):
        self.setup, self.cfg, self.schedule, self.out_dir, self.index = setup, setup.cfg, setup.schedule, out_dir, index
        self.echo = (lambda line: echo(f"{self.cfg.run_id} {line}")) if packed else echo
        self.packed_with: list[str] = []  # the other members' run ids (summary)
        self.started = time.perf_counter()
        self.progress = Progress()
        self.last_telemetry: dict = {}
        self.last_losses: list[float] = []
        h = self.cfg.health
        self.monitor = health.LossMonitor(h.spike_factor, h.spike_window, self.schedule.warmup_steps)
        self.checkpoints = checkpoints.Checkpoints(out_dir, self.echo) if self.cfg.train.checkpoint_every else None
        self.primary = parallel.primary()  # writes metrics, summary and failure records
        self.metrics_file = out_dir / "metrics.jsonl"
        self.mirror = tracking.Mirror([], {})  # opened by _Trainer.train()
        self.landed: dict | None = None  # its summary, once it has landed

    # -- checkpoints

    def save(self, state) -> None:
        self.progress.wall_s += self._elapsed()
        self.progress.recent_losses = list(self.monitor.recent)
        self.checkpoints.save(self.progress.step, state, dataclasses.asdict(self.progress))

    def restore(self, abstract) -> tuple[Any, Progress, list[int]]:
        """The newest checkpoint that reads back: (state or None, its progress, the steps set aside).
        One that does not is set aside (scaling.train.checkpoints) and the next older one tried; with
        none left the run starts again from step 0 (`resumed` says so)."""
        if self.checkpoints is None:
            return None, Progress(), []
        state, progress, set_aside = self.checkpoints.restore(abstract, lambda record: Progress(**record))
        return state, progress if progress is not None else Progress(), set_aside

    def resumed(self, progress: Progress, set_aside: list[int]) -> None:
        """Take up a restored progress record (or none: step 0) and say where the run resumed."""
        if progress.step:
            self.progress = progress
            self.monitor.recent.extend(progress.recent_losses)
            self.log({"event": "resumed", "step": progress.step, "tokens": progress.step * self.schedule.tokens_per_step,
                      **({"set_aside": set_aside} if set_aside else {})})
            self.echo(f"resumed from the checkpoint at step {progress.step}")
        elif set_aside:
            self.log({"event": "restarted", "step": 0, "tokens": 0, "set_aside": set_aside})
            self.echo("no checkpoint reads back: the run starts again from step 0")

    def _elapsed(self) -> float:
        """Wall time since the last call (accumulated into progress.wall_s)."""
        now = time.perf_counter()
        elapsed, self.started = now - self.started, now
        return elapsed

    # -- what it logs

    def log(self, record: dict) -> None:
        if not self.primary:
            return
        append_jsonl(self.metrics_file, record)
        self.mirror.log(record)

    def check(self, steps: list[tuple[int, str]], losses: list[float]) -> None:
        """The health checks on the losses of these (step, phase)s, in order (health.RunStopped)."""
        for (step, phase), loss in zip(steps, losses):
            self.last_losses = (self.last_losses + [loss])[-20:]
            self.monitor.check(step, loss, trunk=phase == "trunk")

    def record_step(self, step: int, phase: str, budget: Budget, lr: float, loss: float, grad_norm: float,
                    telemetry: dict) -> None:
        done, schedule = step + 1, self.schedule
        self.last_telemetry = telemetry
        record = {"step": done, "tokens": done * schedule.tokens_per_step, "phase": phase, "loss": loss,
                  "lr": lr, "grad_norm": grad_norm, "tokens_per_s": self.progress.tokens_per_s(),
                  "telemetry": telemetry}
        if phase == "cooldown":
            record["budget"] = budget.end * schedule.tokens_per_step
        else:
            self.progress.telemetry_sum = _tree_add(self.progress.telemetry_sum, telemetry)
            self.progress.telemetry_count += 1
        self.log(record)
        for event in health.saturation_events(telemetry, self.cfg.health.max_saturation):
            self.log({"step": done, "phase": phase, **event})
        self.echo(f"{phase:8s} step {done:6d}  loss {loss:.4f}  lr {lr:.2e}  "
                  f"{record['tokens_per_s']:.0f} tok/s")

    def record_eval(self, step: int, budget: Budget, val_loss: float, train_loss: float) -> None:
        """Evaluation at a budget: mean loss over the fixed validation windows and train sample, per
        token and per byte; health.RunStopped if either is not finite."""
        setup = self.setup
        record = {"D": step * self.schedule.tokens_per_step, "step": step, "val_loss": val_loss,
                  "train_loss": train_loss,
                  "val_bpb": data.bits_per_byte(val_loss, setup.val_windows, setup.val_bytes),
                  "train_bpb": data.bits_per_byte(train_loss, setup.train_windows, setup.train_bytes),
                  "fraction": budget.fraction}
        labels = self.cfg.study.flop_budgets  # the IsoFLOP budget this evaluation serves (0: none)
        label = labels[self.schedule.budgets.index(budget)] if labels else 0
        if label > 0:
            record["budget"] = label
        self.log({"event": "eval", "tokens": record["D"], **record})
        bpb = "" if record["val_bpb"] is None else f"  val_bpb {record['val_bpb']:.4f}"
        self.echo(f"eval     step {step:6d}  val_loss {val_loss:.4f}  train_loss {train_loss:.4f}{bpb}")
        self.progress.evals.append(record)
        for value, name in ((val_loss, "validation loss"), (train_loss, "train loss")):
            if not math.isfinite(value):
                raise health.RunStopped("diverged", step, f"{name} is {value}")

    # -- landing

    def summary(self, status: str, reason: str | None) -> dict:
        self.progress.wall_s += self._elapsed()
        summary = summarize(self.setup, self.progress, status, reason)
        if self.packed_with:
            summary["packed_with"] = self.packed_with  # trained as one program with these runs
        layout = self.setup.layout
        if layout is not None:  # the devices it ran on (a layout: not part of the run id)
            summary["parallel"] = layout.describe()
            plan_shape = architectures.of(self.setup.model_cfg).plan_shape
            if plan_shape is not None:  # the planner's prediction of this step, where it can price the model
                shape_file = self.out_dir / "plan_model.json"
                if self.primary and not shape_file.exists():
                    atomic_write_json(shape_file, plan_shape(self.setup.model_cfg))
                argv = parallel.plan_step_argv(layout, self.setup.model_cfg, self.cfg.recipe.name,
                                               self.cfg.train.batch_size, str(shape_file))
                summary["parallel"]["plan_step"] = "scaling " + " ".join(argv)
        return summary

    def land_ok(self) -> None:
        summary = self.summary("ok", reason=None)
        self.landed = runs.land(self.out_dir, summary) if self.primary else summary

    def land(self, status: str, step: int, reason: str, error: BaseException | None) -> None:
        self.echo(f"{status} at step {step}: {reason}")
        # a health check reads losses at log steps: the trunk may have run past the step it stopped at
        self.progress.step = min(self.progress.step, step)
        if not self.primary:
            self.landed = self.summary(status, reason)
            return
        try:
            self.landed = runs.land_failure(self.out_dir, config=self.cfg.to_dict(), status=status, reason=reason,
                                            step=step, last_losses=self.last_losses, telemetry=self.last_telemetry,
                                            error=error, landed=self.summary(status, reason))
        except OSError as write:
            if not (disk_full(write) and error is not None and disk_full(error)):
                raise
            # the full disk takes failure.json and summary.json too: the line above said it, and unlanded
            # the run resumes from its last good checkpoint when trained again
            self.landed = summarize(self.setup, self.progress, status, reason)


# ---------------------------------------------------------------- summary.json


def summarize(setup: Setup, progress: Progress, status: str, reason: str | None) -> dict:
    """summary.json of a run: what it is (config, recipe, sizes, compute), how it ended and what it
    measured (evaluations, mean telemetry, timings), from its setup and progress record alone."""
    cfg, schedule = setup.cfg, setup.schedule
    evals = sorted(progress.evals, key=lambda e: e["D"])
    final = evals[-1] if evals and evals[-1]["step"] == schedule.steps else {}
    telemetry = ({k: _tree_scale(v, 1.0 / progress.telemetry_count) for k, v in progress.telemetry_sum.items()}
                 if progress.telemetry_count else {})
    params = ladder.param_counts(setup.model_cfg)
    return {
        "status": status,
        "reason": reason,
        "name": cfg.name,
        "run_id": cfg.run_id,
        "val_loss": final.get("val_loss"),
        "train_loss": final.get("train_loss"),
        "val_bpb": final.get("val_bpb"),  # bits per byte: comparable across tokenizers
        "train_bpb": final.get("train_bpb"),
        "N": int(params["non_embedding"]),
        "N_total": int(params["total"]),
        "D": final.get("D", progress.step * schedule.tokens_per_step),
        "step": final.get("step", progress.step),
        "steps": schedule.steps,
        "size": cfg.model.size,
        "n_layers": setup.model_cfg.n_layers,
        "d_model": setup.model_cfg.d_model,
        "architecture": cfg.model.architecture,
        "lr": cfg.train.lr,
        "tokens": cfg.train.tokens,
        "seed": cfg.seed,
        "smooth_swiglu": cfg.model.smooth_swiglu,
        **_recipe_columns(cfg.recipe),
        "recipe_detail": cfg.recipe.describe(),
        "flops_per_token": float(ladder.flops_per_token(setup.model_cfg)),
        # FLOPs by GEMM part with each operand's effective bits, per-role precision columns
        "compute": compute_lib.columns(setup.model_cfg, cfg.recipe, schedule.tokens_per_step),
        "tokens_per_s": progress.tokens_per_s(),
        "wall_s": progress.wall_s,
        "compile_s": progress.compile_s,
        "eval_s": progress.eval_s,
        "attempts": progress.attempts,
        "corpus": setup.corpus.describe(),
        "hardware": host.describe(),  # timings and the GEMM path hold for this kind of machine
        "bf16_dots": gemm.uses_bf16_dots(cfg.recipe),  # exact low-precision GEMMs as bf16 dots (fast_path)
        "entropy_rate": setup.corpus.entropy_rate,
        "telemetry": telemetry,
        "evals": evals,
        **({"study": cfg.to_dict()["study"]} if cfg.study.flop_budgets else {}),
        "ladder": {
            "schedule": schedule.kind,
            "budgets": [b.fraction for b in schedule.budgets],
            "tokens_trained": progress.tokens_trained,
            "tokens_planned": schedule.tokens_trained(),
            "tokens_separate_runs": schedule.tokens_separate_runs(),
            "saved_fraction": 1.0 - schedule.tokens_trained() / schedule.tokens_separate_runs(),
        },
    }


def _recipe_columns(recipe) -> dict:
    """The results-table columns describing a recipe: its bits P, and the weight role's element
    format, granularity, scaling and block (the forward GEMM's; other roles are in recipe_detail)."""
    spec = recipe.weight
    columns = {"recipe": recipe.name, "P": recipe.bits, "bits_w": recipe.bits_w, "bits_a": recipe.bits_a,
               "bits_g": recipe.bits_g}
    if spec is None:
        return {**columns, "format": "fp32", "granularity": "none", "scaling": "none", "block": None,
                "ebits": 8, "mbits": 23}
    fmt = formats.get(spec.format)
    structure = precision.role_structure(spec)
    return {**columns, "format": spec.format, "granularity": structure.granularity, "scaling": structure.scaling,
            "block": structure.block or None, "ebits": getattr(fmt, "ebits", None),
            "mbits": getattr(fmt, "mbits", None)}


def _to_python(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {str(k): _to_python(v) for k, v in tree.items()}
    return float(np.asarray(tree)) if np.ndim(tree) == 0 else np.asarray(tree, dtype=float).tolist()


def _tree_add(total: Any, tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _tree_add(total.get(k) if isinstance(total, dict) else None, v) for k, v in tree.items()}
    if total is None:
        return tree
    if isinstance(tree, list):
        return (np.asarray(total) + np.asarray(tree)).tolist()
    return total + tree


def _tree_scale(tree: Any, factor: float) -> Any:
    if isinstance(tree, dict):
        return {k: _tree_scale(v, factor) for k, v in tree.items()}
    if isinstance(tree, list):
        return (np.asarray(tree) * factor).tolist()
    return tree * factor
