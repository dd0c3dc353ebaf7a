"""A model laid out on a GPU cluster of any size, and a fitted law's compute optimum priced there.

1. Layouts (ClusterRecipe, CLUSTER_RECIPES: the talk's H100 table of issue #6 recomputed from
   written-down layouts; DENSE_RECIPE for a fitted law's dense shapes): `cluster_step` fills a
   cluster of K GPUs with a recipe's model-parallel part and data parallelism, and keeps the
   fastest step that fits memory (scaling.plan.stepmodel). Days and failures of that step:
   scaling.plan.runplan.
2. The tie to the science (`plan_optimum`): a compute-optimal (N, D, P) point turned into days and
   memory, with P (bits) mapped to the hardware format that runs it; `compute_for_target_loss`
   finds the compute whose optimal loss reaches a target. Loading a fit and optimising it is the
   caller's (`scaling plan --fit`: scaling.cli.plan).

Pure Python (no JAX; SciPy only inside compute_for_target_loss).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace

from scaling.errors import ConfigError
from scaling.plan.efficiency import recipe_for_format
from scaling.plan.hardware import get_gpu, precision_for_bits
from scaling.plan.layout import StepLayout, parse_step_layout
from scaling.plan.runplan import RunPlan, plan_run
from scaling.plan.shapes import ModelShape, gpt_for_params
from scaling.plan.stepmodel import StepResult, step


@dataclass(frozen=True)
class ClusterRecipe:
    """How a model is laid out on a cluster of any size.

    `layout`: the model-parallel part (scaling.plan.layout keys and flags, no dp). On K GPUs
    `cluster_step` keeps tp, cp, ep, etp and the overlaps, tries pp from half to twice the
    recipe's (vpp keeping the recipe's pp x vpp chunks) and the recipe's recompute or full
    recompute, fills the cluster with data parallelism (dp the largest that fits in K with ep x
    etp dividing tp x cp x dp; the GPUs left over idle as spares) and keeps the one with the
    highest throughput that fits memory. The global batch is fixed in sequences (rounded to whole
    micro-batches per replica, at least pp), or None: `micro_batches` per replica, times pp / 2
    under pipeline parallelism (weak scaling).
    """

    layout: str
    seq_len: int
    global_batch: int | None
    recompute: str = "selective"
    micro_batches: int = 8
    source: str = ""


# Written-down layouts for the talk's table (H100, Megatron practice: distributed optimizer with
# overlapped gradient reduce-scatter and parameter all-gather, sequence parallel under TP):
CLUSTER_RECIPES: dict[str, ClusterRecipe] = {
    "deepseek-v3": ClusterRecipe(
        "tp=2,pp=8,vpp=4,ep=64,etp=1,a2ao=1,deepep=1,ogr=1,opg=1", 4096, 15360,
        source="Megatron-Bridge's 1,024-H100 DeepSeek-V3 recipe (perf_recipes/deepseek/h100: TP2 PP8 VP4 EP64, DeepEP, "
               "1F1B all-to-all overlap, recompute of MLA up-projections); DeepSeek-V3's batch of 15,360 x 4,096 tokens"),
    "kimi-k2": ClusterRecipe(
        "tp=2,pp=16,vpp=2,ep=64,etp=1,a2ao=1,deepep=1,ogr=1,opg=1", 4096, 16384,
        source="the DeepSeek-V3 recipe with PP16 VP2 for Kimi K2's 1.5x experts (the fastest layout `scaling plan step "
               "--search` finds on 1,024 H100s); Kimi K2's batch of 67M tokens (Kimi Team 2025, Sec. 3)"),
    "gpt4-reported": ClusterRecipe(
        "tp=8,pp=8,vpp=5,ep=16,etp=8,a2ao=1,ogr=1,opg=1,tpo=1", 8192, 7324,
        source="TP8 with experts split over the same 8 GPUs (Megatron's default expert TP = TP), 16 experts over 16 "
               "nodes, PP8 VP5 (3 layers per virtual stage); the reported batch of 60M tokens at 8K"),
    "llama3-405b": ClusterRecipe(
        "tp=8,pp=16,vpp=4,ogr=1,opg=1", 8192, 2048, recompute="none",
        source="Llama 3 405B's layout on 8K-16K H100s (Dubey et al. 2024, Table 4: TP8 PP16, 16M-token batches)"),
}
# Dense shapes without a recipe (a fitted law's compute optimum): TP8 inside a node, PP8 (4-16
# after cluster_step's choice), 4 pp micro-batches per replica.
DENSE_RECIPE = ClusterRecipe("tp=8,pp=8,ogr=1,opg=1,tpo=1", 4096, None, recompute="none")

# The talk's H100 table (issue #6): training FLOPs and BF16 days on 1,024 / 5,000 / 10,000 H100s.
# What `scaling plan --flops F --model M` is checked against (docs/planner.md; tests/plan/test_cluster.py).
TALK_TABLE: dict[str, tuple[str, float, dict[int, float]]] = {
    "DeepSeek-V3": ("deepseek-v3", 3.4e24, {1024: 97, 5000: 22, 10000: 13}),
    "Kimi K2": ("kimi-k2", 2.98e24, {1024: 85, 5000: 19, 10000: 11}),
    "GPT-4": ("gpt4-reported", 2.1e25, {1024: 602, 5000: 137, 10000: 80}),
}


def cluster_step(model: ModelShape, gpu: str, gpus: int, precision: str, recipe: ClusterRecipe) -> StepResult:
    """The step of `model` on `gpus` GPUs under `recipe` (see ClusterRecipe): of the layouts
    `_cluster_layouts` tries, the fastest that fits memory (else the fastest)."""
    if not (isinstance(gpus, int) and gpus >= 1):
        raise ConfigError("gpus", gpus, "an integer >= 1")
    best, best_key = None, None
    for layout in _cluster_layouts(model, gpus, recipe):
        try:
            r = step(model, gpu, layout, precision, recipe.seq_len)
        except ConfigError:
            continue  # a pp the model cannot take (heads, tokens)
        key = (r.memory.total <= r.gpu.memory_bytes, r.model_flops / r.step_seconds)
        if best_key is None or key > best_key:
            best, best_key = r, key
    if best is None:
        ref = _fitted_layout(model, parse_step_layout(recipe.layout))
        smallest = ref.tp * ref.cp * max(1, min(ref.pp // 2, model.layers)) * ref.ep * ref.expert_tp \
            // math.gcd(ref.tp * ref.cp, ref.ep * ref.expert_tp)
        if gpus < smallest:
            raise ConfigError("gpus", gpus, f"at least {smallest} GPUs for {model.name} laid out as {recipe.layout}")
        raise ConfigError("model", model.name, f"a shape that {recipe.layout} (pp from half to twice its own) can lay out "
                          f"on {gpus} GPUs")
    return best


def _fitted_layout(model: ModelShape, ref: StepLayout) -> StepLayout:
    """A dense recipe's layout with tp cut to the largest divisor of the model's heads and KV heads that
    is at most the recipe's (a 1-head model runs at tp 1, as anyone laying it out would; tp overlap
    needs tp > 1). Expert-parallel recipes are kept as written: their tp is tied to the experts'."""
    if ref.ep > 1:
        return ref
    tp = max(d for d in range(1, ref.tp + 1) if ref.tp % d == 0 and model.heads % d == 0 and model.kv_heads % d == 0)
    return ref if tp == ref.tp else replace(ref, tp=tp, tp_overlap=ref.tp_overlap and tp > 1)


def _cluster_layouts(model: ModelShape, gpus: int, recipe: ClusterRecipe) -> Iterator[StepLayout]:
    """The recipe's layout with pp from half to twice its own (within the model's layers: a model of
    fewer layers than half the recipe's pp still gets pp = its layers and below), under the recipe's
    recompute or full recompute, data parallelism filling the cluster and the global batch per
    replica in micro-batches."""
    ref = _fitted_layout(model, parse_step_layout(recipe.layout))
    chunks = ref.pp * ref.vpp
    for pp in range(max(1, min(ref.pp // 2, model.layers)), min(model.layers, 2 * ref.pp) + 1):
        # the recipe's pp x vpp chunks where the layers allow, fewer virtual stages where they do not
        vpp = max(1, min(chunks // pp, model.layers // pp)) if pp > 1 and not ref.dualpipe else 1
        if pp * vpp > model.layers or (ref.dualpipe and pp % 2):
            continue
        for recompute in dict.fromkeys((recipe.recompute, "full")):
            base = replace(ref, pp=pp, vpp=vpp, recompute=recompute)
            replica = base.tp * base.cp * pp
            unit = base.ep * base.expert_tp // math.gcd(base.tp * base.cp, base.ep * base.expert_tp)
            dp = gpus // replica // unit * unit
            if dp < 1:
                continue
            m = max(pp, round(recipe.global_batch / dp)) if recipe.global_batch else recipe.micro_batches * max(1, pp // 2)
            try:
                layout = replace(base, dp=dp, micro_batches=m)
            except ConfigError:
                continue
            yield layout


# --------------------------------------------------------------------------------------------
# The tie to the science: a fitted law's compute optimum on real hardware
# --------------------------------------------------------------------------------------------


def training_flops(params: float, tokens: float) -> float:
    """Hardware FLOPs of a training run, 6 N D (Kaplan et al. 2020); P sets the peak, not the count."""
    return 6.0 * params * tokens


def compute_for_target_loss(
    optimal_loss: Callable[[float], float],
    target_loss: float,
    low: float = 1e15,
    high: float = 1e30,
) -> float:
    """Smallest compute C whose compute-optimal loss reaches `target_loss`: Brent's root on log10 C.

    `optimal_loss(C)` is the compute-optimal loss at C FLOPs (for a fitted law:
    scaling.study.analysis.pstar.optimal.optimal_precision(fit, compute=C)["loss"]); it falls monotonically with C,
    so the root is unique; solved to 0.1% in C.
    """
    from scipy.optimize import brentq  # lazy: only the --target-loss path pays for SciPy

    def excess(log10_c: float) -> float:
        return optimal_loss(10**log10_c) - target_loss

    at_high = excess(math.log10(high))
    if at_high > 0:
        raise ConfigError("target-loss", target_loss, f"a loss the law reaches with <= {high:.0e} FLOPs "
                          f"(it gives {at_high + target_loss:.4g} there)")
    if excess(math.log10(low)) <= 0:
        return low
    return 10 ** brentq(excess, math.log10(low), math.log10(high), xtol=math.log10(1.001))


@dataclass(frozen=True)
class PrecisionPlan:
    """A compute-optimal (N, D, P) point and what it costs on the cluster."""

    bits: float
    hardware_precision: str
    params: float
    tokens: float
    loss: float
    flops: float
    runs: tuple[RunPlan, ...]


def plan_optimum(point: Mapping[str, float], gpus: list[int], gpu: str = "h100", recipe: ClusterRecipe = DENSE_RECIPE,
                 mfu: float | None = None, **run_options: float | None) -> PrecisionPlan:
    """Days on each cluster size for one (P, N, D, loss) point, at the hardware format for P bits:
    the point's dense GPT shape (`gpt_for_params`) stepped on each cluster under `recipe`, or a given
    `mfu`. `run_options`: plan_run's failure model."""
    precision = precision_for_bits(float(point["P"]), gpu)
    flops = training_flops(float(point["N"]), float(point["D"]))
    if mfu is not None:
        runs = tuple(plan_run(flops, k, gpu, precision, mfu, **run_options) for k in gpus)
    else:
        model = gpt_for_params(float(point["N"]), parse_step_layout(recipe.layout).tp)
        step_recipe = recipe_for_format(precision, get_gpu(gpu))
        runs = tuple(plan_run(flops, k, gpu, step=cluster_step(model, gpu, k, step_recipe, recipe), **run_options)
                     for k in gpus)
    return PrecisionPlan(float(point["P"]), precision, float(point["N"]), float(point["D"]), float(point["loss"]), flops, runs)


def optimum_speedup(best: PrecisionPlan, gpu: str, gpus: int, recipe: ClusterRecipe) -> tuple[StepResult, StepResult]:
    """(BF16 step, the optimum's P-bit recipe step) of the optimum's dense shape on `gpus` GPUs, both on
    the layout the P-bit recipe's days come from (a ConfigError where the shape cannot take it)."""
    model = gpt_for_params(best.params, parse_step_layout(recipe.layout).tp)
    low = cluster_step(model, gpu, gpus, recipe_for_format(best.hardware_precision, get_gpu(gpu)), recipe)
    return step(model, gpu, low.layout, "bf16", recipe.seq_len), low
