"""Live curves: which metrics.jsonl records become which scalars, and no point mirrored twice."""

from scaling.train import tracking

STEP = {"step": 10, "tokens": 2560, "phase": "trunk", "loss": 2.5, "lr": 1e-3, "grad_norm": 0.5,
        "tokens_per_s": 1e4, "telemetry": {"weight": {"amax": 3.0, "block_amax": {"max": 2.0}}, "act_max": [1.0, 4.0]}}


def test_step_records_become_flat_tags():
    curve, step, values = tracking.scalars(STEP)
    assert (curve, step) == ("trunk", 10)
    assert values == {"loss": 2.5, "lr": 1e-3, "grad_norm": 0.5, "tokens_per_s": 1e4, "telemetry/weight/amax": 3.0,
                      "telemetry/weight/block_amax/max": 2.0, "telemetry/act_max/0": 1.0, "telemetry/act_max/1": 4.0}
    curve, step, values = tracking.scalars({**STEP, "phase": "cooldown", "budget": 5120, "step": 20})
    assert (curve, step) == ("cooldown_5120", 20) and values["cooldown_5120/telemetry/weight/amax"] == 3.0


def test_evaluations_are_mirrored_and_other_records_are_not():
    at_budget = {"event": "eval", "tokens": 2560, "D": 2560, "step": 10, "val_loss": 2.0, "train_loss": 1.9,
                 "fraction": 0.5}
    assert tracking.scalars(at_budget) == ("eval", 10, {"eval/val_loss": 2.0, "eval/train_loss": 1.9})
    assert tracking.scalars({"event": "resumed", "step": 50, "tokens": 1}) is None
    assert tracking.scalars({"step": 10, "phase": "trunk", "event": "saturation", "role": "grad"}) is None


class Recorder:
    def __init__(self):
        self.points, self.closed = [], False

    def write(self, step, values):
        self.points.append((step, values.get("loss", values.get("eval/val_loss"))))

    def close(self):
        self.closed = True


def test_a_resumed_mirror_skips_what_metrics_already_held():
    before = [dict(STEP, step=s, loss=float(s)) for s in (1, 10, 20, 30)] + [{"event": "resumed", "step": 20}]
    assert tracking.high_water(before) == {"trunk": 30}
    recorder = Recorder()
    mirror = tracking.Mirror([recorder], tracking.high_water(before))
    for s in (30, 40):  # the resumed attempt logs 30 again (identically), then goes on
        mirror.log(dict(STEP, step=s, loss=float(s)))
    mirror.log({"event": "eval", "step": 30, "val_loss": 2.0, "train_loss": 2.0, "fraction": 1.0})  # a new curve
    mirror.close()
    assert recorder.points == [(40, 40.0), (30, 2.0)] and recorder.closed
