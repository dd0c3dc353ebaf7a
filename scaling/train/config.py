"""Run configuration: nested TOML sections, validated against one schema, with defaults.

    name = "smoke"
    precision = "fp8"          # a preset, a format name, or a [precision] table (scaling.numerics.precision.get)
    seed = 0
    [model]  size, seq_len, smooth_swiglu, n_layers (unset: the ladder's depth for size; set: that
             depth at the size's width, scaling.train.ladder.config_for_size)
    [data]   source ("stdlib" | "pysrc" | "synthetic" | a text file or directory | a .npy/.bin token
             array), tokenizer ("bytes" | "bpe:VOCAB", VOCAB 257..65536; BPE for text sources only),
             eval_tokens (scaling.train.data)
    [train]  tokens (the budget D), batch_size, lr (a number, or "auto": the ladder's tuned rate for
             model.size, scaling.train.ladder.ladder_lr), weight_decay, warmup (a fraction of the steps
             below 1, or a whole number of steps: an IsoFLOP design fixes it in steps, so a
             size trained to different lengths shares its warmup),
             schedule ("wsd" | "cosine"), decay (WSD cooldown fraction), budgets (WSD evaluation
             budgets as fractions of tokens, ending at 1.0), grad_clip, log_every,
             checkpoint_every (steps; 0 = never), tracker (live curves mirrored from metrics.jsonl:
             a list of "tensorboard", "wandb"; default [], scaling.train.tracking)
    [health] spike_factor, spike_window, max_saturation (in-flight thresholds)
    [study]  budgets (the compute budget each train.budgets evaluation serves, in 16-bit FLOPs
             under study.cost, 0 = none; set by an IsoFLOP design, scaling.study.analysis.design), cost

Overrides and sweep axes use dotted keys (`train.lr=1e-3`); values use TOML syntax and fall
back to a plain string (`precision=fp4`). Every key is checked: unknown keys, wrong types and
out-of-range values raise ConfigError naming the key, the value and what is allowed.
`run_id` hashes the resolved config, so a config written with or without defaults gets one id.
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

from scaling.train import data, ladder
from scaling.plan import hardware
from scaling.errors import ConfigError

WSD_BUDGETS = [0.25, 0.5, 1.0]


@dataclass(frozen=True)
class Field:
    default: Any
    check: Callable[[str, Any], Any]  # (dotted key, value) -> normalised value, or raise ConfigError


def _integer(lo: int, hi: int | None = None) -> Callable[[str, Any], int]:
    allowed = f"an integer >= {lo}" + (f" and <= {hi}" if hi is not None else "")

    def check(key: str, value: Any) -> int:
        # 2e6 from a TOML float is a fine token count; 2.5 or true is not.
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
            raise ConfigError(key, value, allowed)
        return value

    return check


def _optional(check: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    """None (the default: unset) or a value `check` accepts."""
    return lambda key, value: None if value is None else check(key, value)


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

    return check


def _learning_rate(key: str, value: Any) -> float | str:
    if value == "auto":
        return value  # resolved from model.size in validate()
    try:
        return _real(0.0, lo_open=True)(key, value)
    except ConfigError:
        raise ConfigError(key, value, 'a number > 0, or "auto" (the tuned rate for model.size)') from None


def _boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(key, value, "true or false")
    return value


def _choice(*options: str) -> Callable[[str, Any], str]:
    def check(key: str, value: Any) -> str:
        if value not in options:
            raise ConfigError(key, value, options)
        return value

    return check


def _name(key: str, value: Any) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", value):
        raise ConfigError(key, value, "a name of letters, digits, '_', '.', '-'")
    return value


def _precision(key: str, value: Any) -> str | dict:
    if not isinstance(value, (str, dict)):
        raise ConfigError(key, value, "a preset or format name, or a [precision] table")
    return value  # parsed once, into RunConfig.recipe, by validate


def _source(key: str, value: Any) -> str:
    if not isinstance(value, str) or not (value in ("stdlib", "pysrc", "synthetic") or Path(value).expanduser().exists()):
        raise ConfigError(key, value, '"stdlib", "pysrc", "synthetic", or an existing file or directory')
    return value


def _tokenizer(key: str, value: Any) -> str:
    vocab = data.tokenizer_vocab(value)  # raises ConfigError naming data.tokenizer
    return "bytes" if vocab is None else f"bpe:{vocab}"  # "bpe:04096" is the run "bpe:4096"


def _warmup(key: str, value: Any) -> float | int:
    allowed = "a fraction of the steps in [0, 1), or a whole number of steps >= 1"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        raise ConfigError(key, value, allowed)
    if value < 1:
        return float(value)
    if not float(value).is_integer():
        raise ConfigError(key, value, allowed)
    return int(value)


def _flops_budgets(key: str, value: Any) -> list[float]:
    allowed = "one compute budget per train.budgets entry (0 = none), the others > 0 and ascending; or []"
    if not isinstance(value, list):
        raise ConfigError(key, value, allowed)
    flops = [_real(0.0)(key, v) for v in value]
    labelled = [f for f in flops if f > 0]
    if labelled != sorted(set(labelled)) or (flops and not labelled):
        raise ConfigError(key, value, allowed)
    return flops


def _cost_model(key: str, value: Any) -> str:
    options = ("bits", "nominal", *hardware.GPUS)
    if value not in options:
        raise ConfigError(key, value, options)
    return value


TRACKERS = ("tensorboard", "wandb")


def _trackers(key: str, value: Any) -> list[str]:
    if not isinstance(value, list) or len(set(map(str, value))) != len(value) or any(t not in TRACKERS for t in value):
        raise ConfigError(key, value, f"a list of distinct trackers from {', '.join(TRACKERS)}, or []")
    if "wandb" in value and importlib.util.find_spec("wandb") is None:
        raise ConfigError(key, value, "trackers whose package is installed: wandb is not (pip install wandb)")
    return value


def _budgets(key: str, value: Any) -> list[float]:
    allowed = "an ascending list of distinct fractions in (0, 1] ending with 1.0"
    if not isinstance(value, list) or not value:
        raise ConfigError(key, value, allowed)
    fractions = [_real(0.0, 1.0, lo_open=True)(key, v) for v in value]
    if fractions != sorted(set(fractions)) or fractions[-1] != 1.0:
        raise ConfigError(key, value, allowed)
    return fractions


SCHEMA: dict[str, Any] = {
    "name": Field("run", _name),
    "precision": Field("fp32", _precision),
    "seed": Field(0, _integer(0, 2**31 - 1)),  # a JAX int32 PRNG seed
    "model": {
        "size": Field(1, _integer(1)),
        "seq_len": Field(128, _integer(2)),
        "smooth_swiglu": Field(False, _boolean),
        "n_layers": Field(None, _optional(_integer(1))),
    },
    "data": {
        "source": Field("stdlib", _source),
        "tokenizer": Field("bytes", _tokenizer),
        "eval_tokens": Field(65536, _integer(1)),
    },
    "train": {
        "tokens": Field(2_000_000, _integer(1)),
        "batch_size": Field(32, _integer(1)),
        "lr": Field(3e-3, _learning_rate),
        "weight_decay": Field(0.1, _real(0.0)),
        "warmup": Field(0.05, _warmup),
        "schedule": Field("wsd", _choice("wsd", "cosine")),
        "decay": Field(0.2, _real(0.0, 1.0, lo_open=True)),
        "budgets": Field(None, _budgets),  # default depends on the schedule (see validate)
        "grad_clip": Field(1.0, _real(0.0)),  # 0 = no clipping
        "log_every": Field(10, _integer(1)),
        "checkpoint_every": Field(100, _integer(0)),  # 0 = never
        "tracker": Field([], _trackers),  # mirrors of metrics.jsonl; [] drops out of run_id
    },
    "health": {
        "spike_factor": Field(3.0, _real(1.0, lo_open=True)),  # loss > factor x running median = diverged
        "spike_window": Field(50, _integer(1)),  # losses in the running median
        "max_saturation": Field(0.01, _real(0.0, 1.0)),  # saturated fraction above this is logged
    },
    "study": {  # labels only: training does not read them; results rows carry them as `budget`
        "budgets": Field([], _flops_budgets),
        "cost": Field("bits", _cost_model),
    },
}


@dataclass(frozen=True)
class Model:
    size: int
    seq_len: int
    smooth_swiglu: bool
    n_layers: int | None  # None: the ladder's depth for size

    def shape(self, vocab: int = 256) -> ladder.ModelConfig:
        """The transformer's shape (scaling.train.ladder.config_for_size)."""
        return ladder.config_for_size(self.size, vocab=vocab, seq_len=self.seq_len,
                                      smooth_swiglu=self.smooth_swiglu, n_layers=self.n_layers)


@dataclass(frozen=True)
class Data:
    source: str
    tokenizer: str  # "bytes" or "bpe:VOCAB"
    eval_tokens: int


@dataclass(frozen=True)
class Train:
    tokens: int
    batch_size: int
    lr: float  # "auto" is resolved to a number by validate
    weight_decay: float
    warmup: float | int  # a fraction (< 1) or a whole number of steps
    schedule: str
    decay: float
    budgets: tuple[float, ...]
    grad_clip: float
    log_every: int
    checkpoint_every: int
    tracker: tuple[str, ...]


@dataclass(frozen=True)
class Health:
    spike_factor: float
    spike_window: int
    max_saturation: float


@dataclass(frozen=True)
class Study:
    budgets: tuple[float, ...]
    cost: str


@dataclass(frozen=True)
class RunConfig:
    """A run's resolved config: every key checked and defaulted once (validate), immutable, typed.
    `precision` is as written (a name, a recipe file or a table: what run_id hashes); `recipe` is
    it parsed (scaling.numerics.precision.Recipe). `to_dict()` is the JSON form config.json stores."""

    name: str
    precision: str | dict
    seed: int
    model: Model
    data: Data
    train: Train
    health: Health
    study: Study
    recipe: Any = field(compare=False, repr=False)

    @property
    def tokens_per_step(self) -> int:
        return self.train.batch_size * self.model.seq_len

    @property
    def steps(self) -> int:
        return self.train.tokens // self.tokens_per_step

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "recipe"}
        d = {k: (_section_dict(v) if is_dataclass(v) else copy.deepcopy(v)) for k, v in d.items()}
        return d

    @functools.cached_property
    def run_id(self) -> str:
        """12 hex characters of sha256 over the canonical JSON of the resolved config. A recipe file is
        hashed by what it says, not where it is: editing it gives new runs, moving it does not."""
        resolved = self.to_dict()
        resolved["train"]["eval_every"] = 0  # a removed knob whose default every existing run id hashed
        if not resolved["study"]["budgets"]:  # runs outside a design keep the ids they had before [study]
            del resolved["study"]
        if resolved["data"]["tokenizer"] == "bytes":  # byte-level runs keep the ids they had before data.tokenizer
            del resolved["data"]["tokenizer"]
        if not resolved["train"]["tracker"]:  # likewise runs without a tracker, before train.tracker
            del resolved["train"]["tracker"]
        if resolved["model"]["n_layers"] is None:  # and ladder-depth runs, before model.n_layers
            del resolved["model"]["n_layers"]
        if isinstance(self.precision, str) and self.precision.endswith(".toml"):
            resolved["precision"] = self.recipe.describe()
        canonical = json.dumps(resolved, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]

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


SECTIONS = {"model": Model, "data": Data, "train": Train, "health": Health, "study": Study}


def validate(cfg: dict | RunConfig) -> RunConfig:
    """The resolved config: defaults filled, every value checked and normalised. Raises ConfigError.
    A RunConfig is already resolved and comes back as it is."""
    if isinstance(cfg, RunConfig):
        return cfg
    if not isinstance(cfg, dict):
        raise ConfigError("config", cfg, "a table of sections")
    resolved = _resolve(cfg, SCHEMA, prefix="")
    recipe = _recipe(resolved["precision"])
    train, model = resolved["train"], resolved["model"]
    if resolved["train"]["budgets"] is None:
        train["budgets"] = list(WSD_BUDGETS) if train["schedule"] == "wsd" else [1.0]
    if train["schedule"] == "cosine" and train["budgets"] != [1.0]:
        raise ConfigError("train.budgets", train["budgets"], "[1.0] with schedule = 'cosine' (only WSD branches)")
    tokens_per_step = train["batch_size"] * model["seq_len"]
    steps = train["tokens"] // tokens_per_step
    if steps < 1:
        raise ConfigError("train.tokens", train["tokens"], f"at least batch_size x seq_len = {tokens_per_step}")
    budget_steps = [round(f * steps) for f in train["budgets"]]
    if budget_steps[0] < 1 or len(set(budget_steps)) != len(budget_steps):
        raise ConfigError("train.budgets", train["budgets"],
                          f"fractions of the {steps} steps giving distinct step counts >= 1")
    warmup_steps = train["warmup"] if train["warmup"] >= 1 else round(train["warmup"] * steps)
    if warmup_steps >= budget_steps[-1] and train["warmup"] >= 1:
        raise ConfigError("train.warmup", train["warmup"], f"fewer steps than the run's {budget_steps[-1]}")
    if resolved["data"]["tokenizer"] != "bytes":  # a BPE needs text: not the synthetic chain, not token arrays
        data.tokenizer_vocab(resolved["data"]["tokenizer"], resolved["data"]["source"])
    study = resolved["study"]
    if study["budgets"] and len(study["budgets"]) != len(train["budgets"]):
        raise ConfigError("study.budgets", study["budgets"], f"one budget per train.budgets entry ({len(train['budgets'])})")
    _check_model(resolved)
    model["n_layers"] = ladder.depth_override(model["size"], model["n_layers"])
    if train["lr"] == "auto":  # resolved here, so a run's config, id and results hold the number
        train["lr"] = ladder.ladder_lr(resolved["model"]["size"])
    sections = {key: cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in resolved[key].items()})
                for key, cls in SECTIONS.items()}
    return RunConfig(name=resolved["name"], precision=resolved["precision"], seed=resolved["seed"], **sections,
                     recipe=recipe)


def _recipe(spec: str | dict):
    from scaling.numerics import precision  # imports JAX; only configs that get this far need it

    return precision.get(spec)  # raises ConfigError naming what is wrong


def _resolve(cfg: dict, schema: dict, prefix: str) -> dict:
    unknown = sorted(set(cfg) - set(schema))
    if unknown:
        where = f"the [{prefix.rstrip('.')}] keys" if prefix else "the top-level keys"
        raise ConfigError(prefix + unknown[0], cfg[unknown[0]], f"one of {where}: {', '.join(schema)}")
    resolved = {}
    for key, spec in schema.items():
        dotted = prefix + key
        if isinstance(spec, dict):
            section = cfg.get(key, {})
            if not isinstance(section, dict):
                raise ConfigError(dotted, section, f"a [{dotted}] table")
            resolved[key] = _resolve(section, spec, dotted + ".")
        elif key in cfg:
            resolved[key] = spec.check(dotted, copy.deepcopy(cfg[key]))
        else:
            resolved[key] = copy.deepcopy(spec.default)
    return resolved


def _check_model(cfg: dict) -> None:
    """The ladder owns which sizes exist; let it reject what it cannot build."""
    m = cfg["model"]
    ladder.config_for_size(m["size"], seq_len=m["seq_len"], smooth_swiglu=m["smooth_swiglu"], n_layers=m["n_layers"])


def run_id(cfg: dict | RunConfig) -> str:
    """The run id of a config (RunConfig.run_id), validating a dict first."""
    return validate(cfg).run_id


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
