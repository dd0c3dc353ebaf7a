import json
import math
import re
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from scaling.plan import cluster as plan, stepmodel, stepvalidate
from scaling.errors import ConfigError


def _talk_days(name, precision="bf16", gpus=(1024, 5000, 10000)):
    """{K: (days, step)} of a talk-table run under its written-down layout."""
    from scaling.plan import stepmodel

    model_name, flops, _ = plan.TALK_TABLE[name]
    model, recipe = stepmodel.load_model(model_name), plan.CLUSTER_RECIPES[model_name]
    out = {}
    for k in gpus:
        step = plan.cluster_step(model, "h100", k, precision, recipe)
        out[k] = (plan.plan_run(flops, k, "h100", step=step).days, step)
    return out


def test_talk_table_recomputed_from_written_down_layouts():
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
    for name, (model_name, flops, talk) in plan.TALK_TABLE.items():
        for k, (days, step) in _talk_days(name).items():
            # days are the FLOPs over the cluster's model FLOP/s in that step, spares included
            assert days * 86_400 == pytest.approx(flops / (step.model_flops / step.step_seconds), rel=1e-12)
            assert step.memory.total <= step.gpu.memory_bytes and 0.9 * k <= step.layout.gpus <= k
            errors[(name, k)] = days / talk[k] - 1
    print({key: f"{e:+.1%}" for key, e in errors.items()})
    assert all(abs(e) <= 0.45 for e in errors.values()), errors
    assert sum(e > 0 for e in errors.values()) >= 7, errors
    measured_fp8_days = 3.4e24 / (338e12 * 1024) / 86_400
    assert plan.TALK_TABLE["DeepSeek-V3"][2][1024] < measured_fp8_days
    bridge = next(c for c in stepvalidate.load_cases() if c["name"].startswith("bridge2509_deepseek_v3_1024xh100"))
    assert abs(stepvalidate.check(bridge).error) <= 0.10


KEPT_BF16 = ("gemm output", "gemm router")  # GEMMs every recipe runs in BF16 (stepmodel: rate="bf16")


def _fp8_step_from_bf16(bf16_step, fp8_step) -> float:
    """The FP8 step its BF16 step predicts: every GEMM but KEPT_BF16 at the FP8 rate (twice the peak at
    the FP8 runs' efficiency, not BF16's: H100 0.493 of 1,979 against 0.595 of 989, so 1.66x, not 2x);
    attention, memory-bound ops and the optimizer unchanged; plus what the FP8 step reports for its
    quantise ops, its pipeline bubble and its exposed communication (less compute hides less of it)."""
    moving = ("quantise", "communication", "pipeline bubble")
    cat = stepmodel.category
    gpu, eff = fp8_step.gpu, stepmodel.efficiency_for(fp8_step.gpu)
    speedup = gpu.peak_tflops["fp8"] * eff.gemm_at("fp8") / (gpu.peak_tflops["bf16"] * eff.gemm_at("bf16"))
    gemms = sum(t if op in KEPT_BF16 else t / speedup for op, t in bf16_step.by_op.items() if cat(op) == "GEMMs")
    same = sum(t for op, t in bf16_step.by_op.items() if cat(op) not in ("GEMMs", *moving))
    return gemms + same + sum(t for op, t in fp8_step.by_op.items() if cat(op) in moving)


def test_cluster_step_keeps_the_global_batch_and_fp8_keeps_part_of_its_2x_peak():
    recipe = plan.CLUSTER_RECIPES["deepseek-v3"]
    bf16, fp8 = _talk_days("DeepSeek-V3"), _talk_days("DeepSeek-V3", "fp8")
    for k, (days, step) in bf16.items():
        lay = step.layout
        # the global batch is fixed in sequences: fewer micro-batches per replica on a larger cluster
        assert lay.micro_batches * lay.dp == pytest.approx(recipe.global_batch, rel=0.05)
        # ep x etp divides the data-parallel ranks of a stage; the experts' replicas are what a failure takes down
        assert (lay.tp * lay.cp * lay.dp) % (lay.ep * lay.expert_tp) == 0
        # days follow the step time (same global batch); FP8 runs only the GEMMs at twice the rate
        fp8_days, fp8_step = fp8[k]
        assert days / fp8_days == pytest.approx(step.step_seconds / fp8_step.step_seconds, rel=1e-9)
        assert fp8_step.step_seconds == pytest.approx(_fp8_step_from_bf16(step, fp8_step), rel=1e-3)
        # shorter stages, a shorter bubble; less compute to hide the expert all-to-all behind
        assert fp8_step.by_op["pipeline bubble"] < step.by_op["pipeline bubble"]
        assert stepmodel.breakdown(fp8_step)["communication"] > stepmodel.breakdown(step)["communication"]
    bubble = [s.by_op["pipeline bubble"] / s.step_seconds for _, s in bf16.values()]
    assert bubble[0] < bubble[-1]  # fewer micro-batches per replica: more of the step is pipeline fill and drain
    with pytest.raises(ConfigError) as e:
        plan.cluster_step(stepmodel.load_model("deepseek-v3"), "h100", 32, "bf16", recipe)
    assert e.value.key == "gpus"


def test_days_formula_with_fixed_mfu():
    # 3.4e24 / (1024 * 989e12 * 86400) = 38.86 days at 100% MFU; 40% MFU -> 97.1 days
    assert plan.train_days(3.4e24, 1024, mfu=1.0) == pytest.approx(3.4e24 / (1024 * 989e12 * 86400))
    assert plan.train_days(3.4e24, 1024, mfu=0.4) == pytest.approx(97.15, abs=0.01)
    # B200 FP4 peak 9000 TFLOP/s dense
    assert plan.train_days(9e15 * 86400, 1, gpu="b200", precision="fp4", mfu=1.0) == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="mfu"):
        plan.plan_run(1e24, 1024)  # neither a measured MFU nor a step


def test_spec_sheet_peaks():
    assert plan.get_gpu("h100").peak("bf16") == 989e12
    assert plan.get_gpu("h100").peak("fp8") == 1979e12
    assert plan.get_gpu("h200").peak_tflops == plan.get_gpu("h100").peak_tflops
    assert plan.get_gpu("h800").peak_tflops == plan.get_gpu("h100").peak_tflops
    assert plan.get_gpu("h800").nvlink_gbps == plan.get_gpu("h100").nvlink_gbps * 4 / 9  # 400 of 900 GB/s
    assert plan.get_gpu("a100").peak("fp16") == 312e12
    assert plan.get_gpu("b200").peak("bf16") == 2250e12 and plan.get_gpu("b200").peak("fp8") == 4500e12
    with pytest.raises(ConfigError, match="precision: got 'fp8'"):
        plan.get_gpu("a100").peak("fp8")
    with pytest.raises(ConfigError, match="precision: got 'fp4'"):
        plan.train_days(1e24, 1024, gpu="h100", precision="fp4", mfu=0.4)


@pytest.mark.parametrize(
    "bits, gpu, expected",
    [(4, "b200", "fp4"), (4, "h100", "fp8"), (4, "a100", "bf16"), (4.5, "b200", "fp8"), (6, "h100", "fp8"),
     (8, "b200", "fp8"), (8, "a100", "bf16"), (12, "h100", "bf16"), (16, "h100", "bf16"), (32, "h100", "tf32")],
)
def test_precision_for_bits(bits, gpu, expected):
    assert plan.precision_for_bits(bits, gpu) == expected


# -- a shape from a parameter count ------------------------------------------------------------


@pytest.mark.parametrize("params", [1e8, 7e9, 7e10])
def test_gpt_shape_from_params_matches_parameter_count(params):
    for tp in (1, 8):
        model = stepmodel.gpt_for_params(params, tp)
        assert model.hidden % 128 == 0 and model.heads % tp == 0 and model.hidden % model.heads == 0
        assert 12 * model.layers * model.hidden**2 == pytest.approx(params, rel=0.1)
        assert model.layers * (model.attention_params + model.mlp_params(False)) == 12 * model.layers * model.hidden**2
        assert 100 <= model.hidden / model.layers <= 160 or model.layers < 8
    with pytest.raises(ConfigError, match="params"):
        stepmodel.gpt_for_params(-1.0)


# -- reliability -------------------------------------------------------------------------------


def test_llama3_failure_rate_round_trip():
    assert plan.expected_interruptions(54, 16384) == pytest.approx(419)
    assert plan.GPU_MTBF_HOURS / 16384 == pytest.approx(3.09, abs=0.01)  # one job failure every ~3 h


def _simulate_checkpoint_restart(rng, segments, mtbf, tau, ckpt, restart):
    """Wall time per segment of tau compute + ckpt write; a failure loses the segment and costs a restart."""
    need = np.full(segments, tau + ckpt)  # first attempt starts right after the previous checkpoint
    wall = np.zeros(segments)
    pending = np.arange(segments)
    while pending.size:
        fail_at = rng.exponential(mtbf, pending.size)
        done = fail_at >= need[pending]
        wall[pending] += np.where(done, need[pending], fail_at)
        need[pending] = restart + tau + ckpt  # later attempts must also survive the restart
        pending = pending[~done]
    return wall


def test_checkpoint_goodput_matches_monte_carlo():
    rng = np.random.default_rng(0)
    mtbf, tau, ckpt, restart = 3.0, 1.0, 0.2, 0.5  # hours; failures are frequent so the test has teeth
    wall = _simulate_checkpoint_restart(rng, 200_000, mtbf, tau, ckpt, restart)
    simulated = tau / wall.mean()
    # delta method: se(tau/mean) = goodput * se(mean)/mean
    se = simulated * wall.std() / math.sqrt(wall.size) / wall.mean()
    predicted = plan.checkpoint_goodput(mtbf, tau, ckpt, restart)
    assert 0.5 < predicted < 0.7  # far from 1: a wrong formula cannot hide
    assert abs(simulated - predicted) < 4 * se, (simulated, predicted, se)
    assert 4 * se < 0.005  # the check resolves 0.5%-level errors


def test_daly_interval_is_the_optimum_of_the_exact_goodput():
    mtbf, ckpt, restart = plan.GPU_MTBF_HOURS / 10000, 5 / 60, 20 / 60
    daly = plan.optimal_checkpoint_interval(mtbf, ckpt)
    assert daly == pytest.approx(math.sqrt(2 * ckpt * mtbf), rel=0.1)  # Young's first-order value
    grid = np.linspace(0.05, 5.0, 2000)
    best = max(plan.checkpoint_goodput(mtbf, t, ckpt, restart) for t in grid)
    assert plan.checkpoint_goodput(mtbf, daly, ckpt, restart) == pytest.approx(best, abs=1e-4)


def _simulate_drop_replica(rng, replicas, mtbf_replica, repair, stall, horizon):
    """Fraction of full throughput: live replicas / n, zero while any failure's stall window is open."""
    cycles = int(3 * horizon / (mtbf_replica + repair)) + 50
    up = rng.exponential(mtbf_replica, (replicas, cycles))
    starts = np.concatenate([np.zeros((replicas, 1)), np.cumsum(up + repair, axis=1)[:, :-1]], axis=1)
    # stationary start: drop a uniform slice of the first cycle so replicas are out of phase
    offset = rng.uniform(0, mtbf_replica + repair, (replicas, 1))
    fail = (starts + up - offset).ravel()
    times = np.concatenate([fail, fail + repair, fail + stall])
    d_live = np.concatenate([-np.ones_like(fail), np.ones_like(fail), np.zeros_like(fail)])
    d_stall = np.concatenate([np.ones_like(fail), np.zeros_like(fail), -np.ones_like(fail)])
    order = np.argsort(times)
    times, d_live, d_stall = times[order], d_live[order], d_stall[order]
    live = replicas + np.cumsum(d_live)
    stalled = np.cumsum(d_stall) > 0
    start = np.clip(times, 0, horizon)
    end = np.clip(np.append(times[1:], horizon), 0, horizon)
    return float(np.sum((end - start) * live / replicas * ~stalled)) / horizon


def test_drop_replica_goodput_matches_monte_carlo():
    rng = np.random.default_rng(1)
    gpus, replica_gpus, gpu_mtbf, repair, stall = 128, 8, 80.0, 2.5, 0.1  # m = 10 h per replica
    samples = np.array([_simulate_drop_replica(rng, gpus // replica_gpus, gpu_mtbf / replica_gpus, repair, stall, 500.0)
                        for _ in range(60)])
    simulated, se = samples.mean(), samples.std(ddof=1) / math.sqrt(samples.size)
    predicted = plan.drop_replica_goodput(gpus, replica_gpus, gpu_mtbf, repair, stall)
    assert predicted == pytest.approx(0.8 * (1 - 0.1 / 12.5) ** 15)
    assert abs(simulated - predicted) < 4 * se, (simulated, predicted, se)
    assert 4 * se < 0.005  # resolves the 0.7% bias of the cruder A * exp(-n q) approximation


def test_drop_replica_beats_checkpoint_restart_at_scale():
    run = plan.plan_run(3.4e24, 10000, mfu=0.3)
    assert run.drop_replica_goodput > run.checkpoint_goodput
    assert run.checkpoint_days > run.drop_replica_days > run.days


# -- tie to the science ------------------------------------------------------------------------


def test_plan_optimum_maps_bits_to_hardware_and_counts_6nd():
    point = {"P": 4, "N": 1e9, "D": 2e10, "loss": 3.1}
    on_b200 = plan.plan_optimum(point, [1024], gpu="b200")
    on_h100 = plan.plan_optimum(point, [1024], gpu="h100")
    assert (on_b200.hardware_precision, on_h100.hardware_precision) == ("fp4", "fp8")
    assert on_b200.flops == 1.2e20
    # the days are the dense shape's NVFP4 step on the cluster
    step = plan.cluster_step(stepmodel.gpt_for_params(1e9, 8), "b200", 1024, "nvfp4", plan.DENSE_RECIPE)
    assert on_b200.runs[0].days == pytest.approx(1.2e20 / (step.model_flops / step.step_seconds) / 86_400, rel=1e-12)
    assert on_b200.runs[0].mfu == pytest.approx(plan.step_mfu(step, 1024))
    assert plan.plan_optimum(point, [1024], gpu="b200", mfu=0.4).runs[0].days == pytest.approx(
        plan.train_days(1.2e20, 1024, "b200", "fp4", mfu=0.4))


class _PowerLawFit:
    """A FitResult-like stand-in: optimal loss E + k * C^-g has a closed-form inverse."""

    law, params = "power", {"E": 1.7, "k": 400.0, "g": 0.15}

    def predict(self, compute):
        return self.params["E"] + self.params["k"] * compute ** -self.params["g"]


def _optimize(fit_result, compute):
    return {"loss": fit_result.predict(compute)}


def test_compute_for_target_loss_inverts_the_optimal_loss():
    fit = _PowerLawFit()
    target = 2.2
    exact = (fit.params["k"] / (target - fit.params["E"])) ** (1 / fit.params["g"])
    assert plan.compute_for_target_loss(fit, target, _optimize) == pytest.approx(exact, rel=2e-3)
    with pytest.raises(ConfigError, match="target-loss"):
        plan.compute_for_target_loss(fit, 1.69, _optimize)  # below the irreducible loss


# -- CLI ---------------------------------------------------------------------------------------


def _cli(*argv):
    return subprocess.run([sys.executable, "-m", "scaling.cli", "plan", *argv], capture_output=True, text=True)


def test_cli_prints_the_talk_table_from_the_step_model():
    proc = _cli("--flops", "3.4e24", "--model", "deepseek-v3", "--gpus", "1024", "5000", "10000")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip().split(" ")[0].replace(",", "").isdigit()]
    days = {int(r[0].replace(",", "")): float(r[2]) for r in rows}
    assert days == pytest.approx({k: d for k, (d, _) in _talk_days("DeepSeek-V3").items()}, rel=1e-3)
    assert "989" in proc.stdout and "tp2 pp8 vpp4 dp64 ep64" in proc.stdout
    fixed = _cli("--flops", "3.4e24", "--mfu", "0.4", "--gpus", "1024")
    assert fixed.returncode == 0 and float(fixed.stdout.splitlines()[3].split()[2]) == pytest.approx(97.15, abs=0.02)


def test_cli_memory_of_a_parameter_count_under_zero_3():
    proc = _cli("step", "--model", "7e9", "--layout", "dp=8,zero=3", "--recompute", "full", "--json")
    assert proc.returncode == 0, proc.stderr
    gib = json.loads(proc.stdout)["memory_breakdown_gib"]
    params = stepmodel.gpt_for_params(7e9).params  # 7.3e9 with the 32K vocabulary in and out
    # Megatron mixed precision: BF16 weights 2, FP32 gradients 4, master + Adam 12 bytes, all / dp under ZeRO-3
    for key, nbytes in (("weights", 2), ("gradients", 4), ("optimizer", 12)):
        assert gib[key] == pytest.approx(params * nbytes / 8 / 2**30, rel=1e-3)


@pytest.mark.parametrize(
    "argv, key",
    [
        (["--flops", "lots"], "flops"),
        (["--flops", "1e24", "--gpus", "0"], "gpus"),
        (["--flops", "1e24", "--gpu", "v100"], "gpu"),
        (["--flops", "1e24", "--gpu", "a100", "--precision", "fp8"], "precision"),
        (["--flops", "1e24"], "model"),  # the step of which model? (or --mfu)
        (["--flops", "1e24", "--model", "llama2-7b"], "model"),  # no written-down cluster layout
        (["--fit", "missing.json", "--compute", "1e22", "--layout", "tp=8,zero=7"], "layout.zero"),
        (["--flops", "1e24", "--mfu", "0.4", "--layout", "tp=8"], "compute/target-loss/layout"),  # --layout is for --fit
        ([], "plan"),
    ],
)
def test_cli_bad_arguments_are_one_line_errors(argv, key):
    proc = _cli(*argv)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"error: {key}:"), proc.stderr


# Kumar et al. 2024 form with kappa = 3: the sweet spot is P* = gamma * 1.904 = 4.76 bits.
KUMAR_PARAMS = {"E": 1.7, "A": 400.0, "B": 1500.0, "alpha": 0.34, "beta": 0.28, "gamma": 2.5, "kappa": 3.0}


@pytest.fixture
def kumar_fit_json(tmp_path):
    from scaling.study import fit

    path = tmp_path / "kumar.json"
    fit.FitResult(law="kumar", params=KUMAR_PARAMS, objective=0.0, residuals=np.array([])).to_json(path)
    return path


def test_cli_plans_the_compute_optimum_of_a_fitted_law(kumar_fit_json, capsys):
    from scaling import cli
    from scaling.study import fit, optimal

    best = optimal.optimal_precision(fit.FitResult.from_json(kumar_fit_json), compute=1e22)
    assert best["P"] == pytest.approx(2.5 * 1.904, abs=0.01)
    flops = 6 * best["N"] * best["D"]  # hardware FLOPs; optimal's compute counts P/16 of them
    # 4.76 bits need an 8-bit format (FP4 is too narrow); the A100 has none below BF16
    for gpu, fmt, p4_fmt in (("b200", "fp8", "fp4"), ("h100", "fp8", "fp8"), ("a100", "bf16", "bf16")):
        argv = ["plan", "--fit", str(kumar_fit_json), "--compute", "1e22", "--gpus", "1024", "--gpu", gpu,
                "--layout", "tp=8,zero=1"]
        assert cli.main(argv) == 0
        out = capsys.readouterr().out
        assert f"optimum P={best['P']:.3g} bits -> {fmt}" in out
        optimum_row = out.split("optimum P=")[1].splitlines()[3].split()
        # the optimum's dense shape stepped on 1,024 GPUs with --layout's tp and pp
        recipe = plan.replace(plan.DENSE_RECIPE, layout="tp=8,pp=1,ogr=1,opg=1,tpo=1")
        step = plan.cluster_step(stepmodel.gpt_for_params(best["N"], 8), gpu, 1024, stepmodel.RECIPE_FOR_FORMAT[fmt], recipe)
        assert float(optimum_row[2]) == pytest.approx(flops / (step.model_flops / step.step_seconds) / 86_400, rel=1e-3)
        assert float(optimum_row[1]) == pytest.approx(plan.step_mfu(step, 1024), abs=1e-3)
        assert float(optimum_row[13]) == pytest.approx(step.memory.total / 2**30, abs=0.05)  # GiB/GPU of that step
        assert optimum_row[14:16] == ["tp8", "pp1"]
        rows = {float(line.split()[0]): line.split() for line in out.split("days@1024")[1].split("\n\n")[0].strip().splitlines()}
        assert sorted(rows) == [4, 6, 8, 16, 32]
        assert (rows[4][1], rows[16][1], rows[32][1]) == (p4_fmt, "bf16", "tf32")
        p4 = best["per_precision"].set_index("P").loc[4]
        p4_plan = plan.plan_optimum({"P": 4, "N": p4["N"], "D": p4["D"], "loss": p4["loss"]}, [1024], gpu, recipe=recipe)
        assert float(rows[4][6]) == pytest.approx(p4_plan.runs[0].days, rel=1e-2)


@pytest.mark.slow
def test_cli_target_loss_finds_the_compute_that_reaches_it(kumar_fit_json, capsys):
    from scaling import cli
    from scaling.study import fit, optimal

    assert cli.main(["plan", "--fit", str(kumar_fit_json), "--target-loss", "2.3", "--gpus", "1024"]) == 0
    compute = float(capsys.readouterr().out.split("compute ")[1].split()[0])
    fit_result = fit.FitResult.from_json(kumar_fit_json)
    assert optimal.optimal_precision(fit_result, compute=compute)["loss"] == pytest.approx(2.3, abs=2e-3)
    assert optimal.optimal_precision(fit_result, compute=compute / 1.05)["loss"] > 2.3
    assert cli.main(["plan", "--fit", str(kumar_fit_json), "--target-loss", "1.5"]) == 2  # below E = 1.7
    assert capsys.readouterr().err.startswith("error: target-loss:")
    assert cli.main(["plan", "--fit", str(kumar_fit_json.parent / "missing.json"), "--compute", "1e22"]) == 2
    assert capsys.readouterr().err.startswith("error: fit:")


# -- the step model (scaling.plan.stepmodel: `scaling plan step`) -----------------------------------




def test_presets_have_the_published_parameter_counts():
    # Llama 3 8B's released checkpoint has 8,030,261,248 parameters (untied embeddings)
    assert stepmodel.PRESETS["llama3-8b"].params == 8_030_261_248
    assert stepmodel.PRESETS["llama3-70b"].params == pytest.approx(70.55e9, rel=1e-3)
    assert stepmodel.PRESETS["llama3-405b"].params == pytest.approx(405.9e9, rel=1e-3)
    assert stepmodel.PRESETS["gpt3-175b"].params == pytest.approx(175e9, rel=0.01)


def _inventory_flops(model, layout, seq_len=4096, precision="bf16"):
    """Model FLOPs of one step summed over the op inventory of every GPU."""
    c = stepmodel.Ctx(model, plan.get_gpu("h100"), layout, stepmodel.RECIPES[precision], seq_len, stepmodel.EFFICIENCY["h100"])
    total = 0.0
    for s in range(layout.pp):
        dense, moe = stepmodel.stage_layers(model, layout, s)
        stage = dense * sum(o.flops * o.count for o in stepmodel.layer_ops(c))
        if moe:
            stage += moe * sum(o.flops * o.count for o in stepmodel.layer_ops(c, moe=True))
        stage += sum(o.flops * o.count for o in stepmodel.edge_ops(c, s == 0, s == layout.pp - 1))
        total += stage * layout.tp * layout.cp * layout.dp * layout.micro_batches  # every GPU of the stage
    return total


@pytest.mark.parametrize("layout", [
    stepmodel.StepLayout(),
    stepmodel.StepLayout(tp=4, pp=2, dp=2, micro_batches=4),
    stepmodel.StepLayout(tp=2, cp=2, dp=2, micro_batches=2, recompute="full"),
])
def test_op_inventory_flops_are_6nd_plus_attention(layout):
    model = stepmodel.load_model("llama3-8b")
    tokens = 4096 * layout.micro_batches * layout.dp
    # hand count: N = 32 layers of (4096 * (4096 + 2 * 1024) + 4096^2 + 3 * 4096 * 14336) + 128256 * 4096
    n = 32 * (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336) + 128256 * 4096
    attention = 6 * 32 * 4096 * 4096 * tokens  # causal: 6 * L * s * h per token (QK^T and PV halved)
    assert _inventory_flops(model, layout) == pytest.approx(6 * n * tokens + attention, rel=1e-12)
    r = stepmodel.step(model, "h100", layout)
    assert r.model_flops == pytest.approx(6 * n * tokens + attention, rel=1e-12)  # recompute adds no model FLOPs


def test_moe_presets_have_the_published_parameter_counts():
    # DeepSeek-V3 report: 671B total, 37B activated; Kimi K2: 1.04T / 32B; Mixtral 8x7B: 46.7B / 12.9B;
    # Qwen3: 30.5B / 3.3B and 235B / 22B (model cards); DeepSeek-V2 report (arXiv 2405.04434): 236B / 21B
    published = {"deepseek-v3": (671e9, 37e9), "deepseek-v2": (236e9, 21e9), "kimi-k2": (1.04e12, 32e9), "mixtral-8x7b": (46.7e9, 12.9e9),
                 "qwen3-30b-a3b": (30.5e9, 3.3e9), "qwen3-235b-a22b": (235e9, 22e9)}
    for name, (total, activated) in published.items():
        m = stepmodel.PRESETS[name]
        assert m.params == pytest.approx(total, rel=0.015), name
        assert m.activated_params == pytest.approx(activated, rel=0.03), name
    # DeepSeek-V3 by hand: MLA attention, 3 dense layers, 58 layers of 256 + 1 experts of 3 * 7168 * 2048
    attention = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    norms = 2 * 7168 + 1536 + 512
    expert = 3 * 7168 * 2048
    total = (61 * (attention + norms) + 3 * 3 * 7168 * 18432 + 58 * (257 * expert + 7168 * 256)
             + 2 * 129280 * 7168 + 7168)
    assert stepmodel.PRESETS["deepseek-v3"].params == total


# a small MoE with every feature: MLA, a dense first layer, shared and routed experts
TINY_MOE = stepmodel.Transformer("tiny-moe", layers=4, hidden=1024, heads=8, kv_heads=8, ffn=4096, vocab=1000,
                                 head_size=128, q_rank=256, kv_rank=128, rope_dim=32, v_head=64, experts=16, top_k=4,
                                 shared_experts=1, expert_ffn=512, dense_layers=1)


@pytest.mark.parametrize("layout", [
    stepmodel.StepLayout(dp=4, ep=4),
    stepmodel.StepLayout(tp=2, pp=2, dp=2, ep=2, etp=1, micro_batches=2),
    stepmodel.StepLayout(tp=2, dp=4, ep=8, etp=1, recompute="full"),
    stepmodel.StepLayout(tp=2, dp=4, ep=4, micro_batches=2, recompute="selective", a2a_overlap=True),  # etp = tp
    stepmodel.StepLayout(pp=3, dp=2, ep=2, micro_batches=3),  # 4 layers on 3 stages: 2, 2, 0... uneven
])
def test_moe_op_inventory_flops_are_6_activated_nd_plus_attention(layout):
    m, s = TINY_MOE, 4096
    tokens = s * layout.micro_batches * layout.dp
    attention = 1024 * 256 + 256 * 8 * 160 + 1024 * 160 + 128 * 8 * 192 + 8 * 64 * 1024
    dense_mlp = 3 * 1024 * 4096
    moe_mlp = 3 * 1024 * 512 * (4 + 1) + 1024 * 16  # top-4 routed + 1 shared + the router
    n = 4 * attention + dense_mlp + 3 * moe_mlp + 1000 * 1024
    assert m.matmul_params == n
    attention_flops = 3 * 4 * s * 8 * (160 + 64) * tokens  # causal QK^T (160 per head) and PV (64)
    assert _inventory_flops(m, layout, s) == pytest.approx(6 * n * tokens + attention_flops, rel=1e-12)
    r = stepmodel.step(m, "h100", layout, "bf16", s)
    assert r.model_flops == pytest.approx(6 * n * tokens + attention_flops, rel=1e-12)


@pytest.mark.parametrize("layout", [stepmodel.StepLayout(dp=4, ep=4), stepmodel.StepLayout(tp=2, pp=2, dp=2, ep=2, etp=1, micro_batches=2)])
def test_mtp_module_is_one_more_layer_a_projection_and_an_output_layer_on_the_last_stage(layout):
    m, s = replace(TINY_MOE, mtp=1), 4096
    tokens = s * layout.micro_batches * layout.dp
    attention = 1024 * 256 + 256 * 8 * 160 + 1024 * 160 + 128 * 8 * 192 + 8 * 64 * 1024
    moe_mlp = 3 * 1024 * 512 * (4 + 1) + 1024 * 16
    # DeepSeek-V3 Sec. 2.2: its own (MoE) layer, the 2h -> h projection and the shared output layer run per token
    n = TINY_MOE.matmul_params + attention + moe_mlp + 2 * 1024 * 1024 + 1000 * 1024
    assert m.matmul_params == n
    assert (m.params, m.activated_params) == (TINY_MOE.params, TINY_MOE.activated_params)  # as DeepSeek counts them
    assert m.mtp_params == TINY_MOE.layer_params(True) + 2 * 1024 * 1024 + 2 * 1024
    attention_flops = 3 * 5 * s * 8 * (160 + 64) * tokens  # 4 layers + the MTP layer
    assert _inventory_flops(m, layout, s) == pytest.approx(6 * n * tokens + attention_flops, rel=1e-12)
    assert stepmodel.step(m, "h100", layout, "bf16", s).model_flops == pytest.approx(6 * n * tokens + attention_flops, rel=1e-12)
    last = layout.pp - 1
    assert stepmodel.stage_layers(m, layout, last)[1] == stepmodel.stage_layers(TINY_MOE, layout, last)[1] + 1
    if layout.pp > 1:  # the first stage is unchanged; the last also holds a copy of the embedding
        assert stepmodel.stage_layers(m, layout, 0) == stepmodel.stage_layers(TINY_MOE, layout, 0)
        extra = stepmodel.stage_params(m, layout, last) - stepmodel.stage_params(TINY_MOE, layout, last)
        routed = 3 * 1024 * 512 * 16
        embedding = stepmodel.padded_vocab(m, 2) * 1024
        assert extra == pytest.approx((m.mtp_params - routed + embedding) / 2 + routed / 2)  # tp 2; ep 2 x etp 1


def test_moe_memory_terms_hand_counted():
    m, s = TINY_MOE, 4096
    lay = stepmodel.StepLayout(tp=2, dp=4, ep=4, etp=1, zero=1)
    attention, norms = 1024 * 256 + 256 * 8 * 160 + 1024 * 160 + 128 * 8 * 192 + 8 * 64 * 1024, 2 * 1024 + 256 + 128
    routed = 16 * 3 * 1024 * 512
    replicated = (4 * (attention + norms) + 3 * 1024 * 4096 + 3 * (3 * 1024 * 512 + 1024 * 16) + 2 * 1000 * 1024 + 1024)
    local_replicated, local_routed = stepmodel.stage_params_split(m, lay, 0)
    assert local_replicated == pytest.approx(replicated / 2 + (1024 - 1000) * 1024 * 2 / 2)  # vocabulary padded to 1024
    assert local_routed == 3 * routed / 4  # 3 MoE layers, experts over ep = 4
    # ZeRO-1: the replicated parameters' optimizer states over dp x cp = 4, the experts' over
    # their expert-data-parallel group tp cp dp / (ep etp) = 2
    assert lay.expert_dp == 2
    mem = stepmodel.stage_memory(m, lay, s, 0)
    assert mem.weights == pytest.approx(2 * (local_replicated + local_routed))
    assert mem.gradients == pytest.approx(4 * (local_replicated + local_routed))
    assert mem.optimizer == pytest.approx(12 * (local_replicated / 4 + local_routed / 2))
    # activations of a MoE layer (BF16, sequence parallel over tp = 2, 2048 own tokens per GPU):
    t, te = 4096, 2048
    per_token = (4 * 1024) / 2 + (2 * 256 + 2 * 128 + 32) + 8 * (2 * 160 + 64 + 64) / 2 + 3 * 512 / 2
    slots = te * 4  # own tokens x top-4, etp = 1
    expect = 2 * (t * per_token + slots * (1024 + 3 * 512)) + 4 * te * 16  # + FP32 router scores
    assert stepmodel.activation_bytes_per_layer(m, lay, s, moe=True) == pytest.approx(expect)
    # selective recompute drops MLA's Q, K, V (redone from the latents)
    selective = stepmodel.activation_bytes_per_layer(m, stepmodel.StepLayout(tp=2, dp=4, ep=4, etp=1, recompute="selective"), s, True)
    assert expect - selective == pytest.approx(2 * t * 8 * (2 * 160 + 64) / 2)


def test_moe_all_to_all_on_nvlink_inside_a_node_and_the_network_across():
    model = stepmodel.load_model("deepseek-v3", layers=8, mtp=0)  # 5 MoE layers (3 dense first)

    def a2a(text):
        r = stepmodel.step(model, "h100", stepmodel.parse_step_layout(text, micro_batches=8, recompute="selective"))
        return r.by_collective.get("ep all-to-all", 0.0), r

    inside, _ = a2a("dp=8,ep=8")  # one node
    across, base = a2a("dp=64,ep=64")  # eight nodes: 7/8 of the copies through the NIC
    assert 0 < inside < across
    # each of 8 copies of a token (7168 x 2 bytes), 7 of 8 off the node, at the NIC's 50 GB/s x efficiency
    eff = stepmodel.EFFICIENCY["h100"].bandwidth
    one = 4096 * 8 * 7168 * 2 * (56 / 64) / (50e9 * eff) + 6e-6
    assert across == pytest.approx(4 * 5 * 8 * one, rel=1e-9)  # 4 per layer, 5 MoE layers, 8 micro-batches
    deepep, _ = a2a("dp=64,ep=64,deepep=1")  # once per remote node: at most 4 nodes (node-limited routing)
    assert deepep == pytest.approx(across * (4 * 7 / 8) / (8 * 7 / 8), rel=1e-3)
    hidden, overlapped = a2a("dp=64,ep=64,a2ao=1")
    assert hidden < across and overlapped.step_seconds < base.step_seconds
    # DeepEP overlapped: what compute hides costs compute 20 of the 132 SMs for as long (20 / 112 more time)
    exposed, both = a2a("dp=64,ep=64,deepep=1,a2ao=1")
    assert 0 <= exposed < deepep
    assert both.by_op["ep all-to-all SM share"] == pytest.approx((deepep - exposed) * 20 / 112, rel=1e-9)
    assert "ep all-to-all SM share" not in overlapped.by_op  # NCCL's all-to-all: not priced
    # a routing imbalance adds expert time, not model FLOPs
    from unittest import mock
    with mock.patch.object(stepmodel, "MOE_IMBALANCE", 1.5):
        _, skewed = a2a("dp=64,ep=64")
    assert skewed.model_flops == base.model_flops
    assert skewed.by_op["gemm expert-fc1"] == pytest.approx(1.5 * base.by_op["gemm expert-fc1"], rel=0.05)


@pytest.mark.parametrize("layout, key", [
    ("dp=4,ep=3", "layout.ep"),  # 16 experts
    ("dp=2,ep=4", "layout.ep"),  # ep does not divide tp * cp * dp
    ("tp=2,dp=2,ep=4", "layout.ep"),  # etp defaults to tp: ep * etp = 8 > 4
    ("tp=2,sp=0,dp=2,ep=2,etp=1", "sequence-parallel"),
])
def test_moe_bad_layouts_are_config_errors(layout, key):
    with pytest.raises(ConfigError) as e:
        stepmodel.step(TINY_MOE, "h100", stepmodel.parse_step_layout(layout), "bf16", 4096)
    assert e.value.key == key, str(e.value)
    with pytest.raises(ConfigError) as e:  # a dense model has no experts to split
        stepmodel.step(stepmodel.load_model("llama3-8b", layers=2), "h100", stepmodel.parse_step_layout("dp=2,ep=2"))
    assert e.value.key == "layout.ep" and "no experts" in str(e.value)
    with pytest.raises(ConfigError) as e:
        stepmodel.step(stepmodel.load_model("qwen3-30b-a3b", layers=2), "h100", stepmodel.parse_step_layout("dp=2,ep=2,seo=1"))
    assert e.value.key == "layout.seo"


def test_zero_stages_shard_exactly_what_they_should():
    model = stepmodel.load_model("llama3-8b")
    p = stepmodel.stage_params(model, stepmodel.StepLayout(dp=4), 0)  # pp = tp = 1: every parameter
    assert p == pytest.approx(model.params)
    expect = {0: (2 * p, 4 * p, 12 * p), 1: (2 * p, 4 * p, 3 * p), 2: (2 * p, p, 3 * p), 3: (p / 2, p, 3 * p)}
    for zero, (w, g, o) in expect.items():
        mem = stepmodel.stage_memory(model, stepmodel.StepLayout(dp=4, zero=zero), 4096, 0)
        assert (mem.weights, mem.gradients, mem.optimizer) == pytest.approx((w, g, o))
    # Megatron's default: the distributed optimizer (ZeRO-1) as soon as dp (or cp) > 1
    assert stepmodel.StepLayout(dp=4).zero_stage == 1 and stepmodel.StepLayout(cp=2).zero_stage == 1
    assert stepmodel.StepLayout().zero_stage == 0


def test_activations_match_korthikanti_hand_count():
    # a GPT block (MHA, GELU, ffn = 4h): Korthikanti's 34 s*b*h bytes less the 2 bytes of dropout masks
    gpt = stepmodel.Transformer("gpt", layers=4, hidden=4096, heads=32, kv_heads=32, ffn=16384, vocab=50304, gated=False)
    s, h = 2048, 4096
    none = stepmodel.activation_bytes_per_layer(gpt, stepmodel.StepLayout(tp=4), s)  # sequence parallel by default
    assert none == 32 * s * h / 4
    no_sp = stepmodel.activation_bytes_per_layer(gpt, stepmodel.StepLayout(tp=4, sp=False), s)
    assert no_sp == 2 * s * (4 * h + 12 * h / 4)  # the four tensors before column-parallel GEMMs are replicated
    full = stepmodel.activation_bytes_per_layer(gpt, stepmodel.StepLayout(tp=4, recompute="full"), s)
    assert full == 2 * s * h / 4
    # Llama (GQA, SwiGLU): 2 bytes * t * (6 h + 2 kv + 3 ffn)
    llama = stepmodel.load_model("llama3-8b")
    assert stepmodel.activation_bytes_per_layer(llama, stepmodel.StepLayout(), 4096) == 2 * 4096 * (6 * 4096 + 2 * 1024 + 3 * 14336)
    # 1F1B: the first stage holds pp micro-batches of L/pp layers, the last one
    lay = stepmodel.StepLayout(pp=4, micro_batches=8)
    per_layer = stepmodel.activation_bytes_per_layer(llama, lay, 4096)
    assert stepmodel.stage_memory(llama, lay, 4096, 0).activations == 8 * 4 * per_layer
    assert stepmodel.stage_memory(llama, lay, 4096, 3).activations == 8 * 1 * per_layer


def test_low_precision_recipes_need_the_hardware():
    model = stepmodel.load_model("llama3-70b", layers=8)
    lay = stepmodel.StepLayout(tp=8, micro_batches=4)
    base = stepmodel.step(model, "h100", lay, "bf16")
    fp8 = stepmodel.step(model, "h100", lay, "fp8")
    assert fp8.step_seconds == pytest.approx(_fp8_step_from_bf16(base, fp8), rel=1e-3)  # GEMMs 2x, quantise added
    nvfp4 = stepmodel.step(model, "b200", lay, "nvfp4").step_seconds
    assert nvfp4 < stepmodel.step(model, "b200", lay, "mxfp8").step_seconds
    with pytest.raises(ConfigError, match="precision: got 'nvfp4'"):
        stepmodel.step(model, "h100", lay, "nvfp4")


@pytest.mark.parametrize("argv, key", [
    (["--model", "llama3-70b", "--layout", "tp=3"], "layout.tp"),  # 64 heads, 8 KV heads
    (["--model", "llama3-70b", "--layout", "tp=8,dp=2", "--gpus", "32"], "layout"),
    (["--model", "llama3-70b", "--layout", "tp=8"], "memory"),  # 70B on one node of H100s, no ZeRO
    (["--model", "llama3-70b", "--layers", "2", "--layout", "pp=4,tp=8", "--micro-batches", "4"], "layout.pp"),  # 2 layers
    (["--model", "gpt5", "--layout", "tp=1"], "model"),
    (["--layout", "tp=2,ep=2"], "layout.ep"),
    (["--layout", "tp=1", "--precision", "mxfp4"], "precision"),
    (["--layout", "tp=1,pp=2", "--micro-batches", "1"], "micro-batches"),
    (["--layout", "tp=1", "--seq-len", "4k"], "seq-len"),
])
def test_step_bad_inputs_are_one_line_errors(argv, key):
    proc = _cli("step", *argv)
    assert proc.returncode == 2, proc.stdout
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"error: {key}:"), proc.stderr


def test_step_cli_json_contract(capsys):
    from scaling import cli

    argv = ["plan", "step", "--model", "llama3-70b", "--layers", "12", "--gpu", "b200", "--layout", "tp=4,pp=1,dp=2,zero=1",
            "--seq-len", "4096", "--micro-batch", "1", "--micro-batches", "8", "--precision", "bf16", "--json"]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step_ms"] > 0 and out["memory_gib"] > 0
    assert out["layout"]["sequence_parallel"] and out["layout"]["zero"] == 1
    assert out["tokens_per_step"] == 4096 * 8 * 2
    assert out["memory_gib"] == pytest.approx(out["memory_breakdown_gib"]["total"])
    # the breakdown sums to the step: ops (collectives included) and the optimizer
    assert sum(out["by_op_ms"].values()) == pytest.approx(out["step_ms"], rel=1e-9)
    assert set(out["by_collective_ms"]) >= {"tp all-gather", "tp reduce-scatter", "dp reduce-scatter", "dp all-gather"}
    # a cut-down 70B on 8 B200s: SimuMax measured 765.6 ms and 39.07 GiB for this run
    assert out["step_ms"] == pytest.approx(765.6, rel=0.10) and out["memory_gib"] == pytest.approx(39.07, rel=0.05)
    # the old flat `scaling plan` still parses
    assert cli.main(["plan", "--flops", "1e24", "--gpus", "1024", "--mfu", "0.4"]) == 0


def test_step_model_is_pure_python():
    """No JAX, NumPy or SciPy: `scaling plan step` and `scaling plan --flops --model` answer in a fraction of a second (0.13 s
    measured on a 2-core EPYC; no timing threshold here, timings belong in benchmarks)."""
    code = ("import sys\nfrom scaling import cli\n"
            "cli.main(['plan', 'step', '--model', 'llama3-405b', '--gpu', 'h100', '--gpus', '16384', "
            "'--layout', 'tp=8,pp=16,dp=128,vpp=2', '--micro-batches', '16', '--seq-len', '8192', '--json'])\n"
            "cli.main(['plan', '--flops', '3.4e24', '--model', 'deepseek-v3', '--gpus', '1024', '5000', '10000'])\n"
            "print(sorted(m for m in ('jax', 'numpy', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def _checks():
    return [stepvalidate.check(c) for c in stepvalidate.load_cases()]


def test_validation_cases_are_real_and_kept_apart():
    cases = stepvalidate.load_cases()
    assert len(cases) >= 6 and all(c["source"] for c in cases)
    roles = {c["role"] for c in cases}
    assert roles == {"calibration", "held-out"}
    assert sum(c["role"] == "held-out" for c in cases) > sum(c["role"] == "calibration" for c in cases)


def test_held_out_step_time_and_memory_errors():
    """Every case's error is printed; unexplained cases must be within 10% (time) and 5% (memory),
    explained ones (a `note` in step_cases.json) are listed with their error, whatever it is."""
    checks = _checks()
    print("\n" + stepvalidate.table(checks))
    for c in checks:
        if c.case["role"] != "held-out" or c.case.get("note"):
            continue
        assert abs(c.error) <= 0.10, (c.case["name"], c.error)
        if c.memory_error is not None:
            assert abs(c.memory_error) <= 0.05, (c.case["name"], c.memory_error)
    unexplained = [c for c in checks if abs(c.error) > 0.20 and not c.case.get("note")]
    assert not unexplained
    dense = [c for c in checks if stepvalidate.family_of(c.case) == "dense"]
    within = [abs(c.error) <= 0.10 for c in dense if c.case["role"] == "held-out"]
    # "most" held-out dense cases: 61 of 68 (H100 35 of 37, B200 26 of 31); B200 was 21 of 31 while its flash
    # attention had one efficiency fitted on the steps (long-context CP runs +17% to +29%, Bridge's Llama 3 8B +23% to +28%)
    assert sum(within) / len(within) > 0.8
    # MoE: test_moe_held_out_step_times_after_the_moe_fit


def test_calibration_reproduces_the_constants_in_the_module():
    refits = stepvalidate.calibrate_all(stepvalidate.load_cases())
    assert set(refits) == set(stepmodel.EFFICIENCY)
    for gen, refit in refits.items():
        for key in ("gemm", "gemm_half_flops", "attention", "bandwidth", "moe_layer_seconds", "attention_half_flops",
                    "mla_attention"):
            assert getattr(refit, key) == pytest.approx(getattr(stepmodel.EFFICIENCY[gen], key), rel=0.02), (gen, key)
        rates = dict(stepmodel.EFFICIENCY[gen].gemm_rates)
        assert dict(refit.gemm_rates) == pytest.approx(rates, rel=0.02) and set(dict(refit.gemm_rates)) == set(rates), gen


def test_expected_interruptions_matches_monte_carlo():
    """K GPUs, each failing as a Poisson process of rate 1/MTBF (a failed GPU is replaced at once):
    the count of failures in T days averages T * 24 * K / MTBF."""
    rng = np.random.default_rng(2)
    days, gpus, mtbf = 3.0, 512, 2_000.0  # hours; ~18 expected failures per run
    runs = 20_000
    horizon = days * 24
    counts = np.zeros(runs)
    clocks = rng.exponential(mtbf, (runs, gpus))
    alive = clocks < horizon
    while alive.any():  # every GPU's next failure until all are past the horizon
        counts += alive.sum(axis=1)
        clocks = np.where(alive, clocks + rng.exponential(mtbf, clocks.shape), clocks)
        alive = clocks < horizon
    predicted = plan.expected_interruptions(days, gpus, mtbf)
    se = counts.std() / math.sqrt(runs)
    assert predicted == pytest.approx(days * 24 * gpus / mtbf)
    assert abs(counts.mean() - predicted) < 4 * se, (counts.mean(), predicted, se)
    assert 4 * se < 0.01 * predicted  # resolves a 1% error in the formula


def _h100_step(layout_text, model="llama3-70b", **kw):
    model = stepmodel.load_model(model, layers=kw.pop("layers", 8))
    layout = stepmodel.parse_step_layout(layout_text, micro_batches=kw.pop("micro_batches", 8))
    return stepmodel.step(model, "h100", layout, kw.pop("precision", "bf16"), kw.pop("seq_len", 4096))


def test_tp_overlap_hides_tp_communication_behind_gemms():
    plain = _h100_step("tp=8")
    overlapped = _h100_step("tp=8,tpo=1")
    tp_comm = sum(v for k, v in plain.by_collective.items() if k.startswith("tp "))
    assert tp_comm > 0.05 * plain.step_seconds  # the overlap has something to hide
    assert overlapped.step_seconds < plain.step_seconds
    # never hides more than the TP collectives themselves
    assert overlapped.step_seconds >= plain.step_seconds - tp_comm - 1e-12
    # GEMMs at tp=8 on H100 outlast the layers' collectives, so all of those hide; the output
    # layer's all-gather / reduce-scatter (edge ops) stay exposed
    c = stepmodel.Ctx(plain.model, plain.gpu, plain.layout, stepmodel.RECIPES["bf16"], 4096, stepmodel.EFFICIENCY["h100"])
    edge = sum(o.seconds for o in stepmodel.edge_ops(c, True, True) if o.kind == "comm") * 8  # 8 micro-batches
    assert 0 < edge < 0.1 * tp_comm
    assert overlapped.step_seconds == pytest.approx(plain.step_seconds - tp_comm + edge, rel=1e-9)


def test_dp_and_p2p_overlap_expose_only_a_bucket_and_the_fill():
    base = _h100_step("tp=8,pp=2,dp=4", micro_batches=8)
    ogr = _h100_step("tp=8,pp=2,dp=4,ogr=1,opg=1", micro_batches=8)
    bucket = 40e6  # Megatron's bucket (max(40M, 1M x dp) parameters)
    params = stepmodel.stage_params(base.model, base.layout, 1)
    assert params > 5 * bucket
    ratio = ogr.by_collective["dp all-gather"] / base.by_collective["dp all-gather"]
    assert ratio == pytest.approx(bucket / params, rel=0.05)  # latency terms aside
    p2p = _h100_step("tp=8,pp=2,dp=4,p2p=1", micro_batches=8)
    assert p2p.by_collective["pp send/recv"] == pytest.approx(base.by_collective["pp send/recv"] * 2 / (2 * (8 + 1)))


def test_overlap_flags_bad_input():
    for text, key in (("tp=8,tpo=2", "layout.tpo"), ("tp=1,tpo=1", "layout.tpo"), ("tp=2,ogr=yes", "layout")):
        with pytest.raises(ConfigError) as e:
            stepmodel.parse_step_layout(text)
        assert e.value.key == key, text


def test_dualpipe_bubble_memory_and_bad_layouts():
    """DeepSeek-V3 Table 2: bubble (pp/2 - 1)(F&B + B - 3W), twice the parameters, pp + 1 micro-batches of activations."""
    model = stepmodel.load_model("llama3-8b", layers=8)
    one_f_one_b = stepmodel.parse_step_layout("pp=4,dp=2", micro_batches=8)
    dual = replace(one_f_one_b, dualpipe=True)
    r1, r2 = stepmodel.step(model, "h100", one_f_one_b), stepmodel.step(model, "h100", dual)
    # GPU s runs half the micro-batches of stage s and half of stage 3 - s: GPU 0 has the embedding and the output layer
    c = stepmodel.Ctx(model, plan.get_gpu("h100"), dual, stepmodel.RECIPES["bf16"], 4096, stepmodel.EFFICIENCY["h100"])
    ops = 4 * stepmodel.layer_ops(c) + [o for first, last in ((True, False), (False, True)) for o in stepmodel.edge_ops(c, first, last)]
    half = [(o, 0.5) for o in ops]  # 2 layers on each of its stages, each stage at half the micro-batches
    t = sum(o.seconds * o.count * w for o, w in half)
    fwd = sum(o.seconds * o.count * w for o, w in half if o.name.endswith(" fwd"))
    wgrad = sum(o.seconds * o.count * w for o, w in half if o.kind == "gemm" and o.name.endswith(" bwd")) / 2
    assert r2.by_op["pipeline bubble"] == pytest.approx((4 / 2 - 1) * (t + (t - fwd - wgrad) - 3 * wgrad), rel=1e-9)
    assert r2.by_op["pipeline bubble"] < r1.by_op["pipeline bubble"]
    # twice the parameters of a 1F1B stage (stages 0 and 3 on GPU 0), pp + 1 = 5 micro-batches in flight
    m0 = stepmodel.stage_memory(model, dual, 4096, 0)
    both = stepmodel.stage_params(model, one_f_one_b, 0) + stepmodel.stage_params(model, one_f_one_b, 3)
    assert m0.weights == pytest.approx(2 * both)
    per_layer = stepmodel.activation_bytes_per_layer(model, dual, 4096)
    assert m0.activations == pytest.approx(5 * 2 * per_layer)
    assert stepmodel.stage_memory(model, one_f_one_b, 4096, 0).activations == pytest.approx(4 * 2 * per_layer)
    for text in ("pp=3,dualpipe=1", "pp=4,vpp=2,dualpipe=1", "dualpipe=1"):
        with pytest.raises(ConfigError, match="layout.dualpipe"):
            stepmodel.parse_step_layout(text)


def test_layout_search_returns_the_fastest_fitting_layout():
    """Small enough to enumerate: every candidate is priced, the one returned fits and none that fits is faster."""
    model = stepmodel.load_model("llama3-8b", layers=4)
    gpu = plan.get_gpu("h100")
    best, fitting = stepmodel.search(model, "h100", 8, 16, 2048)
    candidates = stepmodel.candidate_layouts(model, gpu, 8, 16, 2048)
    results = [stepmodel.step(model, "h100", lay, "bf16", 2048, 8) for lay in candidates]
    fits = [r for r in results if r.memory.total <= gpu.memory_bytes]
    assert fitting == len(fits) > 10
    assert best.memory.total <= gpu.memory_bytes and best.layout.gpus == 8
    assert best.tokens == 16 * 2048
    assert all(r.step_seconds >= best.step_seconds for r in fits)
    # layouts a hand check rules out are not candidates: tp over a node, dp not dividing the batch
    assert all(lay.tp <= 8 and 16 % lay.dp == 0 and lay.micro_batch * lay.micro_batches * lay.dp == 16 for lay in candidates)


def test_layout_search_says_when_nothing_fits():
    with pytest.raises(ConfigError) as e:
        stepmodel.search(stepmodel.load_model("llama3-405b"), "h100", 8, 8, 4096)
    assert e.value.key == "memory"


def test_run_days_from_the_step_model():
    r = _h100_step("tp=8,pp=2,dp=4", micro_batches=8)
    tokens = 1e12
    run = stepmodel.run_days(r, tokens)
    assert run.days * 86_400 == pytest.approx(tokens / (r.tokens / r.step_seconds), rel=1e-9)
    assert run.gpus == 64 and 0 < run.checkpoint_goodput < 1 and 0 < run.drop_replica_goodput < 1
    # dropping a replica loses a tp*cp*pp = 16-GPU replica, as plan.drop_replica_goodput says
    assert run.drop_replica_goodput == pytest.approx(plan.drop_replica_goodput(64, 16))


def test_step_cli_search_and_tokens(capsys):
    from scaling import cli

    cli.main(["plan", "step", "--model", "llama3-8b", "--layers", "4", "--gpu", "h100", "--gpus", "8", "--search",
              "--global-batch", "16", "--seq-len", "2048", "--tokens", "1e9", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert d["layout"]["gpus"] == 8 and d["fits"] and d["fitting_layouts"] > 10
    assert d["run"]["days"] == pytest.approx(1e9 / d["tokens_per_s"] / 86_400)
    assert cli.main(["plan", "step", "--search", "--gpus", "8"]) == 2
    assert capsys.readouterr().err.startswith("error: search:")


def test_recipe_speedup_breakdown_adds_up_and_only_gemms_and_casts_change():
    model = stepmodel.load_model("llama3-70b", layers=8)
    layout = stepmodel.parse_step_layout("tp=8", micro_batches=4)
    base, fp8 = stepmodel.recipe_speedup(model, "h100", layout, "fp8")
    b, q = stepmodel.breakdown(base), stepmodel.breakdown(fp8)
    assert sum(b.values()) == pytest.approx(base.step_seconds) and sum(q.values()) == pytest.approx(fp8.step_seconds)
    assert b["quantise"] == 0 < q["quantise"]
    assert q["GEMMs"] < b["GEMMs"] and q["GEMMs"] > b["GEMMs"] / 2  # 2x peak, but the output layer stays BF16
    for k in ("attention", "memory-bound", "communication"):
        assert q[k] == pytest.approx(b[k]), k
    assert fp8.step_seconds == pytest.approx(_fp8_step_from_bf16(base, fp8), rel=1e-3)
    with pytest.raises(ConfigError):
        stepmodel.recipe_speedup(model, "h100", layout, "fp4")  # no FP4 tensor cores on H100


def test_cli_fit_prices_the_recipe_through_the_step_model(kumar_fit_json, capsys):
    from scaling import cli

    speedups, tables = {}, {}
    for gpu in ("h100", "a100"):
        assert cli.main(["plan", "--fit", str(kumar_fit_json), "--compute", "1e22", "--gpus", "1024", "--gpu", gpu,
                         "--layout", "tp=8,zero=1"]) == 0
        lines = capsys.readouterr().out.splitlines()
        at = next(i for i, x in enumerate(lines) if x.startswith("step model"))
        speedups[gpu] = float(lines[at].split(": ")[-1].split("x")[0])
        rows = {}  # "  GEMMs   152.7   78.9": ms per step by category, BF16 and the recipe
        for line in lines[at + 2:]:
            *name, bf16_ms, low_ms = line.split() or [""]
            if " ".join(name) not in stepmodel.CATEGORIES:
                break
            rows[" ".join(name)] = (float(bf16_ms), float(low_ms))
        tables[gpu] = (lines[at], rows)
    assert speedups["a100"] == 1.0  # P = 4.76 bits runs in BF16 on an A100
    # the printed speedup is the printed steps' ratio, and each printed column adds up to its step:
    # only GEMMs, quantise and communication differ between BF16 and FP8
    head, rows = tables["h100"]
    fp8_ms, bf16_ms = (float(m) for m in re.findall(r"step ([0-9.]+) ms vs \w+ ([0-9.]+) ms", head)[0])
    assert speedups["h100"] == pytest.approx(bf16_ms / fp8_ms, abs=0.01)
    assert {"GEMMs", "attention", "quantise", "memory-bound", "communication"} <= set(rows)
    assert sum(b for b, _ in rows.values()) == pytest.approx(bf16_ms, abs=0.05 * len(rows))
    assert sum(q for _, q in rows.values()) == pytest.approx(fp8_ms, abs=0.05 * len(rows))
    assert {k for k, (b, q) in rows.items() if b != q} == {"GEMMs", "quantise", "communication"}


def test_step_cli_writes_the_breakdown_figure(tmp_path, capsys):
    from scaling import cli

    out = tmp_path / "breakdown.png"
    assert cli.main(["plan", "step", "--model", "llama3-70b", "--layers", "8", "--gpu", "h100", "--layout", "tp=8",
                     "--micro-batches", "4", "--precision", "fp8", "--figure", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["figure"] == str(out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5_000


def test_moe_held_out_step_times_after_the_moe_fit():
    """moe_layer_seconds is fitted per generation on Megatron-Bridge's Qwen3 runs of containers 26.04 and later (H100
    FP8, B200 MXFP8); every other MoE run is held out. Held-out runs without a note must be within 10%. On H100 the MoE
    term is what brings them there: priced without it they are all more than 15% fast (the model before the MoE fit
    failed this test). On B200, SimuMax's DeepSeek-V2/V3 runs, it is the grouped expert GEMM priced at its total size
    (priced as one GEMM per local expert they were +31% to +97%). Noted runs (a software regression the source tables
    themselves show, a whole training run, a layout no calibration run shares) are printed with their error and must
    be within 65% either way (the worst, Qwen3-30B in 25.11, is -61%)."""
    checks = [c for c in _checks() if stepvalidate.family_of(c.case) == "MoE"]
    print("\n" + stepvalidate.table(checks))
    fitted = [c for c in checks if c.case["role"] == "calibration"]
    held = [c for c in checks if c.case["role"] == "held-out"]
    assert len(fitted) >= 8 and len(held) >= 20
    for gen in ("h100", "b200"):
        assert {c.case["model"] for c in fitted if stepvalidate.generation(c.case) == gen} == {"qwen3-235b-a22b",
                                                                                                "qwen3-30b-a3b"}
    plain = [c for c in held if not c.case.get("note")]
    assert len(plain) >= 14
    assert all(abs(c.error) <= 0.10 for c in plain), [(c.case["name"], c.error) for c in plain]
    for c in plain:
        if stepvalidate.generation(c.case) == "h100":
            without = replace(stepmodel.EFFICIENCY["h100"], moe_layer_seconds=0.0)
            assert stepvalidate.check(c.case, without).error < -0.15, c.case["name"]
    assert all(abs(c.error) < 0.65 for c in held), [(c.case["name"], c.error) for c in held]


def test_grouped_expert_gemm_is_priced_at_its_total_size():
    """A GPU's local experts run as one grouped GEMM (TE's --moe-grouped-gemm): 16 experts of a tokens x k x n GEMM
    cost what one GEMM of 16x the tokens costs, less than 16 separate GEMMs at the size knee."""
    model = stepmodel.load_model("qwen3-30b-a3b", layers=2)
    layout = stepmodel.parse_step_layout("ep=8,dp=8", micro_batch=1, micro_batches=1)
    c = stepmodel.Ctx(model, stepmodel.GPUS["h100"], layout, stepmodel.RECIPES["fp8"], 4096, stepmodel.EFFICIENCY["h100"])
    ops: list[stepmodel.Op] = []
    stepmodel._gemm(c, ops, "experts", 4096 * 8, 2048, 768, groups=16)
    one = c.gemm_seconds(2.0 * 4096 * 8 * 2048 * 768)
    assert ops[0].seconds == pytest.approx(one, rel=1e-12) and ops[1].seconds == pytest.approx(2 * one, rel=1e-12)
    assert ops[0].seconds < 16 * c.gemm_seconds(2.0 * 4096 * 8 * 2048 * 768 / 16)


def _slowed(case: dict, factor: float = 3.0) -> dict:
    """The case with its measured step `factor` times longer, whichever way its source states it."""
    case = dict(case)
    if "measured_step_ms" in case:
        case["measured_step_ms"] *= factor
    elif "measured_tokens_per_s_per_gpu" in case:
        case["measured_tokens_per_s_per_gpu"] /= factor
    else:
        case["measured_tflops_per_gpu"] /= factor
    return case


@pytest.mark.parametrize("gen", ["h100", "b200"])
def test_moe_fit_never_sees_a_held_out_case(gen):
    """Tripling every held-out MoE run's measured step leaves a generation's refit exactly as it was; tripling the MoE
    calibration runs' moves moe_layer_seconds (so this test can fail) and leaves the four dense constants alone."""
    cases = [c for c in stepvalidate.load_cases() if stepvalidate.generation(c) == gen]

    def moe(c: dict) -> bool:
        return stepvalidate.family_of(c) == "MoE"

    base = stepvalidate.calibrate(cases)
    assert base.moe_layer_seconds > 0
    assert stepvalidate.calibrate([_slowed(c) if moe(c) and c["role"] == "held-out" else c for c in cases]) == base
    control = stepvalidate.calibrate([_slowed(c) if moe(c) and c["role"] == "calibration" else c for c in cases])
    assert control.moe_layer_seconds > 2 * base.moe_layer_seconds
    assert replace(control, moe_layer_seconds=base.moe_layer_seconds) == base


def test_moe_b200_memory_against_simumax_measurements():
    """MoE peak memory against a measurement: SimuMax's real Megatron-LM runs of DeepSeek-V2 and DeepSeek-V3 cut to
    4 layers (the first dense, no MTP) on 8 B200s, EP8 and EP4 + PP2 (torch.cuda.max_memory_allocated, max over
    ranks). All 12 rows within 5% (they are +0.7% to +3.7%: the remaining excess is the layer-backward transient,
    summed with the logits as for dense models); before TE's shape-cached dummy wgrad was modelled for the grouped
    expert GEMM, EP4 + PP2 DeepSeek-V2 was +5.9%."""
    checks = [c for c in _checks() if c.case["gpu"] == "b200" and c.case["model"] in ("deepseek-v2", "deepseek-v3")]
    print("\n" + stepvalidate.table(checks))
    assert len(checks) == 12 and all(c.case["role"] == "held-out" for c in checks)
    assert {c.case["micro_batches"] for c in checks} == {4, 8, 32}
    for c in checks:
        assert c.measured_gib is not None
        assert abs(c.memory_error) <= 0.05, (c.case["name"], c.memory_error)


def test_a_law_optimum_smaller_than_the_dense_recipe_pipeline_is_still_stepped():
    """A fitted law's optimum can be a tiny model at cluster compute (`scaling reproduce --preset quick` put one
    at N = 1e5: 1 layer): the dense recipe's pp 8 cannot hold it, so pp drops to the layers it has (it was
    'at least 32 GPUs' on 1,024 GPUs, which failed the README's first command)."""
    model = stepmodel.gpt_for_params(1e5, 8)
    assert model.layers < stepmodel.parse_step_layout(plan.DENSE_RECIPE.layout).pp // 2
    step = plan.cluster_step(model, "h100", 1024, "bf16", plan.DENSE_RECIPE)
    assert step.layout.pp <= model.layers and step.layout.gpus <= 1024
    point = {"P": 8.0, "N": 1e5, "D": 3.4e24 / 6e5, "loss": 1.0}
    assert all(r.days > 0 for r in plan.plan_optimum(point, [1024, 5000], "h100").runs)


def test_a_second_tensor_core_rate_gets_its_own_gemm_efficiency_from_its_own_runs():
    """A generation's four dense constants come from its main rate's runs (H100: FP8); runs at another rate (BF16)
    fit only that rate's GEMM efficiency, with the four held. Synthetic BF16 runs made to the model at a BF16 GEMM
    efficiency of 0.62 give back 0.62; the FP8 runs' constants do not move; other rates keep `gemm`. (The real
    BF16 runs, DGX Cloud's, are left out here.)"""
    cases = [c for c in stepvalidate.load_cases() if stepvalidate.generation(c) == "h100"
             and stepvalidate.family_of(c) == "dense" and stepvalidate.rate_of(c) == "fp8"]
    base = stepvalidate.calibrate(cases)
    truth = replace(base, gemm_rates=(("bf16", 0.62),))
    twins = []
    for c in cases:
        if c["role"] != "calibration":
            continue
        twin = {k: v for k, v in c.items() if not k.startswith("measured_")}
        twin |= {"name": c["name"] + "_bf16", "precision": "bf16"}
        twin["measured_step_ms"] = stepvalidate.check({**twin, "measured_step_ms": 1.0}, truth).predicted_ms
        twins.append(twin)
    assert {stepvalidate.rate_of(c) for c in twins} == {"bf16"}
    refit = stepvalidate.calibrate(cases + twins)
    assert dict(refit.gemm_rates)["bf16"] == pytest.approx(0.62, rel=0.02)
    assert replace(refit, gemm_rates=()) == base  # the FP8 runs' constants, untouched
    assert refit.gemm_at("fp8") == base.gemm and refit.gemm_at("bf16") != base.gemm


def test_fp8_over_bf16_speedup_on_h100_against_same_table_measurements():
    """"FP8 is k x faster than BF16 on H100" as the step model computes it, against NVIDIA's DGX Cloud Benchmarking
    tables, which ran each model and layout in both precisions on the same stack (NeMo 24.09-25.04.01): the measured
    BF16/FP8 step ratios are 1.31-1.60; the model's are within 10% of each (all but the four 24.12 BF16 runs held out
    of every fit; the model's are 1.35-1.52, -7.6% to +6.5%). Priced with the FP8 runs' GEMM efficiency for BF16 too,
    the model said 1.55-1.80 (+8% to +24%, +15% on average)."""
    cases = {c["name"]: c for c in stepvalidate.load_cases() if c["name"].startswith("dgxc")}
    pairs = [(cases[n], cases[n[:-3] + "bf16"]) for n in cases if n.endswith("_fp8") and n[:-3] + "bf16" in cases]
    assert len(pairs) >= 12
    old = replace(stepmodel.EFFICIENCY["h100"], gemm_rates=())
    before = []
    for fp8, bf16 in pairs:
        measured = bf16["measured_step_ms"] / fp8["measured_step_ms"]
        model = stepvalidate.check(bf16).predicted_ms / stepvalidate.check(fp8).predicted_ms
        assert abs(model / measured - 1) <= 0.10, (fp8["name"], measured, model)
        before.append(stepvalidate.check(bf16, old).predicted_ms / stepvalidate.check(fp8, old).predicted_ms / measured - 1)
    assert np.mean(before) > 0.10 and min(before) > 0  # the one-efficiency model: FP8 always too far ahead


def test_b200_flash_attention_comes_from_kernel_measurements_not_from_the_steps():
    """B200's flash attention is priced from SimuMax's TE kernel timings on the B200 node its calibration runs used
    (step_cases.json attention_kernels): best fraction, MLA's best fraction and the call size at half of it, fitted
    to the 19 kernels and held while the step constants are fitted (the calibration steps, attention ~10% of each,
    fit equally well anywhere from 0.26 to 0.6). Each kernel is within 25% of its fit; slowing every calibration
    step moves the GEMM constants and leaves attention where the kernels put it. The long-context CP runs, where
    attention is ~60% of the step, then come within 10% (with one fitted efficiency, 0.263: +17% to +29%)."""
    rows = stepvalidate.attention_kernels()["b200"]
    assert len(rows) == 19
    fit = stepmodel.Efficiency(gemm=0.5, gemm_half_flops=1e10, bandwidth=0.5, **stepvalidate.kernel_attention(rows))
    for r in rows:
        flops = r["batch"] * r["seq_len"] ** 2 * r["heads"] * (r["qk_head_dim"] + r["v_head_dim"])
        measured = 3.5 / (2 / r["fwd"] + 5 / r["bwd"])  # non-causal factors -> the causal fraction, fwd + 2.5x bwd
        assert fit.attention_at(flops, r["qk_head_dim"] != r["v_head_dim"]) == pytest.approx(measured, rel=0.25), r
    assert fit.attention_at(1e9) < fit.attention_at(1e11) < fit.attention_at(1e13) < fit.attention
    assert fit.mla_attention < fit.attention
    cases = [c for c in stepvalidate.load_cases() if stepvalidate.generation(c) == "b200"]
    base = stepvalidate.calibrate(cases)
    slowed = stepvalidate.calibrate([_slowed(c, 1.3) if c["role"] == "calibration" else c for c in cases])
    for key in ("attention", "mla_attention", "attention_half_flops"):
        assert getattr(base, key) == getattr(fit, key) == getattr(slowed, key), key
    assert slowed.gemm < base.gemm
    long = [c for c in cases if c["seq_len"] == 131072]
    assert len(long) == 3 and all(abs(stepvalidate.check(c).error) <= 0.10 for c in long)


def test_quantised_copies_follow_the_gemm_layouts_the_gpu_takes():
    """Per-tensor FP8 needs a transposed copy for the backward on Hopper (TN-only FP8 GEMMs), none on Blackwell;
    block-scaled recipes (MX, NVFP4, blockwise FP8) quantise each operand along both axes on every GPU. On B200,
    per-tensor FP8's quantise ops move (2 + 1) bytes per element against MXFP8's (2 + 2 x 33/32)."""
    h100, b200 = stepmodel.GPUS["h100"], stepmodel.GPUS["b200"]
    r = stepmodel.RECIPES
    assert (r["fp8"].copies(h100), r["fp8"].copies(b200)) == (2, 1)
    assert all(r[k].copies(b200) == 2 for k in ("fp8-block", "mxfp8", "mxfp6", "mxfp4", "nvfp4"))
    assert r["fp8-block"].copies(h100) == 2
    assert r["tf32"].copies(h100) == 1
    model = stepmodel.load_model("llama3-8b", layers=2)
    layout = stepmodel.parse_step_layout("dp=8", micro_batch=1, micro_batches=1)
    fp8, mx = (stepmodel.step(model, "b200", layout, p, 4096).by_op["quantise"] for p in ("fp8", "mxfp8"))
    assert mx / fp8 == pytest.approx((2 + 2 * 33 / 32) / 3, rel=1e-9)
