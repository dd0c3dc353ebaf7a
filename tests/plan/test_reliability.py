"""scaling.plan.reliability: failures and goodput, each formula against a Monte Carlo simulation."""

import math

import numpy as np
import pytest

from scaling.plan import reliability


def test_llama3_failure_rate_round_trip():
    assert reliability.expected_interruptions(54, 16384) == pytest.approx(419)
    assert reliability.GPU_MTBF_HOURS / 16384 == pytest.approx(3.09, abs=0.01)  # one job failure every ~3 h


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
    predicted = reliability.checkpoint_goodput(mtbf, tau, ckpt, restart)
    assert 0.5 < predicted < 0.7  # far from 1: a wrong formula cannot hide
    assert abs(simulated - predicted) < 4 * se, (simulated, predicted, se)
    assert 4 * se < 0.005  # the check resolves 0.5%-level errors


def test_daly_interval_is_the_optimum_of_the_exact_goodput():
    mtbf, ckpt, restart = reliability.GPU_MTBF_HOURS / 10000, 5 / 60, 20 / 60
    daly = reliability.optimal_checkpoint_interval(mtbf, ckpt)
    assert daly == pytest.approx(math.sqrt(2 * ckpt * mtbf), rel=0.1)  # Young's first-order value
    grid = np.linspace(0.05, 5.0, 2000)
    best = max(reliability.checkpoint_goodput(mtbf, t, ckpt, restart) for t in grid)
    assert reliability.checkpoint_goodput(mtbf, daly, ckpt, restart) == pytest.approx(best, abs=1e-4)


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
    predicted = reliability.drop_replica_goodput(gpus, replica_gpus, gpu_mtbf, repair, stall)
    assert predicted == pytest.approx(0.8 * (1 - 0.1 / 12.5) ** 15)
    assert abs(simulated - predicted) < 4 * se, (simulated, predicted, se)
    assert 4 * se < 0.005  # resolves the 0.7% bias of the cruder A * exp(-n q) approximation


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
    predicted = reliability.expected_interruptions(days, gpus, mtbf)
    se = counts.std() / math.sqrt(runs)
    assert predicted == pytest.approx(days * 24 * gpus / mtbf)
    assert abs(counts.mean() - predicted) < 4 * se, (counts.mean(), predicted, se)
    assert 4 * se < 0.01 * predicted  # resolves a 1% error in the formula
