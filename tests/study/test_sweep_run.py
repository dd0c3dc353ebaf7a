"""The sweep end to end on the smoke grid: both executors, re-runs, crash safety, bad input."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from scaling.study.sweeps import results, sweep, takeoff

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "experiments" / "smoke_sweep.toml"
pytestmark = pytest.mark.slow


def scaling_cli(*args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "scaling.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, env=env, **kw)


def sweep_here(capsys, *args):
    """`scaling sweep ...` in this process: the same main as the command's, without a process that
    imports JAX and pandas again (~2 s of CPU a call). With --workers 0 its runs train here too."""
    from scaling import cli

    args = ["sweep", *map(str, args)]
    capsys.readouterr()
    returncode = cli.main(args)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, returncode, out, err)


def dry_run(capsys, *args):
    """`scaling sweep ... --dry-run` in this process (it trains and writes nothing)."""
    return sweep_here(capsys, *args, "--dry-run")


@pytest.fixture(scope="module")
def smoke_results(once_per_run):
    """The smoke sweep, swept once per pytest run (its tests read it; each xdist worker they land on used
    to sweep it again)."""
    def sweep_it(out):
        proc = scaling_cli("sweep", SMOKE, "--out", out, "--no-progress")
        return {"args": proc.args, "returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}

    out, made = once_per_run("smoke-sweep", sweep_it)
    proc = subprocess.CompletedProcess(**made)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc


def test_local_sweep_lands_every_run_and_budget(smoke_results):
    out, proc = smoke_results
    df = results.load(out / "smoke_sweep")
    specs = sweep.expand(SMOKE)
    assert len(specs) == 3 and set(df.run_id) == {s.run_id for s in specs}
    assert len(df) == 3 * 2  # two WSD budgets per run
    assert (df.status == "ok").all() and df.val_loss.notna().all()
    assert sorted(df.P.unique()) == [4, 8, 32]
    assert "take-off: 3 shapes" in proc.stdout and "ok 3" in proc.stdout
    report = json.loads((out / "smoke_sweep" / "sweep.json").read_text())
    assert report["counts"]["ok"] == 3


def test_take_off_in_two_lanes_flies_every_shape_and_a_lane_that_dies_fails_its_probes(tmp_path):
    # three model sizes at fp32: three shapes whose steps trace in a fraction of fp8's and fp4's time
    experiment = tmp_path / "shapes.toml"
    experiment.write_text(SMOKE.read_text().replace('precision = ["fp32", "fp8", "fp4"]', '"model.size" = [1, 2, 3]'))
    specs = sweep.expand(experiment)
    cleared, flights = takeoff.take_off(specs, tmp_path, lanes=2)  # this process flies 2 shapes, a child 1
    assert cleared == specs and len(flights) == 3
    assert set(flights) == {sweep.shape_key(s.config) for s in specs} and len({f["N"] for f in flights.values()}) == 3
    assert not list((tmp_path / ".takeoff").glob("lane-*"))  # a lane that landed leaves no files
    # a lane killed at its time limit: each of its probes is a failure naming the exit and the log
    probe = takeoff._takeoff_spec(specs[0])
    (out,) = takeoff._fly_in_child({"key": probe}, tmp_path / "killed", hang_timeout=0.01)().values()
    assert out["status"] == "failed" and "exited with code -9" in out["reason"]
    assert Path(re.search(r"log: (\S+)\)", out["reason"]).group(1)).is_file()


def test_second_run_skips_finished_runs(smoke_results, capsys):
    out, _ = smoke_results
    before = {p: p.stat().st_mtime_ns for p in (out / "smoke_sweep").glob("*/summary.json")}
    proc = sweep_here(capsys, SMOKE, "--out", out, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "3 landed, 0 to run" in proc.stdout
    assert {p: p.stat().st_mtime_ns for p in (out / "smoke_sweep").glob("*/summary.json")} == before


def test_ray_executor_on_a_local_ray_instance(tmp_path, smoke_results):
    # one point of the smoke grid, the same run id as there: fp32, whose step traces quickest (fp8's took
    # ~2 s of CPU in the take-off probe and again in the run)
    experiment = tmp_path / "one.toml"
    experiment.write_text(SMOKE.read_text().replace('precision = ["fp32", "fp8", "fp4"]', 'precision = ["fp32"]'))
    proc = scaling_cli("sweep", experiment, "--out", tmp_path, "--executor", "ray", "--no-progress")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    df = results.load(tmp_path / "smoke_sweep")
    assert len(df) == 2 and (df.status == "ok").all()
    local = results.load(smoke_results[0] / "smoke_sweep").set_index(["run_id", "D"]).sort_index().loc[df.run_id.iloc[0]]
    ray_df = df.set_index(["run_id", "D"]).sort_index().loc[df.run_id.iloc[0]]
    # same configs, same seeds: the executor must not change a single loss
    assert (ray_df.val_loss == local.val_loss).all()


def test_sigkill_mid_sweep_then_rerun_resumes(tmp_path, capsys):
    experiment = tmp_path / "long.toml"  # two seeds at fp32: one take-off probe, and steps that trace quickest
    experiment.write_text(SMOKE.read_text().replace("tokens = 10_240", "tokens = 40_960")
                          .replace("checkpoint_every = 10", "checkpoint_every = 20")
                          .replace('precision = ["fp32", "fp8", "fp4"]', "seed = [0, 1]").replace("seed = 0\n", ""))
    cmd = [sys.executable, "-m", "scaling.cli", "sweep", experiment, "--out", tmp_path / "out", "--no-progress"]
    proc = subprocess.Popen(list(map(str, cmd)), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sweep_dir = tmp_path / "out" / "smoke_sweep"
    deadline = time.time() + 240
    # wait until one run has landed and another holds a checkpoint, then kill -9 the sweep
    while time.time() < deadline:
        landed = [p for p in sweep_dir.glob("*/summary.json")]
        checkpointed = [p for p in sweep_dir.glob("*/checkpoints/*")  # finalised: orbax renames "20.orbax-...-tmp" to "20"
                        if p.name.isdigit() and not (p.parents[1] / "summary.json").exists()]
        if landed and checkpointed:
            break
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("sweep never reached a landed run plus a checkpointed one")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    interrupted = checkpointed[0].parents[1]
    landed_before = {p.parent: p.read_text() for p in landed}
    time.sleep(1.0)  # the orphaned child (if any) would keep writing: it must be dead
    size = (interrupted / "metrics.jsonl").stat().st_size
    time.sleep(1.0)
    assert (interrupted / "metrics.jsonl").stat().st_size == size, "run kept going after its sweep died"

    rerun = sweep_here(capsys, experiment, "--out", tmp_path / "out", "--no-progress", "--workers", "0")  # trains here
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    for run_dir, text in landed_before.items():
        assert (run_dir / "summary.json").read_text() == text  # finished runs are not re-run
    events = [json.loads(line).get("event") for line in (interrupted / "metrics.jsonl").read_text().splitlines()]
    assert "resumed" in events
    df = results.load(sweep_dir)
    assert len(df) == 4 and not df.duplicated(["run_id", "D"]).any() and (df.status == "ok").all()


def test_two_sweeps_at_once_train_each_run_once(tmp_path):
    """Two researchers start the same sweep into the same --out: each run (and take-off probe) is
    trained by one of them, once; both wait for the other's runs, so both exit 0 with all landed."""
    # three shapes at fp32 (three probes and three runs to share out, as the smoke grid's three recipes,
    # whose fp8 and fp4 steps take ~2 s of CPU each to trace, in each probe and each run)
    experiment = tmp_path / "shapes.toml"
    experiment.write_text(SMOKE.read_text().replace('precision = ["fp32", "fp8", "fp4"]', '"model.size" = [1, 2, 3]'))
    quick = ["--set", "train.tokens=2560", "--set", "train.checkpoint_every=5", "--set", "data.eval_tokens=512"]
    cmd = [sys.executable, "-m", "scaling.cli", "sweep", experiment, "--out", tmp_path, "--no-progress", *quick]
    procs = [subprocess.Popen(list(map(str, cmd)), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=400)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n---\n".join(outputs)
    df = results.load(tmp_path / "smoke_sweep")
    assert len(df) == 3 * 2 and not df.duplicated(["run_id", "D"]).any() and (df.status == "ok").all()
    for run_dir in [*(tmp_path / "smoke_sweep").iterdir(), *(tmp_path / ".takeoff" / "smoke_sweep").iterdir()]:
        if not run_dir.is_dir():
            continue
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        first_steps = [r for r in records if r.get("phase") == "trunk" and r["step"] == 1]
        assert len(first_steps) == 1 and not any(r.get("event") == "resumed" for r in records), run_dir
        assert json.loads((run_dir / "summary.json").read_text())["attempts"] == 1
    # each run counted `ok` by the sweep that trained it, and by that one only
    trained = [int(re.search(r"landed: ok (\d+)", out).group(1)) for out in outputs]
    assert sum(trained) == 3, outputs


def test_hung_and_crashed_runs_land_with_failure_records(tmp_path):
    spec = sweep.expand(SMOKE)[0]
    assert sweep.execute(spec, tmp_path, hang_timeout=0.5, poll_s=0.1) == "hung"
    failure = json.loads((spec.out_dir(tmp_path) / "failure.json").read_text())
    assert failure["status"] == "hung" and "no progress" in failure["reason"]
    assert results.load(tmp_path).status.tolist() == ["hung"]

    corpus = tmp_path / "corpus.txt"  # valid when the sweep expands, gone when the run starts
    corpus.write_text("def f(x):\n    return x\n" * 2000)
    broken = spec.config.replace(**{"data.source": str(corpus)})
    broken = sweep.RunSpec(run_id=broken.run_id, sweep="s", config=broken)
    corpus.unlink()
    assert sweep.execute(broken, tmp_path, hang_timeout=120) == "failed"
    failure = json.loads((broken.out_dir(tmp_path) / "failure.json").read_text())
    assert "data.source" in failure["traceback"] and failure["status"] == "failed"


@pytest.mark.parametrize("args, key", [
    (["--set", "train.lr=-1"], "train.lr"),
    (["--set", "seed=-1"], "seed"),
    (["--set", "data.source=/no/such/corpus"], "data.source"),
    (["--set", "model.size=0"], "model.size"),
    (["--workers", "-1"], "--workers"),
    (["--gpus-per-run", "1"], "--gpus-per-run"),  # no GPU visible (CUDA_VISIBLE_DEVICES="" below)
    (["--gpus-per-run", "0.5"], "--gpus-per-run"),  # local: whole GPUs only
    (["--gpus-per-run", "2.5", "--executor", "ray"], "--gpus-per-run"),  # a fraction above 1
    (["--pack", "0"], "--pack"),
    (["--pack", "2", "--executor", "ray"], "--pack"),  # packs train in the local executor's children
    (["--pack", "2", "--workers", "0"], "--pack"),
])
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, capsys, monkeypatch, args, key):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    proc = sweep_here(capsys, SMOKE, "--out", tmp_path / "out", *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {key}") and "allowed" in lines[0]
    assert not (tmp_path / "out").exists()


def test_runs_of_one_shape_train_packed_in_one_child_where_the_probe_clears_them(tmp_path, capsys):
    """Seeds 0-2 of one fp32 run with --pack 2, XLA:CPU's YNNPACK fusions off (there a packed step is
    its single steps bit for bit, tests/train/test_packed.py): one pack of two and one run alone. (fp32:
    its steps trace in a fraction of fp8's time, in the take-off probe, the packing probe and each child.)"""
    experiment = tmp_path / "seeds.toml"
    experiment.write_text(SMOKE.read_text().replace('precision = ["fp32", "fp8", "fp4"]', "seed = [0, 1, 2]")
                          .replace("seed = 0\n", ""))
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_cpu_experimental_ynn_fusion_type="}
    plan = dry_run(capsys, experiment, "--out", tmp_path / "out", "--pack", "2")
    assert "--pack 2: 2 of 3 runs in 1 pack (sizes 2)" in plan.stdout, plan.stdout + plan.stderr
    proc = scaling_cli("sweep", experiment, "--out", tmp_path / "out", "--pack", "2", "--no-progress", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "packing probed for 1 group of runs" in proc.stdout and "not packing" not in proc.stdout
    summaries = [json.loads((spec.out_dir(tmp_path / "out") / "summary.json").read_text())
                 for spec in sweep.expand(experiment)]
    assert [s["status"] for s in summaries] == ["ok"] * 3
    assert [s.get("packed_with") for s in summaries] == [[summaries[1]["run_id"]], [summaries[0]["run_id"]], None]


def test_bad_grid_value_names_the_grid_point(tmp_path, capsys):
    experiment = tmp_path / "bad.toml"
    experiment.write_text(SMOKE.read_text().replace('precision = ["fp32", "fp8", "fp4"]',
                                                    'precision = ["fp32", "fp8"]\n"train.lr" = [0.01, -2]'))
    proc = dry_run(capsys, experiment, "--out", tmp_path / "out")
    assert proc.returncode == 2
    assert "train.lr: got -2" in proc.stderr and "grid point" in proc.stderr
    assert not (tmp_path / "out").exists()


REPRO = """
name = "repro"
precision = "fp32"
[model]
seq_len = 32
[data]
source = "synthetic"
fingerprint = "7122be2c143c"  # the synthetic chain's: a pinned study reproduces
eval_tokens = 1024
[train]
batch_size = 8
lr = 1e-2
warmup = 2
log_every = 5
checkpoint_every = 0
[grid]
precision = ["fp32", "fp8"]
[isoflop]
budgets = [4e9, 8e9]  # 203, 48 and 25 steps at the larger: what is reused is the test, not the losses
sizes = [1, 2, 3]
sizes_per_budget = 3
min_steps = 3
reference = "fp32"
"""


def test_reproduce_runs_an_isoflop_study_reuses_landed_runs_and_reports_only_the_presets_own(tmp_path, monkeypatch, capsys):
    import shutil

    import pandas as pd

    from scaling.study import reproduce

    # a tiny IsoFLOP design: 2 recipes x 3 sizes x 2 budgets, FP32 also at FP8's steps
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "repro.toml").write_text(REPRO)
    monkeypatch.setattr(reproduce, "EXPERIMENTS", experiments)
    monkeypatch.setitem(reproduce.STUDY_PRESETS, "repro", ["repro.toml"])
    monkeypatch.setitem(reproduce.CANDIDATES, "repro", ("chinchilla", "kumar"))  # two laws keep the test quick
    # and 64 starts a fit, not chinchilla's 4500 (the fits are tests/study/test_fit.py's; here they are
    # made, chosen among, written and reused): 16 s of CPU -> 4
    from scaling.study.analysis import fit
    grid = fit._grid
    monkeypatch.setattr(fit, "_grid", lambda problem, init: (lambda g: g[::-(-len(g) // 64)])(grid(problem, init)))
    out = tmp_path / "study"
    with monkeypatch.context() as first:  # this report's figures are drawn by the second one, from the same runs
        from scaling.study.report import plots

        first.setattr(plots, "make_figures", lambda *args, **kwargs: [])
        # the runs train in this process (--workers 0): not what is tested here, and a child process
        # per run would import JAX and trace its step again
        reproduce.reproduce("repro", out, bootstrap=4, progress=False, echo=print, workers=0)
    assert "repro: 6 runs, 0 already landed" in capsys.readouterr().out

    # a run an older grid left in the same sweep folder: not part of the preset, so not of the study
    first = next(p for p in (out / "runs" / "repro").iterdir() if (p / "summary.json").is_file())
    stale = out / "runs" / "repro" / "0123456789ab"
    shutil.copytree(first, stale)
    summary = json.loads((stale / "summary.json").read_text())
    (stale / "summary.json").write_text(json.dumps({**summary, "run_id": stale.name}))
    landed = {p: p.stat().st_mtime_ns for p in (out / "runs" / "repro").glob("*/summary.json") if p.parent != stale}

    # a held-out budget's prediction committed beside the results: the report shows it
    recipe = lambda r, loss: {"recipe": r, "loss": loss, "loss_pi": [loss - 0.1, loss + 0.1], "N_opt": 3e4,
                              "N_pi": [2e4, 4e4], "p_best": 0.5}
    (out / "results" / "repro_prediction.json").write_text(json.dumps({
        "budget": 2.4e10, "level": 0.95, "fitted_on": {"budgets": [4e9, 8e9], "runs": 6}, "laws": [{"name": "kumar"}],
        "draws": 8, "sigma_measurement": 0.01, "sigma_lack_of_fit": 0.0, "reason": "cannot tell: stand-in",
        "recipes": [recipe("fp32", 3.1), recipe("fp8", 3.2)]}))

    fitted_at = (out / "fits" / "repro.json").stat().st_mtime_ns
    report = reproduce.reproduce("repro", out, bootstrap=4, progress=False, echo=print, workers=0)
    echoed = capsys.readouterr().out
    assert "repro: 6 runs, 6 already landed" in echoed  # nothing retrained
    assert "reused from fits/repro.json (made from the same 18 rows" in echoed  # nor refitted
    assert (out / "fits" / "repro.json").stat().st_mtime_ns == fitted_at
    assert "## A budget predicted before it was trained" in report.read_text()
    assert {p: p.stat().st_mtime_ns for p in landed} == landed
    table = pd.read_csv(out / "results" / "repro.csv")
    assert set(table["run_id"]) == {s.run_id for s in sweep.expand(experiments / "repro.toml")}
    assert set(pd.read_parquet(out / "results" / "repro_curves.parquet")["run_id"]) == set(table["run_id"])
    # every recipe at both budgets, 3 sizes each; FP32's extra evaluations carry no budget
    labelled = table[table["budget"].notna()]
    assert labelled.groupby(["budget", "recipe"])["N"].nunique().tolist() == [3] * 4
    fitted = json.loads((out / "fits" / "repro.json").read_text())
    assert fitted["selection"]["chosen"] == fitted["law"] and fitted["data"]["n_points"] == len(table)
    assert {c["name"] for c in fitted["selection"]["candidates"]} == {"chinchilla", "kumar"}
    assert fitted["data"]["unquantised_share"]["N"] == sorted(set(table["N"]))  # what optimal costs hypothetical models by
    findings = json.loads((out / "paper_figures" / "findings.json").read_text())
    assert [b["budget"] for b in findings["budgets"]] == [4e9, 8e9]
    assert all(len(b["recipes"]) == 2 for b in findings["budgets"])
    assert report == out / "paper_figures" / "REPORT.md" and "## IsoFLOP profiles under the `" in report.read_text()


def test_reproduce_reuses_a_fit_only_when_made_from_the_same_rows_candidates_bootstrap_and_code(tmp_path, monkeypatch):
    from test_plots import fake_fit

    from scaling.study import reproduce

    package = tmp_path / "package"
    package.mkdir()
    (package / "laws.py").write_text("A = 1\n")
    monkeypatch.setattr(reproduce, "PACKAGE", package)
    rows = pd.DataFrame({"run_id": ["b", "a", "a"], "D": [2e6, 1e6, 2e6], "N": [1e5, 2e5, 2e5], "val_loss": [2.5, 2.7, 2.6]})
    made = reproduce.made_from(rows, ("chinchilla", "kumar"), 100)
    assert made == reproduce.made_from(rows.iloc[::-1], ("chinchilla", "kumar"), 100)  # the rows, not their order
    assert made["rows"] == 3 and made["candidates"] == ["chinchilla", "kumar"]
    path = tmp_path / "fits" / "x.json"
    law = fake_fit(5.0, n_samples=0)
    law.data["made_from"] = made
    law.to_json(path)
    assert reproduce.reusable_fit(path, made).params == law.params
    changed = [reproduce.made_from(rows.assign(val_loss=[2.5, 2.7, 2.6000001]), ("chinchilla", "kumar"), 100),
               reproduce.made_from(rows, None, 100), reproduce.made_from(rows, ("chinchilla", "kumar"), 4)]
    (package / "laws.py").write_text("A = 2\n")
    changed.append(reproduce.made_from(rows, ("chinchilla", "kumar"), 100))
    assert all(reproduce.reusable_fit(path, c) is None for c in changed)
    assert reproduce.reusable_fit(tmp_path / "fits" / "none.json", made) is None
    path.write_text("{not json")
    assert reproduce.reusable_fit(path, made) is None


def test_the_sweep_keeps_a_summary_and_a_machine_without_the_run_directories_reuses_it(smoke_results, tmp_path, capsys):
    out, _ = smoke_results
    specs = sweep.expand(SMOKE)
    summary = pd.read_csv(out / "smoke_sweep.csv")
    assert set(summary.run_id) == {s.run_id for s in specs} and len(summary) == 3 * 2
    assert set(pd.read_parquet(out / "smoke_sweep_curves.parquet").run_id) == set(summary.run_id)
    # another machine: the committed summary, no run directories, one run's rows missing
    fresh, dropped = tmp_path / "results", specs[0].run_id  # fp32: its step traces quickest
    fresh.mkdir()
    summary[summary.run_id != dropped].to_csv(fresh / "smoke_sweep.csv", index=False)
    proc = dry_run(capsys, SMOKE, "--out", fresh)
    assert proc.returncode == 0 and "2 landed, 1 to run" in proc.stdout, proc.stdout + proc.stderr
    proc = sweep_here(capsys, SMOKE, "--out", fresh, "--no-progress", "--workers", "0")  # its run trains here
    assert proc.returncode == 0 and "ok 1" in proc.stdout, proc.stdout + proc.stderr
    assert [p.name for p in (fresh / "smoke_sweep").iterdir() if p.is_dir()] == [dropped]  # only it trained
    after = pd.read_csv(fresh / "smoke_sweep.csv")
    assert len(after) == 3 * 2 and set(after.run_id) == set(summary.run_id)
    kept = summary[summary.run_id != dropped].set_index(["run_id", "D"]).sort_index()
    again = after[after.run_id != dropped].set_index(["run_id", "D"]).sort_index()
    assert (again["val_loss"] == kept["val_loss"]).all()  # the committed rows as they were
    assert set(pd.read_parquet(fresh / "smoke_sweep_curves.parquet").run_id) == {dropped}


def test_a_pinned_corpus_retrains_runs_landed_on_other_data_and_stops_on_the_wrong_one(smoke_results, tmp_path, capsys):
    out, _ = smoke_results
    specs = sweep.expand(SMOKE)
    summary = pd.read_csv(out / "smoke_sweep.csv")
    real = summary["corpus"].iloc[0].split(" ")[1]  # synthetic's first 12 hex digits
    fresh, moved = tmp_path / "results", specs[0].run_id  # fp32: its step traces quickest
    fresh.mkdir()
    # one run's rows say it trained on other data (another venv's pysrc, say)
    summary.loc[summary.run_id == moved, "corpus"] = "pysrc 0123456789ab"
    summary.to_csv(fresh / "smoke_sweep.csv", index=False)
    unpinned = dry_run(capsys, SMOKE, "--out", fresh)
    assert "3 landed, 0 to run" in unpinned.stdout, unpinned.stdout + unpinned.stderr
    pinned = ["--set", f"data.fingerprint={real}"]
    proc = dry_run(capsys, SMOKE, "--out", fresh, *pinned)
    assert proc.returncode == 0 and "2 landed, 1 to run" in proc.stdout, proc.stdout + proc.stderr
    assert "1 of these runs trained on another corpus (pysrc 0123456789ab)" in proc.stdout
    assert specs[0].run_id == sweep.expand(SMOKE, [f"data.fingerprint={real}"])[0].run_id  # the pin is no part of the run id
    # the wrong corpus here: a dry run says so, a sweep stops before it writes anything
    wrong = ["--set", "data.fingerprint=" + "f" * 12]
    proc = dry_run(capsys, SMOKE, "--out", fresh, *wrong)
    assert proc.returncode == 0 and "warning: training here would stop: data.fingerprint" in proc.stdout
    proc = sweep_here(capsys, SMOKE, "--out", fresh, *wrong, "--no-progress")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
    assert f"resolves to here, {real}" in proc.stderr and not (fresh / "smoke_sweep").exists()
    # the right one: only the run on other data trains again, and its rows are replaced
    proc = sweep_here(capsys, SMOKE, "--out", fresh, *pinned, "--no-progress", "--workers", "0")  # its run trains here
    assert proc.returncode == 0 and "ok 1" in proc.stdout, proc.stdout + proc.stderr
    assert [p.name for p in (fresh / "smoke_sweep").iterdir() if p.is_dir()] == [moved]
    after = pd.read_csv(fresh / "smoke_sweep.csv")
    assert set(after["corpus"].str.split(" ").str[1]) == {real} and len(after) == 3 * 2
