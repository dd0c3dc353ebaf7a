"""The GPU-cluster planner, pure Python (never imports JAX): the GPU table (hardware), one training
step op by op on a layout (stepmodel, checked against published runs by stepvalidate), and FLOPs to
days, memory, interruptions and goodput (cluster)."""

from scaling._lazy import exports

_NAMES = {
    "hardware": "hardware", "stepmodel": "stepmodel", "stepvalidate": "stepvalidate", "cluster": "cluster",
    **{n: "cluster" for n in (
        "train_days", "ClusterRecipe", "CLUSTER_RECIPES", "DENSE_RECIPE", "cluster_step", "step_mfu",
        "expected_interruptions", "optimal_checkpoint_interval", "checkpoint_goodput", "drop_replica_goodput",
        "RunPlan", "plan_run", "training_flops", "compute_for_target_loss", "PrecisionPlan", "plan_optimum",
        "plan_fit", "SECONDS_PER_DAY", "HOURS_PER_DAY", "GPU_MTBF_HOURS",
    )},
}
__all__ = list(_NAMES)
__getattr__ = exports(__name__, _NAMES)
