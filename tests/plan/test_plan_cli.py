"""`scaling plan`, `scaling plan step` (scaling.cli.plan, scaling.cli.plan_step): output, errors, JSON, no JAX."""

import json
import re
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from scaling.plan import cluster, efficiency, hardware, runplan, shapes, stepmodel


def _cli(*argv):
    return subprocess.run([sys.executable, "-m", "scaling.cli", "plan", *argv], capture_output=True, text=True)


def test_cli_prints_the_talk_table_from_the_step_model(talk_days):
    proc = _cli("--flops", "3.4e24", "--model", "deepseek-v3", "--gpus", "1024", "5000", "10000")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip().split(" ")[0].replace(",", "").isdigit()]
    days = {int(r[0].replace(",", "")): float(r[2]) for r in rows}
    assert days == pytest.approx({k: d for k, (d, _) in talk_days("DeepSeek-V3").items()}, rel=1e-3)
    assert "989" in proc.stdout and "tp2 pp8 vpp4 dp64 ep64" in proc.stdout
    fixed = _cli("--flops", "3.4e24", "--mfu", "0.4", "--gpus", "1024")
    assert fixed.returncode == 0 and float(fixed.stdout.splitlines()[3].split()[2]) == pytest.approx(97.15, abs=0.02)


def test_cli_memory_of_a_parameter_count_under_zero_3():
    proc = _cli("step", "--model", "7e9", "--layout", "dp=8,zero=3", "--recompute", "full", "--json")
    assert proc.returncode == 0, proc.stderr
    gib = json.loads(proc.stdout)["memory_breakdown_gib"]
    params = shapes.gpt_for_params(7e9).params  # 7.3e9 with the 32K vocabulary in and out
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
    from scaling.study.analysis import fit

    path = tmp_path / "kumar.json"
    fit.FitResult(law="kumar", params=KUMAR_PARAMS, objective=0.0, residuals=np.array([])).to_json(path)
    return path


def test_cli_plans_the_compute_optimum_of_a_fitted_law(kumar_fit_json, capsys):
    from scaling import cli
    from scaling.study.analysis import fit
    from scaling.study.analysis.pstar import optimal

    best = optimal.optimal_precision(fit.FitResult.from_json(kumar_fit_json), compute=1e22)
    assert best["P"] == pytest.approx(2.5 * 1.904, abs=0.01)
    flops = 6 * best["N"] * best["D"]  # hardware FLOPs; optimal's compute counts P/16 of them
    # 4.76 bits need a 6-bit format (FP4 is too narrow): FP6 where the chip has it (B200/B300 at the FP8
    # rate, MI355X at the FP4 rate), else FP8; the A100 has none below BF16; MI355X has no TF32
    for gpu, fmt, p4_fmt, p32_fmt in (("b200", "fp6", "fp4", "tf32"), ("h100", "fp8", "fp8", "tf32"),
                                      ("a100", "bf16", "bf16", "tf32"), ("b300", "fp6", "fp4", "tf32"),
                                      ("mi300x", "fp8", "fp8", "tf32"), ("mi355x", "fp6", "fp4", "fp32")):
        argv = ["plan", "--fit", str(kumar_fit_json), "--compute", "1e22", "--gpus", "1024", "--gpu", gpu,
                "--layout", "tp=8,zero=1"]
        assert cli.main(argv) == 0
        out = capsys.readouterr().out
        assert f"optimum P={best['P']:.3g} bits -> {fmt}" in out
        optimum_row = out.split("optimum P=")[1].splitlines()[3].split()
        # the optimum's dense shape stepped on 1,024 GPUs with --layout's tp and pp
        recipe = replace(cluster.DENSE_RECIPE, layout="tp=8,pp=1,ogr=1,opg=1,tpo=1")
        step = cluster.cluster_step(shapes.gpt_for_params(best["N"], 8), gpu, 1024,
                                    efficiency.recipe_for_format(fmt, hardware.get_gpu(gpu)), recipe)
        assert float(optimum_row[2]) == pytest.approx(flops / (step.model_flops / step.step_seconds) / 86_400, rel=1e-3)
        assert float(optimum_row[1]) == pytest.approx(runplan.step_mfu(step, 1024), abs=1e-3)
        assert float(optimum_row[13]) == pytest.approx(step.memory.total / 2**30, abs=0.05)  # GiB/GPU of that step
        assert optimum_row[14:16] == ["tp8", "pp1"]
        rows = {float(line.split()[0]): line.split() for line in out.split("days@1024")[1].split("\n\n")[0].strip().splitlines()}
        assert sorted(rows) == [4, 6, 8, 16, 32]
        assert (rows[4][1], rows[16][1], rows[32][1]) == (p4_fmt, "bf16", p32_fmt)
        p4 = best["per_precision"].set_index("P").loc[4]
        p4_plan = cluster.plan_optimum({"P": 4, "N": p4["N"], "D": p4["D"], "loss": p4["loss"]}, [1024], gpu, recipe=recipe)
        assert float(rows[4][6]) == pytest.approx(p4_plan.runs[0].days, rel=1e-2)


@pytest.mark.slow
def test_cli_target_loss_finds_the_compute_that_reaches_it(kumar_fit_json, capsys):
    from scaling import cli
    from scaling.study.analysis import fit
    from scaling.study.analysis.pstar import optimal

    assert cli.main(["plan", "--fit", str(kumar_fit_json), "--target-loss", "2.3", "--gpus", "1024"]) == 0
    compute = float(capsys.readouterr().out.split("compute ")[1].split()[0])
    fit_result = fit.FitResult.from_json(kumar_fit_json)
    assert optimal.optimal_precision(fit_result, compute=compute)["loss"] == pytest.approx(2.3, abs=2e-3)
    assert optimal.optimal_precision(fit_result, compute=compute / 1.05)["loss"] > 2.3
    assert cli.main(["plan", "--fit", str(kumar_fit_json), "--target-loss", "1.5"]) == 2  # below E = 1.7
    assert capsys.readouterr().err.startswith("error: target-loss:")
    assert cli.main(["plan", "--fit", str(kumar_fit_json.parent / "missing.json"), "--compute", "1e22"]) == 2
    assert capsys.readouterr().err.startswith("error: fit:")


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


def test_step_cli_search_and_tokens(capsys):
    from scaling import cli

    cli.main(["plan", "step", "--model", "llama3-8b", "--layers", "4", "--gpu", "h100", "--gpus", "8", "--search",
              "--global-batch", "16", "--seq-len", "2048", "--tokens", "1e9", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert d["layout"]["gpus"] == 8 and d["fits"] and d["fitting_layouts"] > 10
    assert d["run"]["days"] == pytest.approx(1e9 / d["tokens_per_s"] / 86_400)
    assert cli.main(["plan", "step", "--search", "--gpus", "8"]) == 2
    assert capsys.readouterr().err.startswith("error: search:")


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


def test_cli_refuses_a_degenerate_fit_with_one_line(tmp_path, capsys):
    from scaling import cli
    from scaling.study.analysis import fit

    path = tmp_path / "degenerate.json"
    fit.FitResult(law="kumar", params=dict(KUMAR_PARAMS, alpha=-0.0097), objective=0.0, residuals=np.array([]),
                  degenerate="exponent alpha = -0.0097 <= 0 (the loss does not fall with scale)").to_json(path)
    assert cli.main(["plan", "--fit", str(path), "--compute", "1e22", "--gpus", "1024"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"error: --fit {path}: got 'kumar fit, degenerate: exponent alpha = -0.0097 <= 0")
    assert captured.err.count("\n") == 1
