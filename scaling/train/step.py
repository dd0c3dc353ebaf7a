"""The compiled training step: the model's grad step (scaling.train.model) + AdamW (optax), jitted once
per model shape and recipe structure and shared by every run in the process. The model is the
config's architecture (`scaling.train.architectures.build`).

    train_step(model_def, opt_def, state, tokens_BxL1, seed, step, lr, measure) -> (state, loss, grad_norm, telemetry)
    eval_loss(model_def, model_state, tokens_BxL1) -> loss
    init(model_cfg, recipe, tx, seed) -> state = {"model": ..., "optimizer": ...}

`packed()` gives the same three for k runs as one program (a vmap over a leading member axis).

The learning rate is an argument of each update, so one compiled step serves every schedule
and WSD branch. `measure` says whether to compute the quantisation telemetry (the trainer asks
for it on its logged steps only; it is NaN on the others): on a CPU a runtime argument of one
compiled step (XLA:CPU runs only the branch taken), elsewhere a choice made on the host between
two compiled steps (XLA:GPU would read a runtime predicate on the host or compute both branches). The step key is fold_in(key(seed), step), so a
step's randomness (stochastic rounding) depends on (seed, step) alone. scaling.train.loop drives it;
benchmarks time it.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from scaling.train import architectures, data
from scaling.train import model as model_lib

ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.95, 1e-8


def decay_mask(params):
    """Weight decay on matrices (embeddings, projections), not on norm gains (`scale`). By name,
    not by rank: the layer stack's gains are stacked into [n_layers, d] arrays."""
    def decays(path, _) -> bool:
        return not any(getattr(k, "name", getattr(k, "key", None)) == "scale" for k in path)

    return jax.tree_util.tree_map_with_path(decays, params)


# Clipping and Adam's bias correction scale every element by a per-run scalar. They are written as a
# multiplication by its reciprocal, not a division by it, because XLA's simplifier turns
# `x / broadcast(s)` into `x * broadcast(1 / s)` when s has a member axis (packed runs) and not when
# it is a scalar (one run): written as the simplifier leaves them, a packed member's update has its
# single run's bits (tests/train/test_packed.py). optax's own transformations divide; the states are
# optax's, so checkpoints read back either way.


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
    """optax.clip_by_global_norm, the updates scaled by max_norm / norm where the norm exceeds it."""
    def update(updates, state, params=None):
        norm = optax.tree.norm(updates)
        keep = norm < max_norm
        scale = max_norm / norm
        return jax.tree.map(lambda g: jnp.where(keep, g, g * scale.astype(g.dtype)), updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def scale_by_adam(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
    """optax.scale_by_adam (the same moments and state), its bias corrections as reciprocals."""
    def init(params):
        return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32), mu=optax.tree.zeros_like(params),
                                      nu=optax.tree.zeros_like(params))

    def update(updates, state, params=None):
        mu = optax.tree.update_moment(updates, state.mu, b1, 1)
        nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
        count = optax.safe_increment(state.count)
        mu_scale = 1 / (1 - b1 ** count.astype(jnp.float32))
        nu_scale = 1 / (1 - b2 ** count.astype(jnp.float32))
        adam = jax.tree.map(lambda m, v: (m * mu_scale) / (jnp.sqrt(v * nu_scale) + eps), mu, nu)
        return adam, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init, update)


@functools.lru_cache(maxsize=None)
def optimizer_tx(grad_clip: float, weight_decay: float):
    """AdamW whose learning rate is an argument of each update (`learning_rate=`), not a schedule."""
    # Cached: the transformation is part of the optimiser's static graph definition, so equal
    # settings must give the identical object for runs in one process to share a compiled step.
    def scale_by_learning_rate_arg() -> optax.GradientTransformationExtraArgs:
        def update(updates, state, params=None, *, learning_rate, **extra):
            return jax.tree.map(lambda u: -learning_rate * u, updates), state

        return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update)

    return optax.chain(
        clip_by_global_norm(grad_clip) if grad_clip > 0 else optax.identity(),
        scale_by_adam(ADAM_B1, ADAM_B2, ADAM_EPS),
        optax.add_decayed_weights(weight_decay, mask=decay_mask),
        scale_by_learning_rate_arg(),
    )


# ---------------------------------------------------------------- compiled steps (shared across runs)


class Static:
    """A static argument of a jitted step, hashed once. jax.jit hashes its static arguments at every
    call, and an nnx graph definition's hash walks the whole graph (0.15 ms per call for two graph
    definitions on an AMD EPYC core: the host's largest cost per step of a small model). Equal values
    are equal Statics, so runs of one shape still share a compiled step."""

    __slots__ = ("value", "_hash")

    def __init__(self, value):
        self.value, self._hash = value, hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return self is other or (isinstance(other, Static) and self._hash == other._hash and self.value == other.value)


_STATICS: dict[int, tuple[object, Static]] = {}


def _static(value) -> Static:
    """`value`'s Static, found by identity (no hash): a run passes the same graph definitions at every
    step. The entry holds the value, so its id is not reused while it is there."""
    hit = _STATICS.get(id(value))
    if hit is None:
        if len(_STATICS) >= 64:  # a process training many runs: forget the older ones
            _STATICS.clear()
        hit = _STATICS[id(value)] = (value, Static(value))
    return hit[1]


def _update(model_def, opt_def, state, tokens_BxL1, seed, step, lr, measure):
    """One run's training step on one device: (state, loss, grad_norm, telemetry). The graph
    definitions come as Statics."""
    model = nnx.merge(model_def.value, state["model"])
    optimizer = nnx.merge(opt_def.value, state["optimizer"])
    key = jax.random.fold_in(jax.random.key(seed), step)
    loss, grads, telemetry = model_lib.grad_step(model, tokens_BxL1, key, measure)
    grad_norm = optax.tree.norm(grads)
    optimizer.update(model, grads, learning_rate=lr)
    return {"model": nnx.state(model), "optimizer": nnx.state(optimizer)}, loss, grad_norm, telemetry


@functools.lru_cache(maxsize=None)
def compiled(layout=None):
    """The jitted train and eval steps and the initialiser, `(train_step, eval_loss, init)` (the
    forms above; `train_step.lower` as a jitted function's: benchmarks and tests compile ahead of
    time). Graph definitions are static arguments (as `Static`s, hashed once per run), so runs of the
    same model shape and recipe structure in one process share one compilation. `layout`
    (scaling.train.parallel.Layout): the steps of a run across devices, the same computation with
    the batch split over the mesh and the weights and optimiser state where the layout puts them;
    None: one device."""
    data.use_compilation_cache()  # a quantised step compiles for tens of seconds: the next run loads it
    steps = _Compiled(layout)
    return steps, steps.eval_loss, steps.init


class _Compiled:
    """`compiled(layout)`'s steps, one instance per layout and process: the instance is the train
    step. Each jitted function is built once, here, from the method of its name (compile logs say
    `jit(step_fn)`, `jit(jitted_eval)`, `jit(init_params)`, `jit(init_around)`)."""

    def __init__(self, layout):
        self.layout = layout
        # the state is donated: its buffers become the next state's (no second copy of the weights and
        # optimiser moments per step); a caller keeping the old state copies it first (loop._branch)
        self.one_step = jax.jit(self.step_fn, static_argnums=(0, 1), donate_argnums=2)  # measure traced
        self.logged_or_not = jax.jit(self.step_fn, static_argnums=(0, 1, 7), donate_argnums=2)  # measure static: two programs
        self._eval = jax.jit(self.jitted_eval, static_argnums=0)
        # One compiled initialiser instead of one eager dispatch (and compile) per weight matrix, in two
        # parts: the weights, which do not depend on the recipe (a recipe adds formats and scaling state,
        # draws nothing), so one compile of their ~2 s serves every recipe of a model shape; and the
        # recipe's state around them, which compiles in a fraction of that. Across devices the weights are
        # drawn where they live (partitionable threefry: the same values whatever the layout).
        self._init_params = jax.jit(self.init_params, static_argnums=0)
        self._init_around = jax.jit(self.init_around, static_argnums=(0, 1, 2))

    def laid_out(self, tree):
        return tree if self.layout is None else self.layout.constrain(tree)

    def step_fn(self, model_def, opt_def, state, tokens_BxL1, seed, step, lr, measure):
        layout = self.layout
        if layout is None:
            return _update(model_def, opt_def, state, tokens_BxL1, seed, step, lr, measure)
        state, tokens_BxL1 = layout.constrain(state), layout.constrain_batch(tokens_BxL1)
        state, loss, grad_norm, telemetry = _update(model_def, opt_def, state, tokens_BxL1, seed, step, lr, measure)
        return (layout.constrain(state), *layout.constrain_replicated((loss, grad_norm, telemetry)))

    def program(self, measure):
        """The jitted step for this backend and the form of `measure` it takes."""
        if jax.default_backend() == "cpu":
            return self.one_step, np.bool_(measure)
        return self.logged_or_not, bool(measure)

    def __call__(self, model_def, opt_def, state, tokens_BxL1, seed, step, lr, measure):
        jitted, measure = self.program(measure)
        return jitted(_static(model_def), _static(opt_def), state, tokens_BxL1, seed, step, lr, measure)

    def lower(self, model_def, opt_def, state, tokens_BxL1, seed, step, lr, measure):
        jitted, measure = self.program(measure)
        return jitted.lower(_static(model_def), _static(opt_def), state, tokens_BxL1, seed, step, lr, measure)

    def jitted_eval(self, model_def, model_state, tokens_BxL1):
        layout = self.layout
        if layout is not None:
            model_state, tokens_BxL1 = layout.constrain(model_state), layout.constrain_batch(tokens_BxL1)
        loss = model_lib.eval_loss(nnx.merge(model_def.value, model_state), tokens_BxL1)
        return loss if layout is None else layout.constrain_replicated(loss)

    def eval_loss(self, model_def, model_state, tokens_BxL1):
        return self._eval(_static(model_def), model_state, tokens_BxL1)

    def init_params(self, model_cfg, seed):
        return self.laid_out(nnx.state(architectures.build(model_cfg, "fp32", rngs=nnx.Rngs(jax.random.key(seed))), nnx.Param))

    def init_around(self, model_cfg, recipe, tx, params):
        model = architectures.build(model_cfg, recipe, rngs=nnx.Rngs(0))  # its own draws: dead code
        nnx.update(model, params)
        optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
        return self.laid_out({"model": nnx.state(model), "optimizer": nnx.state(optimizer)})

    def init(self, model_cfg, recipe, tx, seed):
        return self._init_around(model_cfg, recipe, tx, self._init_params(model_cfg, seed))


def graph_defs(model_cfg, recipe, tx, seed):
    """The static graph definitions of the model and its optimiser (traced, never computed)."""
    model = architectures.build(model_cfg, recipe, rngs=nnx.Rngs(seed))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    return nnx.graphdef(model), nnx.graphdef(optimizer)


# ---------------------------------------------------------------- many runs, one program


@functools.lru_cache(maxsize=None)
def packed():
    """Runs of one model shape and recipe structure trained as one program: `jax.vmap` of the single
    run's step over a leading member axis of the state, the batch, the seed and the learning rate; the
    step count is shared (members advance together), `measure` is static (two programs, as on a GPU).
    Runs sharing a GPU as processes are time-sliced, their kernels never overlap; members of one
    program fill it together. Members may differ in seed, initialisation, batch, learning rate and
    format (a format is a runtime value of the state: fp8/fp6 or mxfp8/mxfp6 pack, see
    `packable`). A member's state and losses are its single run's bit for bit where a batched dot sums
    in the order of the single one: on a CPU with XLA's YNNPACK fusions off
    (`--xla_cpu_experimental_ynn_fusion_type=`); with them on (the default) not (Adam turns last-bit
    differences in near-zero gradients into weight differences of the order of the learning rate). On a
    GPU: not yet measured. `packing_difference` measures it on the device at hand; the sweep packs
    runs (`--pack K`) only where it is 0 (scaling.study.sweeps.takeoff.pack_probe).

        train_step(model_def, opt_def, states, tokens_KxBxL1, seeds_K, step, lrs_K, measure)
            -> (states, losses_K, grad_norms_K, telemetry with a leading K axis)
        eval_loss(model_def, model_states, tokens_KxBxL1) -> losses_K
        init(model_cfg, recipes, tx, seeds) -> states (each member's single-run init, stacked)"""
    single_init = compiled()[2]

    @functools.partial(jax.jit, static_argnums=(0, 1, 7), donate_argnums=2)
    def jitted_step(model_def, opt_def, states, tokens_KxBxL1, seeds_K, step, lrs_K, measure):
        def member(state, tokens_BxL1, seed, lr):
            return _update(model_def, opt_def, state, tokens_BxL1, seed, step, lr, measure)
        return jax.vmap(member)(states, tokens_KxBxL1, seeds_K, lrs_K)

    @functools.partial(jax.jit, static_argnums=0)
    def jitted_eval(model_def, model_states, tokens_KxBxL1):
        return jax.vmap(lambda st, tok: model_lib.eval_loss(nnx.merge(model_def.value, st), tok))(model_states, tokens_KxBxL1)

    def train_step(model_def, opt_def, states, tokens_KxBxL1, seeds_K, step, lrs_K, measure):
        return jitted_step(_static(model_def), _static(opt_def), states, tokens_KxBxL1, seeds_K, step, lrs_K, measure)

    def eval_loss(model_def, model_states, tokens_KxBxL1):
        return jitted_eval(_static(model_def), model_states, tokens_KxBxL1)

    def init(model_cfg, recipes, tx, seeds):
        states = [single_init(model_cfg, r, tx, s) for r, s in zip(recipes, seeds, strict=True)]
        return jax.tree.map(lambda *xs: jax.numpy.stack(xs), *states)

    return train_step, eval_loss, init


def packing_difference(model_cfg, recipes, tx, seeds, lrs, batch_size: int, steps: int = 3) -> float:
    """How far members of a packed program are from their single runs on this device: the largest
    absolute difference of any loss, grad norm, evaluation loss or state element after `steps` steps
    of random tokens (inf where one is NaN and the other not; 0.0: bit for bit). A few steps suffice:
    Adam turns last-bit differences of near-zero gradients into weight differences of the order of
    the learning rate at once."""
    model_def, opt_def = nnx.eval_shape(lambda: graph_defs(model_cfg, recipes[0], tx, 0))
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, model_cfg.vocab, (steps + 1, len(recipes), batch_size, model_cfg.seq_len + 1), dtype=np.int32)
    single_step, single_eval, single_init = compiled()
    single = []
    for k, (recipe, seed, lr) in enumerate(zip(recipes, seeds, lrs, strict=True)):
        state, outputs = single_init(model_cfg, recipe, tx, seed), []
        for t in range(steps):
            state, loss, norm, _ = single_step(model_def, opt_def, state, tokens[t, k], seed, t, np.float32(lr), False)
            outputs += [loss, norm]
        single.append((state, outputs + [single_eval(model_def, state["model"], tokens[steps, k])]))
    train_step, eval_loss, init = packed()
    seeds_K, lrs_K = np.asarray(seeds, np.int32), np.asarray(lrs, np.float32)
    states, outputs = init(model_cfg, recipes, tx, list(seeds)), []
    for t in range(steps):
        states, losses, norms, _ = train_step(model_def, opt_def, states, tokens[t], seeds_K, t, lrs_K, False)
        outputs += [losses, norms]
    outputs.append(eval_loss(model_def, states["model"], tokens[steps]))
    worst = 0.0
    for k, (state, single_outputs) in enumerate(single):
        pairs = zip(jax.tree.leaves((state, single_outputs)), jax.tree.leaves((states, outputs)), strict=True)
        for a, b in pairs:
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)[k]
            if not np.array_equal(np.isnan(a), np.isnan(b)):
                return math.inf
            worst = max(worst, float(np.nanmax(np.abs(a - b), initial=0.0)))
    return worst


def packable(model_cfg, recipes, tx) -> bool:
    """Whether runs of these recipes can be members of one packed program: one graph definition
    (model shape and recipe structure; formats differ only as values)."""
    defs = {nnx.eval_shape(lambda r=r: graph_defs(model_cfg, r, tx, 0)) for r in recipes}
    return len(defs) == 1
