"""One run across devices (scaling.train.parallel): data parallel and FSDP on 8 CPU devices, a run
resumed on the 4 devices left, and a two-process jax.distributed run on localhost.

XLA_FLAGS must be set before JAX starts its backends, so every check runs in a fresh interpreter
(`--xla_force_host_platform_device_count=N`) and reports JSON on its last line."""

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scaling._io import read_jsonl

pytestmark = pytest.mark.slow  # its tests spawn processes that train, or train several models

ROOT = Path(__file__).resolve().parents[2]
# float32 summation order (partial sums per device, then an all-reduce): a loss of ~5 agrees to ~1e-6
# after a step; over a dozen AdamW steps the differences compound to ~1e-5. Quantisation with a
# per-device scale, or a batch row placed twice, moves a loss by 1e-3 and more.
LOSS_TOL = 1e-4


def python(code: str, devices: int, env: dict | None = None, timeout: int = 900) -> dict:
    """Run `code` in a fresh interpreter with `devices` CPU devices; the JSON its last line prints."""
    full_env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
                "JAX_PLATFORMS": "cpu", **(env or {})}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def tiny_toml(path: Path, **train) -> Path:
    """A size-1 model on the synthetic chain: 12 steps of 8 sequences of 16 tokens, every loss logged."""
    extra = "".join(f"{k} = {v}\n" for k, v in train.items())
    path.write_text(textwrap.dedent("""\
        name = "par"
        precision = "fp32"
        [model]
        size = 1
        seq_len = 16
        [data]
        source = "synthetic"
        eval_tokens = 256
        [train]
        tokens = 1536
        batch_size = 8
        lr = 0.01
        schedule = "cosine"
        log_every = 1
        """) + extra)
    return path


def step_losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if "loss" in r}


# ---------------------------------------------------------------- the layout


def test_layout_shards_the_batch_and_under_fsdp_the_state():
    out = python("""
        import json, jax
        from scaling.train import parallel
        from scaling.errors import ConfigError
        assert parallel.layout_for(1, False, 8) is None  # one device: the unchanged single-device path
        dp, fsdp = parallel.layout_for(8, False, 32), parallel.layout_for(8, True, 32)
        half = parallel.layout_for(4, True, 32)  # fewer replicas than devices: the first 4
        lost = parallel.layout_for(8, False, 32, devices=jax.devices()[:4], fewer=True)  # a resume
        refusals = []
        for fewer in (True, False):  # a resume on devices that do not split the batch; a fresh run on fewer
            try:
                parallel.layout_for(8, False, 8, devices=jax.devices()[:3], fewer=fewer)
            except ConfigError as e:
                refusals.append(str(e))
        refused, fresh = refusals
        specs = lambda l: {str(s): str(l.sharding(s).spec) for s in [(256, 32), (2, 32, 96), (2, 32), (7, 9), (48, 36)]}
        print(json.dumps({"dp": specs(dp), "fsdp": specs(fsdp), "half": [half.devices, half.describe()["devices"]],
                          "lost": [lost.devices, lost.replicas, lost.dropped], "refused": refused, "fresh": fresh,
                          "batch": str(dp.put_batch(__import__("numpy").zeros((32, 17), "int32")).sharding.spec)}))
    """, devices=8)
    assert set(out["dp"].values()) == {"P()"}  # data parallel: every array replicated
    assert out["fsdp"] == {"(256, 32)": "P('data', None)",  # the largest axis 8 divides
                           "(2, 32, 96)": "P(None, None, 'data')",  # a layer stack: not its layer axis
                           "(2, 32)": "P()",  # small: replicated
                           "(7, 9)": "P()",  # 8 divides no axis
                           "(48, 36)": "P('data', None)"}  # 8 divides 48, not 36
    assert out["batch"] == "P('data',)"
    assert out["half"] == [4, ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]]
    assert out["lost"][:2] == [4, 8]
    assert "4 dropped" in out["lost"][2] and "8 replicas on 4 devices (8 rows each)" in out["lost"][2]
    assert out["refused"] == ("parallel.data: got 8; allowed: 3 devices are left, which do not split "
                              "train.batch_size = 8 evenly: set parallel.data to one of [1, 2] (the run id stays)")
    assert out["fresh"] == ("parallel.data: got 8; allowed: at most the 3 devices visible here for a run that starts "
                            "fresh (only a run resuming from its checkpoint trains on fewer: the devices left)")


# ---------------------------------------------------------------- the same computation on 1 and 8 devices


def test_sharded_steps_agree_with_one_device_and_fsdp_divides_the_state():
    """FP8 with per-tensor current scaling of every role. The activation and gradient amax span the
    batch, so on 8 devices they must be all-reduced: a quantised GEMM whose rows lie on 8 devices, at
    a different magnitude on each, gives the one-device output and gradients to float32 noise, far
    from what quantising each device's rows with its own amax gives (the contrast shows the check can
    fail). Two train steps of the model agree with one device, with the same per-role amax telemetry;
    FSDP's compiled step takes a fraction of data parallel's argument bytes per device."""
    out = python("""
        import json, jax, jax.numpy as jnp, numpy as np
        from flax import nnx
        from scaling.numerics import layers
        from scaling.train import config, data, parallel, step as step_lib
        dp_layout = parallel.layout_for(8, False, 8)
        rng = np.random.default_rng(0)
        x = (rng.normal(size=(64, 32)) * 1.7 ** np.repeat(np.arange(8), 8)[:, None]).astype("float32")
        g = (rng.normal(size=(64, 16)) * 1.7 ** np.repeat(np.arange(8)[::-1], 8)[:, None]).astype("float32")
        w = rng.normal(size=(32, 16)).astype("float32")
        def gemm(x, w, g):
            y, vjp = jax.vjp(lambda x, w: layers.qdot(x, w, "fp8"), x, w)
            return (y, *vjp(g))
        gemm = jax.jit(gemm)
        one = [np.asarray(a) for a in gemm(x, w, g)]
        rows = dp_layout.batch
        eight = [np.asarray(a) for a in gemm(jax.device_put(x, rows), w, jax.device_put(g, rows))]
        own = [gemm(x[i:i + 8], w, g[i:i + 8]) for i in range(0, 64, 8)]
        own = [np.concatenate([np.asarray(o[0]) for o in own]), np.concatenate([np.asarray(o[1]) for o in own]),
               sum(np.asarray(o[2]) for o in own)]
        rel = lambda a, b: float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
        gemm_res = {"sharded": [rel(e, o) for e, o in zip(eight, one)], "own_amax": [rel(e, o) for e, o in zip(own, one)]}

        cfg = config.validate({"precision": "fp8", "model": {"size": 1, "seq_len": 16},
                               "data": {"source": "synthetic"}, "train": {"tokens": 4096, "batch_size": 8}})
        corpus = data.load("synthetic", "bytes")
        mc = cfg.model.shape(corpus.vocab)
        tx = step_lib.optimizer_tx(1.0, 0.1)
        md, od = nnx.eval_shape(lambda: step_lib.graph_defs(mc, cfg.recipe, tx, 0))
        batches = [data.batch(corpus.train, 0, s, 8, 16) for s in range(2)]
        res = {"gemm": gemm_res}
        for name, layout in (("one", None), ("dp", dp_layout), ("fsdp", parallel.layout_for(8, True, 8))):
            train_step, eval_loss, init = step_lib.compiled(layout)
            put = jax.device_put if layout is None else layout.put_batch
            state = init(mc, cfg.recipe, tx, 0)
            args = (md, od, state, put(batches[0]), 0, 0, np.float32(1e-2), np.bool_(True))
            mem = train_step.lower(*args).compile().memory_analysis()
            losses, amax = [], None
            for s, b in enumerate(batches):
                state, loss, gn, tel = train_step(md, od, state, put(b), 0, s, np.float32(1e-2), np.bool_(True))
                losses.append(float(parallel.fetch(loss)))
                amax = amax or {r: float(parallel.fetch(tel[r]["amax"])) for r in ("weight", "activation", "grad")}
            ev = float(parallel.fetch(eval_loss(md, state["model"], put(batches[1]))))
            res[name] = {"losses": losses, "amax": amax, "eval": ev,
                         "args": mem.argument_size_in_bytes, "temp": mem.temp_size_in_bytes,
                         "shardings": sorted({str(x.sharding.spec) for x in jax.tree.leaves(state) if hasattr(x, "sharding")})
                                      if layout is not None else []}
        print(json.dumps(res))
    """, devices=8)
    gemm, one, dp, fsdp = out["gemm"], out["one"], out["dp"], out["fsdp"]
    for sharded, own in zip(gemm["sharded"], gemm["own_amax"]):  # y, dX, dW relative to their largest entry
        assert sharded < 1e-6 and own > 1e-3, gemm
    for run in (dp, fsdp):
        assert max(abs(a - b) for a, b in zip(run["losses"], one["losses"])) < 1e-5
        assert abs(run["eval"] - one["eval"]) < 1e-5
        for role in ("weight", "activation", "grad"):  # each role's global amax
            assert run["amax"][role] == pytest.approx(one["amax"][role], rel=1e-6)
    assert dp["shardings"] == ["P()"]
    assert any("'data'" in spec for spec in fsdp["shardings"]) and "P()" in fsdp["shardings"]
    # data parallel holds the whole state on each device; FSDP about an eighth of its large arrays
    assert fsdp["args"] < 0.5 * dp["args"]
    print(f"\ngemm {gemm}\nargument bytes per device: one {one['args']}, dp {dp['args']}, fsdp {fsdp['args']}; "
          f"temp: one {one['temp']}, dp {dp['temp']}, fsdp {fsdp['temp']}; losses {one['losses']} / {dp['losses']} / "
          f"{fsdp['losses']}")


# ---------------------------------------------------------------- `scaling train` across 8 devices, resumed on 4


def test_scaling_train_on_8_devices_matches_1_and_resumes_on_the_4_left(tmp_path):
    cfg = tiny_toml(tmp_path / "par.toml", checkpoint_every=4)
    one, eight, lost = tmp_path / "one", tmp_path / "eight", tmp_path / "lost"
    out = python(f"""
        import json
        from scaling import cli
        from scaling.train import loop
        assert cli.main(["train", "{cfg}", "--out", "{one}"]) == 0
        assert cli.main(["train", "{cfg}", "--set", "parallel.data=8", "--set", "parallel.fsdp=true",
                         "--out", "{eight}"]) == 0
        real = loop._Trainer._step
        def lose_a_device(self, state, step, budget, phase):  # the run dies at step 6: its checkpoint is step 4
            if step == 6:
                raise RuntimeError("device 5 lost")
            return real(self, state, step, budget, phase)
        loop._Trainer._step = lose_a_device
        try:
            cli.main(["train", "{cfg}", "--set", "parallel.data=8", "--set", "parallel.fsdp=true", "--out", "{lost}"])
        except RuntimeError:
            pass
        print(json.dumps({{}}))
    """, devices=8)
    assert out == {}
    s1, s8 = (json.loads((d / "summary.json").read_text()) for d in (one, eight))
    assert s1["run_id"] == s8["run_id"] and s8["status"] == "ok"
    assert "parallel" not in s1 and s8["parallel"]["data"] == 8 and s8["parallel"]["fsdp"] is True
    l1, l8 = step_losses(one), step_losses(eight)
    assert sorted(l1) == sorted(l8) == list(range(1, 13))
    diff = max(abs(l1[k] - l8[k]) for k in l1)
    assert diff < LOSS_TOL, diff
    assert abs(s1["val_loss"] - s8["val_loss"]) < LOSS_TOL
    assert json.loads((lost / "summary.json").read_text())["status"] == "failed"

    resumed = subprocess.run([sys.executable, "-m", "scaling.cli", "train", str(cfg), "--set", "parallel.data=8",
                              "--set", "parallel.fsdp=true", "--out", str(lost)],
                             env={**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
                                  "JAX_PLATFORMS": "cpu"}, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    dropped = [line for line in resumed.stdout.splitlines() if "dropped" in line]
    assert dropped == ["parallel.data = 8 but 4 devices are left: 4 dropped; the global batch of 8 runs its 8 "
                       "replicas on 4 devices (2 rows each), the same numerics and run id"]
    assert "resumed from the checkpoint at step 4" in resumed.stdout
    s4 = json.loads((lost / "summary.json").read_text())
    assert s4["status"] == "ok" and s4["run_id"] == s8["run_id"] and s4["parallel"]["data"] == 4
    assert s4["parallel"]["replicas"] == 8
    after = {r["step"]: r["loss"] for r in read_jsonl(lost / "metrics.jsonl") if "loss" in r and r["step"] > 4}
    assert sorted(after) == list(range(5, 13))
    resumed_diff = max(abs(after[k] - l8[k]) for k in after)
    assert resumed_diff < LOSS_TOL
    assert abs(s4["val_loss"] - s8["val_loss"]) < LOSS_TOL
    print(f"\nlosses 1 vs 8 devices (FSDP), 12 steps: max |diff| {diff:.3g}; val_loss {s1['val_loss']:.6f} vs "
          f"{s8['val_loss']:.6f}; resumed on 4 devices: max |diff| {resumed_diff:.3g}, val_loss {s4['val_loss']:.6f}")

    # the planner's prediction for the layout the run used
    from scaling import cli
    argv = s8["parallel"]["plan_step"].split()[1:]
    assert argv[:2] == ["plan", "step"] and "tp=1,pp=1,dp=8,zero=3" in argv
    assert cli.main(argv) == 0


def test_a_fresh_run_wider_than_the_devices_is_refused_once_and_nothing_is_written(tmp_path):
    """Fewer devices than `parallel.data` is a resume's case (above); a run that starts fresh on them is
    refused with one line, by `scaling train` and by a sweep before take-off, and nothing is written."""
    cfg = tiny_toml(tmp_path / "par.toml")
    experiment = tmp_path / "sweep.toml"
    experiment.write_text(cfg.read_text() + '[grid]\nprecision = ["fp32", "bf16"]\n')
    for devices, argv in ((1, ["train", cfg, "--out", tmp_path / "run"]),
                          (3, ["sweep", experiment, "--out", tmp_path / "results", "--no-progress"])):
        done = subprocess.run([sys.executable, "-m", "scaling.cli", *map(str, argv), "--set", "parallel.data=4"],
                              env={**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
                                   "JAX_PLATFORMS": "cpu"}, cwd=ROOT, capture_output=True, text=True, timeout=900)
        said = [line for line in (done.stdout + done.stderr).splitlines() if "parallel.data" in line]
        assert done.returncode == 2 and said == [
            f"error: parallel.data: got 4; allowed: at most the {devices} device{'s' * (devices > 1)} visible here "
            "for a run that starts fresh (only a run resuming from its checkpoint trains on fewer: the devices left)"
        ], done.stdout + done.stderr
        assert "dropped" not in done.stdout + done.stderr
    assert not (tmp_path / "run").exists() and not list((tmp_path / "results").rglob("*.json"))


# ---------------------------------------------------------------- two hosts (two processes on localhost)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _two_processes(argv: list[str], code: str | None = None) -> list[subprocess.CompletedProcess]:
    """`argv` (or python -c `code`) as processes 0 and 1 of a jax.distributed job of 2 CPU devices each."""
    port = _free_port()
    procs = []
    for index in range(2):
        env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu",
               "JAX_COORDINATOR_ADDRESS": f"localhost:{port}", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": str(index)}
        command = [sys.executable, "-c", textwrap.dedent(code)] if code else [sys.executable, "-m", "scaling.cli", *argv]
        procs.append(subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    done = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=900)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return done


def test_two_processes_train_checkpoint_and_resume_one_run(tmp_path):
    """Two 'hosts' of 2 devices each (jax.distributed on localhost): one run of 4 replicas trains,
    checkpoints through Orbax's multi-host path, dies at step 6, and resumes from step 4 on a second
    launch. Process 0 alone writes the run directory."""
    cfg = tiny_toml(tmp_path / "par.toml", checkpoint_every=4)
    run = tmp_path / "run"
    first = _two_processes([], code=f"""
        from scaling.train import loop, parallel
        parallel.initialize()
        real = loop._Trainer._step
        def lose_a_host(self, state, step, budget, phase):
            if step == 6:
                raise RuntimeError("host lost")
            return real(self, state, step, budget, phase)
        loop._Trainer._step = lose_a_host
        from scaling import cli
        try:
            cli.main(["train", "{cfg}", "--set", "parallel.data=4", "--out", "{run}"])
        except RuntimeError:
            pass
    """)
    assert all(p.returncode == 0 for p in first), first[0].stderr[-3000:] + first[1].stderr[-3000:]
    assert json.loads((run / "summary.json").read_text())["status"] == "failed"
    assert (run / "checkpoints" / "4").is_dir()

    second = _two_processes(["train", str(cfg), "--set", "parallel.data=4", "--out", str(run)])
    assert all(p.returncode == 0 for p in second), second[0].stderr[-3000:] + second[1].stderr[-3000:]
    assert "resumed from the checkpoint at step 4" in second[0].stdout
    # process 1 trains its half and prints the summary it returns; it echoes and writes nothing itself
    assert "ok: N=" in second[1].stdout and "resumed" not in second[1].stdout and "trunk" not in second[1].stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["parallel"]["processes"] == 2 and summary["parallel"]["data"] == 4
    records = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in records if r.get("event") == "resumed"] == [4]
    trained = [r["step"] for r in records if "loss" in r]
    assert trained == list(range(1, 7)) + list(range(5, 13))  # each step logged once per attempt, by process 0


# ---------------------------------------------------------------- the sweep places it


def test_gpus_per_run_g_gives_each_run_g_gpus_and_probes_every_one():
    from scaling.errors import ConfigError
    from scaling.study.sweeps import devices, sweep

    gpus = [str(i) for i in range(10)]
    assert devices.gpu_slots(gpus, workers=None, gpus_per_run=4) == [{"CUDA_VISIBLE_DEVICES": "0,1,2,3"},
                                                                    {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}]
    assert devices.gpu_slots(gpus, workers=1, gpus_per_run=8) == [{"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}]
    devices.check_gpus_per_run(8, "local", gpus)
    devices.check_gpus_per_run(8, "ray", [])  # Ray's cluster size is checked when it starts
    with pytest.raises(ConfigError, match="at most the 4 GPUs visible here"):
        devices.check_gpus_per_run(8, "local", gpus[:4])
    with pytest.raises(ConfigError, match="a whole number of GPUs"):
        devices.check_gpus_per_run(2.5, "ray", [])

    probed = []

    def check(pins, child_env):  # GPU 5 fails its probe
        probed.extend(p["CUDA_VISIBLE_DEVICES"] for p in pins)
        return [{**p, "JAX_PLATFORMS": "cuda"} for p in pins if p["CUDA_VISIBLE_DEVICES"] != "5"]

    slots = devices.gpu_slots(gpus[:8], workers=None, gpus_per_run=4)
    kept = devices.check_gpu_slots(slots, sweep.worker_env, check)
    assert probed == [str(i) for i in range(8)]  # every device of every run, one probe each
    assert kept == [{"CUDA_VISIBLE_DEVICES": "0,1,2,3", "JAX_PLATFORMS": "cuda"}]  # the slot with GPU 5 is left out
    single = devices.gpu_slots(gpus[:2], workers=None)
    assert devices.check_gpu_slots(single, sweep.worker_env, check) == [{**p, "JAX_PLATFORMS": "cuda"} for p in single]


def test_a_sweep_run_on_g_gpus_gets_parallel_data_g_unless_the_experiment_sets_it(tmp_path):
    import argparse

    from scaling.cli import sweep as sweep_cli

    plain, own = tmp_path / "plain.toml", tmp_path / "own.toml"
    plain.write_text('name = "x"\n[grid]\nseed = [0, 1]\n')
    own.write_text('name = "x"\n[parallel]\ndata = 4\n')
    ns = lambda path, sets=(): argparse.Namespace(experiment=str(path), set=list(sets))  # noqa: E731
    assert not sweep_cli._sets_parallel_data(ns(plain))
    assert sweep_cli._sets_parallel_data(ns(own))
    assert sweep_cli._sets_parallel_data(ns(plain, ["parallel.data=2"]))
