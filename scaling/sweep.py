"""Experiments as TOML grids -> RunSpecs -> runs (local or Ray), crash-safe and resumable.

An experiment file is a base config (the `scaling train` schema) plus:

    [grid]                      # axes, expanded to their product
    "model.size" = [1, 2, 3]    # dotted keys, or nested tables: [grid.model] size = [1, 2, 3]
    precision = ["fp32", "fp8", "fp4"]
    [[include]]                 # extra points, each applied to the base config
    "model.size" = 4
    precision = "fp8"
    [[exclude]]                 # grid points matching every key here are dropped
    "model.size" = 3
    precision = "fp4"

The run id is a stable hash of the resolved config, so running a sweep again skips what
has finished. Layout: <out>/<sweep>/<run_id>/{config.json, metrics.jsonl, summary.json, failure.json}.
"""

from __future__ import annotations

import copy
import itertools
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaling.errors import ConfigError

EXPERIMENT_KEYS = ("grid", "include", "exclude")


@dataclass(frozen=True)
class RunSpec:
    run_id: str
    sweep: str
    config: dict

    def out_dir(self, root: str | Path) -> Path:
        return Path(root) / self.sweep / self.run_id


def flatten(table: dict, prefix: str = "") -> dict[str, Any]:
    """{'model': {'size': [1, 2]}} -> {'model.size': [1, 2]}; lists and scalars are leaves."""
    flat = {}
    for key, value in table.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and not (dotted == "precision" or dotted.endswith(".precision")):
            flat.update(flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def set_dotted(cfg: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = cfg
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(dotted, value, f"a key whose parent {part!r} is a table")
    node[leaf] = value


def get_dotted(cfg: dict, dotted: str, default: Any = None) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def grid_points(experiment: dict) -> list[dict[str, Any]]:
    """The experiment's points as {dotted key: value} overrides: grid product - excludes + includes."""
    grid = flatten(experiment.get("grid", {}))
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"grid.{key}", values, "a non-empty list of values")
    excludes = [flatten(e) for e in _tables(experiment, "exclude")]
    points = [dict(zip(grid, combo)) for combo in itertools.product(*grid.values())]
    points = [p for p in points if not any(_matches(p, ex) for ex in excludes)]
    return points + [flatten(inc) for inc in _tables(experiment, "include")]


def _tables(experiment: dict, key: str) -> list[dict]:
    tables = experiment.get(key, [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(key, tables, f"an array of tables ([[{key}]])")
    return tables


def _matches(point: dict, pattern: dict) -> bool:
    return all(k in point and point[k] == v for k, v in pattern.items())


def load_experiment(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError("experiment", str(path), "an existing TOML file")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("experiment", str(path), f"valid TOML ({e})") from None


def expand(path: str | Path, overrides: list[str] = ()) -> list[RunSpec]:
    """Expand an experiment file into validated RunSpecs (unique by run id, in grid order).

    `overrides` are `key=value` strings applied to the base config (as `scaling train --set`).
    Every point is validated before anything runs: a bad value anywhere is a ConfigError.
    """
    from scaling import config  # training-side schema: validate() and run_id()

    experiment = load_experiment(path)
    base = {k: v for k, v in experiment.items() if k not in EXPERIMENT_KEYS}
    base = config.apply_overrides(base, list(overrides))
    sweep = str(base.get("name") or Path(path).stem)
    specs: dict[str, RunSpec] = {}
    for point in grid_points(experiment):
        cfg = copy.deepcopy(base)
        for key, value in point.items():
            set_dotted(cfg, key, value)
        try:
            cfg = config.validate(cfg)
        except ConfigError as e:
            where = ", ".join(f"{k}={v!r}" for k, v in point.items())
            raise ConfigError(e.key, e.value, f"{e.allowed} (grid point {where})") from None
        run_id = config.run_id(cfg)
        specs.setdefault(run_id, RunSpec(run_id=run_id, sweep=sweep, config=cfg))
    return list(specs.values())
