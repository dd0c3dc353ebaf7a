"""scaling.plan.cluster: models laid out on clusters of any size (the talk's table), a law's optimum priced there."""

import numpy as np
import pytest

from scaling.errors import ConfigError
from scaling.plan import cluster, runplan, shapes, stepmodel, stepvalidate
from scaling.plan.layout import parse_step_layout


def test_talk_table_recomputed_from_written_down_layouts(talk_days):
    """Issue #6's H100 table (BF16 days on 1,024 / 5,000 / 10,000 GPUs) from the step model of each
    run under its layout: every entry within 45% of the talk's, and more days than the talk in at
    least 7 of the 9 (docs/planner.md lists every error). The talk is optimistic for these MoE runs,
    which a measurement shows: its 97 BF16 days for DeepSeek-V3 on 1,024 H100s are fewer than the
    114 FP8 days that Megatron-Bridge's measured run of that layout implies (3.4e24 FLOPs at 338
    model TFLOP/s/GPU, 25.09 container), a run the step model prices within 10% (held out). The
    bound has moved with what the model learned from measured runs: 30% before the MoE overhead was
    fitted (MoE steps then 20-35% fast), 40% before DeepEP's 20 SMs were priced (DeepSeek-V3's
    held-out run then -6%), 55% (8 of 9 slow) before BF16 GEMMs on Hopper got their own efficiency,
    fitted on NVIDIA's DGX Cloud BF16 runs (these BF16 steps were priced at the FP8 runs' fraction)."""
    errors = {}
    for name, (model_name, flops, talk) in cluster.TALK_TABLE.items():
        for k, (days, step) in talk_days(name).items():
            # days are the FLOPs over the cluster's model FLOP/s in that step, spares included
            assert days * 86_400 == pytest.approx(flops / (step.model_flops / step.step_seconds), rel=1e-12)
            assert step.memory.total <= step.gpu.memory_bytes and 0.9 * k <= step.layout.gpus <= k
            errors[(name, k)] = days / talk[k] - 1
    print({key: f"{e:+.1%}" for key, e in errors.items()})
    assert all(abs(e) <= 0.45 for e in errors.values()), errors
    assert sum(e > 0 for e in errors.values()) >= 7, errors
    measured_fp8_days = 3.4e24 / (338e12 * 1024) / 86_400
    assert cluster.TALK_TABLE["DeepSeek-V3"][2][1024] < measured_fp8_days
    bridge = next(c for c in stepvalidate.load_cases() if c["name"].startswith("bridge2509_deepseek_v3_1024xh100"))
    assert abs(stepvalidate.check(bridge).error) <= 0.10


def test_cluster_step_keeps_the_global_batch_and_fp8_keeps_part_of_its_2x_peak(talk_days, fp8_step_from_bf16):
    recipe = cluster.CLUSTER_RECIPES["deepseek-v3"]
    bf16, fp8 = talk_days("DeepSeek-V3"), talk_days("DeepSeek-V3", "fp8")
    for k, (days, step) in bf16.items():
        lay = step.layout
        # the global batch is fixed in sequences: fewer micro-batches per replica on a larger cluster
        assert lay.micro_batches * lay.dp == pytest.approx(recipe.global_batch, rel=0.05)
        # ep x etp divides the data-parallel ranks of a stage; the experts' replicas are what a failure takes down
        assert (lay.tp * lay.cp * lay.dp) % (lay.ep * lay.expert_tp) == 0
        # days follow the step time (same global batch); FP8 runs only the GEMMs at twice the rate
        fp8_days, fp8_step = fp8[k]
        assert days / fp8_days == pytest.approx(step.step_seconds / fp8_step.step_seconds, rel=1e-9)
        assert fp8_step.step_seconds == pytest.approx(fp8_step_from_bf16(step, fp8_step), rel=1e-3)
        # shorter stages, a shorter bubble; less compute to hide the expert all-to-all behind
        assert fp8_step.by_op["pipeline bubble"] < step.by_op["pipeline bubble"]
        assert stepmodel.breakdown(fp8_step)["communication"] > stepmodel.breakdown(step)["communication"]
    bubble = [s.by_op["pipeline bubble"] / s.step_seconds for _, s in bf16.values()]
    assert bubble[0] < bubble[-1]  # fewer micro-batches per replica: more of the step is pipeline fill and drain
    with pytest.raises(ConfigError) as e:
        cluster.cluster_step(shapes.load_model("deepseek-v3"), "h100", 32, "bf16", recipe)
    assert e.value.key == "gpus"


def test_plan_optimum_maps_bits_to_hardware_and_counts_6nd():
    point = {"P": 4, "N": 1e9, "D": 2e10, "loss": 3.1}
    on_b200 = cluster.plan_optimum(point, [1024], gpu="b200")
    on_h100 = cluster.plan_optimum(point, [1024], gpu="h100")
    assert (on_b200.hardware_precision, on_h100.hardware_precision) == ("fp4", "fp8")
    assert on_b200.flops == 1.2e20
    # the days are the dense shape's NVFP4 step on the cluster
    step = cluster.cluster_step(shapes.gpt_for_params(1e9, 8), "b200", 1024, "nvfp4", cluster.DENSE_RECIPE)
    assert on_b200.runs[0].days == pytest.approx(1.2e20 / (step.model_flops / step.step_seconds) / 86_400, rel=1e-12)
    assert on_b200.runs[0].mfu == pytest.approx(runplan.step_mfu(step, 1024))
    assert cluster.plan_optimum(point, [1024], gpu="b200", mfu=0.4).runs[0].days == pytest.approx(
        runplan.train_days(1.2e20, 1024, "b200", "fp4", mfu=0.4))


class _PowerLawFit:
    """A fitted law stand-in: optimal loss E + k * C^-g has a closed-form inverse."""

    law, params = "power", {"E": 1.7, "k": 400.0, "g": 0.15}

    def predict(self, compute):
        return self.params["E"] + self.params["k"] * compute ** -self.params["g"]


def test_compute_for_target_loss_inverts_the_optimal_loss():
    fit = _PowerLawFit()
    target = 2.2
    exact = (fit.params["k"] / (target - fit.params["E"])) ** (1 / fit.params["g"])
    assert cluster.compute_for_target_loss(fit.predict, target) == pytest.approx(exact, rel=2e-3)
    with pytest.raises(ConfigError, match="target-loss"):
        cluster.compute_for_target_loss(fit.predict, 1.69)  # below the irreducible loss


def test_a_law_optimum_smaller_than_the_dense_recipe_pipeline_is_still_stepped():
    """A fitted law's optimum can be a tiny model at cluster compute (`scaling reproduce --preset quick` put one
    at N = 1e5: 1 layer): the dense recipe's pp 8 cannot hold it, so pp drops to the layers it has (it was
    'at least 32 GPUs' on 1,024 GPUs, which failed the README's first command)."""
    model = shapes.gpt_for_params(1e5, 8)
    assert model.layers < parse_step_layout(cluster.DENSE_RECIPE.layout).pp // 2
    step = cluster.cluster_step(model, "h100", 1024, "bf16", cluster.DENSE_RECIPE)
    assert step.layout.pp <= model.layers and step.layout.gpus <= 1024
    point = {"P": 8.0, "N": 1e5, "D": 3.4e24 / 6e5, "loss": 1.0}
    assert all(r.days > 0 for r in cluster.plan_optimum(point, [1024, 5000], "h100").runs)


def test_every_dense_shape_a_law_can_put_its_optimum_at_lays_out_on_a_cluster():
    """A law fitted on another CPU put its cluster-scale optimum at 2 layers, 128 wide; the dense recipe's
    tp 8 and pp 8 x vpp chunks could not take it and the planner answered 'gpus: got 1024; allowed: at
    least 32 GPUs', contradicting itself. Every shape from 1e4 to 1e12 parameters now lays out (tp cut
    to the heads, virtual stages to the layers), and too few GPUs is the only 'gpus' error."""
    for n in np.geomspace(1e4, 1e12, 41):
        model = shapes.gpt_for_params(float(n), 8)
        step = cluster.cluster_step(model, "h100", 1024, "bf16", cluster.DENSE_RECIPE)
        assert step.layout.gpus <= 1024 and model.heads % step.layout.tp == 0, model.name
        assert step.layout.pp * step.layout.vpp <= model.layers, model.name
    one_head = shapes.ModelShape("one-head", layers=2, hidden=128, heads=1, kv_heads=1, ffn=512, vocab=32000)
    assert cluster.cluster_step(one_head, "h100", 1024, "bf16", cluster.DENSE_RECIPE).layout.tp == 1
    with pytest.raises(ConfigError, match=r"gpus: got 4; allowed: at least 24 GPUs for gpt-L3-h384"):
        cluster.cluster_step(shapes.gpt_for_params(5e6, 8), "h100", 4, "bf16", cluster.DENSE_RECIPE)
