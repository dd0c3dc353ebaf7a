"""findings.json's schema: the facts REPORT and README are written from, as typed values with a versioned
JSON form, checked when the file is written (`write`) and when it is read (`load`, `Findings.from_json`).

The version. SCHEMA_VERSION names the typed keys below and their types; it goes up when one is added,
removed, renamed or changes type. A reader refuses a file of any other version, or of none, with one line
(ConfigError) saying to rewrite it, rather than misread it. Sub-trees whose keys vary with the study or
the law (the matched gaps, the chips, a law's selection, a P* profile) are typed `dict[str, Any]`, each
commented with the module that defines it: their contents are that module's to document and are not
versioned here.

A study's own sections. A top-level key that is not a field is a study's own section's facts
(`report.Section.key`, any JSON value), kept in `Findings.sections` and written back at the top level.
The file does not record which keys its sections wrote, so any such key passes unless the reader names
the ones it expects (`from_json(data, sections=...)`); a misspelt built-in key still fails, as missing.

Pure Python: dataclasses checked against their own annotations (str, int, float, bool, None, Any, list,
dict and the dataclasses here); a float field takes a JSON integer, an int field no float, neither a bool.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Mapping, Union

from scaling._io import _json_default, atomic_write_json
from scaling.errors import ConfigError

SCHEMA_VERSION = 1
REWRITE = "rewrite it with `scaling figures` (the committed study: `python paper_figures/make_figures.py`)"


class _Absent:
    """An optional key left out of the file (a field defaulting to ABSENT is not written back)."""

    def __repr__(self) -> str:
        return "absent"

    def __bool__(self) -> bool:
        return False


ABSENT: Any = _Absent()


class _Shown(str):
    """A value as an error message shows it: the text itself, not its repr."""

    def __repr__(self) -> str:
        return str(self)


class _Invalid(ConfigError):
    """A problem at `key` (a path inside the file); Findings.from_json names the file in front of it."""


@dataclass(frozen=True)
class _Typed:
    """A JSON object whose keys are this dataclass's fields: each required (unless it defaults to
    ABSENT), of its annotated type, and no other."""

    @classmethod
    def _from(cls, data: Mapping[str, Any], where: str, skip: Collection[str] = ()) -> Any:
        hints = _hints(cls)
        fields = [f for f in dataclasses.fields(cls) if f.name not in skip]
        unknown = sorted(set(data) - {f.name for f in fields})
        if unknown:
            raise _Invalid(_join(where, unknown[0]), _Shown("an unknown key"),
                           f"the keys of {__name__}.{cls.__name__} ({', '.join(f.name for f in fields)}); "
                           f"a new key is added there, with SCHEMA_VERSION raised")
        values = {}
        for f in fields:
            if f.name in data:
                values[f.name] = _load(data[f.name], hints[f.name], _join(where, f.name))
            elif f.default is ABSENT:
                values[f.name] = ABSENT
            else:
                raise _Invalid(_join(where, f.name), _Shown("missing"),
                               f"{_describe(hints[f.name])} (every {cls.__name__} has it)")
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        return {f.name: _dump(getattr(self, f.name)) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not ABSENT}


@dataclass(frozen=True)
class BudgetRecipe(_Typed):
    """One recipe's IsoFLOP profile at a budget (scaling.study.analysis.isoflop.isoflop); the fit's
    fields are None where the recipe reached too few sizes."""

    recipe: str
    bits_eff: float
    P: float
    runs: int
    sizes: int
    interpolated: int
    N_opt: float | None
    D_opt: float | None
    loss: float | None
    ci: list[float] | None
    inside: bool | None
    p_best: float | None
    parabola: list[float] | None
    gap: float | None
    gap_ci: list[float] | None


@dataclass(frozen=True)
class Budget(_Typed):
    """One compute budget's IsoFLOP analysis (scaling.study.analysis.isoflop.isoflop), with the corpora and
    hosts its runs trained on (analysis.findings.corpora, .hosts, added by report.writer.report_facts)."""

    budget: float
    cost_model: str
    level: float
    recipes: list[BudgetRecipe]
    sigma: float | None
    dof: int
    noise_source: str | None
    best: str | None
    runner_up: str | None
    diff: float | None
    diff_ci: list[float] | None
    seed_sigma: float | None
    seed_dof: int
    sigma_parabolas: float | None
    shape_share: float | None
    shape_effects: list[dict[str, Any]]  # {shape, N, effect, recipes}: analysis.shapes via isoflop
    winner: str | None
    reason: str
    pairs: list[dict[str, Any]]  # {a, b, diff, ci, inside, verdict}: isoflop's requested contrasts
    corpora: dict[str, Any]  # corpus -> {recipe: runs}: analysis.findings.corpora
    hosts: dict[str, Any]  # host -> {recipe: runs}: analysis.findings.hosts


@dataclass(frozen=True)
class Law(_Typed):
    """The fitted law the report reads (scaling.study.analysis.fit.FitResult's fields)."""

    name: str
    params: dict[str, float]
    fixed: dict[str, float]
    heldout: dict[str, Any] | None  # fit.FitResult.heldout
    selection: dict[str, Any] | None  # analysis.selection.select's record of how the law was chosen


@dataclass(frozen=True)
class PStar(_Typed):
    """P* at one budget (scaling.study.analysis.findings.findings: _pstar_over_bits for a law with a bits
    axis, _pstar_over_recipes for one without; `error` alone where there are too few runs)."""

    compute: float
    measured: list[dict[str, Any]]  # the recipes the IsoFLOP measurement cannot rule out: findings.measured_choice
    measured_bits: list[float]
    profile: dict[str, Any]  # analysis.pstar.profile.precision_profile, or {"error": ...}
    error: str = ABSENT
    P: float | None = ABSENT
    N: float | None = ABSENT  # where the optimum lies (a law with a bits axis: optimal.optimal_precision)
    D: float | None = ABSENT
    P_ci: list[float] | None = ABSENT
    P_grid: str | None = ABSENT
    P_range: list[float] | None = ABSENT
    no_bits_axis: str = ABSENT
    recipes: list[dict[str, Any]] = ABSENT  # findings.recipe_optima
    specifications: list[dict[str, Any]] = ABSENT  # findings.specification_fits x optimal.cost_models
    law_interval: list[float] | None = ABSENT
    published_law: dict[str, str] = ABSENT  # published range -> inside/outside/cannot tell (findings.against_published)
    interval: list[float] | None = ABSENT
    published: dict[str, str] = ABSENT


@dataclass(frozen=True)
class Prediction(_Typed):
    """A held-out budget's prediction and, once measured, its score (report.writer.prediction_facts from
    scaling.study.analysis.prediction.predict); a key an older prediction file lacks is None."""

    budget: float | None
    cost_model: str | None
    level: float | None
    fitted_on: dict[str, Any]  # predict.predict's `fitted_on`, its run ids left out
    chosen_law: str | None
    laws: list[str]
    draws: int | None
    sigma_measurement: float | None
    sigma_lack_of_fit: float | None
    recipes: list[dict[str, Any]] | None  # predict.predict's per-recipe predictions
    best: str | None
    runner_up: str | None
    diff: float | None
    diff_pi: list[float] | None
    winner: str | None
    reason: str | None
    corpora: dict[str, Any]  # {fitted, measured}
    hosts: dict[str, Any]  # {measured, lower}: writer._prediction_hosts
    host_shift: list[dict[str, Any]]  # a study's `host_shift` section, copied
    score: dict[str, Any] | None  # predict.score, None until the budget is measured


@dataclass(frozen=True)
class Findings(_Typed):
    """findings.json: one field per top-level key (schema_version written first), a study's own
    sections' facts in `sections`."""

    loss_unit: str
    cost_model: str  # the cost model's description (train.compute.CostModel.describe)
    runs: int
    seeds_per_cell: list[int]  # [fewest, most] seeds per (size, recipe, tokens)
    budgets: list[Budget]
    note: str | None  # why there are no budgets, else None
    law: Law | None
    P_star: list[PStar]
    matched: dict[str, Any] | None  # analysis.matched.matched_gaps (report.writer.matched_facts)
    cost_models: dict[str, Any] | None  # analysis.chips.chip_verdicts + costs.charges (writer.cost_facts)
    granularity: dict[str, Any] | None  # analysis.findings.scheme_effects
    outliers: dict[str, Any] | None  # analysis.findings.smooth_swiglu_effect
    prediction: Prediction = ABSENT  # only with a held-out budget's prediction
    prediction_posthoc: Prediction = ABSENT  # only with its post-hoc re-prediction
    sections: dict[str, Any] = field(default_factory=dict)  # report.Section.key -> its facts
    schema_version: int = SCHEMA_VERSION

    @classmethod
    def from_json(cls, data: Any, *, sections: Collection[str] | None = None,
                  source: str = "findings.json") -> Findings:
        """The findings in `data` (findings.json's parsed content), checked: its schema_version is this
        code's, every typed key is present with its type, and every other top-level key is a section's
        (one of `sections` where given). Anything else is a one-line ConfigError naming `source`, the key
        (a path such as `budgets[0].winner`), what it holds and what is allowed."""
        try:
            if not isinstance(data, Mapping):
                raise _Invalid("findings", _Shown(_kind(data)), "a JSON object written by `scaling figures`")
            version = data.get("schema_version", ABSENT)
            if type(version) is not int or version != SCHEMA_VERSION:
                raise _Invalid("schema_version", _Shown("missing") if version is ABSENT else version,
                               f"{SCHEMA_VERSION}, the version this code reads; {REWRITE}")
            own = {f.name for f in dataclasses.fields(cls)} - {"sections", "schema_version"}
            extra = {k: v for k, v in data.items() if k not in own and k != "schema_version"}
            if sections is not None and set(extra) - set(sections):
                raise _Invalid(sorted(set(extra) - set(sections))[0], _Shown("an unknown key"),
                               f"a typed key ({', '.join(sorted(own))}) or a section's "
                               f"({', '.join(sorted(sections)) or 'none expected'})")
            typed = cls._from({k: v for k, v in data.items() if k in own}, "", skip=("sections", "schema_version"))
        except _Invalid as e:
            raise ConfigError(f"{source}: {e.key}", e.value, e.allowed) from None
        return dataclasses.replace(typed, sections=dict(extra))

    def to_json(self) -> dict[str, Any]:
        """findings.json's content: schema_version first, then the typed keys, then the sections'."""
        out = {"schema_version": self.schema_version}
        out.update((k, v) for k, v in super().to_json().items() if k not in ("sections", "schema_version"))
        out.update(self.sections)
        return out


def stamped(facts: Mapping[str, Any]) -> dict[str, Any]:
    """`facts` (report.writer's dict) as findings.json holds it: schema_version first."""
    return {"schema_version": SCHEMA_VERSION, **{k: v for k, v in facts.items() if k != "schema_version"}}


def write(path: str | Path, facts: Mapping[str, Any]) -> Path:
    """Write `facts` to `path` as findings.json (atomically, with schema_version), after checking that
    what lands reads back (Findings.from_json): a writer that drifts from the schema fails here, not at
    the next reader."""
    out = stamped(facts)
    Findings.from_json(json.loads(json.dumps(out, default=_json_default)), source=str(path))
    atomic_write_json(path, out)
    return Path(path)


def load(path: str | Path, *, sections: Collection[str] | None = None) -> Findings:
    """findings.json at `path`, checked (Findings.from_json); an unreadable file is a ConfigError too."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError("findings", str(path), f"a findings.json written by `scaling figures` ({e})") from None
    return Findings.from_json(data, sections=sections, source=str(path))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _load(value: Any, hint: Any, where: str) -> Any:
    """`value` checked against the annotation `hint` (dataclasses built from their objects)."""
    if hint is Any:
        return value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        if not _is(value, inner):
            raise _Invalid(where, _Shown(_kind(value)), _describe(hint))
        return _load(value, inner, where)
    if not _is(value, hint):
        raise _Invalid(where, _Shown(_kind(value)), _describe(hint))
    if isinstance(hint, type) and issubclass(hint, _Typed):
        return hint._from(value, where)
    if origin is list:
        return [_load(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        return {k: _load(v, args[1], _join(where, k)) for k, v in value.items()}
    return value


def _is(value: Any, hint: Any) -> bool:
    """Whether `value` has the outer JSON type `hint` asks for (contents are checked by _load)."""
    base = typing.get_origin(hint) or hint
    if isinstance(base, type) and issubclass(base, _Typed):
        base = dict
    if base in (int, float) and isinstance(value, bool):
        return False
    if base is float:
        return isinstance(value, (int, float))
    return isinstance(value, base)


def _describe(hint: Any) -> str:
    """An annotation as an error message says it: 'a number or None', 'a list of numbers', ..."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in args if a is not type(None)) + " or None"
    if origin is list:
        return "a list" if args[0] is Any else f"a list (each {_describe(args[0])})"
    if origin is dict:
        return "an object" if args[1] is Any else f"an object (each value {_describe(args[1])})"
    if isinstance(hint, type) and issubclass(hint, _Typed):
        return f"a {hint.__name__} object"
    return {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}.get(hint, "any JSON value")


def _kind(value: Any) -> str:
    """What `value` is, short enough for one line."""
    if isinstance(value, Mapping):
        return f"an object with {len(value)} keys"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else str(key)


def _dump(value: Any) -> Any:
    if isinstance(value, _Typed):
        return value.to_json()
    if isinstance(value, list):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value
