"""One training run: data -> model(precision recipe) -> AdamW -> health checks -> metrics and summary.

    scaling train CONFIG.toml [--set key=value ...] [--out DIR]

Writes DIR/{config.json, metrics.jsonl, summary.json} (and failure.json if the run did not end
`ok`), with Orbax checkpoints in DIR/checkpoints/ while it runs (the latest two; removed once the
run has landed), and live curves mirrored from metrics.jsonl if `train.tracker` names any
(DIR/tensorboard/, DIR/wandb/; scaling.train.tracking). Nothing is written until the config, the corpus and the model are known to be
valid; a finished run is not re-run; an interrupted run resumes from its last checkpoint that reads
back (one that does not is moved to DIR/bad_checkpoints/ and the next older one restored). The
process training a run owns its directory (scaling.train.runs: an exclusive lock), so a directory that
another process is training is refused, not written into.

Optimiser: AdamW (b1 = 0.9, b2 = 0.95, eps = 1e-8) with decoupled weight decay on matrices
(embeddings included, norm scales not), global-norm gradient clipping, and a step-dependent
learning rate passed into the update (so one compiled step serves every schedule and branch):

    warmup        f_w(t) = min(1, (t + 1) / W)            W = warmup (steps), or warmup x steps if < 1
    cosine        lr(t) = lr f_w(t) (1 + cos(pi clip((t - W) / (T - W), 0, 1))) / 2
    WSD           lr(t) = lr f_w(t) min(1, (E_b - t) / (E_b - C_b))       (linear cooldown to 0)

For WSD each evaluation budget b (a fraction of `train.tokens`) ends at step E_b and leaves the
constant-LR trunk at C_b = E_b - max(1, round(decay E_b)). The trunk is trained once; at each C_b
a cooldown branch runs from a copy of the trunk's state to E_b and is evaluated, and the trunk
continues where it was (Hägele et al. 2024; OLMo-core's ladder). The last budget (1.0) is the trunk's own end.
Cost: T (1 - decay) + decay sum_b E_b steps instead of sum_b E_b for separate runs; for budgets
[0.25, 0.5, 1.0] and decay 0.2 that is 1.15 T instead of 1.75 T, 34% fewer tokens.

Evaluation at each budget: mean loss over the fixed validation windows (`data.eval_tokens`
contiguous tokens of the held-out split) and over a fixed sample of training windows of the same
size, in nats per token (`val_loss`, `train_loss`) and in bits per byte of the text the target
tokens decode to (`val_bpb`, `train_bpb` = loss x tokens / (bytes x ln 2): loss / ln 2 for byte
tokens, comparable across tokenizers; null for pre-tokenised arrays, whose bytes are unknown). summary.json's `telemetry` is the mean, over the logged trunk steps, of each role's
quantisation statistics (amax, saturated and underflow fractions, SNR) and activation maxima.

Data and randomness are pure functions of (seed, step): batch t is `data.batch(train, seed, t)`,
the step key is fold_in(key(seed), t). A branch step t sees what the trunk's step t would, and a
resumed run sees exactly what the uninterrupted one did, so both reach bit-identical losses.

The host never waits for a step it does not need: steps are dispatched asynchronously, batch t+1
is drawn and sent to the device (jax.device_put) while step t runs, and losses come back to the
host together at log steps (and before evaluations, branches, checkpoints and the first step of
an attempt, which times the compile). The health checks then see every step's loss, in order, at
most log_every steps late; throughput is tokens over the wall time between those waits.

One module (about 600 lines): the trunk, its cooldown branches, evaluation, health checks and
checkpoints share one training state and its resume point.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from scaling.train import compute as compute_lib
from scaling.train import config as config_lib
from scaling.train import architectures, data, health, ladder, parallel, runs, tracking
from scaling.numerics import formats, gemm, precision
from scaling import host
from scaling.train import model as model_lib
from scaling.train import step as step_lib
from scaling._io import append_jsonl, atomic_write_json, read_jsonl
from scaling.errors import ConfigError

KEEP_CHECKPOINTS = 2
BAD_CHECKPOINTS = "bad_checkpoints"  # checkpoints that did not read back, kept for inspection


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
    """The learning rate of training step `step` (0-based) on the way to `budget` (formulas above)."""
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


def prepare(cfg: config_lib.RunConfig) -> Setup:
    """Load everything a run needs; raises ConfigError before anything is written."""
    corpus = data.load(cfg.data.source, cfg.data.tokenizer)
    data.check_fingerprint(corpus, cfg.data.fingerprint)
    seq_len, eval_tokens = cfg.model.seq_len, cfg.data.eval_tokens
    if corpus.train.size < seq_len + 1:
        raise ConfigError("model.seq_len", seq_len, f"at most {corpus.train.size - 1} for this corpus")
    model_cfg = cfg.model.shape(corpus.vocab)
    val_windows = data.eval_windows(corpus.val, eval_tokens, seq_len)
    train_windows = data.train_sample(corpus.train, eval_tokens, seq_len)
    layout = parallel.layout_for(cfg.parallel.data, cfg.parallel.fsdp, cfg.train.batch_size)
    return Setup(cfg=cfg, schedule=schedule_for(cfg), corpus=corpus, model_cfg=model_cfg, val_windows=val_windows, train_windows=train_windows,
                 val_bytes=data.target_bytes(val_windows, corpus.token_bytes),
                 train_bytes=data.target_bytes(train_windows, corpus.token_bytes), layout=layout)


# ---------------------------------------------------------------- the run


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


def run(cfg: config_lib.RunConfig | dict, out_dir: str | Path, echo: Callable[[str], None] | None = None, *,
        wait: bool = False, lock: runs.Lock | None = None) -> dict:
    """Train one run into `out_dir` and return its summary (also written to summary.json).

    A run stopped by a health check returns a summary with status `diverged`; any other exception
    writes failure.json and a `failed` summary, then propagates. While it trains, this process owns
    the directory: `lock` if the caller already holds it (a sweep's watched child inherits its
    parent's), else it takes the lock, raising runs.RunOwned if another process holds it, or with
    `wait` waiting for that process to let go (then returning its summary if the run landed).
    """
    out_dir = Path(out_dir)
    cfg = config_lib.validate(cfg)
    finished = runs.finished(out_dir, cfg)
    if finished is not None:
        return finished
    setup = prepare(cfg)
    if not parallel.primary():  # another host's process of this run: process 0 owns and writes the directory
        return _train(setup, out_dir, lambda line: None)
    with contextlib.nullcontext(lock) if lock is not None else runs.acquire(out_dir, wait=wait):
        finished = runs.finished(out_dir, cfg)  # landed by the process that held the lock before us
        if finished is not None:
            return finished
        runs.begin(out_dir, setup.cfg)
        return _train(setup, out_dir, echo or (lambda line: None))


def _train(setup: Setup, out_dir: Path, echo: Callable[[str], None]) -> dict:
    trainer = None
    try:
        trainer = _Trainer(setup, out_dir, echo)
        return trainer.train()
    except health.RunStopped as stop:
        return trainer.land(stop.status, stop.step, stop.reason, None)
    except Exception as error:
        reason = f"{type(error).__name__}: {error}"
        if not parallel.primary():
            raise
        if trainer is not None:
            trainer.land("failed", trainer.progress.step, reason, error)
        else:  # the model or optimiser could not be built: no step, no losses
            runs.land_failure(out_dir, config=setup.cfg.to_dict(), status="failed", reason=reason, step=0, last_losses=[],
                              telemetry={}, error=error, run_id=setup.cfg.run_id)
        raise
    finally:
        if trainer is not None:
            trainer.mirror.close()


class _Trainer:
    def __init__(self, setup: Setup, out_dir: Path, echo: Callable[[str], None]):
        self.setup, self.cfg, self.schedule, self.out_dir, self.echo = setup, setup.cfg, setup.schedule, out_dir, echo
        self.started = time.perf_counter()
        self.compiled = False  # per attempt: a resumed run compiles again
        self.progress = Progress()
        self.last_telemetry: dict = {}
        self.last_losses: list[float] = []
        h = self.cfg.health
        self.monitor = health.LossMonitor(h.spike_factor, h.spike_window, self.schedule.warmup_steps)
        self.layout = setup.layout
        self.train_step, self.eval_step, init = step_lib.compiled(self.layout)
        tx = step_lib.optimizer_tx(self.cfg.train.grad_clip, self.cfg.train.weight_decay)
        recipe = self.cfg.recipe
        self.model_def, self.opt_def = nnx.eval_shape(lambda: step_lib.graph_defs(setup.model_cfg, recipe, tx, 0))
        self.state = init(setup.model_cfg, recipe, tx, self.cfg.seed)
        self.checkpoints = self._checkpoint_manager()
        self.primary = parallel.primary()  # writes metrics, summary and failure records
        self.metrics_file = out_dir / "metrics.jsonl"
        self.mirror = tracking.Mirror([], {})  # opened by train()
        self.pending: list[tuple] = []  # (step, phase, loss on the device) not yet checked
        self.prefetched: tuple[int, Any] = (-1, None)  # (step, its batch on the device)
        self.clock = time.perf_counter()  # start of the steps since the last wait

    # -- checkpoints

    def _checkpoint_manager(self):
        if not self.cfg.train.checkpoint_every:
            return None
        options = ocp.CheckpointManagerOptions(max_to_keep=KEEP_CHECKPOINTS, enable_async_checkpointing=False)
        return ocp.CheckpointManager((self.out_dir / "checkpoints").absolute(), options=options)

    def _save(self) -> None:
        self.progress.wall_s += self._elapsed()
        self.checkpoints.save(self.progress.step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(self.state),
            progress=ocp.args.JsonSave(dataclasses.asdict(self.progress))))

    def _restore(self) -> None:
        """Resume from the newest checkpoint that reads back. One that does not (any error: unreadable
        metadata, a truncated or missing file, a shape that no longer fits) is set aside in
        DIR/bad_checkpoints/ with one line naming it, and the next older one is tried; with none
        left the run starts again from step 0 and says so."""
        if self.checkpoints is None:
            return
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, self.state)
        set_aside = []
        for step in sorted(self.checkpoints.all_steps(), reverse=True):
            try:
                restored = self.checkpoints.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract), progress=ocp.args.JsonRestore()))
                progress = Progress(**restored.progress)
                if progress.step != step:
                    raise ValueError(f"its progress record is for step {progress.step}")
            except Exception as error:  # noqa: BLE001 - whatever went wrong, an older checkpoint may read back
                self._set_aside(step, error)
                set_aside.append(step)
                continue
            self.state, self.progress = restored.state, progress
            self.monitor.recent.extend(self.progress.recent_losses)
            self._log({"event": "resumed", "step": step, "tokens": step * self.schedule.tokens_per_step,
                       **({"set_aside": set_aside} if set_aside else {})})
            self.echo(f"resumed from the checkpoint at step {step}")
            return
        if set_aside:
            self._log({"event": "restarted", "step": 0, "tokens": 0, "set_aside": set_aside})
            self.echo("no checkpoint reads back: the run starts again from step 0")

    def _set_aside(self, step: int, error: Exception) -> None:
        """Move checkpoint `step` out of the manager's sight (kept, not deleted) and say why."""
        bad = self.out_dir / BAD_CHECKPOINTS
        bad.mkdir(exist_ok=True)
        target = bad / str(step)
        for n in itertools.count(1):  # a step set aside before (an earlier attempt) keeps its copy
            if not target.exists():
                break
            target = bad / f"{step}.{n}"
        os.replace(self.out_dir / "checkpoints" / str(step), target)
        self.checkpoints.close()  # a fresh manager: nothing of the failed read lingers in the old one
        self.checkpoints = self._checkpoint_manager()
        reason = " ".join(f"{type(error).__name__}: {error}".split())
        self.echo(f"checkpoint at step {step} does not read back ({reason[:160]}); moved to {target}")

    def _elapsed(self) -> float:
        """Wall time since the last call (accumulated into progress.wall_s)."""
        now = time.perf_counter()
        elapsed, self.started = now - self.started, now
        return elapsed

    # -- the loop

    def train(self) -> dict:
        logged = read_jsonl(self.metrics_file) if self.metrics_file.exists() else []
        if self.primary:
            self.mirror = tracking.open_mirror(self.cfg, self.out_dir, logged)
        if self.layout is not None:
            self._log({"event": "devices", "step": 0, **self.layout.describe(),
                       **({"dropped": self.layout.dropped} if self.layout.dropped else {})})
            if self.layout.dropped:
                self.echo(self.layout.dropped)
        self._restore()
        self.clock = time.perf_counter()
        self.progress.attempts += 1
        schedule, every = self.schedule, self.cfg.train.checkpoint_every
        done = {e["fraction"] for e in self.progress.evals}
        branches = [b for b in schedule.budgets[:-1] if b.fraction not in done]
        while self.progress.step < schedule.steps:
            step = self.progress.step
            for budget in [b for b in branches if b.cooldown_start == step]:
                self._branch(budget)
                branches.remove(budget)
            self.state = self._step(self.state, step, schedule.final, phase="trunk")
            self.progress.step = step + 1
            if every and self.progress.step % every == 0 and self.progress.step < schedule.steps:
                self._drain()
                self.progress.recent_losses = list(self.monitor.recent)
                self._save()
                self.clock = time.perf_counter()
        self.progress.evals.append(self._evaluate(self.state, schedule.steps, budget=schedule.final))
        summary = self._summary("ok", reason=None)
        return runs.land(self.out_dir, summary) if self.primary else summary

    def _branch(self, budget: Budget) -> None:
        """The cooldown to `budget` from the trunk's current state; the trunk state is untouched (a
        step donates the state it is given, so the branch starts from a copy)."""
        self._drain()  # the trunk's losses so far are checked before the branch's
        state = jax.tree.map(jnp.copy, self.state)
        for step in range(budget.cooldown_start, budget.end):
            state = self._step(state, step, budget, phase="cooldown")
        self.progress.evals.append(self._evaluate(state, budget.end, budget=budget))

    def _batch(self, step: int):
        """Training batch `step` on the device: the one sent while the previous step ran, else now."""
        if self.prefetched[0] == step:
            return self.prefetched[1]
        cfg = self.cfg
        rows = data.batch(self.setup.corpus.train, cfg.seed, step, cfg.train.batch_size, cfg.model.seq_len)
        return jax.device_put(rows) if self.layout is None else self.layout.put_batch(rows)

    def _prefetch(self, step: int) -> None:
        try:
            self.prefetched = (step, self._batch(step))
        except Exception:  # noqa: BLE001 - drawn again where it is used, so its error lands at its own step
            self.prefetched = (-1, None)

    def _step(self, state, step: int, budget: Budget, phase: str):
        schedule = self.schedule
        lr = learning_rate(schedule, step, budget)
        done = step + 1
        logged = done % self.cfg.train.log_every == 0 or done == budget.end or step == 0
        state, loss, grad_norm, telemetry = self.train_step(self.model_def, self.opt_def, state, self._batch(step),
                                                            self.cfg.seed, step, np.float32(lr), np.bool_(logged))
        self.pending.append((step, phase, loss))  # dispatched, not waited for
        if not self.compiled:  # traced by now: say which attention kernel a 16-bit attention runs
            self._attention_line(step)
        if step + 1 < budget.end:
            self._prefetch(step + 1)  # batch t+1 goes to the device while step t runs
        self.progress.tokens_trained += schedule.tokens_per_step
        if not logged:
            if not self.compiled:
                self._drain()  # the attempt's first step: its time is the compile's
            return state
        loss = self._drain()[-1]
        telemetry = _to_python(parallel.fetch(telemetry))
        self.last_telemetry = telemetry
        record = {"step": done, "tokens": done * schedule.tokens_per_step, "phase": phase, "loss": loss,
                  "lr": lr, "grad_norm": float(parallel.fetch(grad_norm)), "tokens_per_s": self.progress.tokens_per_s(),
                  "telemetry": telemetry}
        if phase == "cooldown":
            record["budget"] = budget.end * schedule.tokens_per_step
        else:
            self.progress.telemetry_sum = _tree_add(self.progress.telemetry_sum, telemetry)
            self.progress.telemetry_count += 1
        self._log(record)
        for event in health.saturation_events(telemetry, self.cfg.health.max_saturation):
            self._log({"step": done, "phase": phase, **event})
        self.echo(f"{phase:8s} step {done:6d}  loss {loss:.4f}  lr {lr:.2e}  "
                  f"{record['tokens_per_s']:.0f} tok/s")
        self.clock = time.perf_counter()
        return state

    def _attention_line(self, step: int) -> None:
        dtype = self.cfg.recipe.structure().attention_dtype
        kernel = model_lib.attention_kernels().get(dtype) if dtype else None
        if kernel and self.primary:
            self._log({"event": "attention", "step": step, "dtype": dtype, "kernel": kernel})
            self.echo(f"attention ({dtype} inputs): {kernel}")

    def _drain(self) -> list[float]:
        """Wait for the steps dispatched since the last wait, time them (the first of an attempt
        is its compile), and run the health checks on their losses in order."""
        pending, self.pending = self.pending, []
        losses = [float(x) for x in parallel.fetch([loss for _, _, loss in pending])]
        now = time.perf_counter()
        seconds, self.clock = now - self.clock, now
        if pending and not self.compiled:
            self.compiled = True
            self.progress.compile_s += seconds
        elif pending:
            self.progress.timed_s += seconds
            self.progress.timed_tokens += len(pending) * self.schedule.tokens_per_step
        for (step, phase, _), loss in zip(pending, losses):
            self.last_losses = (self.last_losses + [loss])[-20:]
            self.monitor.check(step, loss, trunk=phase == "trunk")
        return losses

    def _evaluate(self, state, step: int, budget: Budget | None) -> dict:
        """Mean loss over the fixed validation windows and the fixed train sample, per token and per byte."""
        self._drain()
        setup, started = self.setup, time.perf_counter()
        val_loss = self._mean_loss(state, setup.val_windows)
        train_loss = self._mean_loss(state, setup.train_windows)
        self.progress.eval_s += time.perf_counter() - started
        record = {"D": step * self.schedule.tokens_per_step, "step": step, "val_loss": val_loss,
                  "train_loss": train_loss,
                  "val_bpb": data.bits_per_byte(val_loss, setup.val_windows, setup.val_bytes),
                  "train_bpb": data.bits_per_byte(train_loss, setup.train_windows, setup.train_bytes)}
        if budget is not None:
            record["fraction"] = budget.fraction
            labels = self.cfg.study.flop_budgets  # the IsoFLOP budget this evaluation serves (0: none)
            label = labels[self.schedule.budgets.index(budget)] if labels else 0
            if label > 0:
                record["budget"] = label
        self._log({"event": "eval", "tokens": record["D"], **record})
        bpb = "" if record["val_bpb"] is None else f"  val_bpb {record['val_bpb']:.4f}"
        self.echo(f"eval     step {step:6d}  val_loss {val_loss:.4f}  train_loss {train_loss:.4f}{bpb}")
        for value, name in ((val_loss, "validation loss"), (train_loss, "train loss")):
            if not math.isfinite(value):
                raise health.RunStopped("diverged", step, f"{name} is {value}")
        self.clock = time.perf_counter()
        return record

    def _mean_loss(self, state, windows: np.ndarray) -> float:
        """Windows in chunks of batch_size; each chunk's mean weighted by its window count (one
        wait for all chunks)."""
        chunk = self.cfg.train.batch_size
        parts = [windows[start:start + chunk] for start in range(0, len(windows), chunk)]
        put = (lambda part: part) if self.layout is None else self.layout.put_batch
        losses = parallel.fetch([self.eval_step(self.model_def, state["model"], put(part)) for part in parts])
        total = 0.0
        for loss, part in zip(losses, parts):
            total += float(loss) * len(part)
        return total / len(windows)

    def _log(self, record: dict) -> None:
        if not self.primary:
            return
        append_jsonl(self.metrics_file, record)
        self.mirror.log(record)

    # -- landing

    def _summary(self, status: str, reason: str | None) -> dict:
        self.progress.wall_s += self._elapsed()
        summary = summarize(self.setup, self.progress, status, reason)
        if self.layout is not None:  # the devices it ran on (a layout: not part of the run id)
            summary["parallel"] = self.layout.describe()
            plan_shape = architectures.of(self.setup.model_cfg).plan_shape
            if plan_shape is not None:  # the planner's prediction of this step, where it can price the model
                shape_file = self.out_dir / "plan_model.json"
                if self.primary and not shape_file.exists():
                    atomic_write_json(shape_file, plan_shape(self.setup.model_cfg))
                argv = parallel.plan_step_argv(self.layout, self.setup.model_cfg, self.cfg.recipe.name,
                                               self.cfg.train.batch_size, str(shape_file))
                summary["parallel"]["plan_step"] = "scaling " + " ".join(argv)
        return summary

    def land(self, status: str, step: int, reason: str, error: BaseException | None) -> dict:
        self.echo(f"{status} at step {step}: {reason}")
        if self.pending and error is not None:  # losses of steps that ran before the error, unchecked
            with contextlib.suppress(Exception):
                losses = parallel.fetch([loss for _, _, loss in self.pending])
                self.last_losses = (self.last_losses + [float(x) for x in losses])[-20:]
        self.pending = []
        # a health check reads losses at log steps: the trunk may have run past the step it stopped at
        self.progress.step = min(self.progress.step, step)
        if not self.primary:
            return self._summary(status, reason)
        return runs.land_failure(self.out_dir, config=self.cfg.to_dict(), status=status, reason=reason, step=step,
                                 last_losses=self.last_losses, telemetry=self.last_telemetry, error=error,
                                 landed=self._summary(status, reason))


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
