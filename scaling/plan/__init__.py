"""The GPU-cluster planner, pure Python (never imports JAX): the GPU table (hardware); one training
step op by op on a layout (stepmodel, from shapes, layout, efficiency, layerops and memory; search
finds the fastest layout; checked against published runs by stepvalidate); FLOPs to days under
failures (runplan, reliability); a model or a fitted law's optimum on a cluster of any size (cluster)."""

from scaling._lazy import exports

_MODULES = ("hardware", "shapes", "layout", "efficiency", "layerops", "memory", "stepmodel", "search",
            "stepvalidate", "reliability", "runplan", "cluster")
_NAMES = {
    **{m: m for m in _MODULES},
    **{n: "hardware" for n in ("GPUS", "get_gpu", "precision_for_bits")},
    **{n: "shapes" for n in ("ModelShape", "MODELS", "load_model", "gpt_for_params")},
    **{n: "layout" for n in ("StepLayout", "parse_step_layout")},
    **{n: "stepmodel" for n in ("step", "StepResult")},
    **{n: "reliability" for n in (
        "HOURS_PER_DAY", "GPU_MTBF_HOURS", "expected_interruptions", "optimal_checkpoint_interval",
        "checkpoint_goodput", "drop_replica_goodput",
    )},
    **{n: "runplan" for n in ("SECONDS_PER_DAY", "train_days", "step_mfu", "RunPlan", "plan_run", "run_days")},
    **{n: "cluster" for n in (
        "ClusterRecipe", "CLUSTER_RECIPES", "DENSE_RECIPE", "TALK_TABLE", "cluster_step", "training_flops",
        "compute_for_target_loss", "PrecisionPlan", "plan_optimum",
    )},
}
__all__ = list(_NAMES)
__getattr__ = exports(__name__, _NAMES)
