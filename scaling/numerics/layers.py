"""Precision recipes for your own Flax NNX model: a quantised dense layer, a quantised matmul, the
gradient step that keeps their state, and their telemetry.

    layer = QDense(in_features, out_features, "mxfp4", rngs=nnx.Rngs(0))
    y = layer(x, key=key)                                  # fprop quantised as the recipe says
    loss, grads = value_and_grad(loss_fn)(model, batch)    # dgrad and wgrad quantised too
    telemetry_by_layer(model)                              # {layer path: {role: {field: value}}}
    y = qdot(x, w, "mxfp4", key=key)                       # the same three GEMMs, no layer

Every GEMM is `scaling.numerics.gemm`'s: the forward Y = Q(X)·Q(W) and the backward dX = Q(dY)·Q(W)ᵀ,
dW = Q(X)ᵀ·Q(dY) run as one custom VJP, each operand quantised along that GEMM's reduction axis
(`quant.quantize`), so a layer here rounds bit for bit as the project's own transformer
(`scaling.train.model`) does. Stochastic rounding draws from the `key` passed to the call; without
a key a stochastic role rounds to nearest (evaluation).

A QDense owns its recipe's state as NNX variables: the element formats (runtime numbers, so layers
that differ only in format share one compiled program), the delayed-scaling amax histories, the
forward roles' telemetry of its last call, and a GradSink whose "gradient" from the backward pass
is the grad role's telemetry and amax history. `value_and_grad` differentiates the model's
nnx.Param and writes those sinks back ("overwrite with gradient"); plain `nnx.value_and_grad`
trains the same, but leaves the grad role's telemetry unmeasured and its delayed scale unused.
Call each QDense once per forward pass: a layer applied twice sums the two sinks.

The project's transformer (`scaling.train.model`) is built of these same layers and variables:
it builds each QDense from the recipe's structure alone (`QDense(d_in, d_out, structure, ...)`: no
format variables of its own) and passes the formats it keeps once for all layers with each call
(`formats=`), stacks its blocks' layers on a leading layer axis (their variables, telemetry
included, then hold one row per layer) and trains with this module's `value_and_grad`.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from scaling.numerics import gemm, precision, quant
from scaling.numerics.gemm import QdotState
from scaling.numerics.precision import GEMM_ROLES, Recipe, RecipeStructure

FORWARD_ROLES = ("weight", "activation")  # measured in the forward pass; the grad role in the backward


class FormatVector(nnx.Variable):
    """A role's element format as numbers [mbits, emin, emax, max] (`precision.format_vector`): a
    runtime value, so models that differ only in format share one compiled program."""


class AmaxHistory(nnx.Variable):
    """Delayed scaling: the amax of one forward role over its last steps, newest first."""


class GradSink(nnx.Variable):
    """[grad-role telemetry (gemm.TELEMETRY_SIZE), grad amax history]: the forward pass reads the
    history; the backward pass returns the new value as this variable's gradient, which
    `value_and_grad` writes back."""


class QuantTelemetry(nnx.Variable):
    """A forward role's quant.TELEMETRY_FIELDS vector from the layer's last call (NaN: not measured)."""


def _fields(vector: jax.Array) -> dict[str, jax.Array]:
    """quant.TELEMETRY_FIELDS of a telemetry vector (last axis; leading axes, e.g. stacked layers, kept)."""
    return {field: vector[..., i] for i, field in enumerate(quant.TELEMETRY_FIELDS)}


class QDense(nnx.Module):
    """y = x·W (+ b) with the three GEMMs of a dense layer quantised as `recipe` says.

    recipe: a preset or format name, a TOML-style table, a recipe file or a `precision.Recipe`
        (`precision.get`). The layer quantises the GEMM roles (weight, activation, grad); the
        attention role is for attention matmuls (`gemm.fake_quant_along`). A `RecipeStructure`
        alone: the layer keeps no formats of its own, and each call passes them (`formats=`), as
        a model that holds one set of formats for all its layers does.
    kernel_init: (key, shape, dtype) -> array; LeCun normal as nnx.Linear. Master weights are FP32.
    """

    def __init__(self, in_features: int, out_features: int,
                 recipe: Recipe | RecipeStructure | str | Mapping[str, Any], *, use_bias: bool = False,
                 kernel_init: Callable[..., jax.Array] = nnx.initializers.lecun_normal(), rngs: nnx.Rngs):
        if isinstance(recipe, RecipeStructure):
            structure, formats, self.recipe_name = recipe, {}, None
        else:
            recipe = precision.get(recipe)
            structure, self.recipe_name = recipe.structure(), recipe.name
            formats = {r: v for r, v in recipe.formats().items() if r in GEMM_ROLES}
        self.in_features, self.out_features = in_features, out_features
        self.structure = structure
        self.kernel = nnx.Param(kernel_init(rngs.params(), (in_features, out_features), jnp.float32))
        self.bias = nnx.Param(jnp.zeros((out_features,), jnp.float32)) if use_bias else None
        for role, vec in formats.items():
            setattr(self, f"format_{role}", FormatVector(vec))
        for role in FORWARD_ROLES:
            s = getattr(structure, role)
            if s is not None and s.scaling == "delayed":
                setattr(self, f"hist_{role}", AmaxHistory(jnp.zeros((s.amax_history,), jnp.float32)))
        for role in FORWARD_ROLES:
            if getattr(structure, role) is not None:
                setattr(self, f"telemetry_{role}", QuantTelemetry(jnp.full((gemm.TELEMETRY_SIZE,), jnp.nan, jnp.float32)))
        sg = structure.grad
        if sg is not None and not structure.forward_only:
            h = sg.amax_history if sg.scaling == "delayed" else 0
            # telemetry part NaN until a backward pass measured it; the history part starts empty
            self.grad_sink = GradSink(jnp.zeros((gemm.TELEMETRY_SIZE + h,), jnp.float32).at[:gemm.TELEMETRY_SIZE].set(jnp.nan))

    def _state(self, structure: RecipeStructure, formats: Mapping[str, jax.Array] | None) -> QdotState:
        if formats is None:
            formats = {r: getattr(self, f"format_{r}")[...] for r in GEMM_ROLES if hasattr(self, f"format_{r}")}
            if structure.quantises_gemms and not formats:
                raise ValueError("this QDense was built from a RecipeStructure: pass its formats with each call (formats=)")
        hist = {r: getattr(self, f"hist_{r}")[...] for r in FORWARD_ROLES if hasattr(self, f"hist_{r}")}
        sink = self.grad_sink[...] if hasattr(self, "grad_sink") else jnp.zeros((gemm.TELEMETRY_SIZE,), jnp.float32)
        return QdotState(fmt=formats, hist=hist, grad_sink=sink)

    def __call__(self, x: jax.Array, *, key: jax.Array | None = None, measure: jax.Array | bool = True,
                 update_state: bool = True, smooth_K: jax.Array | None = None,
                 structure: RecipeStructure | None = None, formats: Mapping[str, jax.Array] | None = None) -> jax.Array:
        """x (..., in_features) -> (..., out_features), fp32.

        key: feeds the stochastic rounding of this call's forward and backward GEMMs (None: nearest).
        measure: compute the telemetry (a bool, may be traced; NaN where false).
        update_state: roll the delayed-scaling histories (false for evaluation).
        smooth_K: a power-of-two scale per input channel, applied before X is quantised and undone
            on its grid values (Smooth-SwiGLU; `gemm.qdot_apply`).
        structure, formats: run this call under another structure than the layer's own, and with
            these format vectors (by role) instead of its own: a model that keeps one set of formats
            for all its layers, or runs some layers of a stack under its kept blocks' recipe. The
            layer's histories and sink are its own structure's; roles it has no telemetry
            variable for are not kept."""
        structure = self.structure if structure is None else structure
        y, telem, new_hist = gemm.qdot_apply(x, self.kernel[...], structure, self._state(structure, formats), key,
                                             smooth_K, measure)
        if update_state:
            for role, h in new_hist.items():
                getattr(self, f"hist_{role}")[...] = h
        for role, vector in telem.items():
            if hasattr(self, f"telemetry_{role}"):
                getattr(self, f"telemetry_{role}")[...] = vector
        return y if self.bias is None else y + self.bias[...]

    def forward_telemetry(self) -> dict[str, jax.Array]:
        """{role: quant.TELEMETRY_FIELDS vector} of the forward roles (weight, activation) from the
        last call: the raw vectors `telemetry()` names the fields of."""
        return {r: getattr(self, f"telemetry_{r}")[...] for r in FORWARD_ROLES if hasattr(self, f"telemetry_{r}")}

    def telemetry(self) -> dict[str, dict[str, jax.Array]]:
        """{role: {quant.TELEMETRY_FIELDS: value}} of the quantised roles: weight and activation
        from the last forward pass, grad (dY as the dgrad GEMM quantised it) from the last
        `value_and_grad`; NaN where not measured. A stacked layer (the project transformer's
        blocks) gives each field per layer."""
        out = {r: _fields(v) for r, v in self.forward_telemetry().items()}
        if hasattr(self, "grad_sink"):
            out["grad"] = _fields(self.grad_sink[...][..., :gemm.TELEMETRY_SIZE])
        return out


def telemetry_by_layer(model: nnx.Module) -> dict[str, dict[str, dict[str, jax.Array]]]:
    """{'path/to/layer': QDense.telemetry()} for every QDense in `model` that quantises something."""
    return {"/".join(map(str, path)): node.telemetry() for path, node in nnx.iter_graph(model)
            if isinstance(node, QDense) and node.structure.quantises_gemms}


def value_and_grad(fn: Callable[..., Any], *, has_aux: bool = False) -> Callable[..., tuple[Any, nnx.State]]:
    """`nnx.value_and_grad(fn, has_aux=has_aux)` for fn(model, *args): returns (value, gradients of
    the model's nnx.Param). The QDense layers' GradSinks are differentiated too and their
    "gradients" (the grad role's telemetry and new amax history) written back into `model`."""

    def wrapped(model: nnx.Module, *args: Any, **kwargs: Any) -> tuple[Any, nnx.State]:
        wrt = nnx.DiffState(0, nnx.Any(nnx.Param, GradSink))
        value, grads_and_sinks = nnx.value_and_grad(fn, argnums=wrt, has_aux=has_aux)(model, *args, **kwargs)
        grads, sinks = nnx.split_state(grads_and_sinks, nnx.Param, GradSink)
        nnx.update(model, sinks)
        return value, grads

    return wrapped


def qdot(x_MxK: jax.Array, w_KxN: jax.Array, recipe: Recipe | str | Mapping[str, Any], *,
         key: jax.Array | None = None, with_telemetry: bool = False) -> jax.Array | tuple[jax.Array, dict]:
    """x·w with the forward and both backward GEMMs quantised as `recipe` says (differentiable;
    leading batch axes of x are kept). `key` feeds stochastic rounding (None: nearest).
    with_telemetry: also return {role: {quant.TELEMETRY_FIELDS: value}} of the forward roles. The
    grad role is measured in the backward pass: use QDense with `value_and_grad` for it, and for
    delayed scaling (here every call starts with an empty amax history: the current amax)."""
    recipe = precision.get(recipe)
    structure = recipe.structure()
    y, telem, _ = gemm.qdot_apply(x_MxK, w_KxN, structure, gemm.qdot_state(recipe, structure), key,
                                  measure=with_telemetry)
    return (y, {role: _fields(v) for role, v in telem.items()}) if with_telemetry else y
