"""An output directory that cannot be written is refused before any work, in one line naming the option
and the path (was: an OSError traceback, in predict only after its whole fit)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scaling import _io, cli
from scaling.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "results" / "quick.csv"


@pytest.fixture()
def no_work(monkeypatch):
    """Every verb's first piece of work fails the test if it is reached."""
    from scaling.study.sweeps import results, sweep
    from scaling.train import config

    def reached(*args, **kwargs):
        raise AssertionError("work started before the output directory was checked")

    for module, name in ((results, "load"), (sweep, "experiment_points"), (config, "load")):
        monkeypatch.setattr(module, name, reached)


def _verbs(out: Path, rows: Path) -> dict[str, list[str]]:
    return {"train": ["train", str(ROOT / "experiments" / "smoke.toml"), "--out", str(out / "run")],
            "sweep": ["sweep", str(ROOT / "experiments" / "smoke_sweep.toml"), "--out", str(out / "results")],
            "figures": ["figures", "--results", str(QUICK), "--out", str(out / "figs")],
            "predict --rows": ["predict", "--rows", str(rows), "--results", str(QUICK), "--law", "kumar",
                               "-o", str(out / "p.csv")],
            "predict --backtest": ["predict", "--backtest", "--results", str(QUICK), "-o", str(out / "b.json")]}


@pytest.mark.parametrize("verb", ["train", "sweep", "figures", "predict --rows", "predict --backtest"])
def test_an_output_under_a_file_is_refused_before_any_work(tmp_path, capsys, no_work, verb):
    """A path under a regular file, which no user (root included) can create."""
    (tmp_path / "file.txt").write_text("x")
    rows = tmp_path / "rows.csv"
    rows.write_text("N,D,recipe\n1e5,1e5,fp32\n")
    assert cli.main(_verbs(tmp_path / "file.txt", rows)[verb]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --out: got ") and "file.txt is a file" in err[0], err


@pytest.mark.parametrize("verb", ["figures", "predict --rows"])
def test_a_read_only_directory_is_refused_before_any_work(tmp_path, capsys, no_work, monkeypatch, verb):
    """The permission check itself (root writes through chmod 0o555, so os.access answers for it here)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    rows = tmp_path / "rows.csv"
    rows.write_text("N,D,recipe\n1e5,1e5,fp32\n")
    real = os.access
    monkeypatch.setattr(_io.os, "access", lambda p, mode: False if Path(p) == ro else real(p, mode))
    assert cli.main(_verbs(ro, rows)[verb]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{ro} is not writable" in err[0] and "--out" in err[0], err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a 0o555 directory")
def test_a_chmod_read_only_directory_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(ConfigError, match="is not writable"):
            _io.check_writable_dir("--out", ro / "new" / "deeper")
    finally:
        ro.chmod(0o755)


def test_a_writable_or_makeable_directory_passes(tmp_path):
    _io.check_writable_dir("--out", tmp_path)
    _io.check_writable_dir("--out", tmp_path / "not" / "yet")
    assert not (tmp_path / "not").exists()  # checking makes nothing
