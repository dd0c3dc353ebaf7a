"""findings.json has a versioned schema (scaling.study.report.schema): the writer stamps its version and
checks what it writes, readers refuse another version, a missing key or a wrong type with one line naming
the key; a study's own sections' keys pass through."""

import copy
import json
from pathlib import Path

import pytest

from scaling.errors import ConfigError
from scaling.study.report import plots, schema, writer as report
from scaling.study.sweeps import results

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "paper_figures" / "findings.json"

# the smallest findings a study writes: one budget with one recipe, a law, P* with too few runs
RECIPE = {"recipe": "fp8", "bits_eff": 8.0, "P": 8.0, "runs": 3, "sizes": 3, "interpolated": 0, "N_opt": 1e6,
          "D_opt": 2e7, "loss": 1.5, "ci": [1.4, 1.6], "inside": True, "p_best": 0.7, "parabola": [0.1, -1.0, 3.0],
          "gap": None, "gap_ci": None}
BUDGET = {"budget": 1e15, "cost_model": "bits", "level": 0.95, "recipes": [RECIPE], "sigma": 0.01, "dof": 4,
          "noise_source": "joint fit", "best": "fp8", "runner_up": None, "diff": None, "diff_ci": None,
          "seed_sigma": None, "seed_dof": 0, "sigma_parabolas": 0.01, "shape_share": None, "shape_effects": [],
          "winner": None, "reason": "fewer than two recipes", "pairs": [], "corpora": {}, "hosts": {}}
MINIMAL = {"schema_version": schema.SCHEMA_VERSION, "loss_unit": "nats/byte", "cost_model": "bits: ...", "runs": 3,
           "seeds_per_cell": [1, 1], "budgets": [BUDGET], "note": None,
           "law": {"name": "kumar", "params": {"A": 1.0, "alpha": 0.3}, "fixed": {"kappa": 3}, "heldout": None,
                   "selection": None},
           "P_star": [{"compute": 1e15, "measured": [], "measured_bits": [8.0], "profile": {"error": "too few"},
                       "error": "too few runs"}],
           "matched": None, "cost_models": None, "granularity": None, "outliers": None}


def _error(data, **kwargs) -> str:
    with pytest.raises(ConfigError) as e:
        schema.Findings.from_json(data, **kwargs)
    message = str(e.value)
    assert len(message.splitlines()) == 1
    return message


def _with(path: str, value):
    """MINIMAL with the value at `path` (keys and list indices, dot-separated) replaced, or removed if
    value is ...; the path's key is what the error must name."""
    data = copy.deepcopy(MINIMAL)
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    node = data
    for p in parents:
        node = node[p]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return data


def test_findings_read_back_as_typed_values_and_write_back_unchanged():
    f = schema.Findings.from_json(MINIMAL)
    assert isinstance(f.budgets[0], schema.Budget) and isinstance(f.budgets[0].recipes[0], schema.BudgetRecipe)
    assert f.law.name == "kumar" and f.P_star[0].error == "too few runs" and f.P_star[0].P is schema.ABSENT
    assert f.prediction is schema.ABSENT and f.sections == {}
    assert f.to_json() == MINIMAL and list(f.to_json())[0] == "schema_version"


def test_a_studys_own_sections_pass_through_unless_the_reader_names_others():
    data = {**MINIMAL, "my_arm": {"runs": 12}, "nothing": []}
    f = schema.Findings.from_json(data)
    assert f.sections == {"my_arm": {"runs": 12}, "nothing": []} and f.to_json() == data
    assert schema.Findings.from_json(data, sections=("my_arm", "nothing")).sections == f.sections
    message = _error(data, sections=("my_arm",))
    assert message.startswith("findings.json: nothing: ") and "a section's (my_arm)" in message


@pytest.mark.parametrize("version", [..., None, 0, schema.SCHEMA_VERSION + 1, str(schema.SCHEMA_VERSION), True])
def test_another_version_or_none_is_a_one_line_error_saying_to_rewrite_the_file(version):
    message = _error(_with("schema_version", version))
    assert message.startswith("findings.json: schema_version: got ")
    assert f"allowed: {schema.SCHEMA_VERSION}," in message and "python paper_figures/make_figures.py" in message


@pytest.mark.parametrize("path", ["runs", "budgets", "law", "P_star", "budgets.0.winner", "budgets.0.recipes.0.loss",
                                  "law.params", "P_star.0.profile", "budgets.0.corpora"])
def test_a_missing_key_is_a_one_line_error_naming_it(path):
    key = path.replace(".0", "[0]")
    message = _error(_with(path, ...))
    assert message.startswith(f"findings.json: {key}: got missing; allowed: ")


@pytest.mark.parametrize("path, value", [
    ("runs", "3"), ("runs", 3.0), ("runs", True), ("loss_unit", None), ("seeds_per_cell.1", "2"),
    ("budgets", {}), ("budgets.0.budget", "1e15"), ("budgets.0.winner", 3), ("budgets.0.recipes.0.inside", "yes"),
    ("budgets.0.recipes.0", []), ("law.params.A", "x"), ("law", []), ("P_star.0.P", "8"), ("matched", []),
    ("note", 1)])
def test_a_wrong_type_is_a_one_line_error_naming_the_key_and_what_is_allowed(path, value):
    key = path.replace(".0", "[0]").replace(".1", "[1]")
    message = _error(_with(path, value))
    assert message.startswith(f"findings.json: {key}: got ") and "; allowed: " in message


def test_an_unknown_key_inside_a_typed_entry_is_refused():
    message = _error(_with("budgets.0.mystery", 1))
    assert message.startswith("findings.json: budgets[0].mystery: got an unknown key; allowed: the keys of")


def test_a_float_field_takes_a_json_integer_and_optional_keys_stay_absent():
    f = schema.Findings.from_json(_with("budgets.0.budget", 1000))
    assert f.budgets[0].budget == 1000 and "P" not in f.to_json()["P_star"][0]


def test_load_names_the_file_and_refuses_what_is_not_json(tmp_path):
    path = tmp_path / "findings.json"
    path.write_text(json.dumps(_with("schema_version", ...)))
    with pytest.raises(ConfigError, match=f"^{path}: schema_version: got missing"):
        schema.load(path)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="^findings: "):
        schema.load(path)


def test_write_stamps_the_version_and_writes_nothing_the_schema_refuses(tmp_path):
    facts = {k: v for k, v in MINIMAL.items() if k != "schema_version"}
    path = schema.write(tmp_path / "findings.json", facts)
    assert json.loads(path.read_text()) == MINIMAL
    with pytest.raises(ConfigError, match=r"budgets\[0\]\.dof: got 'four'"):
        schema.write(tmp_path / "bad.json", _with("budgets.0.dof", "four"))
    assert not (tmp_path / "bad.json").exists()


def test_readme_findings_are_refused_from_an_unversioned_file(tmp_path, monkeypatch):
    """make_figures.py rewrites README's block only from a findings.json of this schema's version."""
    import make_figures

    monkeypatch.setattr(make_figures, "README", tmp_path / "README.md")  # never the real one
    old = tmp_path / "findings.json"
    old.write_text(json.dumps(_with("schema_version", ...)))
    with pytest.raises(ConfigError, match="schema_version: got missing"):
        make_figures.write_readme_findings(old)


def test_the_committed_findings_json_validates():
    data = json.loads(COMMITTED.read_text(encoding="utf-8"))
    assert data["schema_version"] == schema.SCHEMA_VERSION  # `python paper_figures/make_figures.py` stamps it
    f = schema.load(COMMITTED)
    assert f.to_json() == data and f.budgets and f.law is not None


@pytest.fixture()
def no_figures(monkeypatch):
    monkeypatch.setattr(plots, "make_figures", lambda *args, **kwargs: [])  # findings.json is what is tested here


@pytest.mark.slow
def test_the_report_writes_findings_json_that_validates(tmp_path, no_figures):
    """write_report on the quick study (a section of its own included) writes findings.json with the
    version stamped and every typed key as the schema says; only the version was added."""
    mine = report.Section("my_arm", lambda context: {"runs": int(context.main["run_id"].nunique())})
    report.write_report(results.load(ROOT / "results" / "quick.csv"), report.load_fit(ROOT / "fits" / "quick.json"),
                        tmp_path, sections=[mine])
    data = json.loads((tmp_path / "findings.json").read_text())
    assert data["schema_version"] == schema.SCHEMA_VERSION
    f = schema.load(tmp_path / "findings.json", sections=("my_arm",))
    assert f.to_json() == data and f.sections == {"my_arm": {"runs": 12}}
    assert f.budgets and all(isinstance(b, schema.Budget) for b in f.budgets) and f.law.name == "kumar"
    assert f.matched is not None and f.cost_models is not None and f.prediction is schema.ABSENT
