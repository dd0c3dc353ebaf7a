from pathlib import Path

import pytest

from scaling.train import ladder
from scaling.study.sweeps import devices, sweep, takeoff
from scaling.errors import ConfigError


def test_grid_product_excludes_and_includes():
    experiment = {
        "grid": {"model": {"size": [1, 2]}, "precision": ["fp32", "fp8", "fp4"]},
        "exclude": [{"model.size": 2, "precision": "fp4"}],
        "include": [{"model.size": 3, "precision": "fp8"}],
    }
    points = sweep.grid_points(experiment)
    assert len(points) == 2 * 3 - 1 + 1
    assert {"model.size": 2, "precision": "fp4"} not in points
    assert points[-1] == {"model.size": 3, "precision": "fp8"}
    assert points[0] == {"model.size": 1, "precision": "fp32"}


def test_precision_table_is_a_leaf():
    table = {"weight": {"format": "fp8_e4m3"}}
    assert sweep.flatten({"precision": table}) == {"precision": table}
    assert sweep.flatten({"grid": {"train": {"lr": [1, 2]}}}) == {"grid.train.lr": [1, 2]}


def test_bad_grid_axis_names_key_and_value():
    with pytest.raises(ConfigError, match=r"grid.train.lr: got 0.1; allowed: a non-empty list"):
        sweep.grid_points({"grid": {"train": {"lr": 0.1}}})
    with pytest.raises(ConfigError, match="exclude"):
        sweep.grid_points({"exclude": {"a": 1}})


def test_dotted_set():
    cfg = {}
    sweep.set_dotted(cfg, "train.lr", 0.1)
    sweep.set_dotted(cfg, "model.size", 2)
    assert cfg == {"train": {"lr": 0.1}, "model": {"size": 2}}


def test_zipped_axis_varies_keys_together():
    points = sweep.grid_points({"grid": {"seed": [0, 1], "model.size,precision": [[2, "fp32"], [5, "fp4"]]}})
    assert points == [{"seed": 0, "model.size": 2, "precision": "fp32"}, {"seed": 0, "model.size": 5, "precision": "fp4"},
                      {"seed": 1, "model.size": 2, "precision": "fp32"}, {"seed": 1, "model.size": 5, "precision": "fp4"}]
    with pytest.raises(ConfigError, match="2-element lists"):
        sweep.grid_points({"grid": {"model.size,precision": [[2, "fp32"], [5]]}})


def test_a_run_another_process_owns_is_left_alone_then_waited_for(tmp_path):
    """The ownership rules of both local executors, without training: a held run is OWNED (nothing
    written into it); waited for, it is `skipped` once its owner lands it."""
    import threading

    from scaling.train import runs

    spec = sweep.RunSpec(run_id="abc", sweep="s", config={"seed": 0})
    run_dir = spec.out_dir(tmp_path)
    for attempt in (lambda wait: sweep.execute(spec, tmp_path, hang_timeout=60, poll_s=0.05, wait=wait),
                    lambda wait: sweep._run_in_process(spec, tmp_path, wait)):
        lock = runs.acquire(run_dir)
        assert attempt(False) == sweep.OWNED
        assert [p.name for p in run_dir.iterdir()] == [runs.LOCK_FILE]

        def owner_lands():
            runs.land(run_dir, {"status": "ok"})
            lock.release()

        timer = threading.Timer(0.3, owner_lands)
        timer.start()
        assert attempt(True) == "skipped"
        timer.join()
        (run_dir / runs.SUMMARY_FILE).unlink()


# ---------------------------------------------------------------- GPUs (pure functions; no GPU needed)

SMI = ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5f2c0a1e-0000-0000-0000-000000000000)\n"
       "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-77aa0a1e-0000-0000-0000-000000000000)\n")


def test_visible_gpus_from_cuda_visible_devices_or_nvidia_smi():
    assert devices.visible_gpus({}, listing=SMI) == ["0", "1"]
    assert devices.visible_gpus({}, listing="") == []  # no nvidia-smi, or no GPU
    assert devices.visible_gpus({"CUDA_VISIBLE_DEVICES": "3,1"}, listing=SMI) == ["3", "1"]
    assert devices.visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-77aa0a1e"}, listing=SMI) == ["GPU-77aa0a1e"]
    assert devices.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, listing=SMI) == []  # hides every GPU
    assert devices.visible_gpus({"CUDA_VISIBLE_DEVICES": "2,-1,0"}, listing=SMI) == ["2"]  # CUDA stops at -1


def test_each_worker_is_pinned_to_its_own_gpu():
    pins = [{"CUDA_VISIBLE_DEVICES": g} for g in ("0", "1", "2", "3")]
    assert devices.gpu_slots(["0", "1", "2", "3"], workers=None) == pins  # one run per GPU
    assert devices.gpu_slots(["0", "1", "2", "3"], workers=2) == pins[:2]
    assert devices.gpu_slots(["0", "1"], workers=8) == pins[:2]  # never two runs on one GPU
    assert devices.gpu_slots([], workers=None) == []
    assert sweep.worker_env(pins[1])["CUDA_VISIBLE_DEVICES"] == "1"
    # 1/k GPUs per run: k slots per GPU, each with 1/k of XLA's default 75%, going round the GPUs first
    half = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.375"}
    shared = [{"CUDA_VISIBLE_DEVICES": g, **half} for g in ("0", "1", "0", "1")]
    assert devices.gpu_slots(["0", "1"], workers=None, gpus_per_run=0.5) == shared
    assert devices.gpu_slots(["0", "1"], workers=3, gpus_per_run=0.5) == shared[:3]
    assert len(devices.gpu_slots(["0"], workers=None, gpus_per_run=0.25)) == 4


def test_run_processes_start_with_the_process_env_unless_the_user_set_their_own(monkeypatch):
    from scaling import host

    monkeypatch.setattr(host.platform, "system", lambda: "Linux")
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    assert sweep.worker_env()["GLIBC_TUNABLES"] == host.PROCESS_ENV["GLIBC_TUNABLES"]
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    assert sweep.worker_env()["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"


def test_a_gpu_fraction_shares_memory_unless_the_user_set_it():
    assert devices.gpu_share(0.5, {}) == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.375"}
    assert devices.gpu_share(1, {}) == {} and devices.gpu_share(0, {}) == {}
    assert devices.gpu_share(0.25, {"XLA_CLIENT_MEM_FRACTION": "0.2"}) == {}


@pytest.mark.parametrize("gpus_per_run, executor, gpus, allowed", [
    (1, "local", [], "0 on a machine without GPUs"),
    (0.3, "local", ["0"], "0, 1 or 1/k with the local executor"),
    (2.5, "ray", ["0"], "a whole number of GPUs"),
    (-1, "local", ["0"], "a number in [0, 1]"),
    (4, "local", ["0", "1"], "at most the 2 GPUs visible here"),
])
def test_gpus_per_run_that_cannot_be_met_is_one_line(gpus_per_run, executor, gpus, allowed):
    with pytest.raises(ConfigError, match=r"^--gpus-per-run: got .*; allowed: ") as err:
        devices.check_gpus_per_run(gpus_per_run, executor, gpus)
    assert allowed in err.value.allowed
    devices.check_gpus_per_run(0, "local", [])
    devices.check_gpus_per_run(1, "local", ["0"])
    devices.check_gpus_per_run(0.25, "local", ["0"])  # 4 runs share the GPU
    devices.check_gpus_per_run(2, "local", ["0", "1"])  # one run across both (parallel.data = 2)
    devices.check_gpus_per_run(8, "ray", [])  # Ray places it: num_gpus = 8
    devices.check_gpus_per_run(1 / 3, "local", ["0"])
    devices.check_gpus_per_run(0.5, "ray", [])  # a Ray cluster's GPUs may be on other machines


def test_local_executor_runs_at_most_one_run_per_gpu(tmp_path, monkeypatch):
    import threading
    import time

    held, seen, lock = set(), [], threading.Lock()

    def fake_execute(spec, out_root, hang_timeout, wait=False, pin={}):
        gpu = pin["CUDA_VISIBLE_DEVICES"]
        with lock:
            assert gpu not in held
            held.add(gpu)
            seen.append((spec.run_id, gpu))
        time.sleep(0.05)
        with lock:
            held.remove(gpu)
        return "ok"

    monkeypatch.setattr(sweep, "execute", fake_execute)
    specs = [sweep.RunSpec(run_id=f"r{i}", sweep="s", config={}) for i in range(7)]
    done = []
    sweep._run_local(specs, tmp_path, 60, 1, lambda spec, status: done.append(status), False,
                     devices.gpu_slots(["0", "1", "2"], None))
    assert done == ["ok"] * 7 and sorted(r for r, _ in seen) == sorted(s.run_id for s in specs)
    assert {g for _, g in seen} == {"0", "1", "2"}


def test_every_shipped_experiment_expands_and_the_gpu_pilot_spans_its_design():
    from scaling.train import compute

    root = Path(__file__).resolve().parents[2] / "experiments"
    for path in sorted(root.glob("*.toml")):
        assert sweep.expand(path), path.name
    pilot = sweep.expand(root / "gpu_pilot.toml")
    n = {s.run_id: compute.run_row(s.config)["N"] for s in pilot}
    assert {s.config.recipe.name for s in pilot} == {"bf16", "fp8", "mxfp6", "mxfp4"}
    # of the offered sizes 2-10, the design keeps sizes 4-7 for every recipe: non-embedding N 0.8M-3.0M
    assert sorted(set(n.values())) == [float(ladder.param_counts(ladder.config_for_size(s))["non_embedding"])
                                       for s in range(4, 8)]
    for recipe in ("bf16", "fp8", "mxfp6", "mxfp4"):
        assert sorted(s.config.model.size for s in pilot if s.config.recipe.name == recipe) == [4, 5, 6, 7]
    # tokens per parameter at the budget (the reference's extra evaluations excluded): about 4-120
    per_param = [s.config.train.tokens * f / n[s.run_id] for s in pilot
                 for f, b in zip(s.config.train.eval_at, s.config.study.flop_budgets) if b > 0]
    assert min(per_param) <= 6 and max(per_param) >= 100


def test_take_off_lanes_and_the_eta_they_measure(monkeypatch):
    """Probes fly one lane per worker where no GPU is visible (a GPU process would claim the
    device); probes flown two at a time measured runs that will also run two at a time."""
    monkeypatch.setattr(devices, "visible_gpus", lambda: [])
    assert takeoff.takeoff_lanes(2) == 2 and takeoff.takeoff_lanes(0) == 1
    monkeypatch.setattr(devices, "visible_gpus", lambda: ["0"])
    assert takeoff.takeoff_lanes(2) == 1
    specs = sweep.expand(Path(__file__).resolve().parents[2] / "experiments" / "smoke_sweep.toml")
    flights = {sweep.shape_key(s.config): {"tokens_per_s": 1000.0} for s in specs}
    serial = takeoff.measured_seconds(specs, flights)
    assert serial == pytest.approx(1.15 * sum(s.config.train.tokens for s in specs) / 1000.0
                                   + takeoff.RUN_START_SECONDS * len(specs))
    assert takeoff.measured_seconds(specs, flights, lanes=2) == pytest.approx(serial / 2)


def test_gpu_slots_each_fly_a_take_off_lane_with_their_own_settings(monkeypatch, tmp_path):
    """With GPU slots, take-off flies one lane per slot: this process on the first GPU, child lane i
    started with slot i's pin (its GPU and memory share), the probes dealt round the lanes."""
    specs = sweep.expand(Path(__file__).resolve().parents[2] / "experiments" / "smoke_sweep.toml")
    keys = list(dict.fromkeys(sweep.shape_key(s.config) for s in specs))
    assert len(keys) >= 3
    flown, children = [], []
    monkeypatch.setattr(takeoff, "_fly", lambda config, out_dir: flown.append(config) or {"status": "ok"})

    def child(probes, out_root, hang_timeout, pin={}):
        children.append((sorted(probes), pin))
        return lambda tick=None: {k: {"status": "ok"} for k in probes}

    monkeypatch.setattr(takeoff, "_fly_in_child", child)
    pins = devices.gpu_slots(["0", "1"], None, 0.5)
    assert takeoff.takeoff_lanes(1, pins) == 4
    cleared, flights = takeoff.take_off(specs, tmp_path, lanes=takeoff.takeoff_lanes(1, pins), pins=pins)
    lanes = min(len(pins), len(keys))
    assert [pin for _, pin in children] == pins[1:lanes]
    assert [probes for probes, _ in children] == [sorted(keys[i::lanes]) for i in range(1, lanes)]
    assert len(flown) == len(keys[::lanes]) and cleared == specs and set(flights) == set(keys)


def _specs(*points: dict) -> list:
    from scaling.train import config

    base = {"model": {"size": 1, "seq_len": 32}, "data": {"source": "synthetic"}, "precision": "fp8"}
    cfgs = [config.validate({**base, **p}) for p in points]
    return [sweep.RunSpec(run_id=c.run_id, sweep="s", config=c) for c in cfgs]


def test_runs_of_a_cleared_pack_key_go_k_at_a_time_and_every_other_run_alone():
    from scaling.train import loop

    specs = _specs({"seed": 0}, {"seed": 1, "precision": "mxfp6"}, {"seed": 1}, {"seed": 2, "precision": "fp6"},
                   {"seed": 3}, {"seed": 2, "precision": "mxfp6"})
    fp8, mx = loop.pack_key(specs[0].config), loop.pack_key(specs[1].config)
    assert fp8 != mx
    units = sweep.packs(specs, 2, {fp8})
    assert units == [[specs[0], specs[2]], [specs[1]], [specs[3], specs[4]], [specs[5]]]
    assert sweep.packs(specs, 2, {fp8, mx}) == [[specs[0], specs[2]], [specs[1], specs[5]], [specs[3], specs[4]]]
    assert sweep.packs(specs, 3, {fp8}) == [[specs[0], specs[2], specs[3]], [specs[1]], [specs[4]], [specs[5]]]
    assert sweep.packs(specs, 1, {fp8}) == [[s] for s in specs]
    assert sweep.pack_plan(specs, 2).startswith("--pack 2: 6 of 6 runs in 3 packs (sizes 2, 2, 2)")
    assert sweep.pack_plan(specs[:2], 2).startswith("--pack 2: 0 of 2 runs in 0 packs (sizes none)")


def test_the_packing_probe_clears_only_keys_whose_packed_step_is_bit_for_bit(tmp_path):
    specs = _specs({"seed": 0}, {"seed": 1}, {"seed": 0, "precision": "mxfp6"}, {"seed": 1, "precision": "mxfp6"},
                   {"seed": 0, "precision": "bf16"})
    from scaling.train import loop

    asked, lines = [], []

    def measure(job):
        asked.append(job)
        return {key: 0.0 if "fp8" in pair[0]["precision"] else 0.0163 for key, pair in job.items()}

    cleared = takeoff.pack_probe(specs, tmp_path, echo=lines.append, measure=measure)
    assert len(asked[0]) == 2  # bf16 is alone: nothing to probe
    assert cleared == {loop.pack_key(specs[0].config)}
    assert any("not packing 2 runs" in line and "0.0163" in line for line in lines)


def test_slow_runs_are_slow_against_peers_trained_as_they_were(tmp_path):
    """A packed run's tokens/s is its share of the pack's: compared with packed peers only."""
    import json

    specs = _specs(*({"seed": s} for s in range(7)))
    speeds = [100, 100, 40, 30, 30, 30, 10]  # 0-2 alone (2 slow), 3-6 in a pack of 4 (6 slow)
    for i, (spec, speed) in enumerate(zip(specs, speeds)):
        spec.out_dir(tmp_path).mkdir(parents=True)
        packed_with = {"packed_with": [s.run_id for s in specs[3:] if s is not spec]} if i >= 3 else {}
        (spec.out_dir(tmp_path) / "summary.json").write_text(json.dumps({"status": "ok", "tokens_per_s": speed,
                                                                         **packed_with}))
    assert [r["run_id"] for r in sweep.slow_runs(specs, tmp_path)] == [specs[2].run_id, specs[6].run_id]
