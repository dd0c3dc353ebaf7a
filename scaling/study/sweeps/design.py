"""IsoFLOP designs: an experiment's [isoflop] table (`Design`) turned into run configs that land on
every compute budget they serve (`design_runs`), and the runs a design's landed results call for
next: edge runs that follow a minimum off the end of its profile (`extend_edges`) and seed
replicates around each minimum (`replicates`). Reading the profiles is scaling.study.analysis.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

from scaling.errors import ConfigError
from scaling.study.analysis.isoflop import MIN_SIZES
from scaling.train import compute as compute_lib
from scaling.train import config, ladder

DESIGN_SIZES = 5  # sizes per budget by default (MIN_SIZES is what a parabola needs)


@dataclass(frozen=True)
class Design:
    """An IsoFLOP design (an experiment's [isoflop] table): for every budget and every grid point
    (recipe, seed, ...), `sizes_per_budget` consecutive model shapes centred on the one whose tokens per
    parameter at that budget are closest to `tokens_per_param` (the expected optimum), among `sizes`
    that give at least `min_steps` steps. Each (point, size) is one run, trained to the longest budget
    it serves, with a WSD cooldown branch ending on the step nearest each other budget. `reference`:
    a recipe also evaluated at the other recipes' steps (see `design_runs`); `reference_for`: those
    recipes only (default: all). Its runs' ids depend on those steps, so a recipe added to a landed
    study and left out of `reference_for` leaves them, and every landed run, as they are.

    A shape is a ladder size (`3`) or a size at another depth (`{size = 1, n_layers = 4}`: the
    size's width, scaling.train.ladder.config_for_size); `sizes` holds (size, n_layers or None) pairs.

    `replicates` (seeds, e.g. [1, 2]): once a grid point's runs have landed, its run at each budget's
    observed IsoFLOP minimum and at the minimum's two neighbours is trained again at each of these
    seeds, as it was (same length and budgets): the seed noise where the minimum is read (see
    `replicates`).

    `extend_edges`: once a grid point's runs have landed, a budget whose observed minimum is its
    smallest (largest) size gets a run at the next smaller (larger) shape of `sizes`, serving that
    budget alone, and so on while the minimum stays on the edge (see `extend_edges`): a profile
    whose minimum is its last point does not locate it.

    `shapes`: "common" (the default): the grid points that differ only in their recipe train one
    common set of shapes at each budget, every shape from the smallest to the largest that any of
    their windows needs; a shape missing from a recipe's own window at a budget is a run serving that
    budget alone (like an edge run), so the window's runs keep their ids, and an edge run one recipe's
    minimum calls for is trained for all of them. Recipes are then compared on the same models: the
    loss depends on the shape, not on N alone. "per_recipe": each recipe on its own window only."""

    budgets: tuple[float, ...]
    cost: str = "bits"
    sizes: tuple[tuple[int, int | None], ...] = tuple((s, None) for s in range(1, 13))
    sizes_per_budget: int = DESIGN_SIZES
    tokens_per_param: float = 20.0
    min_steps: int = 50
    reference: str | None = None
    reference_for: tuple[str, ...] | None = None
    replicates: tuple[int, ...] = ()
    extend_edges: bool = False
    shapes: str = "common"

    @classmethod
    def from_table(cls, table: Any) -> "Design":
        """Validated; a bad key or value is a one-line ConfigError naming `isoflop.<key>`."""
        if not isinstance(table, dict):
            raise ConfigError("isoflop", table, "an [isoflop] table")
        unknown = sorted(set(table) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigError(f"isoflop.{unknown[0]}", table[unknown[0]], f"one of {', '.join(cls.__dataclass_fields__)}")
        if "budgets" not in table:
            raise ConfigError("isoflop.budgets", None, "a list of compute budgets (16-bit FLOPs under isoflop.cost)")
        budgets = config.SCHEMA["study"]["flop_budgets"].check("isoflop.budgets", table["budgets"])
        if not budgets:
            raise ConfigError("isoflop.budgets", table["budgets"], "at least one compute budget")
        sizes = table.get("sizes", [s for s, _ in cls.sizes])
        if not isinstance(sizes, list) or not sizes:
            raise ConfigError("isoflop.sizes", sizes, "a list of ladder sizes (integers >= 1) or {size, n_layers} tables")
        sizes = sorted({_shape(s) for s in sizes}, key=lambda s: (s[0], s[1] or 0))
        per = config._integer(MIN_SIZES)("isoflop.sizes_per_budget", table.get("sizes_per_budget", cls.sizes_per_budget))
        if per > len(sizes):
            raise ConfigError("isoflop.sizes_per_budget", per, f"at most the {len(sizes)} sizes offered")
        return cls(budgets=tuple(budgets),
                   cost=config.SCHEMA["study"]["cost"].check("isoflop.cost", table.get("cost", cls.cost)),
                   sizes=tuple(sizes), sizes_per_budget=per,
                   tokens_per_param=config._real(0.0, lo_open=True)("isoflop.tokens_per_param",
                                                                    table.get("tokens_per_param", cls.tokens_per_param)),
                   min_steps=config._integer(1)("isoflop.min_steps", table.get("min_steps", cls.min_steps)),
                   reference=config._name("isoflop.reference", table["reference"]) if "reference" in table else None,
                   reference_for=_names("isoflop.reference_for", table["reference_for"]) if "reference_for" in table else None,
                   replicates=_seeds(table.get("replicates", [])),
                   extend_edges=_flag("isoflop.extend_edges", table.get("extend_edges", cls.extend_edges)),
                   shapes=_choice("isoflop.shapes", table.get("shapes", cls.shapes), SHAPE_RULES))


SHAPE_RULES = ("common", "per_recipe")


def _choice(key: str, value: Any, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ConfigError(key, value, list(allowed))
    return value


def _flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(key, value, "true or false")
    return value


def _names(key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(key, value, "a list of recipe names")
    return tuple(config._name(key, v) for v in value)


def _seeds(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise ConfigError("isoflop.replicates", value, "a list of seeds, e.g. [1, 2]")
    return tuple(sorted({config.SCHEMA["seed"].check("isoflop.replicates", s) for s in value}))


def _shape(entry: Any) -> tuple[int, int | None]:
    """An [isoflop] sizes entry as (size, n_layers or None), checked like model.size / model.n_layers."""
    model = config.SCHEMA["model"]
    if isinstance(entry, dict):
        unknown = sorted(set(entry) - {"size", "n_layers"})
        if unknown or "size" not in entry:
            raise ConfigError("isoflop.sizes", entry, "a ladder size or a {size, n_layers} table")
        shape = (model["size"].check("isoflop.sizes.size", entry["size"]),
                 model["n_layers"].check("isoflop.sizes.n_layers", entry.get("n_layers")))
    else:
        shape = (model["size"].check("isoflop.sizes", entry), None)
    ladder.config_for_size(shape[0], n_layers=shape[1])  # the ladder rejects what it cannot build
    return shape[0], ladder.depth_override(*shape)


def design_runs(points: Sequence[dict], design: Design, vocab: int = 256) -> list[list[config.RunConfig]]:
    """The resolved run configs of each grid point (an unvalidated config: recipe, seed, ...) under an
    IsoFLOP design: one per shape it uses, each with model.size (and model.n_layers), train.tokens,
    train.eval_at (the step of each budget served, as fractions of the longest) and study.flop_budgets /
    study.cost (the labels
    each evaluation's results row carries as `budget`; 0 = not an IsoFLOP point).

    With `design.reference` (a recipe name), that recipe's run of each size also trains to, and
    evaluates at, every step another recipe's run of the same size lands on (same grid point
    otherwise): the matched high-precision loss that a precision gap (scaling.study.analysis.selection.select_law) needs.
    Raises ConfigError when a budget cannot get its sizes or two budgets fall on one step."""
    bases = [config.validate(p) for p in points]
    names = [b.recipe.name for b in bases]
    if design.reference and design.reference not in names:
        raise ConfigError("isoflop.reference", design.reference, f"a recipe of the grid ({', '.join(dict.fromkeys(names))})")
    unknown = [r for r in design.reference_for or () if r not in names]
    if unknown:
        raise ConfigError("isoflop.reference_for", unknown[0], f"recipes of the grid ({', '.join(dict.fromkeys(names))})")
    matched = set(design.reference_for or names)
    served = [_served(base, design, vocab) for base in bases]  # per point: size -> {steps: budget}
    if design.reference:
        siblings = [json.dumps({k: v for k, v in p.items() if k != "precision"}, sort_keys=True, default=str) for p in points]
        for i, name in enumerate(names):
            if name != design.reference:
                continue
            for j in (j for j, key in enumerate(siblings) if key == siblings[i] and j != i and names[j] in matched):
                for size, at in served[j].items():
                    if size in served[i]:  # sizes the reference runs anyway; their budgets stay its own
                        for steps in at:
                            served[i][size].setdefault(steps, 0.0)
    runs = [[_run_config(point, base, shape, at_size[shape], design.cost)
             for shape in sorted(at_size, key=lambda s: (s[0], s[1] or 0))]
            for point, base, at_size in zip(points, bases, served)]
    for i, missing in enumerate(_fills(points, bases, served, design, vocab)):
        runs[i] += [_run_config(points[i], bases[i], shape, {steps: budget}, design.cost)
                    for budget, shape, steps in missing]
    return runs


def siblings(points: Sequence[dict], design: Design) -> list[list[int]]:
    """The grid points that share their shapes (indices): with design.shapes "common", those equal
    but for their recipe; "per_recipe": each point alone."""
    if design.shapes == "per_recipe":
        return [[i] for i in range(len(points))]
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(points):
        key = json.dumps({k: v for k, v in p.items() if k != "precision"}, sort_keys=True, default=str)
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def _fills(points: Sequence[dict], bases: Sequence[config.RunConfig], served: Sequence[dict], design: Design,
           vocab: int) -> list[list[tuple[float, tuple, int]]]:
    """Per point, (budget, shape, steps) of each common shape (see Design.shapes) its own window lacks
    at a budget: every shape of design.sizes from the smallest to the largest its siblings' windows
    hold there. ConfigError when one gives a recipe fewer than min_steps steps."""
    out: list[list[tuple[float, tuple, int]]] = [[] for _ in points]
    for group in siblings(points, design):
        if len(group) < 2:
            continue
        shapes = {i: _shapes(bases[i], design, vocab) for i in group}
        order = list(shapes[group[0]]["shape"])  # by N, which the recipe does not change
        for budget in design.budgets:
            held = {i: {shape for shape, at in served[i].items() if budget in at.values()} for i in group}
            used = [order.index(shape) for i in group for shape in held[i]]
            for i in group:
                for shape in order[min(used):max(used) + 1]:
                    if shape in held[i]:
                        continue
                    per_token = float(shapes[i].loc[shapes[i]["shape"] == shape, "per_token"].iloc[0])
                    steps = int(np.round(budget / per_token / bases[i].tokens_per_step))  # as _served rounds
                    if steps < max(design.min_steps, bases[i].train.warmup + 1):
                        raise ConfigError("isoflop.budgets", budget,
                                          f"budgets giving every recipe at least {design.min_steps} steps at the common "
                                          f"shapes (recipe {bases[i].recipe.name} gets {steps} at size {shape})")
                    out[i].append((budget, shape, steps))
    return out


def _run_config(point: dict, base: config.RunConfig, shape: tuple[int, int | None], at: dict[int, float],
                cost: str) -> config.RunConfig:
    """A grid point's run at one shape, trained to the last of `at` ({steps: budget}) with a WSD
    branch at each of the others."""
    at = dict(sorted(at.items()))
    last = max(at)
    cfg = copy.deepcopy(point)  # as written: a size's `lr = "auto"` resolves at that size
    if shape[1] is not None:
        config.set_dotted(cfg, "model.n_layers", shape[1])
    for key, value in {"model.size": shape[0], "train.tokens": last * base.tokens_per_step,
                       "train.eval_at": [s / last for s in at], "study.flop_budgets": list(at.values()),
                       "study.cost": cost}.items():
        config.set_dotted(cfg, key, value)
    return config.validate(cfg)


def extend_edges(points: Sequence[dict], designed: Sequence[Sequence[config.RunConfig]], design: Design,
                 landed: pd.DataFrame, vocab: int = 256) -> list[list[config.RunConfig]]:
    """Each grid point's runs plus the edge runs (Design.extend_edges) its landed results call for.

    Once all the runs of a point and of its siblings (`siblings`: the recipes sharing its shapes) have
    landed ok, each budget where one of their minima (the mean val_loss over the seeds landed at each N:
    the point's own runs and their replicates) is at its smallest (largest) N gets one run at the next
    smaller (larger) shape of `design.sizes` for each of them, serving that budget alone (at least
    `min_steps` steps); when those runs land and a minimum is still on the edge, the next shape follows,
    until every minimum is inside or the shapes run out. An edge run that has landed stays, even once
    replicates move the minimum inside (landed results are never dropped). Points with runs still to
    land (or siblings with some) are returned as designed."""
    if not design.extend_edges or landed.empty or "budget" not in landed.columns:
        return [list(cfgs) for cfgs in designed]
    ok = landed[landed["status"] == "ok"] if "status" in landed.columns else landed
    landed_ok, on_disk = set(ok["run_id"]), set(landed["run_id"])
    out = [list(cfgs) for cfgs in designed]
    shapes, edge_runs = [], []
    for i, point in enumerate(points):
        base = config.validate(point)
        shapes.append(_shapes(base, design, vocab))
        # a (budget, shape) the point's own runs serve already is no edge: its run there is a design run
        served = {(b, c.model.size, c.model.n_layers) for c in out[i] for b in c.study.flop_budgets if b}
        runs = {}  # every edge run this point could have: those landed are kept
        for shape, per_token in zip(shapes[i]["shape"], shapes[i]["per_token"]):
            for budget in design.budgets:
                steps = int(np.round(budget / per_token / base.tokens_per_step))  # as _served rounds
                if steps >= max(design.min_steps, base.train.warmup + 1):
                    run = _run_config(point, base, shape, {steps: budget}, design.cost)
                    if (budget, run.model.size, run.model.n_layers) not in served:
                        runs[(budget, shape)] = run
        edge_runs.append(runs)
        held = {c.run_id for c in out[i]}
        out[i] += [c for c in runs.values() if c.run_id in on_disk and c.run_id not in held]
    for group in siblings(points, design):
        # an edge run one sibling has landed is a common shape: the others get it too
        landed_edges = [key for i in group for key, run in edge_runs[i].items() if run.run_id in on_disk]
        for i in group:
            held = {c.run_id for c in out[i]}
            for key in dict.fromkeys(landed_edges):
                run = edge_runs[i].get(key)
                if run is not None and run.run_id not in held:
                    out[i].append(run)
                    held.add(run.run_id)
        while all(c.run_id in landed_ok for i in group for c in out[i]):
            wanted: dict[tuple, None] = {}  # (budget, shape) of the next edge run, in budget order
            for budget in design.budgets:
                for i in group:
                    at = _profile(ok, out[i], design, budget)
                    if len(at) < 2:
                        continue
                    k = int(np.argmin(at["val_loss"].to_numpy(float)))
                    if 0 < k < len(at) - 1:
                        continue
                    n_edge, table = at["N"].iloc[k], shapes[i]
                    beyond = table[table["N"] < n_edge].iloc[::-1] if k == 0 else table[table["N"] > n_edge]
                    if not beyond.empty:  # the next shape only: the one after waits for this one's result
                        wanted[(budget, beyond["shape"].iloc[0])] = None
            added = False
            for i in group:
                held = {c.run_id for c in out[i]}
                for key in wanted:
                    run = edge_runs[i].get(key)
                    if run is not None and run.run_id not in held:
                        out[i].append(run)
                        held.add(run.run_id)
                        added = True
            if not added:
                break
    return out


def _profile(ok: pd.DataFrame, cfgs: Sequence[config.RunConfig], design: Design, budget: float) -> pd.DataFrame:
    """A grid point's IsoFLOP profile at `budget` from its landed ok rows, by N: the mean val_loss over
    the seeds landed there (its runs and their replicates at design.replicates) and `run_id`, the
    point's own run at that N. A minimum read from one seed moves with seed noise as large as the
    differences between neighbouring sizes; the analysis averages seeds, so the design does too."""
    own = {c.run_id for c in cfgs}
    twin_of = {c.replace(seed=s).run_id: c.run_id for c in cfgs for s in design.replicates} | {i: i for i in own}
    at = ok[ok["run_id"].isin(twin_of.keys()) & np.isclose(ok["budget"].astype(float), budget, rtol=1e-9)]
    at = at.assign(run_id=at["run_id"].map(twin_of))
    at = at.groupby("run_id", as_index=False).agg(N=("N", "first"), val_loss=("val_loss", "mean"))
    return at[at["run_id"].isin(own)].sort_values("N").reset_index(drop=True)


def replicates(designed: Sequence[Sequence[config.RunConfig]], design: Design,
               landed: pd.DataFrame) -> list[config.RunConfig]:
    """The replicate runs of an IsoFLOP design (Design.replicates) that its landed results call for.

    designed: `design_runs`'s configs per grid point; landed: the results rows (scaling.study.sweeps.results.load) of
    the runs landed so far. A grid point gets replicates once all its runs have landed ok: at each
    budget, its run at the minimum (of the mean over the seeds landed so far, see `_profile`) and the
    runs of the two neighbouring sizes (the two nearest where the minimum is the smallest or largest
    size), each again at every replicate seed. Until then it gets none (a minimum is read from
    finished runs only). A replicate that has landed stays, even once the minimum has moved."""
    if not design.replicates or landed.empty or "budget" not in landed.columns:
        return []
    ok = landed[landed["status"] == "ok"] if "status" in landed.columns else landed
    out: dict[str, config.RunConfig] = {}
    on_disk = set(landed["run_id"])
    for cfgs in designed:
        ids = [c.run_id for c in cfgs]
        for cfg in cfgs:
            for seed in design.replicates:
                twin = cfg.replace(seed=seed)
                if twin.run_id in on_disk:
                    out.setdefault(twin.run_id, twin)
        if not set(ids) <= set(ok["run_id"]):
            continue
        for budget in design.budgets:
            at = _profile(ok, cfgs, design, budget)
            if at.empty:
                continue
            i = int(np.argmin(at["val_loss"].to_numpy(float)))
            start = min(max(0, i - 1), max(0, len(at) - 3))
            for run_id in at["run_id"].iloc[start:start + 3]:
                cfg = cfgs[ids.index(run_id)]
                for seed in design.replicates:
                    twin = cfg.replace(seed=seed)
                    out.setdefault(twin.run_id, twin)
    return list(out.values())


def _shapes(base: config.RunConfig, design: Design, vocab: int) -> pd.DataFrame:
    """design.sizes at a grid point, by N: columns shape, N, per_token (cost under design.cost)."""
    cost = compute_lib.get(design.cost)
    rows = []
    for shape in design.sizes:
        row = compute_lib.run_row(base.replace(**{"model.size": shape[0], "model.n_layers": shape[1]}), vocab)
        rows.append({"shape": shape, "N": row["N"], "per_token": float(cost.per_token(pd.DataFrame([row]))[0])})
    return pd.DataFrame(rows).sort_values("N").reset_index(drop=True)


def _served(base: config.RunConfig, design: Design, vocab: int) -> dict[tuple, dict[int, float]]:
    """shape -> {steps: budget}: where one grid point's runs land on each budget (see Design)."""
    if base.train.warmup < 1:  # a fraction would give one size different warmups at different lengths
        raise ConfigError("train.warmup", base.train.warmup,
                          "a whole number of steps in an IsoFLOP design (the same warmup at every budget)")
    tokens_per_step = base.tokens_per_step
    sizes = _shapes(base, design, vocab)
    served: dict[tuple, dict[int, float]] = {}
    for budget in design.budgets:
        steps = np.round(budget / sizes["per_token"] / tokens_per_step).astype(int)
        ok = sizes[(steps >= max(design.min_steps, base.train.warmup + 1))].index
        if len(ok) < design.sizes_per_budget:
            least = max(design.min_steps, base.train.warmup + 1)
            # the k-th cheapest size's least budget: every size below it trains `least` steps too
            smallest = np.sort(sizes["per_token"].to_numpy() * tokens_per_step * least)[design.sizes_per_budget - 1]
            digits = 10.0 ** (np.floor(np.log10(smallest)) - 2)
            smallest = np.ceil(smallest / digits) * digits  # 3 significant digits, rounded up so it works
            raise ConfigError("isoflop.budgets", budget,
                              f"at least {smallest:.3g} ({design.sizes_per_budget} sizes trained {least} steps or more; "
                              f"this one gives {len(ok)})")
        ratio = steps[ok] * tokens_per_step / sizes.loc[ok, "N"]
        centre = int(np.argmin(np.abs(np.log(ratio / design.tokens_per_param))))
        start = min(max(0, centre - design.sizes_per_budget // 2), len(ok) - design.sizes_per_budget)
        for i in ok[start:start + design.sizes_per_budget]:
            size = sizes.loc[i, "shape"]
            at = served.setdefault(size, {})
            if int(steps[i]) in at:
                raise ConfigError("isoflop.budgets", budget, f"budgets at least one step apart at size {size} "
                                                             f"(it shares step {int(steps[i])} with {at[int(steps[i])]:g})")
            at[int(steps[i])] = budget
    return served
