"""Take-off is never silent: a line per shape as it clears, from this process's lane and a child's,
in `scaling sweep` and in `scaling reproduce`."""

import re
from pathlib import Path

import pytest

from scaling.study import reproduce
from scaling.study.sweeps import sweep, takeoff

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "experiments" / "smoke_sweep.toml"


@pytest.mark.slow
def test_take_off_says_each_shape_it_clears_in_either_lane(tmp_path):
    specs = [s for s in sweep.expand(SMOKE) if s.config.recipe.name in ("fp32", "fp8")]
    lines = []
    cleared, flights = takeoff.take_off(specs, tmp_path, lanes=2, echo=lines.append)  # one shape here, one in a child
    assert cleared == specs and len(flights) == 2
    said = [line for line in lines if " cleared in " in line]
    assert len(said) == 2, lines
    assert all(re.fullmatch(r"take-off: shape [12]/2 \(L2-h32, fp(32|8)\) cleared in \d+\.\d s", line) for line in said)
    assert {line.split(", ")[1].split(")")[0] for line in said} == {"fp32", "fp8"}


@pytest.mark.slow
def test_reproduce_passes_its_echo_to_take_off(tmp_path, monkeypatch):
    """reproduce's take-off speaks through reproduce's own echo (its lines reach the console)."""
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "smoke.toml").write_text(SMOKE.read_text())
    monkeypatch.setattr(reproduce, "EXPERIMENTS", experiments)
    monkeypatch.setitem(reproduce.STUDY_PRESETS, "smoke", ["smoke.toml"])

    class Stop(Exception):
        pass

    def take_off(todo, out_root, **kw):
        kw["echo"]("take-off: shape 1/3 (L2-h32, fp32) cleared in 1.0 s")
        raise Stop

    monkeypatch.setattr(takeoff, "take_off", take_off)
    lines = []
    with pytest.raises(Stop):
        reproduce.reproduce("smoke", tmp_path / "out", echo=lines.append)
    assert "take-off: shape 1/3 (L2-h32, fp32) cleared in 1.0 s" in lines


def test_take_off_refuses_an_evaluation_larger_than_the_corpus_before_anything_flies(tmp_path, monkeypatch):
    """A user's own small corpus with the default eval_tokens: take-off's probes evaluate on fewer tokens,
    so all 8 runs of a new user's sweep cleared take-off and then failed at their start. Take-off now
    checks each run's own evaluation against the validation split, in one line, before any probe."""
    from scaling.errors import ConfigError

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(40):
        (corpus / f"doc{i}.txt").write_text(f"document {i}: " + "some words of text " * 60)
    specs = [s for s in sweep.expand(SMOKE, [f"data.source={corpus}", "data.eval_tokens=65536"])
             if s.config.recipe.name == "fp32"]
    monkeypatch.setattr(takeoff, "_fly", lambda *a, **k: pytest.fail("a probe flew"))
    with pytest.raises(ConfigError, match=r"data.eval_tokens: got 65536; allowed: between 32 \(model.seq_len\) and \d+ "
                                          r"\(the validation split\)"):
        takeoff.take_off(specs, tmp_path / "out")
