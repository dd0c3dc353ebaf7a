"""One run across several devices, and across hosts, on JAX's own sharding (the `[parallel]` config).

    [parallel]
    data = 8        # replicas: the batch is split over 8 devices (mesh axis "data")
    fsdp = true     # and the master weights and Adam state too (fully sharded data parallel)

The step is one global computation (`jax.jit` over a `Mesh`): the batch is sharded along "data",
the weights and optimiser state replicated (data parallel) or sharded along the same axis (FSDP: each
array on its largest axis the device count divides, small arrays replicated), and XLA inserts the
collectives. Nothing in the loss, the gradients or the quantisation is written per device, so a
reduction that spans devices is reduced across them: the per-tensor amax of the activation and
gradient roles (a [B, L, D] tensor whose batch rows lie on 8 devices) is a max all-reduced over the
devices, and the weight role's amax under FSDP likewise; per-block (MX, NV) and per-channel scales
of activations and gradients are along the feature axis, inside one device's rows, and need no
communication. Delayed-scaling histories are replicated and updated with the global amax. The
numerics are those of the single-device step up to float32 summation order (partial sums per
device, then an all-reduce), so the device count and the sharding are a layout, not a setting of
the experiment: they do not enter the run id (scaling.train.config.canonical_form).

Fewer devices than replicas (a device or host lost, resumed on what is left): the run keeps its
global batch and its numerics. The devices left take the missing replicas' rows (8 replicas on 4
devices: 2 each, one pass, the same global computation), not a gradient accumulation over
micro-batches, which would split each per-tensor amax of the activations and gradients into one
per micro-batch and change the numerics of every current-scaled recipe. The devices left must
divide the batch (else a ConfigError saying which values fit); one line says what was dropped.

Several hosts: one process per host, `initialize()` before JAX starts its backends, from
JAX_COORDINATOR_ADDRESS + JAX_NUM_PROCESSES + JAX_PROCESS_ID, or a launcher JAX detects itself
(SLURM, Open MPI). Every process draws the same global batch (a function of (seed, step)) and
places the rows of its own devices (`jax.make_array_from_callback`); Orbax checkpoints through its
multi-host path (every process saves and restores its shards); process 0 alone writes the run
directory's files and holds its lock.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from scaling.errors import ConfigError

AXIS = "data"
MIN_SHARDED = 1024  # FSDP: arrays of fewer elements (norm gains, scaling state) stay replicated


# ---------------------------------------------------------------- several hosts


def initialize(environ: Mapping[str, str] | None = None) -> bool:
    """`jax.distributed.initialize` from the environment, once, before JAX's backends start: our
    variables (JAX_COORDINATOR_ADDRESS=host:port, JAX_NUM_PROCESSES, JAX_PROCESS_ID) or a launcher
    JAX detects (SLURM with more than one task, Open MPI with more than one rank). False (nothing
    done) for a single process."""
    environ = os.environ if environ is None else environ
    if jax.distributed.is_initialized():
        return True
    if "JAX_NUM_PROCESSES" in environ or "JAX_PROCESS_ID" in environ:
        try:
            count, index = int(environ["JAX_NUM_PROCESSES"]), int(environ["JAX_PROCESS_ID"])
            address = environ["JAX_COORDINATOR_ADDRESS"]
        except (KeyError, ValueError) as e:
            raise ConfigError("JAX_NUM_PROCESSES", environ.get("JAX_NUM_PROCESSES"),
                              f"with JAX_PROCESS_ID and JAX_COORDINATOR_ADDRESS=host:port, all set ({e!r})") from None
        if count <= 1:
            return False
        jax.distributed.initialize(coordinator_address=address, num_processes=count, process_id=index)
        return True
    launched = (int(environ.get("SLURM_NTASKS", "1") or 1) > 1 and "SLURM_JOB_ID" in environ) or \
        int(environ.get("OMPI_COMM_WORLD_SIZE", "1") or 1) > 1
    if launched:
        jax.distributed.initialize()
        return True
    return False


def primary() -> bool:
    """Whether this process writes the run directory (process 0; the only one without hosts)."""
    return jax.process_index() == 0


# ---------------------------------------------------------------- the layout


@dataclass(frozen=True)
class Layout:
    """A run's devices: a 1-D mesh along "data" and whether weights and optimiser state are sharded.
    Hashable: the compiled steps take it as a static argument."""

    mesh: Mesh
    fsdp: bool
    replicas: int  # parallel.data as configured (more than the devices if some were lost)
    dropped: str = field(default="", compare=False)  # the line saying which replicas' devices are gone

    @property
    def devices(self) -> int:
        return self.mesh.size

    @property
    def batch(self) -> NamedSharding:
        return NamedSharding(self.mesh, P(AXIS))

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    def sharding(self, shape: tuple[int, ...]) -> NamedSharding:
        """Where an array of weights or optimiser state lives: replicated, or under FSDP on its
        largest axis the device count divides (not the layer-stack axis of a stacked array)."""
        n = self.devices
        if not self.fsdp or n == 1 or math.prod(shape) < MIN_SHARDED:
            return self.replicated
        axes = range(1 if len(shape) >= 3 else 0, len(shape))
        fits = [a for a in axes if shape[a] % n == 0]
        if not fits:
            return self.replicated
        axis = max(fits, key=lambda a: (shape[a], -a))
        spec = [None] * len(shape)
        spec[axis] = AXIS
        return NamedSharding(self.mesh, P(*spec))

    def shardings(self, tree: Any) -> Any:
        return jax.tree.map(lambda x: self.sharding(np.shape(x)), tree)

    def constrain(self, tree: Any) -> Any:
        """`tree` (weights, optimiser state) laid out by `sharding`, inside a jitted function."""
        return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, self.sharding(np.shape(x))), tree)

    def constrain_batch(self, tokens_BxL: Any) -> Any:
        return jax.lax.with_sharding_constraint(tokens_BxL, self.rows(tokens_BxL.shape[0]))

    def constrain_replicated(self, tree: Any) -> Any:
        return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, self.replicated), tree)

    def rows(self, n_rows: int) -> NamedSharding:
        """A batch of `n_rows` split by rows, or replicated where the devices do not divide it
        (an evaluation's last, shorter chunk)."""
        return self.batch if n_rows % self.devices == 0 else self.replicated

    def put_batch(self, rows: np.ndarray) -> jax.Array:
        """A host batch (the same global batch on every process) as one global array: each process
        places the rows of its own devices."""
        sharding = self.rows(rows.shape[0])
        return jax.make_array_from_callback(rows.shape, sharding, lambda index: rows[index])

    def put(self, tree: Any) -> Any:
        """Weights and optimiser state (on any devices) moved to this layout."""
        return jax.device_put(tree, self.shardings(tree))

    def describe(self) -> dict:
        return {"data": self.devices, "replicas": self.replicas, "fsdp": self.fsdp,
                "processes": jax.process_count(),
                "devices": [f"{d.platform}:{d.id}" for d in self.mesh.devices.flat]}


def layout_for(data: int, fsdp: bool, batch_size: int, devices: list | None = None, *,
               fewer: bool = False) -> Layout | None:
    """The layout of a run with `parallel.data = data` on `devices` (default: every device of every
    process). None for one replica in one process: the single-device path, unchanged. Fewer devices
    than replicas only with `fewer` (a run resuming from its checkpoint after devices were lost, or a
    take-off probe); a run starting fresh is refused. The devices left, which must divide the batch,
    then take the missing replicas' rows (`Layout.dropped`: the line that says what was dropped)."""
    devices = list(jax.devices() if devices is None else devices)
    processes = jax.process_count()
    if data == 1 and processes == 1:
        return None
    if processes > 1 and data < len(devices):
        raise ConfigError("parallel.data", data, f"{len(devices)}: every device of the {processes} processes "
                          "(or fewer only after devices were lost)")
    if data <= len(devices):
        return Layout(Mesh(np.array(devices[:data]), (AXIS,)), fsdp, data)
    left = len(devices)
    if not fewer:
        raise ConfigError("parallel.data", data, fresh_allowed(left))
    if batch_size % left:
        fits = [d for d in range(1, left + 1) if batch_size % d == 0]
        raise ConfigError("parallel.data", data, f"{left} devices are left, which do not split train.batch_size = "
                          f"{batch_size} evenly: set parallel.data to one of {fits} (the run id stays)")
    dropped = (f"parallel.data = {data} but {left} devices are left: {data - left} dropped; the global batch of "
               f"{batch_size} runs its {data} replicas on {left} devices ({batch_size // left} rows each), "
               f"the same numerics and run id")
    return Layout(Mesh(np.array(devices), (AXIS,)), fsdp, data, dropped)


def fresh_allowed(devices: int) -> str:
    """What a run that starts fresh may ask for on `devices` (the `allowed` of its ConfigError)."""
    return (f"at most the {devices} device{'s' if devices != 1 else ''} visible here for a run that starts fresh "
            "(only a run resuming from its checkpoint trains on fewer: the devices left)")


def fetch(tree: Any) -> Any:
    """Device values to the host: replicated outputs (losses, norms, telemetry) from this process's
    own copy, so every process can read them without a collective."""
    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(x.addressable_shards[0].data)
        return x

    return jax.device_get(jax.tree.map(one, tree))


# ---------------------------------------------------------------- the planner's view of the layout

PLAN_RECIPES = {"fp32": "tf32"}  # a run's recipe -> scaling.plan.efficiency's, where the names differ


def plan_step_argv(layout: Layout | None, model_cfg: Any, recipe_name: str, batch_size: int, model_json: str) -> list[str]:
    """`scaling plan step` arguments predicting one step of this run on an H100 node, for the layout it
    trained with: dp = its devices, zero=3 for FSDP (weights, gradients and Adam state sharded) and 0
    for data parallel, one micro-batch of batch_size / devices sequences each. `model_json`: where
    the run's shape (scaling.plan.shapes' keys) is written, since the planner reads a shape from a
    file. A recipe the planner does not know is left to its default (bf16)."""
    from scaling.plan.efficiency import RECIPES

    devices = 1 if layout is None else layout.devices
    zero = 3 if layout is not None and layout.fsdp else 0
    argv = ["plan", "step", "--model", model_json, "--gpu", "h100", "--gpus", str(devices),
            "--layout", f"tp=1,pp=1,dp={devices},zero={zero}", "--seq-len", str(model_cfg.seq_len),
            "--micro-batch", str(batch_size // devices), "--micro-batches", "1"]
    precision = PLAN_RECIPES.get(recipe_name, recipe_name)
    return argv + (["--precision", precision] if precision in RECIPES else [])
