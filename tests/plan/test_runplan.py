"""scaling.plan.runplan: FLOPs to days, from a measured MFU or a step of the step model."""

import pytest

from scaling.errors import ConfigError
from scaling.plan import reliability, runplan


def test_days_formula_with_fixed_mfu():
    # 3.4e24 / (1024 * 989e12 * 86400) = 38.86 days at 100% MFU; 40% MFU -> 97.1 days
    assert runplan.train_days(3.4e24, 1024, mfu=1.0) == pytest.approx(3.4e24 / (1024 * 989e12 * 86400))
    assert runplan.train_days(3.4e24, 1024, mfu=0.4) == pytest.approx(97.15, abs=0.01)
    # B200 FP4 peak 9000 TFLOP/s dense
    assert runplan.train_days(9e15 * 86400, 1, gpu="b200", precision="fp4", mfu=1.0) == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="mfu"):
        runplan.plan_run(1e24, 1024)  # neither a measured MFU nor a step


def test_drop_replica_beats_checkpoint_restart_at_scale():
    run = runplan.plan_run(3.4e24, 10000, mfu=0.3)
    assert run.drop_replica_goodput > run.checkpoint_goodput
    assert run.checkpoint_days > run.drop_replica_days > run.days


def test_run_days_from_the_step_model(h100_step):
    r = h100_step("tp=8,pp=2,dp=4", micro_batches=8)
    tokens = 1e12
    run = runplan.run_days(r, tokens)
    assert run.days * 86_400 == pytest.approx(tokens / (r.tokens / r.step_seconds), rel=1e-9)
    assert run.gpus == 64 and 0 < run.checkpoint_goodput < 1 and 0 < run.drop_replica_goodput < 1
    # dropping a replica loses a tp*cp*pp = 16-GPU replica, as reliability.drop_replica_goodput says
    assert run.drop_replica_goodput == pytest.approx(reliability.drop_replica_goodput(64, 16))
