"""Bad input a new user meets: one line under 200 characters that names what is wrong and what
would work, exit code 2, nothing written."""

from pathlib import Path

import pandas as pd
import pytest

from scaling import cli
from scaling.errors import ConfigError
from scaling.study.sweeps import sweep

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "results" / "quick.csv"


def _error(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and len(err) < 200, err
    return err


@pytest.fixture()
def without(tmp_path):
    def table(*columns: str) -> str:
        path = tmp_path / f"no_{'_'.join(columns)}.csv"
        pd.read_csv(QUICK).drop(columns=list(columns)).to_csv(path, index=False)
        return str(path)
    return table


def test_fit_names_the_column_a_law_needs(capsys, without, tmp_path):
    err = _error(capsys, ["fit", without("N"), "--out", str(tmp_path / "f.json")])
    assert "missing N" in err and "kumar" in err
    assert not (tmp_path / "f.json").exists()


def test_fit_without_a_loss_column_says_which_it_looks_for(capsys, without, tmp_path):
    err = _error(capsys, ["fit", without("val_loss"), "--out", str(tmp_path / "f.json")])
    assert "--loss-column" in err and "neither loss nor val_loss" in err
    err = _error(capsys, ["fit", str(QUICK), "--loss-column", "vall_loss", "--out", str(tmp_path / "f.json")])
    assert "'vall_loss'" in err and "val_loss" in err


def test_figures_names_the_missing_column(capsys, without, tmp_path):
    err = _error(capsys, ["figures", "--results", without("val_loss"), "--out", str(tmp_path / "figs")])
    assert "missing val_loss" in err
    assert not (tmp_path / "figs" / "REPORT.md").exists()


def test_a_too_small_isoflop_budget_names_the_smallest_that_works(tmp_path):
    text = (ROOT / "experiments" / "quick.toml").read_text()
    assert "budgets = [1e11, 2e11]" in text

    def expand(budget: float):
        path = tmp_path / "small.toml"
        path.write_text(text.replace("budgets = [1e11, 2e11]", f"budgets = [{budget!r}]"))
        return sweep.expand(path)

    with pytest.raises(ConfigError) as error:
        expand(1e9)
    message = str(error.value)
    assert len(message) < 200 and "(1, None)" not in message, message
    least = float(message.split("allowed: at least ")[1].split(" ")[0])
    assert 1e9 < least < 1e11 and len(expand(least)) > 0  # the budget it names is enough
    with pytest.raises(ConfigError):
        expand(least * 0.9)  # and not much more than enough
