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

Many runs, one program (`run_packed`): runs differing only in seed, learning rate and format values
(`pack_key`) train in step as members of one vmapped program (scaling.train.step.packed), each
writing its own directory as it would alone; the sweep packs runs where the device sums a packed
step as it sums a single one (scaling.study.sweeps.sweep).

The trunk, its cooldown branches, evaluation, health checks and checkpoints share one training
state and its resume point, so the program that drives them (_Trainer) lives here. Each run's own side
of it, the same whether it trains alone or packed (its schedule, its Setup, its Progress record, its
_Member: what it logs, checks, saves and lands; its summary.json), is scaling.train.member, whose names
stay importable from here. How a checkpoint is written, read back or set aside (Orbax and its quirks, a
full disk) is scaling.train.checkpoints; this module decides when.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from scaling.train import config as config_lib
from scaling.train import checkpoints, data, health, parallel, runs, tracking
from scaling.train.checkpoints import BAD_CHECKPOINTS, KEEP_CHECKPOINTS, DiskFull, disk_full  # noqa: F401 - importable from here
from scaling.train import model as model_lib
from scaling.train import step as step_lib
from scaling.train.member import (Budget, Progress, Schedule, Setup, _Member, _to_python,  # noqa: F401 - importable from here
    learning_rate, prepare, schedule_for, summarize)
from scaling._io import read_jsonl
from scaling.errors import ConfigError

# Set (by a sweep's run child on SIGINT, scaling.study.sweeps.sweep) to stop the run between two steps: it
# checkpoints where it is, logs an `interrupted` event and raises Interrupted without landing, so
# training it again resumes at that step.
STOP = threading.Event()


# ---------------------------------------------------------------- the run


def run(cfg: config_lib.RunConfig | dict, out_dir: str | Path, echo: Callable[[str], None] | None = None, *,
        wait: bool = False, lock: runs.Lock | None = None, fewer_devices: bool = False) -> dict:
    """Train one run into `out_dir` and return its summary (also written to summary.json).

    A run stopped by a health check returns a summary with status `diverged`; a full disk returns a
    `failed` one, said in one line (failure.json and summary.json written where they still fit, the last
    good checkpoint kept to resume from); any other exception writes failure.json and a `failed`
    summary, then propagates. While it trains, this process owns
    the directory: `lock` if the caller already holds it (a sweep's watched child inherits its
    parent's), else it takes the lock, raising runs.RunOwned if another process holds it, or with
    `wait` waiting for that process to let go (then returning its summary if the run landed).
    Fewer devices than `parallel.data` only for a run resuming from a checkpoint, or with `fewer_devices`.
    """
    out_dir = Path(out_dir)
    cfg = config_lib.validate(cfg)
    finished = runs.finished(out_dir, cfg)
    if finished is not None:
        return finished
    setup = prepare(cfg, fewer_devices=fewer_devices or runs.has_checkpoint(out_dir))
    if not parallel.primary():  # another host's process of this run: process 0 owns and writes the directory
        return _train([setup], [out_dir], lambda line: None)[0]
    with contextlib.nullcontext(lock) if lock is not None else runs.acquire(out_dir, wait=wait):
        finished = runs.finished(out_dir, cfg)  # landed by the process that held the lock before us
        if finished is not None:
            return finished
        runs.begin(out_dir, setup.cfg)
        return _train([setup], [out_dir], echo or (lambda line: None))[0]


def pack_key(cfg: config_lib.RunConfig) -> str:
    """Runs with equal keys can train as members of one program (`run_packed`): everything but the
    seed, the learning rate, the precision's format values and the run's labels (name, study) is
    equal (model shape, schedule, batch, data, optimiser, intervals), and the recipes share one
    structure. One device (no `[parallel]` layout)."""
    d = cfg.to_dict()
    for key in ("name", "seed", "precision", "study"):
        d.pop(key)
    d["train"].pop("lr")
    return json.dumps([d, repr(cfg.recipe.structure())], sort_keys=True, default=str)


def run_packed(cfgs: list[config_lib.RunConfig | dict], out_dirs: list[str | Path],
               echo: Callable[[str], None] | None = None, *, locks: list[runs.Lock] | None = None) -> list[dict]:
    """Train runs of one `pack_key` as one program (scaling.train.step.packed), each into its own
    directory exactly as `run` would: its metrics, checkpoints (its slice of the state), health
    checks and summary. A member stopped by a health check lands as diverged and keeps its slot
    (its results ignored) while the others train on. Members whose checkpoints are at different
    steps (one did not read back) cannot train in step: then each trains alone, one after another,
    from its own checkpoint. While they train this process owns every directory: `locks` where the
    caller holds them (a sweep's pack child inherits its parent's), else it takes each lock, raising
    runs.RunOwned, with nothing written, if another process holds one. Runs landed for good are
    returned as they landed. A member's losses are its single run's bit for bit
    only where the device's batched dots sum as its single dots do (tests/train/test_packed.py):
    the sweep packs only where its take-off probe found that."""
    cfgs = [config_lib.validate(c) for c in cfgs]
    out_dirs = [Path(d) for d in out_dirs]
    if len({pack_key(c) for c in cfgs}) != 1 or any(c.parallel.data > 1 for c in cfgs):
        raise ConfigError("pack", [c.run_id for c in cfgs], "runs of one model shape, schedule, batch, data and recipe "
                          "structure on one device, differing in seed, learning rate or format values")
    echo = echo or (lambda line: None)
    with contextlib.ExitStack() as held:
        for out_dir in out_dirs if locks is None else []:
            held.enter_context(runs.acquire(out_dir))
        summaries: list[dict | None] = [runs.finished(d, c) for c, d in zip(cfgs, out_dirs)]
        todo = [i for i, s in enumerate(summaries) if s is None]
        setups = [prepare(cfgs[i]) for i in todo]
        for i, setup in zip(todo, setups):
            runs.begin(out_dirs[i], setup.cfg)
        try:
            landed = _train(setups, [out_dirs[i] for i in todo], echo) if todo else []
        except _Unaligned as unaligned:
            echo(str(unaligned))
            landed = [_train([setup], [out_dirs[i]], echo)[0] for i, setup in zip(todo, setups)]
    for i, summary in zip(todo, landed):
        summaries[i] = summary
    return summaries


class Interrupted(KeyboardInterrupt):
    """STOP stopped the run between two steps: it checkpointed there and has not landed (a KeyboardInterrupt,
    so no handler of errors lands it as failed)."""


class _Unaligned(Exception):
    """The members of a pack resumed at different steps: they cannot train in step."""


class _AllLanded(Exception):
    """Every member of the program has landed (a health check stopped the last one)."""


def _train(setups: list[Setup], out_dirs: list[Path], echo: Callable[[str], None]) -> list[dict]:
    """Train one run, or several as one program; each member's summary, in order."""
    trainer = None
    try:
        trainer = _Trainer(setups, out_dirs, echo)
        trainer.train()
    except _AllLanded:
        pass
    except _Unaligned:
        raise
    except Exception as error:
        reason = f"{type(error).__name__}: {error}"
        if not parallel.primary():
            raise
        if trainer is not None:
            trainer.fail(reason, error)
        else:  # the model or optimiser could not be built: no step, no losses
            for setup, out_dir in zip(setups, out_dirs):
                runs.land_failure(out_dir, config=setup.cfg.to_dict(), status="failed", reason=reason, step=0,
                                  last_losses=[], telemetry={}, error=error, run_id=setup.cfg.run_id)
        if trainer is None or not disk_full(error):
            raise
        # a full disk: the one line `land` printed is the whole story (the last good checkpoint resumes it)
    finally:
        if trainer is not None:
            for member in trainer.members:
                member.mirror.close()
    return [member.landed for member in trainer.members]


class _Trainer:
    """The device program of one run, or of several as one (`packed`: scaling.train.step.packed), and
    the loop that drives it: the trunk, its cooldown branches, evaluations and checkpoints, in step
    for every member. Each member's side (what it logs, checks and lands) is its _Member."""

    def __init__(self, setups: list[Setup], out_dirs: list[Path], echo: Callable[[str], None]):
        self.packed = len(setups) > 1
        self.members = [_Member(s, d, echo, i, self.packed) for i, (s, d) in enumerate(zip(setups, out_dirs))]
        for member in self.members if self.packed else []:
            member.packed_with = [m.cfg.run_id for m in self.members if m is not member]
        self.live = list(self.members)  # not landed yet
        lead = self.members[0]
        self.setup, self.cfg, self.schedule, self.echo = lead.setup, lead.cfg, lead.schedule, echo
        self.compiled = False  # per attempt: a resumed run compiles again
        self.layout = lead.setup.layout
        tx = step_lib.optimizer_tx(self.cfg.train.grad_clip, self.cfg.train.weight_decay)
        recipes = [m.cfg.recipe for m in self.members]
        self.model_def, self.opt_def = nnx.eval_shape(lambda: step_lib.graph_defs(self.setup.model_cfg, recipes[0], tx, 0))
        if self.packed:
            if not step_lib.packable(self.setup.model_cfg, recipes, tx):
                raise ConfigError("pack", [m.cfg.recipe.name for m in self.members], "recipes of one structure")
            self.train_step, self.eval_step, init = step_lib.packed()
            self.state = init(self.setup.model_cfg, recipes, tx, [m.cfg.seed for m in self.members])
        else:
            self.train_step, self.eval_step, init = step_lib.compiled(self.layout)
            self.state = init(self.setup.model_cfg, recipes[0], tx, self.cfg.seed)
        self.pending: list[tuple] = []  # (step, phase, losses on the device) not yet checked
        self.prefetched: tuple[int, Any] = (-1, None)  # (step, its batch on the device)
        self.clock = time.perf_counter()  # start of the steps since the last wait

    # -- members

    def _member_state(self, member: _Member):
        return jax.tree.map(lambda x: x[member.index], self.state) if self.packed else self.state

    def _stop(self, member: _Member, stop: health.RunStopped) -> None:
        """Land a member a health check stopped; its slot keeps training, unread. None left: done."""
        member.land(stop.status, stop.step, stop.reason, None)
        self.live.remove(member)
        if not self.live:
            raise _AllLanded

    def fail(self, reason: str, error: BaseException) -> None:
        """Land every member still training as failed (the program raised `error`)."""
        if self.pending:  # losses of steps that ran before the error, unchecked
            with contextlib.suppress(Exception):
                fetched = parallel.fetch([loss for _, _, loss in self.pending])
                for member in self.live:
                    member.last_losses = (member.last_losses + self._of(member, fetched))[-20:]
        self.pending = []
        for member in self.live:
            member.land("failed", member.progress.step, reason, error)

    def _of(self, member: _Member, fetched: list) -> list[float]:
        """A member's values of fetched per-step arrays (a packed program's have a member axis)."""
        return [float(np.asarray(x)[member.index]) if self.packed else float(x) for x in fetched]

    # -- checkpoints

    def _save(self) -> None:
        for member in self.live:
            member.save(self._member_state(member))

    def _restore(self) -> None:
        """Every member from its newest checkpoint that reads back; members at different steps raise
        _Unaligned (before anything is logged: each then trains alone)."""
        if self.packed:  # a member's slice
            one = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), self.state)
        else:
            one = checkpoints.abstract(self.state)
        restored = [member.restore(one) for member in self.members]
        steps = {progress.step for _, progress, _ in restored}
        if len(steps) > 1:
            raise _Unaligned(f"the packed runs resume at different steps ({sorted(steps)}): each trains alone")
        if steps != {0}:
            states = [state for state, _, _ in restored]
            self.state = jax.tree.map(lambda *xs: jnp.stack(xs), *states) if self.packed else states[0]
        for member, (_, progress, set_aside) in zip(self.members, restored):
            member.resumed(progress, set_aside)

    # -- the loop

    def train(self) -> None:
        for member in self.members:
            if member.primary:
                logged = read_jsonl(member.metrics_file) if member.metrics_file.exists() else []
                member.mirror = tracking.open_mirror(member.cfg, member.out_dir, logged)
        if self.layout is not None:
            self.members[0].log({"event": "devices", "step": 0, **self.layout.describe(),
                                 **({"dropped": self.layout.dropped} if self.layout.dropped else {})})
            if self.layout.dropped:
                self.echo(self.layout.dropped)
        self._restore()
        self.clock = time.perf_counter()
        for member in self.members:
            member.progress.attempts += 1
        lead, schedule, every = self.members[0], self.schedule, self.cfg.train.checkpoint_every
        done = {e["fraction"] for e in lead.progress.evals}
        branches = [b for b in schedule.budgets[:-1] if b.fraction not in done]
        while lead.progress.step < schedule.steps:
            step = lead.progress.step
            if STOP.is_set():
                self._interrupt()
            for budget in [b for b in branches if b.cooldown_start == step]:
                try:
                    self._branch(budget)
                except Interrupted:  # the branch is dropped; the trunk, at its start, checkpoints
                    self._interrupt()
                branches.remove(budget)
            self.state = self._step(self.state, step, schedule.final, phase="trunk")
            for member in self.members:
                member.progress.step = step + 1
            if every and step + 1 < schedule.steps and (step + 1) % every == 0:
                self._drain()
                self._save()
                self.clock = time.perf_counter()
        self._evaluate(self.state, schedule.steps, budget=schedule.final)
        for member in list(self.live):
            member.land_ok()

    def _interrupt(self) -> None:
        """STOP is set: checkpoint the trunk at its step (a branch not evaluated yet runs again from
        there), log `interrupted` and raise Interrupted; nothing lands."""
        self._drain()
        for member in self.live:
            step = member.progress.step
            if member.checkpoints is not None and step and member.checkpoints.latest_step() != step:
                member.save(self._member_state(member))
            member.log({"event": "interrupted", "step": step, "tokens": step * self.schedule.tokens_per_step})
            member.echo(f"interrupted at step {step}: "
                        + ("checkpointed; training it again resumes there" if member.checkpoints is not None
                           else "no checkpoints (train.checkpoint_every = 0): training it again starts over"))
        raise Interrupted

    def _branch(self, budget: Budget) -> None:
        """The cooldown to `budget` from the trunk's current state; the trunk state is untouched (a
        step donates the state it is given, so the branch starts from a copy)."""
        self._drain()  # the trunk's losses so far are checked before the branch's
        state = jax.tree.map(jnp.copy, self.state)
        for step in range(budget.cooldown_start, budget.end):
            if STOP.is_set():
                raise Interrupted
            state = self._step(state, step, budget, phase="cooldown")
        self._evaluate(state, budget.end, budget=budget)

    def _batch(self, step: int):
        """Training batch `step` on the device (each member's, stacked): the one sent while the
        previous step ran, else now."""
        if self.prefetched[0] == step:
            return self.prefetched[1]
        cfg, train = self.cfg, self.setup.corpus.train
        if self.packed:
            return jax.device_put(np.stack([data.batch(train, m.cfg.seed, step, cfg.train.batch_size, cfg.model.seq_len)
                                            for m in self.members]))
        rows = data.batch(train, cfg.seed, step, cfg.train.batch_size, cfg.model.seq_len)
        return jax.device_put(rows) if self.layout is None else self.layout.put_batch(rows)

    def _prefetch(self, step: int) -> None:
        try:
            self.prefetched = (step, self._batch(step))
        except Exception:  # noqa: BLE001 - drawn again where it is used, so its error lands at its own step
            self.prefetched = (-1, None)

    def _step(self, state, step: int, budget: Budget, phase: str):
        lrs = [learning_rate(m.schedule, step, budget) for m in self.members]
        done = step + 1
        logged = done % self.cfg.train.log_every == 0 or done == budget.end or step == 0
        if self.packed:
            seeds, lr, measure = np.array([m.cfg.seed for m in self.members], np.int32), np.array(lrs, np.float32), logged
        else:
            seeds, lr, measure = self.cfg.seed, np.float32(lrs[0]), np.bool_(logged)
        state, loss, grad_norm, telemetry = self.train_step(self.model_def, self.opt_def, state, self._batch(step),
                                                            seeds, step, lr, measure)
        self.pending.append((step, phase, loss))  # dispatched, not waited for
        if not self.compiled:  # traced by now: say which attention kernel a 16-bit attention runs
            self._attention_line(step)
        if step + 1 < budget.end:
            self._prefetch(step + 1)  # batch t+1 goes to the device while step t runs
        for member in self.members:
            member.progress.tokens_trained += self.schedule.tokens_per_step
        if not logged:
            if not self.compiled:
                self._drain()  # the attempt's first step: its time is the compile's
            return state
        losses = self._drain()
        telemetry, grad_norm = parallel.fetch(telemetry), parallel.fetch(grad_norm)
        for member in list(self.live):
            own = jax.tree.map(lambda x: np.asarray(x)[member.index], telemetry) if self.packed else telemetry
            member.record_step(step, phase, budget, lrs[member.index], losses[member.index][-1],
                               self._of(member, [grad_norm])[0], _to_python(own))
        self.clock = time.perf_counter()
        return state

    def _attention_line(self, step: int) -> None:
        dtype = self.cfg.recipe.structure().attention_dtype
        kernel = model_lib.attention_kernels().get(dtype) if dtype else None
        for member in self.members if kernel else []:
            if member.primary:
                member.log({"event": "attention", "step": step, "dtype": dtype, "kernel": kernel})
                member.echo(f"attention ({dtype} inputs): {kernel}")

    def _drain(self) -> list[list[float]]:
        """Wait for the steps dispatched since the last wait, time them (the first of an attempt
        is its compile), and run each member's health checks on its losses in order. Returns each
        member's losses (by index)."""
        pending, self.pending = self.pending, []
        fetched = parallel.fetch([loss for _, _, loss in pending])
        now = time.perf_counter()
        seconds, self.clock = now - self.clock, now
        first = pending and not self.compiled
        self.compiled = self.compiled or bool(pending)
        losses = [self._of(member, fetched) for member in self.members]
        for member in list(self.live):
            if first:
                member.progress.compile_s += seconds
            elif pending:
                member.progress.timed_s += seconds
                member.progress.timed_tokens += len(pending) * self.schedule.tokens_per_step
            try:
                member.check([(step, phase) for step, phase, _ in pending], losses[member.index])
            except health.RunStopped as stop:
                self._stop(member, stop)
        return losses

    def _evaluate(self, state, step: int, budget: Budget) -> None:
        """Each member's mean loss over the fixed validation windows and the fixed train sample."""
        self._drain()
        setup, started = self.setup, time.perf_counter()
        val_losses = self._mean_losses(state, setup.val_windows)
        train_losses = self._mean_losses(state, setup.train_windows)
        seconds = time.perf_counter() - started
        for member in list(self.live):
            member.progress.eval_s += seconds
            try:
                member.record_eval(step, budget, val_losses[member.index], train_losses[member.index])
            except health.RunStopped as stop:
                self._stop(member, stop)
        self.clock = time.perf_counter()

    def _mean_losses(self, state, windows: np.ndarray) -> list[float]:
        """Each member's loss over `windows`, in chunks of batch_size, each chunk's mean weighted by
        its window count (one wait for all chunks)."""
        chunk = self.cfg.train.batch_size
        parts = [windows[start:start + chunk] for start in range(0, len(windows), chunk)]
        if self.packed:
            k = len(self.members)
            put = lambda part: np.broadcast_to(part, (k, *part.shape))  # noqa: E731 - every member, the same windows
        else:
            put = (lambda part: part) if self.layout is None else self.layout.put_batch
        fetched = parallel.fetch([self.eval_step(self.model_def, state["model"], put(part)) for part in parts])
        totals = [0.0] * len(self.members)
        for member in self.members:
            for loss, part in zip(self._of(member, fetched), parts):
                totals[member.index] += loss * len(part)
        return [total / len(windows) for total in totals]
