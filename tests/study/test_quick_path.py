"""The main job's fit and report path (`scaling reproduce --preset quick` once its runs have landed)
prints its own lines and no Python warning."""

import shutil
import warnings
from pathlib import Path

import pytest

from scaling.study import reproduce

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_quick_fit_and_report_raise_no_warning(tmp_path, monkeypatch):
    """The path after training: law selection, the bootstrap (where numpy's overflow warning came from:
    the spread of a barely identified amplitude's resamples), the held-out error, findings, figures and
    REPORT. The candidates are the quick preset's chosen law alone: choosing among its three laws
    costs two more minutes and is tested on its own (tests/study/test_law_selection.py)."""
    monkeypatch.setitem(reproduce.CANDIDATES, "quick", ("kumar",))
    out = tmp_path / "quick"
    (out / "results").mkdir(parents=True)
    for name in ("quick.csv", "quick_curves.parquet"):  # the committed summary: every run has landed
        shutil.copy(ROOT / "results" / name, out / "results" / name)
    lines: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = reproduce.reproduce("quick", out, progress=False, echo=lines.append)
    assert [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught] == []
    assert lines[0] == "quick: 12 runs, 12 already landed" and "chosen by held-out precision gaps" in lines[1]
    assert path.is_file() and len(lines) == 3
