"""The GPU take-off check, on a CPU with stand-in devices: one that computes float32 dots like TF32,
one that is slow against its peers, one far under its kind's datasheet peak. Each is left out with
one line saying why; with no usable device the sweep stops (ConfigError)."""

from __future__ import annotations

import jax
import pytest

from scaling.errors import ConfigError
from scaling.study.sweeps import devices, sweep

SMALL = {"n": 128, "repeats": 3}  # the speed probe's matmul on a CPU


class Steady(devices.Target):
    """The CPU's numerics with a fixed matmul time: a wall clock on a shared 2-core machine is no
    ground for a speed verdict in a unit test (a busy moment once made a healthy stand-in 'slow')."""

    def time_matmul(self, n, repeats):
        return 1.0


class TF32(Steady):
    """Float32 dots on inputs rounded to TF32's 10 mantissa bits, as Ampere's tensor cores do."""

    def f32_dot(self, a, b):
        tf32 = lambda x: jax.lax.reduce_precision(x, exponent_bits=8, mantissa_bits=10)
        return super().f32_dot(tf32(a), tf32(b))


class Slow(Steady):
    """A thousand times slower than its peers (a slow node)."""

    def time_matmul(self, n, repeats):
        return 1000 * super().time_matmul(n, repeats)


def _cpu(cls=Steady, name="cpu", kind=None):
    return cls(jax.devices("cpu")[0], name=name, kind=kind)


def test_a_sound_device_passes_every_probe():
    result = devices.probe(_cpu(devices.Target), **SMALL)  # the real timer
    assert result.problems == [] and result.flops_per_s > 0 and result.peak_flops_per_s is None


def test_a_tf32_device_a_slow_one_and_one_under_its_datasheet_peak_are_each_left_out_with_a_line():
    good = [_cpu(name="a"), _cpu(name="b")]
    tf32, slow = _cpu(TF32, "tf32"), _cpu(Slow, "slow")
    h100 = _cpu(name="h100", kind="NVIDIA H100 80GB HBM3")  # this CPU is far under 989 TFLOP/s
    lines = []
    usable = devices.check([good[0], tf32, slow, h100, good[1]], echo=lines.append, **SMALL)
    assert usable == good
    assert len(lines) == 3 and all("\n" not in line for line in lines)
    by_device = {line.split()[1]: line for line in lines}
    assert "computes like TF32" in by_device["tf32"] and "float32 dot at HIGHEST" in by_device["tf32"]
    assert "peers' median" in by_device["slow"]
    assert "datasheet peak 989 TFLOP/s" in by_device["h100"]


def test_no_usable_device_stops_the_sweep_before_training():
    lines = []
    with pytest.raises(ConfigError, match="take-off: got 'tf32'; allowed: at least one device that passes"):
        devices.check([_cpu(TF32, "tf32")], echo=lines.append, **SMALL)
    assert len(lines) == 1 and "tf32" in lines[0]


def test_a_lone_device_has_no_peers_to_be_slow_against():
    usable, lines = devices.judge([devices.Probe(name="only", kind="cpu", flops_per_s=1.0)])
    assert [p.name for p in usable] == ["only"] and lines == []


def test_gpu_children_must_start_on_cuda_with_deterministic_ops():
    pin = devices.gpu_pin({"CUDA_VISIBLE_DEVICES": "3"}, environ={"XLA_FLAGS": "--xla_dump_to=/tmp/x"})
    assert pin == {"CUDA_VISIBLE_DEVICES": "3", "JAX_PLATFORMS": "cuda",
                   "XLA_FLAGS": "--xla_dump_to=/tmp/x --xla_gpu_deterministic_ops=true"}
    mine = "--xla_gpu_deterministic_ops=false"  # the user's own choice is kept
    assert devices.gpu_pin({}, environ={"XLA_FLAGS": mine, "JAX_PLATFORMS": "rocm"}) == {
        "JAX_PLATFORMS": "rocm", "XLA_FLAGS": mine}


def test_the_parent_starts_jax_without_preallocating_and_restores_the_environment():
    """The parent's JAX starts with the runs' XLA_FLAGS, so its take-off compiles are the cache entries
    the runs load (on an H200 a run then compiled in 2 s)."""
    environ = {"XLA_PYTHON_CLIENT_ALLOCATOR": "bfc"}
    with devices.parent_allocation(environ):
        assert environ == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_ALLOCATOR": "platform",
                           "XLA_FLAGS": devices.gpu_pin({}, {})["XLA_FLAGS"]}
    assert environ == {"XLA_PYTHON_CLIENT_ALLOCATOR": "bfc"}
    environ = {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}
    with devices.parent_allocation(environ):
        assert environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --xla_gpu_deterministic_ops=true"
    assert environ == {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}


def test_gpus_per_run_where_jax_is_not_on_a_gpu_is_refused_in_one_line():
    devices.require_gpu_backend("gpu")
    with pytest.raises(ConfigError, match=r"^--gpus-per-run: got \"> 0 with JAX's backend 'cpu'\"; allowed: 0, or") as e:
        devices.require_gpu_backend("cpu")
    assert "\n" not in str(e.value)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="here CUDA starts")
def test_a_gpu_slot_whose_jax_cannot_start_cuda_is_left_out():
    """On this machine a child pinned to a GPU (JAX_PLATFORMS=cuda) cannot start: the CUDA install a
    run would silently have trained on the CPU without."""
    lines = []
    with pytest.raises(ConfigError, match="take-off"):  # two slots sharing GPU 0: one probe, one line
        devices.check_gpu_pins(devices.gpu_slots(["0"], None, 0.5), sweep.worker_env, echo=lines.append, timeout=120)
    assert len(lines) == 1 and lines[0].startswith("device CUDA_VISIBLE_DEVICES=0 left out: JAX did not start on CUDA")


def test_slots_sharing_a_gpu_are_probed_once_and_share_its_verdict(monkeypatch):
    """Probes sharing a GPU would time each other: one probe per GPU, and every slot of a GPU that
    passed is kept (here GPU 1 fails its numerics)."""
    started = []

    class Child:
        def __init__(self, argv, env, **kw):
            started.append(env["CUDA_VISIBLE_DEVICES"])

    def landed(proc, out, pin, timeout):
        gpu = pin["CUDA_VISIBLE_DEVICES"]
        return devices.Probe(name=f"gpu{gpu}", problems=["TF32 dot"] if gpu == "1" else [], flops_per_s=5e14)

    monkeypatch.setattr(devices.subprocess, "Popen", Child)
    monkeypatch.setattr(devices, "_landed", landed)
    lines = []
    kept = devices.check_gpu_pins(devices.gpu_slots(["0", "1"], None, 0.5), lambda pin: dict(pin), echo=lines.append)
    assert started == ["0", "1"] and len(lines) == 1 and "gpu1" in lines[0]
    assert [pin["CUDA_VISIBLE_DEVICES"] for pin in kept] == ["0", "0"]
    assert all(pin["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.375" and pin["JAX_PLATFORMS"] == "cuda" for pin in kept)


def test_the_sweep_checks_its_gpus_before_take_off_compiles_anything(monkeypatch, tmp_path):
    """A sweep whose only GPU fails the check stops before any take-off probe compiles."""
    from pathlib import Path

    from scaling.cli import sweep as sweep_cli

    checked = []

    def refuse(pins, child_env, **kw):
        checked.append(pins)
        raise ConfigError("take-off", "CUDA_VISIBLE_DEVICES=0", "at least one device that passes")

    monkeypatch.setattr(sweep_cli, "_gpu_pins", lambda args: [{"CUDA_VISIBLE_DEVICES": "0"}])
    monkeypatch.setattr(devices, "check_gpu_pins", refuse)
    monkeypatch.setattr(sweep_cli.takeoff, "take_off", lambda *a, **k: pytest.fail("take-off flew before the GPU check"))
    parser = __import__("argparse").ArgumentParser()
    sweep_cli.add_arguments(parser)
    smoke = Path(__file__).resolve().parents[2] / "experiments" / "smoke_sweep.toml"
    args = parser.parse_args([str(smoke), "--out", str(tmp_path), "--gpus-per-run", "1"])
    with pytest.raises(ConfigError, match="take-off"):
        sweep_cli.main(args)
    assert checked == [[{"CUDA_VISIBLE_DEVICES": "0"}]]


# Ray starts its processes with subprocess (fork, then exec at once): JAX's at-fork warning is meant for
# a fork that goes on running Python beside JAX's threads, which this is not.
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")
def test_a_ray_cluster_whose_gpus_do_not_start_cuda_stops_before_training():
    """--executor ray with GPUs: every GPU of the cluster is probed in a task reserving it, in a child with
    its runs' environment (JAX_PLATFORMS=cuda). On this CPU machine a local Ray told it has two GPUs
    stands in for a cluster whose CUDA is broken: each GPU gets one line naming its node and GPU, and the
    check stops the sweep (Ray places runs on any GPU, so none can be left out)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=1, num_gpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        lines: list[str] = []
        with pytest.raises(ConfigError, match="every GPU of the Ray cluster usable"):
            devices.check_ray_gpus(2, sweep.worker_env, echo=lines.append, timeout=120)
    finally:
        ray.shutdown()
    assert len(lines) == 2 and all("JAX did not start on CUDA" in line for line in lines), lines
    assert sorted(line.split("CUDA_VISIBLE_DEVICES=")[1][0] for line in lines) == ["0", "1"]


def test_a_ray_run_on_a_gpu_must_start_jax_on_it():
    """A Ray task's run gets the local GPU runs' pin: JAX_PLATFORMS=cuda (no silent CPU fallback) and
    deterministic GPU ops, beside its memory share."""
    pin = devices.ray_pin(0.5, environ={})
    assert pin["JAX_PLATFORMS"] == "cuda" and devices.DETERMINISTIC_FLAG in pin["XLA_FLAGS"]
    assert pin["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.375" and "CUDA_VISIBLE_DEVICES" not in pin  # Ray's own
    assert devices.ray_pin(0, environ={}) == {}
