"""Run configuration: nested TOML sections, each key declared once (its default, its check and what
it means, in the dataclasses below), validated once (`validate`), and hashed into a run id from an
explicit, versioned canonical form (`canonical_form`).

    name = "smoke"
    precision = "fp8"          # a preset, a format name, a recipe file (.toml) or a [precision] table
    seed = 0
    [model]  size, seq_len, smooth_swiglu, n_layers, architecture
    [data]   source, tokenizer, eval_tokens
    [train]  tokens, batch_size, lr, weight_decay, warmup, schedule, decay, eval_at (token budgets:
             fractions of train.tokens), grad_clip, log_every, checkpoint_every, tracker
    [health] spike_factor, spike_window, max_saturation
    [study]  flop_budgets (the compute budget each train.eval_at evaluation serves), cost
    [parallel] data (replicas: devices the batch is split over), fsdp (weights and Adam state sharded too)

Every key with its default, what it allows and what it means: `reference_table()`, which
docs/training.md holds (a test keeps the two equal). Overrides and sweep axes use dotted keys
(`train.lr=1e-3`); values use TOML syntax and fall back to a plain string (`precision=fp4`). Every
key is checked: unknown keys, wrong types and out-of-range values raise ConfigError naming the key,
the value and what is allowed.

One module: the schema, its checks and the canonical form the run id hashes
change together whenever a key is added.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.util
import json
import re
import tomllib
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Callable

from scaling.train import architectures, data, ladder
from scaling.plan import hardware
from scaling.errors import ConfigError

DEFAULT_EVAL_AT = {"wsd": [0.25, 0.5, 1.0], "cosine": [1.0]}  # train.eval_at when unset, per schedule

# ---------------------------------------------------------------- checks: (dotted key, value) -> value

# Each check returns the normalised value or raises ConfigError; `check.allowed` is what its error
# message (and the reference table) says is allowed.


def _allowing(allowed: str) -> Callable[[Callable], Callable]:
    def tag(check: Callable) -> Callable:
        check.allowed = allowed
        return check

    return tag


def _integer(lo: int, hi: int | None = None) -> Callable[[str, Any], int]:
    allowed = f"an integer >= {lo}" + (f" and <= {hi}" if hi is not None else "")

    def check(key: str, value: Any) -> int:
        # 2e6 from a TOML float is a fine token count; 2.5 or true is not.
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
            raise ConfigError(key, value, allowed)
        return value

    check.allowed = allowed
    return check


def _optional(check: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    """None (the default: unset) or a value `check` accepts."""

    @_allowing(f"{check.allowed}, or unset")
    def optional(key: str, value: Any) -> Any:
        return None if value is None else check(key, value)

    return optional


def _real(lo: float, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False):
    lo_text = f"> {lo:g}" if lo_open else f">= {lo:g}"
    hi_text = "" if hi is None else (f" and < {hi:g}" if hi_open else f" and <= {hi:g}")
    allowed = f"a number {lo_text}{hi_text}"

    def check(key: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, value, allowed)
        number = float(value)
        too_low = number <= lo if lo_open else number < lo
        too_high = hi is not None and (number >= hi if hi_open else number > hi)
        if too_low or too_high or number != number:
            raise ConfigError(key, value, allowed)
        return number

    check.allowed = allowed
    return check


@_allowing('a number > 0, or "auto" (the tuned rate for model.size)')
def _learning_rate(key: str, value: Any) -> float | str:
    if value == "auto":
        return value  # resolved from model.size in validate()
    try:
        return _real(0.0, lo_open=True)(key, value)
    except ConfigError:
        raise ConfigError(key, value, _learning_rate.allowed) from None


@_allowing("true or false")
def _boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(key, value, _boolean.allowed)
    return value


def _choice(*options: str) -> Callable[[str, Any], str]:
    def check(key: str, value: Any) -> str:
        if value not in options:
            raise ConfigError(key, value, options)
        return value

    check.allowed = "one of " + ", ".join(options)
    return check


@_allowing("a name of letters, digits, '_', '.', '-'")
def _name(key: str, value: Any) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", value):
        raise ConfigError(key, value, _name.allowed)
    return value


@_allowing("a preset or format name, a recipe file (.toml), or a [precision] table")
def _precision(key: str, value: Any) -> str | dict:
    if not isinstance(value, (str, dict)):
        raise ConfigError(key, value, _precision.allowed)
    return value  # read and parsed once, into RunConfig.precision and .recipe, by validate


@_allowing('"stdlib", "pysrc", "synthetic", or an existing file or directory')
def _source(key: str, value: Any) -> str:
    if not isinstance(value, str) or not (value in ("stdlib", "pysrc", "synthetic") or Path(value).expanduser().exists()):
        raise ConfigError(key, value, _source.allowed)
    return value


@_allowing('"" (any), or 12 to 64 hex digits: the start of the corpus\'s sha256 (the results\' `corpus` column)')
def _fingerprint(key: str, value: Any) -> str:
    if not isinstance(value, str) or not (value == "" or (12 <= len(value) <= 64 and all(c in "0123456789abcdef" for c in value))):
        raise ConfigError(key, value, _fingerprint.allowed)
    return value


@_allowing('a registered architecture (scaling.train.architectures): "transformer", or one your module registers')
def _architecture(key: str, value: Any) -> str:
    return architectures.get(value).name  # raises ConfigError naming model.architecture and the registered names


@_allowing(data.TOKENIZER_ALLOWED + " (a BPE for text sources only)")
def _tokenizer(key: str, value: Any) -> str:
    vocab = data.tokenizer_vocab(value)  # raises ConfigError naming data.tokenizer
    return "bytes" if vocab is None else f"bpe:{vocab}"  # "bpe:04096" is the run "bpe:4096"


@_allowing("a fraction of the steps in [0, 1), or a whole number of steps >= 1")
def _warmup(key: str, value: Any) -> float | int:
    allowed = _warmup.allowed
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        raise ConfigError(key, value, allowed)
    if value < 1:
        return float(value)
    if not float(value).is_integer():
        raise ConfigError(key, value, allowed)
    return int(value)


@_allowing("one compute budget per train.eval_at entry (0 = none), the others > 0 and ascending; or []")
def _flop_budgets(key: str, value: Any) -> list[float]:
    allowed = _flop_budgets.allowed
    if not isinstance(value, list):
        raise ConfigError(key, value, allowed)
    flops = [_real(0.0)(key, v) for v in value]
    labelled = [f for f in flops if f > 0]
    if labelled != sorted(set(labelled)) or (flops and not labelled):
        raise ConfigError(key, value, allowed)
    return flops


@_allowing('"bits", "nominal", or a GPU of scaling.plan.hardware.GPUS (e.g. "h100")')
def _cost_model(key: str, value: Any) -> str:
    options = ("bits", "nominal", *hardware.GPUS)
    if value not in options:
        raise ConfigError(key, value, options)
    return value


TRACKERS = ("tensorboard", "wandb")


@_allowing(f"a list of distinct trackers from {', '.join(TRACKERS)}, or []")
def _trackers(key: str, value: Any) -> list[str]:
    if not isinstance(value, list) or len(set(map(str, value))) != len(value) or any(t not in TRACKERS for t in value):
        raise ConfigError(key, value, _trackers.allowed)
    if "wandb" in value and importlib.util.find_spec("wandb") is None:
        raise ConfigError(key, value, "trackers whose package is installed: wandb is not (pip install wandb)")
    return value


@_allowing("an ascending list of distinct fractions in (0, 1] ending with 1.0")
def _eval_at(key: str, value: Any) -> list[float]:
    allowed = _eval_at.allowed
    if not isinstance(value, list) or not value:
        raise ConfigError(key, value, allowed)
    fractions = [_real(0.0, 1.0, lo_open=True)(key, v) for v in value]
    if fractions != sorted(set(fractions)) or fractions[-1] != 1.0:
        raise ConfigError(key, value, allowed)
    return fractions


# ---------------------------------------------------------------- the schema, declared once


@dataclass(frozen=True)
class Setting:
    """One config key: its default, its check, and what the reference table says of it."""

    default: Any
    check: Callable[[str, Any], Any]  # (dotted key, value) -> normalised value, or raise ConfigError
    meaning: str
    shown_default: str | None = None  # the table's default column where the value alone misleads

    @property
    def allowed(self) -> str:
        return self.check.allowed


def setting(default: Any, check: Callable[[str, Any], Any], meaning: str, *, shown_default: str | None = None) -> Any:
    """A dataclass field declaring a config key: default, check and meaning in one place."""
    return field(default=default, metadata={"setting": Setting(default, check, meaning, shown_default)})


def section() -> Any:
    """A dataclass field holding a [section] of settings (its type is in SECTIONS)."""
    return field(metadata={"section": True})


@dataclass(frozen=True, kw_only=True)
class Model:
    size: int = setting(1, _integer(1), "The ladder size: d_model = 32·size, n_layers = 2 + size // 2 "
                        "(the model table below).")
    seq_len: int = setting(128, _integer(2), "Tokens per training sequence (the context length).")
    smooth_swiglu: bool = setting(False, _boolean, "Smooth-SwiGLU: the down-projection input scaled per "
                                  "channel by a power of two before it is quantised (Fishman et al. 2024).")
    n_layers: int | None = setting(None, _optional(_integer(1)), "Another depth at the size's width; unset "
                                   "(or the ladder's depth) is the ladder size.")
    architecture: str = setting(architectures.DEFAULT, _architecture, "The model the ladder's dimensions build: "
                                "the built-in transformer (scaling.train.model) or one registered with "
                                "scaling.train.architectures.register (docs/training.md).")

    def shape(self, vocab: int = 256) -> ladder.ModelConfig:
        """The model's dimensions and architecture (scaling.train.ladder.config_for_size)."""
        return ladder.config_for_size(self.size, vocab=vocab, seq_len=self.seq_len, smooth_swiglu=self.smooth_swiglu,
                                      n_layers=self.n_layers, architecture=self.architecture)


@dataclass(frozen=True, kw_only=True)
class Data:
    source: str = setting("stdlib", _source, "The corpus: this interpreter's standard library (`stdlib`), every "
                          "importable `*.py` (`pysrc`), a Markov chain of known entropy (`synthetic`, for "
                          "tests), text files, or a `.npy` / `.bin` token array.")
    tokenizer: str = setting("bytes", _tokenizer, "One token per byte, or a byte-level BPE of VOCAB tokens "
                             "trained on the training split.")
    eval_tokens: int = setting(65536, _integer(1), "Validation tokens per evaluation, in windows spread over "
                               "the validation split.")
    fingerprint: str = setting("", _fingerprint, "The corpus the run must train on: `pysrc` and `stdlib` are "
                               "what this installation holds, so another venv or checkout path is other data. "
                               "A run whose source resolves to another fingerprint stops before it trains; "
                               "`\"\"`: any.")


@dataclass(frozen=True, kw_only=True)
class Train:
    tokens: int = setting(2_000_000, _integer(1), "Tokens trained (D); steps = tokens // (batch_size × seq_len).")
    batch_size: int = setting(32, _integer(1), "Sequences per step.")
    lr: float = setting(3e-3, _learning_rate, "AdamW's peak learning rate; `\"auto\"` is resolved (before the "
                        "run id) to the ladder's tuned rate for model.size.")
    weight_decay: float = setting(0.1, _real(0.0), "AdamW's decoupled weight decay.")
    warmup: float | int = setting(0.05, _warmup, "Linear warmup, as a fraction of the steps or in steps (in steps, "
                                  "runs of one size trained to different lengths warm up alike).")
    schedule: str = setting("wsd", _choice("wsd", "cosine"), "`wsd`: warmup, constant, linear cooldown to 0, "
                            "one cooldown branch per train.eval_at entry; `cosine`: one evaluation at the end.")
    decay: float = setting(0.2, _real(0.0, 1.0, lo_open=True), "WSD cooldown length, as a fraction of each "
                           "evaluation's steps.")
    eval_at: tuple[float, ...] | None = setting(
        None, _eval_at, "Token budgets of the run, as fractions of train.tokens: each is evaluated at the "
        "end of its own cooldown branch (WSD), one results row each.",
        shown_default="`[0.25, 0.5, 1.0]` (wsd), `[1.0]` (cosine)")
    grad_clip: float = setting(1.0, _real(0.0), "Global gradient-norm clip; 0 = none.")
    log_every: int = setting(10, _integer(1), "Steps between metrics.jsonl lines.")
    checkpoint_every: int = setting(100, _integer(0), "Steps between checkpoints; 0 = never.")
    tracker: tuple[str, ...] = setting((), _trackers, "Live mirrors of metrics.jsonl (scaling.train.tracking).")


@dataclass(frozen=True, kw_only=True)
class Health:
    spike_factor: float = setting(3.0, _real(1.0, lo_open=True), "A loss above this × the running median "
                                  "stops the run as diverged.")
    spike_window: int = setting(50, _integer(1), "Losses in that running median.")
    max_saturation: float = setting(0.01, _real(0.0, 1.0), "A saturated fraction of a quantised tensor above "
                                    "this is logged.")


@dataclass(frozen=True, kw_only=True)
class Study:
    """Labels only: training does not read them; an IsoFLOP design sets them, results rows carry them."""

    flop_budgets: tuple[float, ...] = setting(
        (), _flop_budgets, "The compute budget, in 16-bit FLOPs under study.cost, that each train.eval_at "
        "evaluation serves (0 = none); results rows carry it as `budget`.")
    cost: str = setting("bits", _cost_model, "The cost model of study.flop_budgets (scaling.train.compute).")


@dataclass(frozen=True, kw_only=True)
class Parallel:
    """A layout, not a setting of the experiment: the step is one global computation whatever the
    devices (scaling.train.parallel), so these keys never enter the run id."""

    data: int = setting(1, _integer(1), "Replicas: the batch is split over this many devices (mesh axis `data`; "
                        "every device of every process with several hosts); 1 = one device. Must divide "
                        "train.batch_size. Fewer devices left than this (a run resuming from its checkpoint): they "
                        "take the missing replicas' rows; a run starting fresh on fewer is refused.")
    fsdp: bool = setting(False, _boolean, "Fully sharded data parallel: the master weights and Adam state are "
                         "sharded along `data` too (each array on its largest axis the devices divide).")


SECTIONS = {"model": Model, "data": Data, "train": Train, "health": Health, "study": Study, "parallel": Parallel}


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """A run's resolved config: every key checked and defaulted once (validate), immutable, typed.
    `precision` is a preset or format name, or a table (a recipe file is read into its table, so the
    config, its id and config.json hold what the file said); `recipe` is it parsed
    (scaling.numerics.precision.Recipe). `to_dict()` is the JSON form config.json stores."""

    name: str = setting("run", _name, "The run's name: its directory is `runs/<name>/<run_id>` (unless `--out`).")
    precision: str | dict = setting(
        "fp32", _precision, "The numerics recipe: a preset (`fp8`, `mxfp4`, ...), an element format (`e3m4`: "
        "every GEMM input, per tensor), a `[precision]` table, or a recipe file, read into its table "
        "([precision.md](precision.md)).")
    seed: int = setting(0, _integer(0, 2**31 - 1), "The initial weights, the batch order and every PRNG key "
                        "(a JAX int32 seed).")
    model: Model = section()
    data: Data = section()
    train: Train = section()
    health: Health = section()
    study: Study = section()
    parallel: Parallel = section()
    recipe: Any = field(compare=False, repr=False)

    @property
    def tokens_per_step(self) -> int:
        return self.train.batch_size * self.model.seq_len

    @property
    def steps(self) -> int:
        return self.train.tokens // self.tokens_per_step

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "recipe"}
        return {k: (_section_dict(v) if is_dataclass(v) else copy.deepcopy(v)) for k, v in d.items()}

    @functools.cached_property
    def run_id(self) -> str:
        """12 hex characters of sha256 over the canonical JSON of `canonical_form(self)`."""
        text = json.dumps(canonical_form(self), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def replace(self, **dotted: Any) -> RunConfig:
        """A new validated config with `dotted` keys set (`replace(**{"train.tokens": 512})`). Values
        validate resolved stay resolved: `lr = "auto"` kept its size's number, so a config for
        another size is built from the config as written, not replaced from this one."""
        cfg = self.to_dict()
        for key, value in dotted.items():
            set_dotted(cfg, key, value)
        return validate(cfg)


def _section_dict(section: Any) -> dict:
    return {f.name: list(v) if isinstance(v := getattr(section, f.name), tuple) else v for f in fields(section)}


def _schema(cls: type) -> dict[str, Any]:
    """{key: Setting, section: {key: Setting}} in declaration order, read from the dataclasses."""
    out: dict[str, Any] = {}
    for f in fields(cls):
        if "setting" in f.metadata:
            out[f.name] = f.metadata["setting"]
        elif "section" in f.metadata:
            out[f.name] = _schema(SECTIONS[f.name])
    return out


SCHEMA: dict[str, Any] = _schema(RunConfig)  # a view of the declarations above, not a second copy


def settings() -> dict[str, Setting]:
    """Every key, dotted (`train.lr`), in declaration order."""
    out = {}
    for name, spec in SCHEMA.items():
        if isinstance(spec, dict):
            out.update({f"{name}.{key}": s for key, s in spec.items()})
        else:
            out[name] = spec
    return out


# ---------------------------------------------------------------- the run id's canonical form

# The canonical form is versioned. Version 1 is hashed as it stands, so every run id ever made keeps
# its value; a later version adds {"version": N} to what is hashed, so its ids never meet version 1's.
RUN_ID_VERSION = 1


def canonical_form(cfg: RunConfig) -> dict:
    """What a run id hashes (version 1): the resolved config (defaults written out, `lr = "auto"` as
    its number, n_layers equal to the ladder's depth as unset, a recipe file as its table), under the
    names and with the keys below. Tuples are JSON lists, numbers JSON numbers (2e6 tokens = 2000000).

    Every key enters under its own name except train.eval_at and study.flop_budgets, hashed under the
    names they had when these ids were first made (train.budgets, study.budgets); train.eval_every,
    a knob since removed, is hashed at the value every run had (0). Keys added after the first ids
    enter only where they differ from what every earlier run had: model.n_layers when set,
    model.architecture when not "transformer",
    data.tokenizer when not "bytes", train.tracker when not empty, and [study] when it has flop
    budgets (without them study.cost labels nothing and is left out). [parallel] is never hashed:
    the device count and the sharding are a layout of one global computation whose numerics are
    the same up to float32 summation order (scaling.train.parallel). data.fingerprint is never
    hashed: it checks which data the source resolves to and is not a setting of the experiment (the
    results rows record the corpus each run trained on)."""
    m, d, t, h, s = cfg.model, cfg.data, cfg.train, cfg.health, cfg.study
    form = {
        "name": cfg.name,
        "precision": copy.deepcopy(cfg.precision),
        "seed": cfg.seed,
        "model": {"size": m.size, "seq_len": m.seq_len, "smooth_swiglu": m.smooth_swiglu},
        "data": {"source": d.source, "eval_tokens": d.eval_tokens},
        "train": {"tokens": t.tokens, "batch_size": t.batch_size, "lr": t.lr, "weight_decay": t.weight_decay,
                  "warmup": t.warmup, "schedule": t.schedule, "decay": t.decay, "budgets": list(t.eval_at),
                  "grad_clip": t.grad_clip, "log_every": t.log_every, "checkpoint_every": t.checkpoint_every,
                  "eval_every": 0},
        "health": {"spike_factor": h.spike_factor, "spike_window": h.spike_window,
                   "max_saturation": h.max_saturation},
    }
    if m.n_layers is not None:
        form["model"]["n_layers"] = m.n_layers
    if m.architecture != architectures.DEFAULT:
        form["model"]["architecture"] = m.architecture
    if d.tokenizer != "bytes":
        form["data"]["tokenizer"] = d.tokenizer
    if t.tracker:
        form["train"]["tracker"] = list(t.tracker)
    if s.flop_budgets:
        form["study"] = {"budgets": list(s.flop_budgets), "cost": s.cost}
    return form


def run_id(cfg: dict | RunConfig) -> str:
    """The run id of a config (RunConfig.run_id), validating a dict first."""
    return validate(cfg).run_id


# ---------------------------------------------------------------- validation


def validate(cfg: dict | RunConfig) -> RunConfig:
    """The resolved config: defaults filled, every value checked and normalised. Raises ConfigError.
    A RunConfig is already resolved and comes back as it is."""
    if isinstance(cfg, RunConfig):
        return cfg
    if not isinstance(cfg, dict):
        raise ConfigError("config", cfg, "a table of sections")
    resolved = _resolve(cfg, SCHEMA, prefix="")
    resolved["precision"] = _read_recipe_files(resolved["precision"], "precision")
    recipe = _recipe(resolved["precision"])
    train, model = resolved["train"], resolved["model"]
    if train["eval_at"] is None:
        train["eval_at"] = list(DEFAULT_EVAL_AT[train["schedule"]])
    if train["schedule"] == "cosine" and train["eval_at"] != [1.0]:
        raise ConfigError("train.eval_at", train["eval_at"], "[1.0] with schedule = 'cosine' (only WSD branches)")
    tokens_per_step = train["batch_size"] * model["seq_len"]
    steps = train["tokens"] // tokens_per_step
    if steps < 1:
        raise ConfigError("train.tokens", train["tokens"], f"at least batch_size x seq_len = {tokens_per_step}")
    eval_steps = [round(f * steps) for f in train["eval_at"]]
    if eval_steps[0] < 1 or len(set(eval_steps)) != len(eval_steps):
        raise ConfigError("train.eval_at", train["eval_at"],
                          f"fractions of the {steps} steps giving distinct step counts >= 1")
    if train["warmup"] >= 1 and train["warmup"] >= eval_steps[-1]:
        raise ConfigError("train.warmup", train["warmup"], f"fewer steps than the run's {eval_steps[-1]}")
    if resolved["data"]["tokenizer"] != "bytes":  # a BPE needs text: not the synthetic chain, not token arrays
        data.tokenizer_vocab(resolved["data"]["tokenizer"], resolved["data"]["source"])
    study = resolved["study"]
    if study["flop_budgets"] and len(study["flop_budgets"]) != len(train["eval_at"]):
        raise ConfigError("study.flop_budgets", study["flop_budgets"],
                          f"one budget per train.eval_at entry ({len(train['eval_at'])})")
    if train["batch_size"] % resolved["parallel"]["data"]:
        raise ConfigError("parallel.data", resolved["parallel"]["data"],
                          f"a divisor of train.batch_size = {train['batch_size']} (each replica takes whole sequences)")
    _check_model(resolved)
    model["n_layers"] = ladder.depth_override(model["size"], model["n_layers"])
    if train["lr"] == "auto":  # resolved here, so a run's config, id and results hold the number
        train["lr"] = ladder.ladder_lr(model["size"])
    sections = {key: cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in resolved[key].items()})
                for key, cls in SECTIONS.items()}
    return RunConfig(name=resolved["name"], precision=resolved["precision"], seed=resolved["seed"], **sections,
                     recipe=recipe)


def _resolve(cfg: dict, schema: dict, prefix: str) -> dict:
    unknown = sorted(set(cfg) - set(schema))
    if unknown:
        key = prefix + unknown[0]
        if key in RENAMED:
            raise ConfigError(key, cfg[unknown[0]], f"{RENAMED[key]} (the key's name now; same meaning)")
        where = f"the [{prefix.rstrip('.')}] keys" if prefix else "the top-level keys"
        raise ConfigError(key, cfg[unknown[0]], f"one of {where}: {', '.join(schema)}")
    resolved = {}
    for key, spec in schema.items():
        dotted = prefix + key
        if isinstance(spec, dict):
            section_table = cfg.get(key, {})
            if not isinstance(section_table, dict):
                raise ConfigError(dotted, section_table, f"a [{dotted}] table")
            resolved[key] = _resolve(section_table, spec, dotted + ".")
        elif key in cfg:
            resolved[key] = spec.check(dotted, copy.deepcopy(cfg[key]))
        else:  # tuple defaults (immutable in the dataclasses) resolve as the lists a file would give
            resolved[key] = list(spec.default) if isinstance(spec.default, tuple) else copy.deepcopy(spec.default)
    return resolved


def _read_recipe_files(spec: str | dict, key: str, reading: tuple[Path, ...] = ()) -> str | dict:
    """`spec` with every recipe file it names (itself, or a table's `base`) replaced by the file's
    [precision] table (or the whole file if it has none): a run is what its recipe said when it was
    configured, so editing the file gives a new run and moving it does not."""
    if isinstance(spec, dict):
        return {**spec, "base": _read_recipe_files(spec["base"], f"{key}.base", reading)} if "base" in spec else spec
    if not _names_recipe_file(spec):
        return spec
    path = Path(spec).expanduser().resolve()
    if path in reading:
        raise ConfigError(key, spec, "a recipe file that does not name itself")
    try:
        table = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(key, spec, f"a readable TOML recipe file ({e})") from None
    return _read_recipe_files(table.get("precision", table), key, (*reading, path))


def _names_recipe_file(spec: Any) -> bool:
    return (isinstance(spec, str) and spec.endswith(".toml")) or (isinstance(spec, dict) and _names_recipe_file(spec.get("base")))


def _recipe(spec: str | dict):
    from scaling.numerics import precision  # imports JAX; only configs that get this far need it

    return precision.get(spec)  # raises ConfigError naming what is wrong


def _check_model(cfg: dict) -> None:
    """The ladder owns which sizes exist; let it reject what it cannot build."""
    m = cfg["model"]
    ladder.config_for_size(m["size"], seq_len=m["seq_len"], smooth_swiglu=m["smooth_swiglu"], n_layers=m["n_layers"],
                           architecture=m["architecture"])


# ---------------------------------------------------------------- config.json of earlier versions

# Keys config.json files hold under the names they had before (run directories outlive renames).
RENAMED = {"train.budgets": "train.eval_at", "study.budgets": "study.flop_budgets"}
REMOVED = {"train.eval_every": 0}  # removed knobs, at the one value every stored run had


def upgrade(stored: dict) -> dict:
    """A stored config (a run directory's config.json, of any version) in today's keys: renamed keys
    under their names now, removed knobs dropped where they hold the value every run had. Anything
    else is left for validate to judge. A stored recipe file path is refused: what the file said when
    the run began is not known, so the run cannot be told apart from one of the file as it is now."""
    if not isinstance(stored, dict):
        return stored
    if _names_recipe_file(stored.get("precision")):
        raise ConfigError("precision", stored["precision"], "a recipe table in a stored config (what the file said then)")
    out = copy.deepcopy(stored)
    for old, new in RENAMED.items():
        section, key = old.split(".")
        table = out.get(section)
        if isinstance(table, dict) and key in table and new.split(".")[1] not in table:
            table[new.split(".")[1]] = table.pop(key)
    for old, value in REMOVED.items():
        section, key = old.split(".")
        table = out.get(section)
        if isinstance(table, dict) and table.get(key, object()) == value:
            del table[key]
    return out


# ---------------------------------------------------------------- the reference table (docs/training.md)


def reference_table() -> str:
    """Every key as a Markdown table (key, default, allowed values, meaning): docs/training.md's."""
    rows = ["| key | default | allowed | meaning |", "| --- | --- | --- | --- |"]
    for key, s in settings().items():
        default = s.shown_default or ("unset" if s.default is None else f"`{_toml_text(s.default)}`")
        cells = [f"`{key}`", default, s.allowed, s.meaning]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


def _toml_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_text(v) for v in value) + "]"
    return repr(value)


# ---------------------------------------------------------------- files and overrides


def parse_value(text: str) -> Any:
    """TOML value syntax (`3e-3`, `true`, `[0.5, 1.0]`, `"x"`), else the text itself (`fp4`)."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(cfg: dict, overrides: list[str]) -> dict:
    """A copy of `cfg` with each `dotted.key=value` set (unknown keys are caught by validate)."""
    cfg = copy.deepcopy(cfg)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError("--set", item, "key=value, e.g. train.lr=1e-3")
        set_dotted(cfg, key.strip(), parse_value(text.strip()))
    return cfg


def set_dotted(cfg: dict, dotted: str, value: Any) -> None:
    """cfg["a"]["b"] = value for dotted = "a.b", creating tables on the way."""
    *parents, leaf = dotted.split(".")
    node = cfg
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(dotted, value, f"a key whose parent {part!r} is a table")
    node[leaf] = value


def load(path: str | Path, overrides: list[str] = ()) -> dict:
    """The TOML file at `path` with `overrides` applied (not yet validated)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("config", str(path), "an existing TOML file")
    try:
        cfg = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("config", str(path), f"valid TOML ({e})") from None
    return apply_overrides(cfg, list(overrides))
