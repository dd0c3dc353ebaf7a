"""Model architectures by name (`model.architecture`): what the trainer builds, and the one
description of a model's matmuls that parameter counts, FLOPs and the cost models read.

Pure Python (no JAX): the config schema, sweep planning and `scaling plan` read an architecture
without loading it; the model's module is imported when a run first builds it. A new architecture
is one module plus its registration (examples/own_architecture.py):

    from scaling.train import architectures
    architectures.register("gelu", build=GeluTransformer, projections=gelu_projections,
                           doc="The ladder's transformer with a GELU MLP (two matrices, not three).")

then `model.architecture = "gelu"` in a config trains it, in any process that imported the module
registering it (a `scaling` command knows the built-in `transformer` only).

    build(cfg: ModelConfig, recipe, *, rngs) -> an nnx.Module with the interface of `LanguageModel`
    projections(cfg) -> [(d_in, d_out), ...]  one layer's quantised dense projections (2 FLOPs per
                        weight and token forward; the recipe's GEMM roles quantise them)
    attention(cfg)   -> [(flops, K), ...]    one layer's activation-activation matmuls: forward FLOPs
                        per token and reduction length (the recipe's attention role quantises them)
    other_params(cfg) -> int                 non-embedding parameters outside the projections (norm
                        gains; default: two per layer and a final one, `pre_norm_gains`)
    plan_shape(cfg)  -> the model in scaling.plan.shapes' keys, or None: `scaling plan step` cannot
                        price it (a run across devices then prints no plan-step command)

Every architecture has an embedding (vocab x d_model) and an untied output head (d_model x vocab),
which parameter counts and FLOPs add (scaling.train.ladder).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from scaling.errors import ConfigError, user_code

DEFAULT = "transformer"


@dataclass(frozen=True)
class ModelConfig:
    """A model's dimensions (scaling.train.ladder.config_for_size makes them from one knob) and its
    architecture; a static argument of the compiled step, so equal configs share a compilation."""

    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    vocab: int = 256  # byte tokens
    seq_len: int = 256
    smooth_swiglu: bool = False
    rope_base: float = 10_000.0
    init_std: float = 0.02  # N(0, 0.02²) init; output projections additionally / sqrt(2·n_layers)
    norm_eps: float = 1e-6
    architecture: str = DEFAULT

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads or self.head_dim % 2:
            raise ValueError(f"d_model={self.d_model} must split into n_heads={self.n_heads} even-sized heads")


class LanguageModel(Protocol):
    """What the compiled step (scaling.train.step, through scaling.train.model's loss_fn and
    grad_step) needs of a model: the recipe's structure, the [start, stop) of the layers that run the
    recipe (the others kept in high precision), and a forward pass giving float32 logits and aux:

        aux = {"telemetry": {role: [arrays whose last axis is a quant.TELEMETRY_FIELDS vector]},
               "act_max": (n_layers,) max |residual| after each layer,
               "swiglu_max": (n_layers,) max |MLP hidden| of each layer}

    Its dense layers are `scaling.numerics.layers.QDense` (the grad role's telemetry and delayed
    scale come back through their GradSinks)."""

    structure: Any

    def __call__(self, tokens_BxL: Any, *, key: Any = None, update_state: bool = True,
                 measure: Any = True) -> tuple[Any, dict]: ...

    def quantised_layers(self) -> tuple[int, int]: ...


@dataclass(frozen=True)
class Architecture:
    name: str
    build: Callable[..., LanguageModel] | str  # or "module:attribute", imported at first build
    projections: Callable[[ModelConfig], list[tuple[int, int]]]
    attention: Callable[[ModelConfig], list[tuple[float, int]]]
    other_params: Callable[[ModelConfig], int]
    plan_shape: Callable[[ModelConfig], dict] | None
    doc: str


_REGISTRY: dict[str, Architecture] = {}


def register(name: str, *, build: Callable[..., LanguageModel] | str,
             projections: Callable[[ModelConfig], list[tuple[int, int]]],
             attention: Callable[[ModelConfig], list[tuple[float, int]]] | None = None,
             other_params: Callable[[ModelConfig], int] | None = None,
             plan_shape: Callable[[ModelConfig], dict] | None = None, doc: str = "") -> Architecture:
    """Add an architecture (module docstring); `attention` defaults to causal softmax attention's
    (`causal_attention`), `other_params` to a pre-norm layer's norm gains (`pre_norm_gains`). A name
    already registered or not a non-empty string raises ConfigError."""
    if not isinstance(name, str) or not name:
        raise ConfigError("architecture", name, "a non-empty string")
    if name in _REGISTRY:
        raise ConfigError("architecture", name, "a name not yet registered (taken: " + ", ".join(_REGISTRY) + ")")
    for key, fn in (("build", build), ("projections", projections)):
        if not (callable(fn) or (key == "build" and isinstance(fn, str) and fn.count(":") == 1)):
            raise ConfigError(f"architecture.{name}.{key}", fn, "a function" + (" or 'module:attribute'" if key == "build" else ""))
    own = {key: _UserFunction(f"architecture.{name}.{key}", fn) if callable(fn) and not _ours(fn) else fn
           for key, fn in (("build", build), ("projections", projections), ("attention", attention),
                           ("other_params", other_params), ("plan_shape", plan_shape))}
    arch = Architecture(name, own["build"], own["projections"], own["attention"] or causal_attention,
                        own["other_params"] or pre_norm_gains, own["plan_shape"], " ".join(doc.split()))
    _REGISTRY[name] = arch
    return arch


def get(name: str) -> Architecture:
    if name not in _REGISTRY:
        raise ConfigError("model.architecture", name, f"a registered architecture: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def names() -> tuple[str, ...]:
    """The registered architectures, in registration order."""
    return tuple(_REGISTRY)


def of(cfg: ModelConfig) -> Architecture:
    return get(cfg.architecture)


def build(cfg: ModelConfig, recipe: Any, *, rngs: Any) -> LanguageModel:
    """The model of `cfg.architecture` under `recipe` (a "module:attribute" builder imported here)."""
    make = of(cfg).build
    if isinstance(make, str):
        module, attribute = make.split(":")
        with user_code(f"architecture.{cfg.architecture}.build"):
            make = getattr(importlib.import_module(module), attribute)
    return make(cfg, recipe, rngs=rngs)


def _ours(fn: Any) -> bool:
    return (getattr(fn, "__module__", None) or "").split(".")[0] == "scaling"


class _UserFunction:
    """A registered architecture's own function: an exception it raises becomes one line naming its
    file and line (errors.user_code), not a traceback from deep inside the trainer."""

    def __init__(self, key: str, fn: Callable[..., Any]):
        self.key, self.fn = key, fn
        try:
            self.file = inspect.getsourcefile(fn)
        except TypeError:  # a callable object or a builtin: the traceback's deepest frame
            self.file = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with user_code(self.key, self.file):
            return self.fn(*args, **kwargs)


# ---------------------------------------------------------------- the built-in transformer


def transformer_projections(cfg: ModelConfig) -> list[tuple[int, int]]:
    """(d_in, d_out) of each dense projection in one layer of `scaling.train.model.Transformer`: fused
    QKV, attention out, fused up+gate (SwiGLU), down (tests/train/test_model.py checks them against
    the model's own kernels)."""
    d, f = cfg.d_model, cfg.d_ff
    return [(d, 3 * d), (d, d), (d, 2 * f), (f, d)]


def causal_attention(cfg: ModelConfig) -> list[tuple[float, int]]:
    """Softmax attention's two matmuls per layer and token, forward: Q·Kᵀ (2·T·d FLOPs, reducing over
    head_dim) and P·V (2·T·d, reducing over T), over the full T×T (no causal discount)."""
    T, d = cfg.seq_len, cfg.d_model
    return [(2.0 * T * d, cfg.head_dim), (2.0 * T * d, T)]


def pre_norm_gains(cfg: ModelConfig) -> int:
    """Two norm gains (d each) per layer and a final norm's."""
    return (2 * cfg.n_layers + 1) * cfg.d_model


def transformer_plan_shape(cfg: ModelConfig) -> dict:
    """The transformer in scaling.plan.shapes' keys (multi-head attention, SwiGLU: gated)."""
    return {"layers": cfg.n_layers, "hidden": cfg.d_model, "heads": cfg.n_heads, "kv_heads": cfg.n_heads,
            "ffn": cfg.d_ff, "vocab": cfg.vocab, "gated": True}


register(DEFAULT, build="scaling.train.model:Transformer", projections=transformer_projections,
         plan_shape=transformer_plan_shape,
         doc="Pre-norm decoder: RMSNorm, causal multi-head attention with RoPE and a fused QKV projection, "
             "SwiGLU MLP (optionally Smooth-SwiGLU), untied head (scaling.train.model).")
